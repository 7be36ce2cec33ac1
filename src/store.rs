//! The registration store: where registrations are kept so that they outlive the process.
//! Requests are served from the in-memory table (`registry`); the store is written through,
//! and the gateway answers a create, renew or release only once the store has committed it.
//!
//! A third, `etcd` (cargo feature `cluster`), is shared by several nodes (`gateway::cluster`).
//!
//! Two backends behind one small trait: `memory` (the embedded gateways' default: the
//! registrations live and die with their harness) and `sqlite` (`gatehouse serve`'s default:
//! a file, written by one thread that commits concurrent writes together).
//!
//! Invariant: a token is never stored, only its SHA-256 digest (tests/store.rs searches the
//! file for every token it minted).

#[cfg(feature = "cluster")]
pub mod etcd;
pub mod memory;
pub mod seal;
pub mod sqlite;
mod types;

pub use types::{block_of, Store, StoreError, StoreKind, StoreStats};

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
        #[cfg(feature = "cluster")]
        StoreBackend::Etcd => Ok(open_etcd(config)?),
        #[cfg(not(feature = "cluster"))]
        StoreBackend::Etcd => Err(StoreError::Open {
            path: "etcd".into(),
            message: "this gatehouse was built without the `cluster` feature (cargo build --features cluster)".into(),
        }),
    }
}

/// The `etcd` store a config names (its password read from `password_file`).
#[cfg(feature = "cluster")]
pub fn open_etcd(config: &crate::config::StoreConfig) -> Result<Arc<etcd::EtcdStore>, StoreError> {
    let user = match (&config.user, &config.password_file) {
        (Some(u), Some(f)) => {
            let p = std::fs::read_to_string(f).map_err(|e| StoreError::Open {
                path: f.display().to_string(),
                message: e.to_string(),
            })?;
            Some((u.clone(), p.trim_end_matches(['\r', '\n']).to_string()))
        }
        (Some(u), None) => Some((u.clone(), String::new())),
        _ => None,
    };
    Ok(Arc::new(etcd::EtcdStore::new(etcd::EtcdOptions {
        endpoints: config.endpoints.clone(),
        prefix: config.prefix.clone().unwrap_or_default(),
        user,
        ca_file: config.ca_file.clone(),
        cert_file: config.cert_file.clone(),
        key_file: config.key_file.clone(),
        timeout: std::time::Duration::from_millis(config.timeout_ms),
    })?))
}
