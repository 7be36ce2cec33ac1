//! Step 2 of a call: admission (grant, pins, audit health, the registration's and its
//! family's limits). The [`Admission`] it returns gives back the concurrency slot it took
//! when dropped. The block below is `call.rs`'s admission, moved verbatim (issue 51: the
//! call counters get one owner in the registration wing).

use std::borrow::Cow;

use super::execute::changed_tool_refusal;
use super::types::{Ended, Refused};
use crate::audit::Outcome;
use crate::registration::pins::Drift;
use crate::registration::RegistrationState;
use crate::tools::{GrantedTool, ToolResult};

/// An admitted call's hold on its registration (`registration::Slot`), and where its
/// `max_calls` budget comes from (`registration::Reserve`).
pub(crate) use crate::registration::{Reserve as Budget, Slot as Admission};

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
    // Unknown to this registration: not granted, or removed upstream since (its pin).
    let unknown = |reason: &'static str, message: String| {
        let ended = Ended::Error(
            crate::protocol::error::INVALID_PARAMS,
            message,
            Outcome::Denied,
        );
        Err((None, refused(reason.into(), ended)))
    };
    let Some(tool) = reg.tools.get(name) else {
        return unknown(
            "unknown tool (not granted to this registration)",
            format!("Unknown tool: {name}"),
        );
    };
    // The surface pinned at creation (`pins`): a tool its upstream removed is unknown now;
    // one it changed is refused under `on_tool_change = "refuse"` (one atomic load when
    // nothing drifted).
    match reg.pins.drift_of(name) {
        None | Some(Drift::Followed { .. }) => {}
        Some(Drift::Removed) => {
            return unknown(
                "tool removed by its upstream since the registration was made",
                format!("Unknown tool: {name} (its upstream no longer offers it)"),
            )
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
    match reg.admit_call(budget).await {
        Ok(admission) => Ok((tool, admission)),
        Err(why) => Err(limited(why)),
    }
}
