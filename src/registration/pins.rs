//! A registration's tool surface, pinned at creation (issue 39): each granted tool's
//! definition (name, title, description, input and output schema, annotations, execution) by
//! digest, and how the upstreams' definitions drifted since. A tool its upstream removed
//! leaves the registration's list and its calls; a changed one is refused (the registration
//! keeps listing the definition it was made with, and calls answer a tool error) or followed
//! (the new definition is listed and served), per the upstream's `on_tool_change`. Tools that
//! newly match a glob grant are never added: the `ToolSet` is fixed at creation.
//!
//! Invariant: a registration's visible list changes only through [`Pins::compare`], which
//! says whether it did, so `tools/list_changed` goes only to registrations whose list changed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::config::OnToolChange;
use crate::sync::HashMap;
use crate::tools::ToolSet;

/// The members of a `Tool` object that make its contract (what the agent was told).
const DEFINITION: [&str; 7] = [
    "name",
    "title",
    "description",
    "inputSchema",
    "outputSchema",
    "annotations",
    "execution",
];

/// SHA-256 (hex) of a tool's definition: [`DEFINITION`]'s members, with every object's keys
/// sorted (an upstream that reorders keys has not changed its contract).
pub fn definition_digest(descriptor: &Value) -> String {
    let mut def = Map::new();
    for k in DEFINITION {
        if let Some(v) = descriptor.get(k) {
            def.insert(k.to_string(), canonical(v));
        }
    }
    let bytes = serde_json::to_vec(&Value::Object(def)).unwrap_or_default();
    hex::encode(Sha256::digest(&bytes))
}

/// `v` with every object's keys in sorted order.
fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), canonical(&m[k.as_str()])))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// How a pinned tool stands against its upstream's current definition.
#[derive(Debug, Clone, PartialEq)]
pub enum Drift {
    /// The upstream no longer has it: gone from the list, calls unknown.
    Removed,
    /// Changed, `on_tool_change = "refuse"`: listed as pinned, calls refused.
    Refused { digest: String },
    /// Changed, `on_tool_change = "follow"`: the new definition, listed and served.
    Followed {
        digest: String,
        descriptor: Arc<Value>,
    },
}

/// One tool whose standing changed in a [`Pins::compare`] (for the audit).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub tool: String,
    pub upstream: String,
    pub pinned: String,
    /// The new standing (None: back to the pinned definition).
    pub now: Option<Drift>,
}

/// What a [`Pins::compare`] found.
#[derive(Debug, Default)]
pub struct Compared {
    /// The registration's visible list (names or definitions) changed.
    pub list_changed: bool,
    pub changes: Vec<Change>,
}

/// The pinned definitions of one registration's tools and their drift.
#[derive(Debug)]
pub struct Pins {
    /// Per tool name, the digest pinned at creation.
    digests: HashMap<String, String>,
    /// SHA-256 over the sorted (name, digest) pairs: the surface as a whole.
    summary: String,
    drift: RwLock<HashMap<String, Drift>>,
    /// Any drift at all (a call reads this, not the lock, when there is none).
    drifted: AtomicBool,
}

impl Pins {
    pub fn of(tools: &ToolSet) -> Pins {
        let digests: HashMap<String, String> = tools
            .iter()
            .map(|t| (t.name.clone(), definition_digest(&t.descriptor)))
            .collect();
        let mut h = Sha256::new();
        // The ToolSet is in name order.
        for t in tools.iter() {
            h.update(t.name.as_bytes());
            h.update([0]);
            h.update(digests.get(&t.name).map_or("", |d| d.as_str()).as_bytes());
            h.update([0]);
        }
        Pins {
            digests,
            summary: hex::encode(h.finalize()),
            drift: RwLock::new(HashMap::default()),
            drifted: AtomicBool::new(false),
        }
    }

    /// The digest of the surface pinned at creation.
    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// The pinned digest of one tool.
    pub fn pinned(&self, name: &str) -> Option<&str> {
        self.digests.get(name).map(String::as_str)
    }

    /// Whether any of its tools drifted (one atomic load).
    pub fn drifted(&self) -> bool {
        self.drifted.load(Ordering::Acquire)
    }

    /// How `name` drifted, if it did.
    pub fn drift_of(&self, name: &str) -> Option<Drift> {
        if !self.drifted.load(Ordering::Acquire) {
            return None;
        }
        crate::sync::read(&self.drift).get(name).cloned()
    }

    /// The `tools` array of a `tools/list` result: removed tools left out, followed ones in
    /// their new definition, the rest as pinned.
    pub fn descriptors(&self, tools: &ToolSet) -> Vec<Value> {
        if !self.drifted.load(Ordering::Acquire) {
            return tools.descriptors();
        }
        let drift = crate::sync::read(&self.drift);
        tools
            .iter()
            .filter_map(|t| match drift.get(&t.name) {
                Some(Drift::Removed) => None,
                Some(Drift::Followed { descriptor, .. }) => Some((**descriptor).clone()),
                _ => Some((*t.descriptor).clone()),
            })
            .collect()
    }

