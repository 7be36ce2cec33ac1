//! 2026-07-28 `subscriptions/listen` streams: per registration, what each open stream asked
//! to hear (tools/prompts/resources list changes, updates of some resource URIs). The hub
//! offers every list change and resource update of a registration here as well as to its
//! sessions; a stream gets only the types it asked for, each with
//! `_meta["io.modelcontextprotocol/subscriptionId"]` (the listen request's id). Each stream's
//! queue is bounded; a stream that does not read is closed, not fed by dropping.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde_json::Value;
use tokio::sync::mpsc;

use crate::sync::lock;

/// Messages queued per listen stream; a stream this far behind is closed.
pub const LISTEN_QUEUE: usize = 256;
/// Listen streams per registration; over it `subscriptions/listen` is refused (429).
pub const MAX_LISTENERS_PER_REGISTRATION: usize = 64;
/// Resource URIs one stream may subscribe to.
pub const MAX_URIS: usize = 256;

pub use crate::protocol::meta::SUBSCRIPTION_ID;

/// A task's status change, on the listen streams that named it (2026-07-28 tasks extension).
pub const TASKS_METHOD: &str = "notifications/tasks";

/// What one stream asked to hear (and was granted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub tools: bool,
    pub prompts: bool,
    pub resources: bool,
    pub uris: HashSet<String>,
    /// Tasks (the gateway's ids, the registration's own) whose `notifications/tasks` the
    /// stream hears (the 2026-07-28 tasks extension).
    pub task_ids: HashSet<String>,
}

impl Filter {
    fn wants(&self, msg: &Value) -> bool {
        use crate::protocol::Notice;
        match Notice::of_message(msg) {
            Notice::ToolsListChanged => self.tools,
            Notice::PromptsListChanged => self.prompts,
            Notice::ResourcesListChanged => self.resources,
            Notice::ResourcesUpdated => msg
                .pointer("/params/uri")
                .and_then(Value::as_str)
                .is_some_and(|u| self.uris.contains(u)),
            Notice::Other if msg.get("method").and_then(Value::as_str) == Some(TASKS_METHOD) => msg
                .pointer("/params/taskId")
                .and_then(Value::as_str)
                .is_some_and(|t| self.task_ids.contains(t)),
            Notice::Log | Notice::TaskStatus | Notice::Other => false,
        }
    }
}

struct Listener {
    key: u64,
    subscription_id: Value,
    filter: Filter,
    tx: mpsc::Sender<Value>,
}

#[derive(Default)]
pub struct Listeners {
    map: Mutex<HashMap<String, Vec<Listener>>>,
    next: AtomicU64,
}

impl Listeners {
    /// Adds a stream; `None` when the registration has [`MAX_LISTENERS_PER_REGISTRATION`].
    pub fn add(
        &self,
        registration_id: &str,
        subscription_id: Value,
        filter: Filter,
    ) -> Option<(u64, mpsc::Receiver<Value>)> {
        let (tx, rx) = mpsc::channel(LISTEN_QUEUE);
        let key = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut map = lock(&self.map);
        let v = map.entry(registration_id.to_owned()).or_default();
        if v.len() >= MAX_LISTENERS_PER_REGISTRATION {
            return None;
        }
        v.push(Listener {
            key,
            subscription_id,
            filter,
            tx,
        });
        Some((key, rx))
    }

    /// Removes stream `key` (the client closed it, or it ended).
    pub fn remove(&self, registration_id: &str, key: u64) {
        let mut map = lock(&self.map);
        if let Some(v) = map.get_mut(registration_id) {
            v.retain(|l| l.key != key);
            if v.is_empty() {
                map.remove(registration_id);
            }
        }
    }

    /// Offers a notification to a registration's streams; returns how many took it. A stream
    /// whose queue is full is closed (its sender dropped: the stream ends).
    pub fn deliver(&self, registration_id: &str, msg: &Value) -> usize {
        let mut map = lock(&self.map);
        let Some(v) = map.get_mut(registration_id) else {
            return 0;
        };
        let mut n = 0;
        v.retain(|l| {
            if !l.filter.wants(msg) {
                return true;
            }
            let mut m = msg.clone();
            if let Some(p) = m.as_object_mut().map(|o| {
                o.entry("params")
                    .or_insert_with(|| Value::Object(Default::default()))
            }) {
                if let Some(meta) = p
                    .as_object_mut()
                    .map(|p| p.entry(crate::protocol::meta::META).or_insert_with(|| Value::Object(Default::default())))
                    .and_then(Value::as_object_mut)
                {
                    meta.insert(SUBSCRIPTION_ID.into(), l.subscription_id.clone());
                }
            }
            // bounded: LISTEN_QUEUE; a stream that far behind is closed (kept: false).
            match l.tx.try_send(m) { // bounded: LISTEN_QUEUE; full → the stream is closed
                Ok(()) => {
                    n += 1;
                    true
                }
                Err(_) => {
                    tracing::warn!(registration = %registration_id, "a subscriptions/listen stream that does not read is closed");
                    false
                }
            }
        });
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_stream_gets_what_it_asked_for_with_its_subscription_id() {
        let t = Listeners::default();
        let filter = Filter {
            tools: true,
            uris: ["a://1".to_string()].into(),
            ..Filter::default()
        };
        let (key, mut rx) = t.add("r", json!(9), filter).unwrap();
        let tools = json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"});
        let prompts = json!({"jsonrpc": "2.0", "method": "notifications/prompts/list_changed"});
        let up1 = json!({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": "a://1"}});
        let up2 = json!({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": "a://2"}});
        assert_eq!(t.deliver("r", &tools), 1);
        assert_eq!(t.deliver("r", &prompts), 0);
        assert_eq!(t.deliver("r", &up2), 0);
        assert_eq!(t.deliver("r", &up1), 1);
        assert_eq!(t.deliver("other", &tools), 0);
        let got = rx.try_recv().unwrap();
        assert_eq!(got["params"]["_meta"][SUBSCRIPTION_ID], 9);
        assert_eq!(rx.try_recv().unwrap()["params"]["uri"], "a://1");
        t.remove("r", key);
        assert_eq!(t.deliver("r", &tools), 0, "removed");
    }

    #[test]
    fn a_stream_that_does_not_read_is_closed() {
        let t = Listeners::default();
        let filter = Filter {
            tools: true,
            ..Filter::default()
        };
        let (_key, mut rx) = t.add("r", json!(1), filter).unwrap();
        let tools = json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"});
        for _ in 0..LISTEN_QUEUE {
            assert_eq!(t.deliver("r", &tools), 1);
        }
        assert_eq!(t.deliver("r", &tools), 0);
        let mut n = 0;
        while rx.try_recv().is_ok() {
            n += 1;
        }
        assert_eq!(n, LISTEN_QUEUE);
        assert!(rx.is_closed(), "closed, not fed by dropping");
    }
}
