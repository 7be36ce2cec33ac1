//! A governed tool call, in four steps, each testable on its own: [`parse`] the params,
//! [`admit`] the call (grant, audit health, limits: the [`Admission`] it returns gives back
//! the concurrency slot it took when dropped), [`execute`] it (timeout, cancellation,
//! upstream or in-process), and [`finish`], the one place every outcome goes through — a
//! refusal at any step included: it builds the audit record once, from a [`Summary`], and
//! writes it and the call's metric before the reply is sent.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use serde_json::{json, Map, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::audit::{args_digest, HexDigest, Outcome, MAX_TOOL_NAME_BYTES};
use crate::mcp::jsonrpc::{self, Reply};
use crate::mcp::request::RequestCtx;
use crate::pins::Drift;
use crate::registry::RegistrationState;
use crate::telemetry::{CallTrace, Telemetry};
use crate::tools::{Backend, GrantedTool, ToolContext, ToolResult};
use crate::upstream::{CallIds, ForwardCall, ForwardError, ForwardOutcome, RawResult};

/// How a call ended (or was refused), before [`finish`] turns it into a record and a reply.
#[derive(Debug)]
pub(crate) enum Ended {
    /// A `CallToolResult` for the client.
    Result(Value, Outcome),
    /// An upstream's `CallToolResult`, as it wrote it.
    Raw(RawResult, Outcome),
    /// A JSON-RPC error for the client.
    Error(i64, String, Outcome),
    /// Refused by a limit: a tool error result saying why (the record's reason too).
    Limited(String),
    /// The registration's `call_timeout_s` (seconds) elapsed.
    TimedOut(f64),
    /// Refused while the audit log cannot be written.
    AuditDown,
    /// Cancelled: nothing is sent.
    Cancelled,
}

/// A `tools/call`'s params, read in one pass: a map lookup hashes its key (SipHash), and a
/// `tools/call` reads three of them.
#[derive(Debug)]
pub(crate) struct ToolCall {
    pub name: String,
    pub arguments: Value,
    /// The params as sent, `arguments` taken out (`Null` in its place; the upstream's params
    /// get it back there, `upstream::forward`).
    pub params: Map<String, Value>,
    pub progress_token: Option<Value>,
    /// The params hold a `task` member (2025-11-25 tasks; `mcp::tasks::prepare_call`).
    pub task: bool,
}

/// A call refused before it runs: the tool name if it was read, the record's reason, and how
/// it ended.
#[derive(Debug)]
pub(crate) struct Refused {
    pub tool: Option<String>,
    pub reason: Cow<'static, str>,
    pub ended: Ended,
}

/// Step 1: the params of a `tools/call`, or why they are refused (malformed: a
/// `protocol_error`, -32602; a name longer than the audit keeps: `denied`, -32602).
pub(crate) fn parse(params: Option<Value>) -> Result<ToolCall, Refused> {
    let malformed = |tool, reason: &'static str, message: &str| Refused {
        tool,
        reason: reason.into(),
        ended: Ended::Error(
            jsonrpc::INVALID_PARAMS,
            message.to_string(),
            Outcome::ProtocolError,
        ),
    };
    let mut params = match params {
        Some(Value::Object(m)) => m,
        _ => {
            return Err(malformed(
                None,
                "params must be an object with a name",
                "tools/call needs params {\"name\": string, \"arguments\"?: object}",
            ))
        }
    };
    let mut name = None;
    let mut arguments = None;
    let mut progress_token = None;
    let mut task = false;
    for (k, v) in params.iter_mut() {
        match k.as_str() {
            "name" => name = Some(&*v),
            "arguments" => arguments = Some(std::mem::take(v)),
            "_meta" => progress_token = v.get("progressToken").cloned(),
            "task" => task = true,
            _ => {}
        }
    }
    let name = match name {
        Some(Value::String(s)) => s.clone(),
        _ => {
            return Err(malformed(
                None,
                "missing tool name",
                "tools/call: \"name\" must be a string",
            ))
        }
    };
    let arguments = match arguments {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v,
        Some(_) => {
            return Err(malformed(
                Some(name),
                "arguments must be an object",
                "tools/call: \"arguments\" must be an object",
            ))
        }
    };
    if name.len() > MAX_TOOL_NAME_BYTES {
        // Not echoed: the reply names the rule, the record a cut, digested copy.
        let n = name.len();
        return Err(Refused {
            tool: Some(name),
            reason: format!("tool name too long ({n} bytes; at most {MAX_TOOL_NAME_BYTES})")
                .into(),
            ended: Ended::Error(
                jsonrpc::INVALID_PARAMS,
                format!(
                    "Unknown tool: the name is too long ({n} bytes; tool names are at most {MAX_TOOL_NAME_BYTES} bytes)"
                ),
                Outcome::Denied,
            ),
        });
    }
    Ok(ToolCall {
        name,
        arguments,
        params,
        progress_token,
        task,
    })
}

/// What the record says of the arguments: their digest (redacted keys left out: a digest of a
/// low-entropy secret could be brute-forced offline) and, if configured, the redacted copy.
fn asked(ctx: &RequestCtx, args: &Value) -> (HexDigest, Option<Value>) {
    let audit = &ctx.hub.config().audit;
    let redacted = (!audit.redact_keys.is_empty()).then(|| redact(args, &audit.redact_keys));
    let digest = args_digest(redacted.as_ref().unwrap_or(args));
    let arguments = audit
        .record_arguments
        .then(|| redacted.unwrap_or_else(|| args.clone()));
    (digest, arguments)
}

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
    match reg.admit_call(budget).await {
        Ok(admission) => Ok((tool, admission)),
        Err(why) => Err(limited(why)),
    }
}

/// What [`finish`] builds the record from: the text it borrows, how the call ended.
pub(crate) struct Summary<'a> {
    pub tool: Option<&'a str>,
    /// `tool` is one of the registration's tools (the metric's label; else `_unknown`).
    pub granted: bool,
    pub upstream: Option<&'a str>,
    pub digest: Option<&'a str>,
    pub arguments: Option<Value>,
    /// The record's reason, if the step that ended the call gave one.
    pub reason: Option<Cow<'static, str>>,
    pub ids: Option<&'a CallIds>,
    pub ended: Ended,
    /// The call's SERVER span (tracing on), ended by [`finish`].
    pub trace: Option<Box<CallTrace>>,
    /// A cluster node: the store revision the call was admitted (or refused) against.
    pub revision: Option<u64>,
}

