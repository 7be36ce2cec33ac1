//! MCP tasks on the wire, 2025-11-25 form (handshake-era sessions: legacy SSE and Streamable
//! HTTP): what a `tools/call` with `params.task` becomes once its upstream answered with a
//! `CreateTaskResult` ([`created`]), the client's `tasks/get|result|cancel|list` ([`handle`]),
//! each task's background poller, and the ends a task meets besides its own (release, TTL,
//! a restarted upstream). The table is `crate::tasks`.
//!
//! - A client only ever sees the gateway's ids; the upstream's go upstream only, on the
//!   connection (epoch) the task was created on.
//! - `tasks/list` is answered from the table, for the asking registration only; it is never
//!   forwarded (an upstream's list shows every caller of a shared connection).
//! - A client's poll within the task's poll interval of the last upstream poll is answered
//!   from the table.
//! - Every task is audited `task_created` once and `task_outcome` exactly once (the task's
//!   settle latch): whoever sees the end first (a client's poll or `tasks/result`, the poller,
//!   a cancel, release, the TTL) writes it.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use crate::hub::Hub;
use crate::mcp::jsonrpc::{self, RpcError};
use crate::mcp::request::RequestCtx;
use crate::registry::RegistrationState;
use crate::tasks::{Final, NewTask, Status, Task, TaskOutcome, RELATED_TASK};

/// The methods this module answers.
pub const METHODS: &[&str] = crate::mcp::TASK_METHODS;

/// The 2026-07-28 tasks extension's name, and its error when a request did not declare it.
pub const EXTENSION: &str = crate::upstream::TASKS_EXTENSION;
pub const EXTENSION_NOT_DECLARED: i64 = -32021;

/// A 2026-07-28 request's client capabilities, in its `_meta`.
const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// The poller never asks an upstream about one task more often than this.
const POLL_FLOOR: Duration = Duration::from_millis(100);

/// How long an upstream `tasks/result` still open when its task settled otherwise is given to
/// answer before it is abandoned.
const SETTLED_ASK_GRACE: Duration = Duration::from_secs(2);

/// How long a cancel sent on the gateway's behalf (release, TTL) may take.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

/// The server capability the gateway declares (2025-11-25) when a granted upstream runs tool
/// calls as tasks.
pub fn capability() -> Value {
    json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}})
}

/// Whether an upstream's `tasks` capability says it runs `tools/call` as tasks.
pub fn upstream_runs_tasks(tasks: &Value) -> bool {
    tasks
        .get("requests")
        .and_then(|r| r.get("tools"))
        .and_then(|t| t.get("call"))
        .is_some()
}

/// Prepares a `tools/call`'s params for the upstream: `task` is kept (its TTL cut to the
/// gateway's cap) on a session that can hold tasks, and dropped otherwise (stateless
/// 2026-07-28 requests: `params.task` is to be ignored there). Whether a task was asked.
pub fn prepare_call(params: &mut Map<String, Value>, session: bool, max_ttl: Duration) -> bool {
    if !session {
        params.remove("task");
        return false;
    }
    let Some(task) = params.get_mut("task") else {
        return false;
    };
    let Some(t) = task.as_object_mut() else {
        return false;
    };
    let max = u64::try_from(max_ttl.as_millis()).unwrap_or(u64::MAX);
    let asked = t.get("ttl").and_then(Value::as_u64).unwrap_or(max);
    t.insert("ttl".into(), Value::from(asked.min(max)));
    true
}

/// Whether a granted tool's upstream runs it only as a task (`execution.taskSupport:
/// "required"`, 2025-11-25).
pub fn requires_task(tool: &crate::tools::GrantedTool) -> bool {
    matches!(
        tool.backend,
        crate::tools::Backend::Upstream {
            task_support: crate::tools::TaskSupport::Required,
            ..
        }
    )
}

/// Whether a stateless (2026-07-28) call of an `optional` tool asks for a task: its request
/// declared the tasks extension. Read only for such tools (`params` is not looked at
/// otherwise).
pub fn stateless_asks(
    tool: &crate::tools::GrantedTool,
    params: &Map<String, Value>,
    stateless: bool,
) -> bool {
    stateless
        && matches!(
            tool.backend,
            crate::tools::Backend::Upstream {
                task_support: crate::tools::TaskSupport::Optional,
                ..
            }
        )
        && params
            .get("_meta")
            .and_then(|m| m.get(META_CAPABILITIES))
            .is_some_and(declares_extension)
}

/// Whether an upstream's answer to a call of `tool` may be a `CreateTaskResult`: the call
/// asked for a task (the client or the gateway), or the tool's descriptor says its upstream
/// runs it as a task (`optional`: it may answer one unasked). A tool without `taskSupport`
/// (forbidden) is not answered with a task (2025-11-25), so its result is not scanned.
pub fn may_answer_task(tool: &crate::tools::GrantedTool, asked: bool) -> bool {
    asked
        || matches!(
            tool.backend,
            crate::tools::Backend::Upstream {
                task_support: crate::tools::TaskSupport::Optional
                    | crate::tools::TaskSupport::Required,
                ..
            }
        )
}

/// Asks the upstream for a task on a call whose client did not (`params.task`, the TTL cap).
/// On a stateless request (`stateless`) that declares the 2026-07-28 tasks extension in its
/// `_meta`, the task is handed to the client in that form: `Some(the client capabilities
/// it declared)` (`ClientCapability::bits_of`). Read only here: a call of a tool that needs
/// a task, never on the ordinary call's path.
pub fn ask_task(params: &mut Map<String, Value>, max_ttl: Duration, stateless: bool) -> Option<u8> {
    let modern = if stateless {
        params
            .get("_meta")
            .and_then(|m| m.get(META_CAPABILITIES))
            .filter(|c| declares_extension(c))
            .map(|c| crate::mcp::ClientCapability::bits_of(Some(c)))
    } else {
        None
    };
    let max = u64::try_from(max_ttl.as_millis()).unwrap_or(u64::MAX);
    params.insert("task".into(), json!({"ttl": max}));
    modern
}

/// Whether a 2026-07-28 request's params declare the tasks extension (in `_meta`'s client
/// capabilities).
pub fn declares_tasks(params: Option<&Value>) -> bool {
    params
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(META_CAPABILITIES))
        .is_some_and(declares_extension)
}

/// Whether client capabilities (a 2026-07-28 request's `_meta`) declare the tasks extension.
fn declares_extension(caps: &Value) -> bool {
    caps.get("extensions")
        .and_then(|e| e.get(EXTENSION))
        .is_some_and(|v| !v.is_null())
}

/// A tool's definition as listed to clients: an upstream's `taskSupport: "required"` is shown
/// `"optional"` (the gateway runs the task itself for a client that calls it plainly).
pub fn listed(descriptor: &mut Value) {
    if let Some(ts) = descriptor
        .get_mut("execution")
        .and_then(|e| e.get_mut("taskSupport"))
    {
        if ts == "required" {
            *ts = Value::String("optional".into());
        }
    }
}

