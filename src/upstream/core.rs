//! The request core of one upstream connection, shared by the connection and its transport's
//! background tasks: the pending map (upstream id → waiter), progress-token routing, and the
//! routing of every inbound message (responses, notifications, server → client requests).
//! `stdio` and `http` feed it; `connection` registers requests in it. It owns no task, so a
//! task holding it never keeps a connection alive.

use crate::sync::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::events::{EventSink, Limiter, Refusal, EVENT_BURST, EVENT_RATE_PER_S};
use super::types::Answer;
use super::{IdCounter, LogFilter, NotificationsRefused, RequestTag, UpstreamError, UpstreamEvent};
use crate::protocol::RpcError;
use crate::sync::lock;

/// The connection-unique progress token for upstream request `id`.
pub(crate) fn progress_token(epoch: u64, id: u64) -> String {
    format!("gatehouse-{epoch}-{id}")
}

/// Replaces `params._meta.progressToken` (if present) with the connection's own token and
/// returns how to route progress back.
pub(super) fn rewrite_progress_token(
    params: &mut Value,
    epoch: u64,
    id: u64,
    sink: Option<mpsc::Sender<Value>>,
    as_messages: bool,
) -> Option<ProgressRoute> {
    // Most calls have no `_meta`: found without hashing the key (`jsonrpc::member_mut`).
    let slot =
        crate::protocol::jsonrpc::member_mut(params.as_object_mut()?, crate::protocol::meta::META)
            .and_then(|meta| meta.get_mut(crate::protocol::meta::PROGRESS_TOKEN))?;
    let token = progress_token(epoch, id);
    let original = std::mem::replace(slot, Value::String(token.clone()));
    Some(ProgressRoute {
        token,
        original,
        sink,
        as_messages,
    })
}

pub(super) struct ProgressRoute {
    /// The token we sent upstream.
    token: String,
    /// The caller's token, restored in what we deliver.
    original: Value,
    sink: Option<mpsc::Sender<Value>>,
    /// Delivered as whole `notifications/progress` messages, not bare params.
    as_messages: bool,
}

struct PendingRequest {
    tx: oneshot::Sender<Result<Answer, Value>>,
    /// The waiter wants the result as the upstream wrote it ([`Answer::Raw`]).
    raw: bool,
    progress: Option<ProgressRoute>,
    notifications: Option<mpsc::Sender<Value>>,
    log_filter: Option<LogFilter>,
    tag: Option<RequestTag>,
    /// Its consumer took no notification for the grace (`notify_grace_ms`, [`super::types::NOTIFY_GRACE`] by default): later ones are refused at
    /// once (counted), so one stuck caller holds the reader once, not once per notification.
    stalled: bool,
}

#[derive(Default)]
struct State {
    pending: HashMap<u64, PendingRequest>,
    closed: Option<String>,
}

/// The one pending request that `matches`, if exactly one does.
fn only_pending(state: &State, matches: impl Fn(&PendingRequest) -> bool) -> Option<u64> {
    let mut ids = state
        .pending
        .iter()
        .filter(|(_, p)| matches(p))
        .map(|(id, _)| *id);
    match (ids.next(), ids.next()) {
        (Some(only), None) => Some(only),
        _ => None,
    }
}

/// Transport-independent connection state, shared with the transport's background tasks.
/// It owns no tasks itself, so tasks holding it never keep a connection alive.
pub(crate) struct Core {
    pub(crate) upstream_id: String,
    pub(crate) epoch: u64,
    pub(super) ids: IdCounter,
    state: Mutex<State>,
    pub(super) closed: CancellationToken,
    /// Set with `state.closed`, before `closed` fires: read by every call on the connection
    /// (a token's `is_cancelled` takes its mutex, shared by every call on this upstream).
    is_closed: AtomicBool,
    events: EventSink,
    refused: NotificationsRefused,
    grace: std::time::Duration,
    /// Warnings about responses that answer no pending request (twice-answered, never-sent
    /// or late ids): an upstream that writes them in a loop gets a few lines logged, then a
    /// count every [`super::events::SUMMARY_EVERY`], not a line each.
    stray: Mutex<Limiter>,
}

/// Warnings about stray responses logged per second per connection (burst [`STRAY_BURST`]).
const STRAY_WARNINGS_PER_S: u32 = 10;
const STRAY_BURST: u32 = 50;

impl Core {
    /// Number of requests awaiting a response.
    pub(super) fn pending_len(&self) -> usize {
        lock(&self.state).pending.len()
    }

