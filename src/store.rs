//! The registration store: where registrations are kept so that they outlive the process.
//! Requests are served from the in-memory table (`registry`); the store is written through,
//! and the gateway answers a create, renew or release only once the store has committed it.
//!
//! Two backends behind one small trait: `memory` (the embedded gateways' default: the
//! registrations live and die with their harness) and `sqlite` (`gatehouse serve`'s default:
//! a file, written by one thread that commits concurrent writes together).
//!
//! Invariant: a token is never stored, only its SHA-256 digest (tests/store.rs searches the
//! file for every token it minted).

pub mod memory;
pub mod sqlite;
mod types;

pub use types::{block_of, Store, StoreError, StoreStats, StoredRegistration, StoredTool};

use std::path::Path;
use std::sync::Arc;

/// Opens the store a config names: `memory`, else the SQLite file (created 0600 if absent).
pub fn open(
    config: &crate::config::StoreConfig,
    audit_path: &Path,
    default: crate::config::StoreBackend,
) -> Result<Arc<dyn Store>, StoreError> {
    use crate::config::StoreBackend;
    match config.backend.unwrap_or(default) {
        StoreBackend::Memory => Ok(Arc::new(memory::MemoryStore::default())),
        StoreBackend::Sqlite => {
            let path = config
                .path
                .clone()
                .unwrap_or_else(|| crate::config::StoreConfig::path_beside(audit_path));
            Ok(Arc::new(sqlite::SqliteStore::open(&path, config.queue)?))
        }
    }
}