/// A `CreateTaskResult`'s task as a 2025-11-25 `Task` object, if `result` is one, and
/// whether it came in the 2026-07-28 form: a `task` object with a string `taskId` (2025), or
/// `resultType: "task"` with a flat `taskId` (2026); never with `content` (a tool result is
/// never taken for one). Read on upstream tool results that may be one: a substring scan
/// first, parsed only when it may be one.
pub fn create_task_result(result: &str) -> Option<(Value, bool)> {
    // A tool result nearly always starts with its `content` (which no task result has): not
    // even scanned.
    if result.starts_with(r#"{"content":"#) || !result.contains("\"taskId\"") {
        return None;
    }
    let mut v: Value = serde_json::from_str(result).ok()?;
    if v.get("content").is_some() {
        return None;
    }
    if v.get("resultType").and_then(Value::as_str) == Some("task") {
        v.get("taskId")?.as_str()?;
        return Some((from_modern(&v), true));
    }
    let task = v.get_mut("task")?.take();
    task.get("taskId")?.as_str()?;
    Some((task, false))
}

/// The fields a task has alike in both forms.
fn common_fields(t: &Value) -> Map<String, Value> {
    [
        "taskId",
        "status",
        "statusMessage",
        "createdAt",
        "lastUpdatedAt",
    ]
    .into_iter()
    .filter_map(|k| Some((k.to_string(), t.get(k)?.clone())))
    .collect()
}

/// A 2026-07-28 task object (flat; `ttlMs`, `pollIntervalMs`) as the 2025-11-25 `Task` the
/// table keeps (`ttl`, `pollInterval`); the outcome fields (`result`, `error`,
/// `inputRequests`) are read by the caller.
fn from_modern(t: &Value) -> Value {
    let mut m = common_fields(t);
    m.insert("ttl".into(), t.get("ttlMs").cloned().unwrap_or(Value::Null));
    if let Some(p) = t.get("pollIntervalMs") {
        m.insert("pollInterval".into(), p.clone());
    }
    Value::Object(m)
}

/// Why a created task is not handed to its client.
#[derive(Debug)]
pub enum NotCreated {
    /// The registration holds its cap of live tasks: the task was cancelled upstream.
    Full(usize),
    /// The registration was released while the task was being created: cancelled upstream.
    Released,
}

/// Takes a task the upstream created for a call into the table: audits `task_created`,
/// starts its poller, and returns the `CreateTaskResult` for the client (the gateway's id in
/// it). A task created after its registration was released is cancelled upstream at once.
#[allow(clippy::too_many_arguments)] // what the creating call knew, read once here
pub async fn created(
    ctx: &RequestCtx,
    tool: &str,
    upstream: &str,
    epoch: u64,
    (upstream_task, upstream_modern): (Value, bool),
    internal: bool,
    modern: Option<u8>,
    progress: Option<(Value, u64)>,
) -> Result<Arc<Task>, NotCreated> {
    let hub = &ctx.hub;
    let cfg = &hub.config().tasks;
    let max_ttl = Duration::from_secs(cfg.max_ttl_s.max(1));
    let ttl = upstream_task
        .get("ttl")
        .and_then(Value::as_u64)
        .map(Duration::from_millis)
        .map_or(max_ttl, |t| t.min(max_ttl));
    let poll = upstream_task
        .get("pollInterval")
        .and_then(Value::as_u64)
        .unwrap_or(0)
        .max(cfg.min_poll_interval_ms);
    let upstream_id = upstream_task
        .get("taskId")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let new = NewTask {
        registration: ctx.registration.clone(),
        upstream: upstream.to_string(),
        epoch,
        upstream_id: upstream_id.clone(),
        tool: tool.to_string(),
        internal,
        modern,
        upstream_modern,
        session: ctx.session.as_ref().map(Arc::downgrade),
        progress: progress_route(ctx, epoch, progress, internal, modern.is_some()),
        ttl,
        poll_interval: Duration::from_millis(poll),
        view: upstream_task,
    };
    let task = match hub.tasks().insert(new, cfg.max_live_per_registration) {
        Ok(t) => t,
        Err(crate::tasks::Refused::Full(n)) => {
            tracing::warn!(registration = %crate::refusals::shorten(&ctx.registration.id), upstream, cap = n, "task refused: the registration holds its cap of live tasks; cancelled upstream");
            cancel_upstream_id(hub, &ctx.registration, upstream, epoch, &upstream_id).await;
            return Err(NotCreated::Full(n));
        }
    };
    let mut rec = ctx.registration.audit_record("task_created");
    rec.session_id = ctx.session_id().map(Into::into);
    rec.transport = Some(ctx.transport.as_str().into());
    rec.tool = Some(tool.into());
    rec.upstream = Some(upstream.into());
    rec.epoch = Some(epoch);
    rec.rare_mut().task_id = Some(task.id.as_str().into());
    let digest = crate::tasks::upstream_digest(&task.upstream_id);
    rec.rare_mut().upstream_task_digest = Some(digest.as_str().into());
    rec.rare_mut().ttl_ms = u64::try_from(ttl.as_millis()).ok();
    let _ = hub.audit().record(rec).await;
    if ctx.registration.is_released() {
        end_on_release(hub, &task).await;
        return Err(NotCreated::Released);
    }
    spawn_poller(hub.clone(), task.clone());
    Ok(task)
}

/// Whether upstream `id` is configured to speak the 2026-07-28 era.
pub fn modern_upstream(hub: &Hub, id: &str) -> bool {
    hub.config()
        .upstreams
        .iter()
        .any(|u| u.id == id && u.protocol.as_deref() == Some(crate::config::MODERN_PROTOCOL))
}

/// A 2025-11-25 client asked a 2026-07-28 upstream for a task, and the upstream answered at
/// once (the server decides: a tool it does not run as a task). The client gets what it asked
/// for, a task, already ended with that result (its `tasks/result` answers it; `failed` for a
/// tool error, as in 2025-11-25); audited `task_created` and `task_outcome` like any task.
pub async fn ended_at_once(
    ctx: &RequestCtx,
    tool: &str,
    upstream: &str,
    epoch: u64,
    result: Value,
) -> Result<Arc<Task>, NotCreated> {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let view = json!({"taskId": format!("answered-at-once-{}", crate::tasks::mint_id()),
                      "status": "working", "createdAt": now, "lastUpdatedAt": now, "ttl": null});
    let task = created(ctx, tool, upstream, epoch, (view, true), false, None, None).await?;
    let (status, outcome) = if is_error(&result) {
        (Status::Failed, TaskOutcome::ToolError)
    } else {
        (Status::Completed, TaskOutcome::Completed)
    };
    settle(&ctx.hub, &task, status, None, Ok(result), outcome, None).await;
    Ok(task)
}

/// Where a task's progress goes once its creating call ended: the client's token and the
/// call's upstream request id given, a plain call's own stream (the gateway runs the task for
/// it) or the creating session (2025-11-25); none for a 2026 task (the extension has no
/// progress for tasks).
fn progress_route(
    ctx: &RequestCtx,
    epoch: u64,
    progress: Option<(Value, u64)>,
    internal: bool,
    modern: bool,
) -> Option<crate::tasks::TaskProgress> {
    let (client_token, request_id) = progress?;
    let to = if internal {
        crate::tasks::ProgressTo::Call(ctx.notify.clone()?)
    } else if modern {
        return None;
    } else {
        crate::tasks::ProgressTo::Session(Arc::downgrade(ctx.session.as_ref()?))
    };
    Some(crate::tasks::TaskProgress {
        upstream_token: crate::upstream::progress_token(epoch, request_id),
        client_token,
        to,
    })
}

