//! The upstream layer's vocabulary: transports, connect and request options, responses,
//! events and errors.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// Protocol version requested in `initialize` unless [`ConnectOptions::protocol_version`] says otherwise.
pub const DEFAULT_PROTOCOL_VERSION: &str = "2025-06-18";

/// The 2026-07-28 tasks extension (SEP-2663), declared per request.
pub use crate::protocol::meta::TASKS_EXTENSION;

/// The stateless revision an upstream may be configured to speak instead of the handshake.
pub const MODERN_PROTOCOL_VERSION: &str = crate::config::MODERN_PROTOCOL;

/// Protocol versions this layer accepts in an `InitializeResult` (all legacy-handshake revisions).
pub const SUPPORTED_PROTOCOL_VERSIONS: &[&str] = crate::protocol::LEGACY_VERSIONS;

/// The `capabilities.experimental` key a server uses to advertise the gatehouse lease extension.
pub use crate::protocol::meta::LEASE as LEASE_CAPABILITY;

pub use crate::config::UpstreamTransport as Transport;

/// The request-id source for one upstream slot. Cheap to clone; clones share the counter.
///
/// The pool keeps one per slot and passes a clone to every respawn, so a respawned connection
/// continues where the previous epoch stopped and ids never repeat for that slot.
#[derive(Debug, Clone)]
pub struct IdCounter(Arc<AtomicU64>);

impl IdCounter {
    /// A counter whose first id is `first`.
    pub fn starting_at(first: u64) -> Self {
        Self(Arc::new(AtomicU64::new(first)))
    }

