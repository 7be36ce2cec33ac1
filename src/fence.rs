//! The freshness fence of a cluster node (issue 36, CLUSTER.md §5.4), and what the node knows
//! of its peers' applied revisions. `gateway::cluster` drives it; the data listener asks it.
//!
//! A node serves MCP paths only while it is fresh: while it has seen, within the bound B, its
//! own heartbeat write come back through its watch (or a linearizable range read complete).
//! Everything committed before that write was applied before it, so a release committed at
//! t is honoured by every serving node from t + B on. When the proof runs out, the node
//! fences: 503 + `Retry-After` on `/gw/…`, and every call in flight is cancelled (calls take
//! the current [`Fence::token`] and stop when it fires).
//!
//! Invariant: outside a cluster (`enabled` false) the fence is never closed and costs one
//! atomic load per request (tests/cluster.rs tests it closed).

// Driven by `gateway::cluster` (feature `cluster`); without it only `is_fenced`/`token` are
// asked (and always answer "open").
#![cfg_attr(not(feature = "cluster"), allow(dead_code))]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::sync::lock;

#[derive(Debug)]
pub struct Fence {
    enabled: AtomicBool,
    fenced: AtomicBool,
    /// Fired when the node fences; replaced by a fresh one when it serves again.
    token: Mutex<CancellationToken>,
    /// Live peers (this node included): node id → the revision it has applied.
    peers: Mutex<BTreeMap<String, i64>>,
    /// Woken whenever `peers` changes.
    changed: tokio::sync::Notify,
    /// This node's id (its own entry in `peers`).
    own: Mutex<String>,
    /// The store revision this node has applied (what a decision made now is made against).
    applied: AtomicU64,
}

impl Default for Fence {
    fn default() -> Self {
        Fence {
            enabled: AtomicBool::new(false),
            fenced: AtomicBool::new(false),
            token: Mutex::new(CancellationToken::new()),
            peers: Mutex::new(BTreeMap::new()),
            changed: tokio::sync::Notify::new(),
            own: Mutex::new(String::new()),
            applied: AtomicU64::new(0),
        }
    }
}

/// Who acknowledged a release within the bound, and who did not (and so fenced).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Acks {
    pub revision: i64,
    pub acked: Vec<String>,
    pub fenced: Vec<String>,
    pub waited: Duration,
}

impl Fence {
    /// Turns the fence on, closed (a cluster node starts fenced until its first proof).
    pub fn enable(&self, node: &str) {
        *lock(&self.own) = node.to_string();
        self.fenced.store(true, Ordering::Release);
        lock(&self.token).cancel();
        self.enabled.store(true, Ordering::Release);
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    /// Is the node fenced (MCP paths answer 503)?
    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// Closes the fence: in-flight calls are cancelled. True if it was open.
    pub fn close(&self) -> bool {
        let was_open = !self.fenced.swap(true, Ordering::AcqRel);
        if was_open {
            lock(&self.token).cancel();
        }
        was_open
    }

    /// Opens the fence. True if it was closed.
    pub fn open(&self) -> bool {
        let mut token = lock(&self.token);
        if token.is_cancelled() {
            *token = CancellationToken::new();
        }
        drop(token);
        self.fenced.swap(false, Ordering::AcqRel)
    }

    /// The store revision this node has applied (the cluster's replica sets it).
    pub fn set_applied(&self, revision: u64) {
        self.applied.fetch_max(revision, Ordering::AcqRel);
    }

    /// The store revision a decision made now uses (a call's admission; the audit record's
    /// `store_revision`): `None` outside a cluster, where it costs one atomic load.
    pub fn decided_at(&self) -> Option<u64> {
        if !self.enabled() {
            return None;
        }
        Some(self.applied.load(Ordering::Acquire))
    }

    /// The token a call stops on when the node fences (`None` outside a cluster).
    pub fn token(&self) -> Option<CancellationToken> {
        if !self.enabled() {
            return None;
        }
        Some(lock(&self.token).clone())
    }

    /// A peer's applied revision (from its heartbeat).
    pub fn peer_applied(&self, node: &str, revision: i64) {
        {
            let mut peers = lock(&self.peers);
            match peers.get_mut(node) {
                Some(r) => *r = (*r).max(revision),
                None => {
                    peers.insert(node.to_string(), revision);
                }
            }
        }
        self.changed.notify_waiters();
    }

    /// A peer's heartbeat key went away (its lease ended: the node is gone).
    pub fn peer_gone(&self, node: &str) {
        lock(&self.peers).remove(node);
        self.changed.notify_waiters();
    }

    /// How many nodes are live (heartbeat keys known, this one included once it has beaten).
    pub fn live(&self) -> usize {
        lock(&self.peers).len()
    }

    /// Replaces the peer set (after a full read).
    pub fn set_peers(&self, peers: BTreeMap<String, i64>) {
        *lock(&self.peers) = peers;
        self.changed.notify_waiters();
    }

    /// Waits until every live peer has applied `revision`, or `bound` has passed. The live
    /// peers are those this node knows of once it has applied `revision - 1` itself (every
    /// heartbeat key committed before the release), so its own entry is waited for first.
    pub async fn await_applied(&self, revision: i64, bound: Duration) -> Acks {
        let start = Instant::now();
        let deadline = tokio::time::Instant::now() + bound;
        let own = lock(&self.own).clone();
        loop {
            let changed = self.changed.notified();
            let (acked, behind): (Vec<_>, Vec<_>) = lock(&self.peers)
                .iter()
                .map(|(n, r)| (n.clone(), *r >= revision))
                .partition(|(_, ok)| *ok);
            let own_done = own.is_empty() || acked.iter().any(|(n, _)| *n == own);
            if (own_done && behind.is_empty()) || tokio::time::Instant::now() >= deadline {
                return Acks {
                    revision,
                    acked: acked.into_iter().map(|(n, _)| n).collect(),
                    fenced: behind.into_iter().map(|(n, _)| n).collect(),
                    waited: start.elapsed(),
                };
            }
            let _ = tokio::time::timeout_at(deadline, changed).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_release_waits_for_every_peer_or_the_bound() {
        let f = Fence::default();
        assert!(f.token().is_none(), "off outside a cluster");
        f.enable("a");
        assert!(f.is_fenced());
        let t = f.token().unwrap_or_default();
        assert!(t.is_cancelled(), "a closed fence's token has fired");
        assert!(f.open());
        let t = f.token().unwrap_or_default();
        assert!(!t.is_cancelled());
        f.peer_applied("a", 10);
        f.peer_applied("b", 5);
        let acks = f.await_applied(7, Duration::from_millis(50)).await;
        assert_eq!(acks.acked, vec!["a".to_string()]);
        assert_eq!(acks.fenced, vec!["b".to_string()]);
        assert!(acks.waited >= Duration::from_millis(50));
        f.peer_applied("b", 8);
        let acks = f.await_applied(7, Duration::from_secs(5)).await;
        assert_eq!(acks.fenced, Vec::<String>::new());
        assert!(f.close());
        assert!(t.is_cancelled(), "fencing fires the calls' token");
    }
}