    pub(super) fn new(
        upstream_id: String,
        epoch: u64,
        ids: IdCounter,
        events: EventSink,
        refused: NotificationsRefused,
        grace: std::time::Duration,
    ) -> Self {
        Self {
            upstream_id,
            epoch,
            ids,
            state: Mutex::new(State::default()),
            closed: CancellationToken::new(),
            is_closed: AtomicBool::new(false),
            events,
            refused,
            grace,
            stray: Mutex::new(Limiter::new(STRAY_WARNINGS_PER_S, STRAY_BURST)),
        }
    }

    pub(super) fn register(
        &self,
        id: u64,
        progress: Option<ProgressRoute>,
        notifications: Option<mpsc::Sender<Value>>,
        log_filter: Option<LogFilter>,
        tag: Option<RequestTag>,
        raw: bool,
    ) -> Result<oneshot::Receiver<Result<Answer, Value>>, UpstreamError> {
        let (tx, rx) = oneshot::channel();
        let mut state = lock(&self.state);
        if let Some(reason) = &state.closed {
            return Err(UpstreamError::Closed(reason.clone()));
        }
        state.pending.insert(
            id,
            PendingRequest {
                tx,
                raw,
                progress,
                notifications,
                log_filter,
                tag,
                stalled: false,
            },
        );
        Ok(rx)
    }

    /// Removes a pending request; returns whether it was still pending.
    pub(super) fn remove(&self, id: u64) -> bool {
        lock(&self.state).pending.remove(&id).is_some()
    }

    /// Whether [`Core::mark_closed`] ran; no lock.
    pub(super) fn is_closed(&self) -> bool {
        self.is_closed.load(Ordering::Acquire)
    }

    pub(super) fn closed_reason(&self) -> Option<String> {
        lock(&self.state).closed.clone()
    }

    pub(super) fn close_reason(&self) -> String {
        self.closed_reason()
            .unwrap_or_else(|| "connection closed".to_owned())
    }

    /// Marks the connection closed (first caller wins): fails every pending request at once and
    /// emits [`UpstreamEvent::Closed`].
    pub(crate) fn mark_closed(&self, reason: String) {
        let drained = {
            let mut state = lock(&self.state);
            if state.closed.is_some() {
                return;
            }
            state.closed = Some(reason.clone());
            self.is_closed.store(true, Ordering::Release);
            std::mem::take(&mut state.pending)
        };
        let failed = drained.len();
        // Dropping the senders wakes every waiter with `Closed`.
        drop(drained);
        self.closed.cancel();
        tracing::info!(upstream = %self.upstream_id, epoch = self.epoch, failed_pending = failed, %reason, "upstream connection closed");
        self.events.closed(self.epoch, reason);
    }

    /// Routes one inbound JSON-RPC message. Returns a message to send back upstream, if any
    /// (the answer to a server `ping`).
    ///
    /// `related_hint` is the request whose response stream carried the message (HTTP), if known.
    ///
    /// A call's progress and logs are handed to its channel with `send().await`: when the
    /// caller is slower than the upstream, the reader waits (backpressure) — at most
    /// the grace (`notify_grace_ms`, [`super::types::NOTIFY_GRACE`] by default) per call, after which that call's notifications are refused and
    /// counted. Nothing is dropped silently; order is the upstream's.
    pub(crate) async fn dispatch(&self, msg: Value, related_hint: Option<u64>) -> Option<Value> {
        let Value::Object(mut obj) = msg else {
            tracing::warn!(upstream = %self.upstream_id, "ignoring non-object JSON-RPC message from upstream");
            return None;
        };
        let method = match obj.remove("method") {
            Some(Value::String(method)) => Some(method),
            Some(_) => {
                tracing::warn!(upstream = %self.upstream_id, "ignoring message with a non-string method");
                return None;
            }
            None => None,
        };
        let id = obj.remove("id").filter(|id| !id.is_null());
        let params = obj.remove("params");
        match (method, id) {
            (Some(method), Some(id)) => self.on_server_request(id, method, params, related_hint),
            (Some(method), None) => {
                self.on_notification(method, params, related_hint).await;
                None
            }
            (None, Some(id)) => {
                self.on_response(id, obj);
                None
            }
            (None, None) => {
                if let Some(error) = obj.get("error") {
                    tracing::warn!(upstream = %self.upstream_id, %error, "upstream sent an error without id");
                } else {
                    tracing::warn!(upstream = %self.upstream_id, "ignoring message that is neither request, notification nor response");
                }
                None
            }
        }
    }

