//! The store's vocabulary: what is kept per registration, the trait both backends
//! implement, and its errors.

use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::registration::Limits;
use crate::registration::Root;

/// Which backend a store is: the config's `[store] backend` names the same three.
pub use crate::config::StoreBackend as StoreKind;

/// Why a store operation failed. Messages name the file, never a token.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store could not be opened (start-up refuses to go on).
    #[error("registration store {path}: {message}")]
    Open { path: String, message: String },
    /// A write or read failed.
    #[error("registration store: {0}")]
    Failed(String),
    /// A write whose answer was lost and whose outcome could not be read back: it may have
    /// been committed (retrying a release is safe).
    #[error("registration store: outcome unknown ({0})")]
    Unknown(String),
    /// The store was closed.
    #[error("registration store is closed")]
    Closed,
}

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

/// A registration as the store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRegistration {
    pub id: String,
    pub agent_id: String,
    pub label: Option<String>,
    /// SHA-256 of the token (the token itself is never stored).
    pub token_sha256: [u8; 32],
    pub grants: Vec<String>,
    pub tools: Vec<StoredTool>,
    pub limits: Limits,
    pub roots: Option<Vec<Root>>,
    pub ttl_s: Option<u64>,
    /// Unix ms.
    pub created_at_ms: i64,
    /// Unix ms at which the lease ends; 0 = never.
    pub expires_at_ms: u64,
    /// The node that created it (`node_id`), if any.
    pub node: Option<String>,
    /// Calls of `max_calls` reserved by nodes so far (spent, or in a node's hand).
    pub calls_reserved: u64,
    /// A child registration's parent (issue 39): restored after it, released with it.
    pub parent: Option<String>,
}

impl StoredRegistration {
    /// Has its TTL passed at `now_ms`?
    pub fn expired_at(&self, now_ms: u64) -> bool {
        self.expires_at_ms != 0 && self.expires_at_ms <= now_ms
    }
}

/// How many calls of a `max_calls` budget a node may take from the store at once.
pub fn block_of(limits: &Limits, block: u64, durable: bool) -> u64 {
    match limits.max_calls {
        // A store that dies with the process loses nothing by handing out the whole budget:
        // the call path never goes back to it (the behaviour before the store).
        Some(max) if !durable => max,
        Some(max) => max.min(block.max(1)),
        None => 0,
    }
}

/// Counters of a store, for the benchmark and the logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Operations applied.
    pub ops: u64,
    /// Transactions committed (one fsync of the WAL each under `synchronous=FULL`).
    pub commits: u64,
}

/// The registration store. Every write resolves once it is durable (committed), or fails.
pub trait Store: Send + Sync {
    /// Which backend this is (`memory`, `sqlite` or `etcd`).
    fn kind(&self) -> StoreKind;
    /// The file, for a file-backed store.
    fn path(&self) -> Option<&Path>;
    /// Whether registrations survive the process (then budgets are reserved block by block).
    fn durable(&self) -> bool;
    /// Every registration kept, in creation order (start-up; expired ones included: the
    /// gateway audits and releases them).
    fn load_all(&self) -> BoxFuture<'_, Result<Vec<StoredRegistration>, StoreError>>;
    /// Adds a registration (its first budget block reserved in `calls_reserved`).
    fn create(&self, reg: StoredRegistration) -> BoxFuture<'_, Result<(), StoreError>>;
    /// Moves a registration's expiry; false if it is not in the store.
    fn renew(&self, id: &str, expires_at_ms: u64) -> BoxFuture<'_, Result<bool, StoreError>>;
    /// Removes a registration; false if it was not there. A committed release is final.
    fn release(&self, id: &str) -> BoxFuture<'_, Result<bool, StoreError>>;
    /// Reserves up to `want` more calls of a registration's `max_calls` (a compare-and-set in
    /// one transaction); returns how many were granted (0: the budget is spent, or the
    /// registration is gone).
    fn reserve(&self, id: &str, want: u64) -> BoxFuture<'_, Result<u64, StoreError>>;
    /// Gives back `unused` reserved calls (a clean stop: the block in hand, unspent).
    fn give_back(&self, id: &str, unused: u64) -> BoxFuture<'_, Result<(), StoreError>>;
    /// Counters.
    fn stats(&self) -> StoreStats;
    /// Finishes pending writes and stops the writer (idempotent).
    fn close(&self) -> BoxFuture<'_, ()>;
}