/// Runs `tools/call`: the four steps. Returns the reply, or `None` when the call was
/// cancelled. The rare, large paths are boxed (ARCHITECTURE.md, Decisions: request futures).
///
/// Not an `async fn`: an `async fn` moves its arguments into locals of its own, so `id` and
/// `params` would take room twice in its state; the block uses its captures in place, and
/// binds what `parse` gives straight into the locals it needs (this future is moved with
/// every call: smaller is cheaper).
#[allow(clippy::manual_async_fn)] // an async fn would hold `id` and `params` twice (above)
pub fn run<'c>(
    ctx: &'c RequestCtx,
    id: Value,
    params: Option<Value>,
    cancel: CancellationToken,
) -> impl std::future::Future<Output = Option<Reply>> + Send + 'c {
    async move {
        let started = Instant::now();
        // The call read, and its SERVER span begun (tracing off: one `None` check, nothing
        // built); in a block, so the whole `ToolCall` is not kept in this future's state.
        let (trace, name, arguments, mut params, progress_token, task) = {
            let call = match parse(params) {
                Ok(c) => c,
                Err(r) => {
                    return Box::pin(refuse(ctx, started, id, r, None, None, None)).await;
                }
            };
            let trace = ctx.hub.telemetry().map(|t| server_span(t, ctx, &id, &call));
            let ToolCall {
                name,
                arguments,
                params,
                progress_token,
                task,
            } = call;
            (trace, name, arguments, params, progress_token, task)
        };
        // 2025-11-25 `params.task`: kept (TTL capped) on sessions, dropped on stateless
        // requests (read by `parse`'s one pass: most calls have none, and a lookup hashes).
        let max_ttl = Duration::from_secs(ctx.hub.config().tasks.max_ttl_s.max(1));
        let asks_task =
            task && crate::mcp::tasks::prepare_call(&mut params, ctx.session.is_some(), max_ttl);
        let (digest, recorded) = asked(ctx, &arguments);
        let reg = &ctx.registration;
        let budget = Budget {
            store: &**ctx.hub.store(),
            block: ctx.hub.config().store.budget_block,
        };
        // A cluster node: the store revision the admission is decided against (everything
        // up to it applied; `None` outside a cluster: one atomic load).
        let revision = ctx.hub.fence().decided_at();
        let (tool, admission) = match admit(budget, reg, &name, ctx.hub.audit().is_healthy()).await
        {
            Ok(a) => a,
            Err((tool, mut r)) => {
                r.tool = Some(name);
                let upstream = tool.and_then(GrantedTool::upstream);
                let asked = Some((digest.as_str(), recorded));
                return Box::pin(refuse(ctx, started, id, r, upstream, asked, trace)).await;
            }
        };
        // A tool its upstream runs only as a task, called without one: the gateway asks for
        // the task and waits for its end itself (`mcp::tasks::run_for_call`), unless a
        // stateless client declared the 2026-07-28 tasks extension (it gets the task). A
        // stateless client that declared it gets a task of an `optional` tool too (the
        // server decides, and runs such a tool as a task for a client that opted in).
        // What a task call keeps for its task (boxed: the call's future grows by one pointer).
        let mut task_call: Option<Box<TaskCall>> = None;
        if !asks_task
            && (crate::mcp::tasks::requires_task(tool)
                || crate::mcp::tasks::stateless_asks(tool, &params, ctx.session.is_none()))
        {
            let modern = crate::mcp::tasks::ask_task(&mut params, max_ttl, ctx.session.is_none());
            let progress = progress_token.clone();
            task_call = Some(Box::new(TaskCall { modern, progress }));
        } else if asks_task {
            let progress = progress_token.clone();
            task_call = Some(Box::new(TaskCall {
                modern: None,
                progress,
            }));
        }
        // A tool that may run as a task (`optional`), called without one: a 2026-07-28
        // upstream that runs it only as a task answers -32021 (the tasks extension not
        // declared), and the call is then made again asking for one. What that needs is
        // kept (boxed: one pointer in every call's future; set only for such tools).
        let again = (task_call.is_none() && crate::mcp::tasks::may_answer_task(tool, false))
            .then(|| Box::new((params.clone(), arguments.clone(), progress_token.clone())));
        let timeout = reg
            .limits
            .call_timeout_s
            .filter(|t| *t > 0.0 && t.is_finite())
            .map(Duration::from_secs_f64);
        // The upstream request id and epoch, kept even if the timeout drops the execution.
        let ids = CallIds::new(started.into_std());
        let exec = Execution {
            tool,
            name: &name,
            params,
            arguments,
            progress_token,
            ids: &ids,
            trace: trace.as_deref(),
        };
        let mut ended = execute(ctx, exec, &cancel, timeout).await;
        if let Some(again) = again {
            if matches!(&ended, Ended::Error(code, ..) if *code == crate::mcp::tasks::EXTENSION_NOT_DECLARED)
            {
                let (mut params, arguments, progress_token) = *again;
                let modern =
                    crate::mcp::tasks::ask_task(&mut params, max_ttl, ctx.session.is_none());
                task_call = Some(Box::new(TaskCall {
                    modern,
                    progress: progress_token.clone(),
                }));
                let exec = Execution {
                    tool,
                    name: &name,
                    params,
                    arguments,
                    progress_token,
                    ids: &ids,
                    trace: trace.as_deref(),
                };
                ended = Box::pin(execute(ctx, exec, &cancel, timeout)).await;
            }
        }
        let mut reason = None;
        if let Ended::Raw(raw, Outcome::Ok) = &ended {
            // Scanned only where a task may be the answer (not a `taskSupport`-less tool's
            // result: most calls).
            let created = if crate::mcp::tasks::may_answer_task(tool, asks_task) {
                tool.upstream()
                    .zip(ids.epoch())
                    .zip(crate::mcp::tasks::create_task_result(raw.get()))
            } else {
                None
            };
            if let Some(((upstream, epoch), task)) = created {
                let made = TaskMade {
                    name: &name,
                    upstream,
                    epoch,
                    task,
                    for_client: asks_task,
                    modern: task_call.as_ref().and_then(|t| t.modern),
                    progress: task_call.and_then(|t| t.progress).zip(ids.request_id()),
                };
                (ended, reason) = Box::pin(task_created(ctx, made, &cancel)).await;
            }
        }
        if asks_task && reason.is_none() {
            // Asked for a task and answered at once by a 2026-07-28 upstream: the client
            // gets a task that ended with that answer.
            if let (Ended::Raw(raw, _), Some(upstream), Some(epoch)) =
                (&ended, tool.upstream(), ids.epoch())
            {
                if crate::mcp::tasks::modern_upstream(&ctx.hub, upstream) {
                    let result = serde_json::from_str(raw.get()).unwrap_or(Value::Null);
                    (ended, reason) =
                        Box::pin(ended_at_once(ctx, &name, upstream, epoch, result)).await;
                }
            }
        }
        let summary = Summary {
            tool: Some(&name),
            granted: true,
            upstream: tool.upstream(),
            digest: Some(digest.as_str()),
            arguments: recorded,
            reason,
            ids: Some(&ids),
            ended,
            trace,
            revision,
        };
        let reply = finish(ctx, started, id, summary).await;
        // The slot is given back once the record is written, as `max_concurrent` counts it.
        drop(admission);
        reply
    }
}

