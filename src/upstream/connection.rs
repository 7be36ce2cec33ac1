//! One upstream connection: the handshake, request ids, the pending map, cancellation, timeouts, progress-token mapping and inbound message routing.
//!
//! Transport specifics (child process, HTTP) live in `stdio.rs` and `http.rs`; this file only
//! sees them through the closed [`TransportHandle`] enum.
//!
//! Invariants:
//! - No std lock is held across `.await`: the pending map is locked, mutated and released.
//! - A closed connection never leaves a waiter hanging: closing drains the pending map, which
//!   drops every waiter's sender, and each waiter maps that to [`UpstreamError::Closed`].
//! - A request future that is dropped before completing removes its pending entry and sends a
//!   best-effort `notifications/cancelled` upstream ([`PendingGuard`]).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::sync::oneshot;

use super::core::{rewrite_progress_token, Core};
use super::events::EventSink;
use super::http::{HttpTransport, Mirror};
use super::stdio::StdioTransport;
use super::{
    Answer, Answered, ConnectOptions, IdCounter, RequestOptions, Response, Transport,
    UpstreamError, LEASE_CAPABILITY, MODERN_PROTOCOL_VERSION, SUPPORTED_PROTOCOL_VERSIONS,
    TASKS_EXTENSION,
};

/// Upper bound for sending a `notifications/cancelled` after a cancel or timeout.
const CANCEL_SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// Upper bound on `tools/list` pages followed, against servers that loop on cursors.
const MAX_LIST_PAGES: usize = 1000;

static NULL: Value = Value::Null;

/// A cheap, cloneable handle to one live upstream connection.
///
/// Dropping the last clone tears the connection down (stdio: SIGKILL to the process group; the
/// pending requests fail with [`UpstreamError::Closed`]). Prefer [`Connection::close`], which is
/// graceful and idempotent.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("upstream_id", &self.inner.core.upstream_id)
            .field("epoch", &self.inner.core.epoch)
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

struct Inner {
    core: Arc<Core>,
    transport: TransportHandle,
    request_timeout: Duration,
    init: OnceLock<Value>,
    /// A 2026-07-28 upstream: the per-request envelope every request's `_meta` carries.
    modern: Option<Envelope>,
    teardown: tokio::sync::OnceCell<()>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The transport's own Drop kills what it owns; here we only make sure waiters and the
        // gateway learn about it.
        self.core.mark_closed("connection dropped".to_owned());
    }
}

/// The closed set of transports, as seen by the connection.
pub(crate) enum TransportHandle {
    Stdio(StdioTransport),
    Http(HttpTransport),
}

impl TransportHandle {
    /// Sends a request and drives its delivery. For stdio the future never completes after a
    /// successful write (the reader task dispatches the response); for HTTP it completes once
    /// the POST response (JSON or SSE stream) has been consumed and dispatched.
    async fn drive_request(
        &self,
        core: &Arc<Core>,
        id: u64,
        line: Vec<u8>,
        trace: Option<Box<crate::telemetry::TraceMeta>>,
        mirror: Option<Box<super::http::Mirror>>,
    ) -> Result<(), UpstreamError> {
        match self {
            Self::Stdio(stdio) => {
                stdio.send_line(line).await?;
                std::future::pending::<()>().await;
                Ok(())
            }
            // Boxed: the HTTP exchange's future (~2.3 KB, reqwest's) would otherwise size
            // this one, and with it every future up to `call::run`'s, which stdio calls move
            // and copy on each layer's start.
            Self::Http(http) => Box::pin(http.exchange(core, id, line, trace, mirror)).await,
        }
    }

    /// Sends a notification or response (no reply expected).
    async fn send(&self, core: &Arc<Core>, msg: &Value) -> Result<(), UpstreamError> {
        match self {
            Self::Stdio(stdio) => stdio.send(msg).await,
            Self::Http(http) => http.post_accepted(core, msg).await,
        }
    }

