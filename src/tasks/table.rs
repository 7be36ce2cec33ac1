//! MCP tasks (2025-11-25 form) owned by the registration that created them: the gateway mints
//! each task's id (`gtask_` + 128 random bits, OS CSPRNG), binds it to the registration and
//! keeps the upstream's id to itself. One table per gateway: by gateway id (lookups scoped by
//! registration: another registration's id and an unknown one are the same miss), by
//! registration (for `tasks/list` and release), and by `(upstream, epoch, upstream id)` (for
//! the upstream's `notifications/tasks/status`).
//!
//! A task record holds what its routes need (registration, upstream, connection epoch,
//! upstream id, tool), its effective TTL and poll interval, the last `Task` object seen (with
//! the gateway's id in it), and once known its final answer (the `tasks/result` reply) and
//! its outcome. The outcome is settled once ([`Task::settle`]: a latch), which also gives back
//! the registration's `max_concurrent` slot the task held while live. What talks to the
//! upstream (polls, cancels, the poller) is `tasks::driver`; this module only keeps the state.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use rand::RngCore;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::registration::RegistrationState;
use crate::sync::{lock, HashMap};

/// The prefix of every gateway task id.
pub const ID_PREFIX: &str = "gtask_";

/// Settled tasks kept per registration, per live task allowed (`max_live_per_registration`).
pub const KEPT_PER_LIVE: usize = 4;

/// Input requests a 2026 task holds pending at once (more are refused upstream).
pub const MAX_INPUTS: usize = 16;

/// The `_meta` key naming the task a message relates to (2025-11-25).
pub const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// A fresh task id: `gtask_` + 128 bits from the OS CSPRNG, base64url.
pub fn mint_id() -> String {
    let mut bytes = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!(
        "{ID_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// What the audit log says of an upstream task id: its SHA-256 in hex (the id itself may be
/// a bearer token at the upstream).
pub fn upstream_digest(upstream_id: &str) -> String {
    hex::encode(Sha256::digest(upstream_id.as_bytes()))
}

/// A task's status (2025-11-25).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Working,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

impl Status {
    pub fn parse(s: &str) -> Option<Status> {
        Some(match s {
            "working" => Status::Working,
            "input_required" => Status::InputRequired,
            "completed" => Status::Completed,
            "failed" => Status::Failed,
            "cancelled" => Status::Cancelled,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Working => "working",
            Status::InputRequired => "input_required",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Completed | Status::Failed | Status::Cancelled)
    }
}

/// Where a task's progress goes after its creating call ended (2025-11-25: the token stays
/// valid until the task ends).
#[derive(Debug)]
pub struct TaskProgress {
    /// The token the gateway sent upstream (`upstream::progress_token`).
    pub upstream_token: String,
    /// The client's token, restored in what it is sent.
    pub client_token: Value,
    pub to: ProgressTo,
}

#[derive(Debug)]
pub enum ProgressTo {
    /// The session that created the task (on its server-to-client stream).
    Session(std::sync::Weak<crate::session::Session>),
    /// The plain call a task runs for (its own stream, as the call's progress went).
    Call(tokio::sync::mpsc::Sender<Value>),
}

/// How a task ended, as audited (`task_outcome`), exactly once per task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskOutcome {
    Completed,
    /// Completed with `isError: true` (2025-11-25 shows it as `failed`).
    ToolError,
    /// Failed with a JSON-RPC error.
    Failed,
    /// Cancelled by its client.
    Cancelled,
    /// Cancelled upstream because its registration was released.
    CancelledOnRelease,
    /// Its TTL ran out while it was live: cancelled upstream.
    Expired,
    /// Its upstream restarted or forgot it.
    Lost,
}

impl TaskOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskOutcome::Completed => "completed",
            TaskOutcome::ToolError => "tool_error",
            TaskOutcome::Failed => "failed",
            TaskOutcome::Cancelled => "cancelled",
            TaskOutcome::CancelledOnRelease => "cancelled_on_release",
            TaskOutcome::Expired => "expired",
            TaskOutcome::Lost => "lost",
        }
    }
}

/// The reply `tasks/result` gives once the task is terminal: the tool's result, or a
/// JSON-RPC error object.
pub type Final = Result<Value, Value>;

