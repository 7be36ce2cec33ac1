//! The query of `GET /v1/audit`: filters, `limit`, `max_bytes`; each bad value answered
//! with a message naming the parameter and what it takes.

use crate::audit::{Filter, Outcome};

/// The most records one answer holds.
pub const MAX_LIMIT: usize = 1000;
/// The most bytes of the chain one answer reads (8 MiB).
pub const MAX_BYTES_CAP: u64 = 8 << 20;
/// Defaults: 100 records, from the last 1 MiB.
pub const DEFAULT_LIMIT: usize = 100;
pub const DEFAULT_MAX_BYTES: u64 = 1 << 20;
/// The longest filter value accepted (an audit field is cut well below this).
const MAX_VALUE_BYTES: usize = 2048;

/// A parsed `GET /v1/audit` query.
#[derive(Debug, Clone)]
pub struct AuditQuery {
    pub filter: Filter,
    pub limit: usize,
    pub max_bytes: u64,
}

impl AuditQuery {
    /// Parses `agent_id`, `tool`, `outcome`, `event`, `registration_id`, `limit` (1-1000),
    /// `max_bytes` (1024-8388608). An empty value means no filter.
    pub fn parse(raw: &str) -> Result<AuditQuery, String> {
        let uri = format!("/?{raw}");
        let uri: axum::http::Uri = uri
            .parse()
            .map_err(|_| "the query is not a valid URL query".to_string())?;
        let pairs = axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&uri)
            .map_err(|_| "the query is not valid (percent-encoding or form encoding)".to_string())?
            .0;
        let mut q = AuditQuery {
            filter: Filter::default(),
            limit: DEFAULT_LIMIT,
            max_bytes: DEFAULT_MAX_BYTES,
        };
        for (k, v) in pairs {
            if v.len() > MAX_VALUE_BYTES {
                return Err(format!("{k}: at most {MAX_VALUE_BYTES} bytes"));
            }
            let text = (!v.is_empty()).then(|| v.clone());
            match k.as_str() {
                "agent_id" => q.filter.agent_id = text,
                "tool" => q.filter.tool = text,
                "registration_id" => q.filter.registration_id = text,
                "event" => q.filter.event = text,
                "trace_id" => q.filter.trace_id = text,
                "outcome" => {
                    if let Some(o) = &text {
                        if !Outcome::ALL.iter().any(|k| k.as_str() == o) {
                            let all: Vec<&str> = Outcome::ALL.iter().map(|k| k.as_str()).collect();
                            return Err(format!(
                                "outcome: must be one of {} (got {:?})",
                                all.join(", "),
                                cut(o)
                            ));
                        }
                    }
                    q.filter.outcome = text;
                }
                "limit" => q.limit = within("limit", &v, 1, MAX_LIMIT)?,
                "max_bytes" => q.max_bytes = within("max_bytes", &v, 1024, MAX_BYTES_CAP)?,
                other => {
                    return Err(format!(
                        "{}: unknown parameter (expected agent_id, tool, outcome, event, registration_id, limit, max_bytes)",
                        cut(other)
                    ))
                }
            }
        }
        Ok(q)
    }
}

/// A value quoted back in an error, at most 64 bytes of it.
/// Parameter `name`'s value `v` as an integer from `lo` to `hi`, or the message that says so.
fn within<T>(name: &str, v: &str, lo: T, hi: T) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display,
{
    match v.parse::<T>() {
        Ok(n) if lo <= n && n <= hi => Ok(n),
        _ => Err(format!(
            "{name}: must be an integer from {lo} to {hi} (got {:?})",
            cut(v)
        )),
    }
}

fn cut(s: &str) -> &str {
    crate::audit::prefix(s, 64)
}

// Unit tests only (never built into the daemon): an unwrap that fails is the test failing.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn good_queries_parse_and_bad_ones_name_the_parameter() {
        let q =
            AuditQuery::parse("agent_id=a%20b&tool=&outcome=ok&limit=5&max_bytes=4096").unwrap();
        assert_eq!(q.filter.agent_id.as_deref(), Some("a b"));
        assert_eq!(q.filter.tool, None);
        assert_eq!(q.filter.outcome.as_deref(), Some("ok"));
        assert_eq!((q.limit, q.max_bytes), (5, 4096));
        let d = AuditQuery::parse("").unwrap();
        assert_eq!((d.limit, d.max_bytes), (DEFAULT_LIMIT, DEFAULT_MAX_BYTES));
        for (bad, starts) in [
            ("limit=0", "limit:"),
            ("limit=abc", "limit:"),
            ("limit=1001", "limit:"),
            ("max_bytes=10", "max_bytes:"),
            ("max_bytes=99999999999", "max_bytes:"),
            ("outcome=great", "outcome:"),
            ("colour=red", "colour: unknown parameter"),
        ] {
            let e = AuditQuery::parse(bad).unwrap_err();
            assert!(e.starts_with(starts), "{bad}: {e}");
        }
    }
}
