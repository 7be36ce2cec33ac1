//! The session table: every MCP session of every registration, on every transport.
//!
//! Each session's state lives in one `Session` value owned by the table. There is one close
//! path (`SessionTable::close`), used by stream end, DELETE, release, the reaper and shutdown.
//! Invariant: lookups are scoped by registration; a session id minted under registration A
//! never resolves under B.

use crate::sync::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::SessionConfig;
use crate::protocol::jsonrpc::{IdKey, Reply};
use crate::protocol::{log_level_index, ClientCapability};
use crate::registration::{random_b64, RegistrationState};
use crate::sync::lock;

/// The downstream transport a session or request arrived on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Legacy HTTP+SSE (2024-11-05).
    Sse,
    /// Streamable HTTP with `Mcp-Session-Id` (2025-03-26 … 2025-11-25).
    StreamableHttp,
    /// Stateless Streamable HTTP (2026-07-28).
    Stateless,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Sse => "sse",
            Transport::StreamableHttp => "streamable_http",
            Transport::Stateless => "stateless",
        }
    }
}

/// Why a session could not be created.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("too many sessions: the gateway holds its maximum of {0}")]
    GlobalCap(usize),
    #[error("too many sessions for this registration (maximum {0})")]
    RegistrationCap(usize),
}

/// One message queued for a session's stream: the whole `message` event, its compact JSON
/// encoded once, here, in its framing (the stream writes these bytes as they are), and the
/// share of the session's byte budget it holds until the stream takes it.
pub struct Queued {
    event: Bytes,
    _bytes: OwnedSemaphorePermit,
}

/// A message that found no room in its session's queue: the queue, the message's share of
/// the byte budget, and the message (with its share already held, when only the queue's
/// slots were full).
struct Waiting {
    out: Outbound,
    share: u32,
    queued: Result<Queued, Bytes>,
}

/// What frames a queued message: compact JSON holds no line break (control characters in
/// strings are escaped), so it is one `data:` line.
const EVENT_HEAD: &[u8] = b"event: message\ndata: ";
const EVENT_TAIL: &[u8] = b"\n\n";

/// A response as a `message` event, its JSON encoded once, in place.
pub fn message_event(msg: &Reply) -> Vec<u8> {
    let mut event = Vec::with_capacity(256);
    event.extend_from_slice(EVENT_HEAD);
    msg.write_json(&mut event);
    event.extend_from_slice(EVENT_TAIL);
    event
}

impl Queued {
    /// The event's bytes; its share of the byte budget is freed.
    pub fn into_event(self) -> Bytes {
        self.event
    }
}

/// The sending side of a session's server-to-client queue, bounded in messages
/// (`sessions.queue`) and in bytes (`sessions.queue_bytes`): a reader that stops reading
/// holds at most that much, then its session is closed after the grace.
#[derive(Clone)]
pub struct Outbound {
    tx: mpsc::Sender<Queued>,
    bytes: Arc<Semaphore>,
    budget: usize,
}

impl Outbound {
    /// A new queue for one stream, sized from the config.
    pub fn new(config: &SessionConfig) -> (Outbound, mpsc::Receiver<Queued>) {
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        // Permits are counted in `u32` by `acquire_many`; the config caps the budget at 1 GiB.
        let budget = config.queue_bytes.clamp(1, u32::MAX as usize >> 1);
        let out = Outbound {
            tx,
            bytes: Arc::new(Semaphore::new(budget)),
            budget,
        };
        (out, rx)
    }

    pub fn same_channel(&self, other: &Outbound) -> bool {
        self.tx.same_channel(&other.tx)
    }

    /// The budget a message of `len` bytes holds: all of it, or the whole budget for a
    /// message larger than it (which then goes alone).
    fn share(&self, len: usize) -> u32 {
        u32::try_from(len.clamp(1, self.budget)).unwrap_or(u32::MAX >> 1)
    }

    /// Bytes queued and not yet taken by the stream.
    pub fn queued_bytes(&self) -> usize {
        self.budget - self.bytes.available_permits().min(self.budget)
    }
}

/// Why a request could not start on a session.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallRefused {
    /// The id names a request of this session still in flight (ids must not be reused).
    #[error("invalid request: a request with this id is already in flight on this session (request ids must not be reused)")]
    DuplicateId,
    /// The session holds its maximum of requests in flight.
    #[error("busy: this session has {0} requests in flight, its maximum (sessions.max_in_flight); retry once one ends")]
    TooMany(usize),
}