/// What a task is made with, kept as it was.
#[derive(Debug)]
pub struct TaskSpec {
    /// The upstream's id: never shown to a client nor written in clear.
    pub upstream_id: String,
    pub tool: String,
    /// Run by the gateway for a client that did not ask for a task (its `tools/call` waits
    /// for the end): never listed nor looked up, and it holds no slot of its own (the call
    /// holds one).
    pub internal: bool,
    /// Handed to a stateless 2026-07-28 client (the `io.modelcontextprotocol/tasks`
    /// extension): the client capabilities its creating request declared
    /// (`ClientCapability::bits_of`), which bound what its `inputRequests` may ask.
    pub modern: Option<u8>,
    /// Its upstream speaks the 2026-07-28 era (the tasks extension): polled with `tasks/get`,
    /// whose answer inlines the outcome; no `tasks/result` upstream.
    pub upstream_modern: bool,
    /// The session that created it (handshake-era clients): where a 2026 upstream's input
    /// requests are asked.
    pub session: Option<std::sync::Weak<crate::session::Session>>,
    pub progress: Option<TaskProgress>,
    pub ttl: Duration,
    pub poll_interval: Duration,
}

/// One task.
#[derive(Debug)]
pub struct Task {
    pub id: String,
    pub registration: Arc<RegistrationState>,
    pub upstream: String,
    /// The upstream connection's epoch when the task was created: a task is only asked about
    /// on that connection (a respawned stdio child does not know it). Moved once to a new
    /// HTTP connection that still knows the task ([`TaskTable::rebind`]).
    epoch: AtomicU64,
    /// The task was probed on a new connection of its HTTP upstream once already, and
    /// whether it was found there (and moved to it).
    pub probed: AtomicBool,
    pub moved: AtomicBool,
    /// What the task was made with (never changes).
    pub spec: TaskSpec,
    /// A 2026 task's upstream `tasks/result` is open (it collects the upstream's side-channel
    /// requests as `inputRequests`): at most one at a time.
    pub asking: AtomicBool,
    /// While `asking`: where the upstream's side-channel requests for the task go.
    inputs_sink: Mutex<Option<tokio::sync::mpsc::Sender<Value>>>,
    pub created: Instant,
    /// Fires when the task is settled, or its registration released: stops its poller.
    pub stop: CancellationToken,
    /// Wakes the poller (a status notification said the task changed).
    pub wake: Notify,
    /// Fires when the table forgets the task (its poller, waiting for the TTL, ends then).
    pub gone: CancellationToken,
    state: Mutex<State>,
    finished: watch::Sender<Option<Arc<Final>>>,
    settled: AtomicBool,
    /// The registration's `max_concurrent` slot (and each ancestor's), held while the task
    /// is live.
    holds_slot: AtomicBool,
    seq: u64,
}

#[derive(Debug)]
struct State {
    /// The last `Task` object seen, with the gateway's id and TTL in it.
    view: Value,
    /// When the upstream was last asked about the task.
    polled: Instant,
    outcome: Option<TaskOutcome>,
    /// A 2026 task's pending input requests (`inputRequests`), by the key the gateway minted
    /// (the id the routing layer gave the upstream's side-channel request).
    inputs: serde_json::Map<String, Value>,
    /// A 2026 upstream's input-request keys, by the key the gateway shows for each (the
    /// upstream's keys may name its task id, which no client sees).
    upstream_keys: HashMap<String, String>,
    /// A 2026 upstream's keys answered already (not parked again while it still lists them).
    answered_keys: Vec<String>,
}

/// What a new task is made of.
pub struct NewTask {
    pub registration: Arc<RegistrationState>,
    pub upstream: String,
    pub epoch: u64,
    pub spec: TaskSpec,
    /// The upstream's `Task` object (its id is replaced here).
    pub view: Value,
}

impl Task {
    /// The epoch of the upstream connection the task lives on.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The last `Task` object seen, as the client sees it.
    pub fn view(&self) -> Value {
        lock(&self.state).view.clone()
    }

    #[cfg(test)]
    pub fn status(&self) -> Option<Status> {
        let st = lock(&self.state);
        st.view
            .get("status")
            .and_then(Value::as_str)
            .and_then(Status::parse)
    }

    /// Whether the upstream was asked about this task within its poll interval (a client's
    /// poll is then answered from the table).
    pub fn polled_lately(&self) -> bool {
        lock(&self.state).polled.elapsed() < self.spec.poll_interval
    }