/// The SERVER span of a call (tracing on): its parent from `_meta`, else the HTTP header.
/// Out of line and cold: the call's own future does not carry its state.
#[cold]
fn server_span(t: &Telemetry, ctx: &RequestCtx, id: &Value, call: &ToolCall) -> Box<CallTrace> {
    let reg = &ctx.registration;
    let mut inbound = crate::telemetry::Inbound::default()
        .with_meta(&call.params)
        .with_headers(ctx.trace_headers.as_deref());
    // The client's free-text trace values are exported (tracestate) and sent upstream: one
    // holding the caller's token is dropped, like any such `_meta` entry.
    for v in [
        &mut inbound.meta_state,
        &mut inbound.meta_baggage,
        &mut inbound.header_state,
        &mut inbound.header_baggage,
    ] {
        if v.is_some_and(|s| reg.token_in(&Value::from(s))) {
            *v = None;
        }
    }
    // `capture_tool_io`: the arguments as the audit would keep them (`redact_keys`), never
    // when they carry the token.
    let keys = &ctx.hub.config().audit.redact_keys;
    let redacted;
    let arguments = match t.captures_tool_io() && !reg.token_in(&call.arguments) {
        false => None,
        true if keys.is_empty() => Some(&call.arguments),
        true => {
            redacted = redact(&call.arguments, keys);
            Some(&redacted)
        }
    };
    t.server_span(
        inbound,
        &crate::telemetry::CallAbout {
            tool: &call.name,
            request_id: id,
            protocol_version: ctx.session.as_ref().and_then(|s| s.protocol_version()),
            session_id: ctx.session_id(),
            agent_id: &reg.agent_id,
            registration_id: &reg.id,
            transport: ctx.transport.as_str(),
            arguments,
        },
    )
}

/// A call refused by [`parse`] or [`admit`], through [`finish`].
/// What a call that asks for a task (its client, or the gateway for a `required` tool) keeps
/// for it until the upstream answers.
struct TaskCall {
    /// A stateless client that declared the 2026-07-28 tasks extension (the capabilities it
    /// declared).
    modern: Option<u8>,
    /// The client's progress token: routable until the task ends.
    progress: Option<Value>,
}

/// A task an upstream created for a call.
struct TaskMade<'a> {
    name: &'a str,
    upstream: &'a str,
    epoch: u64,
    /// The task (a 2025-11-25 `Task` object), and whether its upstream answered in the
    /// 2026-07-28 form.
    task: (Value, bool),
    /// The client asked for it (`params.task`): it gets the task; else the call waits for
    /// the task's end and gets its result.
    for_client: bool,
    /// A stateless client that declared the 2026-07-28 tasks extension: it gets the task in
    /// that form (the capabilities it declared, `ClientCapability::bits_of`).
    modern: Option<u8>,
    /// The client's progress token and the call's upstream request id.
    progress: Option<(Value, u64)>,
}

/// An upstream answered a call with a `CreateTaskResult`: the task is the gateway's now
/// (`mcp::tasks::created`). A client that asked for it gets it under the gateway's id; one
/// that did not gets the task's result on this call (`mcp::tasks::run_for_call`).
async fn task_created(
    ctx: &RequestCtx,
    made: TaskMade<'_>,
    cancel: &CancellationToken,
) -> (Ended, Option<Cow<'static, str>>) {
    use crate::mcp::tasks::NotCreated;
    let internal = !made.for_client && made.modern.is_none();
    let created = crate::mcp::tasks::created(
        ctx,
        made.name,
        made.upstream,
        made.epoch,
        made.task,
        internal,
        made.modern,
        made.progress,
    )
    .await;
    match created {
        Ok(task) if internal => {
            let why = format!("run as task {} for a client without tasks", task.id);
            let ended = match crate::mcp::tasks::run_for_call(ctx, &task, cancel).await {
                None => Ended::Cancelled,
                Some(f) => match &*f {
                    Ok(result) => {
                        let o = if result.get("isError") == Some(&Value::Bool(true)) {
                            Outcome::ToolError
                        } else {
                            Outcome::Ok
                        };
                        Ended::Result(result.clone(), o)
                    }
                    Err(e) => Ended::Error(
                        e.get("code")
                            .and_then(Value::as_i64)
                            .unwrap_or(jsonrpc::INTERNAL_ERROR),
                        e.get("message")
                            .and_then(Value::as_str)
                            .unwrap_or("task failed")
                            .to_string(),
                        Outcome::ToolError,
                    ),
                },
            };
            (ended, Some(why.into()))
        }
        Ok(task) => {
            let why = format!("task created: {}", task.id);
            let result = match made.modern {
                Some(_) => crate::mcp::tasks::modern_created(&task),
                None => json!({"task": task.view()}),
            };
            (Ended::Result(result, Outcome::Ok), Some(why.into()))
        }
        Err(NotCreated::Full(n)) => {
            let why = format!("limit tasks.max_live_per_registration ({n}) reached: the task was cancelled upstream");
            (
                Ended::Error(jsonrpc::INTERNAL_ERROR, why.clone(), Outcome::Denied),
                Some(why.into()),
            )
        }
        Err(NotCreated::Released) => (Ended::Cancelled, None),
    }
}