/// Runs a task for a `tools/call` that did not ask for one (the upstream requires a task for
/// the tool, or answered with one unasked): waits for its end and returns its answer for the
/// plain call. The call's cancel becomes `tasks/cancel` upstream (audited `cancelled`;
/// `None`).
pub async fn run_for_call(
    ctx: &RequestCtx,
    task: &Arc<Task>,
    cancel: &CancellationToken,
) -> Option<Arc<Final>> {
    match wait_final(ctx, task, cancel, None).await {
        Some(f) => Some(f),
        None => {
            if !task.is_settled() {
                let acked = cancel_upstream_id(
                    &ctx.hub,
                    &task.registration,
                    &task.upstream,
                    task.epoch(),
                    &task.upstream_id,
                )
                .await;
                let why = if acked {
                    "the call was cancelled: cancelled upstream"
                } else {
                    "the call was cancelled: the upstream did not acknowledge the cancel"
                };
                let outcome = if task.registration.is_released() {
                    TaskOutcome::CancelledOnRelease
                } else {
                    TaskOutcome::Cancelled
                };
                settle(
                    &ctx.hub,
                    task,
                    Status::Cancelled,
                    Some(why),
                    Err(cancelled_error("its call was cancelled")),
                    outcome,
                    None,
                )
                .await;
            }
            None
        }
    }
}

/// The registration's task `id`, or the -32602 that an unknown id and another
/// registration's id alike get.
fn lookup(ctx: &RequestCtx, id: &Value, params: Option<&Value>) -> Result<Arc<Task>, Value> {
    let task_id = params.and_then(|p| p.get("taskId")).and_then(Value::as_str);
    task_id
        .and_then(|t| ctx.hub.tasks().get(&ctx.registration.id, t))
        .filter(|t| !t.internal)
        .ok_or_else(|| {
            RpcError::new(
                Some(id.clone()),
                jsonrpc::INVALID_PARAMS,
                "unknown task: no task of this registration has that taskId",
            )
            .to_value()
        })
}

/// Handles `tasks/get|result|cancel|list` for a session. `None`: the request was cancelled.
pub async fn handle(
    ctx: &RequestCtx,
    id: Value,
    method: &str,
    params: Option<Value>,
    cancel: CancellationToken,
    trace: Option<&crate::telemetry::CallTrace>,
) -> Option<Value> {
    if ctx.session.is_none() {
        return Some(modern(ctx, id, method, params.as_ref()).await);
    }
    if method == "tasks/update" {
        // Not a 2025-11-25 method.
        return Some(
            RpcError::new(
                Some(id),
                jsonrpc::METHOD_NOT_FOUND,
                format!("method not found: {method}"),
            )
            .to_value(),
        );
    }
    if method == "tasks/list" {
        return Some(list(ctx, id, params.as_ref()));
    }
    let task = match lookup(ctx, &id, params.as_ref()) {
        Ok(t) => t,
        Err(e) => return Some(e),
    };
    let hub = &ctx.hub;
    match method {
        "tasks/get" => {
            if !task.is_settled() && !task.polled_lately() {
                refresh(hub, &task, trace).await;
            }
            Some(jsonrpc::success(id, task.view()))
        }
        "tasks/result" => result(ctx, id, &task, cancel, trace).await,
        _ => Some(cancel_task(hub, id, &task, trace).await),
    }
}

/// `tasks/*` on a stateless 2026-07-28 request (the `io.modelcontextprotocol/tasks`
/// extension; `Mcp-Name` was checked against `taskId` by the endpoint). `tasks/result` and
/// `tasks/list` are gone in that revision (-32601); the others need the extension declared in
/// the request's `_meta` (-32021 otherwise). The registration's tasks are looked up as for a
/// session (its 2025-form tasks too: the extension allows `get` and `cancel` on them) and
/// shown in the 2026 form: `tasks/get` inlines the result (`completed` even with `isError`)
/// or the error (`failed`) and the pending `inputRequests`; `tasks/cancel` and `tasks/update`
/// are acknowledged empty (a cancel of a task that ended is no error there).
async fn modern(ctx: &RequestCtx, id: Value, method: &str, params: Option<&Value>) -> Value {
    if let Some(e) = stateless(id.clone(), method, params) {
        return e;
    }
    let task = match lookup(ctx, &id, params) {
        Ok(t) => t,
        Err(e) => return e,
    };
    let hub = &ctx.hub;
    match method {
        "tasks/get" => {
            // A terminal status heard (a status notification) but not settled yet: settled
            // now, as the 2026 form inlines the outcome with the status.
            let heard_end = task
                .view()
                .get("status")
                .and_then(Value::as_str)
                .and_then(Status::parse)
                .is_some_and(Status::is_terminal);
            if !task.is_settled() && (heard_end || !task.polled_lately()) {
                refresh(hub, &task, None).await;
            }
            jsonrpc::success(id, detailed(&task))
        }
        "tasks/update" => {
            let Some(responses) = params
                .and_then(|p| p.get("inputResponses"))
                .and_then(Value::as_object)
            else {
                return RpcError::new(
                    Some(id),
                    jsonrpc::INVALID_PARAMS,
                    "invalid params: inputResponses (an object) is required",
                )
                .to_value();
            };
            if task.upstream_modern {
                return update_upstream(hub, id, &task, responses).await;
            }
            for (key, response) in responses {
                // Keys this task does not wait on are ignored (an answer may cross the end).
                if task.take_input(key).is_some() {
                    hub.pool().client_response(
                        &task.registration.id,
                        crate::upstream::STATELESS_SESSION,
                        &Value::String(key.clone()),
                        &json!({ "result": response }),
                    );
                }
            }
            task.wake.notify_one();
            jsonrpc::success(id, json!({}))
        }
        _ => {
            if !task.is_settled() {
                let r = cancel_task(hub, id.clone(), &task, None).await;
                if r.get("error").and_then(|e| e.get("code"))
                    == Some(&json!(jsonrpc::INTERNAL_ERROR))
                {
                    return r;
                }
            }
            jsonrpc::success(id, json!({}))
        }
    }
}

/// A 2026 client's `tasks/update` of a task whose upstream speaks the 2026-07-28 era: the
/// responses to the requests it is waiting on go upstream (`tasks/update`, the upstream's id),
/// the others are dropped (an answer may cross the end); acknowledged empty.
async fn update_upstream(
    hub: &Arc<Hub>,
    id: Value,
    task: &Arc<Task>,
    responses: &Map<String, Value>,
) -> Value {
    let mut answered = Map::new();
    for (key, response) in responses {
        if let Some(up_key) = task.take_upstream_input(key) {
            answered.insert(up_key, response.clone());
        }
    }
    match send_inputs(hub, task, answered).await {
        None => {
            task.wake.notify_one();
            jsonrpc::success(id, json!({}))
        }
        Some(Err(e)) => jsonrpc::error_of(id, &e, "tasks/update refused upstream"),
        Some(Ok(why)) => RpcError::new(Some(id), jsonrpc::INTERNAL_ERROR, why).to_value(),
    }
}

/// `tasks/update {inputResponses}` upstream (nothing when empty). `Some(Err(error))`: the
/// upstream refused it; `Some(Ok(why))`: it could not be reached.
async fn send_inputs(
    hub: &Arc<Hub>,
    task: &Arc<Task>,
    answered: Map<String, Value>,
) -> Option<Result<String, Value>> {
    if answered.is_empty() {
        return None;
    }
    let mut p = upstream_params(task);
    p.insert("inputResponses".into(), Value::Object(answered));
    let r = hub
        .pool()
        .forward_task(
            &task.registration,
            &task.upstream,
            task.epoch(),
            "tasks/update",
            p,
            task.stop.clone(),
            None,
            None,
            None,
        )
        .await;
    match r {
        Ok(Some(Ok(_))) => None,
        Ok(Some(Err(e))) => Some(Err(e)),
        Ok(None) => {
            lost_or_rebound(hub, task).await;
            None
        }
        Err(e) => Some(Ok(format!("the task's upstream could not be reached: {e}"))),
    }
}