    /// Takes an upstream `Task` object (its id replaced by ours, its TTL by the effective
    /// one) as the latest view, unless the task is settled already (a settled status sticks).
    /// Returns the status it says.
    pub fn observe(&self, mut upstream_task: Value) -> Option<Status> {
        self.rewrite(&mut upstream_task);
        let mut st = lock(&self.state);
        st.polled = Instant::now();
        if st.outcome.is_none() {
            st.view = upstream_task;
        }
        st.view
            .get("status")
            .and_then(Value::as_str)
            .and_then(Status::parse)
    }

    /// Puts the gateway's id and effective TTL into an upstream `Task` object.
    pub fn rewrite(&self, task: &mut Value) {
        if let Some(m) = task.as_object_mut() {
            m.insert("taskId".into(), Value::String(self.id.clone()));
            m.insert(
                "ttl".into(),
                Value::from(u64::try_from(self.spec.ttl.as_millis()).unwrap_or(u64::MAX)),
            );
            if m.contains_key("pollInterval") || !self.spec.poll_interval.is_zero() {
                m.insert(
                    "pollInterval".into(),
                    Value::from(u64::try_from(self.spec.poll_interval.as_millis()).unwrap_or(0)),
                );
            }
        }
    }

    /// Parks an input request (2026 tasks) under `key`; bounded by `MAX_INPUTS`.
    pub fn park_input(&self, key: String, request: Value) -> bool {
        let mut st = lock(&self.state);
        if st.inputs.len() >= MAX_INPUTS {
            return false;
        }
        st.inputs.insert(key, request);
        true
    }

    /// Parks a 2026 upstream's input request (its key `upstream_key`) under a key the gateway
    /// mints: `Some(that key)` when it is new, `None` when it is parked already or the task
    /// holds `MAX_INPUTS` (`Err` then).
    pub fn park_upstream_input(
        &self,
        upstream_key: &str,
        request: Value,
    ) -> Result<Option<String>, ()> {
        let mut st = lock(&self.state);
        if st.upstream_keys.values().any(|k| k == upstream_key)
            || st.answered_keys.iter().any(|k| k == upstream_key)
        {
            return Ok(None);
        }
        if st.inputs.len() >= MAX_INPUTS {
            return Err(());
        }
        let mut bytes = [0u8; 9];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        let key = format!(
            "input_{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
        );
        st.inputs.insert(key.clone(), request);
        st.upstream_keys
            .insert(key.clone(), upstream_key.to_string());
        Ok(Some(key))
    }

    /// Takes the parked 2026 upstream input request `key`: the upstream's key for it.
    pub fn take_upstream_input(&self, key: &str) -> Option<String> {
        let mut st = lock(&self.state);
        st.inputs.remove(key)?;
        let up = st.upstream_keys.remove(key)?;
        if st.answered_keys.len() < MAX_INPUTS {
            st.answered_keys.push(up.clone());
        }
        Some(up)
    }