    /// Best-effort, non-blocking send (used from `Drop`).
    // why: a `Drop` cannot wait; see `StdioTransport::send_or_drop` (bounded queue, logged drop).
    fn send_or_drop(&self, core: &Arc<Core>, msg: Value) {
        // why: a Drop cannot wait; bounded, drops logged
        match self {
            Self::Stdio(stdio) => stdio.send_or_drop(&msg),
            Self::Http(http) => http.spawn_post(core, msg),
        }
    }

    async fn shutdown(&self) {
        match self {
            Self::Stdio(stdio) => stdio.shutdown().await,
            Self::Http(http) => http.shutdown().await,
        }
    }

    fn pid(&self) -> Option<u32> {
        match self {
            Self::Stdio(stdio) => Some(stdio.pid()),
            Self::Http(_) => None,
        }
    }
}

impl Connection {
    /// Opens the transport (spawns the child / prepares the HTTP client), performs `initialize`
    /// (bounded by `opts.request_timeout`), checks the negotiated protocol version and sends
    /// `notifications/initialized`.
    ///
    /// Events for this connection (tagged with `opts.epoch`) go to `events`. On failure the
    /// transport is torn down before the error is returned.
    pub async fn connect(
        opts: ConnectOptions,
        events: EventSink,
    ) -> Result<Connection, UpstreamError> {
        let core = Arc::new(Core::new(
            opts.upstream_id.clone(),
            opts.epoch,
            opts.ids.clone(),
            events,
            opts.notifications_refused.clone(),
            opts.notify_grace,
        ));
        let transport = match &opts.transport {
            Transport::Stdio {
                command,
                args,
                env,
                cwd,
            } => TransportHandle::Stdio(StdioTransport::spawn(
                &core,
                command,
                args,
                env,
                cwd.as_deref(),
                opts.shutdown_grace,
            )?),
            Transport::Http { url, headers, tls } => TransportHandle::Http(HttpTransport::new(
                &opts.upstream_id,
                url,
                headers,
                tls,
                opts.auth.clone(),
                opts.tokens.clone(),
            )?),
        };
        let conn = Connection {
            inner: Arc::new(Inner {
                core,
                transport,
                request_timeout: opts.request_timeout,
                init: OnceLock::new(),
                modern: opts.modern.then(|| Envelope {
                    capabilities: opts.client_capabilities.clone(),
                    client_info: opts.client_info.clone(),
                }),
                teardown: tokio::sync::OnceCell::new(),
            }),
        };
        match conn.handshake(&opts).await {
            Ok(()) => Ok(conn),
            Err(err) => {
                tracing::warn!(upstream = %opts.upstream_id, error = %err, "upstream initialize failed");
                conn.inner
                    .core
                    .mark_closed(format!("initialize failed: {err}"));
                conn.close().await;
                Err(err)
            }
        }
    }

    async fn handshake(&self, opts: &ConnectOptions) -> Result<(), UpstreamError> {
        if self.inner.modern.is_some() {
            if let TransportHandle::Http(http) = &self.inner.transport {
                http.set_protocol_version(MODERN_PROTOCOL_VERSION);
            }
            return self.discover(opts).await;
        }
        let params = json!({
            "protocolVersion": opts.protocol_version,
            "capabilities": opts.client_capabilities,
            "clientInfo": opts.client_info,
        });
        let result = self.request_handshake("initialize", params, opts).await?;
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .ok_or_else(|| {
                UpstreamError::Protocol("initialize result lacks protocolVersion".to_owned())
            })?;
        if !SUPPORTED_PROTOCOL_VERSIONS.contains(&version) {
            return Err(UpstreamError::UnsupportedProtocolVersion(
                version.to_owned(),
            ));
        }
        if let TransportHandle::Http(http) = &self.inner.transport {
            http.set_protocol_version(version);
        }
        tracing::debug!(
            upstream = %self.upstream_id(),
            epoch = self.epoch(),
            protocol_version = version,
            "upstream initialized"
        );
        let _ = self.inner.init.set(result);
        self.notify("notifications/initialized", Value::Null).await
    }

