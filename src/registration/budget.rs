//! A registration's call counters and the one place that writes them: `max_calls` (a block
//! at a time from the store, issue 35) and `max_concurrent`, shared by a child's whole family
//! (issue 39). Its admission of a call (`slot`) hands out a guard holding the call's
//! `max_concurrent` slots.
//!
//! Invariant: the budget is never exceeded, across restarts too: a block is reserved
//! (committed) before it is spent, and one given back is first taken out of the node's hand
//! (a swap), so a call can never spend a call that was given back (issue 50).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::Limits;

/// The call counters of one registration.
#[derive(Debug, Default)]
pub struct Budget {
    /// Calls started (refused by `max_concurrent` included: they counted against `max_calls`).
    started: AtomicU64,
    /// Calls of `max_calls` this node holds from the store (`store::Store::reserve`) and has
    /// not spent: a call takes one (compare-and-set); when none is left, another block is
    /// reserved under `reserving`. A cluster node gives an idle block back by taking it all at
    /// once (a swap).
    left: AtomicU64,
    /// The calls of `max_calls` the store has handed out (to every node), as last known here:
    /// when none is left here and this says the budget is spent, a call is refused without
    /// asking the store. A cluster node learns it from the replicated registration (a block
    /// given back elsewhere lowers it); a single node counts its own reservations.
    store_reserved: AtomicU64,
    /// Held while a block is reserved, so that concurrent calls reserve one block, not many.
    reserving: tokio::sync::Mutex<()>,
    /// Calls (and tasks kept for a client) holding a `max_concurrent` slot.
    in_flight: AtomicUsize,
}

impl Budget {
    /// `in_hand` calls held from the start (the whole budget of a store that dies with the
    /// process; [`Budget::first_block`] sets a durable store's).
    pub(super) fn new(in_hand: u64) -> Budget {
        Budget {
            left: AtomicU64::new(in_hand),
            store_reserved: AtomicU64::new(in_hand),
            ..Budget::default()
        }
    }

    /// Read back from the store: calls reserved so far (by any node) count as spent.
    pub(super) fn restored(reserved: u64) -> Budget {
        Budget {
            started: AtomicU64::new(reserved),
            store_reserved: AtomicU64::new(reserved),
            ..Budget::default()
        }
    }