    fn on_response(&self, id: Value, mut obj: Map<String, Value>) {
        let outcome = if let Some(error) = obj.remove("error") {
            Err(error)
        } else if let Some(result) = obj.remove("result") {
            Ok(result)
        } else {
            tracing::warn!(upstream = %self.upstream_id, %id, "ignoring response without result or error");
            return;
        };
        if let Some(pending) = self.answered(id.as_u64(), &id) {
            // The waiter may be gone already (it raced with cancel); nothing to do then.
            let _ = pending.tx.send(outcome.map(Answer::Parsed));
        }
    }

    /// The pending request a response answers (removed), or `None`, logged, when there is
    /// none: late, cancelled, from another epoch, or an id that is not one of ours.
    fn answered(&self, id: Option<u64>, shown: &dyn std::fmt::Display) -> Option<PendingRequest> {
        let pending = id.and_then(|id| lock(&self.state).pending.remove(&id));
        if pending.is_none() && self.may_warn_stray() {
            tracing::warn!(upstream = %self.upstream_id, epoch = self.epoch, id = %shown, "dropping response for unknown upstream request id (answered twice, never sent, late, cancelled or from another epoch)");
        }
        pending
    }

    /// Whether one more stray-response warning may be logged now; says when they start being
    /// counted instead, and sums the counted ones up.
    fn may_warn_stray(&self) -> bool {
        let now = tokio::time::Instant::now();
        let mut limiter = lock(&self.stray);
        if let Some(n) = limiter.summary(now, false) {
            tracing::warn!(upstream = %self.upstream_id, skipped = n, "responses for unknown upstream request ids dropped and not logged since the last summary");
        }
        if limiter.admit(now) {
            return true;
        }
        if let Refusal::Started = limiter.refuse(now) {
            tracing::warn!(upstream = %self.upstream_id, "too many responses for unknown upstream request ids: further ones are dropped and counted, not logged");
        }
        false
    }

    /// An over-long response line for pending request `id` (its id read from the line's
    /// start, the rest skipped unread): the waiter gets an error at once rather than waiting
    /// out its timeout. False when no request with that id is pending.
    pub(crate) fn on_oversized(&self, id: u64, max: usize) -> bool {
        let Some(pending) = lock(&self.state).pending.remove(&id) else {
            return false;
        };
        let error = RpcError::internal(format!("the upstream's response is larger than {max} bytes (the gateway's line limit); it was skipped")).object();
        let _ = pending.tx.send(Err(error));
        true
    }

    /// A response with a result read without parsing the result (the stdio reader's common
    /// line, `stdio::ResultLine`): a raw waiter gets the text as it is, others the parsed
    /// value. Same routing as [`Core::dispatch`] gives a response.
    pub(crate) fn on_result(&self, id: u64, result: &serde_json::value::RawValue) {
        let Some(pending) = self.answered(Some(id), &id) else {
            return;
        };
        // The text is valid JSON: a waiter that wants it parsed gets it parsed.
        let parsed = (!pending.raw)
            .then(|| serde_json::from_str(result.get()).ok())
            .flatten();
        let answer = parsed.map_or_else(|| Answer::Raw(result.to_owned()), Answer::Parsed);
        // The waiter may be gone already (it raced with cancel); nothing to do then.
        let _ = pending.tx.send(Ok(answer));
    }