    /// A handshake request (`initialize`, `server/discover`): traced, and sent non-cancellable
    /// (the MCP lifecycle forbids cancelling `initialize`); its result, or the upstream's error.
    async fn request_handshake(
        &self,
        method: &str,
        mut params: Value,
        opts: &ConnectOptions,
    ) -> Result<Value, UpstreamError> {
        let request = traced(&mut params, opts.trace.as_ref());
        self.call(method, params, request, false)
            .await?
            .into_result()
    }

    /// A 2026-07-28 upstream's handshake: `server/discover` (no `initialize`, no
    /// `notifications/initialized`). Its answer is kept in the shape of an `InitializeResult`
    /// (`protocolVersion`, `capabilities`, `serverInfo`), which is what the pool reads.
    async fn discover(&self, opts: &ConnectOptions) -> Result<(), UpstreamError> {
        let mut result = self
            .request_handshake("server/discover", json!({}), opts)
            .await?;
        let speaks = result
            .get("supportedVersions")
            .and_then(Value::as_array)
            .is_some_and(|v| v.iter().any(|v| v == MODERN_PROTOCOL_VERSION));
        if !speaks {
            let offered = result
                .get("supportedVersions")
                .cloned()
                .unwrap_or(Value::Null);
            return Err(UpstreamError::UnsupportedProtocolVersion(format!(
                "server/discover offers {offered}, not {MODERN_PROTOCOL_VERSION}"
            )));
        }
        let server_info = result
            .pointer_mut("/_meta/io.modelcontextprotocol~1serverInfo")
            .map(Value::take)
            .unwrap_or_else(|| json!({}));
        let mut capabilities = result
            .get_mut("capabilities")
            .map(Value::take)
            .unwrap_or_else(|| json!({}));
        let runs_tasks = capabilities
            .pointer("/extensions")
            .and_then(|e| e.get(TASKS_EXTENSION))
            .is_some();
        if let (true, Some(c)) = (runs_tasks, capabilities.as_object_mut()) {
            // What the gateway reads to know an upstream runs tool calls as tasks (the
            // 2025-11-25 capability); the extension stays listed beside it.
            c.entry("tasks")
                .or_insert_with(|| json!({"cancel": {}, "requests": {"tools": {"call": {}}}}));
        }
        tracing::debug!(
            upstream = %self.upstream_id(),
            epoch = self.epoch(),
            protocol_version = MODERN_PROTOCOL_VERSION,
            "upstream discovered"
        );
        let _ = self.inner.init.set(json!({
            "protocolVersion": MODERN_PROTOCOL_VERSION,
            "capabilities": capabilities,
            "serverInfo": server_info,
        }));
        Ok(())
    }

    /// Whether this upstream speaks the 2026-07-28 era (configured so).
    pub fn is_modern(&self) -> bool {
        self.inner.modern.is_some()
    }

    /// The epoch the pool assigned to this connection.
    pub fn epoch(&self) -> u64 {
        self.inner.core.epoch
    }

    /// The child's pid (which is also its process-group id) for stdio; `None` for HTTP.
    pub fn pid(&self) -> Option<u32> {
        self.inner.transport.pid()
    }

    /// The upstream's configured id.
    pub fn upstream_id(&self) -> &str {
        &self.inner.core.upstream_id
    }

    /// The upstream's `InitializeResult` (protocolVersion, capabilities, serverInfo, …).
    pub fn initialize_result(&self) -> &Value {
        self.inner.init.get().unwrap_or(&NULL)
    }

    /// The negotiated protocol version.
    pub fn protocol_version(&self) -> Option<&str> {
        self.initialize_result()
            .get("protocolVersion")
            .and_then(Value::as_str)
    }

    /// Whether the server advertised `capabilities.experimental["io.gatehouse/lease"]`.
    pub fn supports_lease(&self) -> bool {
        self.initialize_result()
            .pointer("/capabilities/experimental")
            .and_then(|experimental| experimental.get(LEASE_CAPABILITY))
            .is_some_and(|lease| !lease.is_null())
    }

