//! The store's vocabulary: the trait every backend implements (each keeps
//! `registration::Record`s), and its errors.

use std::path::Path;

use crate::registration::Limits;
use crate::registration::Record;
use futures::future::BoxFuture;

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
    fn path(&self) -> Option<&Path> {
        None
    }
    /// Whether registrations survive the process (then budgets are reserved block by block):
    /// every kind but `memory`.
    fn durable(&self) -> bool {
        self.kind() != StoreKind::Memory
    }
    /// Every registration kept, in creation order (start-up; expired ones included: the
    /// gateway audits and releases them).
    fn load_all(&self) -> BoxFuture<'_, Result<Vec<Record>, StoreError>>;
    /// Adds a registration (its first budget block reserved in `calls_reserved`).
    fn create(&self, reg: Record) -> BoxFuture<'_, Result<(), StoreError>>;
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
