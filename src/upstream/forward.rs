//! Forwarding a request to an upstream on the registration's slot: `tools/call` (with its
//! progress and logs routed back to the caller) and the proxied `resources/*`, `prompts/*`,
//! `completion/complete`. Each holds a permit on the slot and marks it busy while it runs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::lease::upstream_meta;
use super::pool::Pool;
use super::routing::CallOwner;
use super::slot::{Busy, Share, Slot};
use super::{Connection, ForwardError, RequestOptions, UpstreamError};
use crate::protocol::jsonrpc;
use crate::registration::RegistrationState;
use crate::session::Session;

/// One forwarded `tools/call`.
pub struct ForwardCall<'a> {
    pub registration: &'a Arc<RegistrationState>,
    pub session: Option<Arc<Session>>,
    pub upstream: &'a str,
    pub tool: &'a str,
    /// The downstream params (`name` and `arguments` are replaced, in their places).
    pub params: Map<String, Value>,
    pub arguments: Value,
    /// Borrowed: each clone of a token, and each drop, takes the token's mutex.
    pub cancel: &'a CancellationToken,
    /// Where `notifications/progress` for this call goes.
    pub notify: Option<mpsc::Sender<Value>>,
    /// Filled in as soon as they are known, so that a call the gateway itself cuts off (its
    /// registration's `call_timeout_s`) still names them in its audit record.
    pub ids: Option<&'a CallIds>,
    /// The call's SERVER span (tracing on): the upstream request gets a CLIENT span, its
    /// child, whose context replaces the client's in `_meta`.
    pub trace: Option<&'a crate::telemetry::CallTrace>,
    /// The tool's `x-mcp-header` arguments (`ToolSet::param_headers`): a 2026-07-28 HTTP
    /// upstream gets them as `Mcp-Param-{Name}` headers.
    pub param_headers: Option<&'a crate::protocol::param_header::ParamHeaders>,
}

/// Where a request's server → client requests go: the session's, or (a stateless 2026 task)
/// a sink of the gateway's own.
#[derive(Default)]
pub struct TaskOwner {
    pub session: Option<Arc<Session>>,
    pub notify: Option<mpsc::Sender<Value>>,
}

/// Which connection of the slot a [`Request`] may be answered on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum On {
    /// Whichever is live (spawned or reconnected if need be).
    Current,
    /// Only the connection of this epoch, the one a task was created on (a respawned child
    /// does not know the task).
    Epoch(u64),
    /// The current connection if it is an HTTP one (a task probed after its connection
    /// ended: a respawned child never knows the tasks of the one before).
    Reconnected,
}

/// One request for [`Pool::send`]: everything but a `tools/call`.
pub struct Request<'a> {
    pub registration: &'a Arc<RegistrationState>,
    pub upstream: &'a str,
    pub method: &'a str,
    pub params: Map<String, Value>,
    pub cancel: CancellationToken,
    pub on: On,
    /// Instead of the upstream's `call_timeout_s` (a blocking `tasks/result` may wait longer).
    pub timeout: Option<Duration>,
    pub owner: TaskOwner,
    /// The SERVER span of the request that asked (tracing on) and what the request is about.
    pub trace: Option<(
        &'a crate::telemetry::CallTrace,
        crate::telemetry::Target<'a>,
    )>,
}

impl<'a> Request<'a> {
    /// A request with no owner, no trace and the upstream's own timeout.
    pub fn new(
        registration: &'a Arc<RegistrationState>,
        upstream: &'a str,
        method: &'a str,
        params: Map<String, Value>,
        cancel: CancellationToken,
        on: On,
    ) -> Self {
        Self {
            registration,
            upstream,
            method,
            params,
            cancel,
            on,
            timeout: None,
            owner: TaskOwner::default(),
            trace: None,
        }
    }
}