/// A 2025-11-25 client's task on a 2026-07-28 upstream waits on input: the request (its key
/// parked as `key`) is sent on the creating session (an `elicitation/create`, say, with the
/// related-task `_meta` naming the gateway's id), as a 2025 server would while the client's
/// `tasks/result` is open; the client's answer goes upstream as `tasks/update`. A capability
/// the session's client did not declare, or a session gone, is answered upstream as refused
/// (an elicitation: `decline`).
fn ask_session(hub: &Arc<Hub>, task: &Arc<Task>, key: String, request: Value) {
    let (hub, task) = (hub.clone(), task.clone());
    let reg = task.registration.clone();
    reg.calls.spawn(async move {
        let method = request
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let mut params = request
            .get("params")
            .cloned()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        let session = task
            .session
            .as_ref()
            .and_then(std::sync::Weak::upgrade)
            .filter(|s| !s.cancel.is_cancelled());
        let allowed = crate::mcp::ClientCapability::for_method(&method);
        let answer = match (session, allowed) {
            (Some(s), Some(cap)) if s.declares(cap) => {
                if let Some(m) = params.as_object_mut() {
                    let meta = m.entry("_meta").or_insert_with(|| json!({}));
                    if let Some(meta) = meta.as_object_mut() {
                        // The upstream's id, as an upstream's own request would name it: the
                        // delivery names the gateway's instead (`Hub::related_task_to_client`).
                        meta.insert(RELATED_TASK.into(), json!({"taskId": task.upstream_id}));
                    }
                }
                match hub.pool().ask_session(&s, &method, params, &*hub).await {
                    Some(rx) => tokio::select! {
                        r = rx => r.ok(),
                        () = task.stop.cancelled() => return,
                    },
                    None => None,
                }
            }
            _ => None,
        };
        let response = match answer {
            Some(Ok(result)) => result,
            // Refused, unanswered or undeliverable: an elicitation is declined; anything else
            // is left to the task's TTL.
            _ if method == "elicitation/create" => json!({"action": "decline"}),
            _ => {
                tracing::warn!(task = %task.id, method, "a 2026 upstream's input request could not be asked of its 2025 client");
                return;
            }
        };
        let Some(up_key) = task.take_upstream_input(&key) else {
            return;
        };
        let mut answered = Map::new();
        answered.insert(up_key, response);
        if let Some(e) = send_inputs(&hub, &task, answered).await {
            tracing::debug!(task = %task.id, error = ?e, "tasks/update refused upstream");
        }
        task.wake.notify_one();
    });
}

/// A task's common fields in the 2026-07-28 form (flat; `ttlMs`, `pollIntervalMs`).
fn modern_fields(task: &Task) -> Map<String, Value> {
    let view = task.view();
    let mut m = common_fields(&view);
    m.insert(
        "ttlMs".into(),
        view.get("ttl").cloned().unwrap_or(Value::Null),
    );
    if let Some(p) = view.get("pollInterval") {
        m.insert("pollIntervalMs".into(), p.clone());
    }
    m
}

/// The reply to a `tools/call` whose task is handed to a 2026-07-28 client.
pub fn modern_created(task: &Task) -> Value {
    let mut m = modern_fields(task);
    m.insert("resultType".into(), json!("task"));
    Value::Object(m)
}

/// `tasks/get`'s DetailedTask (2026-07-28): a settled task's answer inline — a tool result
/// (`isError` too) is `completed` with `result`, a JSON-RPC error `failed` with `error`, a
/// cancel `cancelled`; a live task waiting on its client lists its `inputRequests`.
fn detailed(task: &Task) -> Value {
    let mut m = modern_fields(task);
    m.insert("resultType".into(), json!("complete"));
    match task.final_answer().as_deref() {
        Some(Ok(result)) => {
            m.insert("status".into(), json!("completed"));
            m.insert("result".into(), result.clone());
        }
        Some(Err(e)) => {
            if m.get("status") != Some(&json!("cancelled")) {
                m.insert("status".into(), json!("failed"));
                m.insert("error".into(), e.clone());
            }
        }
        None => {
            let status = m
                .get("status")
                .and_then(Value::as_str)
                .and_then(Status::parse);
            if status.is_some_and(Status::is_terminal) {
                // Its outcome is not read yet (the upstream did not answer): still working.
                m.insert("status".into(), json!("working"));
            }
            // A task waits on its client while any parked request is unanswered (the
            // upstream may say `working` again once one of several is answered).
            let inputs = task.inputs();
            if !inputs.is_empty() {
                m.insert("status".into(), json!("input_required"));
            } else if m.get("status") == Some(&json!("input_required")) {
                // Nothing to answer: every request answered (sent upstream), or none handed
                // over yet (a 2025-11-25 upstream's come on the `tasks/result` opened once its
                // status is seen): working until one is parked (SEP-2322: never
                // `input_required` without `inputRequests`).
                m.insert("status".into(), json!("working"));
            }
            if m.get("status") == Some(&json!("input_required")) {
                m.insert("inputRequests".into(), Value::Object(inputs));
            }
        }
    }
    Value::Object(m)
}

/// The refusal of a 2026-07-28 `tasks/*` request, if it is refused before lookup.
fn stateless(id: Value, method: &str, params: Option<&Value>) -> Option<Value> {
    if matches!(method, "tasks/result" | "tasks/list") {
        // (Refused before dispatch by the stateless endpoint; kept for any other caller.)
        return Some(
            RpcError::new(
                Some(id),
                jsonrpc::METHOD_NOT_FOUND,
                format!("method not found: {method} (removed in 2026-07-28)"),
            )
            .to_value(),
        );
    }
    let declared = params
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(META_CAPABILITIES))
        .is_some_and(declares_extension);
    if !declared {
        return Some(jsonrpc::error_response(
            Some(id),
            EXTENSION_NOT_DECLARED,
            &format!(
                "{method} needs the {EXTENSION} extension, which this request did not declare"
            ),
            Some(json!({"requiredCapabilities": {"extensions": {EXTENSION: {}}}})),
        ));
    }
    None
}

fn list(ctx: &RequestCtx, id: Value, params: Option<&Value>) -> Value {
    if let Some(c) = params.and_then(|p| p.get("cursor")) {
        if !c.is_null() && c != "" {
            return RpcError::new(
                Some(id),
                jsonrpc::INVALID_PARAMS,
                "invalid cursor: this gateway returns every task in one page",
            )
            .to_value();
        }
    }
    let tasks: Vec<Value> = ctx
        .hub
        .tasks()
        .of_registration(&ctx.registration.id)
        .iter()
        .filter(|t| !t.internal)
        .map(|t| t.view())
        .collect();
    jsonrpc::success(id, json!({"tasks": tasks}))
}