    /// Hands one notification of pending request `id` to its channel (see [`Core::dispatch`]).
    async fn deliver(&self, id: u64, sink: mpsc::Sender<Value>, msg: Value) {
        match tokio::time::timeout(self.grace, sink.send(msg)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                // The call ended between the lookup and the send.
                self.refused.inc();
                tracing::debug!(upstream = %self.upstream_id, jsonrpc.id = id, "call ended; notification not delivered (counted)");
            }
            Err(_) => {
                self.refused.inc();
                if let Some(p) = lock(&self.state).pending.get_mut(&id) {
                    p.stalled = true;
                }
                tracing::warn!(upstream = %self.upstream_id, jsonrpc.id = id, grace_ms = self.grace.as_millis(), "caller took no notification within the grace; refusing this call's notifications (counted)");
            }
        }
    }

    async fn on_notification(
        &self,
        method: String,
        params: Option<Value>,
        related_hint: Option<u64>,
    ) {
        if method == "notifications/subscriptions/acknowledged" {
            // The first message of a `subscriptions/listen` stream (`upstream::subscriptions`).
            return;
        }
        if method == "notifications/progress" {
            if let Some(params) = params {
                self.on_progress(params).await;
            }
            return;
        }
        if method == "notifications/message" {
            // A log belongs to the request it can be attributed to (HTTP: the POST stream that
            // carried it; stdio: the only pending request), and goes to that request's sink.
            let sink = {
                let state = lock(&self.state);
                // stdio: the only pending request with a sink (the gateway's own requests,
                // such as a catalog refresh, have none and own no client-visible log).
                let related =
                    related_hint.or_else(|| only_pending(&state, |p| p.notifications.is_some()));
                related.and_then(|id| {
                    let p = state.pending.get(&id)?;
                    Some((
                        id,
                        p.notifications.clone()?,
                        p.stalled,
                        p.log_filter.clone(),
                    ))
                })
            };
            if let Some((id, sink, stalled, filter)) = sink {
                if let Some(LogFilter(wants)) = filter {
                    let level = params
                        .as_ref()
                        .and_then(|p| p.get("level"))
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    if !wants(level) {
                        return;
                    }
                }
                let mut msg = Map::new();
                msg.insert("jsonrpc".into(), Value::String("2.0".into()));
                msg.insert("method".into(), Value::String(method));
                if let Some(p) = params {
                    msg.insert("params".into(), p);
                }
                if stalled {
                    self.refused.inc();
                } else {
                    self.deliver(id, sink, Value::Object(msg)).await;
                }
                return;
            }
        }
        // Rate-limited and bounded; a refusal is counted (events.rs).
        self.events.notify(UpstreamEvent::Notification {
            epoch: self.epoch,
            method,
            params,
        });
    }

    async fn on_progress(&self, mut params: Value) {
        let Some(token) = params
            .get(crate::protocol::meta::PROGRESS_TOKEN)
            .and_then(Value::as_str)
        else {
            tracing::debug!(upstream = %self.upstream_id, "dropping progress with a token we never issued");
            return;
        };
        let Some(id) = token
            .rsplit_once('-')
            .and_then(|(_, id)| id.parse::<u64>().ok())
        else {
            tracing::debug!(upstream = %self.upstream_id, token, "dropping progress with a token we never issued");
            return;
        };
        let route = {
            let state = lock(&self.state);
            state.pending.get(&id).and_then(|pending| {
                let route = pending.progress.as_ref().filter(|r| r.token == token)?;
                Some((
                    route.original.clone(),
                    route.sink.clone(),
                    route.as_messages,
                    pending.stalled,
                ))
            })
        };
        let Some((original, sink, as_messages, stalled)) = route else {
            // The request ended (a task's creating call): the task table may still route it
            // (`Downstream::task_progress`), its token as the upstream has it.
            tracing::debug!(upstream = %self.upstream_id, token, "progress for a request that is no longer pending: to the task table");
            self.events.notify(UpstreamEvent::Progress {
                epoch: self.epoch,
                upstream_request_id: id,
                params,
            });
            return;
        };
        if let Some(slot) = params.get_mut(crate::protocol::meta::PROGRESS_TOKEN) {
            *slot = original;
        }
        match sink {
            Some(_) if stalled => self.refused.inc(),
            Some(sink) if as_messages => {
                let msg = json!({
                    "jsonrpc": "2.0",
                    "method": "notifications/progress",
                    "params": params,
                });
                self.deliver(id, sink, msg).await
            }
            Some(sink) => self.deliver(id, sink, params).await,
            None => {
                self.events.notify(UpstreamEvent::Progress {
                    epoch: self.epoch,
                    upstream_request_id: id,
                    params,
                });
            }
        }
    }

    fn on_server_request(
        &self,
        id: Value,
        method: String,
        params: Option<Value>,
        related_hint: Option<u64>,
    ) -> Option<Value> {
        if method == "ping" {
            return Some(json!({ "jsonrpc": "2.0", "id": id, "result": {} }));
        }
        let (related_request, related_tag) = {
            let state = lock(&self.state);
            // stdio: the only pending request made for a client (it carries its owner's tag);
            // the gateway's own requests (a catalog refresh racing the call) cannot have asked.
            let related = related_hint.or_else(|| only_pending(&state, |p| p.tag.is_some()));
            let tag = related
                .and_then(|r| state.pending.get(&r))
                .and_then(|p| p.tag.clone());
            (related, tag)
        };
        let answer_to = id.clone();
        let refused = self.events.request(UpstreamEvent::Request {
            epoch: self.epoch,
            id,
            method,
            params,
            related_request,
            related_tag,
        });
        // A request the gateway cannot queue is answered at once: the server never waits.
        refused.err().map(|why| {
            RpcError::internal(format!("gatehouse: server request refused: {why} (at most {EVENT_RATE_PER_S}/s, burst {EVENT_BURST})"))
                .to(answer_to)
                .to_value()
        })
    }
}
