//! The helpdesk's state: cases, their notes and each lease's selected case; the requests in
//! flight, so a cancellation reaches its work.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// State behind one lock, cheap to clone; short locks only.
pub(super) struct Shared<T>(Arc<Mutex<T>>);

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<T: Default> Default for Shared<T> {
    fn default() -> Self {
        Shared(Arc::default())
    }
}

impl<T> Shared<T> {
    pub(super) fn lock(&self) -> MutexGuard<'_, T> {
        // A poisoned lock still holds consistent data: every critical section is a few inserts.
        crate::sync::lock(&self.0)
    }
}

/// Cases, their notes, and the selected case of each lease.
pub(super) type Desk = Shared<DeskState>;

#[derive(Default)]
pub(super) struct DeskState {
    pub(super) next_case: u64,
    pub(super) cases: HashMap<String, Case>,
    /// lease id → selected case id; entries are removed on release.
    pub(super) selected: HashMap<String, String>,
}

pub(super) struct Case {
    pub(super) notes: Vec<String>,
}

impl Desk {
    /// Open a case and select it for `lease`; returns its id.
    pub(super) fn open_case(&self, lease: &str) -> String {
        let mut state = self.lock();
        state.next_case += 1;
        let case_id = format!("case-{}", state.next_case);
        state
            .cases
            .insert(case_id.clone(), Case { notes: Vec::new() });
        state.selected.insert(lease.to_owned(), case_id.clone());
        case_id
    }

    pub(super) fn selected(&self, lease: &str) -> Option<String> {
        self.lock().selected.get(lease).cloned()
    }

    /// Append a note to the lease's selected case; returns the case id.
    pub(super) fn add_note(&self, lease: &str, text: &str) -> Option<String> {
        let mut state = self.lock();
        let case_id = state.selected.get(lease)?.clone();
        let case = state.cases.get_mut(&case_id)?;
        case.notes.push(text.to_owned());
        Some(case_id)
    }

    /// The lease's selected case and its notes.
    pub(super) fn list_notes(&self, lease: &str) -> Option<(String, Vec<String>)> {
        let state = self.lock();
        let case_id = state.selected.get(lease)?;
        let case = state.cases.get(case_id)?;
        Some((case_id.clone(), case.notes.clone()))
    }

    /// Forget the lease's selection; returns the case it had selected.
    pub(super) fn release(&self, lease: &str) -> Option<String> {
        self.lock().selected.remove(lease)
    }
}

/// Cancellation handles of requests being handled, keyed by their JSON-RPC id.
pub(super) type InFlight = Shared<InFlightState>;

#[derive(Default)]
pub(super) struct InFlightState {
    pub(super) next_seq: u64,
    pub(super) by_id: HashMap<String, (u64, CancellationToken)>,
}

/// Removes its entry from [`InFlight`] on drop (unless a later request reused the id).
pub(super) struct InFlightGuard {
    pub(super) in_flight: InFlight,
    pub(super) key: String,
    pub(super) seq: u64,
    pub(super) cancel: CancellationToken,
}

impl InFlight {
    pub(super) fn register(&self, id: &Value) -> InFlightGuard {
        let key = id.to_string();
        let cancel = CancellationToken::new();
        let mut state = self.lock();
        state.next_seq += 1;
        let seq = state.next_seq;
        state.by_id.insert(key.clone(), (seq, cancel.clone()));
        InFlightGuard {
            in_flight: self.clone(),
            key,
            seq,
            cancel,
        }
    }

    /// Cancel the request with this id; false if it is not in flight.
    pub(super) fn cancel(&self, id: &Value) -> bool {
        let token = self
            .lock()
            .by_id
            .get(&id.to_string())
            .map(|(_, t)| t.clone());
        token.map(|t| t.cancel()).is_some()
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let mut state = self.in_flight.lock();
        if state
            .by_id
            .get(&self.key)
            .is_some_and(|(seq, _)| *seq == self.seq)
        {
            state.by_id.remove(&self.key);
        }
    }
}