/// A task that ended at once ([`crate::mcp::tasks::ended_at_once`]), for the client that asked.
async fn ended_at_once(
    ctx: &RequestCtx,
    name: &str,
    upstream: &str,
    epoch: u64,
    result: Value,
) -> (Ended, Option<Cow<'static, str>>) {
    match crate::mcp::tasks::ended_at_once(ctx, name, upstream, epoch, result).await {
        Ok(task) => {
            let why = format!("task created: {} (answered at once upstream)", task.id);
            (
                Ended::Result(json!({"task": task.view()}), Outcome::Ok),
                Some(why.into()),
            )
        }
        Err(crate::mcp::tasks::NotCreated::Full(n)) => {
            let why = format!("limit tasks.max_live_per_registration ({n}) reached");
            (
                Ended::Error(jsonrpc::INTERNAL_ERROR, why.clone(), Outcome::Denied),
                Some(why.into()),
            )
        }
        Err(crate::mcp::tasks::NotCreated::Released) => (Ended::Cancelled, None),
    }
}

fn refuse<'c>(
    ctx: &'c RequestCtx,
    started: Instant,
    id: Value,
    r: Refused,
    upstream: Option<&str>,
    asked: Option<(&str, Option<Value>)>,
    trace: Option<Box<CallTrace>>,
) -> impl std::future::Future<Output = Option<Reply>> + Send + 'c {
    let (digest, arguments) = match asked {
        Some((d, a)) => (Some(d), a),
        None => (None, None),
    };
    finish(
        ctx,
        started,
        id,
        Summary {
            tool: r.tool.as_deref(),
            granted: r
                .tool
                .as_deref()
                .is_some_and(|t| ctx.registration.tools.get(t).is_some()),
            upstream,
            digest,
            arguments,
            reason: Some(r.reason),
            ids: None,
            ended: r.ended,
            trace,
            revision: ctx.hub.fence().decided_at(),
        },
    )
}

/// What [`execute`] runs: the granted tool and the call's parts, moved in.
pub(crate) struct Execution<'a> {
    pub tool: &'a GrantedTool,
    pub name: &'a str,
    pub params: Map<String, Value>,
    pub arguments: Value,
    pub progress_token: Option<Value>,
    /// Where an upstream call reports its request id and epoch (kept on timeout).
    pub ids: &'a CallIds,
    /// The call's SERVER span, parent of the upstream request's CLIENT span.
    pub trace: Option<&'a CallTrace>,
}

/// Step 3: runs an admitted call, in-process or upstream, under the registration's timeout
/// and the call's cancellation. A call whose cancellation raced with its end counts as
/// cancelled.
///
/// Not an `async fn`: its future would keep `exec` in its state beside the backend's future
/// that `exec` is moved into (ARCHITECTURE.md, Decisions: request futures).
pub(crate) fn execute<'a>(
    ctx: &'a RequestCtx,
    exec: Execution<'a>,
    cancel: &'a CancellationToken,
    timeout: Option<Duration>,
) -> impl std::future::Future<Output = Ended> + Send + 'a {
    // An upstream call handles its own cancellation (it must send `notifications/cancelled`
    // upstream before the call ends), so only in-process calls are cut off here.
    // Without a registration timeout an upstream call is just awaited: a disabled `select!`
    // branch still builds its future (the token's waiter), and this is every proxied call.
    let is_upstream = matches!(exec.tool.backend, Backend::Upstream { .. });
    // A cluster node that fences cancels its calls in flight (`fence`; `None` outside a
    // cluster).
    let fence = ctx.hub.fence().token();
    let run = run_backend(ctx, exec, cancel);
    // Combinators, not an `async` block: awaiting `run` inside one would move it into a
    // second slot of the block's state (this future is inside every call's).
    let ran = if is_upstream && timeout.is_none() && fence.is_none() {
        futures::future::Either::Left(run)
    } else {
        // An in-process tool, a registration timeout, a cluster's fence: the select is boxed,
        // so its state is not in every call's future.
        futures::future::Either::Right(Box::pin(async move {
            tokio::pin!(run);
            tokio::select! {
                biased;
                _ = cancel.cancelled(), if !is_upstream => Ended::Cancelled,
                e = &mut run => e,
                _ = fenced(fence.as_ref()) => {
                    // The call is cancelled as a client's cancel would be (an upstream call
                    // tells its upstream first), and ends as its backend ends it.
                    cancel.cancel();
                    run.await
                }
                _ = sleep_opt(timeout) => Ended::TimedOut(timeout.map(|d| d.as_secs_f64()).unwrap_or_default()),
            }
        }))
    };
    futures::FutureExt::map(ran, move |ended| {
        if cancel.is_cancelled() {
            Ended::Cancelled
        } else {
            ended
        }
    })
}