    /// Compares this registration's tools of `upstream` with the upstream's current tools
    /// (`current`: exposed name → definition) and records the drift.
    pub fn compare(
        &self,
        tools: &ToolSet,
        upstream: &str,
        current: &HashMap<String, Arc<Value>>,
        policy: OnToolChange,
    ) -> Compared {
        let mut out = Compared::default();
        let mut drift = crate::sync::write(&self.drift);
        for t in tools.iter().filter(|t| t.upstream() == Some(upstream)) {
            let Some(pinned) = self.digests.get(&t.name) else {
                continue;
            };
            let now = match current.get(&t.name) {
                None => Some(Drift::Removed),
                Some(d) => {
                    let digest = definition_digest(d);
                    if &digest == pinned {
                        None
                    } else {
                        match policy {
                            OnToolChange::Refuse => Some(Drift::Refused { digest }),
                            OnToolChange::Follow => Some(Drift::Followed {
                                digest,
                                descriptor: d.clone(),
                            }),
                        }
                    }
                }
            };
            let before = drift.get(&t.name).cloned();
            if before == now {
                continue;
            }
            // The visible definition: None (not listed), else its digest.
            let visible = |d: &Option<Drift>| match d {
                Some(Drift::Removed) => None,
                Some(Drift::Followed { digest, .. }) => Some(digest.clone()),
                _ => Some(pinned.clone()),
            };
            if visible(&before) != visible(&now) {
                out.list_changed = true;
            }
            match &now {
                Some(d) => {
                    drift.insert(t.name.clone(), d.clone());
                }
                None => {
                    drift.remove(&t.name);
                }
            }
            out.changes.push(Change {
                tool: t.name.clone(),
                upstream: upstream.to_string(),
                pinned: pinned.clone(),
                now,
            });
        }
        self.drifted.store(!drift.is_empty(), Ordering::Release);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{Backend, GrantedTool};
    use serde_json::json;

    fn tool(name: &str, description: &str) -> GrantedTool {
        GrantedTool {
            name: name.into(),
            descriptor: Arc::new(
                json!({"name": name, "description": description, "inputSchema": {"type": "object", "properties": {"a": {"type": "string"}}}}),
            ),
            backend: Backend::Upstream {
                upstream: "up".into(),
                tool: name.into(),
                grant_name: format!("up.{name}"),
                task_support: crate::tools::TaskSupport::Forbidden,
            },
        }
    }

    fn current(tools: &[GrantedTool]) -> HashMap<String, Arc<Value>> {
        tools
            .iter()
            .map(|t| (t.name.clone(), t.descriptor.clone()))
            .collect()
    }

    #[test]
    fn digests_ignore_key_order_and_other_members() {
        let a = json!({"name": "x", "inputSchema": {"type": "object", "required": ["a"]}, "description": "d"});
        let b = json!({"description": "d", "inputSchema": {"required": ["a"], "type": "object"}, "name": "x", "_meta": {"k": 1}});
        assert_eq!(definition_digest(&a), definition_digest(&b));
        let c = json!({"name": "x", "inputSchema": {"type": "object", "required": ["a"]}, "description": "e"});
        assert_ne!(definition_digest(&a), definition_digest(&c));
    }

    #[test]
    fn refuse_keeps_the_list_follow_changes_it_removal_hides() {
        let set = ToolSet::new(vec![tool("up.a", "one"), tool("up.b", "two")]);
        let pins = Pins::of(&set);
        // Nothing changed: no list change, no drift.
        let same = pins.compare(
            &set,
            "up",
            &current(&[tool("up.a", "one"), tool("up.b", "two")]),
            OnToolChange::Refuse,
        );
        assert!(!same.list_changed && same.changes.is_empty());
        assert_eq!(pins.descriptors(&set), set.descriptors());
        // a changed, refused: listed as pinned, so no list change; one change for the audit.
        let changed = [tool("up.a", "ONE"), tool("up.b", "two")];
        let r = pins.compare(&set, "up", &current(&changed), OnToolChange::Refuse);
        assert!(!r.list_changed);
        assert_eq!(r.changes.len(), 1);
        assert!(matches!(pins.drift_of("up.a"), Some(Drift::Refused { .. })));
        assert_eq!(pins.descriptors(&set)[0]["description"], "one");
        // The same again: nothing new.
        let again = pins.compare(&set, "up", &current(&changed), OnToolChange::Refuse);
        assert!(again.changes.is_empty());
        // Followed: the list shows the new definition.
        let f = pins.compare(&set, "up", &current(&changed), OnToolChange::Follow);
        assert!(f.list_changed);
        assert_eq!(pins.descriptors(&set)[0]["description"], "ONE");
        // Removed: gone from the list.
        let gone = pins.compare(
            &set,
            "up",
            &current(&[tool("up.b", "two")]),
            OnToolChange::Follow,
        );
        assert!(gone.list_changed);
        assert_eq!(pins.descriptors(&set).len(), 1);
        assert_eq!(pins.drift_of("up.a"), Some(Drift::Removed));
        // Back as pinned: listed again, no drift left.
        let back = pins.compare(
            &set,
            "up",
            &current(&[tool("up.a", "one"), tool("up.b", "two")]),
            OnToolChange::Follow,
        );
        assert!(back.list_changed);
        assert_eq!(pins.drift_of("up.a"), None);
        assert_eq!(pins.descriptors(&set), set.descriptors());
    }
}