/// `tasks/result`: blocks until the task ends. The upstream's blocking `tasks/result` is
/// asked on the caller's behalf (so what the upstream sends the client meanwhile, such as an
/// elicitation, reaches its session); whichever ends first, it or another sighting of the end
/// (the poller, a cancel, the TTL), settles the task, and the settled answer is sent.
async fn result(
    ctx: &RequestCtx,
    id: Value,
    task: &Arc<Task>,
    cancel: CancellationToken,
    trace: Option<&crate::telemetry::CallTrace>,
) -> Option<Value> {
    let f = wait_final(ctx, task, &cancel, trace).await?;
    Some(answer(id, task, &f))
}

/// Waits for a task's end (`None`: `cancel` fired first), asking the upstream's blocking
/// `tasks/result` meanwhile on the session's behalf (for at most the upstream's
/// `call_timeout_s`).
async fn wait_final(
    ctx: &RequestCtx,
    task: &Arc<Task>,
    cancel: &CancellationToken,
    trace: Option<&crate::telemetry::CallTrace>,
) -> Option<Arc<Final>> {
    if let Some(f) = task.final_answer() {
        return Some(f);
    }
    if task.upstream_modern {
        // No blocking `tasks/result` in the 2026-07-28 era: the poller's `tasks/get` sees the
        // end (woken now, so a call waiting on it is not a poll interval late).
        task.wake.notify_one();
        return tokio::select! {
            biased;
            () = cancel.cancelled() => None,
            f = task.finished() => Some(f),
        };
    }
    let hub = &ctx.hub;
    let asked = cancel.child_token();
    let _stop_asking = asked.clone().drop_guard();
    // The upstream's blocking `tasks/result` holds one of the connection's permits: it is
    // given the upstream's `call_timeout_s` (what a call may hold one for), never the task's
    // TTL; past it the task's end is waited for from the poller.
    let ask = hub.pool().forward_task(
        &task.registration,
        &task.upstream,
        task.epoch(),
        "tasks/result",
        upstream_params(task),
        asked.clone(),
        None,
        ctx.session.clone(),
        trace,
    );
    tokio::pin!(ask);
    let r = tokio::select! {
        biased;
        () = cancel.cancelled() => return None,
        f = task.finished() => {
            // Settled by another sighting: the task is terminal, so the upstream's
            // `tasks/result` answers at once; it is given a moment rather than abandoned
            // (`notifications/cancelled` for a blocking `tasks/result` ends a Python SDK 1.x
            // server: tests/fixtures/task_server.py showed it).
            let _ = tokio::time::timeout(SETTLED_ASK_GRACE, &mut ask).await;
            return Some(f);
        }
        r = &mut ask => r,
    };
    take_result(hub, task, r).await;
    tokio::select! {
        biased;
        () = cancel.cancelled() => None,
        f = task.finished() => Some(f),
    }
}

/// Takes the answer of the upstream's blocking `tasks/result` (asked by [`wait_final`] or
/// [`ask_inputs`]): settles the task, or leaves it to the poller.
async fn take_result(
    hub: &Arc<Hub>,
    task: &Arc<Task>,
    r: Result<Option<Result<Value, Value>>, crate::upstream::ForwardError>,
) {
    match r {
        Ok(Some(Ok(result))) => {
            if result.get("content").is_none() && !is_error(&result) {
                // Not a tool result (the Python SDK 1.x answers a failed task's
                // `tasks/result` with `_meta` only): its status says how it ended.
                refresh(hub, task, None).await;
                if task.is_settled() {
                    return;
                }
            }
            let outcome = if is_error(&result) {
                TaskOutcome::ToolError
            } else {
                TaskOutcome::Completed
            };
            let status = if outcome == TaskOutcome::ToolError {
                Status::Failed
            } else {
                Status::Completed
            };
            settle(hub, task, status, None, Ok(result), outcome, None).await;
        }
        Ok(Some(Err(e))) => {
            let code = e.get("code").and_then(Value::as_i64);
            if code == Some(jsonrpc::INVALID_PARAMS) {
                // The upstream no longer knows it (or it was cancelled meanwhile).
                refresh(hub, task, None).await;
                if !task.is_settled() {
                    lose(hub, task, "the upstream no longer knows the task").await;
                }
            } else {
                settle(
                    hub,
                    task,
                    Status::Failed,
                    None,
                    Err(e),
                    TaskOutcome::Failed,
                    code,
                )
                .await;
            }
        }
        Ok(None) => lost_or_rebound(hub, task).await,
        Err(e) => {
            tracing::debug!(task = %task.id, error = %e, "tasks/result upstream did not answer; waiting for the poller");
        }
    }
}

/// A 2026 task whose upstream (2025-11-25) waits on its client (`input_required`): the
/// upstream's side-channel requests are delivered while a `tasks/result` is open, so one is
/// opened (once at a time) on a sink of the gateway's; each request on it is parked as one
/// of the task's `inputRequests` (its related-task `_meta` dropped), answered by the
/// client's `tasks/update`. A request for a capability the client did not declare is
/// refused upstream. The `tasks/result` ends with the task (and settles it).
fn ask_inputs(hub: &Arc<Hub>, task: &Arc<Task>) {
    if task.asking.swap(true, std::sync::atomic::Ordering::AcqRel) {
        return;
    }
    let (hub, task) = (hub.clone(), task.clone());
    let reg = task.registration.clone();
    reg.calls.spawn(async move {
        let declared = task.modern.unwrap_or(0);
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Value>(crate::tasks::MAX_INPUTS);
        task.set_input_sink(Some(tx.clone()));
        let to = crate::upstream::TaskOwner {
            session: None,
            notify: Some(tx),
        };
        let ask = hub.pool().forward_task_to(
            &task.registration,
            &task.upstream,
            task.epoch(),
            "tasks/result",
            upstream_params(&task),
            task.registration.cancel.child_token(),
            None,
            to,
            None,
        );
        tokio::pin!(ask);
        let r = loop {
            tokio::select! {
                r = &mut ask => break Some(r),
                Some(msg) = rx.recv() => park(&hub, &task, declared, msg),
                () = task.stop.cancelled() => {
                    // Settled otherwise: given a moment rather than abandoned (as in
                    // `wait_final`).
                    let _ = tokio::time::timeout(SETTLED_ASK_GRACE, &mut ask).await;
                    break None;
                }
            }
        };
        task.set_input_sink(None);
        if let Some(r) = r {
            take_result(&hub, &task, r).await;
        }
        task.asking
            .store(false, std::sync::atomic::Ordering::Release);
    });
}

/// One message of a 2026 task's side channel: a request is parked (or refused upstream);
/// anything else (progress, logs: the extension has none for tasks) is dropped.
fn park(hub: &Hub, task: &Task, declared: u8, mut msg: Value) {
    let Some(key) = msg.get("id").and_then(Value::as_str).map(str::to_owned) else {
        return;
    };
    let method = msg
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let allowed =
        crate::mcp::ClientCapability::for_method(&method).is_some_and(|c| c.in_bits(declared));
    let mut params = msg
        .get_mut("params")
        .map(Value::take)
        .unwrap_or_else(|| json!({}));
    if let Some(meta) = params.get_mut("_meta").and_then(Value::as_object_mut) {
        meta.remove(RELATED_TASK);
        if meta.is_empty() {
            if let Some(p) = params.as_object_mut() {
                p.remove("_meta");
            }
        }
    }
    let parked =
        allowed && task.park_input(key.clone(), json!({"method": method, "params": params}));
    if !parked {
        let why = if allowed {
            format!("{method} refused: the task holds too many unanswered input requests")
        } else {
            format!("{method} refused: the client did not declare the capability it needs")
        };
        hub.pool().client_response(
            &task.registration.id,
            crate::upstream::STATELESS_SESSION,
            &Value::String(key),
            &crate::hub::refusal_body(&why),
        );
    }
}

