//! Stateless 2026-07-28 requests on `/gw/<id>/mcp`: no session, the protocol version in
//! `_meta`, mirrored headers validated against the body, `server/discover`, `resultType` on
//! every result, cache fields on list results, and cancellation by closing the response.

use std::borrow::Cow;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{json, Map, Value};

use super::reply::{reply, resume, Mrtr, ReplyOpts};
use super::{header_str, json_response, Rejection, SESSION_NAME, VERSION_NAME};
use crate::hub::Hub;
use crate::mcp::jsonrpc::{self, Message, RpcError};
use crate::mcp::request::RequestCtx;
use crate::mcp::{ALL_VERSIONS, LEGACY_VERSIONS, MODERN_VERSION};
use crate::registry::RegistrationState;
use crate::session::Transport;

pub const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// How long a client may cache `server/discover` (its content is fixed per build).
const DISCOVER_TTL_MS: u64 = 60_000;
/// `tools/list` may change when an upstream's tools change, and 2026-07-28 clients cannot be
/// told (no `subscriptions/listen` yet): they must not cache it.
const LIST_TTL_MS: u64 = 0;

/// Methods whose server requests travel as MRTR rounds (the spec allows no others).
const MRTR_METHODS: &[&str] = &["tools/call", "prompts/get", "resources/read"];

/// Methods served statelessly; anything else is 404 + -32601.
const METHODS: &[&str] = &[
    "server/discover",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "prompts/list",
    "prompts/get",
    "completion/complete",
];

/// A message's `_meta`, from its params.
fn meta(params: Option<&Value>) -> Option<&Map<String, Value>> {
    params?.get("_meta")?.as_object()
}

/// Is this POST a stateless (2026-07-28) one? Its `_meta` names a protocol version, or it has
/// no session and its `MCP-Protocol-Version` header is not a handshake-era one. Takes the
/// message's method and params (as read, valid or not).
pub fn is_stateless(method: Option<&str>, params: Option<&Value>, headers: &HeaderMap) -> bool {
    if meta(params).is_some_and(|m| m.contains_key(META_VERSION)) {
        return true;
    }
    let is_initialize = method == Some("initialize");
    headers.get(&SESSION_NAME).is_none()
        && !is_initialize
        && header_str(headers, &VERSION_NAME).is_some_and(|h| !LEGACY_VERSIONS.contains(&h))
}

fn error(
    status: StatusCode,
    id: Option<Value>,
    code: i64,
    msg: &str,
    data: Option<Value>,
) -> Rejection {
    Rejection::new(status, code, msg)
        .with_id(id)
        .with_data(data)
}

/// Decodes a mirrored header value (`=?base64?…?=` form included; a plain value is borrowed).
pub fn decode_header_value(raw: &str) -> Option<Cow<'_, str>> {
    if let Some(b64) = raw
        .strip_prefix("=?base64?")
        .and_then(|r| r.strip_suffix("?="))
    {
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        return String::from_utf8(bytes).ok().map(Cow::Owned);
    }
    Some(Cow::Borrowed(raw))
}

/// The mirrored request headers (besides `MCP-Protocol-Version`).
static METHOD_NAME: HeaderName = HeaderName::from_static("mcp-method");
static NAME_NAME: HeaderName = HeaderName::from_static("mcp-name");

/// Checks one mirrored header against the body value (-32020 when absent or different).
fn mirror(headers: &HeaderMap, name: &HeaderName, expected: &str) -> Result<(), String> {
    let Some(v) = headers.get(name) else {
        return Err(format!("header mismatch: {name} is required"));
    };
    let decoded = std::str::from_utf8(v.as_bytes())
        .ok()
        .and_then(decode_header_value);
    if decoded.as_deref() == Some(expected) {
        Ok(())
    } else {
        Err(format!(
            "header mismatch: {name} does not match the request body"
        ))
    }
}