/// The upstream request id and epoch of a forwarded call (0 = not known yet: both start at 1).
#[derive(Debug)]
pub struct CallIds {
    epoch: AtomicU64,
    request_id: AtomicU64,
    /// When the call began (its one clock read, `call::run`).
    started: std::time::Instant,
    /// When, after `started`, the wait for the upstream's connection began (ns + 1; 0: the
    /// upstream did not answer), and whether it is a stdio one:
    /// `mcp_client_operation_duration_seconds` is read at the call's end from it, without a
    /// clock read of its own.
    waited_from_ns: AtomicU64,
    stdio: AtomicBool,
    /// Which kind of credential the upstream request carried (`AuthKind` as u8; 0: none
    /// was sent, the call did not reach a slot).
    auth: std::sync::atomic::AtomicU8,
}

impl CallIds {
    pub fn new(started: std::time::Instant) -> Self {
        Self {
            epoch: AtomicU64::new(0),
            request_id: AtomicU64::new(0),
            started,
            waited_from_ns: AtomicU64::new(0),
            stdio: AtomicBool::new(false),
            auth: std::sync::atomic::AtomicU8::new(0),
        }
    }

    /// Which kind of credential the call's upstream request carried (`upstream_auth`);
    /// `None` if it never got that far.
    pub fn upstream_auth(&self) -> Option<crate::registration::AuthKind> {
        crate::registration::AuthKind::from_u8(self.auth.load(Ordering::Relaxed))
    }

    fn set_auth(&self, kind: crate::registration::AuthKind) {
        self.auth.store(kind as u8, Ordering::Relaxed);
    }

    pub fn epoch(&self) -> Option<u64> {
        Some(self.epoch.load(Ordering::Acquire)).filter(|e| *e != 0)
    }

    pub fn request_id(&self) -> Option<u64> {
        Some(self.request_id.load(Ordering::Acquire)).filter(|i| *i != 0)
    }

    /// The wait for the upstream's connection began at `began` (the call's end reads the
    /// upstream's answer time from it); `stdio`: a stdio upstream.
    fn waited(&self, began: tokio::time::Instant, stdio: bool) {
        let after = began.into_std().saturating_duration_since(self.started);
        let ns = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX - 1);
        self.stdio.store(stdio, Ordering::Release);
        self.waited_from_ns.store(ns + 1, Ordering::Release);
    }

    /// How long the upstream took to answer (from the wait for its connection to the call's
    /// end, `elapsed` after `started`), and whether it is a stdio upstream; `None` if it did
    /// not answer.
    pub fn answered(&self, elapsed: Duration) -> Option<(Duration, bool)> {
        let ns = self.waited_from_ns.load(Ordering::Acquire);
        (ns != 0).then(|| {
            (
                elapsed.saturating_sub(Duration::from_nanos(ns - 1)),
                self.stdio.load(Ordering::Acquire),
            )
        })
    }
}

/// How a forwarded call ended.
#[derive(Debug)]
pub enum ForwardOutcome {
    /// The upstream's `CallToolResult`, unchanged: its JSON text as the upstream wrote it.
    Result(super::RawResult),
    /// The upstream answered a JSON-RPC error.
    RpcError {
        code: i64,
        message: String,
    },
    /// The request could not be forwarded, or the connection died (`upstream_failed`).
    Failed(ForwardError),
    Timeout(Duration),
    Cancelled,
}

#[derive(Debug)]
pub struct Forwarded {
    pub upstream_request_id: Option<u64>,
    pub epoch: Option<u64>,
    pub outcome: ForwardOutcome,
    /// The request's CLIENT span, ended by the caller (which reads the result's `isError`).
    /// Boxed: a span is large, and `Forwarded` lives in every forwarded call's future.
    pub client_span: Option<Box<crate::telemetry::ClientSpan>>,
}