    /// Forgets parked 2026 upstream input requests the upstream no longer lists.
    pub fn keep_upstream_inputs(&self, listed: &serde_json::Map<String, Value>) {
        let mut st = lock(&self.state);
        let gone: Vec<String> = st
            .upstream_keys
            .iter()
            .filter(|(_, up)| !listed.contains_key(up.as_str()))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            st.upstream_keys.remove(&k);
            st.inputs.remove(&k);
        }
        st.answered_keys
            .retain(|up| listed.contains_key(up.as_str()));
    }

    /// Sets (or clears) where the upstream's side-channel requests for this task go.
    pub fn set_input_sink(&self, sink: Option<tokio::sync::mpsc::Sender<Value>>) {
        *lock(&self.inputs_sink) = sink;
    }

    /// Where the upstream's side-channel requests for this task go, while one is open.
    pub fn input_sink(&self) -> Option<tokio::sync::mpsc::Sender<Value>> {
        lock(&self.inputs_sink).clone()
    }

    /// The pending input requests (2026 tasks).
    pub fn inputs(&self) -> serde_json::Map<String, Value> {
        lock(&self.state).inputs.clone()
    }

    /// Takes the pending input request `key`, if there is one.
    pub fn take_input(&self, key: &str) -> Option<Value> {
        lock(&self.state).inputs.remove(key)
    }

    /// Whether the outcome is settled.
    pub fn is_settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    pub fn outcome(&self) -> Option<TaskOutcome> {
        lock(&self.state).outcome
    }

    /// Settles the task once: its final status and answer, its outcome. `true` for the one
    /// caller that settled it (and must audit it); the registration's slot is given back and
    /// waiters on [`Task::finished`] are woken.
    pub fn settle(
        &self,
        status: Status,
        message: Option<&str>,
        answer: Final,
        outcome: TaskOutcome,
    ) -> bool {
        if self.settled.swap(true, Ordering::AcqRel) {
            return false;
        }
        {
            let mut st = lock(&self.state);
            st.outcome = Some(outcome);
            st.inputs.clear();
            st.upstream_keys.clear();
            st.answered_keys.clear();
            if let Some(m) = st.view.as_object_mut() {
                m.insert("status".into(), Value::String(status.as_str().into()));
                match message {
                    Some(msg) => {
                        m.insert("statusMessage".into(), Value::String(msg.into()));
                    }
                    None if status == Status::Cancelled => {
                        m.remove("statusMessage");
                    }
                    None => {}
                }
                m.insert(
                    "lastUpdatedAt".into(),
                    Value::String(
                        chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                    ),
                );
            }
        }
        self.give_back_slot();
        self.finished.send_replace(Some(Arc::new(answer)));
        self.stop.cancel();
        true
    }

    fn give_back_slot(&self) {
        if self.holds_slot.swap(false, Ordering::AcqRel) {
            self.registration.give_back_slot();
        }
    }

    /// The final answer, once settled.
    pub fn final_answer(&self) -> Option<Arc<Final>> {
        self.finished.borrow().clone()
    }

    /// Waits for the final answer.
    pub async fn finished(&self) -> Arc<Final> {
        let mut rx = self.finished.subscribe();
        loop {
            if let Some(f) = rx.borrow_and_update().clone() {
                return f;
            }
            if rx.changed().await.is_err() {
                // The sender lives in `self`: not reached while `self` is borrowed.
                std::future::pending::<()>().await;
            }
        }
    }

    /// When the task's TTL runs out.
    pub fn deadline(&self) -> Instant {
        self.created + self.spec.ttl
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.give_back_slot();
    }
}

/// Why a task was not taken into the table.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The registration holds `max_live_per_registration` live tasks already.
    Full(usize),
}

/// The gateway's tasks.
#[derive(Debug, Default)]
pub struct TaskTable {
    inner: Mutex<Inner>,
    seq: AtomicU64,
}

#[derive(Debug, Default)]
struct Inner {
    by_id: HashMap<String, Arc<Task>>,
    /// Registration id → its task ids, in creation order.
    by_registration: HashMap<String, std::collections::BTreeMap<u64, String>>,
    /// (upstream, epoch, upstream task id) → gateway id.
    by_upstream: HashMap<(String, u64, String), String>,
    /// (upstream, the progress token sent upstream) → gateway id.
    by_progress: HashMap<(String, String), String>,
}