/// Cancellations that named no request in flight, remembered (per session, at most this
/// many) in case the request they name has not started yet: it starts cancelled.
const EARLY_CANCELS: usize = 16;

/// How many times `create` tries to make room by evicting before it gives up (503).
const EVICTION_ATTEMPTS: usize = 8;

/// One MCP session.
pub struct Session {
    pub id: String,
    pub registration: Arc<RegistrationState>,
    pub transport: Transport,
    /// Fires when the session closes; a child of the registration's token.
    pub cancel: CancellationToken,
    protocol_version: Mutex<Option<&'static str>>,
    initialized: AtomicBool,
    /// Where server-to-client messages for this session go (the SSE stream).
    outbound: Mutex<Option<Outbound>>,
    /// Downstream request id key -> the call's cancellation token. An id stays here until
    /// its call ends (a cancelled call included), so it cannot be reused meanwhile.
    in_flight: Mutex<HashMap<IdKey, CancellationToken>>,
    /// Most requests in flight at once (`sessions.max_in_flight`).
    max_in_flight: usize,
    /// Ids of `notifications/cancelled` that named no request in flight (bounded).
    early_cancels: Mutex<std::collections::VecDeque<IdKey>>,
    /// Open server-to-client streams (an SSE session's stream, a Streamable HTTP GET).
    streams: AtomicUsize,
    last_active: Mutex<Instant>,
    /// `logging/setLevel`: 0 = not set (every log passes), else severity index + 1.
    log_level: AtomicU8,
    /// URIs this session subscribed to (`resources/subscribe` the upstream accepted); only
    /// their `notifications/resources/updated` reach it. At most `MAX_SUBSCRIPTIONS`.
    subscriptions: Mutex<HashSet<String>>,
    /// The client capabilities its `initialize` declared (`ClientCapability::bits_of`):
    /// server → client requests reach it only for these.
    client_capabilities: AtomicU8,
}

/// Resource subscriptions one session may hold (a bound, like every table).
pub const MAX_SUBSCRIPTIONS: usize = 1024;

impl Session {
    /// Records a subscription; false if the session already holds `MAX_SUBSCRIPTIONS`.
    pub fn subscribe(&self, uri: &str) -> bool {
        let mut subs = lock(&self.subscriptions);
        if subs.len() >= MAX_SUBSCRIPTIONS && !subs.contains(uri) {
            return false;
        }
        subs.insert(uri.to_string());
        true
    }

    pub fn unsubscribe(&self, uri: &str) {
        lock(&self.subscriptions).remove(uri);
    }

    pub fn is_subscribed(&self, uri: &str) -> bool {
        lock(&self.subscriptions).contains(uri)
    }

