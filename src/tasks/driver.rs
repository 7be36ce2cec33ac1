//! A live task's driver: what moves it from one status to the next, on the connection it
//! was created on. Its background poller (one per live task, on its registration's tracker:
//! it ends with the registration) polls the upstream until the task is settled, so a task
//! nobody polls still gets its outcome; the TTL cancels a live task; a client's poll,
//! `tasks/cancel` and the answers to its input requests go through the same steps; a task
//! whose connection ended is probed once on its HTTP upstream's next connection. Every end
//! goes through [`super::settle`].

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::settle::{
    ask, cancel_and_settle, lose, observe_told, settle, settle_cancelled, tell_listeners,
};
use super::wire::{cancelled_error, from_modern, is_error, upstream_request};
use crate::hub::Hub;
use crate::protocol::jsonrpc::{self, RpcError};
use crate::registration::RegistrationState;
use crate::tasks::{Status, Task, TaskOutcome, RELATED_TASK};
use crate::telemetry::Target;
use crate::upstream::{On, Request};

/// The poller never asks an upstream about one task more often than this.
const POLL_FLOOR: Duration = Duration::from_millis(100);

/// How long an upstream `tasks/result` still open when its task settled otherwise is given to
/// answer before it is abandoned.
pub(crate) const SETTLED_ASK_GRACE: Duration = Duration::from_secs(2);

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
    let undeclared = crate::mrtr::input::undeclared(&method, declared);
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
    let parked = undeclared.is_none() && {
        let request = crate::mrtr::input::request(Value::String(method.clone()), Some(params));
        task.park_input(key.clone(), request)
    };
    if !parked {
        let why = undeclared.unwrap_or_else(|| {
            format!("{method} refused: the task holds too many unanswered input requests")
        });
        hub.pool().client_response(
            &task.registration.id,
            crate::upstream::STATELESS_SESSION,
            &Value::String(key),
            &crate::hub::refusal_body(&why),
        );
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
    futures::future::join_all(tasks.iter().map(|t| Driver::new(hub, t).end_on_release())).await;
}

