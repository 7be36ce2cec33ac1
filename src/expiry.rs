//! Registration expiry (the TTL): the deadline of every registration that has a `ttl_s`; the
//! gateway's sweep expires them through the same close path as an explicit release. (A
//! "lease" is the upstream lease, `upstream::lease`.)
//!
//! Invariant: deadlines are `tokio::time::Instant`s (never the wall clock), so tests drive
//! expiry with paused time; the wall-clock `expires_at_ms` shown to clients is derived.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The deadlines of registrations with a TTL, keyed by registration id.
#[derive(Default)]
pub struct Deadlines {
    map: Mutex<HashMap<String, Instant>>,
    /// Wakes the sweep when a deadline is added or moved.
    changed: Notify,
}

impl Deadlines {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Instant>> {
        // A poisoned lock only means a panic mid-insert of plain data; the map is consistent.
        crate::sync::lock(&self.map)
    }

    /// Sets (or moves) the deadline of `id` to `ttl` from now.
    pub fn set(&self, id: &str, ttl: Duration) -> Instant {
        let at = Instant::now() + ttl;
        self.lock().insert(id.to_string(), at);
        self.changed.notify_one();
        at
    }

    pub fn remove(&self, id: &str) {
        let mut map = self.lock();
        map.remove(id);
        if map.is_empty() {
            map.shrink_to(0);
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// The earliest deadline, if any.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.lock().values().min().copied()
    }

    /// Removes and returns the ids whose deadline has passed.
    pub fn take_expired(&self, now: Instant) -> Vec<String> {
        let mut map = self.lock();
        let ids: Vec<String> = map
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            map.remove(id);
        }
        ids
    }

    /// Waits until the earliest deadline passes or the set of deadlines changes.
    pub async fn wait_next(&self) {
        let next = self.next_deadline();
        match next {
            Some(at) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = self.changed.notified() => {}
                }
            }
            None => self.changed.notified().await,
        }
    }
}