/// The tool itself: an in-process tool (a panic is caught: `protocol_error`) or the upstream.
///
/// Not an `async fn`: its future would hold `exec` twice (the argument and the local it is
/// moved into: 568 bytes), and it is moved into every call's future.
#[allow(clippy::manual_async_fn)] // an async fn would hold `exec` twice (above)
fn run_backend<'a>(
    ctx: &'a RequestCtx,
    exec: Execution<'a>,
    cancel: &'a CancellationToken,
) -> impl std::future::Future<Output = Ended> + Send + 'a {
    async move {
        let reg = &ctx.registration;
        let name = exec.name;
        match &exec.tool.backend {
            Backend::InProcess(t) => {
                let tctx = ToolContext {
                    registration_id: reg.id.as_str().into(),
                    agent_id: reg.agent_id.clone(),
                    label: reg.label.as_deref().map(Arc::from),
                    session_id: ctx.session_id().map(Arc::from),
                    cancel: cancel.clone(),
                    progress_token: exec.progress_token,
                    notify: ctx.notify.clone(),
                };
                match std::panic::AssertUnwindSafe(t.call(exec.arguments, tctx))
                    .catch_unwind()
                    .await
                {
                    Ok(Ok(r)) => {
                        let o = if r.is_error() {
                            Outcome::ToolError
                        } else {
                            Outcome::Ok
                        };
                        Ended::Result(r.0, o)
                    }
                    Ok(Err(e)) => Ended::Result(ToolResult::error(e.0).0, Outcome::ToolError),
                    Err(_) => Ended::Error(
                        jsonrpc::INTERNAL_ERROR,
                        format!("tool {name} failed internally"),
                        Outcome::ProtocolError,
                    ),
                }
            }
            Backend::Upstream {
                upstream,
                tool: upstream_tool,
                ..
            } => {
                let fwd = Box::pin(ctx.hub.pool().forward(ForwardCall {
                    registration: reg,
                    session: ctx.session.clone(),
                    upstream,
                    tool: upstream_tool,
                    // Moved, not copied: nothing reads them after the call is under way.
                    params: exec.params,
                    arguments: exec.arguments,
                    cancel,
                    notify: ctx.notify.clone(),
                    ids: Some(exec.ids),
                    trace: exec.trace,
                }))
                .await;
                let ended = upstream_ended(name, fwd.outcome);
                if let Some(span) = fwd.client_span {
                    let error_type = match &ended {
                        Ended::Raw(_, Outcome::Ok) | Ended::Result(_, Outcome::Ok) => None,
                        Ended::Error(code, ..) => Some(crate::telemetry::code_error_type(*code)),
                        Ended::Result(_, Outcome::Timeout) => Some("timeout"),
                        Ended::Cancelled => Some("cancelled"),
                        _ => Some("tool_error"),
                    };
                    span.end(fwd.upstream_request_id, error_type, None);
                }
                ended
            }
        }
    }
}

/// What a call to a tool whose definition changed upstream answers (`on_tool_change =
/// "refuse"`).
fn changed_tool_refusal(name: &str) -> String {
    format!(
        "the definition of tool {name} changed upstream since this registration was made; calls to it are refused (on_tool_change = \"refuse\")"
    )
}

fn upstream_ended(name: &str, outcome: ForwardOutcome) -> Ended {
    use ForwardOutcome as F;
    match outcome {
        // Found when its connection was checked (`upstream::Pool::verify`), after admission:
        // answered as admission answers it now.
        F::Failed(ForwardError::ToolChanged { removed: true, .. }) => Ended::Error(
            jsonrpc::INVALID_PARAMS,
            format!("Unknown tool: {name} (its upstream no longer offers it)"),
            Outcome::Denied,
        ),
        F::Failed(ForwardError::ToolChanged { removed: false, .. }) => {
            Ended::Limited(changed_tool_refusal(name))
        }
        F::Result(raw) => {
            let o = if is_error(&raw) {
                Outcome::ToolError
            } else {
                Outcome::Ok
            };
            Ended::Raw(raw, o)
        }
        F::RpcError { code, message } => Ended::Error(code, message, Outcome::ToolError),
        F::Failed(why @ ForwardError::Busy { .. }) => {
            tracing::info!(tool = name, error = %why, "call refused: the registration holds its share of the upstream");
            Ended::Error(jsonrpc::BUSY, why.to_string(), Outcome::Denied)
        }
        F::Failed(why) => {
            tracing::warn!(tool = name, error = %why, side = ?why.side(), "upstream call failed");
            Ended::Error(
                jsonrpc::INTERNAL_ERROR,
                format!("upstream for tool {name} failed: {why}"),
                Outcome::UpstreamFailed,
            )
        }
        F::Timeout(d) => Ended::Result(
            ToolResult::error(format!(
                "tool call timed out after {} s (upstream call_timeout)",
                d.as_secs_f64()
            ))
            .0,
            Outcome::Timeout,
        ),
        F::Cancelled => Ended::Cancelled,
    }
}

/// Whether a tool result says `"isError": true`, read from its text (nothing else of it is
/// parsed; a result that is not an object is not an error result).
fn is_error(result: &RawResult) -> bool {
    #[derive(serde::Deserialize)]
    struct Flags<'a> {
        #[serde(rename = "isError", borrow)]
        is_error: Option<&'a serde_json::value::RawValue>,
    }
    // A derived struct would also read an array (`[true]`) by position: objects only.
    let text = result.get();
    if !text.trim_start().starts_with('{') || !may_say_is_error(text) {
        return false;
    }
    serde_json::from_str::<Flags>(text)
        .ok()
        .and_then(|f| f.is_error)
        .is_some_and(|v| v.get() == "true")
}

/// Whether `text` could hold a key `isError` whose value is `true`: a key written as
/// `isError"` then `:` then `t` (whitespace allowed), or a `\u` escape, which could spell the
/// key (no other escape yields a letter). Inside a string a quote is escaped, so a string's
/// `isError\": true` is not such a key. When it is false the top-level flag cannot be true,
/// which spares the parse for the usual `"isError": false` or no flag at all.
///
/// One vectorised pass (`memchr2`) finds every backslash and `E`: a `str` search per byte
/// sought costs a searcher and a scan each, more than the whole check of a small result.
fn may_say_is_error(text: &str) -> bool {
    const KEY: &[u8] = b"isError\"";
    let bytes = text.as_bytes();
    // A backslash before this index was escaped by the one before it: it starts no escape.
    let mut escapes_from = 0;
    for at in memchr::memchr2_iter(b'\\', b'E', bytes) {
        if bytes[at] == b'\\' {
            if at < escapes_from {
                continue;
            }
            match bytes.get(at + 1) {
                Some(b'u') => return true,
                Some(b'\\') => escapes_from = at + 2,
                _ => {}
            }
            continue;
        }
        let Some(start) = at.checked_sub(2) else {
            continue;
        };
        if bytes[start..].starts_with(KEY) {
            let rest = bytes[start + KEY.len()..].trim_ascii_start();
            if rest
                .strip_prefix(b":")
                .is_some_and(|v| v.trim_ascii_start().starts_with(b"t"))
            {
                return true;
            }
        }
    }
    false
}