/// Handles one stateless message (or why it is not a valid one).
pub async fn handle(
    gw: Arc<Hub>,
    reg: Arc<RegistrationState>,
    headers: HeaderMap,
    msg: Result<Message, RpcError>,
) -> Result<Response, Rejection> {
    let msg = msg.map_err(Rejection::malformed)?;
    let (id, method, params) = match msg {
        Message::Request { id, method, params } => (Some(id), method, params),
        Message::Notification { method, params } => (None, method, params),
        Message::Response { .. } => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                None,
                jsonrpc::INVALID_REQUEST,
                "invalid request: 2026-07-28 clients do not send responses",
                None,
            ))
        }
    };
    let meta_version = meta(params.as_ref())
        .and_then(|m| m.get(META_VERSION))
        .and_then(Value::as_str)
        .map(str::to_string);
    let has_caps = meta(params.as_ref())
        .and_then(|m| m.get(META_CAPABILITIES))
        .is_some_and(Value::is_object);
    let unsupported = |requested: &str| {
        error(
            StatusCode::BAD_REQUEST,
            id.clone(),
            jsonrpc::UNSUPPORTED_VERSION,
            &format!("unsupported protocol version: {requested}"),
            Some(json!({"supported": ALL_VERSIONS, "requested": requested})),
        )
    };
    let Some(version) = meta_version else {
        if let Some(h) = header_str(&headers, &VERSION_NAME) {
            if h != MODERN_VERSION {
                return Err(unsupported(h));
            }
        }
        return Err(error(
            StatusCode::BAD_REQUEST,
            id,
            jsonrpc::INVALID_PARAMS,
            &format!("invalid params: _meta[\"{META_VERSION}\"] is required"),
            None,
        ));
    };
    if version != MODERN_VERSION {
        return Err(unsupported(&version));
    }
    if id.is_some() && !has_caps {
        return Err(error(
            StatusCode::BAD_REQUEST,
            id,
            jsonrpc::INVALID_PARAMS,
            &format!("invalid params: _meta[\"{META_CAPABILITIES}\"] is required"),
            None,
        ));
    }
    // The mirrored headers, in order: the version always; for requests the method, and the
    // name (or URI) for the methods that have one.
    let name_field = match method.as_str() {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        _ => None,
    };
    let name = name_field.map(|field| {
        params
            .as_ref()
            .and_then(|p| p.get(field))
            .and_then(Value::as_str)
            .unwrap_or_default()
    });
    let is_request = id.is_some();
    let checks = [
        (&VERSION_NAME, Some(version.as_str())),
        (&METHOD_NAME, is_request.then_some(method.as_str())),
        (&NAME_NAME, name.filter(|_| is_request)),
    ];
    for (h, expected) in checks.iter().filter_map(|(h, e)| e.map(|e| (*h, e))) {
        if let Err(m) = mirror(&headers, h, expected) {
            return Err(error(
                StatusCode::BAD_REQUEST,
                id,
                jsonrpc::HEADER_MISMATCH,
                &m,
                None,
            ));
        }
    }
    let Some(id) = id else {
        // Notifications carry nothing the gateway acts on statelessly (cancellation is
        // closing the response stream).
        return Ok(StatusCode::ACCEPTED.into_response());
    };
    if !METHODS.contains(&method.as_str()) {
        return Err(error(
            StatusCode::NOT_FOUND,
            Some(id),
            jsonrpc::METHOD_NOT_FOUND,
            &format!("method not found: {method}"),
            None,
        ));
    }
    let ctx = RequestCtx {
        hub: gw.clone(),
        registration: reg.clone(),
        session: None,
        transport: Transport::Stateless,
        notify: None,
    };
    if method == "server/discover" {
        // Boxed: its future is large and `server/discover` is rare.
        let result = Box::pin(discover(&ctx)).await;
        return Ok(json_response(
            StatusCode::OK,
            &finish(jsonrpc::success(id, result), &method),
        ));
    }
    let retry = MRTR_METHODS
        .contains(&method.as_str())
        .then(|| params.as_ref().and_then(|p| p.get("requestState")))
        .flatten();
    if let Some(state) = retry {
        // An MRTR retry: it continues the held call; it is not forwarded again.
        let Some(state) = state.as_str() else {
            return Err(error(
                StatusCode::BAD_REQUEST,
                Some(id),
                jsonrpc::INVALID_PARAMS,
                "invalid params: requestState must be the string this gateway issued",
                None,
            ));
        };
        let mut held = match gw.held().resume(&reg.id, state) {
            Ok(h) => h,
            Err(e) => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    Some(id),
                    jsonrpc::INVALID_PARAMS,
                    &format!("invalid params: {e}"),
                    None,
                ))
            }
        };
        let responses = params
            .as_ref()
            .and_then(|p| p.get("inputResponses"))
            .and_then(Value::as_object);
        for asked in std::mem::take(&mut held.asked) {
            let body = match responses.and_then(|r| r.get(&asked)) {
                Some(r) => json!({ "result": r }),
                None => {
                    json!({"error": {"code": -32603, "message": format!("gatehouse: the client's retry carried no inputResponses[{asked:?}]")}})
                }
            };
            gw.pool().client_response(
                &reg.id,
                crate::upstream::STATELESS_SESSION,
                &Value::String(asked),
                &body,
            );
        }
        let opts = ReplyOpts {
            priming: false,
            cancel_on_drop: true,
            method: method.clone(),
            finish: Some(finish as fn(Value, &str) -> Value),
            mrtr: Some(Mrtr {
                capabilities: meta(params.as_ref())
                    .and_then(|m| m.get(META_CAPABILITIES))
                    .cloned()
                    .unwrap_or(Value::Null),
            }),
        };
        return resume(gw.clone(), reg.clone(), id, held, opts).await;
    }
    let cancel = reg.cancel.child_token();
    let opts = ReplyOpts {
        priming: false,
        cancel_on_drop: true,
        method: method.clone(),
        finish: Some(finish as fn(Value, &str) -> Value),
        mrtr: MRTR_METHODS.contains(&method.as_str()).then(|| Mrtr {
            capabilities: meta(params.as_ref())
                .and_then(|m| m.get(META_CAPABILITIES))
                .cloned()
                .unwrap_or(Value::Null),
        }),
    };
    reply(ctx, id, method, params, cancel, opts).await
}