    /// Number of requests awaiting a response.
    pub fn in_flight(&self) -> usize {
        self.inner.core.pending_len()
    }

    /// Whether the connection is closed (explicitly, or because the upstream went away).
    pub fn is_closed(&self) -> bool {
        self.inner.core.is_closed()
    }

    /// Resolves once the connection is closed, for whatever reason.
    pub async fn wait_closed(&self) {
        self.inner.core.closed.cancelled().await;
    }

    /// The id source shared by this upstream slot (see [`IdCounter`]).
    pub fn ids(&self) -> &IdCounter {
        &self.inner.core.ids
    }

    /// Fetches all tools, following `nextCursor` until the last page.
    pub async fn list_tools(&self) -> Result<Vec<Value>, UpstreamError> {
        self.list_tools_traced(None).await
    }

    /// [`Connection::list_tools`]; `trace`: the pool work's trace context, sent with each page
    /// (tracing on).
    pub async fn list_tools_traced(
        &self,
        trace: Option<&crate::telemetry::TraceMeta>,
    ) -> Result<Vec<Value>, UpstreamError> {
        let mut tools = Vec::new();
        let mut cursor: Option<Value> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut params = match &cursor {
                Some(cursor) => json!({ "cursor": cursor }),
                None => json!({}),
            };
            let request = traced(&mut params, trace);
            let response = self.request("tools/list", params, request).await?;
            let mut result = response
                .outcome
                .map_err(|error| UpstreamError::from_rpc_error(&error))?;
            match result.get_mut("tools").map(Value::take) {
                Some(Value::Array(page)) => tools.extend(page),
                Some(Value::Null) | None => {}
                Some(_) => {
                    return Err(UpstreamError::Protocol(
                        "tools/list result.tools is not an array".to_owned(),
                    ))
                }
            }
            match result.get_mut("nextCursor").map(Value::take) {
                Some(next) if !next.is_null() => cursor = Some(next),
                _ => return Ok(tools),
            }
        }
        Err(UpstreamError::Protocol(format!(
            "tools/list did not finish within {MAX_LIST_PAGES} pages"
        )))
    }

    /// Sends a request and waits for its response.
    ///
    /// - The JSON-RPC id comes from the connection's [`IdCounter`] and is reported through
    ///   `opts.started` before sending.
    /// - `params` is forwarded as-is, except that `params._meta.progressToken`, if present, is
    ///   replaced by a connection-unique token; progress is delivered per [`RequestOptions::progress`]
    ///   with the original token restored, and stops once the response arrived.
    /// - On `opts.cancel` or timeout, `notifications/cancelled {requestId, reason}` is sent
    ///   upstream, the pending entry removed (a late response is dropped) and
    ///   [`UpstreamError::Cancelled`] / [`UpstreamError::Timeout`] returned.
    /// - If the connection closes meanwhile, this returns [`UpstreamError::Closed`] at once.
    ///
    /// An upstream JSON-RPC error is *not* an `Err`: it is `Ok(Response { outcome: Err(error) })`.
    pub async fn request(
        &self,
        method: &str,
        params: Value,
        opts: RequestOptions,
    ) -> Result<Response, UpstreamError> {
        let a = self.call(method, params, opts, true).await?;
        Ok(Response {
            upstream_id: a.upstream_id,
            epoch: a.epoch,
            outcome: a.outcome.map(Answer::into_value),
        })
    }

    /// [`Connection::request`] whose result is [`Answer::Raw`] when
    /// [`RequestOptions::raw_result`] is set (a forwarded `tools/call`).
    pub async fn request_answer(
        &self,
        method: &str,
        params: Value,
        opts: RequestOptions,
    ) -> Result<Answered, UpstreamError> {
        self.call(method, params, opts, true).await
    }

    async fn call(
        &self,
        method: &str,
        mut params: Value,
        opts: RequestOptions,
        cancellable: bool,
    ) -> Result<Answered, UpstreamError> {
        let core = &self.inner.core;
        // A 2026-07-28 upstream: the envelope in `_meta`; over HTTP, the mirrored headers.
        let mirror = match (&self.inner.modern, &self.inner.transport) {
            (Some(envelope), transport) => {
                envelope.put(method, &mut params);
                match transport {
                    TransportHandle::Http(_) => {
                        Mirror::of(method, &params, opts.param_headers.as_deref()).map(Box::new)
                    }
                    TransportHandle::Stdio(_) => None,
                }
            }
            (None, _) => None,
        };
        // A closed connection is refused by `register` below, under the lock it takes anyway.
        let id = core.ids.next();
        let progress = rewrite_progress_token(
            &mut params,
            core.epoch,
            id,
            opts.progress,
            opts.progress_as_messages,
        );
        let mut rx = core.register(
            id,
            progress,
            opts.notifications,
            opts.log_filter,
            opts.tag,
            opts.raw_result,
        )?;
        let guard = PendingGuard {
            conn: self,
            id,
            cancellable,
            armed: true,
        };
        if let Some(started) = opts.started {
            let _ = started.send(id);
        }
        let line = match encode_request(id, method, &params) {
            Ok(line) => line,
            Err(e) => {
                guard.disarm();
                core.remove(id);
                return Err(e);
            }
        };
        drop(params);
        let timeout = opts.timeout.unwrap_or(self.inner.request_timeout);
        tracing::trace!(upstream = %core.upstream_id, epoch = core.epoch, jsonrpc.id = id, jsonrpc.method = method, "upstream request");

        let drive = self
            .inner
            .transport
            .drive_request(core, id, line, opts.trace, mirror);
        tokio::pin!(drive);
        // A coarse deadline (it fires within 100 ms after `timeout`): a timer-wheel entry per
        // request cost ~1,200 instructions of a proxied call (`sync::coarse`).
        let deadline = crate::sync::coarse::sleep(timeout);
        tokio::pin!(deadline);
        let waited = tokio::select! {
            biased;
            received = &mut rx => match received {
                Ok(outcome) => Waited::Done(outcome),
                Err(_) => Waited::Closed,
            },
            () = opts.cancel.cancelled() => Waited::Cancelled,
            () = &mut deadline => Waited::Timeout,
            driven = &mut drive => match driven {
                Err(err) => Waited::Failed(err),
                // The transport finished delivering: the response must have been dispatched.
                Ok(()) => match rx.try_recv() {
                    Ok(outcome) => Waited::Done(outcome),
                    Err(oneshot::error::TryRecvError::Closed) => Waited::Closed,
                    Err(oneshot::error::TryRecvError::Empty) => Waited::Failed(
                        UpstreamError::Protocol(
                            "upstream ended the response stream without a response".to_owned(),
                        ),
                    ),
                },
            },
        };
        match waited {
            Waited::Done(outcome) => {
                guard.disarm();
                Ok(Answered {
                    upstream_id: id,
                    epoch: core.epoch,
                    outcome,
                })
            }
            Waited::Closed => {
                guard.disarm();
                Err(UpstreamError::Closed(core.close_reason()))
            }
            Waited::Cancelled => {
                guard.disarm();
                self.abandon(id, cancellable, "cancelled by client").await;
                Err(UpstreamError::Cancelled)
            }
            Waited::Timeout => {
                guard.disarm();
                self.abandon(id, cancellable, "request timed out").await;
                Err(UpstreamError::Timeout(timeout))
            }
            Waited::Failed(err) => {
                guard.disarm();
                core.remove(id);
                Err(err)
            }
        }
    }

    /// Forgets a pending request and tells the upstream to stop working on it.
    async fn abandon(&self, id: u64, cancellable: bool, reason: &str) {
        let core = &self.inner.core;
        let was_pending = core.remove(id);
        if !(cancellable && was_pending) || core.is_closed() {
            return;
        }
        let msg = cancelled_notification(id, reason);
        match tokio::time::timeout(CANCEL_SEND_TIMEOUT, self.inner.transport.send(core, &msg)).await
        {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                tracing::debug!(upstream = %core.upstream_id, jsonrpc.id = id, error = %err, "could not send notifications/cancelled");
            }
            Err(_) => {
                tracing::debug!(upstream = %core.upstream_id, jsonrpc.id = id, "timed out sending notifications/cancelled");
            }
        }
    }

    /// Sends a notification upstream. `params` is omitted when `Value::Null`.
    pub async fn notify(&self, method: &str, params: Value) -> Result<(), UpstreamError> {
        let core = &self.inner.core;
        if let Some(reason) = core.closed_reason() {
            return Err(UpstreamError::Closed(reason));
        }
        let mut msg = Map::new();
        msg.insert("jsonrpc".to_owned(), json!("2.0"));
        msg.insert("method".to_owned(), json!(method));
        if !params.is_null() {
            msg.insert("params".to_owned(), params);
        }
        self.inner.transport.send(core, &Value::Object(msg)).await
    }

    /// Answers a server → client request ([`super::UpstreamEvent::Request`]) with `Ok(result)` or
    /// `Err(error object)`; `id` is passed back verbatim.
    pub async fn respond(
        &self,
        id: Value,
        outcome: Result<Value, Value>,
    ) -> Result<(), UpstreamError> {
        let core = &self.inner.core;
        if let Some(reason) = core.closed_reason() {
            return Err(UpstreamError::Closed(reason));
        }
        let msg = match outcome {
            Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
            // The error object as the client (or the gateway, refusing) wrote it.
            Err(error) => crate::protocol::RpcError::from_peer_or(&error, "")
                .to(id)
                .to_value(),
        };
        self.inner.transport.send(core, &msg).await
    }

    /// Tears the connection down; idempotent, and concurrent callers all wait for the same
    /// teardown. Pending requests fail with [`UpstreamError::Closed`] immediately.
    ///
    /// stdio: close stdin, wait up to the grace period for exit, SIGTERM the process group,
    /// wait again, SIGKILL the group, reap the child. HTTP: DELETE the session (if any).
    pub async fn close(&self) {
        let inner = &self.inner;
        inner
            .teardown
            .get_or_init(|| async {
                inner.core.mark_closed("closed by gateway".to_owned());
                inner.transport.shutdown().await;
            })
            .await;
    }
}

