//! Method dispatch: what each MCP method does for a registration, whatever the transport.

use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use crate::call;
use crate::methods::request::{RequestCtx, Served};
use crate::protocol::jsonrpc::{self, Reply, RpcError};
use crate::protocol::{server_info, Method};

/// The `initialize` result for a requested version; records the version on the session.
pub async fn initialize(ctx: &RequestCtx, params: Option<&Value>) -> Value {
    let requested = params
        .and_then(|p| p.get("protocolVersion"))
        .and_then(Value::as_str);
    let version = crate::protocol::negotiate(requested);
    if let Some(s) = &ctx.session {
        s.set_protocol_version(version);
        s.set_client_capabilities(params.and_then(|p| p.get("capabilities")));
    }
    json!({
        "protocolVersion": version,
        "capabilities": crate::methods::proxy::capabilities(ctx).await,
        "serverInfo": server_info(),
        "instructions": format!("Tools granted to agent {}.", ctx.registration.agent_id),
    })
}

/// Handles one request. `None`: no reply is to be sent (the request was cancelled).
///
/// Methods other than `tools/call` and `ping` run boxed: their futures are large (the
/// upstream pool's), and this future is moved with every request (see `call::run`).
pub async fn handle_request(
    ctx: &RequestCtx,
    id: Value,
    method: &str,
    params: Option<Value>,
    cancel: CancellationToken,
) -> Option<Reply> {
    let needs_init = !matches!(method, "initialize" | "ping");
    if let Some(s) = &ctx.session {
        if needs_init && s.protocol_version().is_none() {
            return Some(
                RpcError::invalid_request("session not initialized: send initialize first")
                    .to(id)
                    .to_value()
                    .into(),
            );
        }
    }
    if method == "tools/call" {
        return call::run(ctx, id, params, cancel).await;
    }
    observed(ctx, id, method, params, cancel)
        .await
        .map(Reply::Value)
}

/// Every method but `tools/call`, observed: `mcp_server_operation_duration_seconds` by method
/// and, with tracing on, a SERVER span (`call::run` does both for `tools/call`).
async fn observed(
    ctx: &RequestCtx,
    id: Value,
    method: &str,
    params: Option<Value>,
    cancel: CancellationToken,
) -> Option<Value> {
    let began = begin(ctx, &id, method, params.as_ref());
    let req = Served {
        id,
        method,
        params,
        cancel,
        trace: began.trace(),
    };
    let reply = handle_other(ctx, req).await;
    began.end(ctx, reply.as_ref());
    reply
}

/// A request other than `tools/call` under way: when it began, and its SERVER span.
pub(crate) struct Began {
    started: std::time::Instant,
    method: &'static str,
    trace: Option<Box<crate::telemetry::CallTrace>>,
}

/// Begins observing a request other than `tools/call` (the stateless `server/discover` too).
pub(crate) fn begin(ctx: &RequestCtx, id: &Value, method: &str, params: Option<&Value>) -> Began {
    let method = crate::protocol::method_name(method);
    Began {
        started: std::time::Instant::now(),
        method,
        trace: ctx
            .hub
            .telemetry()
            .map(|t| request_span(t, ctx, id, method, params)),
    }
}

impl Began {
    pub(crate) fn trace(&self) -> Option<&crate::telemetry::CallTrace> {
        self.trace.as_deref()
    }

    /// The request answered `reply` (`None`: cancelled, nothing sent): its duration in
    /// `mcp_server_operation_duration_seconds`, its span ended.
    pub(crate) fn end(self, ctx: &RequestCtx, reply: Option<&Value>) {
        let error_type = match reply {
            None => Some("cancelled"),
            Some(r) => r
                .get("error")
                .and_then(|e| e.get("code"))
                .and_then(Value::as_i64)
                .map(crate::telemetry::code_error_type),
        };
        ctx.hub.metrics().observe_operation(
            false,
            self.method,
            error_type,
            "tcp",
            self.started.elapsed(),
        );
        if let Some(t) = self.trace {
            // No description: an error's message may echo what the client sent (a URI's query).
            t.end(error_type, None, Vec::new());
        }
    }
}

