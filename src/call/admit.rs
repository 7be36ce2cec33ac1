//! Step 2 of a call: admission (grant, pins, audit health, the registration's and its
//! family's limits). The [`Admission`] it returns gives back the concurrency slot it took
//! when dropped. The block below is `call.rs`'s admission, moved verbatim (issue 51: the
//! call counters get one owner in the registration wing).

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use super::execute::changed_tool_refusal;
use super::types::{Ended, Refused};
use crate::audit::Outcome;
use crate::mcp::jsonrpc;
use crate::pins::Drift;
use crate::registry::RegistrationState;
use crate::tools::{GrantedTool, ToolResult};

/// An admitted call's hold on its registration: one of its `max_concurrent` slots (and, for
/// a child, one of each ancestor's), given back when dropped, however the call ends.
#[derive(Debug)]
pub(crate) struct Admission<'r>(&'r RegistrationState, Option<FamilyInFlight>);

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        self.0.calls_in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A child's call counted in flight on each of its ancestors, until dropped.
#[derive(Debug)]
pub(crate) struct FamilyInFlight(Vec<std::sync::Arc<RegistrationState>>);

impl Drop for FamilyInFlight {
    fn drop(&mut self) {
        for a in &self.0 {
            a.calls_in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Where a `max_calls` budget comes from: the store, a block at a time (issue 35).
#[derive(Clone, Copy)]
pub(crate) struct Budget<'a> {
    pub store: &'a dyn crate::store::Store,
    /// Calls reserved per block (`[store] budget_block`).
    pub block: u64,
}

/// Takes one call of `reg`'s `max_calls` budget: from the block this node holds, else from
/// a new block reserved from the store (one reservation at a time per registration). The
/// budget is never exceeded, across restarts too: a block is reserved (committed) before it
/// is spent, and one given back is first taken out of the node's hand. When none is left
/// here and the store's count as last known here says the budget is spent, the call is
/// refused without asking the store. `Err(true)`: spent; `Err(false)`: the store could not
/// be asked (logged).
async fn take_call(budget: Budget<'_>, reg: &RegistrationState, max: u64) -> Result<(), bool> {
    loop {
        if reg.take_call_in_hand() {
            return Ok(());
        }
        if reg.store_reserved.load(Ordering::Acquire) >= max {
            return Err(true);
        }
        // The block in hand is spent: reserve the next one (boxed: a rare path).
        let more = Box::pin(async {
            let _one = reg.budget.lock().await;
            if reg.calls_left.load(Ordering::Acquire) > 0 {
                return Ok(true); // another call reserved meanwhile
            }
            if reg.store_reserved.load(Ordering::Acquire) >= max {
                return Ok(false);
            }
            // A cluster node learns the store's count from its replica (a block given back
            // on another node lowers it); a single node counts its own reservations.
            let own_count = budget.store.kind() != "etcd";
            let block = crate::store::block_of(&reg.limits, budget.block, true);
            match budget.store.reserve(&reg.id, block).await {
                Ok(0) => {
                    if own_count {
                        reg.store_reserved.fetch_max(max, Ordering::AcqRel);
                    }
                    Ok(false)
                }
                Ok(got) => {
                    reg.calls_left.fetch_add(got, Ordering::AcqRel);
                    if own_count {
                        reg.store_reserved.fetch_add(got, Ordering::AcqRel);
                    }
                    Ok(true)
                }
                Err(e) => {
                    tracing::error!(registration = %reg.id, error = %e, "the call budget cannot be reserved");
                    Err(false)
                }
            }
        })
        .await?;
        if !more {
            return Err(true);
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

/// Takes a call of `reg` from every ancestor's budget (`max_calls`, `max_concurrent`),
/// nearest first (the family shares it); on a refusal gives back what it took and says whose
/// limit it was.
async fn admit_family(
    budget: Budget<'_>,
    reg: &RegistrationState,
) -> Result<FamilyInFlight, String> {
    let mut taken = FamilyInFlight(Vec::new());
    for a in reg.family.ancestors() {
        if let Some(max) = a.limits.max_calls {
            if let Err(s) = take_call(budget, a, max).await {
                return Err(spent(max, Some(&a.id), s));
            }
        } else {
            a.calls_started.fetch_add(1, Ordering::AcqRel);
        }
        let max_conc = a.limits.max_concurrent.unwrap_or(usize::MAX);
        if a.calls_in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max_conc).then_some(n + 1)
            })
            .is_err()
        {
            return Err(format!(
                "limit max_concurrent ({max_conc}) of ancestor registration {} reached (its family shares it)",
                a.id
            ));
        }
        taken.0.push(a.clone());
    }
    Ok(taken)
}

/// Step 2: the granted tool and the [`Admission`], or why the call is refused (`denied`):
/// the tool is not granted, the audit log cannot be written, or a limit is reached. A call
/// refused by `max_concurrent` has counted against `max_calls` (it was started).
pub(crate) async fn admit<'r>(
    budget: Budget<'_>,
    reg: &'r RegistrationState,
    name: &str,
    audit_healthy: bool,
) -> Result<(&'r GrantedTool, Admission<'r>), (Option<&'r GrantedTool>, Refused)> {
    let refused = |reason: Cow<'static, str>, ended| Refused {
        tool: None,
        reason,
        ended,
    };
    let Some(tool) = reg.tools.get(name) else {
        return Err((
            None,
            refused(
                "unknown tool (not granted to this registration)".into(),
                Ended::Error(
                    jsonrpc::INVALID_PARAMS,
                    format!("Unknown tool: {name}"),
                    Outcome::Denied,
                ),
            ),
        ));
    };
    // The surface pinned at creation (`pins`): a tool its upstream removed is unknown now;
    // one it changed is refused under `on_tool_change = "refuse"` (one atomic load when
    // nothing drifted).
    match reg.pins.drift_of(name) {
        None | Some(Drift::Followed { .. }) => {}
        Some(Drift::Removed) => {
            return Err((
                None,
                refused(
                    "tool removed by its upstream since the registration was made".into(),
                    Ended::Error(
                        jsonrpc::INVALID_PARAMS,
                        format!("Unknown tool: {name} (its upstream no longer offers it)"),
                        Outcome::Denied,
                    ),
                ),
            ))
        }
        Some(Drift::Refused { .. }) => {
            let why = changed_tool_refusal(name);
            return Err((
                Some(tool),
                refused(
                    "tool definition changed since the registration was made".into(),
                    Ended::Result(ToolResult::error(why).0, Outcome::Denied),
                ),
            ));
        }
    }
    if !audit_healthy {
        return Err((
            Some(tool),
            refused("audit log unavailable".into(), Ended::AuditDown),
        ));
    }
    let limited = |why: String| (Some(tool), refused(why.clone().into(), Ended::Limited(why)));
    if let Some(max) = reg.limits.max_calls {
        if let Err(s) = take_call(budget, reg, max).await {
            return Err(limited(spent(max, None, s)));
        }
    } else {
        reg.calls_started.fetch_add(1, Ordering::AcqRel);
    }
    let max_conc = reg.limits.max_concurrent.unwrap_or(usize::MAX);
    if reg
        .calls_in_flight
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max_conc).then_some(n + 1)
        })
        .is_err()
    {
        return Err(limited(format!(
            "limit max_concurrent ({max_conc}) reached for this registration"
        )));
    }
    let mut admission = Admission(reg, None);
    // A child's call also counts against every ancestor's budget (dropping `admission` gives
    // back its own slot if one refuses).
    if reg.family.parent.is_some() {
        match Box::pin(admit_family(budget, reg)).await {
            Ok(f) => admission.1 = Some(f),
            Err(why) => return Err(limited(why)),
        }
    }
    Ok((tool, admission))
}
