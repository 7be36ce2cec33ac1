//! Child registrations (issue 39): a sub-agent's registration made from a live parent. Its
//! grants resolve among the parent's tools only (the parent's pinned definitions), its TTL
//! ends no later than the parent's, its limits are at most the parent's (inherited where it
//! sets none), and depth and fan-out are capped (`[children]`). Its calls also count against
//! every ancestor's `max_calls` and `max_concurrent` (`call`), and releasing a registration
//! releases its descendants first, deepest first (`gateway`).

use std::sync::Arc;

use crate::config::ChildrenConfig;
use crate::tools::{Backend, GrantedTool, ToolSet};

use super::{Family, Grant, RegistrationSpec, RegistrationState};

/// What a child is made of: its tools (the parent's, filtered by its grants), its family,
/// and its spec with TTL and limits bounded by the parent's.
pub struct Child {
    pub tools: ToolSet,
    pub family: Family,
    pub spec: RegistrationSpec,
}

/// Checks a child's spec against its parent and the caps; the error says what to fix.
pub fn child_of(
    parent: &Arc<RegistrationState>,
    mut spec: RegistrationSpec,
    caps: &ChildrenConfig,
    now_ms: u64,
) -> Result<Child, String> {
    let pid = &parent.id;
    let depth = parent.family.depth + 1;
    if depth > caps.max_depth {
        return Err(format!(
            "parent {pid} is {} level(s) below its root registration: children.max_depth = {} allows no deeper child",
            parent.family.depth, caps.max_depth
        ));
    }
    let siblings = parent.family.child_count();
    if siblings >= caps.max_per_registration {
        return Err(format!(
            "parent {pid} has {siblings} live children: children.max_per_registration = {} allows no more",
            caps.max_per_registration
        ));
    }
    if !spec.local_tools.is_empty() {
        return Err(
            "a child registration's tools come from its parent: it cannot bring in-process tools of its own"
                .into(),
        );
    }
    // Grants: among the parent's tools only, each pattern matching at least one.
    let mut tools: Vec<GrantedTool> = Vec::new();
    let mut outside = Vec::new();
    for pattern in &spec.tools {
        let grant = Grant::parse(pattern)?;
        let before = tools.len();
        tools.extend(parent.tools.iter().filter(|t| matches(&grant, t)).cloned());
        if tools.len() == before {
            outside.push(pattern.as_str());
        }
    }
    if !outside.is_empty() {
        return Err(format!(
            "not among the parent's tools: {} (a child's grants must name tools of its parent {pid}, which has: {})",
            outside.join(", "),
            parent.tools.names().join(", ")
        ));
    }
    // Limits: at most the parent's; unset ones inherited.
    let p = &parent.limits;
    let l = &mut spec.limits;
    bounded("max_calls", &mut l.max_calls, p.max_calls)?;
    bounded("max_concurrent", &mut l.max_concurrent, p.max_concurrent)?;
    bounded(
        "calls_per_minute",
        &mut l.calls_per_minute,
        p.calls_per_minute,
    )?;
    if let Some(pt) = &p.tool_calls_per_minute {
        let ct = l.tool_calls_per_minute.get_or_insert_with(Default::default);
        for (tool, n) in pt {
            let mut c = ct.get(tool).copied();
            bounded(
                &format!("tool_calls_per_minute[{tool:?}]"),
                &mut c,
                Some(*n),
            )?;
            if let Some(c) = c {
                ct.insert(tool.clone(), c);
            }
        }
    }
    match (l.call_timeout_s, p.call_timeout_s) {
        (Some(c), Some(pp)) if c > pp => {
            return Err(format!(
                "limits.call_timeout_s ({c}) exceeds the parent's ({pp})"
            ))
        }
        (None, Some(pp)) => l.call_timeout_s = Some(pp),
        _ => {}
    }
    // TTL: ends no later than the parent's.
    let parent_end = parent.expires_at_ms();
    if parent_end != 0 {
        let left_s = parent_end.saturating_sub(now_ms).div_ceil(1000).max(1);
        spec.ttl_s = Some(spec.ttl_s.map_or(left_s, |t| t.min(left_s)));
    }
    Ok(Child {
        tools: ToolSet::new(tools),
        family: Family::child_of(parent, &spec.agent_id),
        spec,
    })
}

/// The limit `name`: at most the parent's, the parent's where unset.
fn bounded<T: PartialOrd + Copy + std::fmt::Display>(
    name: &str,
    child: &mut Option<T>,
    parent: Option<T>,
) -> Result<(), String> {
    match (*child, parent) {
        (Some(c), Some(p)) if c > p => Err(format!(
            "limits.{name} ({c}) exceeds the parent's ({p}): a child's limits are at most its parent's"
        )),
        (None, Some(p)) => {
            *child = Some(p);
            Ok(())
        }
        _ => Ok(()),
    }
}

/// A child's grant names a tool of its parent by the parent's grant rule, or by the name the
/// parent's agent sees.
fn matches(grant: &Grant, t: &GrantedTool) -> bool {
    grant.grants(t) || (matches!(t.backend, Backend::Upstream { .. }) && grant.matches(&t.name))
}
