//! What a harness asks for when it registers an execution ([`RegistrationSpec`]), with its
//! limits and roots, and the checks every registration passes before anything is resolved.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::tools::{Backend, GrantedTool, InProcessTool, ToolSet};

use super::Grant;

/// Limits bound to a registration (not to a session, so reconnecting does not reset them).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_timeout_s: Option<f64>,
    /// Calls per minute (a token bucket; issue 49): this registration's, a child's within its
    /// parent's, and a child's calls take from every ancestor's bucket too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls_per_minute: Option<u32>,
    /// Calls per minute of one tool (by the name the registration sees).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls_per_minute: Option<BTreeMap<String, u32>>,
    /// The registration's policy rules (issue 49), written as the body's top-level `policy`;
    /// kept with the limits so every store keeps them as it keeps the limits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy: Vec<crate::policy::RuleSpec>,
}

/// A root the harness sets for an execution (MCP `Root`): what `roots/list` from an upstream
/// this registration owns answers, instead of asking the agent's client.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Root {
    /// A `file://` URI.
    pub uri: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Root {
    pub fn new(uri: impl Into<String>) -> Self {
        Root {
            uri: uri.into(),
            name: None,
        }
    }

    pub fn named(uri: impl Into<String>, name: impl Into<String>) -> Self {
        Root {
            uri: uri.into(),
            name: Some(name.into()),
        }
    }
}

/// Most roots one registration may set.
pub const MAX_ROOTS: usize = 64;

/// Checks a registration's roots: at most [`MAX_ROOTS`], each a `file://` URI of at most
/// 4,096 bytes and a name of at most 256, neither with control characters.
pub fn validate_roots(roots: &[Root]) -> Result<(), String> {
    if roots.len() > MAX_ROOTS {
        return Err(format!(
            "roots: at most {MAX_ROOTS} roots (got {})",
            roots.len()
        ));
    }
    for (i, r) in roots.iter().enumerate() {
        if !r.uri.starts_with("file://")
            || r.uri.len() > 4096
            || r.uri.chars().any(char::is_control)
        {
            return Err(format!(
                "roots[{i}].uri: must be a file:// URI of at most 4096 bytes without control characters"
            ));
        }
        if let Some(n) = &r.name {
            if n.len() > 256 || n.chars().any(char::is_control) {
                return Err(format!(
                    "roots[{i}].name: at most 256 bytes without control characters"
                ));
            }
        }
    }
    Ok(())
}

/// What a harness asks for when it registers an execution.
#[derive(Debug, Clone, Default)]
pub struct RegistrationSpec {
    pub agent_id: String,
    /// Grants: `upstream.tool`, `upstream.*`, or in-process tool names of the gateway catalog.
    pub tools: Vec<String>,
    pub label: Option<String>,
    pub ttl_s: Option<u64>,
    pub limits: Limits,
    /// Tools private to this registration (always granted).
    pub local_tools: Vec<InProcessTool>,
    /// The execution's roots, set by the harness: upstreams this registration owns
    /// (`per_registration`, or its lease) get them for `roots/list`, and the agent's client
    /// is not asked. None: `roots/list` goes to a session whose client declared `roots`.
    pub roots: Option<Vec<Root>>,
    /// The id of a live registration this one is a child of (a sub-agent): its grants must
    /// be a subset of the parent's tools, its TTL and limits at most the parent's, its calls
    /// count against the parent's budget too, and it is released with the parent.
    pub parent: Option<String>,
}

impl RegistrationSpec {
    /// Makes this a child of the live registration `id`.
    pub fn parent(mut self, id: impl Into<String>) -> Self {
        self.parent = Some(id.into());
        self
    }

    pub fn new(agent_id: impl Into<String>) -> Self {
        RegistrationSpec {
            agent_id: agent_id.into(),
            ..Default::default()
        }
    }

    /// Grants a tool by name or glob.
    pub fn grant(mut self, pattern: impl Into<String>) -> Self {
        self.tools.push(pattern.into());
        self
    }

    /// Gives this registration its own in-process tool.
    pub fn with_tool(mut self, tool: InProcessTool) -> Self {
        self.local_tools.push(tool);
        self
    }

    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    pub fn ttl_s(mut self, ttl: u64) -> Self {
        self.ttl_s = Some(ttl);
        self
    }

    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Sets the execution's roots (answered to `roots/list` from upstreams it owns).
    pub fn roots(mut self, roots: Vec<Root>) -> Self {
        self.roots = Some(roots);
        self
    }
}

impl RegistrationSpec {
    /// The checks every registration passes before anything is resolved: the agent id, the
    /// roots, the names of its own tools, and each grant's shape (`Grant::parse`).
    pub fn check(&self) -> Result<(), String> {
        if self.agent_id.trim().is_empty() {
            return Err("agent_id must not be empty".into());
        }
        if self.agent_id.len() > 256 || self.agent_id.chars().any(char::is_control) {
            return Err(
                "agent_id must be at most 256 characters, without control characters".into(),
            );
        }
        if let Some(roots) = &self.roots {
            validate_roots(roots)?;
        }
        for t in &self.local_tools {
            if !crate::config::valid_tool_name(t.name()) {
                return Err(format!(
                    "tool name {:?}: names are 1-128 characters of [A-Za-z0-9_.-]",
                    t.name()
                ));
            }
        }
        for pattern in &self.tools {
            Grant::parse(pattern)?;
        }
        if self.limits.calls_per_minute == Some(0)
            || self
                .limits
                .tool_calls_per_minute
                .iter()
                .flatten()
                .any(|(_, n)| *n == 0)
        {
            return Err("limits: calls_per_minute and tool_calls_per_minute are at least 1".into());
        }
        crate::policy::compile(&self.limits.policy, "policy", false)?;
        Ok(())
    }

