//! Tasks as a client meets them, beside the call: a task an upstream created for a
//! `tools/call` taken into the table ([`created`]; the call's plan decided it would be one,
//! `crate::call::plan`), a task the gateway runs for a plain call ([`run_for_call`]), and the
//! client's `tasks/get|result|cancel|list|update` in either form ([`handle`]).
//!
//! - A client only ever sees the gateway's ids; the upstream's go upstream only, on the
//!   connection (epoch) the task was created on.
//! - `tasks/list` is answered from the table, for the asking registration only; it is never
//!   forwarded (an upstream's list shows every caller of a shared connection).
//! - A client's poll within the task's poll interval of the last upstream poll is answered
//!   from the table.
//! - Every task is audited `task_created` once and `task_outcome` exactly once
//!   ([`crate::tasks::settle`]).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::hub::Hub;
use crate::methods::request::{RequestCtx, Served};
use crate::protocol::jsonrpc::{self, RpcError};
use crate::tasks::driver::{spawn_poller, Driver, SETTLED_ASK_GRACE};
use crate::tasks::settle::{ask, cancel_and_settle, cancel_upstream_id, settle};
use crate::tasks::wire::{
    answer, cancelled_error, detailed, is_error, stateless, upstream_request,
};
use crate::tasks::{Final, NewTask, Status, Task, TaskOutcome, TaskSpec};
use crate::telemetry::Target;
use crate::upstream::{Request, TaskOwner};

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
        spec: TaskSpec {
            upstream_id: upstream_id.clone(),
            tool: tool.to_string(),
            internal,
            modern,
            upstream_modern,
            session: ctx.session.as_ref().map(Arc::downgrade),
            progress: progress_route(ctx, epoch, progress, internal, modern.is_some()),
            ttl,
            poll_interval: Duration::from_millis(poll),
        },
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
    let digest = crate::tasks::upstream_digest(&task.spec.upstream_id);
    rec.rare_mut().upstream_task_digest = Some(digest.as_str().into());
    rec.rare_mut().ttl_ms = u64::try_from(ttl.as_millis()).ok();
    let _ = hub.audit().record(rec).await;
    if ctx.registration.is_released() {
        Driver::new(hub, &task).end_on_release().await;
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

/// How long a call a task ran for waits for the task's queued progress before it answers.
const EVENTS_WITHIN: std::time::Duration = std::time::Duration::from_millis(500);

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
        Some(f) => {
            // The task's progress read before its final status is still queued on the slot's
            // events: it reaches the call's stream before the reply (bounded wait).
            let pool = ctx.hub.pool();
            pool.events_handled(&task.upstream, &task.registration, EVENTS_WITHIN)
                .await;
            Some(f)
        }
        None => {
            if !task.is_settled() {
                let why = [
                    "the call was cancelled: cancelled upstream",
                    "the call was cancelled: the upstream did not acknowledge the cancel",
                ];
                let outcome = if task.registration.is_released() {
                    TaskOutcome::CancelledOnRelease
                } else {
                    TaskOutcome::Cancelled
                };
                let err = cancelled_error("its call was cancelled");
                cancel_and_settle(&ctx.hub, task, why, err, outcome).await;
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
        .filter(|t| !t.spec.internal)
        .ok_or_else(|| {
            RpcError::new(
                Some(id.clone()),
                crate::protocol::error::INVALID_PARAMS,
                "unknown task: no task of this registration has that taskId",
            )
            .to_value()
        })
}

/// Handles `tasks/get|result|cancel|list` for a session. `None`: the request was cancelled.
pub async fn handle(ctx: &RequestCtx, req: Served<'_>) -> Option<Value> {
    let Served {
        id,
        method,
        params,
        cancel,
        trace,
    } = req;
    if ctx.session.is_none() {
        return Some(modern(ctx, id, method, params.as_ref()).await);
    }
    if method == "tasks/update" {
        // Not a 2025-11-25 method.
        return Some(RpcError::method_not_found(format!("method not found: {method}")).answer(&id));
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
                Driver::new(hub, &task).refresh(trace).await;
            }
            Some(jsonrpc::success(id, task.view()))
        }
        "tasks/result" => result(ctx, id, &task, cancel, trace).await,
        _ => Some(Driver::new(hub, &task).cancel(id, trace).await),
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
                Driver::new(hub, &task).refresh(None).await;
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
                    crate::protocol::error::INVALID_PARAMS,
                    "invalid params: inputResponses (an object) is required",
                )
                .to_value();
            };
            if task.spec.upstream_modern {
                return Driver::new(hub, &task).update_upstream(id, responses).await;
            }
            for (key, response) in responses {
                // Keys this task does not wait on are ignored (an answer may cross the end).
                if task.take_input(key).is_some() {
                    hub.pool().client_response(
                        &task.registration.id,
                        crate::upstream::STATELESS_SESSION,
                        &Value::String(key.clone()),
                        &crate::mrtr::input::answered(response),
                    );
                }
            }
            task.wake.notify_one();
            jsonrpc::success(id, json!({}))
        }
        _ => {
            if !task.is_settled() {
                let r = Driver::new(hub, &task).cancel(id.clone(), None).await;
                if r.get("error").and_then(|e| e.get("code"))
                    == Some(&json!(crate::protocol::error::INTERNAL_ERROR))
                {
                    return r;
                }
            }
            jsonrpc::success(id, json!({}))
        }
    }
}

fn list(ctx: &RequestCtx, id: Value, params: Option<&Value>) -> Value {
    if let Some(c) = params.and_then(|p| p.get("cursor")) {
        if !c.is_null() && c != "" {
            return RpcError::new(
                Some(id),
                crate::protocol::error::INVALID_PARAMS,
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
        .filter(|t| !t.spec.internal)
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
    if task.spec.upstream_modern {
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
    let request = Request {
        owner: TaskOwner {
            session: ctx.session.clone(),
            notify: None,
        },
        trace: trace.map(|t| (t, Target::None)),
        ..upstream_request(task, "tasks/result", asked.clone())
    };
    let ask = ask(hub, request);
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
    Driver::new(hub, task).take_result(r).await;
    tokio::select! {
        biased;
        () = cancel.cancelled() => None,
        f = task.finished() => Some(f),
    }
}
