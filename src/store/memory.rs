//! The `memory` store: a map in the process. Nothing survives the process; every operation
//! is done when its future is first polled.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use futures::future::{ready, BoxFuture, FutureExt};

use super::types::{Store, StoreError, StoreStats};
use crate::registration::Record;
use crate::sync::{lock, HashMap};

#[derive(Default)]
pub struct MemoryStore {
    map: Mutex<HashMap<String, Record>>,
    ops: AtomicU64,
}

impl MemoryStore {
    fn op<T>(&self, f: impl FnOnce(&mut HashMap<String, Record>) -> T) -> T {
        self.ops.fetch_add(1, Ordering::Relaxed);
        f(&mut lock(&self.map))
    }
}

impl Store for MemoryStore {
    fn kind(&self) -> crate::store::StoreKind {
        crate::store::StoreKind::Memory
    }

    fn load_all(&self) -> BoxFuture<'_, Result<Vec<Record>, StoreError>> {
        let mut all: Vec<_> = self.op(|m| m.values().cloned().collect());
        all.sort_by(|a: &Record, b| a.created_at_ms.cmp(&b.created_at_ms).then(a.id.cmp(&b.id)));
        ready(Ok(all)).boxed()
    }

    fn create(&self, reg: Record) -> BoxFuture<'_, Result<(), StoreError>> {
        self.op(|m| m.insert(reg.id.clone(), reg));
        ready(Ok(())).boxed()
    }

    fn renew(&self, id: &str, expires_at_ms: u64) -> BoxFuture<'_, Result<bool, StoreError>> {
        let found = self.op(|m| match m.get_mut(id) {
            Some(r) => {
                r.expires_at_ms = expires_at_ms;
                true
            }
            None => false,
        });
        ready(Ok(found)).boxed()
    }

    fn release(&self, id: &str) -> BoxFuture<'_, Result<bool, StoreError>> {
        let found = self.op(|m| {
            let found = m.remove(id).is_some();
            if m.is_empty() {
                m.shrink_to(0);
            }
            found
        });
        ready(Ok(found)).boxed()
    }

    fn reserve(&self, id: &str, want: u64) -> BoxFuture<'_, Result<u64, StoreError>> {
        let got = self.op(|m| match m.get_mut(id) {
            Some(r) => {
                let left = r
                    .limits
                    .max_calls
                    .map_or(want, |max| max.saturating_sub(r.calls_reserved));
                let got = want.min(left);
                r.calls_reserved += got;
                got
            }
            None => 0,
        });
        ready(Ok(got)).boxed()
    }

    fn give_back(&self, id: &str, unused: u64) -> BoxFuture<'_, Result<(), StoreError>> {
        self.op(|m| {
            if let Some(r) = m.get_mut(id) {
                r.calls_reserved = r.calls_reserved.saturating_sub(unused);
            }
        });
        ready(Ok(())).boxed()
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            ops: self.ops.load(Ordering::Relaxed),
            commits: 0,
        }
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        ready(()).boxed()
    }
}