/// The fence's cancellation, or never (outside a cluster).
async fn fenced(fence: Option<&CancellationToken>) {
    match fence {
        Some(f) => f.cancelled().await,
        None => std::future::pending().await,
    }
}

async fn sleep_opt(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// What a call's end makes of its record and its reply (before the audit write).
#[derive(Debug)]
pub(crate) struct Conclusion {
    pub outcome: Outcome,
    pub reason: Option<Cow<'static, str>>,
    pub error_code: Option<i64>,
    /// `None`: nothing is sent (cancelled).
    pub reply: Option<Reply>,
    /// Sent even if the record cannot be written (the refusal says the audit is down).
    pub unconditional: bool,
}

/// How a call ended, as recorded and answered: pure, the half of [`finish`] that decides.
/// `reason` is the step's own; `released`: whether the registration was released (a
/// cancelled call's reason).
pub(crate) fn conclude(
    id: &Value,
    ended: Ended,
    reason: Option<Cow<'static, str>>,
    released: bool,
) -> Conclusion {
    let plain = |outcome, reply| Conclusion {
        outcome,
        reason: None,
        error_code: None,
        reply: Some(reply),
        unconditional: false,
    };
    let mut c = match ended {
        Ended::Cancelled => Conclusion {
            outcome: Outcome::Cancelled,
            reason: Some(if released {
                "registration released".into()
            } else {
                "cancelled by client or session end".into()
            }),
            error_code: None,
            reply: None,
            unconditional: false,
        },
        Ended::Result(result, outcome) => {
            plain(outcome, jsonrpc::success(id.clone(), result).into())
        }
        Ended::Raw(result, outcome) => plain(
            outcome,
            Reply::Raw {
                id: id.clone(),
                result,
            },
        ),
        Ended::Limited(why) => {
            let reply = jsonrpc::success(id.clone(), ToolResult::error(why.clone()).0).into();
            let mut c = plain(Outcome::Denied, reply);
            c.reason = Some(why.into());
            c
        }
        Ended::TimedOut(secs) => {
            let text = format!("tool call timed out after {secs} s (limit call_timeout_s)");
            let reply = jsonrpc::success(id.clone(), ToolResult::error(text).0).into();
            let mut c = plain(Outcome::Timeout, reply);
            c.reason = Some(format!("call_timeout_s ({secs}) elapsed").into());
            c
        }
        Ended::AuditDown => {
            let reply = jsonrpc::error_response(
                Some(id.clone()),
                jsonrpc::INTERNAL_ERROR,
                "audit log unavailable: tool calls are refused until it can be written",
                None,
            )
            .into();
            let mut c = plain(Outcome::Denied, reply);
            c.unconditional = true;
            c
        }
        Ended::Error(code, message, outcome) => {
            let reply = jsonrpc::error_response(Some(id.clone()), code, &message, None).into();
            let mut c = plain(outcome, reply);
            c.error_code = Some(code);
            if outcome == Outcome::Denied {
                c.reason = Some(message.into());
            }
            c
        }
    };
    // The step's own reason comes first.
    if reason.is_some() {
        c.reason = reason;
    }
    c
}

/// Step 4, for every outcome: builds the call's record once from `summary`, observes the
/// call's metric and writes the record; then the reply (`None`: the call was cancelled, or
/// its registration released meanwhile: nothing is sent). A reply whose record could not be
/// written is withheld (an error says so).
///
/// Not an `async fn`: everything but the wait for the audit write is done when it is called,
/// so its future holds the reply, not the record (a 1.5 KB state inside every call's future
/// otherwise, copied with it).
pub(crate) fn finish<'c>(
    ctx: &'c RequestCtx,
    started: Instant,
    id: Value,
    summary: Summary<'_>,
) -> impl std::future::Future<Output = Option<Reply>> + Send + 'c {
    // One clock read for the record and the metric.
    let elapsed = started.elapsed();
    let reg = &ctx.registration;
    let c = conclude(&id, summary.ended, summary.reason, reg.is_released());
    let mut rec = reg.audit_record("governed_mcp_call");
    rec.session_id = ctx.session_id().map(Cow::Borrowed);
    rec.transport = Some(Cow::Borrowed(ctx.transport.as_str()));
    rec.tool = summary.tool.map(Cow::Borrowed);
    rec.upstream = summary.upstream.map(Cow::Borrowed);
    rec.args_digest = summary.digest.map(Cow::Borrowed);
    rec.arguments = summary.arguments;
    rec.store_revision = summary.revision;
    if let Some(ids) = summary.ids {
        rec.upstream_request_id = ids.request_id();
        rec.epoch = ids.epoch();
    }
    let error_type = error_type_of(&c);
    if let Some(t) = summary.trace {
        end_server_span(t, reg, &mut rec, &c, error_type, summary.upstream);
    }
    rec.set_outcome(c.outcome);
    rec.error_code = c.error_code;
    rec.reason = c.reason;
    rec.duration_ms = Some(elapsed.as_secs_f64() * 1000.0);
    let tool_label = match summary.tool {
        Some(t) if summary.granted => t,
        Some(_) => "_unknown",
        None => "_none",
    };
    // The upstream's answer, when there was one (`mcp_client_operation_duration_seconds`).
    let client = summary
        .ids
        .and_then(|ids| ids.answered(elapsed))
        .map(|(d, stdio)| (if stdio { "pipe" } else { "tcp" }, d));
    ctx.hub
        .metrics()
        .observe_call(tool_label, c.outcome.as_str(), error_type, elapsed, client);
    let written = ctx.hub.audit().record(rec);
    let (reply, unconditional) = (c.reply, c.unconditional);
    async move {
        if let Err(e) = written.await {
            if !unconditional {
                tracing::error!(error = %e, "audit record not written; reply withheld");
                return reply.map(|_| {
                    jsonrpc::error_response(
                        Some(id),
                        jsonrpc::INTERNAL_ERROR,
                        "audit log unavailable: the call's result is withheld",
                        None,
                    )
                    .into()
                });
            }
        }
        // A call cancelled while its record was being written is not answered.
        if ctx.registration.is_released() {
            return None;
        }
        reply
    }
}