/// The `server/discover` result.
async fn discover(ctx: &RequestCtx) -> Value {
    // No `listChanged` (no `subscriptions/listen` yet) and no `logging/setLevel` statelessly.
    let mut caps = crate::mcp::proxy::capabilities(ctx).await;
    caps["tools"] = json!({});
    if let Some(m) = caps.as_object_mut() {
        m.remove("logging");
    }
    json!({
        "supportedVersions": ALL_VERSIONS,
        "capabilities": caps,
        "serverInfo": crate::mcp::server_info(),
        "instructions": format!("Tools granted to agent {}.", ctx.registration.agent_id),
    })
}

/// Completes a 2026-07-28 result: `resultType`, server info, and cache fields on lists.
fn finish(mut reply: Value, method: &str) -> Value {
    if let Some(Value::Object(r)) = reply.get_mut("result") {
        r.entry("resultType").or_insert_with(|| json!("complete"));
        let meta = r.entry("_meta").or_insert_with(|| json!({}));
        if let Value::Object(m) = meta {
            m.entry(META_SERVER_INFO)
                .or_insert_with(crate::mcp::server_info);
        }
        let ttl = match method {
            "server/discover" => Some(DISCOVER_TTL_MS),
            m if m.ends_with("/list") || m == "resources/read" => Some(LIST_TTL_MS),
            _ => None,
        };
        if let Some(ttl) = ttl {
            r.insert("ttlMs".into(), json!(ttl));
            r.insert("cacheScope".into(), json!("private"));
        }
    }
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_base64_header_values() {
        assert_eq!(
            decode_header_value("tools/call").as_deref(),
            Some("tools/call")
        );
        assert_eq!(
            decode_header_value("=?base64?aMOpbGxv?=").as_deref(),
            Some("héllo")
        );
        assert_eq!(decode_header_value("=?base64?!!?="), None);
    }

    #[test]
    fn results_carry_result_type_and_cache_fields() {
        let r = finish(
            jsonrpc::success(json!(1), json!({"tools": []})),
            "tools/list",
        );
        assert_eq!(r["result"]["resultType"], "complete");
        assert_eq!(r["result"]["cacheScope"], "private");
        assert!(r["result"]["ttlMs"].is_u64());
        let r = finish(
            jsonrpc::success(json!(1), json!({"content": []})),
            "tools/call",
        );
        assert_eq!(r["result"]["resultType"], "complete");
        assert!(r["result"].get("ttlMs").is_none());
    }
}