    /// Reads the body of `POST /v1/registrations`; errors name the field at fault.
    pub fn from_json(body: &[u8]) -> Result<RegistrationSpec, String> {
        use serde_json::Value;
        let v: Value =
            serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
        let Value::Object(mut m) = v else {
            return Err("body must be a JSON object with agent_id and tools".into());
        };
        let agent_id = match m.remove("agent_id") {
            Some(Value::String(s)) if !s.trim().is_empty() => s,
            Some(Value::String(_)) => return Err("agent_id: must not be empty".into()),
            Some(_) => return Err("agent_id: must be a string".into()),
            None => return Err("agent_id: required".into()),
        };
        let tools = match m.remove("tools") {
            Some(Value::Array(a)) => a
                .into_iter()
                .enumerate()
                .map(|(i, t)| match t {
                    Value::String(s) => Ok(s),
                    _ => Err(format!("tools[{i}]: must be a string")),
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err("tools: must be an array of tool names or globs".into()),
            None => return Err("tools: required (an array of tool names or globs)".into()),
        };
        let label = match m.remove("label") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(_) => return Err("label: must be a string".into()),
        };
        let ttl_s = match m.remove("ttl_s") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Some(n),
                _ => return Err("ttl_s: must be a positive integer (seconds)".into()),
            },
        };
        let limits = match m.remove("limits") {
            None | Some(Value::Null) => Limits::default(),
            Some(v) => serde_json::from_value::<Limits>(v).map_err(|e| format!("limits: {e}"))?,
        };
        let mut limits = limits;
        match m.remove("policy") {
            None | Some(Value::Null) => {}
            Some(_) if !limits.policy.is_empty() => {
                return Err("policy: give it once, at the top level".into())
            }
            Some(v) => {
                limits.policy = serde_json::from_value(v).map_err(|e| {
                    format!(
                        "policy: {e} (an array of {{\"id\", \"when\", \"effect\", \"reason\"?}})"
                    )
                })?
            }
        }
        let roots = match m.remove("roots") {
            None | Some(Value::Null) => None,
            Some(v) => Some(serde_json::from_value::<Vec<Root>>(v).map_err(|e| {
                format!("roots: {e} (an array of {{\"uri\": \"file://…\", \"name\": …}})")
            })?),
        };
        let parent = match m.remove("parent") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() => Some(s),
            Some(_) => return Err("parent: must be a registration id (a string)".into()),
        };
        if let Some(k) = m.keys().next() {
            return Err(format!(
                "{k}: unknown field (expected agent_id, tools, label, ttl_s, limits, policy, roots, parent)"
            ));
        }
        Ok(RegistrationSpec {
            agent_id,
            tools,
            label,
            ttl_s,
            limits,
            local_tools: Vec::new(),
            roots,
            parent,
        })
    }
}

/// The tools a (root) registration's grants give: its own tools, then per grant the
/// in-process tools of `catalog` and the upstream tools it matches. Each grant must match a
/// tool (the error says why it matched none: `has_upstream` tells a configured upstream), and
/// no two tools may be exposed under one name.
pub fn resolve(
    spec: &RegistrationSpec,
    catalog: &BTreeMap<String, InProcessTool>,
    upstream_tools: &[GrantedTool],
    has_upstream: impl Fn(&str) -> bool,
) -> Result<ToolSet, String> {
    let mut granted: Vec<GrantedTool> = Vec::new();
    for t in &spec.local_tools {
        granted.push(GrantedTool {
            name: t.name().to_string(),
            descriptor: t.shared_descriptor(),
            backend: Backend::InProcess(t.clone()),
        });
    }
    for pattern in &spec.tools {
        let grant = Grant::parse(pattern)?;
        let before = granted.len();
        for (name, t) in catalog.iter().filter(|(n, _)| grant.matches(n)) {
            granted.push(GrantedTool {
                name: name.clone(),
                descriptor: t.shared_descriptor(),
                backend: Backend::InProcess(t.clone()),
            });
        }
        granted.extend(
            upstream_tools
                .iter()
                .filter(|t| matches!(t.backend, Backend::Upstream { .. }) && grant.grants(t))
                .cloned(),
        );
        if granted.len() == before {
            let prefix = grant.upstream();
            return Err(match prefix {
                Some(p) if has_upstream(p) => format!(
                    "grant {pattern:?} matches no tool: upstream {p:?} has no tool by that name"
                ),
                Some(p) => format!(
                    "grant {pattern:?} matches no tool: {p:?} is not a configured upstream and no in-process tool has that name"
                ),
                None => format!(
                    "grant {pattern:?} matches no tool: no in-process tool or upstream tool has that name"
                ),
            });
        }
    }
    let described = granted.iter().map(|t| {
        let who = match &t.backend {
            Backend::InProcess(_) => format!("in-process tool {:?}", t.name),
            Backend::Upstream { grant_name, .. } => format!("upstream tool {grant_name:?}"),
        };
        (t.name.as_str(), who)
    });
    if let Some((name, a, b)) = crate::tool_name::first_collision(described) {
        return Err(format!(
            "tool name collision: {a} and {b} are both exposed as {name:?}; rename one (the upstream's `rename`) or choose another separator"
        ));
    }
    Ok(ToolSet::new(granted))
}