impl TaskTable {
    /// Takes a new task: mints its id, holds one of its registration's `max_concurrent`
    /// slots while it is live (the call that created it held one), and indexes it.
    pub fn insert(&self, new: NewTask, max_live: usize) -> Result<Arc<Task>, Refused> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let id = mint_id();
        let mut inner = lock(&self.inner);
        let live = inner
            .by_registration
            .get(&new.registration.id)
            .map(|m| {
                m.values()
                    .filter(|id| inner.by_id.get(*id).is_some_and(|t| !t.is_settled()))
                    .count()
            })
            .unwrap_or(0);
        if live >= max_live {
            return Err(Refused::Full(max_live));
        }
        // Settled tasks are kept (their answers cached) until their TTL; past
        // `KEPT_PER_LIVE × max_live` of them the oldest is forgotten first.
        let kept_cap = max_live.saturating_mul(KEPT_PER_LIVE).max(1);
        while inner
            .by_registration
            .get(&new.registration.id)
            .is_some_and(|m| m.len() >= kept_cap)
        {
            let oldest = inner
                .by_registration
                .get(&new.registration.id)
                .and_then(|m| {
                    m.values()
                        .filter_map(|id| inner.by_id.get(id))
                        .find(|t| t.is_settled())
                        .cloned()
                });
            match oldest {
                Some(t) => Self::forget(&mut inner, &t),
                None => return Err(Refused::Full(max_live)),
            }
        }
        if !new.spec.internal {
            // Its registration's slot and, for a child, each ancestor's (a family shares them).
            new.registration.hold_slot();
        }
        let (finished, _) = watch::channel(None);
        let task = Arc::new(Task {
            id: id.clone(),
            stop: new.registration.cancel.child_token(),
            registration: new.registration,
            upstream: new.upstream,
            epoch: AtomicU64::new(new.epoch),
            probed: AtomicBool::new(false),
            moved: AtomicBool::new(false),
            asking: AtomicBool::new(false),
            inputs_sink: Mutex::new(None),
            created: Instant::now(),
            wake: Notify::new(),
            gone: CancellationToken::new(),
            state: Mutex::new(State {
                view: Value::Null,
                polled: Instant::now(),
                outcome: None,
                inputs: serde_json::Map::new(),
                upstream_keys: HashMap::default(),
                answered_keys: Vec::new(),
            }),
            finished,
            settled: AtomicBool::new(false),
            holds_slot: AtomicBool::new(!new.spec.internal),
            seq,
            spec: new.spec,
        });
        let mut view = new.view;
        task.rewrite(&mut view);
        lock(&task.state).view = view;
        inner.by_id.insert(id.clone(), task.clone());
        inner
            .by_registration
            .entry(task.registration.id.clone())
            .or_default()
            .insert(seq, id.clone());
        if let Some(p) = &task.spec.progress {
            inner.by_progress.insert(
                (task.upstream.clone(), p.upstream_token.clone()),
                id.clone(),
            );
        }
        inner.by_upstream.insert(
            (
                task.upstream.clone(),
                task.epoch(),
                task.spec.upstream_id.clone(),
            ),
            id,
        );
        Ok(task)
    }

    /// The task `id` of `registration_id`; `None` for an unknown id and for another
    /// registration's alike.
    pub fn get(&self, registration_id: &str, id: &str) -> Option<Arc<Task>> {
        lock(&self.inner)
            .by_id
            .get(id)
            .filter(|t| t.registration.id == registration_id)
            .cloned()
    }

    /// A registration's tasks, oldest first.
    pub fn of_registration(&self, registration_id: &str) -> Vec<Arc<Task>> {
        let inner = lock(&self.inner);
        inner
            .by_registration
            .get(registration_id)
            .map(|m| {
                m.values()
                    .filter_map(|id| inner.by_id.get(id).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The live task of `registration_id` whose upstream id is `upstream_id` (a server →
    /// client request related to it names that id).
    pub fn by_upstream_id_of(&self, registration_id: &str, upstream_id: &str) -> Option<Arc<Task>> {
        let inner = lock(&self.inner);
        inner
            .by_registration
            .get(registration_id)?
            .values()
            .filter_map(|id| inner.by_id.get(id))
            .find(|t| t.spec.upstream_id == upstream_id)
            .cloned()
    }

    /// The task an upstream's notification names.
    pub fn by_upstream(&self, upstream: &str, epoch: u64, upstream_id: &str) -> Option<Arc<Task>> {
        let inner = lock(&self.inner);
        let id = inner
            .by_upstream
            .get(&(upstream.to_string(), epoch, upstream_id.to_string()))?;
        inner.by_id.get(id).cloned()
    }

    /// The task whose creating call sent `token` upstream as its progress token.
    pub fn by_progress(&self, upstream: &str, token: &str) -> Option<Arc<Task>> {
        let inner = lock(&self.inner);
        let id = inner
            .by_progress
            .get(&(upstream.to_string(), token.to_string()))?;
        inner.by_id.get(id).cloned()
    }

    /// Moves a task to its upstream's connection of `epoch` (a new HTTP connection that still
    /// knows it): asked about there from now on, and its notifications routed from there.
    pub fn rebind(&self, task: &Task, epoch: u64) {
        let mut inner = lock(&self.inner);
        if !inner.by_id.contains_key(&task.id) {
            return;
        }
        let old = task.epoch.swap(epoch, Ordering::AcqRel);
        let up = task.spec.upstream_id.clone();
        if let Some(id) = inner
            .by_upstream
            .remove(&(task.upstream.clone(), old, up.clone()))
        {
            inner
                .by_upstream
                .insert((task.upstream.clone(), epoch, up), id);
        }
    }

    /// Forgets a task (its TTL ran out, or its registration was released): unknown afterwards.
    pub fn remove(&self, task: &Task) {
        Self::forget(&mut lock(&self.inner), task);
    }

    fn forget(inner: &mut Inner, task: &Task) {
        task.gone.cancel();
        if inner.by_id.remove(&task.id).is_none() {
            return;
        }
        if let Some(m) = inner.by_registration.get_mut(&task.registration.id) {
            m.remove(&task.seq);
            if m.is_empty() {
                inner.by_registration.remove(&task.registration.id);
            }
        }
        inner.by_upstream.remove(&(
            task.upstream.clone(),
            task.epoch(),
            task.spec.upstream_id.clone(),
        ));
        if let Some(p) = &task.spec.progress {
            inner
                .by_progress
                .remove(&(task.upstream.clone(), p.upstream_token.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn registration(id: &str) -> Arc<RegistrationState> {
        let spec = crate::registration::RegistrationSpec::new("agent");
        Arc::new(RegistrationState::new(
            id.into(),
            "t",
            &spec,
            crate::tools::ToolSet::new(vec![]),
        ))
    }

    fn new_task(reg: &Arc<RegistrationState>, up_id: &str) -> NewTask {
        NewTask {
            registration: reg.clone(),
            upstream: "everything".into(),
            epoch: 1,
            spec: TaskSpec {
                upstream_id: up_id.into(),
                tool: "everything.simulate-research-query".into(),
                internal: false,
                modern: None,
                upstream_modern: false,
                session: None,
                progress: None,
                ttl: Duration::from_secs(60),
                poll_interval: Duration::from_secs(1),
            },
            view: json!({"taskId": up_id, "status": "working", "ttl": null}),
        }
    }

    #[tokio::test]
    async fn ids_are_minted_scoped_and_upstream_ids_stay_inside() {
        let table = TaskTable::default();
        let (a, b) = (registration("a"), registration("b"));
        let ta = table.insert(new_task(&a, "up-1"), 8).unwrap();
        assert!(ta.id.starts_with(ID_PREFIX));
        assert_eq!(ta.id.len(), ID_PREFIX.len() + 22, "128 bits, base64url");
        assert_ne!(ta.id, table.insert(new_task(&a, "up-2"), 8).unwrap().id);
        assert_eq!(ta.view()["taskId"], ta.id.as_str());
        assert_eq!(ta.view()["ttl"], 60_000);
        assert!(!ta.view().to_string().contains("up-1"));
        // Another registration's id is the same miss as an unknown one.
        assert!(table.get("b", &ta.id).is_none());
        assert!(table.get("a", "gtask_nope").is_none());
        assert!(table.get("a", &ta.id).is_some());
        assert_eq!(table.of_registration("a").len(), 2);
        assert!(table.of_registration("b").is_empty());
        assert_eq!(
            table.by_upstream("everything", 1, "up-1").unwrap().id,
            ta.id
        );
        assert!(table.by_upstream("everything", 2, "up-1").is_none());
        // A live task holds a slot; settling gives it back, once.
        assert_eq!(a.budget().in_flight(), 2);
        assert!(ta.settle(
            Status::Completed,
            None,
            Ok(json!({})),
            TaskOutcome::Completed
        ));
        assert!(!ta.settle(Status::Failed, None, Ok(json!({})), TaskOutcome::Lost));
        assert_eq!(ta.outcome(), Some(TaskOutcome::Completed));
        assert_eq!(ta.status(), Some(Status::Completed));
        assert_eq!(a.budget().in_flight(), 1);
        // A settled status sticks.
        ta.observe(json!({"taskId": "up-1", "status": "working"}));
        assert_eq!(ta.status(), Some(Status::Completed));
        table.remove(&ta);
        assert!(table.get("a", &ta.id).is_none());
        assert!(table.by_upstream("everything", 1, "up-1").is_none());
        // Settled tasks are kept up to KEPT_PER_LIVE × max_live, the oldest forgotten first.
        let first = table.insert(new_task(&b, "k-0"), 1).unwrap();
        first.settle(
            Status::Completed,
            None,
            Ok(json!({})),
            TaskOutcome::Completed,
        );
        for i in 1..KEPT_PER_LIVE {
            let t = table.insert(new_task(&b, &format!("k-{i}")), 1).unwrap();
            t.settle(
                Status::Completed,
                None,
                Ok(json!({})),
                TaskOutcome::Completed,
            );
        }
        assert_eq!(table.of_registration("b").len(), KEPT_PER_LIVE);
        let _ = table.insert(new_task(&b, "up-3"), 1).unwrap();
        assert_eq!(table.of_registration("b").len(), KEPT_PER_LIVE);
        assert!(
            table.get("b", &first.id).is_none(),
            "the oldest settled one went"
        );
        assert_eq!(
            table.insert(new_task(&b, "up-4"), 1).unwrap_err(),
            Refused::Full(1)
        );
        assert_eq!(upstream_digest("x").len(), 64);
    }
}
