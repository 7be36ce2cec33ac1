//! The first check of every agent request: its `Host` and `Origin` (403), against DNS
//! rebinding, before the registration is even looked up.

use axum::http::{header, HeaderMap, HeaderValue};

use super::Rejection;
use crate::config::Config;

/// Host and Origin (403): DNS-rebinding protection, before anything else.
pub fn check_host_origin(config: &Config, headers: &HeaderMap) -> Result<(), Rejection> {
    check_host_origin_values(
        config,
        headers.get(header::HOST),
        headers.get(header::ORIGIN),
    )
}

/// [`check_host_origin`] on the request's first `Host` and `Origin` values, already found.
pub fn check_host_origin_values(
    config: &Config,
    host: Option<&HeaderValue>,
    origin: Option<&HeaderValue>,
) -> Result<(), Rejection> {
    use crate::refusals::Reason;
    let checks = [
        (
            host,
            host_allowed as fn(&Config, &str) -> bool,
            Reason::Host,
            "forbidden: Host not allowed",
        ),
        (
            origin,
            origin_allowed,
            Reason::Origin,
            "forbidden: Origin not allowed",
        ),
    ];
    for (value, allowed, reason, why) in checks {
        // Absent: nothing to check. Present: readable and allowed.
        if value.is_some_and(|v| !v.to_str().is_ok_and(|v| allowed(config, v))) {
            return Err(Rejection::forbidden(reason, why));
        }
    }
    Ok(())
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
    // A byte scan (a `str` search costs more than a host); `:` is one byte.
    match hostport
        .bytes()
        .position(|c| c == b':')
        .map(|at| (&hostport[..at], &hostport[at + 1..]))
    {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `allowed` says yes to each of `ok` and no to each of `bad`.
    fn sorts(c: &Config, allowed: fn(&Config, &str) -> bool, ok: &[&str], bad: &[&str]) {
        for o in ok {
            assert!(allowed(c, o), "{o}");
        }
        for b in bad {
            assert!(!allowed(c, b), "{b}");
        }
    }

    #[test]
    fn loopback_origins() {
        let c = Config::default();
        let ok = [
            "http://localhost",
            "http://localhost:3000",
            "https://127.0.0.1:8080",
            "http://[::1]:99",
        ];
        let bad = [
            "http://evil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.nip.io",
            "null",
            "http://localhost:99999",
            "http://user@localhost",
        ];
        sorts(&c, origin_allowed, &ok, &bad);
    }

    #[test]
    fn hosts() {
        let mut c = Config {
            public_url: Some("https://gw.example:8443/base".into()),
            allowed_hosts: vec!["mcp.internal".into(), "other.internal:99".into()],
            ..Config::default()
        };
        let ok = [
            "localhost",
            "localhost:8787",
            "127.0.0.1:1",
            "[::1]:80",
            "gw.example:8443",
            "mcp.internal",
            "mcp.internal:1234",
            "other.internal:99",
        ];
        let bad = [
            "evil.example.com",
            "evil.example.com:8787",
            "gw.example:1",
            "other.internal:98",
            "127.0.0.1.nip.io",
            "localhost:99999",
            "",
            "[::1",
        ];
        sorts(&c, host_allowed, &ok, &bad);
        c.public_url = None;
        assert!(!host_allowed(&c, "gw.example:8443"));
    }
}