    /// Calls started so far.
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::Acquire)
    }

    /// Calls holding a `max_concurrent` slot now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Calls of `max_calls` in this node's hand, not spent.
    pub fn in_hand(&self) -> u64 {
        self.left.load(Ordering::Acquire)
    }

    /// The calls of `max_calls` the store has handed out, as last known here.
    pub fn store_reserved(&self) -> u64 {
        self.store_reserved.load(Ordering::Acquire)
    }

    /// The first block, reserved with the creation (`in_hand` held here and counted by the
    /// store).
    pub(crate) fn first_block(&self, in_hand: u64) {
        self.left.store(in_hand, Ordering::Release);
        self.store_reserved.store(in_hand, Ordering::Release);
    }

    /// What the store has handed out, as a cluster node's replica read it.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn learn_store_reserved(&self, reserved: u64) {
        self.store_reserved.store(reserved, Ordering::Release);
    }

    /// Takes one call of the block in hand (false: none left here).
    pub(super) fn take_in_hand(&self) -> bool {
        let took = self
            .left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if took {
            self.started.fetch_add(1, Ordering::AcqRel);
        }
        took
    }

    /// Takes the whole block in hand (to give it back); no call can spend it after.
    pub(super) fn take_unspent(&self) -> u64 {
        self.left.swap(0, Ordering::AcqRel)
    }

    /// Takes a `max_concurrent` slot, if fewer than `max` are taken.
    pub(super) fn try_enter(&self, max: usize) -> bool {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    pub(super) fn enter(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    pub(super) fn leave(&self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Where a `max_calls` budget comes from: the store, a block at a time (issue 35).
#[derive(Clone, Copy)]
pub(crate) struct Reserve<'a> {
    pub store: &'a dyn crate::store::Store,
    /// Calls reserved per block (`[store] budget_block`).
    pub block: u64,
}

impl Budget {
    /// Takes one call of a `max_calls` budget of `max` (registration `id`, `limits`): from
    /// the block this node holds, else from a new block reserved from the store (one
    /// reservation at a time per registration). When none is left here and the store's
    /// count as last known here says the budget is spent, the call is refused without asking
    /// the store. `Err(true)`: spent; `Err(false)`: the store could not be asked (logged).
    async fn take_call(
        &self,
        source: Reserve<'_>,
        id: &str,
        limits: &Limits,
        max: u64,
    ) -> Result<(), bool> {
        loop {
            if self.take_in_hand() {
                return Ok(());
            }
            if self.store_reserved() >= max {
                return Err(true);
            }
            // The block in hand is spent: reserve the next one (boxed: a rare path).
            let more = Box::pin(self.reserve_block(source, id, limits, max)).await?;
            if !more {
                return Err(true);
            }
        }
    }

    /// Reserves the next block (false: the budget is spent).
    async fn reserve_block(
        &self,
        source: Reserve<'_>,
        id: &str,
        limits: &Limits,
        max: u64,
    ) -> Result<bool, bool> {
        let _one = self.reserving.lock().await;
        if self.in_hand() > 0 {
            return Ok(true); // another call reserved meanwhile
        }
        if self.store_reserved() >= max {
            return Ok(false);
        }
        // A cluster node learns the store's count from its replica (a block given back on
        // another node lowers it); a single node counts its own reservations.
        let own_count = source.store.kind() != crate::store::StoreKind::Etcd;
        let block = crate::store::block_of(limits, source.block, true);
        match source.store.reserve(id, block).await {
            Ok(0) => {
                if own_count {
                    self.store_reserved.fetch_max(max, Ordering::AcqRel);
                }
                Ok(false)
            }
            Ok(got) => {
                self.left.fetch_add(got, Ordering::AcqRel);
                if own_count {
                    self.store_reserved.fetch_add(got, Ordering::AcqRel);
                }
                Ok(true)
            }
            Err(e) => {
                tracing::error!(registration = %id, error = %e, "the call budget cannot be reserved");
                Err(false)
            }
        }
    }

    /// Counts a call against `max_calls` (started, or refused: the message says whose,
    /// `whose` naming an ancestor's).
    pub(super) async fn start_call(
        &self,
        source: Reserve<'_>,
        id: &str,
        limits: &Limits,
        whose: Option<&str>,
    ) -> Result<(), String> {
        match limits.max_calls {
            Some(max) => self
                .take_call(source, id, limits, max)
                .await
                .map_err(|s| spent(max, whose, s)),
            None => {
                self.started.fetch_add(1, Ordering::AcqRel);
                Ok(())
            }
        }
    }
}

/// The refusal of a `max_calls` budget `take_call` did not give.
fn spent(max: u64, whose: Option<&str>, spent: bool) -> String {
    match (spent, whose) {
        (true, None) => format!("limit max_calls ({max}) reached for this registration"),
        (true, Some(a)) => format!(
            "limit max_calls ({max}) of ancestor registration {a} reached (its family shares it)"
        ),
        (false, _) => {
            "the call budget cannot be reserved: the registration store is failing".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::registration::{RegistrationSpec, RegistrationState};
    use crate::tools::ToolSet;
    use std::sync::Arc;

    #[test]
    fn a_block_given_back_is_never_spent_by_a_racing_call() {
        // Issue 50: a cluster node gives an idle block back while calls may be taking from
        // it; every call of the block is either spent here or given back, never both.
        for _ in 0..200 {
            let mut spec = RegistrationSpec::new("agent");
            spec.limits.max_calls = Some(1000);
            let reg = Arc::new(RegistrationState::new(
                "r".into(),
                "t",
                &spec,
                ToolSet::default(),
            ));
            reg.budget().first_block(64);
            let takers: Vec<_> = (0..4)
                .map(|_| {
                    let reg = reg.clone();
                    std::thread::spawn(move || {
                        let mut n = 0u64;
                        while reg.budget().take_in_hand() {
                            n += 1;
                        }
                        n
                    })
                })
                .collect();
            let given = reg.take_unspent();
            let spent: u64 = takers.into_iter().map(|t| t.join().unwrap_or(0)).sum();
            assert_eq!(spent + given, 64, "spent {spent} + given back {given}");
            assert_eq!(reg.budget().started(), spent);
            assert!(
                !reg.budget().take_in_hand(),
                "nothing left after the give back"
            );
        }
    }
}
