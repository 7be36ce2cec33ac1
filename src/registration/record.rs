//! A registration's durable fields ([`Record`]), exactly as every store keeps them: the
//! `memory` store holds the value, `sqlite` one row per record (a column per field, the lists
//! as JSON), and `etcd` the value's JSON (its serde form below, the token digest in hex).
//!
//! Invariant: the token itself is never in a record, only its SHA-256 digest.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::tools::{Backend, GrantedTool, InProcessTool, ToolSet};

use super::{Limits, Root};

/// One tool of a registration as stored: enough to serve `tools/list` and route a call
/// after a restart without asking the upstream first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StoredTool {
    /// The name the agent sees.
    pub name: String,
    /// Upstream tools: the upstream's id (absent: an in-process tool of the gateway catalog,
    /// found again by name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// Upstream tools: the tool's name at the upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// Upstream tools: `<upstream>.<tool after rename>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_name: Option<String>,
    /// Upstream tools: the `Tool` object served in `tools/list`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub descriptor: Option<Arc<Value>>,
}

impl StoredTool {
    /// A granted tool as stored: an upstream tool whole, an in-process one by name.
    pub fn of(t: &GrantedTool) -> StoredTool {
        match &t.backend {
            Backend::InProcess(_) => StoredTool {
                name: t.name.clone(),
                upstream: None,
                tool: None,
                grant_name: None,
                descriptor: None,
            },
            Backend::Upstream {
                upstream,
                tool,
                grant_name,
                ..
            } => StoredTool {
                name: t.name.clone(),
                upstream: Some(upstream.clone()),
                tool: Some(tool.clone()),
                grant_name: Some(grant_name.clone()),
                descriptor: Some(t.descriptor.clone()),
            },
        }
    }
}

/// A registration as the store keeps it. Its serde form is the `etcd` store's value (the
/// field names and order of DESIGN.md's store format; unknown fields are ignored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    pub agent_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// SHA-256 of the token (the token itself is never stored); hex in JSON.
    #[serde(with = "hex_digest")]
    pub token_sha256: [u8; 32],
    pub grants: Vec<String>,
    pub tools: Vec<StoredTool>,
    pub limits: Limits,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roots: Option<Vec<Root>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
    /// Unix ms.
    pub created_at_ms: i64,
    /// Unix ms at which the lease ends; 0 = never.
    pub expires_at_ms: u64,
    /// The node that created it (`node_id`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Calls of `max_calls` reserved by nodes so far (spent, or in a node's hand).
    pub calls_reserved: u64,
    /// A child registration's parent (issue 39): restored after it, released with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Its upstream credentials (issue 47), each sealed (`store::seal`), by upstream id;
    /// never in clear.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<BTreeMap<String, String>>,
}

impl Record {
    /// Has its TTL passed at `now_ms`?
    pub fn expired_at(&self, now_ms: u64) -> bool {
        self.expires_at_ms != 0 && self.expires_at_ms <= now_ms
    }

    /// The tool set it is served with again: upstream tools as stored (their connection
    /// opens on the first call), in-process ones found again in `catalog` by name (one no
    /// longer there is left out).
    pub fn tool_set(&self, catalog: &BTreeMap<String, InProcessTool>) -> ToolSet {
        let mut tools = Vec::with_capacity(self.tools.len());
        for t in &self.tools {
            match (&t.upstream, &t.tool, &t.grant_name, &t.descriptor) {
                (Some(upstream), Some(tool), Some(grant_name), Some(descriptor)) => {
                    tools.push(GrantedTool {
                        name: t.name.clone(),
                        descriptor: descriptor.clone(),
                        backend: Backend::Upstream {
                            upstream: upstream.clone(),
                            tool: tool.clone(),
                            grant_name: grant_name.clone(),
                            task_support: crate::tools::task_support(descriptor),
                        },
                    })
                }
                _ => match catalog.get(&t.name) {
                    Some(p) => tools.push(GrantedTool {
                        name: t.name.clone(),
                        descriptor: p.shared_descriptor(),
                        backend: Backend::InProcess(p.clone()),
                    }),
                    None => {
                        tracing::warn!(tool = %t.name, "restored registration: in-process tool no longer in the catalog")
                    }
                },
            }
        }
        ToolSet::new(tools)
    }
}