/// A request as one line, `{"jsonrpc":"2.0","id":…,"method":…,"params":…}` and `\n`, written
/// directly (no `Map` is built for the envelope; the members in the order they always had).
/// `params` is left out when `Value::Null`.
/// What a 2026-07-28 request carries in its `_meta`: the protocol version, the client's
/// capabilities and its `clientInfo`.
struct Envelope {
    capabilities: Value,
    client_info: Value,
}

impl Envelope {
    /// Writes the envelope into a request's `_meta`. A `tools/call` holding `params.task` (the
    /// 2025-11-25 way to ask for a task, which the 2026-07-28 era ignores) declares the tasks
    /// extension instead; `tasks/*` requests always declare it.
    fn put(&self, method: &str, params: &mut Value) {
        if !params.is_object() {
            *params = json!({});
        }
        let Some(p) = params.as_object_mut() else {
            return;
        };
        let asks_task = match method {
            "tools/call" => p.remove("task").is_some(),
            m => m.starts_with("tasks/"),
        };
        let mut capabilities = self.capabilities.clone();
        if asks_task {
            if let Some(c) = capabilities.as_object_mut() {
                let ext = c.entry("extensions").or_insert_with(|| json!({}));
                if !ext.is_object() {
                    *ext = json!({});
                }
                if let Some(e) = ext.as_object_mut() {
                    e.insert(TASKS_EXTENSION.into(), json!({}));
                }
            }
        }
        let meta = p
            .entry(crate::protocol::meta::META)
            .or_insert_with(|| json!({}));
        if !meta.is_object() {
            *meta = json!({});
        }
        if let Some(m) = meta.as_object_mut() {
            m.insert(
                crate::protocol::meta::PROTOCOL_VERSION.into(),
                Value::from(MODERN_PROTOCOL_VERSION),
            );
            m.insert(
                crate::protocol::meta::CLIENT_CAPABILITIES.into(),
                capabilities,
            );
            m.insert(
                crate::protocol::meta::CLIENT_INFO.into(),
                self.client_info.clone(),
            );
        }
    }
}