/// What one forwarded request holds while it runs: its slot (marked busy), a permit on the
/// slot and the slot's live connection.
struct InUse {
    slot: Arc<Slot>,
    conn: Connection,
    /// When the call's upstream timeout (`call_timeout_s`) runs out: it began before the
    /// wait for a permit, so waiting counts against it.
    deadline: tokio::time::Instant,
    _permit: tokio::sync::OwnedSemaphorePermit,
    _share: Option<Share>,
    _busy: Busy,
}

impl InUse {
    /// What is left of the call's timeout.
    fn remaining(&self) -> Duration {
        self.deadline
            .saturating_duration_since(tokio::time::Instant::now())
            .max(Duration::from_millis(1))
    }
}

impl Pool {
    /// Forwards one `tools/call`; never hangs past the call timeout, cancel, or connection death.
    pub async fn forward(&self, call: ForwardCall<'_>) -> Forwarded {
        let mut fwd = Forwarded {
            upstream_request_id: None,
            epoch: None,
            outcome: ForwardOutcome::Cancelled,
            client_span: None,
        };
        let in_use = match self
            .acquire(call.upstream, call.registration, call.cancel, call.ids)
            .await
        {
            Ok(u) => u,
            Err(ForwardError::Cancelled) => return fwd,
            Err(ForwardError::Upstream(UpstreamError::Timeout(d))) => {
                fwd.outcome = ForwardOutcome::Timeout(d);
                return fwd;
            }
            Err(e) => {
                fwd.outcome = ForwardOutcome::Failed(e);
                return fwd;
            }
        };
        let (slot, conn) = (&in_use.slot, &in_use.conn);
        fwd.epoch = Some(conn.epoch());
        if let Some(ids) = call.ids {
            ids.epoch.store(conn.epoch(), Ordering::Release);
        }
        // The connection's check (`Pool::verify`) may have found the tool changed or gone
        // since the call was admitted: it is refused as admission would refuse it now.
        if let Some(refused) = drifted_away(call.registration, call.upstream, call.tool) {
            fwd.outcome = ForwardOutcome::Failed(refused);
            return fwd;
        }

        let stdio = conn.pid().is_some();
        let mut params = call.params;
        // In their places, found without hashing the keys.
        jsonrpc::set_member(&mut params, "name", Value::String(call.tool.to_string()));
        jsonrpc::set_member(&mut params, "arguments", call.arguments);
        fwd.client_span = call.trace.map(|t| {
            let target = crate::telemetry::Target::Tool(call.tool);
            Box::new(client_span(t, slot, call.upstream, "tools/call", target))
        });
        let owner = TaskOwner {
            session: call.session.clone(),
            notify: call.notify.clone(),
        };
        // (No local for the span: a `Copy` local stays in the future's state to its scope's end.)
        let tag = dress(
            &mut params,
            slot,
            call.registration,
            fwd.client_span.as_deref(),
            owner,
        );

        let (started_tx, started_rx) = oneshot::channel();
        // The call's progress and logs go straight to the caller's channel, in the upstream's
        // order, as whole notifications: the upstream reader waits for room in it
        // (`core::Core::deliver`, at most `notify_grace_ms`, then refuses and counts), so there
        // is backpressure end to end and nothing is dropped on the way. Logs pass the session's
        // `logging/setLevel` filter there.
        let log_filter = call
            .session
            .clone()
            .map(|s| super::LogFilter(Arc::new(move |level: &str| s.wants_log(level))));
        let timeout = in_use.remaining();
        let opts = RequestOptions {
            timeout: Some(timeout),
            cancel: call.cancel.clone(),
            progress: call.notify.clone(),
            started: Some(started_tx),
            notifications: call.notify,
            tag: Some(tag),
            progress_as_messages: true,
            log_filter,
            raw_result: true,
            trace: fwd.client_span.as_ref().map(|s| Box::new(s.meta().clone())),
            param_headers: call.param_headers.cloned(),
        };
        let request = conn.request_answer("tools/call", Value::Object(params), opts);
        tokio::pin!(request);
        // The request reports its id before its first wait, so it is read after each poll of
        // the request: a second branch woken by it would poll the whole request once more.
        let mut started_rx = Some(started_rx);
        let result = std::future::poll_fn(|cx| {
            let polled = std::future::Future::poll(request.as_mut(), cx);
            if let Some(rx) = started_rx.as_mut() {
                match rx.try_recv() {
                    Ok(id) => {
                        started_rx = None;
                        fwd.upstream_request_id = Some(id);
                        if let Some(ids) = call.ids {
                            ids.request_id.store(id, Ordering::Release);
                        }
                    }
                    Err(oneshot::error::TryRecvError::Closed) => started_rx = None,
                    Err(oneshot::error::TryRecvError::Empty) => {}
                }
            }
            polled
        })
        .await;
        if let (Some(ids), Ok(_)) = (call.ids, &result) {
            // Timed from the wait for a permit to the call's end (no clock read here).
            let began =
                in_use.deadline - Duration::from_secs(slot.spec.config.call_timeout_s.max(1));
            ids.waited(began, stdio);
        }
        fwd.outcome = call_outcome(result, slot, &mut fwd.upstream_request_id);
        fwd
    }