/// A task's background poller, on its registration's tracker (it ends with the registration):
/// polls the upstream every poll interval (sooner when a status notification wakes it) until
/// the task is settled, so a task nobody polls still gets its outcome; at the TTL a live task
/// is cancelled upstream (audited `expired`); a settled one is kept (its answer cached) until
/// the TTL, then forgotten.
pub(crate) fn spawn_poller(hub: Arc<Hub>, task: Arc<Task>) {
    let reg = task.registration.clone();
    reg.calls.spawn(async move {
        let every = task
            .spec
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
                    Driver::new(&hub, &task).expire().await;
                    return;
                }
                () = task.wake.notified() => {}
                () = tokio::time::sleep(every) => {}
            }
            if !task.is_settled() {
                Driver::new(&hub, &task).refresh(None).await;
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

/// A live task's driver: the task and the hub it reaches its upstream through. What moves a
/// task from one status to the next is a method here, whoever asks (its poller, a client's
/// poll, `tasks/result` or `tasks/cancel`, release, the TTL).
#[derive(Clone, Copy)]
pub(crate) struct Driver<'a> {
    pub hub: &'a Arc<Hub>,
    pub task: &'a Arc<Task>,
}

impl<'a> Driver<'a> {
    pub(crate) fn new(hub: &'a Arc<Hub>, task: &'a Arc<Task>) -> Self {
        Self { hub, task }
    }

    /// A 2026 client's `tasks/update` of a task whose upstream speaks the 2026-07-28 era: the
    /// responses to the requests it is waiting on go upstream (`tasks/update`, the upstream's id),
    /// the others are dropped (an answer may cross the end); acknowledged empty.
    pub(crate) async fn update_upstream(self, id: Value, responses: &Map<String, Value>) -> Value {
        let Driver { task, .. } = self;
        let mut answered = Map::new();
        for (key, response) in responses {
            if let Some(up_key) = task.take_upstream_input(key) {
                answered.insert(up_key, response.clone());
            }
        }
        match self.send_inputs(answered).await {
            None => {
                task.wake.notify_one();
                jsonrpc::success(id, json!({}))
            }
            Some(Err(e)) => {
                crate::protocol::error::RpcError::from_peer_or(&e, "tasks/update refused upstream")
                    .to(id)
                    .to_value()
            }
            Some(Ok(why)) => {
                RpcError::new(Some(id), crate::protocol::error::INTERNAL_ERROR, why).to_value()
            }
        }
    }

    /// `tasks/update {inputResponses}` upstream (nothing when empty). `Some(Err(error))`: the
    /// upstream refused it; `Some(Ok(why))`: it could not be reached.
    async fn send_inputs(self, answered: Map<String, Value>) -> Option<Result<String, Value>> {
        let Driver { hub, task } = self;
        if answered.is_empty() {
            return None;
        }
        let mut request = upstream_request(task, "tasks/update", task.stop.clone());
        let inputs = Value::Object(answered);
        request.params.insert("inputResponses".into(), inputs);
        let r = ask(hub, request).await;
        match r {
            Ok(Some(Ok(_))) => None,
            Ok(Some(Err(e))) => Some(Err(e)),
            Ok(None) => {
                self.lost_or_rebound().await;
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
    fn ask_session(self, key: String, request: Value) {
        let Driver { hub, task } = self;
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
            .spec.session
            .as_ref()
            .and_then(std::sync::Weak::upgrade)
            .filter(|s| !s.cancel.is_cancelled());
        let allowed = crate::protocol::ClientCapability::for_method(&method);
        let answer = match (session, allowed) {
            (Some(s), Some(cap)) if s.declares(cap) => {
                if let Some(m) = params.as_object_mut() {
                    let meta = m.entry("_meta").or_insert_with(|| json!({}));
                    if let Some(meta) = meta.as_object_mut() {
                        // The upstream's id, as an upstream's own request would name it: the
                        // delivery names the gateway's instead (`Hub::related_task_to_client`).
                        meta.insert(RELATED_TASK.into(), json!({"taskId": task.spec.upstream_id}));
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
        if let Some(e) = Driver::new(&hub, &task).send_inputs(answered).await {
            tracing::debug!(task = %task.id, error = ?e, "tasks/update refused upstream");
        }
        task.wake.notify_one();
    });
    }

    /// Takes the answer of the upstream's blocking `tasks/result` (asked by [`wait_final`] or
    /// [`ask_inputs`]): settles the task, or leaves it to the poller.
    pub(crate) async fn take_result(
        self,
        r: Result<Option<Result<Value, Value>>, crate::upstream::ForwardError>,
    ) {
        let Driver { hub, task } = self;
        match r {
            Ok(Some(Ok(result))) => {
                if result.get("content").is_none() && !is_error(&result) {
                    // Not a tool result (the Python SDK 1.x answers a failed task's
                    // `tasks/result` with `_meta` only): its status says how it ended.
                    self.refresh(None).await;
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
                if code == Some(crate::protocol::error::INVALID_PARAMS) {
                    // The upstream no longer knows it (or it was cancelled meanwhile).
                    self.refresh(None).await;
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
            Ok(None) => self.lost_or_rebound().await,
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
    fn ask_inputs(self) {
        let Driver { hub, task } = self;
        if task.asking.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        let (hub, task) = (hub.clone(), task.clone());
        let reg = task.registration.clone();
        reg.calls.spawn(async move {
            let declared = task.spec.modern.unwrap_or(0);
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Value>(crate::tasks::MAX_INPUTS);
            task.set_input_sink(Some(tx.clone()));
            let to = crate::upstream::TaskOwner {
                session: None,
                notify: Some(tx),
            };
            let cancel = task.registration.cancel.child_token();
            let request = Request {
                owner: to,
                ..upstream_request(&task, "tasks/result", cancel)
            };
            let asked = ask(&hub, request);
            tokio::pin!(asked);
            let r = loop {
                tokio::select! {
                    r = &mut asked => break Some(r),
                    Some(msg) = rx.recv() => park(&hub, &task, declared, msg),
                    () = task.stop.cancelled() => {
                        // Settled otherwise: given a moment rather than abandoned (as in
                        // `wait_final`).
                        let _ = tokio::time::timeout(SETTLED_ASK_GRACE, &mut asked).await;
                        break None;
                    }
                }
            };
            task.set_input_sink(None);
            if let Some(r) = r {
                Driver::new(&hub, &task).take_result(r).await;
            }
            task.asking
                .store(false, std::sync::atomic::Ordering::Release);
        });
    }

    pub(crate) async fn cancel(
        self,
        id: Value,
        trace: Option<&crate::telemetry::CallTrace>,
    ) -> Value {
        let Driver { hub, task } = self;
        let terminal = || {
            RpcError::new(
                Some(id.clone()),
                crate::protocol::error::INVALID_PARAMS,
                "task is already terminal: it cannot be cancelled",
            )
            .to_value()
        };
        if task.is_settled() {
            return terminal();
        }
        let request = Request {
            trace: trace.map(|t| (t, Target::None)),
            ..upstream_request(task, "tasks/cancel", task.stop.clone())
        };
        let r = ask(hub, request).await;
        match r {
            Ok(Some(Ok(t))) => {
                if !task.spec.upstream_modern {
                    // 2026-07-28: an empty acknowledgement, not the task.
                    task.observe(t);
                }
                let won = settle_cancelled(hub, task, "cancelled by its client").await;
                if won || task.outcome() == Some(TaskOutcome::Cancelled) {
                    jsonrpc::success(id, task.view())
                } else {
                    terminal()
                }
            }
            Ok(Some(Err(_))) => {
                // Terminal upstream already (or forgotten): see which, then refuse.
                self.refresh(trace).await;
                terminal()
            }
            Ok(None) => match self.rebound().await {
                // Its HTTP upstream reconnected and still knows it: cancelled there.
                Probe::Moved => Box::pin(self.cancel(id, trace)).await,
                Probe::Later => RpcError::new(
                    Some(id),
                    crate::protocol::error::INTERNAL_ERROR,
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
                crate::protocol::error::INTERNAL_ERROR,
                format!("the task's upstream could not be reached: {e}"),
            )
            .to_value(),
        }
    }

    /// Asks the upstream about a live task (`tasks/get`) and takes the answer; at a terminal
    /// status reads its result once (`tasks/result`, which answers at once then) and settles it.
    /// `trace`: the SERVER span of the client's request that asked (none for the poller).
    pub(crate) async fn refresh(self, trace: Option<&crate::telemetry::CallTrace>) {
        let Driver { hub, task } = self;
        let request = Request {
            trace: trace.map(|t| (t, Target::None)),
            ..upstream_request(task, "tasks/get", task.stop.clone())
        };
        let r = ask(hub, request).await;
        match r {
            Ok(Some(Ok(t))) if task.spec.upstream_modern => self.settle_modern(t).await,
            Ok(Some(Ok(t))) => match observe_told(hub, task, t) {
                Some(s) if s.is_terminal() && !task.is_settled() => self.settle_terminal(s).await,
                Some(Status::InputRequired) if task.spec.modern.is_some() => self.ask_inputs(),
                _ => {}
            },
            Ok(Some(Err(e)))
                if e.get("code").and_then(Value::as_i64)
                    == Some(crate::protocol::error::INVALID_PARAMS) =>
            {
                lose(hub, task, "the upstream no longer knows the task").await
            }
            Ok(None) => self.lost_or_rebound().await,
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
    async fn settle_modern(self, t: Value) {
        let Driver { hub, task } = self;
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
                    crate::protocol::error::RpcError::new(
                        None,
                        crate::protocol::error::INTERNAL_ERROR,
                        format!("task failed: {why}"),
                    )
                    .object()
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
                settle_cancelled(hub, task, "cancelled upstream").await;
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
                        Ok(Some(key)) if task.spec.modern.is_none() => {
                            self.ask_session(key, request.clone());
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
        if !task.is_settled()
            && before.as_ref().and_then(Value::as_str) != status.map(Status::as_str)
        {
            tell_listeners(hub, task);
        }
    }

    async fn settle_terminal(self, status: Status) {
        let Driver { hub, task } = self;
        if status == Status::Cancelled {
            settle_cancelled(hub, task, "cancelled upstream").await;
            return;
        }
        // Not the task's `stop`: the task is terminal upstream, so this answers at once; were it
        // cancelled when another sighting settles the task first, the upstream would be sent
        // `notifications/cancelled` for a blocking `tasks/result`, which ends a Python SDK 1.x
        // server (tests/fixtures/task_server.py showed it).
        let request = upstream_request(task, "tasks/result", CancellationToken::new());
        let r = ask(hub, request).await;
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
                let err = crate::protocol::error::RpcError::new(
                    None,
                    crate::protocol::error::INTERNAL_ERROR,
                    format!("task failed: {why}"),
                )
                .object();
                let code = Some(crate::protocol::error::INTERNAL_ERROR);
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
            Ok(None) => self.lost_or_rebound().await,
            Err(e) => {
                tracing::debug!(task = %task.id, error = %e, "the result of a finished task could not be read; asked again later")
            }
        }
    }

    /// The task's connection ended: [`rebound`] to its HTTP upstream's new connection, left for
    /// the poller while that connection cannot be made, or lost.
    async fn lost_or_rebound(self) {
        let Driver { hub, task } = self;
        match self.rebound().await {
            Probe::Moved | Probe::Later => {}
            Probe::Unknown => lose(hub, task, UNKNOWN_AFTER_RECONNECT).await,
            Probe::Gone => lose(hub, task, "upstream restarted").await,
        }
    }

    /// A task whose connection ended, on an HTTP upstream: probed once on the upstream's next
    /// connection (`tasks/get`). Known there (servers whose task ids are bearer tokens), it is
    /// moved to that connection and the answer taken; unknown (session-scoped servers), or a
    /// stdio upstream (a respawned child never knows the tasks of the one before), it is gone.
    async fn rebound(self) -> Probe {
        let Driver { hub, task } = self;
        use std::sync::atomic::Ordering;
        if task.moved.load(Ordering::Acquire) {
            // Another sighting moved it while this one's request was on the old connection.
            return Probe::Moved;
        }
        if task.probed.load(Ordering::Acquire) || task.is_settled() {
            return Probe::Gone;
        }
        let request = Request {
            on: On::Reconnected,
            ..upstream_request(task, "tasks/get", task.stop.clone())
        };
        let probe = hub.pool().send(request);
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
        if task.spec.upstream_modern {
            Box::pin(self.settle_modern(t)).await;
        } else if let Some(s) = observe_told(hub, task, t) {
            if s.is_terminal() && !task.is_settled() {
                Box::pin(self.settle_terminal(s)).await;
            }
        }
        Probe::Moved
    }

    /// A task whose registration was released: cancelled upstream, audited
    /// `cancelled_on_release`, forgotten.
    pub(crate) async fn end_on_release(self) {
        let Driver { hub, task } = self;
        if !task.is_settled() {
            let why = [
                "registration released: cancelled upstream",
                "registration released: the upstream did not acknowledge the cancel",
            ];
            let err = cancelled_error("registration released");
            cancel_and_settle(hub, task, why, err, TaskOutcome::CancelledOnRelease).await;
        }
        hub.tasks().remove(task);
    }

    /// The TTL ran out: a live task is cancelled upstream and audited `expired`; then forgotten.
    async fn expire(self) {
        let Driver { hub, task } = self;
        if !task.is_settled() {
            let why = ["the task's TTL ran out"; 2];
            let err = crate::protocol::error::RpcError::new(
                None,
                crate::protocol::error::INVALID_PARAMS,
                "task expired",
            )
            .object();
            cancel_and_settle(hub, task, why, err, TaskOutcome::Expired).await;
        }
        hub.tasks().remove(task);
    }
}
