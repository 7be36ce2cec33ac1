//! An upstream's tool catalog: fetched at the upstream's first use (`initialize`, `tools/list`),
//! refreshed on `notifications/tools/list_changed`, and the tools agents see of it.

use std::sync::Arc;

use serde_json::{json, Value};

use super::{Connection, UpstreamError};
use crate::config::UpstreamConfig;
use crate::tools::{Backend, GrantedTool};

/// An upstream's tools as fetched at its first use (refreshed on `list_changed`).
#[derive(Debug, Clone)]
pub struct Catalog {
    pub tools: Vec<Value>,
    /// The server's `capabilities` from its `initialize` result (`resources`, `prompts`, …).
    pub capabilities: Value,
}

impl Catalog {
    /// Lists the connection's tools (every page) and keeps its capabilities; `trace`: the
    /// pool work's trace context (tracing on).
    pub(super) async fn fetch(
        conn: &Connection,
        trace: Option<&crate::telemetry::TraceMeta>,
    ) -> Result<Catalog, UpstreamError> {
        let mut tools = conn.list_tools_traced(trace).await?;
        let capabilities = conn
            .initialize_result()
            .get("capabilities")
            .cloned()
            .unwrap_or_else(|| json!({}));
        if conn.is_modern()
            && capabilities
                .pointer("/extensions")
                .and_then(|e| e.get(super::TASKS_EXTENSION))
                .is_some()
        {
            // A 2026-07-28 upstream decides per call whether a call runs as a task (the
            // tools say nothing): each tool is shown `optional` (a 2025-11-25 client may ask
            // for a task; a plain call the upstream runs only as a task is run as one by
            // the gateway, `call::run_one`).
            for t in &mut tools {
                if let Some(m) = t.as_object_mut() {
                    let exec = m.entry("execution").or_insert_with(|| json!({}));
                    if let Some(e) = exec.as_object_mut() {
                        e.entry("taskSupport").or_insert_with(|| json!("optional"));
                    }
                }
            }
        }
        Ok(Catalog {
            tools,
            capabilities,
        })
    }

    /// The tools agents see, under their exposed names (invalid names are left out).
    pub(super) fn granted_tools(&self, config: &UpstreamConfig) -> Vec<GrantedTool> {
        let mut out = Vec::new();
        for t in &self.tools {
            let Some(tool) = t.get("name").and_then(Value::as_str) else {
                continue;
            };
            let (name, grant_name) = exposed_name(config, tool);
            if !crate::config::valid_tool_name(&name) {
                tracing::warn!(upstream = %config.id, tool, "tool not exposed: its name is not 1-128 characters of [A-Za-z0-9_.-]");
                continue;
            }
            // 2026-07-28: a client MUST drop a tool whose `x-mcp-header` annotations break the
            // rules (its clients over Streamable HTTP would; the gateway could not mirror them).
            if let Some(Err(rule)) = t
                .get("inputSchema")
                .map(crate::protocol::param_header::scan)
            {
                tracing::warn!(upstream = %config.id, tool, rule = %rule, "tool not exposed: its x-mcp-header annotation breaks the rules");
                continue;
            }
            let mut descriptor = t.clone();
            if let Some(m) = descriptor.as_object_mut() {
                m.insert("name".into(), Value::String(name.clone()));
            }
            out.push(GrantedTool {
                name,
                backend: Backend::Upstream {
                    upstream: config.id.clone(),
                    tool: tool.to_string(),
                    grant_name,
                    task_support: crate::tools::task_support(&descriptor),
                },
                descriptor: Arc::new(descriptor),
            });
        }
        out
    }
}

/// The name agents see for an upstream tool, and its grant name `<upstream>.<tool>`
/// (`tool_name`: `rename`, then the upstream's separator and model-safe rule).
pub fn exposed_name(config: &UpstreamConfig, tool: &str) -> (String, String) {
    let local = config.rename.get(tool).map(String::as_str).unwrap_or(tool);
    (
        crate::tool_name::exposed(&config.id, local, config.name_rule()),
        crate::tool_name::grant_name(&config.id, local),
    )
}