    /// The id the next request will get (for diagnostics; racy by nature).
    pub fn peek(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    pub(crate) fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

impl Default for IdCounter {
    /// Starts at 1.
    fn default() -> Self {
        Self::starting_at(1)
    }
}

/// Notifications of a call that the gateway could not deliver (the call ended first, or its
/// consumer took none for [`NOTIFY_GRACE`]): counted, never dropped silently. One per
/// upstream, shared by its connections; the `gatehouse_notifications_refused` metric.
#[derive(Debug, Clone, Default)]
pub struct NotificationsRefused(Arc<AtomicU64>);

impl NotificationsRefused {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// How long an upstream reader waits for room in a call's notification channel before it
/// gives up on that call's notifications (counted in [`NotificationsRefused`]). While it
/// waits, the reader reads nothing more from the connection: that is the backpressure.
pub const NOTIFY_GRACE: Duration = Duration::from_secs(10);

/// Everything needed to open one connection. Build with [`ConnectOptions::new`] and adjust fields.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The upstream's configured id (used in logs and errors).
    pub upstream_id: String,
    pub transport: Transport,
    /// Epoch of this connection, chosen by the pool (bumped on each respawn).
    pub epoch: u64,
    /// Request id source; share one per upstream slot across epochs (see [`IdCounter`]).
    pub ids: IdCounter,
    /// Default per-request timeout (also bounds `initialize`).
    pub request_timeout: Duration,
    /// `clientInfo` sent in `initialize` (an MCP `Implementation` object).
    pub client_info: Value,
    /// `capabilities` sent in `initialize`. Default `{}`: only declare what the gateway can route.
    pub client_capabilities: Value,
    /// `protocolVersion` requested in `initialize`.
    pub protocol_version: String,
    /// The upstream speaks the 2026-07-28 era (`[[upstreams]] protocol = "2026-07-28"`): no
    /// `initialize`; `server/discover` instead, and every request carries the per-request
    /// envelope in its `_meta` ([`MODERN_PROTOCOL_VERSION`]).
    pub modern: bool,
    /// stdio teardown: how long to wait after closing stdin, and again after SIGTERM.
    pub shutdown_grace: Duration,
    /// Where undeliverable call notifications are counted (the upstream's counter).
    pub notifications_refused: NotificationsRefused,
    /// How long the reader waits for a call's consumer to take a notification before it
    /// refuses that call's notifications ([`NOTIFY_GRACE`] by default).
    pub notify_grace: Duration,
    /// The pool work's trace context (tracing on), sent with `initialize` (`_meta`, and
    /// headers to HTTP upstreams) so the upstream's span of it joins that trace.
    pub trace: Option<crate::telemetry::TraceMeta>,
    /// A registration's own credential for this HTTP upstream (issue 47), read on every
    /// request so a rotation reaches the next one; `None`: the configured headers only.
    pub auth: Option<Arc<crate::registration::AuthCell>>,
    /// OAuth (issue 47): the access tokens this HTTP upstream's requests carry.
    pub tokens: Option<Arc<super::tokens::Tokens>>,
}

impl ConnectOptions {
    /// Options with defaults: epoch 0, fresh [`IdCounter`], 60 s timeout, 2 s grace,
    /// `clientInfo = {"name":"gatehouse","version":<crate version>}`.
    pub fn new(upstream_id: impl Into<String>, transport: Transport) -> Self {
        Self {
            upstream_id: upstream_id.into(),
            transport,
            epoch: 0,
            ids: IdCounter::default(),
            request_timeout: Duration::from_secs(60),
            client_info: serde_json::json!({
                "name": "gatehouse",
                "version": env!("CARGO_PKG_VERSION"),
            }),
            client_capabilities: serde_json::json!({}),
            protocol_version: DEFAULT_PROTOCOL_VERSION.to_owned(),
            modern: false,
            shutdown_grace: Duration::from_secs(2),
            notifications_refused: NotificationsRefused::default(),
            notify_grace: NOTIFY_GRACE,
            trace: None,
            auth: None,
            tokens: None,
        }
    }
}

/// Per-request options for [`Connection::request`](super::Connection::request).
#[derive(Debug, Default)]
pub struct RequestOptions {
    /// Overrides [`ConnectOptions::request_timeout`].
    pub timeout: Option<Duration>,
    /// Fire to cancel: `notifications/cancelled` goes upstream and the call returns
    /// [`UpstreamError::Cancelled`].
    pub cancel: CancellationToken,
    /// Receives `notifications/progress` params for this request with the caller's original
    /// `progressToken` restored. The reader waits for room (backpressure), at most
    /// [`NOTIFY_GRACE`] per call, then refuses and counts ([`NotificationsRefused`]); delivery
    /// stops once the response arrived. Without a sender, progress for a request
    /// that carried a token is emitted as [`UpstreamEvent::Progress`] instead.
    pub progress: Option<tokio::sync::mpsc::Sender<Value>>,
    /// Receives the upstream request id as soon as it is assigned (before sending), for audit.
    pub started: Option<tokio::sync::oneshot::Sender<u64>>,
    /// Receives `notifications/message` (logs) attributable to this request, as whole JSON-RPC
    /// notifications, before its response (attribution as for [`UpstreamEvent::Request`]).
    /// Without a sender they are emitted as [`UpstreamEvent::Notification`].
    pub notifications: Option<tokio::sync::mpsc::Sender<Value>>,
    /// Who the request is for, kept in the connection's pending entry and handed back with a
    /// server → client request related to it ([`UpstreamEvent::Request::related_tag`]).
    pub tag: Option<RequestTag>,
    /// Progress goes to [`RequestOptions::progress`] as whole `notifications/progress`
    /// messages (as logs are), not as bare params: the sender can then be the caller's own
    /// channel, with no forwarding step per call.
    pub progress_as_messages: bool,
    /// Logs whose level this refuses are not delivered (a session's `logging/setLevel`): a
    /// filter the client asked for, so neither counted nor emitted as events.
    pub log_filter: Option<LogFilter>,
    /// The result is wanted as the upstream wrote it ([`Answer::Raw`]), not parsed.
    pub raw_result: bool,
    /// The gateway's CLIENT span context (tracing on): an HTTP upstream also gets it as the
    /// `traceparent` (`tracestate`, `baggage`) headers of the request's POST (it is in the
    /// request's `_meta` already, the only carrier on stdio).
    pub trace: Option<Box<crate::telemetry::TraceMeta>>,
    /// A forwarded `tools/call`'s `x-mcp-header` arguments: mirrored as `Mcp-Param-{Name}`
    /// headers to a 2026-07-28 HTTP upstream.
    pub param_headers: Option<crate::protocol::param_header::ParamHeaders>,
}

/// See [`RequestOptions::log_filter`]: `level` is the log's `params.level` (`""` if none).
#[derive(Clone)]
pub struct LogFilter(pub Arc<dyn Fn(&str) -> bool + Send + Sync>);

impl std::fmt::Debug for LogFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LogFilter")
    }
}

/// An opaque owner of a pending request (the pool puts its call's owner here).
#[derive(Clone)]
pub struct RequestTag(pub Arc<dyn Any + Send + Sync>);

impl std::fmt::Debug for RequestTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RequestTag")
    }
}

impl PartialEq for RequestTag {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// A result as the upstream wrote it (its JSON text, validated): a forwarded tool result
/// passes through to the client without being parsed into a `Value` and encoded again.
pub type RawResult = Box<serde_json::value::RawValue>;

/// What a pending request receives: its result parsed, or, asked for with
/// [`RequestOptions::raw_result`], as the upstream wrote it.
#[derive(Debug)]
pub enum Answer {
    Parsed(Value),
    Raw(RawResult),
}

impl Answer {
    /// The result as a `Value` (a raw one is parsed: it is valid JSON).
    pub fn into_value(self) -> Value {
        match self {
            Answer::Parsed(v) => v,
            Answer::Raw(r) => crate::protocol::jsonrpc::raw_value(&r),
        }
    }

