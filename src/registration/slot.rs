//! An admitted call's hold on its registration ([`Slot`]): the call is counted against its
//! `max_calls` and holds one of its `max_concurrent` slots, and for a child one of each
//! ancestor's (a family shares them), given back when the guard drops, however the call ends.
//! The counters are [`super::Budget`]'s; this is the only place that takes and gives slots.

use std::sync::Arc;

use super::{RegistrationState, Reserve};

/// An admitted call's hold on its registration: one of its `max_concurrent` slots (and, for
/// a child, one of each ancestor's), given back when dropped, however the call ends.
#[derive(Debug)]
pub(crate) struct Slot<'r> {
    registration: &'r RegistrationState,
    /// The ancestors whose slot it holds too (a child's call).
    family: Vec<Arc<RegistrationState>>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.registration.budget().leave();
        for a in &self.family {
            a.budget().leave();
        }
    }
}

impl RegistrationState {
    /// Admits a call against this registration's limits and, for a child, every ancestor's
    /// (nearest first: the family shares them): one of `max_calls` and a `max_concurrent`
    /// slot each. On a refusal it gives back the slots it took and says whose limit it was. A
    /// call refused by `max_concurrent` has counted against `max_calls` (it was started).
    pub(crate) async fn admit_call(&self, source: Reserve<'_>) -> Result<Slot<'_>, String> {
        self.budget()
            .start_call(source, &self.id, &self.limits, None)
            .await?;
        let max_conc = self.limits.max_concurrent.unwrap_or(usize::MAX);
        if !self.budget().try_enter(max_conc) {
            return Err(format!(
                "limit max_concurrent ({max_conc}) reached for this registration"
            ));
        }
        let mut slot = Slot {
            registration: self,
            family: Vec::new(),
        };
        if self.family.parent.is_some() {
            Box::pin(slot.admit_family(source)).await?;
        }
        Ok(slot)
    }

    /// Holds a `max_concurrent` slot of this registration and each ancestor's without a
    /// check (a task kept for a client, admitted as a call already), until
    /// [`RegistrationState::give_back_slot`].
    pub(crate) fn hold_slot(&self) {
        self.budget().enter();
        for a in self.family.ancestors() {
            a.budget().enter();
        }
    }

    /// Gives back a slot [`RegistrationState::hold_slot`] took.
    pub(crate) fn give_back_slot(&self) {
        self.budget().leave();
        for a in self.family.ancestors() {
            a.budget().leave();
        }
    }
}

impl Slot<'_> {
    /// Takes the call from every ancestor's budget, nearest first.
    async fn admit_family(&mut self, source: Reserve<'_>) -> Result<(), String> {
        let reg = self.registration;
        for a in reg.family.ancestors() {
            a.budget()
                .start_call(source, &a.id, &a.limits, Some(&a.id))
                .await?;
            let max_conc = a.limits.max_concurrent.unwrap_or(usize::MAX);
            if !a.budget().try_enter(max_conc) {
                return Err(format!(
                    "limit max_concurrent ({max_conc}) of ancestor registration {} reached (its family shares it)",
                    a.id
                ));
            }
            self.family.push(a.clone());
        }
        Ok(())
    }
}
