//! Agent-facing endpoints: the checks every request passes (Origin, registration, token) and
//! the transports (`sse`: legacy HTTP+SSE; `streamable_http`: Streamable HTTP, both eras,
//! with its stateless 2026-07-28 half in `stateless`).

pub mod event_stream;
pub mod oauth;
pub mod origin;
pub mod rejection;
pub mod reply;
pub mod sse;
pub mod stateless;
pub mod streamable_http;

use std::sync::Arc;

use axum::body::Body;
use axum::http::header::{AsHeaderName, HeaderName};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use bytes::Bytes;

use crate::hub::Hub;
use crate::mcp::jsonrpc;
use crate::registry::RegistrationState;
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

/// The headers an agent request's checks read, found in one pass over the map (a lookup by
/// name hashes the name; comparing a standard name is comparing its tag): each the first
/// value of its name, as `HeaderMap::get` gives it.
#[derive(Default)]
pub(crate) struct Heads<'a> {
    pub host: Option<&'a HeaderValue>,
    pub origin: Option<&'a HeaderValue>,
    pub authorization: Option<&'a HeaderValue>,
    pub content_type: Option<&'a HeaderValue>,
    /// `Mcp-Session-Id`.
    pub session: Option<&'a HeaderValue>,
    /// `MCP-Protocol-Version`.
    pub version: Option<&'a HeaderValue>,
}

impl<'a> Heads<'a> {
    pub(crate) fn of(headers: &'a HeaderMap) -> Self {
        let mut h = Heads::default();
        for (name, value) in headers {
            let slot = if name == header::HOST {
                &mut h.host
            } else if name == header::ORIGIN {
                &mut h.origin
            } else if name == header::AUTHORIZATION {
                &mut h.authorization
            } else if name == header::CONTENT_TYPE {
                &mut h.content_type
            } else if name == SESSION_NAME {
                &mut h.session
            } else if name == VERSION_NAME {
                &mut h.version
            } else {
                continue;
            };
            if slot.is_none() {
                *slot = Some(value);
            }
        }
        h
    }
}

/// The bearer token in a request's `Authorization` value, if it has one.
fn bearer_of(authorization: Option<&HeaderValue>) -> Option<&str> {
    let v = authorization?.to_str().ok()?;
    // A byte scan (a `str` search costs more than this short value); a space is one byte.
    let at = v.bytes().position(|c| c == b' ')?;
    let (scheme, token) = (&v[..at], &v[at + 1..]);
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The checks every agent request passes, in order: Host and Origin (403), registration
/// (404), token (401, with the OAuth-aware challenge of `oauth::unauthorized`). The token is
/// compared with this registration's token only.
pub fn authorize(
    gw: &Hub,
    id: &str,
    surface: Surface,
    headers: &HeaderMap,
) -> Result<Arc<RegistrationState>, Rejection> {
    authorize_with(gw, id, surface, headers, &Heads::of(headers))
}

/// [`authorize`] with the request's headers already found ([`Heads`]).
pub(crate) fn authorize_with(
    gw: &Hub,
    id: &str,
    surface: Surface,
    headers: &HeaderMap,
    heads: &Heads<'_>,
) -> Result<Arc<RegistrationState>, Rejection> {
    origin::check_host_origin_values(gw.config(), heads.host, heads.origin)?;
    let Some(reg) = gw.registry().get(id) else {
        return Err(Rejection::unknown_registration(gw.registry(), id));
    };
    let why = match bearer_of(heads.authorization) {
        Some(t) if reg.token_matches(t) => return Ok(reg),
        None => oauth::Refusal::Missing,
        Some(_) => oauth::Refusal::Invalid,
    };
    let transport = match surface {
        Surface::Mcp => "streamable_http",
        Surface::Sse => "sse",
    };
    Err(oauth::unauthorized(gw, headers, id, surface, why).auth_failed(reg, transport))
}

/// Is the request's Content-Type (its first value, [`Heads::content_type`]) JSON?
pub(crate) fn is_json(content_type: Option<&HeaderValue>) -> bool {
    let Some(v) = content_type else {
        return false;
    };
    // The media type, before any parameters, read from the bytes (a `str` split costs more
    // than the whole check): visible ASCII only, as `to_str` requires.
    let v = v.as_bytes();
    // What clients send nearly always, compared whole before the general reading.
    if v == b"application/json" {
        return true;
    }
    if !v.iter().all(|&c| c == b'\t' || (b' '..=b'~').contains(&c)) {
        return false;
    }
    let media = v.iter().position(|&c| c == b';').map_or(v, |at| &v[..at]);
    media.trim_ascii().eq_ignore_ascii_case(b"application/json")
}

/// Reads a body up to `max_body_bytes` (413 above it) within `connections.body_timeout_s` of
/// the request's start (408 after it: a body trickled a byte at a time holds nothing for
/// long). Either refusal closes the connection (`server::close_if_body_unread`). A body that
/// came with its head (nearly all of them) is read on the first poll and arms no timer.
pub async fn read_body(body: Body, config: &crate::config::Config) -> Result<Bytes, Rejection> {
    let limit = config.max_body_bytes;
    let too_large = |_| {
        Rejection::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            jsonrpc::INVALID_REQUEST,
            format!("request body exceeds the limit of {limit} bytes"),
        )
    };
    let mut read = std::pin::pin!(axum::body::to_bytes(body, limit));
    let first = std::future::poll_fn(|cx| match std::future::Future::poll(read.as_mut(), cx) {
        std::task::Poll::Ready(r) => std::task::Poll::Ready(Some(r)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await;
    if let Some(r) = first {
        return r.map_err(too_large);
    }
    let within = std::time::Duration::from_secs(config.connections.body_timeout_s.max(1));
    match tokio::time::timeout(within, read).await {
        Ok(r) => r.map_err(too_large),
        Err(_) => Err(Rejection::new(
            StatusCode::REQUEST_TIMEOUT,
            jsonrpc::INVALID_REQUEST,
            format!(
                "request body not received within {} s (connections.body_timeout_s)",
                within.as_secs()
            ),
        )),
    }
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