    /// The result as text (a parsed one, from the general path or an HTTP upstream, is
    /// encoded once; that cannot fail for a `Value`).
    pub fn into_raw(self) -> Result<RawResult, serde_json::Error> {
        match self {
            Answer::Parsed(v) => serde_json::value::to_raw_value(&v),
            Answer::Raw(r) => Ok(r),
        }
    }
}

/// A completed upstream request whose result may be raw ([`RequestOptions::raw_result`]).
#[derive(Debug)]
pub struct Answered {
    pub upstream_id: u64,
    pub epoch: u64,
    /// `Ok(result)` or `Err(error object)` as the upstream sent them.
    pub outcome: Result<Answer, Value>,
}

impl Answered {
    /// The result as a value, or the upstream's error as an [`UpstreamError`].
    pub(crate) fn into_result(self) -> Result<Value, UpstreamError> {
        self.outcome
            .map(Answer::into_value)
            .map_err(|error| UpstreamError::from_rpc_error(&error))
    }
}

/// A completed upstream request.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    /// The JSON-RPC id used on the upstream connection.
    pub upstream_id: u64,
    pub epoch: u64,
    /// `Ok(result)` or `Err(error object)` exactly as the upstream sent them.
    pub outcome: Result<Value, Value>,
}

/// Events a connection emits for the gateway to route. All carry the connection's epoch.
#[derive(Debug, Clone, PartialEq)]
pub enum UpstreamEvent {
    /// A server notification not consumed by the connection (e.g. `notifications/tools/list_changed`,
    /// `notifications/message`, `notifications/cancelled` for a server → client request).
    Notification {
        epoch: u64,
        method: String,
        params: Option<Value>,
    },
    /// `notifications/progress` for a pending request that has no per-request progress channel;
    /// `params.progressToken` is the caller's original token.
    Progress {
        epoch: u64,
        upstream_request_id: u64,
        params: Value,
    },
    /// A server → client request other than `ping` (sampling, elicitation, roots, …). Answer it
    /// with [`Connection::respond`](super::Connection::respond) using `id` verbatim.
    ///
    /// `related_request` is the pending upstream request it can be attributed to, if any:
    /// - HTTP: the request whose POST response stream carried it (a structural link); `None`
    ///   when it arrived some other way.
    /// - stdio: there is no structural link, so it is `Some(id)` only when exactly one request
    ///   made for a client (one with a [`RequestOptions::tag`]) was pending when it arrived,
    ///   else `None` (the gateway should then fail closed). The gateway's own requests (a
    ///   catalog refresh) do not count.
    Request {
        epoch: u64,
        id: Value,
        method: String,
        params: Option<Value>,
        related_request: Option<u64>,
        /// The [`RequestOptions::tag`] of `related_request`.
        related_tag: Option<RequestTag>,
    },
    /// The connection is gone (emitted exactly once). All pending requests have failed.
    Closed { epoch: u64, reason: String },
}