    /// Sends one request other than a `tools/call` to an upstream on the registration's slot
    /// (`resources/*`, `prompts/*`, `completion/complete`, a task's `tasks/*`): same slot,
    /// permits, lease `_meta` and timeout as [`Pool::forward`]; no progress or log routing.
    /// Server → client requests it causes go to `request.owner` as a call's do. With
    /// `request.trace` (tracing on), it has a CLIENT span, the child of the request's SERVER
    /// span, whose context goes into `_meta` (and headers, to HTTP upstreams).
    ///
    /// `Ok(Some((epoch, answer)))`: the epoch it was asked on and the upstream's answer, a
    /// result or the error object it sent; `Ok(None)`: the connection `request.on` names is
    /// not the live one (never for [`On::Current`]); `Err`: why the upstream could not answer.
    pub async fn send(
        &self,
        request: Request<'_>,
    ) -> Result<Option<(u64, Result<Value, Value>)>, ForwardError> {
        let (registration, upstream, on) = (request.registration, request.upstream, request.on);
        let in_use = self
            .acquire(upstream, registration, &request.cancel, None)
            .await?;
        let (slot, conn) = (&in_use.slot, &in_use.conn);
        let current = match on {
            On::Current => true,
            On::Epoch(e) => conn.epoch() == e,
            On::Reconnected => conn.pid().is_none(),
        };
        if !current {
            return Ok(None);
        }
        let method = request.method;
        let span = request.trace.map(|(t, target)| {
            client_span(
                t,
                slot,
                upstream,
                crate::protocol::method_name(method),
                target,
            )
        });
        let mut params = request.params;
        let tag = dress(
            &mut params,
            slot,
            registration,
            span.as_ref(),
            request.owner,
        );
        let opts = RequestOptions {
            timeout: Some(request.timeout.unwrap_or_else(|| in_use.remaining())),
            cancel: request.cancel,
            tag: Some(tag),
            trace: span.as_ref().map(|s| Box::new(s.meta().clone())),
            ..RequestOptions::default()
        };
        let answered = conn.request(method, Value::Object(params), opts).await;
        if let Some(span) = span {
            end_client_span(span, &answered);
        }
        match answered {
            Ok(resp) => {
                slot.answered();
                Ok(Some((conn.epoch(), resp.outcome)))
            }
            Err(UpstreamError::Closed(_)) if on != On::Current && conn.is_closed() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Waits (at most `within`) until the events already queued by the connections serving
    /// `registration` on `upstream` have been handled (a task's progress read before its final
    /// status: `methods::tasks::run_for_call`). No slot: nothing to wait for.
    pub async fn events_handled(
        &self,
        upstream: &str,
        registration: &RegistrationState,
        within: Duration,
    ) {
        let auth = own_auth(registration, upstream);
        if let Ok((slot, _)) = self
            .slot_for(upstream, &registration.id, auth.as_ref())
            .await
        {
            if !slot.events_handled(within).await {
                tracing::debug!(upstream, "the slot's events were not all handled in time");
            }
        }
    }

    /// The slot serving `registration_id` on `upstream`, a permit on it and its connection
    /// (spawned if needed) — each step abandoned when `cancel` fires, and the whole bounded by
    /// the upstream's `call_timeout_s` (the wait for a permit counts against the call's
    /// timeout). On a shared or leased slot a registration holding its share of the permits
    /// (`max_in_flight_per_registration`) is refused at once ([`ForwardError::Busy`]).
    ///
    /// The registration's own credential for the upstream (issue 47), if it has one, picks
    /// its own slot; one refused at restore refuses the request. `ids` (a call's) is told
    /// which kind of credential the request carries (`upstream_auth`).
    async fn acquire(
        &self,
        upstream: &str,
        registration: &RegistrationState,
        cancel: &CancellationToken,
        ids: Option<&CallIds>,
    ) -> Result<InUse, ForwardError> {
        let began = tokio::time::Instant::now();
        let registration_id = registration.id.as_str();
        // No credential in its family: one atomic load.
        let auth = own_auth(registration, upstream);
        let own = match &auth {
            Some(a) => credential_check(upstream, &a.cell)?,
            None => false,
        };
        // Each wait below polls its step first: when the step is ready at once (the common
        // case), the cancellation and the deadline are not even registered (a timer entry and
        // a waiter each, set and taken back per call otherwise).
        let (slot, shared) = tokio::select! {
            biased;
            s = self.slot_for(upstream, registration_id, auth.as_ref()) => s?,
            () = cancel.cancelled() => return Err(ForwardError::Cancelled),
        };
        if let Some(ids) = ids {
            // An OAuth upstream's requests carry its tokens (a subject token sets no header).
            ids.set_auth(if own && slot.tokens.is_none() {
                crate::registration::AuthKind::Registration
            } else {
                slot.spec.static_auth
            });
        }
        let timeout = Duration::from_secs(slot.spec.config.call_timeout_s.max(1));
        let deadline = began + timeout;
        let share = if shared {
            let cap = slot.spec.config.registration_share();
            match Share::take(&slot, registration_id, cap) {
                Some(s) => Some(s),
                None => {
                    return Err(ForwardError::Busy {
                        upstream: upstream.to_string(),
                        cap,
                    })
                }
            }
        } else {
            None
        };
        let busy = Busy::new(&slot);
        let timed_out = || ForwardError::Upstream(UpstreamError::Timeout(timeout));
        let permit = tokio::select! {
            biased;
            p = slot.permits.clone().acquire_owned() => p.map_err(|_| ForwardError::ShuttingDown)?,
            () = cancel.cancelled() => return Err(ForwardError::Cancelled),
            () = tokio::time::sleep_until(deadline) => return Err(timed_out()),
        };
        let conn = tokio::select! {
            biased;
            c = slot.connection() => c?,
            () = cancel.cancelled() => return Err(ForwardError::Cancelled),
            () = tokio::time::sleep_until(deadline) => return Err(timed_out()),
        };
        // A new connection (spawn, respawn, reconnect) serves nothing before its tools were
        // compared with the pins (`Pool::verify`; one atomic load once it was).
        if slot.verified.load(Ordering::Acquire) < conn.epoch() {
            tokio::select! {
                biased;
                v = Box::pin(self.verify(&slot, &conn)) => v?,
                () = cancel.cancelled() => return Err(ForwardError::Cancelled),
                () = tokio::time::sleep_until(deadline) => return Err(timed_out()),
            }
        }
        Ok(InUse {
            slot,
            conn,
            deadline,
            _permit: permit,
            _share: share,
            _busy: busy,
        })
    }
}

/// A registration's credential cell for `upstream`, checked before its slot is taken: whether
/// it holds a credential now (unset: the requests carry the configured headers only); refused
/// fails the request with its reason.
fn credential_check(
    upstream: &str,
    cell: &crate::registration::AuthCell,
) -> Result<bool, ForwardError> {
    use crate::registration::AuthState;
    match cell.state() {
        AuthState::Refused(why) => Err(ForwardError::CredentialsRefused {
            upstream: upstream.to_string(),
            why: why.to_string(),
        }),
        AuthState::Set(..) => Ok(true),
        AuthState::Unset => Ok(false),
    }
}

/// How a forwarded `tools/call` ended, from its request's end (the upstream's request id
/// read from its answer into `request_id`).
fn call_outcome(
    result: Result<super::Answered, UpstreamError>,
    slot: &Slot,
    request_id: &mut Option<u64>,
) -> ForwardOutcome {
    match result {
        Ok(resp) => {
            slot.answered();
            *request_id = Some(resp.upstream_id);
            match resp.outcome {
                Ok(answer) => match answer.into_raw() {
                    Ok(raw) => ForwardOutcome::Result(raw),
                    Err(e) => ForwardOutcome::Failed(ForwardError::Upstream(
                        UpstreamError::Protocol(format!("result not encodable: {e}")),
                    )),
                },
                Err(e) => ForwardOutcome::RpcError {
                    code: crate::protocol::error::RpcError::code_of(&e),
                    message: e
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("upstream error")
                        .to_string(),
                },
            }
        }
        Err(UpstreamError::Cancelled) => ForwardOutcome::Cancelled,
        // The whole of `call_timeout_s` (the request had what the permit wait left of it).
        Err(UpstreamError::Timeout(_)) => {
            ForwardOutcome::Timeout(Duration::from_secs(slot.spec.config.call_timeout_s.max(1)))
        }
        Err(e) => ForwardOutcome::Failed(e.into()),
    }
}

/// Why a call of `upstream`'s `tool` must not be sent for `registration` any more: its pinned
/// definition was found removed or changed (`on_tool_change = "refuse"`). One atomic load when
/// nothing drifted.
fn drifted_away(
    registration: &RegistrationState,
    upstream: &str,
    tool: &str,
) -> Option<ForwardError> {
    if !registration.pins.drifted() {
        return None;
    }
    let name = registration.tools.iter().find_map(|t| match &t.backend {
        crate::tools::Backend::Upstream {
            upstream: u,
            tool: n,
            ..
        } if u == upstream && n == tool => Some(t.name.as_str()),
        _ => None,
    })?;
    let removed = match registration.pins.drift_of(name)? {
        crate::registration::pins::Drift::Followed { .. } => return None,
        crate::registration::pins::Drift::Removed => true,
        crate::registration::pins::Drift::Refused { .. } => false,
    };
    Some(ForwardError::ToolChanged {
        tool: name.to_string(),
        removed,
    })
}

/// The CLIENT span of a proxied or task request on `slot` (tracing on), the child of `trace`.
fn client_span(
    trace: &crate::telemetry::CallTrace,
    slot: &Slot,
    upstream: &str,
    method: &'static str,
    target: crate::telemetry::Target<'_>,
) -> crate::telemetry::ClientSpan {
    let [spawned, catalog] = slot.pool_work();
    trace.client_span(crate::telemetry::Upstreamed {
        upstream,
        method,
        target,
        peer: slot.spec.peer(),
        waited: [spawned.as_ref(), catalog.as_ref()],
    })
}

/// Ends a CLIENT span from how its request ended.
fn end_client_span(
    span: crate::telemetry::ClientSpan,
    answered: &Result<super::Response, UpstreamError>,
) {
    let (id, error_type) = match answered {
        Ok(resp) => (
            Some(resp.upstream_id),
            resp.outcome.as_ref().err().map(|e| {
                crate::telemetry::code_error_type(crate::protocol::error::RpcError::code_of(e))
            }),
        ),
        Err(UpstreamError::Timeout(_)) => (None, Some("timeout")),
        Err(UpstreamError::Cancelled) => (None, Some("cancelled")),
        Err(_) => (None, Some("_OTHER")),
    };
    span.end(id, error_type, None);
}

/// The registration's lease on a leased slot (minted on first use); none otherwise.
fn lease_of(slot: &Slot, registration: &RegistrationState) -> Option<String> {
    slot.leased
        .load(Ordering::SeqCst)
        .then(|| slot.leases.lease_for(&registration.id))
}

/// What every request sent for a registration carries: its `_meta` (the lease on a leased
/// slot, the CLIENT span's context) set in `params`, and the tag routing the server → client
/// requests it causes to `owner`.
fn dress(
    params: &mut Map<String, Value>,
    slot: &Slot,
    registration: &RegistrationState,
    span: Option<&crate::telemetry::ClientSpan>,
    owner: TaskOwner,
) -> super::RequestTag {
    upstream_meta(
        params,
        registration,
        lease_of(slot, registration),
        span.map(|s| s.meta()),
    );
    CallOwner {
        registration_id: registration.id.clone(),
        session: owner.session,
        notify: owner.notify,
    }
    .tag()
}

impl Pool {
    /// A probe's question to one upstream (`gateway::probe`): `ping` on the connection that
    /// serves `registration_id` (spawned or respawned if need be, as its next call would),
    /// within `timeout`. Any JSON-RPC answer, an error included, is an answer. The error names
    /// its kind only, never an upstream's command or URL.
    pub async fn ping(
        &self,
        upstream: &str,
        registration: &RegistrationState,
        timeout: Duration,
    ) -> Result<(), &'static str> {
        let cancel = CancellationToken::new();
        let _stop = cancel.clone().drop_guard();
        let asked = async {
            let in_use = self.acquire(upstream, registration, &cancel, None).await?;
            let opts = RequestOptions {
                timeout: Some(timeout),
                cancel: cancel.clone(),
                ..Default::default()
            };
            in_use.conn.request("ping", Value::Null, opts).await?;
            in_use.slot.answered();
            Ok::<(), ForwardError>(())
        };
        match tokio::time::timeout(timeout, asked).await {
            // Its share of the connection's permits is in use: its calls are running there.
            Ok(Ok(())) | Ok(Err(ForwardError::Busy { .. })) => Ok(()),
            Err(_) | Ok(Err(ForwardError::Upstream(UpstreamError::Timeout(_)))) => {
                Err("no answer within the deadline")
            }
            Ok(Err(e)) => Err(match e {
                ForwardError::UnknownUpstream(_) => "not configured (removed by a reload?)",
                ForwardError::ShuttingDown => "shutting down",
                ForwardError::CredentialsRefused { .. } => "its credentials are refused",
                ForwardError::Unavailable { .. } => "unavailable: cannot connect",
                ForwardError::Upstream(UpstreamError::Spawn(_)) => "cannot be spawned",
                ForwardError::Upstream(UpstreamError::Closed(_)) => "connection closed",
                ForwardError::Upstream(UpstreamError::HttpStatus { .. }) => {
                    "answered an HTTP error status"
                }
                ForwardError::Upstream(UpstreamError::Http(_) | UpstreamError::Io(_)) => {
                    "cannot connect"
                }
                _ => "failed",
            }),
        }
    }
}

/// The registration's own credential for `upstream` (issue 47), with its agent path as the
/// actor of a token exchange. No credential in its family: one atomic load.
#[inline]
fn own_auth(registration: &RegistrationState, upstream: &str) -> Option<super::tokens::OwnAuth> {
    registration
        .upstream_auth(upstream)
        .map(|cell| super::tokens::OwnAuth {
            cell,
            actor: registration
                .family
                .agent_path
                .as_deref()
                .map(super::tokens::agent_path_token),
        })
}
