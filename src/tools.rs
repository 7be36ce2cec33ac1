//! Tools as a registration sees them: in-process tools written in Rust, granted tool sets,
//! and the `CallToolResult` values they produce.

use crate::sync::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::protocol::param_header::{self, ParamHeaders};
use crate::protocol::{jsonrpc, LOG_LEVELS};

/// The boxed future an in-process tool handler returns.
pub type ToolFuture = Pin<Box<dyn Future<Output = Result<ToolResult, ToolError>> + Send>>;
type Handler = dyn Fn(Value, ToolContext) -> ToolFuture + Send + Sync;

/// A `CallToolResult` object, passed to the client as is.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult(pub Value);

impl ToolResult {
    /// One text block.
    pub fn text(text: impl Into<String>) -> Self {
        ToolResult(json!({"content": [{"type": "text", "text": text.into()}]}))
    }

    /// A tool execution error (`isError: true`) with one text block.
    pub fn error(text: impl Into<String>) -> Self {
        ToolResult(json!({"content": [{"type": "text", "text": text.into()}], "isError": true}))
    }

    /// Structured content, with its JSON text as a text block for older clients.
    pub fn structured(value: Value) -> Self {
        let text = value.to_string();
        ToolResult(json!({"content": [{"type": "text", "text": text}], "structuredContent": value}))
    }

    /// Whether the result reports a tool execution error.
    pub fn is_error(&self) -> bool {
        self.0.get("isError").and_then(Value::as_bool) == Some(true)
    }
}

/// A failure inside an in-process tool; reported to the client as a tool error (`isError`).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

impl ToolError {
    pub fn new(message: impl Into<String>) -> Self {
        ToolError(message.into())
    }
}

/// What a tool handler knows about the call it serves.
#[derive(Clone)]
pub struct ToolContext {
    pub registration_id: Arc<str>,
    pub agent_id: Arc<str>,
    /// The registration's label, if the harness gave one.
    pub label: Option<Arc<str>>,
    /// The MCP session the call came on (none for stateless 2026-07-28 requests).
    pub session_id: Option<Arc<str>>,
    /// Fires when the call is cancelled (client cancel, release, timeout).
    pub cancel: CancellationToken,
    /// The caller's `progressToken`, if it asked for progress.
    pub(crate) progress_token: Option<Value>,
    /// Where notifications of this call go (its client), if anywhere.
    pub(crate) notify: Option<mpsc::Sender<Value>>,
}

impl ToolContext {
    /// Sends `notifications/progress` to the caller, if it asked for progress.
    pub async fn progress(&self, progress: f64, total: Option<f64>, message: Option<&str>) {
        let (Some(token), Some(tx)) = (&self.progress_token, &self.notify) else {
            return;
        };
        let mut p = Map::new();
        p.insert("progressToken".into(), token.clone());
        p.insert("progress".into(), json!(progress));
        if let Some(t) = total {
            p.insert("total".into(), json!(t));
        }
        if let Some(m) = message {
            p.insert("message".into(), json!(m));
        }
        let n = jsonrpc::notification("notifications/progress", Some(Value::Object(p)));
        let _ = tx.send(n).await;
    }

    /// Whether the caller asked for progress (sent a `progressToken`).
    pub fn wants_progress(&self) -> bool {
        self.progress_token.is_some() && self.notify.is_some()
    }

    /// Sends a log message (`notifications/message`) to the caller. `level` must be one of
    /// [`LOG_LEVELS`]; an unknown level is sent as `info`.
    pub async fn log(&self, level: &str, message: &str) {
        let Some(tx) = &self.notify else {
            return;
        };
        let level = LOG_LEVELS
            .iter()
            .find(|l| **l == level)
            .copied()
            .unwrap_or("info");
        let n = jsonrpc::notification(
            "notifications/message",
            Some(json!({"level": level, "logger": "gatehouse.tool", "data": message})),
        );
        let _ = tx.send(n).await;
    }
}

/// A tool implemented in the harness process.
#[derive(Clone)]
pub struct InProcessTool {
    /// Shared by every registration the tool is granted to.
    descriptor: Arc<Value>,
    handler: Arc<Handler>,
}

impl std::fmt::Debug for InProcessTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessTool")
            .field("descriptor", &self.descriptor)
            .finish()
    }
}

impl InProcessTool {
    /// A tool with a name, a description, a JSON Schema for its arguments and a handler.
    ///
    /// On Streamable HTTP and stateless requests the handler's future is polled by the task of
    /// the request that called it (no task hop), so it must not block its thread: run
    /// blocking work with `tokio::task::spawn_blocking`.
    pub fn new<F, Fut>(name: &str, description: &str, input_schema: Value, handler: F) -> Self
    where
        F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ToolResult, ToolError>> + Send + 'static,
    {
        InProcessTool {
            descriptor: Arc::new(json!({
                "name": name,
                "description": description,
                "inputSchema": input_schema,
            })),
            handler: Arc::new(move |args, ctx| Box::pin(handler(args, ctx))),
        }
    }