/// Sorts records for a restore: parents before their children (a child may share its
/// parent's millisecond), then by creation time.
pub fn restore_order(all: &mut [Record]) {
    let depth_of = {
        let parents: std::collections::HashMap<&str, Option<&str>> = all
            .iter()
            .map(|s| (s.id.as_str(), s.parent.as_deref()))
            .collect();
        all.iter()
            .map(|s| {
                let mut d = 0usize;
                let mut at = s.parent.as_deref();
                while let Some(p) = at.filter(|_| d < 64) {
                    d += 1;
                    at = parents.get(p).copied().flatten();
                }
                (s.id.clone(), d)
            })
            .collect::<std::collections::HashMap<String, usize>>()
    };
    all.sort_by_key(|s| (depth_of.get(&s.id).copied().unwrap_or(0), s.created_at_ms));
}

/// Each stored child's agent ids from its root down (`Family::child_of`'s `agent_path`), read
/// from the stored rows' parents; an ancestor the store no longer holds ends the walk (the
/// path then starts at the oldest one it holds).
pub fn agent_paths(all: &[Record]) -> std::collections::HashMap<String, Vec<String>> {
    let rows: std::collections::HashMap<&str, &Record> =
        all.iter().map(|s| (s.id.as_str(), s)).collect();
    all.iter()
        .filter(|s| s.parent.is_some())
        .map(|s| {
            let mut path = vec![s.agent_id.clone()];
            let mut at = s.parent.as_deref();
            while let Some(p) = at.and_then(|p| rows.get(p)).filter(|_| path.len() <= 64) {
                path.push(p.agent_id.clone());
                at = p.parent.as_deref();
            }
            path.reverse();
            (s.id.clone(), path)
        })
        .collect()
}

/// The token digest as 64 hex characters (the `etcd` value's `token_sha256`).
mod hex_digest {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let text = String::deserialize(d)?;
        let mut digest = [0u8; 32];
        hex::decode_to_slice(&text, &mut digest).map_err(serde::de::Error::custom)?;
        Ok(digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_etcd_form_is_the_old_documents_field_for_field() {
        // A value as the etcd store wrote it before `Record` (its `Doc`), unknown field and
        // all: read back, and written again to the same JSON.
        let old = serde_json::json!({
            "id": "n1.abc", "agent_id": "a", "label": "l",
            "token_sha256": hex::encode([7u8; 32]),
            "grants": ["up.*"],
            "tools": [{"name": "up.t", "upstream": "up", "tool": "t", "grant_name": "up.t",
                       "descriptor": {"name": "up.t"}}],
            "limits": {"max_calls": 5}, "roots": [{"uri": "file:///w"}], "ttl_s": 60,
            "created_at_ms": 1, "expires_at_ms": 2, "node": "n1", "calls_reserved": 3,
            "parent": "p"
        });
        let r: Record = serde_json::from_value(old.clone()).unwrap();
        assert_eq!(r.token_sha256, [7u8; 32]);
        assert_eq!(r.limits.max_calls, Some(5));
        assert_eq!(serde_json::to_value(&r).unwrap(), old);
        let order: Vec<String> = serde_json::from_slice::<serde_json::Map<String, Value>>(
            &serde_json::to_vec(&r).unwrap(),
        )
        .unwrap()
        .keys()
        .cloned()
        .collect();
        assert_eq!(order.len(), 14);
        let mut minimal = old.clone();
        for k in ["label", "roots", "ttl_s", "node", "parent"] {
            minimal.as_object_mut().unwrap().remove(k);
        }
        minimal["extra"] = serde_json::json!(1);
        let m: Record = serde_json::from_value(minimal).unwrap();
        assert!(m.label.is_none() && m.parent.is_none());
        let text = serde_json::to_string(&m).unwrap();
        assert!(!text.contains("extra") && !text.contains("label"));
        let mut bad = old;
        bad["token_sha256"] = serde_json::json!("zz");
        assert!(serde_json::from_value::<Record>(bad).is_err());
    }
}
