//! Agent-facing endpoints: the front door every request passes (`door`) and the transports
//! (`sse`: legacy HTTP+SSE; `streamable_http`: Streamable HTTP, both eras, with its
//! stateless 2026-07-28 half in `stateless`).

pub mod door;
pub mod event_stream;
pub mod oauth;
pub mod origin;
pub mod rejection;
pub mod reply;
pub mod sse;
pub mod stateless;
pub mod streamable_http;

use axum::http::header::{AsHeaderName, HeaderName};
use axum::http::HeaderMap;

pub use oauth::Surface;
pub use rejection::{json_response, reply_response, Rejection};

/// `Mcp-Session-Id` and `MCP-Protocol-Version`.
pub const SESSION_HEADER: &str = "mcp-session-id";
pub const VERSION_HEADER: &str = "mcp-protocol-version";
/// The same names as `HeaderName`s, for lookups: a lookup by `&str` parses and checks the
/// name every time.
pub(crate) static SESSION_NAME: HeaderName = HeaderName::from_static(SESSION_HEADER);
pub(crate) static VERSION_NAME: HeaderName = HeaderName::from_static(VERSION_HEADER);
/// A header's value as text (None if absent or not visible ASCII).
pub fn header_str(headers: &HeaderMap, name: impl AsHeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// A query parameter's value (no percent-decoding is needed for our ids).
pub fn query_param<'a>(query: Option<&'a str>, names: &[&str]) -> Option<&'a str> {
    // Split by byte scans (a `str` split builds a searcher per call, and this runs on every
    // legacy SSE message). `&` and `=` are one byte each, so every cut is a char boundary.
    let mut rest = query?;
    loop {
        let (kv, next) = match rest.bytes().position(|b| b == b'&') {
            Some(at) => (&rest[..at], Some(&rest[at + 1..])),
            None => (rest, None),
        };
        let (k, v) = match kv.bytes().position(|b| b == b'=') {
            Some(at) => (&kv[..at], &kv[at + 1..]),
            None => (kv, ""),
        };
        if names.contains(&k) {
            return Some(v);
        }
        rest = next?;
    }
}

#[cfg(test)]
mod tests {
    use super::query_param;

    #[test]
    fn query_params_are_found_by_name() {
        let names = &["session_id", "sessionId"];
        for (q, found) in [
            (Some("session_id=abc"), Some("abc")),
            (Some("x=1&sessionId=é9&session_id=z"), Some("é9")),
            (Some("a&session_id"), Some("")),
            (Some("session_id=a=b&"), Some("a=b")),
            (Some("&&x=&"), None),
            (Some(""), None),
            (Some("session=1&id=2"), None),
            (None, None),
        ] {
            assert_eq!(query_param(q, names), found, "{q:?}");
        }
    }
}
