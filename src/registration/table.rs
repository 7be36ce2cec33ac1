//! The table of live registrations, keyed by id, and the memory of ids released lately.
//!
//! Invariant: lookup is by id first, never by searching tokens.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::sync::HashMap;

use super::RegistrationState;

/// The table of live registrations, keyed by id.
#[derive(Default)]
pub struct Registry {
    map: Mutex<HashMap<String, Arc<RegistrationState>>>,
    /// The ids released lately, so that a refusal can say `released` rather than
    /// `unknown_registration` (for the operators only: both are the same 404).
    released: Mutex<RecentIds>,
}

/// The slots of the released-id memory (a 64-bit digest each: 64 KiB, allocated with the
/// registry, so that releasing grows nothing).
pub const RELEASED_SLOTS: usize = 8192;

/// A fixed memory of released ids, direct-mapped by a 64-bit digest: an id stays until a
/// later one lands in its slot (after N later releases it is still there with probability
/// ≈ e^(−N/8192): the last few thousand releases). A digest collision only names a refusal's
/// reason wrong; nothing is decided by it.
struct RecentIds {
    slots: Box<[u64]>,
    hasher: foldhash::fast::RandomState,
}

impl Default for RecentIds {
    fn default() -> Self {
        RecentIds {
            slots: vec![0; RELEASED_SLOTS].into_boxed_slice(),
            hasher: Default::default(),
        }
    }
}

impl RecentIds {
    /// The id's digest (never 0, the empty slot) and its slot.
    fn digest(&self, id: &str) -> (u64, usize) {
        let d = std::hash::BuildHasher::hash_one(&self.hasher, id) | 1;
        (d, (d >> 1) as usize % self.slots.len())
    }

    fn remember(&mut self, id: &str) {
        let (d, slot) = self.digest(id);
        self.slots[slot] = d;
    }

    fn contains(&self, id: &str) -> bool {
        let (d, slot) = self.digest(id);
        self.slots[slot] == d
    }
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<RegistrationState>>> {
        // A poisoned lock only means another thread panicked mid-update of a plain map insert
        // or remove; the map itself is still consistent.
        crate::sync::lock(&self.map)
    }

    pub fn get(&self, id: &str) -> Option<Arc<RegistrationState>> {
        self.lock().get(id).cloned()
    }

    pub(crate) fn insert(&self, state: Arc<RegistrationState>) {
        self.lock().insert(state.id.clone(), state);
    }

    pub(crate) fn remove(&self, id: &str) -> Option<Arc<RegistrationState>> {
        let mut map = self.lock();
        let removed = map.remove(id);
        if map.is_empty() {
            map.shrink_to(0);
        }
        drop(map);
        if removed.is_some() {
            crate::sync::lock(&self.released).remember(id);
        }
        removed
    }

    /// Was `id` released lately (see [`RELEASED_SLOTS`])?
    pub fn was_released(&self, id: &str) -> bool {
        crate::sync::lock(&self.released).contains(id)
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    pub fn all(&self) -> Vec<Arc<RegistrationState>> {
        let mut v: Vec<_> = self.lock().values().cloned().collect();
        v.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registration::RegistrationSpec;
    use crate::tools::ToolSet;

    #[test]
    fn released_ids_are_remembered_within_the_bound() {
        let reg = Registry::default();
        let spec = RegistrationSpec::new("a");
        let st = Arc::new(RegistrationState::new(
            "r1".into(),
            "t",
            &spec,
            ToolSet::default(),
        ));
        reg.insert(st);
        assert!(!reg.was_released("r1"));
        assert!(reg.remove("r1").is_some());
        assert!(reg.was_released("r1") && !reg.was_released("r2"));
        // A fixed table: the newest ids are there, most of a table's worth back still are,
        // the oldest mostly gone, and the memory never grows.
        let mut recent = RecentIds::default();
        let n = 4 * RELEASED_SLOTS;
        for i in 0..n {
            recent.remember(&format!("id{i}"));
        }
        assert_eq!(recent.slots.len(), RELEASED_SLOTS);
        assert!(recent.contains(&format!("id{}", n - 1)));
        let last = (n - 1000..n)
            .filter(|i| recent.contains(&format!("id{i}")))
            .count();
        assert!(last > 850, "{last} of the last 1,000");
        let old = (0..1000)
            .filter(|i| recent.contains(&format!("id{i}")))
            .count();
        assert!(old < 100, "{old} of the oldest 1,000");
    }
}
