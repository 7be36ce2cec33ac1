//! MCP Apps (the `io.modelcontextprotocol/ui` extension, SEP-1865) as the gateway reads it:
//! the extension's id and settings, a tool's view (`_meta.ui.resourceUri`, or the legacy flat
//! `_meta["ui/resourceUri"]`), a tool's visibility, and the `ui://` scheme. Pure: no I/O.
//!
//! What the gateway does with it (`methods::proxy`, `call::finish`, `upstream::routing`):
//! - a tool's `_meta` passes through untouched (tools/list shows it as the upstream wrote it);
//! - a `ui://` resource is served only to a registration granted a tool whose view it is;
//! - a call to a tool whose visibility is `["app"]` only (hidden from the model) can only have
//!   come from an app's view: its record says `initiator: "app"`.

use serde_json::{json, Value};

/// The extension's id, under `capabilities.extensions` on both sides.
pub const EXTENSION: &str = "io.modelcontextprotocol/ui";
/// The MIME type of an app's HTML view.
pub const MIME_TYPE: &str = "text/html;profile=mcp-app";
/// The URI scheme of an app's view.
pub const SCHEME: &str = "ui://";
/// The flat `_meta` key older servers and hosts use for the view's URI.
pub const LEGACY_RESOURCE_URI: &str = "ui/resourceUri";
/// What `initiator` says in a call's audit record when an app's view made the call.
pub const APP_INITIATOR: &str = "app";

/// The settings the gateway declares for the extension (to clients, when an upstream gave
/// none of its own, and to upstreams): the one view type it passes through.
pub fn settings() -> Value {
    json!({ "mimeTypes": [MIME_TYPE] })
}

/// The extension's settings in a `capabilities` object, if it declares the extension.
pub fn declared(capabilities: &Value) -> Option<&Value> {
    capabilities
        .get("extensions")
        .and_then(|e| e.get(EXTENSION))
        .filter(|v| !v.is_null())
}

/// Adds the extension to `capabilities.extensions` (keeping other extensions there).
pub fn declare(capabilities: &mut Value, settings: Value) {
    let Some(c) = capabilities.as_object_mut() else {
        return;
    };
    let ext = c.entry("extensions").or_insert_with(|| json!({}));
    if !ext.is_object() {
        *ext = json!({});
    }
    if let Some(e) = ext.as_object_mut() {
        e.insert(EXTENSION.into(), settings);
    }
}

/// The `ui://` URI of a tool's view: `_meta.ui.resourceUri`, else the legacy flat key.
pub fn resource_uri(tool: &Value) -> Option<&str> {
    let meta = tool.get("_meta")?;
    meta.get("ui")
        .and_then(|u| u.get("resourceUri"))
        .or_else(|| meta.get(LEGACY_RESOURCE_URI))
        .and_then(Value::as_str)
        .filter(|u| is_ui(u))
}

/// Whether a tool is visible to the app only (`_meta.ui.visibility` lists `"app"` and not
/// `"model"`): the model never sees it, so a call to it came from an app's view.
pub fn app_only(tool: &Value) -> bool {
    // `get`s, not `pointer`: a pointer's segments are unescaped into new `String`s.
    let Some(v) = tool
        .get("_meta")
        .and_then(|m| m.get("ui"))
        .and_then(|u| u.get("visibility"))
        .and_then(Value::as_array)
    else {
        return false;
    };
    v.iter().any(|s| s == "app") && !v.iter().any(|s| s == "model")
}

/// Whether a URI names an app's view.
pub fn is_ui(uri: &str) -> bool {
    uri.len() > SCHEME.len() && uri[..SCHEME.len()].eq_ignore_ascii_case(SCHEME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_uri_from_either_key() {
        let nested = json!({"_meta": {"ui": {"resourceUri": "ui://a/x.html"}}});
        let flat = json!({"_meta": {"ui/resourceUri": "ui://b/y.html"}});
        let other = json!({"_meta": {"ui": {"resourceUri": "https://e/x"}}});
        assert_eq!(resource_uri(&nested), Some("ui://a/x.html"));
        assert_eq!(resource_uri(&flat), Some("ui://b/y.html"));
        assert_eq!(resource_uri(&other), None);
        assert_eq!(resource_uri(&json!({"name": "t"})), None);
    }

    #[test]
    fn app_only_needs_app_without_model() {
        let v = |vis: Value| json!({"_meta": {"ui": {"visibility": vis}}});
        assert!(app_only(&v(json!(["app"]))));
        assert!(!app_only(&v(json!(["model", "app"]))));
        assert!(!app_only(&v(json!(["model"]))));
        assert!(!app_only(
            &json!({"_meta": {"ui": {"resourceUri": "ui://x"}}})
        ));
    }

    #[test]
    fn declare_keeps_other_extensions() {
        let mut caps = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
        declare(&mut caps, settings());
        assert!(caps["extensions"]["io.modelcontextprotocol/tasks"].is_object());
        assert_eq!(declared(&caps), Some(&settings()));
        assert!(is_ui("UI://x/y") && !is_ui("ui://") && !is_ui("file:///x"));
    }
}