/// The reply to `tasks/result` from a settled answer: the related-task `_meta` names the
/// gateway's id.
fn answer(id: Value, task: &Task, f: &Final) -> Value {
    match f {
        Ok(result) => {
            let mut result = result.clone();
            if let Some(m) = result.as_object_mut() {
                let meta = m
                    .entry("_meta")
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Some(meta) = meta.as_object_mut() {
                    meta.insert(RELATED_TASK.into(), json!({"taskId": task.id}));
                }
            }
            jsonrpc::success(id, result)
        }
        Err(e) => jsonrpc::error_of(id, e, "task failed"),
    }
}

async fn cancel_task(
    hub: &Arc<Hub>,
    id: Value,
    task: &Arc<Task>,
    trace: Option<&crate::telemetry::CallTrace>,
) -> Value {
    let terminal = || {
        RpcError::new(
            Some(id.clone()),
            jsonrpc::INVALID_PARAMS,
            "task is already terminal: it cannot be cancelled",
        )
        .to_value()
    };
    if task.is_settled() {
        return terminal();
    }
    let r = hub
        .pool()
        .forward_task(
            &task.registration,
            &task.upstream,
            task.epoch(),
            "tasks/cancel",
            upstream_params(task),
            task.stop.clone(),
            None,
            None,
            trace,
        )
        .await;
    match r {
        Ok(Some(Ok(t))) => {
            if !task.upstream_modern {
                // 2026-07-28: an empty acknowledgement, not the task.
                task.observe(t);
            }
            let won = settle(
                hub,
                task,
                Status::Cancelled,
                None,
                Err(cancelled_error("cancelled by its client")),
                TaskOutcome::Cancelled,
                None,
            )
            .await;
            if won || task.outcome() == Some(TaskOutcome::Cancelled) {
                jsonrpc::success(id, task.view())
            } else {
                terminal()
            }
        }
        Ok(Some(Err(_))) => {
            // Terminal upstream already (or forgotten): see which, then refuse.
            refresh(hub, task, trace).await;
            terminal()
        }
        Ok(None) => match rebound(hub, task).await {
            // Its HTTP upstream reconnected and still knows it: cancelled there.
            Probe::Moved => Box::pin(cancel_task(hub, id, task, trace)).await,
            Probe::Later => RpcError::new(
                Some(id),
                jsonrpc::INTERNAL_ERROR,
                "the task's upstream could not be reached: retry the cancel",
            )
            .to_value(),
            Probe::Unknown => {
                lose(hub, task, UNKNOWN_AFTER_RECONNECT).await;
                terminal()
            }
            Probe::Gone => {
                lose(hub, task, "upstream restarted").await;
                terminal()
            }
        },
        Err(e) => RpcError::new(
            Some(id),
            jsonrpc::INTERNAL_ERROR,
            format!("the task's upstream could not be reached: {e}"),
        )
        .to_value(),
    }
}

fn cancelled_error(why: &str) -> Value {
    json!({"code": jsonrpc::INTERNAL_ERROR, "message": format!("task cancelled: {why}")})
}

/// `{taskId: <upstream id>}`.
fn upstream_params(task: &Task) -> Map<String, Value> {
    let mut p = Map::new();
    p.insert("taskId".into(), Value::String(task.upstream_id.clone()));
    p
}

fn is_error(result: &Value) -> bool {
    result.get("isError") == Some(&Value::Bool(true))
}

/// Asks the upstream about a live task (`tasks/get`) and takes the answer; at a terminal
/// status reads its result once (`tasks/result`, which answers at once then) and settles it.
/// `trace`: the SERVER span of the client's request that asked (none for the poller).
async fn refresh(hub: &Arc<Hub>, task: &Arc<Task>, trace: Option<&crate::telemetry::CallTrace>) {
    let r = hub
        .pool()
        .forward_task(
            &task.registration,
            &task.upstream,
            task.epoch(),
            "tasks/get",
            upstream_params(task),
            task.stop.clone(),
            None,
            None,
            trace,
        )
        .await;
    match r {
        Ok(Some(Ok(t))) if task.upstream_modern => settle_modern(hub, task, t).await,
        Ok(Some(Ok(t))) => match observe_told(hub, task, t) {
            Some(s) if s.is_terminal() && !task.is_settled() => settle_terminal(hub, task, s).await,
            Some(Status::InputRequired) if task.modern.is_some() => ask_inputs(hub, task),
            _ => {}
        },
        Ok(Some(Err(e)))
            if e.get("code").and_then(Value::as_i64) == Some(jsonrpc::INVALID_PARAMS) =>
        {
            lose(hub, task, "the upstream no longer knows the task").await
        }
        Ok(None) => lost_or_rebound(hub, task).await,
        Ok(Some(Err(e))) => {
            tracing::debug!(task = %task.id, error = %e, "tasks/get refused upstream; polled again later")
        }
        Err(e) => {
            tracing::debug!(task = %task.id, error = %e, "tasks/get failed upstream; polled again later")
        }
    }
}

/// A 2026-07-28 upstream's `tasks/get` answer (a DetailedTask): kept as the task's view; at a
/// terminal status, the outcome it inlines settles the task (`completed` with a tool result,
/// `isError` shown `failed` in the 2025-11-25 form as there; `failed` with a JSON-RPC error);
/// `input_required` parks its `inputRequests` for a 2026 client (answered by its
/// `tasks/update`, forwarded upstream).
async fn settle_modern(hub: &Arc<Hub>, task: &Arc<Task>, t: Value) {
    let before = task.view().get("status").cloned();
    let status = task.observe(from_modern(&t));
    if task.is_settled() {
        return;
    }
    match status {
        Some(Status::Completed) => {
            let result = t
                .get("result")
                .cloned()
                .unwrap_or_else(|| json!({"content": []}));
            let (status, outcome) = if is_error(&result) {
                (Status::Failed, TaskOutcome::ToolError)
            } else {
                (Status::Completed, TaskOutcome::Completed)
            };
            settle(hub, task, status, None, Ok(result), outcome, None).await;
        }
        Some(Status::Failed) => {
            let err = t.get("error").cloned().unwrap_or_else(|| {
                let why = t
                    .get("statusMessage")
                    .and_then(Value::as_str)
                    .unwrap_or("no reason given");
                json!({"code": jsonrpc::INTERNAL_ERROR, "message": format!("task failed: {why}")})
            });
            let code = err.get("code").and_then(Value::as_i64);
            settle(
                hub,
                task,
                Status::Failed,
                None,
                Err(err),
                TaskOutcome::Failed,
                code,
            )
            .await;
        }
        Some(Status::Cancelled) => {
            settle(
                hub,
                task,
                Status::Cancelled,
                None,
                Err(cancelled_error("cancelled upstream")),
                TaskOutcome::Cancelled,
                None,
            )
            .await;
        }
        Some(Status::InputRequired) => {
            // Parked under keys of the gateway's (the upstream's may name its task id): shown
            // to a 2026 client as `inputRequests`; asked of a 2025 client's session.
            let listed = t
                .get("inputRequests")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            task.keep_upstream_inputs(&listed);
            for (up_key, request) in &listed {
                match task.park_upstream_input(up_key, request.clone()) {
                    Ok(Some(key)) if task.modern.is_none() => {
                        ask_session(hub, task, key, request.clone());
                    }
                    Ok(_) => {}
                    Err(()) => {
                        tracing::warn!(task = %task.id, "an input request of a 2026 upstream's task not parked: too many unanswered");
                    }
                }
            }
        }
        _ => {}
    }
    // A live status that changed (its input requests parked first) is told to the listen
    // streams that named the task; an end was told by `settle`.
    if !task.is_settled() && before.as_ref().and_then(Value::as_str) != status.map(Status::as_str) {
        tell_listeners(hub, task);
    }
}

