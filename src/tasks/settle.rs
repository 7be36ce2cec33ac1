//! The one settle path of a task: whoever sees its end first (a client's poll or
//! `tasks/result`, the poller, a cancel, release, the TTL) settles it here and writes its
//! `task_outcome` record, exactly once (the task's settle latch); the listen streams that
//! named it are told. Also the gateway's own `tasks/cancel` of an upstream task, and
//! [`ask`], the one way a task's request goes upstream.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::wire::{cancelled_error, detailed};
use crate::hub::Hub;
use crate::protocol::jsonrpc;
use crate::tasks::{Final, Status, Task, TaskOutcome, RELATED_TASK};
use crate::upstream::{ForwardError, On, Request};

/// How long a cancel sent on the gateway's behalf (release, TTL) may take.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

/// A task's request upstream ([`crate::upstream::Pool::send`]); `Ok(None)`: the connection
/// it names is not the live one.
pub(crate) async fn ask(
    hub: &Hub,
    request: Request<'_>,
) -> Result<Option<Result<Value, Value>>, ForwardError> {
    Ok(hub.pool().send(request).await?.map(|(_, answer)| answer))
}

/// The task's upstream restarted or forgot it: `failed`, audited `lost`.
pub(crate) async fn lose(hub: &Arc<Hub>, task: &Arc<Task>, why: &str) {
    let err = crate::protocol::error::RpcError::new(
        None,
        crate::protocol::error::INTERNAL_ERROR,
        format!("task lost: {why}"),
    )
    .object();
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
pub(crate) async fn settle(
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
    rec.tool = Some(task.spec.tool.as_str().into());
    rec.upstream = Some(task.upstream.as_str().into());
    rec.epoch = Some(task.epoch());
    rec.rare_mut().task_id = Some(task.id.as_str().into());
    let digest = crate::tasks::upstream_digest(&task.spec.upstream_id);
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
pub(crate) fn tell_listeners(hub: &Hub, task: &Task) {
    if task.spec.internal {
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
pub(crate) fn observe_told(hub: &Hub, task: &Task, view: Value) -> Option<Status> {
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
pub(crate) async fn cancel_upstream_id(
    hub: &Hub,
    reg: &Arc<crate::registration::RegistrationState>,
    upstream: &str,
    epoch: u64,
    upstream_id: &str,
) -> bool {
    let mut p = Map::new();
    p.insert("taskId".into(), Value::String(upstream_id.to_string()));
    let cancel = CancellationToken::new();
    let request = Request {
        timeout: Some(CANCEL_TIMEOUT),
        ..Request::new(reg, upstream, "tasks/cancel", p, cancel, On::Epoch(epoch))
    };
    let fwd = ask(hub, request);
    matches!(
        tokio::time::timeout(CANCEL_TIMEOUT, fwd).await,
        Ok(Ok(Some(Ok(_))))
    )
}

/// Cancels a live task upstream on the gateway's behalf and settles it `cancelled` (`err`,
/// `outcome`); the record's reason says whether the upstream acknowledged the cancel.
pub(crate) async fn cancel_and_settle(
    hub: &Arc<Hub>,
    task: &Arc<Task>,
    [acked, unacked]: [&str; 2],
    err: Value,
    outcome: TaskOutcome,
) {
    let ok = cancel_upstream_id(
        hub,
        &task.registration,
        &task.upstream,
        task.epoch(),
        &task.spec.upstream_id,
    )
    .await;
    let why = if ok { acked } else { unacked };
    settle(
        hub,
        task,
        Status::Cancelled,
        Some(why),
        Err(err),
        outcome,
        None,
    )
    .await;
}

/// Settles a task `cancelled` (`why` in its error); whether this call settled it.
pub(crate) async fn settle_cancelled(hub: &Arc<Hub>, task: &Arc<Task>, why: &str) -> bool {
    let err = Err(cancelled_error(why));
    settle(
        hub,
        task,
        Status::Cancelled,
        None,
        err,
        TaskOutcome::Cancelled,
        None,
    )
    .await
}