fn encode_request(id: u64, method: &str, params: &Value) -> Result<Vec<u8>, UpstreamError> {
    let mut line = Vec::with_capacity(64);
    line.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    line.extend_from_slice(itoa::Buffer::new().format(id).as_bytes());
    line.extend_from_slice(b",\"method\":");
    serde_json::to_writer(&mut line, method)?;
    if !params.is_null() {
        line.extend_from_slice(b",\"params\":");
        serde_json::to_writer(&mut line, params)?;
    }
    line.extend_from_slice(b"}\n");
    Ok(line)
}

enum Waited {
    Done(Result<Answer, Value>),
    Closed,
    Cancelled,
    Timeout,
    Failed(UpstreamError),
}

/// Removes the pending entry and sends a best-effort `notifications/cancelled` if the request
/// future is dropped before it finished.
struct PendingGuard<'a> {
    conn: &'a Connection,
    id: u64,
    cancellable: bool,
    armed: bool,
}

impl PendingGuard<'_> {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let inner = &self.conn.inner;
        if inner.core.remove(self.id) && self.cancellable && !inner.core.is_closed() {
            tracing::debug!(upstream = %inner.core.upstream_id, jsonrpc.id = self.id, "request dropped; cancelling upstream");
            // why: from Drop; bounded, a drop is logged (see `Transport::send_or_drop`).
            inner.transport.send_or_drop(
                // why: from Drop; bounded, a drop is logged
                &inner.core,
                cancelled_notification(self.id, "request abandoned"),
            );
        }
    }
}

