//! Agent-facing endpoints: the checks every request passes (Origin, registration, token) and
//! the transports (`sse`: legacy HTTP+SSE; `streamable_http`: Streamable HTTP, both eras,
//! with its stateless 2026-07-28 half in `stateless`).

pub mod sse;
pub mod stateless;
pub mod streamable_http;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use crate::config::Config;
use crate::gateway::Gateway;
use crate::mcp::jsonrpc;
use crate::registry::RegistrationState;

/// An HTTP error whose body is a JSON-RPC error with a null id.
pub fn http_error(status: StatusCode, code: i64, message: &str) -> Response {
    json_response(status, &jsonrpc::error_response(None, code, message, None))
}

/// A JSON body with a status.
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response()
}

fn unauthorized(message: &str) -> Response {
    let mut r = http_error(StatusCode::UNAUTHORIZED, jsonrpc::INVALID_REQUEST, message);
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"gatehouse\""),
    );
    r
}

/// Is a present `Origin` allowed? Loopback origins are, by default; others only if listed.
pub fn origin_allowed(config: &Config, origin: &str) -> bool {
    if config.allowed_origins.iter().any(|o| o == origin) {
        return true;
    }
    if !config.allow_loopback_origins {
        return false;
    }
    let rest = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    let Some(hostport) = rest else { return false };
    if hostport.contains('/') || hostport.contains('@') {
        return false;
    }
    let host = if let Some(v6) = hostport.strip_prefix('[') {
        match v6.split_once(']') {
            Some((h, port)) if port.is_empty() || valid_port(port) => return h == "::1",
            _ => return false,
        }
    } else {
        match hostport.split_once(':') {
            Some((h, port)) if valid_port(port) => h,
            Some(_) => return false,
            None => hostport,
        }
    };
    host.eq_ignore_ascii_case("localhost") || host == "127.0.0.1"
}

fn valid_port(p: &str) -> bool {
    p.strip_prefix(':')
        .unwrap_or(p)
        .parse::<u16>()
        .is_ok_and(|_| !p.is_empty())
}

/// The bearer token of a request, if it has one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The checks every agent request passes, in order: Origin (403), registration (404),
/// token (401). The token is compared with this registration's token only.
pub fn authorize(
    gw: &Gateway,
    id: &str,
    headers: &HeaderMap,
) -> Result<Arc<RegistrationState>, Response> {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let ok = origin
            .to_str()
            .is_ok_and(|o| origin_allowed(gw.config(), o));
        if !ok {
            return Err(http_error(
                StatusCode::FORBIDDEN,
                jsonrpc::INVALID_REQUEST,
                "forbidden: Origin not allowed",
            ));
        }
    }
    let Some(reg) = gw.registry().get(id) else {
        return Err(http_error(
            StatusCode::NOT_FOUND,
            jsonrpc::INVALID_REQUEST,
            "registration not found",
        ));
    };
    match bearer(headers) {
        None => Err(unauthorized("missing bearer token")),
        Some(t) if reg.token_matches(t) => Ok(reg),
        Some(_) => Err(unauthorized("invalid bearer token")),
    }
}

/// Is the request's Content-Type JSON?
pub fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

/// Reads a body up to the configured limit (413 above it).
pub async fn read_body(body: Body, limit: usize) -> Result<Bytes, Response> {
    axum::body::to_bytes(body, limit).await.map_err(|_| {
        http_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            jsonrpc::INVALID_REQUEST,
            &format!("request body exceeds the limit of {limit} bytes"),
        )
    })
}

/// A query parameter's value (no percent-decoding is needed for our ids).
pub fn query_param<'a>(query: Option<&'a str>, names: &[&str]) -> Option<&'a str> {
    query?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        names.contains(&k).then_some(v)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_origins() {
        let c = Config::default();
        for ok in [
            "http://localhost",
            "http://localhost:3000",
            "https://127.0.0.1:8080",
            "http://[::1]:99",
        ] {
            assert!(origin_allowed(&c, ok), "{ok}");
        }
        for bad in [
            "http://evil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.nip.io",
            "null",
            "http://localhost:99999",
            "http://user@localhost",
        ] {
            assert!(!origin_allowed(&c, bad), "{bad}");
        }
    }
}