    /// Adds `annotations` (e.g. `readOnlyHint`) to the tool's descriptor.
    pub fn with_annotations(mut self, annotations: Value) -> Self {
        if let Some(m) = Arc::make_mut(&mut self.descriptor).as_object_mut() {
            m.insert("annotations".into(), annotations);
        }
        self
    }

    pub fn name(&self) -> &str {
        self.descriptor
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    pub fn descriptor(&self) -> &Value {
        &self.descriptor
    }

    /// The shared descriptor (no copy per registration).
    pub(crate) fn shared_descriptor(&self) -> Arc<Value> {
        self.descriptor.clone()
    }

    pub(crate) fn call(&self, args: Value, ctx: ToolContext) -> ToolFuture {
        (self.handler)(args, ctx)
    }
}

/// Where a granted tool runs.
#[derive(Debug, Clone)]
pub enum Backend {
    InProcess(InProcessTool),
    Upstream {
        upstream: String,
        /// The tool's name at the upstream.
        tool: String,
        /// `<upstream>.<tool after rename>`: what grants match (`tool_name`), whatever the
        /// separator and length rule made of the exposed name.
        grant_name: String,
        /// Whether the upstream runs it as a task (`execution.taskSupport`, 2025-11-25): read
        /// once from the descriptor when granted, not at every call.
        task_support: TaskSupport,
    },
}

/// A tool's `execution.taskSupport` (2025-11-25; absent: `Forbidden`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskSupport {
    Forbidden,
    Optional,
    Required,
}

/// A tool's `execution.taskSupport`, from its descriptor.
pub fn task_support(descriptor: &serde_json::Value) -> TaskSupport {
    match descriptor
        .get("execution")
        .and_then(|e| e.get("taskSupport"))
        .and_then(serde_json::Value::as_str)
    {
        Some("required") => TaskSupport::Required,
        Some("optional") => TaskSupport::Optional,
        _ => TaskSupport::Forbidden,
    }
}

/// One tool granted to a registration, under the name its agent sees.
#[derive(Debug, Clone)]
pub struct GrantedTool {
    pub name: String,
    /// The `Tool` object served in `tools/list`, its `name` set to `name`. Shared between
    /// registrations granted the same tool.
    pub descriptor: Arc<Value>,
    pub backend: Backend,
}

impl GrantedTool {
    pub fn upstream(&self) -> Option<&str> {
        match &self.backend {
            Backend::InProcess(_) => None,
            Backend::Upstream { upstream, .. } => Some(upstream),
        }
    }
}

/// The tools a registration may see and call, in deterministic (name) order.
#[derive(Debug, Default)]
pub struct ToolSet {
    tools: Vec<GrantedTool>,
    index: HashMap<String, usize>,
    /// The tools whose `inputSchema` carries `x-mcp-header` annotations, by name, computed
    /// once here (empty for most sets: a call of another tool pays one `is_empty`).
    params: HashMap<String, ParamHeaders>,
    /// Some tool is visible to an MCP App's view only (`protocol::apps::app_only`): a call's
    /// record asks which tool it was only then (most sets: one `bool` read per call).
    has_app_only: bool,
}

impl ToolSet {
    pub fn new(mut tools: Vec<GrantedTool>) -> Self {
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        tools.dedup_by(|a, b| a.name == b.name);
        let index = tools
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        let params = tools
            .iter()
            .filter_map(|t| {
                // A tool breaking the rules was left out of its catalog (`upstream::catalog`);
                // one stored before is served without the check.
                let found = param_header::scan(t.descriptor.get("inputSchema")?).ok()?;
                (!found.is_empty()).then(|| (t.name.clone(), ParamHeaders::from(found)))
            })
            .collect();
        let has_app_only = tools
            .iter()
            .any(|t| crate::protocol::apps::app_only(&t.descriptor));
        ToolSet {
            tools,
            index,
            params,
            has_app_only,
        }
    }

    /// Whether tool `name` is granted and visible to an MCP App's view only: a call to it
    /// came from the view (`initiator: "app"`).
    pub fn is_app_only(&self, name: &str) -> bool {
        self.has_app_only
            && self
                .get(name)
                .is_some_and(|t| crate::protocol::apps::app_only(&t.descriptor))
    }

    /// The `Mcp-Param-*` arguments of tool `name` (2026-07-28), if it has any.
    pub fn param_headers(&self, name: &str) -> Option<&ParamHeaders> {
        if self.params.is_empty() {
            return None;
        }
        self.params.get(name)
    }

    pub fn get(&self, name: &str) -> Option<&GrantedTool> {
        self.index.get(name).and_then(|i| self.tools.get(*i))
    }

    pub fn iter(&self) -> impl Iterator<Item = &GrantedTool> {
        self.tools.iter()
    }

    pub fn names(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.name.clone()).collect()
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The `tools` array of a `tools/list` result.
    pub fn descriptors(&self) -> Vec<Value> {
        self.tools.iter().map(|t| (*t.descriptor).clone()).collect()
    }
}