/// `error.type` of a call's end (the conventions' values; a closed set: a metric label):
/// the JSON-RPC code of an error reply, `tool_error` for a result with `isError`, `timeout`,
/// `cancelled`; `None` for success.
pub(crate) fn error_type_of(c: &Conclusion) -> Option<&'static str> {
    if let Some(code) = c.error_code {
        return Some(crate::telemetry::code_error_type(code));
    }
    match c.outcome {
        Outcome::Ok => None,
        Outcome::ToolError => Some("tool_error"),
        Outcome::Timeout => Some("timeout"),
        Outcome::Cancelled => Some("cancelled"),
        // The audit-down refusal is an error reply; other denials are `isError` results.
        Outcome::Denied if c.unconditional => Some("-32603"),
        Outcome::Denied => Some("tool_error"),
        Outcome::ProtocolError | Outcome::UpstreamFailed => Some("_OTHER"),
    }
}

/// Ends a call's SERVER span from its conclusion; its trace id goes into the record.
#[cold]
fn end_server_span(
    mut t: Box<CallTrace>,
    reg: &RegistrationState,
    rec: &mut crate::audit::Record<'_>,
    c: &Conclusion,
    error_type: Option<&'static str>,
    upstream: Option<&str>,
) {
    rec.rare_mut().trace_id = Some(Cow::Owned(t.take_trace_id()));
    let mut more = vec![opentelemetry::KeyValue::new(
        "gatehouse.outcome",
        c.outcome.as_str(),
    )];
    if let Some(u) = upstream {
        more.push(opentelemetry::KeyValue::new(
            "gatehouse.upstream.name",
            u.to_string(),
        ));
    }
    if t.captures_tool_io() {
        // The reply as sent (`capture_tool_io`), cut; the result only, never an error's data.
        let result = match &c.reply {
            Some(Reply::Raw { result, .. }) => Some(result.get().to_string()),
            Some(Reply::Value(v)) => v.get("result").map(Value::to_string),
            None => None,
        };
        if let Some(r) = result.filter(|r| !reg.token_in(&Value::from(r.as_str()))) {
            more.push(opentelemetry::KeyValue::new(
                "gen_ai.tool.call.result",
                crate::telemetry::bounded_text(r),
            ));
        }
    }
    t.end(error_type, c.reason.as_deref(), more);
}