/// The SERVER span of a request other than `tools/call` (tracing on): its parent from
/// `_meta`, else the HTTP header; its target a prompt name or a resource URI (cut, never a
/// value carrying the caller's token). Cold: requests pay for it only with tracing on.
#[cold]
fn request_span(
    t: &crate::telemetry::Telemetry,
    ctx: &RequestCtx,
    id: &Value,
    method: &'static str,
    params: Option<&Value>,
) -> Box<crate::telemetry::CallTrace> {
    use crate::telemetry::{redacted_uri, Target};
    let reg = &ctx.registration;
    let clean = |s: &str| !reg.token_in(&Value::from(s));
    let mut inbound = crate::telemetry::Inbound::default();
    if let Some(Value::Object(p)) = params {
        inbound = inbound.with_meta(p);
    }
    let inbound = inbound
        .with_headers(ctx.trace_headers.as_deref())
        .without(|s| !clean(s));
    fn text<'v>(v: Option<&'v Value>, clean: &dyn Fn(&str) -> bool) -> Option<&'v str> {
        v.and_then(Value::as_str).filter(|s| clean(s))
    }
    let param = |k: &str| params.and_then(|p| p.get(k));
    let uri;
    let target = match method {
        "prompts/get" => text(param("name"), &clean)
            .filter(|n| n.len() <= crate::audit::MAX_TOOL_NAME_BYTES)
            .map_or(Target::None, Target::Prompt),
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => {
            uri = text(param("uri"), &clean).map(redacted_uri);
            uri.as_deref().map_or(Target::None, Target::Resource)
        }
        "completion/complete" => {
            let r = param("ref");
            let prompt = text(r.and_then(|r| r.get("name")), &clean)
                .filter(|n| n.len() <= crate::audit::MAX_TOOL_NAME_BYTES);
            uri = text(r.and_then(|r| r.get("uri")), &clean).map(redacted_uri);
            match (prompt, uri.as_deref()) {
                (Some(p), _) => Target::Prompt(p),
                (None, Some(u)) => Target::Resource(u),
                (None, None) => Target::None,
            }
        }
        _ => Target::None,
    };
    t.request_span(
        inbound,
        &crate::telemetry::RequestAbout {
            method,
            target,
            common: ctx.span_common(id),
        },
    )
}

/// Every method but `tools/call` (whose reply may carry an upstream's result as written).
async fn handle_other(ctx: &RequestCtx, req: Served<'_>) -> Option<Value> {
    let (method, kind) = (req.method, Method::of(req.method));
    // The message's method read once. Task and proxied methods take the request whole; the
    // others answer its id (moved, not cloned).
    match kind {
        m if m.is_task() => return Box::pin(crate::methods::tasks::handle(ctx, req)).await,
        m if m.is_proxied() => {
            return Some(Box::pin(crate::methods::proxy::handle(ctx, req)).await)
        }
        _ => {}
    }
    let (id, params) = (req.id, req.params.as_ref());
    Some(match kind {
        Method::Initialize => {
            if ctx
                .session
                .as_ref()
                .is_some_and(|s| s.protocol_version().is_some())
            {
                return Some(
                    RpcError::invalid_request(
                        "invalid request: this session is already initialized",
                    )
                    .to(id)
                    .to_value(),
                );
            }
            let result = Box::pin(initialize(ctx, params)).await;
            jsonrpc::success(id, result)
        }
        Method::Ping => jsonrpc::success(id, json!({})),
        Method::ToolsList => tools_list(ctx, id, params),
        Method::LoggingSetLevel => set_log_level(ctx, id, params),
        _ => RpcError::method_not_found(format!("method not found: {method}"))
            .to(id)
            .to_value(),
    })
}

/// `logging/setLevel`: the gateway filters the upstream logs it forwards to this session (an
/// upstream connection may be shared, so the level is not passed on). Without a session
/// (stateless requests) there is nothing to remember; the request is acknowledged.
fn set_log_level(ctx: &RequestCtx, id: Value, params: Option<&Value>) -> Value {
    let level = params.and_then(|p| p.get("level")).and_then(Value::as_str);
    let Some(level) = level.filter(|l| crate::protocol::log_level_index(l).is_some()) else {
        return RpcError::invalid_params("logging/setLevel: \"level\" must be one of debug, info, notice, warning, error, critical, alert, emergency").to(id)
        .to_value();
    };
    if let Some(s) = &ctx.session {
        s.set_log_level(level);
    }
    jsonrpc::success(id, json!({}))
}

fn tools_list(ctx: &RequestCtx, id: Value, params: Option<&Value>) -> Value {
    if let Some(c) = params.and_then(|p| p.get("cursor")) {
        if !c.is_null() && c != "" {
            return RpcError::invalid_params(
                "invalid cursor: this gateway returns every tool in one page",
            )
            .to(id)
            .to_value();
        }
    }
    let mut result = Map::new();
    let mut tools = ctx.registration.pins.descriptors(&ctx.registration.tools);
    tools.iter_mut().for_each(crate::tasks::wire::listed);
    result.insert("tools".into(), Value::Array(tools));
    jsonrpc::success(id, Value::Object(result))
}

/// Handles a notification from the client.
pub fn handle_notification(ctx: &RequestCtx, method: &str, params: Option<&Value>) {
    match method {
        "notifications/initialized" => {
            if let Some(s) = &ctx.session {
                s.mark_initialized();
            }
        }
        "notifications/cancelled" => {
            let Some(request_id) = params.and_then(|p| p.get("requestId")) else {
                return;
            };
            if let Some(s) = &ctx.session {
                if s.cancel_call(request_id) {
                    tracing::debug!(session = %s.id, "call cancelled by client");
                }
            }
        }
        // Passed to the connections this registration owns, unless its harness set the roots
        // (then those answer roots/list, whatever the client has).
        "notifications/roots/list_changed" => {
            let declared = ctx
                .session
                .as_ref()
                .is_some_and(|s| s.declares(crate::protocol::ClientCapability::Roots));
            if declared && ctx.registration.roots.is_none() {
                ctx.hub.pool().roots_list_changed(&ctx.registration.id);
            }
        }
        other => tracing::debug!(method = other, "notification ignored"),
    }
}
