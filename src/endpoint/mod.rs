//! Agent-facing endpoints: the checks every request passes (Origin, registration, token) and
//! the transports (`sse`: legacy HTTP+SSE; `streamable_http`: Streamable HTTP, both eras,
//! with its stateless 2026-07-28 half in `stateless`).

pub mod event_stream;
pub mod rejection;
pub mod reply;
pub mod sse;
pub mod stateless;
pub mod streamable_http;

use std::sync::Arc;

use axum::body::Body;
use axum::http::header::{AsHeaderName, HeaderName};
use axum::http::{header, HeaderMap, StatusCode};
use bytes::Bytes;

use crate::config::Config;
use crate::hub::Hub;
use crate::mcp::jsonrpc;
use crate::registry::RegistrationState;
pub use rejection::{json_response, Rejection};

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

/// Splits `host[:port]` (IPv6 in brackets); `None` if malformed.
fn split_host(hostport: &str) -> Option<(&str, Option<&str>)> {
    if let Some(v6) = hostport.strip_prefix('[') {
        let (h, rest) = v6.split_once(']')?;
        return match rest.strip_prefix(':') {
            None if rest.is_empty() => Some((h, None)),
            Some(p) if valid_port(p) => Some((h, Some(p))),
            _ => None,
        };
    }
    match hostport.split_once(':') {
        Some((h, p)) if valid_port(p) && !h.is_empty() => Some((h, Some(p))),
        Some(_) => None,
        None if !hostport.is_empty() => Some((hostport, None)),
        None => None,
    }
}

/// Is a `Host` header allowed? Loopback hosts (any port), the host of `public_url`, and
/// `allowed_hosts` entries (`host` for any port, or exact `host:port`). DNS rebinding makes
/// a hostile name resolve to this listener; its Host header gives it away.
pub fn host_allowed(config: &Config, host: &str) -> bool {
    let Some((name, port)) = split_host(host) else {
        return false;
    };
    if name.eq_ignore_ascii_case("localhost") || name == "127.0.0.1" || name == "::1" {
        return true;
    }
    let public = config.public_url.as_deref().and_then(|u| {
        let rest = u
            .strip_prefix("http://")
            .or_else(|| u.strip_prefix("https://"))?;
        rest.split('/').next()
    });
    public
        .into_iter()
        .chain(config.allowed_hosts.iter().map(String::as_str))
        .filter_map(split_host)
        .any(|(h, p)| h.eq_ignore_ascii_case(name) && (p.is_none() || p == port))
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

/// The checks every agent request passes, in order: Host and Origin (403), registration
/// (404), token (401). The token is compared with this registration's token only.
pub fn authorize(
    gw: &Hub,
    id: &str,
    headers: &HeaderMap,
) -> Result<Arc<RegistrationState>, Rejection> {
    if let Some(host) = headers.get(header::HOST) {
        let ok = host.to_str().is_ok_and(|h| host_allowed(gw.config(), h));
        if !ok {
            return Err(Rejection::forbidden("forbidden: Host not allowed"));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let ok = origin
            .to_str()
            .is_ok_and(|o| origin_allowed(gw.config(), o));
        if !ok {
            return Err(Rejection::forbidden("forbidden: Origin not allowed"));
        }
    }
    let Some(reg) = gw.registry().get(id) else {
        return Err(Rejection::not_found("registration not found"));
    };
    match bearer(headers) {
        None => Err(Rejection::unauthorized("missing bearer token")),
        Some(t) if reg.token_matches(t) => Ok(reg),
        Some(_) => Err(Rejection::unauthorized("invalid bearer token")),
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
pub async fn read_body(body: Body, limit: usize) -> Result<Bytes, Rejection> {
    axum::body::to_bytes(body, limit).await.map_err(|_| {
        Rejection::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            jsonrpc::INVALID_REQUEST,
            format!("request body exceeds the limit of {limit} bytes"),
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

    #[test]
    fn hosts() {
        let mut c = Config {
            public_url: Some("https://gw.example:8443/base".into()),
            allowed_hosts: vec!["mcp.internal".into(), "other.internal:99".into()],
            ..Config::default()
        };
        for ok in [
            "localhost",
            "localhost:8787",
            "127.0.0.1:1",
            "[::1]:80",
            "gw.example:8443",
            "mcp.internal",
            "mcp.internal:1234",
            "other.internal:99",
        ] {
            assert!(host_allowed(&c, ok), "{ok}");
        }
        for bad in [
            "evil.example.com",
            "evil.example.com:8787",
            "gw.example:1",
            "other.internal:98",
            "127.0.0.1.nip.io",
            "localhost:99999",
            "",
            "[::1",
        ] {
            assert!(!host_allowed(&c, bad), "{bad}");
        }
        c.public_url = None;
        assert!(!host_allowed(&c, "gw.example:8443"));
    }
}