/// A copy of `args` with the values of `keys` (at any depth) replaced by `"[redacted]"`.
pub fn redact(args: &Value, keys: &[String]) -> Value {
    match args {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    if keys.iter().any(|r| r == k) {
                        (k.clone(), json!("[redacted]"))
                    } else {
                        (k.clone(), redact(v, keys))
                    }
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|v| redact(v, keys)).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration(limits: crate::registry::Limits) -> RegistrationState {
        let tool = crate::tools::InProcessTool::new("echo", "echo", json!({}), |_, _| async {
            Ok(ToolResult::text("hi"))
        });
        let tools = crate::tools::ToolSet::new(vec![GrantedTool {
            name: "echo".into(),
            descriptor: Arc::new(json!({"name": "echo"})),
            backend: Backend::InProcess(tool),
        }]);
        let spec = crate::registry::RegistrationSpec::new("a").limits(limits);
        RegistrationState::new("r".into(), "t", &spec, tools)
    }

    fn code_and_outcome(r: &Refused) -> (i64, Outcome) {
        match &r.ended {
            Ended::Error(code, _, o) => (*code, *o),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parse_reads_the_params_once_and_refuses_what_is_malformed() {
        let c = parse(Some(json!({"name": "echo", "arguments": {"a": 1},
            "_meta": {"progressToken": 7}, "x": true})))
        .unwrap();
        assert_eq!(c.name, "echo");
        assert_eq!(c.arguments, json!({"a": 1}));
        assert_eq!(c.progress_token, Some(json!(7)));
        assert_eq!(
            c.params["arguments"],
            Value::Null,
            "taken out, its place kept"
        );
        assert_eq!(c.params["x"], true);
        let c = parse(Some(json!({"name": "echo", "arguments": null}))).unwrap();
        assert_eq!(c.arguments, json!({}));
        let long = "x".repeat(MAX_TOOL_NAME_BYTES + 1);
        for (params, tool, reason, outcome) in [
            (
                None,
                None,
                "params must be an object with a name",
                Outcome::ProtocolError,
            ),
            (
                Some(json!([1])),
                None,
                "params must be an object with a name",
                Outcome::ProtocolError,
            ),
            (
                Some(json!({"name": 3})),
                None,
                "missing tool name",
                Outcome::ProtocolError,
            ),
            (
                Some(json!({"name": "echo", "arguments": [1]})),
                Some("echo"),
                "arguments must be an object",
                Outcome::ProtocolError,
            ),
            (
                Some(json!({"name": long})),
                Some(long.as_str()),
                "tool name too long",
                Outcome::Denied,
            ),
        ] {
            let r = parse(params).unwrap_err();
            assert_eq!(r.tool.as_deref(), tool);
            assert!(r.reason.starts_with(reason), "{}", r.reason);
            assert_eq!(code_and_outcome(&r), (jsonrpc::INVALID_PARAMS, outcome));
        }
    }

    #[tokio::test]
    async fn admission_refuses_in_order_and_gives_back_its_slot_when_dropped() {
        let store = crate::store::memory::MemoryStore::default();
        let budget = Budget {
            store: &store,
            block: 64,
        };
        let admit = |reg, name, healthy| admit(budget, reg, name, healthy);
        let reg = registration(crate::registry::Limits {
            max_calls: Some(2),
            max_concurrent: Some(1),
            call_timeout_s: None,
        });
        let (_, r) = admit(&reg, "nope", true).await.unwrap_err();
        assert_eq!(
            code_and_outcome(&r),
            (jsonrpc::INVALID_PARAMS, Outcome::Denied)
        );
        let (tool, r) = admit(&reg, "echo", false).await.unwrap_err();
        assert!(tool.is_some() && matches!(r.ended, Ended::AuditDown));
        assert_eq!(reg.budget().started(), 0, "refused before the limits");
        let (_, held) = admit(&reg, "echo", true).await.unwrap();
        assert_eq!(reg.budget().in_flight(), 1);
        let (_, r) = admit(&reg, "echo", true).await.unwrap_err();
        assert!(
            matches!(&r.ended, Ended::Limited(w) if w.contains("max_concurrent")),
            "{r:?}"
        );
        drop(held);
        assert_eq!(reg.budget().in_flight(), 0, "given back");
        let (_, r) = admit(&reg, "echo", true).await.unwrap_err();
        assert!(
            matches!(&r.ended, Ended::Limited(w) if w.contains("max_calls (2)")),
            "{r:?}"
        );
        assert_eq!(reg.budget().started(), 2);
        assert_eq!(reg.budget().in_flight(), 0);
    }

    #[test]
    fn every_ending_concludes_into_one_outcome_reason_and_reply() {
        let id = json!(1);
        let c = conclude(
            &id,
            Ended::AuditDown,
            Some("audit log unavailable".into()),
            false,
        );
        assert_eq!(
            (c.outcome, c.error_code, c.unconditional),
            (Outcome::Denied, None, true)
        );
        assert_eq!(c.reason.as_deref(), Some("audit log unavailable"));
        let reply = c.reply.unwrap().into_value();
        assert_eq!(reply["error"]["code"], jsonrpc::INTERNAL_ERROR);
        for (released, why) in [
            (false, "cancelled by client or session end"),
            (true, "registration released"),
        ] {
            let c = conclude(&id, Ended::Cancelled, None, released);
            assert_eq!(
                (c.outcome, c.reason.as_deref(), c.reply.is_none()),
                (Outcome::Cancelled, Some(why), true)
            );
        }
        let c = conclude(&id, Ended::Limited("limit x".into()), None, false);
        assert_eq!(
            (c.outcome, c.reason.as_deref()),
            (Outcome::Denied, Some("limit x"))
        );
        assert_eq!(c.reply.unwrap().into_value()["result"]["isError"], true);
        let c = conclude(&id, Ended::TimedOut(0.5), None, false);
        assert_eq!(
            (c.outcome, c.reason.as_deref()),
            (Outcome::Timeout, Some("call_timeout_s (0.5) elapsed"))
        );
        let c = conclude(
            &id,
            Ended::Error(-32030, "busy".into(), Outcome::Denied),
            None,
            false,
        );
        assert_eq!(
            (c.error_code, c.reason.as_deref()),
            (Some(-32030), Some("busy"))
        );
        let c = conclude(
            &id,
            Ended::Error(-32602, "Unknown tool: x".into(), Outcome::Denied),
            Some("unknown tool".into()),
            false,
        );
        assert_eq!(
            c.reason.as_deref(),
            Some("unknown tool"),
            "the step's reason first"
        );
        let c = conclude(
            &id,
            Ended::Result(json!({"content": []}), Outcome::Ok),
            None,
            false,
        );
        assert_eq!(
            (c.outcome, c.reason, c.error_code, c.unconditional),
            (Outcome::Ok, None, None, false)
        );
    }

    #[test]
    fn is_error_is_read_from_the_text() {
        let raw = |t: &str| serde_json::value::RawValue::from_string(t.to_string()).unwrap();
        assert!(is_error(&raw(r#"{"content":[],"isError":true}"#)));
        assert!(is_error(&raw(
            r#"{"isError" :  true , "x": {"isError": false}}"#
        )));
        assert!(!is_error(&raw(r#"{"content":[],"isError":false}"#)));
        assert!(!is_error(&raw(r#"{"content":[{"isError":true}]}"#)));
        assert!(!is_error(&raw(r#"{"isError":"true"}"#)));
        assert!(!is_error(&raw(r#"[true]"#)));
        assert!(!is_error(&raw(r#"{"content":[],"isError" : false}"#)));
        assert!(is_error(&raw(r#"{"a":{"isError":false},"isError":
 true}"#)));
        assert!(!is_error(&raw(
            r#"{"content":[{"type":"text","text":"isError\": true"}]}"#
        )));
        // The key spelled with escapes is the same key.
        assert!(is_error(&raw(r#"{"\u0069sError":true}"#)));
        assert!(!is_error(&raw(
            r#"{"content":[{"type":"text","text":"a\nb"}]}"#
        )));
        // An escaped backslash before a `u` is no `\u` escape; one after it is.
        assert!(!is_error(&raw(r#"{"text":"a\\u","isError":false}"#)));
        assert!(is_error(&raw(r#"{"text":"a\\\u0041","isError":true}"#)));
        assert!(is_error(&raw(r#"{"E":1,"isError":true}"#)));
        assert!(!is_error(&raw(r#"{"text":"Error","isError" : false}"#)));
    }

    /// The pre-check: true wherever the flag could be `true` (the parse then decides).
    #[test]
    fn may_say_is_error_reads_bytes() {
        for (t, maybe) in [
            (r#"{"content":[],"isError":true}"#, true),
            (r#"{"isError" :  true}"#, true),
            (r#"{"isError":false}"#, false),
            (r#"isError"#, false),
            (r#"E"#, false),
            (r#"sE"#, false),
            (r#"{"isError":"#, false),
            (r#"{"a\\":1,"isError":	true}"#, true),
            (r#"{"a\\u":1}"#, false),
            (r#"{"a\\\u0069":1}"#, true),
            (r#"\\"#, false),
            (r#"\"#, false),
            (r#"{"é\é":1}"#, false),
            (r#"{"EisError":true}"#, true),
            (r#"{"isErrorisError":true}"#, true),
            (r#"{"isErrorX":true}"#, false),
        ] {
            assert_eq!(super::may_say_is_error(t), maybe, "{t}");
        }
    }
}