async fn settle_terminal(hub: &Arc<Hub>, task: &Arc<Task>, status: Status) {
    if status == Status::Cancelled {
        settle(
            hub,
            task,
            status,
            None,
            Err(cancelled_error("cancelled upstream")),
            TaskOutcome::Cancelled,
            None,
        )
        .await;
        return;
    }
    let r = hub
        .pool()
        .forward_task(
            &task.registration,
            &task.upstream,
            task.epoch(),
            "tasks/result",
            upstream_params(task),
            // Not the task's `stop`: the task is terminal upstream, so this answers at once; were
            // it cancelled when another sighting settles the task first, the upstream would be
            // sent `notifications/cancelled` for a blocking `tasks/result`, which ends a Python
            // SDK 1.x server (tests/fixtures/task_server.py showed it).
            CancellationToken::new(),
            None,
            None,
            None,
        )
        .await;
    match r {
        Ok(Some(Ok(result))) if status == Status::Failed && !is_error(&result) => {
            // Failed without a tool result (the Python SDK 1.x: an exception in the work):
            // a JSON-RPC error carrying its status message.
            let why = task
                .view()
                .get("statusMessage")
                .and_then(Value::as_str)
                .unwrap_or("no reason given")
                .to_string();
            let err =
                json!({"code": jsonrpc::INTERNAL_ERROR, "message": format!("task failed: {why}")});
            let code = Some(jsonrpc::INTERNAL_ERROR);
            settle(hub, task, status, None, Err(err), TaskOutcome::Failed, code).await;
        }
        Ok(Some(Ok(result))) => {
            // A tool error is `failed` in 2025-11-25 (whatever the upstream said; a 2026
            // client is shown `completed` with the result).
            let (status, outcome) = if is_error(&result) {
                (Status::Failed, TaskOutcome::ToolError)
            } else {
                (status, TaskOutcome::Completed)
            };
            settle(hub, task, status, None, Ok(result), outcome, None).await;
        }
        Ok(Some(Err(e))) => {
            let code = e.get("code").and_then(Value::as_i64);
            settle(hub, task, status, None, Err(e), TaskOutcome::Failed, code).await;
        }
        Ok(None) => lost_or_rebound(hub, task).await,
        Err(e) => {
            tracing::debug!(task = %task.id, error = %e, "the result of a finished task could not be read; asked again later")
        }
    }
}

/// The task's connection ended: [`rebound`] to its HTTP upstream's new connection, left for
/// the poller while that connection cannot be made, or lost.
async fn lost_or_rebound(hub: &Arc<Hub>, task: &Arc<Task>) {
    match rebound(hub, task).await {
        Probe::Moved | Probe::Later => {}
        Probe::Unknown => lose(hub, task, UNKNOWN_AFTER_RECONNECT).await,
        Probe::Gone => lose(hub, task, "upstream restarted").await,
    }
}

/// Why a task is lost whose HTTP upstream's new connection does not know it.
const UNKNOWN_AFTER_RECONNECT: &str =
    "upstream reconnected: its new connection does not know the task";

/// What probing a task on its upstream's new connection found.
#[derive(Debug, PartialEq, Eq)]
enum Probe {
    /// Known there: moved to that connection.
    Moved,
    /// No connection could be made yet (the upstream is unreachable): asked again at the
    /// next poll (the task's TTL bounds the wait).
    Later,
    /// Asked on the new connection, which does not know it.
    Unknown,
    /// A stdio upstream, or probed once already.
    Gone,
}

/// A task whose connection ended, on an HTTP upstream: probed once on the upstream's next
/// connection (`tasks/get`). Known there (servers whose task ids are bearer tokens), it is
/// moved to that connection and the answer taken; unknown (session-scoped servers), or a
/// stdio upstream (a respawned child never knows the tasks of the one before), it is gone.
async fn rebound(hub: &Arc<Hub>, task: &Arc<Task>) -> Probe {
    use std::sync::atomic::Ordering;
    if task.moved.load(Ordering::Acquire) {
        // Another sighting moved it while this one's request was on the old connection.
        return Probe::Moved;
    }
    if task.probed.load(Ordering::Acquire) || task.is_settled() {
        return Probe::Gone;
    }
    let probe = hub.pool().probe_task(
        &task.registration,
        &task.upstream,
        upstream_params(task),
        task.stop.clone(),
    );
    let (epoch, t) = match probe.await {
        Ok(Some((epoch, Ok(t)))) => (epoch, t),
        Err(e) => {
            tracing::debug!(task = %task.id, error = %e, "task's upstream not reachable to probe it; asked again at the next poll");
            return Probe::Later;
        }
        Ok(Some(_)) => {
            task.probed.store(true, Ordering::Release);
            return Probe::Unknown;
        }
        Ok(None) => {
            task.probed.store(true, Ordering::Release);
            return Probe::Gone;
        }
    };
    if epoch == task.epoch() || task.moved.swap(true, Ordering::AcqRel) {
        // Moved there by a probe that ran alongside this one.
        return Probe::Moved;
    }
    task.probed.store(true, Ordering::Release);
    tracing::info!(task = %task.id, upstream = %task.upstream, epoch, "task found on its upstream's new connection: moved there");
    hub.tasks().rebind(task, epoch);
    if task.upstream_modern {
        Box::pin(settle_modern(hub, task, t)).await;
    } else if let Some(s) = observe_told(hub, task, t) {
        if s.is_terminal() && !task.is_settled() {
            Box::pin(settle_terminal(hub, task, s)).await;
        }
    }
    Probe::Moved
}

/// The task's upstream restarted or forgot it: `failed`, audited `lost`.
async fn lose(hub: &Arc<Hub>, task: &Arc<Task>, why: &str) {
    let err = json!({"code": jsonrpc::INTERNAL_ERROR, "message": format!("task lost: {why}")});
    settle(
        hub,
        task,
        Status::Failed,
        Some(why),
        Err(err),
        TaskOutcome::Lost,
        None,
    )
    .await;
}