/// Errors of the upstream connection layer. All of them are upstream-side failures.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("invalid upstream configuration: {0}")]
    Config(String),
    #[error("failed to spawn upstream process: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("upstream i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("upstream http error: {0}")]
    Http(#[from] reqwest::Error),
    #[error("upstream answered http status {status}")]
    HttpStatus { status: u16 },
    #[error("upstream connection closed: {0}")]
    Closed(String),
    #[error("upstream request cancelled")]
    Cancelled,
    #[error("upstream request timed out after {0:?}")]
    Timeout(Duration),
    #[error("upstream returned JSON-RPC error {code}: {message}")]
    Rpc { code: i64, message: String },
    #[error("upstream protocol version {0:?} is not supported")]
    UnsupportedProtocolVersion(String),
    #[error("upstream protocol violation: {0}")]
    Protocol(String),
    #[error("failed to encode message for upstream: {0}")]
    Encode(#[from] serde_json::Error),
    /// OAuth (issue 47): no access token could be had for the request.
    #[error("{0}")]
    Auth(super::oauth::OAuthError),
    /// The upstream answered 401 to the credential (an OAuth token: after one fresh token).
    #[error("upstream {upstream} rejected this registration's credentials")]
    AuthRejected { upstream: String },
}

impl UpstreamError {
    /// Builds [`UpstreamError::Rpc`] from a JSON-RPC error object.
    pub(crate) fn from_rpc_error(error: &Value) -> Self {
        Self::Rpc {
            code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
        }
    }
}

/// What the pool hands back to the gateway: what it cannot handle itself. The gateway's hub
/// implements it; the pool holds it weakly and never names an endpoint or the gateway.
pub trait Downstream: Send + Sync {
    /// An upstream's tools changed: tell the sessions of every registration granted one.
    fn tools_changed<'a>(&'a self, upstream_id: &'a str) -> BoxFuture<'a, ()>;
    /// A notification outside any call, where [`crate::protocol::Notice::route`] sent it (a
    /// registration's sessions and listen streams, or every registration granted
    /// `upstream_id`; a resource update only to subscribers of its URI, a log only where its
    /// level reaches). How many sessions and streams it was queued on.
    fn notify<'a>(
        &'a self,
        upstream_id: &'a str,
        route: crate::protocol::Route,
        msg: Value,
    ) -> BoxFuture<'a, usize>;
    /// An upstream's `notifications/tasks/status` (2025-11-25): to the registration that owns
    /// the task it names on that connection (`epoch`), with the gateway's task id; dropped
    /// when no task of the gateway has that upstream id.
    fn task_status<'a>(
        &'a self,
        upstream_id: &'a str,
        epoch: u64,
        params: Value,
    ) -> BoxFuture<'a, usize>;
    /// The owner and input sink of a 2026-form task (its registration's, on that connection,
    /// `epoch`) whose upstream task id is `upstream_task_id`, while the gateway holds its
    /// upstream `tasks/result` open: a side-channel request naming the task in its
    /// related-task `_meta` goes there (it names no request).
    fn task_inputs(
        &self,
        upstream_id: &str,
        epoch: u64,
        upstream_task_id: &str,
    ) -> Option<(String, tokio::sync::mpsc::Sender<Value>)>;
    /// A `notifications/progress` whose request ended (its token as the gateway sent it
    /// upstream): to the client of the task that call created, while the task is live (a
    /// task's progress token stays valid until it ends); dropped otherwise.
    fn task_progress<'a>(
        &'a self,
        upstream_id: &'a str,
        epoch: u64,
        params: Value,
    ) -> BoxFuture<'a, ()>;
    /// Puts a message (a server → client request) on a session's server-to-client stream;
    /// whether it was queued.
    fn deliver<'a>(
        &'a self,
        session: &'a crate::session::Session,
        msg: Value,
    ) -> BoxFuture<'a, bool>;
    /// A live registration (for the roots its harness set), if it is still registered.
    fn registration(
        &self,
        registration_id: &str,
    ) -> Option<Arc<crate::registration::RegistrationState>>;
    /// The sessions of a registration: a server → client request no call can be named for
    /// goes to one of them that declared the capability it needs.
    fn sessions_of(&self, registration_id: &str) -> Vec<Arc<crate::session::Session>>;
}

/// Which side of the gateway a failure is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The caller (it cancelled, or went away).
    Downstream,
    /// The upstream server or the connection to it.
    Upstream,
    /// The gateway itself (configuration, shutdown).
    Internal,
}

/// Why a request could not be forwarded to an upstream (its answer, even a JSON-RPC error,
/// is not an error here).
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("cancelled")]
    Cancelled,
    #[error("unknown upstream {0:?}")]
    UnknownUpstream(String),
    #[error("upstream is shutting down")]
    ShuttingDown,
    /// The upstream could not be reached to learn its tools and sharing.
    #[error("upstream {upstream:?} is unavailable: {source}")]
    Unavailable {
        upstream: String,
        source: UpstreamError,
    },
    /// The registration holds its share of this upstream's permits already
    /// (`max_in_flight_per_registration` on a shared or leased connection): refused at once,
    /// never queued.
    #[error("busy: this registration has {cap} calls in flight on upstream {upstream:?}, its share of the upstream's permits (max_in_flight_per_registration); retry once one ends")]
    Busy { upstream: String, cap: usize },
    /// The tool's pinned definition was found removed or changed (`on_tool_change =
    /// "refuse"`) when its connection was checked, after the call was admitted (`crate::registration::pins`).
    #[error("the definition of tool {tool} changed upstream since this registration was made")]
    ToolChanged { tool: String, removed: bool },
    /// The registration's credential for this upstream is not usable (restored from the
    /// store without the key that sealed it): refused until the harness rotates it.
    #[error("the credentials of this registration for upstream {upstream:?} are refused: {why}; the harness must set them again (PUT /v1/registrations/<id>/credentials)")]
    CredentialsRefused { upstream: String, why: String },
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
}

impl ForwardError {
    pub fn side(&self) -> Side {
        match self {
            ForwardError::Cancelled | ForwardError::Busy { .. } => Side::Downstream,
            ForwardError::UnknownUpstream(_) | ForwardError::ShuttingDown => Side::Internal,
            ForwardError::CredentialsRefused { .. } => Side::Internal,
            ForwardError::Unavailable { .. }
            | ForwardError::ToolChanged { .. }
            | ForwardError::Upstream(_) => Side::Upstream,
        }
    }
}