fn cancelled_notification(id: u64, reason: &str) -> Value {
    json!({
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": { "requestId": id, "reason": reason },
    })
}

/// A pool request's options, with `trace` (tracing on) written into its `_meta` and headers.
fn traced(params: &mut Value, trace: Option<&crate::telemetry::TraceMeta>) -> RequestOptions {
    let Some(t) = trace else {
        return RequestOptions::default();
    };
    if let Some(p) = params.as_object_mut() {
        let mut meta = serde_json::Map::new();
        meta.insert(
            crate::telemetry::TRACEPARENT.into(),
            Value::String(t.traceparent.clone()),
        );
        if let Some(s) = &t.tracestate {
            meta.insert(
                crate::telemetry::TRACESTATE.into(),
                Value::String(s.clone()),
            );
        }
        p.insert(crate::protocol::meta::META.into(), Value::Object(meta));
    }
    RequestOptions {
        trace: Some(Box::new(t.clone())),
        ..RequestOptions::default()
    }
}

#[cfg(test)]
mod tests {
    use super::encode_request;
    use serde_json::{json, Value};

    #[test]
    fn a_request_line_is_the_envelope_the_map_made_and_parses_back() {
        let params = json!({"name": "t\"x", "arguments": {"é": [1, null]}, "_meta": {"k": 1}});
        let line = String::from_utf8(encode_request(7, "tools/call", &params).unwrap()).unwrap();
        assert!(line.ends_with("}\n") && !line[..line.len() - 1].contains('\n'));
        assert_eq!(
            line,
            "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"tools/call\",\"params\":{\"name\":\"t\\\"x\",\"arguments\":{\"é\":[1,null]},\"_meta\":{\"k\":1}}}\n"
        );
        let back: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["params"], params);
        // `params` is left out when null, as before.
        assert_eq!(
            String::from_utf8(encode_request(u64::MAX, "ping", &Value::Null).unwrap()).unwrap(),
            format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"ping\"}}\n",
                u64::MAX
            )
        );
    }
}