    /// The negotiated revision (one of the gateway's own version strings: no copy per
    /// request).
    pub fn protocol_version(&self) -> Option<&'static str> {
        *lock(&self.protocol_version)
    }

    pub fn set_protocol_version(&self, v: &'static str) {
        *lock(&self.protocol_version) = Some(v);
    }

    /// Records the session's `logging/setLevel`; false for an unknown level.
    pub fn set_log_level(&self, level: &str) -> bool {
        match log_level_index(level) {
            Some(i) => {
                self.log_level.store(i + 1, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// Does a `notifications/message` at `level` reach this session? Yes unless the client
    /// set a higher minimum (an unknown level passes).
    pub fn wants_log(&self, level: &str) -> bool {
        match (
            self.log_level.load(Ordering::Acquire),
            log_level_index(level),
        ) {
            (0, _) | (_, None) => true,
            (min, Some(i)) => i + 1 >= min,
        }
    }

    /// Records what the client's `initialize` declared (`params.capabilities`).
    pub fn set_client_capabilities(&self, capabilities: Option<&Value>) {
        self.client_capabilities
            .store(ClientCapability::bits_of(capabilities), Ordering::Release);
    }

    /// Did the client declare this capability at `initialize`?
    pub fn declares(&self, cap: ClientCapability) -> bool {
        cap.in_bits(self.client_capabilities.load(Ordering::Acquire))
    }

    pub fn is_initialized(&self) -> bool {
        self.initialized.load(Ordering::Acquire)
    }

    pub fn mark_initialized(&self) {
        self.initialized.store(true, Ordering::Release);
    }

    /// Marks activity (only after the request was authenticated).
    pub fn touch(&self) {
        *lock(&self.last_active) = Instant::now();
    }

    pub fn last_active(&self) -> Instant {
        *lock(&self.last_active)
    }

    pub fn set_outbound(&self, tx: Option<Outbound>) {
        *lock(&self.outbound) = tx;
    }

    pub fn outbound(&self) -> Option<Outbound> {
        lock(&self.outbound).clone()
    }

    /// Whether the session has a server-to-client stream.
    pub fn has_outbound(&self) -> bool {
        lock(&self.outbound).is_some()
    }

    /// Tracks a call so `notifications/cancelled` can find it. Returns the call's token, or
    /// why it may not start: its id is in flight already (-32600), or the session holds its
    /// maximum of requests in flight. A call named by an earlier cancellation starts
    /// cancelled.
    pub fn begin_call(&self, id: &Value) -> Result<CancellationToken, CallRefused> {
        let key = IdKey::of(id);
        let token = self.cancel.child_token();
        let mut in_flight = lock(&self.in_flight);
        if in_flight.contains_key(&key) {
            return Err(CallRefused::DuplicateId);
        }
        if in_flight.len() >= self.max_in_flight {
            return Err(CallRefused::TooMany(self.max_in_flight));
        }
        // An early cancellation is looked for before the key moves into the table, under the
        // table's lock (so the key is not copied): `cancel_call` takes the two locks one after
        // the other, never together, so this order cannot deadlock with it.
        {
            let mut early = lock(&self.early_cancels);
            if let Some(i) = early.iter().position(|k| *k == key) {
                early.remove(i);
                token.cancel();
            }
        }
        in_flight.insert(key, token.clone());
        Ok(token)
    }

    /// Ends a call; its end counts as activity (the idle clock restarts).
    pub fn end_call(&self, id: &Value) {
        lock(&self.in_flight).remove(&IdKey::of(id));
        self.touch();
    }

    /// A server-to-client stream opened; a session with an open stream is not idle.
    pub fn stream_opened(&self) {
        self.streams.fetch_add(1, Ordering::AcqRel);
    }

    /// A stream closed; the idle clock restarts from now.
    pub fn stream_closed(&self) {
        let _ = self
            .streams
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        self.touch();
    }

    /// Idle: no call in flight and no open stream. Only idle sessions are reaped or evicted.
    pub fn is_idle(&self) -> bool {
        self.in_flight() == 0 && self.streams.load(Ordering::Acquire) == 0
    }

    /// Cancels the in-flight call with this downstream id. Returns whether one was found; if
    /// none was, the id is remembered (the last few) so that a request racing its own
    /// cancellation (sent on another connection) starts cancelled. The call keeps its id
    /// until it ends.
    pub fn cancel_call(&self, id: &Value) -> bool {
        let key = IdKey::of(id);
        let token = lock(&self.in_flight).get(&key).cloned();
        match token {
            Some(t) => {
                t.cancel();
                true
            }
            None => {
                let mut early = lock(&self.early_cancels);
                if !early.contains(&key) {
                    if early.len() >= EARLY_CANCELS {
                        early.pop_front();
                    }
                    early.push_back(key);
                }
                false
            }
        }
    }

    pub fn in_flight(&self) -> usize {
        lock(&self.in_flight).len()
    }
}

#[derive(Default)]
struct Tables {
    sessions: HashMap<String, Arc<Session>>,
    by_registration: HashMap<String, HashSet<String>>,
}

/// All sessions, with caps.
pub struct SessionTable {
    config: SessionConfig,
    tables: Mutex<Tables>,
    /// Calls' notes channels that ended unused, for the next calls ([`SessionTable::notes_channel`]).
    spare_notes: Mutex<Vec<Notes>>,
    /// The node's id (`node_id`): session ids are `<node>.<128 random bits>`, so an L7 proxy
    /// routes a session to the node that holds it; another node answers 404 (issue 36).
    node: Option<String>,
}

/// A call's notes channel: the sender its reader keeps while the work runs (`keep`), and the
/// receiver.
pub(crate) type Notes = (mpsc::Sender<Value>, mpsc::Receiver<Value>);

/// Spare notes channels kept (each holds one block of 32 slots, ~2.5 KiB).
pub(crate) const SPARE_NOTES_MAX: usize = 8;

impl SessionTable {
    pub fn new(config: SessionConfig) -> Self {
        SessionTable {
            config,
            tables: Mutex::new(Tables::default()),
            spare_notes: Mutex::new(Vec::new()),
            node: None,
        }
    }

    /// Session ids of this table carry `node` (`<node>.<random>`).
    pub fn on_node(mut self, node: Option<&str>) -> Self {
        self.node = node.map(str::to_string);
        self
    }

    /// A call's notes channel of `capacity`: a spare one if there is one, else new. A
    /// channel's two allocations, setup and teardown cost more than the rest of the reply
    /// engine for a call without notes, and nearly every call ends without any.
    pub(crate) fn notes_channel(&self, capacity: usize) -> Notes {
        let spare = {
            let mut spare = lock(&self.spare_notes);
            spare
                .iter()
                .position(|(tx, _)| tx.max_capacity() == capacity)
                .map(|at| spare.swap_remove(at))
        };
        spare.unwrap_or_else(|| mpsc::channel(capacity))
    }

    /// Spare notes channels kept now.
    #[cfg(test)]
    pub(crate) fn spare_notes(&self) -> usize {
        lock(&self.spare_notes).len()
    }

    /// Keeps a call's notes channel for a next call if nothing can reach it any more: `keep`
    /// is its only sender (no tool context or upstream route holds a clone), nothing is
    /// queued, and it is open; at most [`SPARE_NOTES_MAX`]. Else it is dropped. Only after
    /// its reader left a no-op waker in it (`endpoint::reply::drain_quietly`), so neither way
    /// wakes anyone.
    pub(crate) fn recycle_notes(&self, keep: mpsc::Sender<Value>, notes: mpsc::Receiver<Value>) {
        let unused = notes.sender_strong_count() == 1
            && notes.sender_weak_count() == 0
            && notes.is_empty()
            && !notes.is_closed();
        if !unused {
            return;
        }
        let mut spare = lock(&self.spare_notes);
        if spare.len() < SPARE_NOTES_MAX {
            spare.push((keep, notes));
        }
    }

    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// Mints a session for a registration. Caps are checked here.
    pub fn create(
        &self,
        registration: &Arc<RegistrationState>,
        transport: Transport,
    ) -> Result<Arc<Session>, SessionError> {
        let id = match &self.node {
            Some(node) => format!("{node}.{}", random_b64(16)),
            None => random_b64(16),
        };
        let session = Arc::new(Session {
            id,
            registration: registration.clone(),
            transport,
            cancel: registration.cancel.child_token(),
            protocol_version: Mutex::new(None),
            initialized: AtomicBool::new(false),
            outbound: Mutex::new(None),
            in_flight: Mutex::new(HashMap::default()),
            max_in_flight: self.config.max_in_flight.max(1),
            early_cancels: Mutex::new(std::collections::VecDeque::new()),
            streams: AtomicUsize::new(0),
            last_active: Mutex::new(Instant::now()),
            log_level: AtomicU8::new(0),
            subscriptions: Mutex::new(HashSet::default()),
            client_capabilities: AtomicU8::new(0),
        });
        // At a cap, the oldest idle session (of the registration, or of the gateway) is
        // evicted through `close`; when none is idle, the caller answers 503.
        for _ in 0..EVICTION_ATTEMPTS {
            let victim = {
                let mut t = lock(&self.tables);
                let per = t
                    .by_registration
                    .get(&registration.id)
                    .map(HashSet::len)
                    .unwrap_or(0);
                if per >= self.config.max_per_registration {
                    let ids = t.by_registration.get(&registration.id);
                    match oldest_idle(&t.sessions, ids.into_iter().flatten()) {
                        Some(v) => v,
                        None => {
                            return Err(SessionError::RegistrationCap(
                                self.config.max_per_registration,
                            ))
                        }
                    }
                } else if t.sessions.len() >= self.config.max_sessions {
                    match oldest_idle(&t.sessions, t.sessions.keys()) {
                        Some(v) => v,
                        None => return Err(SessionError::GlobalCap(self.config.max_sessions)),
                    }
                } else {
                    t.sessions.insert(session.id.clone(), session.clone());
                    t.by_registration
                        .entry(registration.id.clone())
                        .or_default()
                        .insert(session.id.clone());
                    return Ok(session);
                }
            };
            tracing::info!(session = %victim, "session evicted: session cap reached");
            self.close(&victim);
        }
        Err(SessionError::GlobalCap(self.config.max_sessions))
    }

    /// The sessions of one registration (to route registration-wide notifications).
    pub fn sessions_of(&self, registration_id: &str) -> Vec<Arc<Session>> {
        let t = lock(&self.tables);
        t.by_registration
            .get(registration_id)
            .map(|ids| {
                ids.iter()
                    .filter_map(|id| t.sessions.get(id).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Looks a session up under one registration and on the transport that minted it; never
    /// crosses registrations, and a legacy SSE session id is unknown on Streamable HTTP (and
    /// the reverse): a session is bound to its transport.
    pub fn get(
        &self,
        registration_id: &str,
        session_id: &str,
        transport: Transport,
    ) -> Option<Arc<Session>> {
        let t = lock(&self.tables);
        t.sessions
            .get(session_id)
            .filter(|s| s.registration.id == registration_id && s.transport == transport)
            .cloned()
    }

    /// The one close path: removes the session and cancels everything it started.
    pub fn close(&self, session_id: &str) -> Option<Arc<Session>> {
        let removed = {
            let mut t = lock(&self.tables);
            let removed = t.sessions.remove(session_id);
            if let Some(s) = &removed {
                if let Some(set) = t.by_registration.get_mut(&s.registration.id) {
                    set.remove(session_id);
                    if set.is_empty() {
                        t.by_registration.remove(&s.registration.id);
                    }
                }
            }
            if t.sessions.is_empty() {
                t.sessions.shrink_to(0);
                t.by_registration.shrink_to(0);
            }
            removed
        };
        if let Some(s) = &removed {
            s.cancel.cancel();
            s.set_outbound(None);
        }
        removed
    }

    /// Sends a message on a session's server-to-client stream, encoded once; the queue is
    /// bounded in messages and in bytes, and a reader stuck past the grace
    /// (`sessions.slow_reader_grace_ms`) loses its session. Returns whether it was queued.
    pub async fn deliver(&self, session: &Session, msg: Value) -> bool {
        self.deliver_reply(session, Reply::Value(msg)).await
    }

    /// [`SessionTable::deliver`] for a response (whose result may be an upstream's, passed
    /// through as written).
    pub async fn deliver_reply(&self, session: &Session, msg: Reply) -> bool {
        match self.try_deliver(session, msg) {
            Ok(delivered) => delivered,
            // Boxed: the wait's future (a deadline, a permit, a send) is large, and this
            // future lives inside every legacy SSE call's task.
            Err(wait) => Box::pin(self.deliver_waiting(session, wait)).await,
        }
    }

    /// What [`SessionTable::deliver_reply`] does without waiting: `Ok(delivered)`, or the
    /// message when the queue has no room for it now.
    fn try_deliver(&self, session: &Session, msg: Reply) -> Result<bool, Waiting> {
        let Some(out) = session.outbound() else {
            return Ok(false);
        };
        if session.cancel.is_cancelled() {
            return Ok(false);
        }
        // Encoded once, in its framing.
        let event = message_event(&msg);
        drop(msg);
        // The budget counts the message, not its framing.
        let share = out.share(event.len() - EVENT_HEAD.len() - EVENT_TAIL.len());
        let event = Bytes::from(event);
        // Room in the queue (the usual case): no deadline to set up.
        let queued = match out.bytes.clone().try_acquire_many_owned(share) {
            Ok(permit) => {
                let item = Queued {
                    event,
                    _bytes: permit,
                };
                let sent = out.tx.try_send(item); // bounded: messages and bytes; full → the wait below, never a drop
                match sent {
                    Ok(()) => return Ok(true),
                    Err(mpsc::error::TrySendError::Closed(_)) => return Ok(false),
                    Err(mpsc::error::TrySendError::Full(q)) => Ok(q),
                }
            }
            Err(tokio::sync::TryAcquireError::Closed) => return Ok(false),
            Err(tokio::sync::TryAcquireError::NoPermits) => Err(event),
        };
        Err(Waiting { out, share, queued })
    }

    /// A message waiting for room in its session's queue, at most `slow_reader_grace_ms`;
    /// then the reader is slow and its session closed.
    async fn deliver_waiting(&self, session: &Session, wait: Waiting) -> bool {
        let Waiting { out, share, queued } = wait;
        let grace = Duration::from_millis(self.config.slow_reader_grace_ms);
        let deadline = Instant::now() + grace;
        let sent = async {
            let q = match queued {
                Ok(q) => q,
                Err(event) => {
                    let permit = tokio::time::timeout_at(
                        deadline,
                        out.bytes.clone().acquire_many_owned(share),
                    )
                    .await
                    .map_err(|_| true)?
                    .map_err(|_| false)?;
                    Queued {
                        event,
                        _bytes: permit,
                    }
                }
            };
            let left = deadline.saturating_duration_since(Instant::now());
            out.tx
                .send_timeout(q, left)
                .await
                .map_err(|e| matches!(e, mpsc::error::SendTimeoutError::Timeout(_)))
        };
        match sent.await {
            Ok(()) => true,
            Err(timed_out) => {
                if timed_out {
                    tracing::warn!(
                        session = %session.id,
                        queued_bytes = out.queued_bytes(),
                        grace_ms = self.config.slow_reader_grace_ms,
                        "slow reader: its stream took nothing within the grace; session closed"
                    );
                    self.close(&session.id);
                }
                false
            }
        }
    }

    /// Closes every session of a registration.
    pub fn close_registration(&self, registration_id: &str) -> usize {
        let ids: Vec<String> = lock(&self.tables)
            .by_registration
            .get(registration_id)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        ids.iter().filter(|id| self.close(id).is_some()).count()
    }

    /// Closes every session (shutdown).
    pub fn close_all(&self) -> usize {
        let ids: Vec<String> = lock(&self.tables).sessions.keys().cloned().collect();
        ids.iter().filter(|id| self.close(id).is_some()).count()
    }

    pub fn len(&self) -> usize {
        lock(&self.tables).sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn count_for(&self, registration_id: &str) -> usize {
        lock(&self.tables)
            .by_registration
            .get(registration_id)
            .map(HashSet::len)
            .unwrap_or(0)
    }

    /// Sessions idle since before `cutoff` (for the reaper).
    pub fn idle_since(&self, cutoff: Instant) -> Vec<String> {
        lock(&self.tables)
            .sessions
            .values()
            .filter(|s| s.is_idle() && s.last_active() <= cutoff)
            .map(|s| s.id.clone())
            .collect()
    }

    /// The earliest last-activity instant among sessions (the reaper's next deadline).
    pub fn oldest_activity(&self) -> Option<Instant> {
        lock(&self.tables)
            .sessions
            .values()
            .map(|s| s.last_active())
            .min()
    }

    /// The idle reaper: sleeps until the oldest session's deadline, closes every session
    /// idle for `idle_timeout_s` through `close` (the one close path), and repeats until
    /// `stop` fires. Activity only moves deadlines later, and a session that is busy at its
    /// deadline gets a fresh one when its call or stream ends, so the sleep is never too long.
    pub async fn run_reaper(&self, stop: CancellationToken) {
        let idle = Duration::from_secs(self.config.idle_timeout_s.max(1));
        loop {
            let now = Instant::now();
            if let Some(cutoff) = now.checked_sub(idle) {
                for id in self.idle_since(cutoff) {
                    tracing::debug!(session = %id, "session closed: idle");
                    self.close(&id);
                }
            }
            let next = lock(&self.tables)
                .sessions
                .values()
                .map(|s| s.last_active() + idle)
                .filter(|d| *d > now)
                .min()
                .unwrap_or(now + idle);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(next) => {}
            }
        }
    }
}

/// The least recently active idle session among `ids`.
fn oldest_idle<'a>(
    sessions: &HashMap<String, Arc<Session>>,
    ids: impl Iterator<Item = &'a String>,
) -> Option<String> {
    ids.filter_map(|id| sessions.get(id))
        .filter(|s| s.is_idle())
        .min_by_key(|s| s.last_active())
        .map(|s| s.id.clone())
}
