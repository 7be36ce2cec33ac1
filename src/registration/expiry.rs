//! Registration expiry (the TTL): the deadline of every registration that has a `ttl_s`; the
//! gateway's sweep expires them through the same close path as an explicit release. (A
//! "lease" is the upstream lease, `upstream::lease`.)
//!
//! Invariant: deadlines are `tokio::time::Instant`s (never the wall clock), so tests drive
//! expiry with paused time; the wall-clock `expires_at_ms` shown to clients is derived.
//!
//! Invariant: a renewal and the expiry are one decision, taken under this table's lock
//! ([`Deadlines::renew`], [`Deadlines::take_expired`]): a deadline the sweep has taken is
//! `expiring` until the release ends it, and a renewal then loses (404); a deadline already
//! passed is never moved. A renewal that wins moved the deadline before the sweep could take
//! it, so a 200 is never followed by the expiry it raced.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The deadlines of registrations with a TTL, keyed by registration id.
#[derive(Default)]
pub struct Deadlines {
    table: Mutex<Table>,
    /// Wakes the sweep when a deadline is added or moved.
    changed: Notify,
}

#[derive(Default)]
struct Table {
    map: HashMap<String, Instant>,
    /// Taken by the sweep, not yet released: a renewal loses.
    expiring: HashSet<String>,
}

/// What [`Deadlines::renew`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The deadline moved (or was set, for a registration that had none).
    Moved(Instant),
    /// Its deadline passed or the sweep took it: it expires, the renewal lost.
    Expired,
}

impl Deadlines {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // A poisoned lock only means a panic mid-insert of plain data; the map is consistent.
        crate::sync::lock(&self.table)
    }

    /// Sets (or moves) the deadline of `id` to `ttl` from now.
    pub fn set(&self, id: &str, ttl: Duration) -> Instant {
        let at = Instant::now() + ttl;
        self.lock().map.insert(id.to_string(), at);
        self.changed.notify_one();
        at
    }

    /// A renewal: moves the deadline of `id` to `ttl` from now, running `won` under the
    /// table's lock (the caller's expiry shown to clients moves with it), unless the deadline
    /// has passed or the sweep has taken it; then nothing changes and it is
    /// [`Renewal::Expired`] (a passed deadline not taken yet wakes the sweep).
    pub fn renew(&self, id: &str, ttl: Duration, won: impl FnOnce()) -> Renewal {
        let now = Instant::now();
        let mut t = self.lock();
        if t.expiring.contains(id) {
            return Renewal::Expired;
        }
        if t.map.get(id).is_some_and(|at| *at <= now) {
            drop(t);
            self.changed.notify_one();
            return Renewal::Expired;
        }
        let at = now + ttl;
        t.map.insert(id.to_string(), at);
        won();
        drop(t);
        self.changed.notify_one();
        Renewal::Moved(at)
    }

    /// Forgets `id` (its release ended it, or it has no deadline any more).
    pub fn remove(&self, id: &str) {
        let mut t = self.lock();
        t.map.remove(id);
        t.expiring.remove(id);
        if t.map.is_empty() {
            t.map.shrink_to(0);
        }
        if t.expiring.is_empty() {
            t.expiring.shrink_to(0);
        }
    }

    /// Gives an expiry the sweep could not carry out (the store refused the release) a new
    /// deadline `after` from now.
    pub fn retry(&self, id: &str, after: Duration) {
        let mut t = self.lock();
        if t.expiring.remove(id) {
            t.map.insert(id.to_string(), Instant::now() + after);
            drop(t);
            self.changed.notify_one();
        }
    }

    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().map.is_empty()
    }

    /// The earliest deadline, if any.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.lock().map.values().min().copied()
    }

    /// Removes and returns the ids whose deadline has passed; each is `expiring` (renewals
    /// lose) until [`Deadlines::remove`] or [`Deadlines::retry`].
    pub fn take_expired(&self, now: Instant) -> Vec<String> {
        let mut t = self.lock();
        let ids: Vec<String> = t
            .map
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            t.map.remove(id);
            t.expiring.insert(id.clone());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_taken_or_passed_deadline_is_never_renewed() {
        let d = Deadlines::default();
        d.set("a", Duration::from_secs(1));
        d.set("b", Duration::from_secs(1));
        // Before the deadline: the renewal wins and the sweep finds nothing.
        let mut won = false;
        assert!(matches!(
            d.renew("a", Duration::from_secs(2), || won = true),
            Renewal::Moved(_)
        ));
        assert!(won);
        tokio::time::advance(Duration::from_millis(1500)).await;
        // "b" passed, not taken yet: the renewal loses and leaves it to the sweep.
        assert_eq!(
            d.renew("b", Duration::from_secs(1), || {}),
            Renewal::Expired
        );
        assert_eq!(d.take_expired(Instant::now()), vec!["b".to_string()]);
        // Taken: still lost, until the release forgets it.
        assert_eq!(
            d.renew("b", Duration::from_secs(1), || {}),
            Renewal::Expired
        );
        d.retry("b", Duration::from_secs(1));
        assert!(matches!(
            d.renew("b", Duration::from_secs(1), || {}),
            Renewal::Moved(_)
        ));
        tokio::time::advance(Duration::from_secs(1)).await;
        let mut taken = d.take_expired(Instant::now());
        taken.sort();
        assert_eq!(taken, vec!["a".to_string(), "b".to_string()]);
        d.remove("a");
        d.remove("b");
        assert!(d.lock().expiring.is_empty() && d.is_empty());
        // No deadline at all (no TTL yet): a renewal sets one.
        assert!(matches!(
            d.renew("c", Duration::from_secs(1), || {}),
            Renewal::Moved(_)
        ));
    }
}
