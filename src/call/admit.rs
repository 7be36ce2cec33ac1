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
    govern: Govern<'_>,
) -> Result<(&'r GrantedTool, Admission<'r>, Option<Box<Hold>>), (Option<&'r GrantedTool>, Refused)>
{
    let refused = |reason: Cow<'static, str>, ended| Refused {
        tool: None,
        reason,
        ended,
        rule: None,
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
    let hold = match govern.check(reg, tool) {
        Err(r) => return Err((Some(tool), r)),
        Ok(hold) => hold,
    };
    let limited = |why: String| (Some(tool), refused(why.clone().into(), Ended::Limited(why)));
    match reg.admit_call(budget).await {
        Ok(admission) => Ok((tool, admission, hold)),
        Err(why) => Err(limited(why)),
    }
}

/// An admitted call an `approve` rule holds until its approver decides (`call::approve`);
/// boxed where it is returned (rare, and admission's result is in every call's future).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hold {
    pub rule: String,
    pub approver: crate::policy::Approver,
    pub timeout_s: Option<u64>,
}

/// What a call is governed by besides its limits (issue 49): the config's policy rules as
/// they are now, and the call's arguments.
#[derive(Clone, Copy)]
pub(crate) struct Govern<'a> {
    pub config: Option<&'a crate::policy::eval::ConfigPolicy>,
    pub args: &'a serde_json::Value,
}

impl Govern<'_> {
    /// The policy's decision (config rules, then the family's, root first), then the rate
    /// limits (this registration's buckets and every ancestor's). With no policy and no rate
    /// limit anywhere: `None` checks only. `Ok(Some(hold))`: an `approve` rule matched.
    #[inline]
    fn check(
        self,
        reg: &RegistrationState,
        tool: &GrantedTool,
    ) -> Result<Option<Box<Hold>>, Refused> {
        // A root registration with no rule and no rate limit, and no config policy: nothing
        // to decide (inlined into admission: a few loads on every such call).
        if self.config.is_none()
            && reg.family.parent.is_none()
            && reg.policy.is_none()
            && reg.rate.is_empty()
        {
            return Ok(None);
        }
        self.decide(reg, tool)
    }

    /// [`Govern::check`] for a call something may govern.
    fn decide(
        self,
        reg: &RegistrationState,
        tool: &GrantedTool,
    ) -> Result<Option<Box<Hold>>, Refused> {
        use crate::policy::{decide, Buckets, CallFacts, Decision, Layers};
        let mut hold = None;
        let family_rules = reg.policy.is_some()
            || (reg.family.parent.is_some() && reg.family.ancestors().any(|a| a.policy.is_some()));
        if self.config.is_some() || family_rules {
            let mut chain: Vec<&RegistrationState> = reg.family.ancestors().map(|a| &**a).collect();
            chain.reverse();
            chain.push(reg);
            let layers = Layers {
                root: chain.first().and_then(|r| r.policy.as_ref()),
                narrowing: chain
                    .iter()
                    .skip(1)
                    .filter_map(|r| r.policy.as_ref())
                    .collect(),
            };
            let upstream_name = match &tool.backend {
                crate::tools::Backend::Upstream { tool, .. } => tool.as_str(),
                crate::tools::Backend::InProcess(_) => tool.name.as_str(),
            };
            let facts = CallFacts {
                registration_id: &reg.id,
                agent_id: &reg.agent_id,
                agent_path: reg.family.agent_path.as_deref(),
                label: reg.label.as_deref(),
                tool: &tool.name,
                upstream_name,
                descriptor: &tool.descriptor,
                args: self.args,
                upstream: tool.upstream(),
            };
            match decide(self.config, &layers, &facts) {
                Decision::Allow => {}
                Decision::Deny { rule, reason } => {
                    let text = format!("denied by policy rule {rule}: {reason}");
                    return Err(Refused {
                        tool: None,
                        reason: format!("policy rule {rule}: {reason}").into(),
                        ended: Ended::Result(ToolResult::error(text).0, Outcome::Denied),
                        rule: Some(rule),
                    });
                }
                Decision::Approve {
                    rule,
                    approver,
                    timeout_s,
                } => {
                    hold = Some(Box::new(Hold {
                        rule,
                        approver,
                        timeout_s,
                    }))
                }
            }
        }
        let limited = !reg.rate.is_empty()
            || (reg.family.parent.is_some() && reg.family.ancestors().any(|a| !a.rate.is_empty()));
        if limited {
            let levels = std::iter::once((reg.id.as_str(), &reg.rate))
                .chain(reg.family.ancestors().map(|a| (a.id.as_str(), &a.rate)));
            if let Err(r) = Buckets::take_all(levels, &tool.name) {
                return Err(Refused {
                    tool: None,
                    reason: "rate_limited".into(),
                    ended: Ended::RateLimited(r.message, r.retry_after_ms),
                    rule: None,
                });
            }
        }
        Ok(hold)
    }
}