/// Settles a task and, for the one caller that did, writes its `task_outcome` record.
/// Whether this call settled it.
async fn settle(
    hub: &Arc<Hub>,
    task: &Arc<Task>,
    status: Status,
    message: Option<&str>,
    answer: Final,
    outcome: TaskOutcome,
    error_code: Option<i64>,
) -> bool {
    let mut answer = answer;
    if let Ok(Value::Object(m)) = &mut answer {
        // It named the upstream's id; `answer` names the gateway's (none on a plain call).
        if let Some(meta) = m.get_mut("_meta").and_then(Value::as_object_mut) {
            meta.remove(RELATED_TASK);
        }
        if m.get("_meta")
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty)
        {
            m.remove("_meta");
        }
    }
    if !task.settle(status, message, answer, outcome) {
        return false;
    }
    let mut rec = task.registration.audit_record("task_outcome");
    rec.tool = Some(task.tool.as_str().into());
    rec.upstream = Some(task.upstream.as_str().into());
    rec.epoch = Some(task.epoch());
    rec.rare_mut().task_id = Some(task.id.as_str().into());
    let digest = crate::tasks::upstream_digest(&task.upstream_id);
    rec.rare_mut().upstream_task_digest = Some(digest.as_str().into());
    rec.outcome = Some(outcome.as_str().into());
    rec.error_code = error_code;
    rec.reason = message.map(|m| m.to_string().into());
    rec.duration_ms = Some(task.created.elapsed().as_secs_f64() * 1000.0);
    if let Err(e) = hub.audit().record(rec).await {
        tracing::error!(task = %task.id, error = %e, "task outcome not audited");
    }
    tell_listeners(hub, task);
    true
}

/// `notifications/tasks` (the task as `tasks/get` shows it in the 2026-07-28 form, its
/// outcome inline once settled) to the registration's `subscriptions/listen` streams that
/// named the task; nothing when none did.
fn tell_listeners(hub: &Hub, task: &Task) {
    if task.internal {
        return;
    }
    let mut params = detailed(task);
    if let Some(m) = params.as_object_mut() {
        m.remove("resultType");
    }
    let msg = jsonrpc::notification(crate::listen::TASKS_METHOD, Some(params));
    hub.listeners().deliver(&task.registration.id, &msg);
}

/// Takes an upstream's view of a live task; a status that changed (and did not end the task:
/// [`settle`] tells that) is told to the listen streams that named it.
fn observe_told(hub: &Hub, task: &Task, view: Value) -> Option<Status> {
    let before = task.view().get("status").cloned();
    let status = task.observe(view);
    if !task.is_settled()
        && before.as_ref().and_then(Value::as_str) != status.map(Status::as_str)
        && status.is_some_and(|s| !s.is_terminal())
    {
        tell_listeners(hub, task);
    }
    status
}

/// Sends `tasks/cancel` for an upstream task id on the gateway's behalf (bounded wait);
/// whether the upstream acknowledged it.
async fn cancel_upstream_id(
    hub: &Hub,
    reg: &Arc<RegistrationState>,
    upstream: &str,
    epoch: u64,
    upstream_id: &str,
) -> bool {
    let mut p = Map::new();
    p.insert("taskId".into(), Value::String(upstream_id.to_string()));
    let fwd = hub.pool().forward_task(
        reg,
        upstream,
        epoch,
        "tasks/cancel",
        p,
        CancellationToken::new(),
        Some(CANCEL_TIMEOUT),
        None,
        None,
    );
    matches!(
        tokio::time::timeout(CANCEL_TIMEOUT, fwd).await,
        Ok(Ok(Some(Ok(_))))
    )
}

/// A task whose registration was released: cancelled upstream, audited
/// `cancelled_on_release`, forgotten.
async fn end_on_release(hub: &Arc<Hub>, task: &Arc<Task>) {
    if !task.is_settled() {
        let acked = cancel_upstream_id(
            hub,
            &task.registration,
            &task.upstream,
            task.epoch(),
            &task.upstream_id,
        )
        .await;
        let why = if acked {
            "registration released: cancelled upstream"
        } else {
            "registration released: the upstream did not acknowledge the cancel"
        };
        settle(
            hub,
            task,
            Status::Cancelled,
            Some(why),
            Err(cancelled_error("registration released")),
            TaskOutcome::CancelledOnRelease,
            None,
        )
        .await;
    }
    hub.tasks().remove(task);
}

/// Release: every live task of the registration is cancelled upstream (`tasks/cancel`, never
/// `notifications/cancelled`) and audited before the release completes; all its tasks are
/// forgotten. Called by the gateway's release path before the registration's upstream
/// connections and leases go.
pub async fn release(hub: &Arc<Hub>, reg: &RegistrationState) {
    let tasks = hub.tasks().of_registration(&reg.id);
    if tasks.is_empty() {
        return;
    }
    // At most `max_live_per_registration` live ones: cancelled together.
    futures::future::join_all(tasks.iter().map(|t| end_on_release(hub, t))).await;
}

/// A task's background poller, on its registration's tracker (it ends with the registration):
/// polls the upstream every poll interval (sooner when a status notification wakes it) until
/// the task is settled, so a task nobody polls still gets its outcome; at the TTL a live task
/// is cancelled upstream (audited `expired`); a settled one is kept (its answer cached) until
/// the TTL, then forgotten.
fn spawn_poller(hub: Arc<Hub>, task: Arc<Task>) {
    let reg = task.registration.clone();
    reg.calls.spawn(async move {
        let every = task
            .poll_interval
            .max(Duration::from_millis(
                hub.config().tasks.min_poll_interval_ms,
            ))
            .max(POLL_FLOOR);
        let deadline = task.deadline();
        loop {
            tokio::select! {
                biased;
                () = task.stop.cancelled() => break,
                () = tokio::time::sleep_until(deadline) => {
                    expire(&hub, &task).await;
                    return;
                }
                () = task.wake.notified() => {}
                () = tokio::time::sleep(every) => {}
            }
            if !task.is_settled() {
                refresh(&hub, &task, None).await;
            }
        }
        if task.registration.is_released() {
            return; // the release path ends and forgets it
        }
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => hub.tasks().remove(&task),
            () = task.registration.cancel.cancelled() => {}
            () = task.gone.cancelled() => {}
        }
    });
}

/// The TTL ran out: a live task is cancelled upstream and audited `expired`; then forgotten.
async fn expire(hub: &Arc<Hub>, task: &Arc<Task>) {
    if !task.is_settled() {
        cancel_upstream_id(
            hub,
            &task.registration,
            &task.upstream,
            task.epoch(),
            &task.upstream_id,
        )
        .await;
        settle(
            hub,
            task,
            Status::Cancelled,
            Some("the task's TTL ran out"),
            Err(json!({"code": jsonrpc::INVALID_PARAMS, "message": "task expired"})),
            TaskOutcome::Expired,
            None,
        )
        .await;
    }
    hub.tasks().remove(task);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_params_are_capped_and_dropped_without_a_session() {
        let max = Duration::from_secs(60);
        let mut p = json!({"name": "x", "task": {"ttl": 999_999_999}})
            .as_object()
            .cloned()
            .unwrap();
        assert!(prepare_call(&mut p, true, max));
        assert_eq!(p["task"]["ttl"], 60_000);
        let mut p = json!({"name": "x", "task": {}})
            .as_object()
            .cloned()
            .unwrap();
        assert!(prepare_call(&mut p, true, max));
        assert_eq!(p["task"]["ttl"], 60_000);
        let mut p = json!({"name": "x", "task": {}})
            .as_object()
            .cloned()
            .unwrap();
        assert!(!prepare_call(&mut p, false, max));
        assert!(!p.contains_key("task"));
        let mut p = json!({"name": "x"}).as_object().cloned().unwrap();
        assert!(!prepare_call(&mut p, true, max));
        assert!(create_task_result(r#"{"task":{"taskId":"u","status":"working"}}"#).is_some());
        assert!(create_task_result(r#"{"content":[{"type":"text","text":"taskId"}]}"#).is_none());
        assert!(
            create_task_result(r#"{"content":[],"task":{"taskId":"u"}}"#).is_none(),
            "a tool result is never a task"
        );
    }
}
