//! Streamable HTTP on `/gw/<id>/mcp`, both eras on one path.
//!
//! Handshake era (2025-03-26, 2025-06-18, 2025-11-25): `initialize` on POST mints a session
//! (`Mcp-Session-Id`); later POSTs, the GET stream and DELETE must carry it. Stateless
//! 2026-07-28 requests (with `_meta["io.modelcontextprotocol/protocolVersion"]`) are handed to
//! `stateless`. The era is picked per request from the body and headers.
//!
//! Reply choice: a request is answered as JSON unless something streams. The call starts at
//! once; if a notification (progress, log) arrives before the result, or the call runs past
//! `keepalive_s`, the reply switches to `text/event-stream` (notifications, keep-alives, then
//! the response). Fast calls therefore get plain JSON.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header::{AsHeaderName, HeaderName};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::sse::sse_json;
use super::{authorize, http_error, is_json, json_response, read_body};
use crate::gateway::Gateway;
use crate::mcp::dispatch::{self, RequestCtx};
use crate::mcp::jsonrpc::{self, Body as RpcBody, Message};
use crate::mcp::LEGACY_VERSIONS;
use crate::registry::{random_b64, RegistrationState};
use crate::session::{Session, Transport};

pub const SESSION_HEADER: &str = "mcp-session-id";
pub const VERSION_HEADER: &str = "mcp-protocol-version";
/// The same names as `HeaderName`s, for lookups: a lookup by `&str` parses and checks the
/// name every time.
pub(crate) static SESSION_NAME: HeaderName = HeaderName::from_static(SESSION_HEADER);
pub(crate) static VERSION_NAME: HeaderName = HeaderName::from_static(VERSION_HEADER);
/// What a handshake-era request without `MCP-Protocol-Version` is assumed to speak.
const ASSUMED_VERSION: &str = "2025-03-26";
/// Batches are accepted from this revision only.
const BATCH_VERSION: &str = "2025-03-26";
/// Priming events (empty data with an id) go to clients at this revision or later.
const PRIMING_SINCE: &str = "2025-11-25";

/// A header's value as text (None if absent or not visible ASCII).
pub fn header_str(headers: &HeaderMap, name: impl AsHeaderName) -> Option<&str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Does `Accept` list both `application/json` and `text/event-stream`?
fn accepts(headers: &HeaderMap, json: bool, sse: bool) -> bool {
    let mut has_json = false;
    let mut has_sse = false;
    for v in headers.get_all(header::ACCEPT) {
        let Ok(v) = v.to_str() else { continue };
        for item in v.split(',') {
            let media = item.split(';').next().unwrap_or("").trim();
            has_json |= media.eq_ignore_ascii_case("application/json");
            has_sse |= media.eq_ignore_ascii_case("text/event-stream");
        }
    }
    (!json || has_json) && (!sse || has_sse)
}

fn bad_request(message: &str) -> Response {
    http_error(StatusCode::BAD_REQUEST, jsonrpc::INVALID_REQUEST, message)
}

fn session_not_found() -> Response {
    http_error(
        StatusCode::NOT_FOUND,
        jsonrpc::INVALID_REQUEST,
        "session not found: initialize again without Mcp-Session-Id",
    )
}

fn accepted() -> Response {
    StatusCode::ACCEPTED.into_response()
}

/// The session a handshake-era request names, scoped to its registration (400 / 404).
/// It is looked up only after `authorize`, and touched only then.
fn require_session(
    gw: &Gateway,
    reg: &RegistrationState,
    headers: &HeaderMap,
) -> Result<Arc<Session>, Response> {
    let Some(sid) = header_str(headers, &SESSION_NAME).filter(|s| !s.is_empty()) else {
        return Err(bad_request(
            "bad request: Mcp-Session-Id header is required (send initialize first)",
        ));
    };
    let Some(session) = gw
        .sessions()
        .get(&reg.id, sid)
        .filter(|s| s.transport == Transport::StreamableHttp)
    else {
        return Err(session_not_found());
    };
    session.touch();
    Ok(session)
}

/// The handshake-era version of a request: the header, validated, or 2025-03-26.
fn legacy_version(headers: &HeaderMap) -> Result<&str, Response> {
    match headers.get(&VERSION_NAME) {
        None => Ok(ASSUMED_VERSION),
        Some(v) => match v.to_str() {
            Ok(v) if LEGACY_VERSIONS.contains(&v) => Ok(v),
            _ => Err(bad_request(
                "bad request: unsupported MCP-Protocol-Version (supported: 2024-11-05, 2025-03-26, 2025-06-18, 2025-11-25, 2026-07-28)",
            )),
        },
    }
}

/// `POST /gw/<id>/mcp`. Takes the whole request (not a `HeaderMap` extractor, which clones
/// every header) and keeps its headers.
pub async fn post(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    request: axum::extract::Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    let reg = match authorize(&gw, &id, super::Surface::Mcp, &headers) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    if !accepts(&headers, true, true) {
        return http_error(
            StatusCode::NOT_ACCEPTABLE,
            jsonrpc::INVALID_REQUEST,
            "not acceptable: Accept must list application/json and text/event-stream",
        );
    }
    if !is_json(&headers) {
        return http_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            jsonrpc::INVALID_REQUEST,
            "unsupported media type: Content-Type must be application/json",
        );
    }
    let bytes = match read_body(body, gw.config().max_body_bytes).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    // The common case: one valid request or notification, read without a `Value` envelope.
    if let Some(msg) = jsonrpc::parse_request(&bytes) {
        return if super::stateless::is_stateless(msg.method(), msg.params(), &headers) {
            super::stateless::handle(gw, reg, headers, Ok(msg)).await
        } else {
            legacy_single(gw, reg, &headers, Ok(msg)).await
        };
    }
    // Everything else (responses, batches, malformed messages) is boxed, like `initialize`
    // below: rare, and their futures would make every request's future (moved on each
    // request) kilobytes larger.
    Box::pin(post_general(gw, reg, headers, bytes)).await
}

/// A body the direct parse left alone: parsed into a `Value`, then classified (which words
/// the errors).
async fn post_general(
    gw: Gateway,
    reg: Arc<RegistrationState>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    let parsed = match jsonrpc::parse_body(&bytes) {
        Ok(b) => b,
        Err(e) => return json_response(StatusCode::BAD_REQUEST, &e.to_value()),
    };
    match parsed {
        RpcBody::Single(v) => {
            let method = v.get("method").and_then(Value::as_str);
            if super::stateless::is_stateless(method, v.get("params"), &headers) {
                super::stateless::handle(gw, reg, headers, jsonrpc::classify(v)).await
            } else {
                legacy_single(gw, reg, &headers, jsonrpc::classify(v)).await
            }
        }
        RpcBody::Batch(items) => legacy_batch(gw, reg, &headers, items).await,
    }
}

/// A handshake-era message (or why it is not a valid one: reported after the version check).
async fn legacy_single(
    gw: Gateway,
    reg: Arc<RegistrationState>,
    headers: &HeaderMap,
    msg: Result<Message, jsonrpc::RpcError>,
) -> Response {
    let version = match legacy_version(headers) {
        Ok(v) => v.to_string(),
        Err(r) => return r,
    };
    let msg = match msg {
        Ok(m) => m,
        Err(e) => return json_response(StatusCode::BAD_REQUEST, &e.to_value()),
    };
    if let Message::Request { id, method, params } = &msg {
        if method == "initialize" {
            return Box::pin(initialize(gw, reg, id.clone(), params.clone())).await;
        }
    }
    let session = match require_session(&gw, &reg, headers) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let ctx = session_ctx(&gw, &reg, &session);
    match msg {
        Message::Request { id, method, params } => {
            let cancel = session.begin_call(&id);
            let opts = ReplyOpts {
                priming: version.as_str() >= PRIMING_SINCE,
                cancel_on_drop: false,
                method: method.clone(),
                finish: None,
            };
            reply(ctx, id, method, params, cancel, opts).await
        }
        Message::Notification { method, params } => {
            dispatch::handle_notification(&ctx, &method, params.as_ref());
            accepted()
        }
        Message::Response { id, body } => {
            if !gw.pool().client_response(&reg.id, &session.id, &id, &body) {
                tracing::debug!(session = %session.id, "response from client ignored: no request pending");
            }
            accepted()
        }
    }
}

fn session_ctx(gw: &Gateway, reg: &Arc<RegistrationState>, session: &Arc<Session>) -> RequestCtx {
    RequestCtx {
        gateway: gw.clone(),
        registration: reg.clone(),
        session: Some(session.clone()),
        transport: Transport::StreamableHttp,
        protocol_version: session.protocol_version().unwrap_or(ASSUMED_VERSION),
        notify: None,
    }
}

/// `initialize`: mints a session bound to the registration. The session enters the table
/// only if the handshake succeeds; a failed one is closed at once.
async fn initialize(
    gw: Gateway,
    reg: Arc<RegistrationState>,
    id: Value,
    params: Option<Value>,
) -> Response {
    let session = match gw.sessions().create(&reg, Transport::StreamableHttp) {
        Ok(s) => s,
        Err(e) => {
            return http_error(
                StatusCode::SERVICE_UNAVAILABLE,
                jsonrpc::INTERNAL_ERROR,
                &e.to_string(),
            )
        }
    };
    let ctx = session_ctx(&gw, &reg, &session);
    let reply =
        dispatch::handle_request(&ctx, id, "initialize", params, session.cancel.child_token())
            .await;
    match reply {
        Some(r) if r.get("result").is_some() => {
            tracing::debug!(registration = %reg.id, session = %session.id, "streamable session opened");
            let mut resp = json_response(StatusCode::OK, &r);
            if let Ok(v) = HeaderValue::from_str(&session.id) {
                resp.headers_mut().insert(SESSION_HEADER, v);
            }
            resp
        }
        other => {
            gw.sessions().close(&session.id);
            match other {
                Some(r) => json_response(StatusCode::BAD_REQUEST, &r),
                None => bad_request("initialize failed"),
            }
        }
    }
}

/// A JSON-RPC batch (2025-03-26 only): every reply in one JSON array.
async fn legacy_batch(
    gw: Gateway,
    reg: Arc<RegistrationState>,
    headers: &HeaderMap,
    items: Vec<Value>,
) -> Response {
    let version = match legacy_version(headers) {
        Ok(v) => v,
        Err(r) => return r,
    };
    if items.is_empty() {
        return bad_request("invalid request: empty batch");
    }
    let session = match require_session(&gw, &reg, headers) {
        Ok(s) => s,
        Err(r) => return r,
    };
    if version != BATCH_VERSION || session.protocol_version() != Some(BATCH_VERSION) {
        return bad_request(
            "invalid request: JSON-RPC batches are accepted for protocol version 2025-03-26 only",
        );
    }
    let ctx = session_ctx(&gw, &reg, &session);
    let mut calls = Vec::new();
    let mut replies = Vec::new();
    for item in items {
        match jsonrpc::classify(item) {
            Err(e) => replies.push(e.to_value()),
            Ok(Message::Request { id, method, .. }) if method == "initialize" => replies.push(
                jsonrpc::RpcError::new(
                    Some(id),
                    jsonrpc::INVALID_REQUEST,
                    "invalid request: initialize must not be part of a batch",
                )
                .to_value(),
            ),
            Ok(Message::Request { id, method, params }) => {
                let cancel = session.begin_call(&id);
                let ctx = ctx.clone();
                let session = session.clone();
                calls.push(async move {
                    let r =
                        dispatch::handle_request(&ctx, id.clone(), &method, params, cancel).await;
                    session.end_call(&id);
                    r
                });
            }
            Ok(Message::Notification { method, params }) => {
                dispatch::handle_notification(&ctx, &method, params.as_ref())
            }
            Ok(Message::Response { id, body }) => {
                ctx.gateway
                    .pool()
                    .client_response(&ctx.registration.id, &session.id, &id, &body);
            }
        }
    }
    replies.extend(futures::future::join_all(calls).await.into_iter().flatten());
    if replies.is_empty() {
        return accepted();
    }
    json_response(StatusCode::OK, &Value::Array(replies))
}

/// How a request's reply is framed.
pub(crate) struct ReplyOpts {
    /// Send a priming event (empty data with an id) first (clients at ≥ 2025-11-25).
    pub priming: bool,
    /// Cancel the call when the response is dropped (stateless: disconnect = cancel).
    pub cancel_on_drop: bool,
    pub method: String,
    /// Applied to the final response (stateless: `resultType`, cache fields).
    pub finish: Option<fn(Value, &str) -> Value>,
}

/// Cancels a call when dropped, unless disarmed (the call finished).
struct CancelOnDrop(Option<CancellationToken>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.cancel();
        }
    }
}

enum First {
    Done(Option<Value>),
    Stream(Option<Value>),
}

type WorkFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Value>> + Send>>;

/// A call's work (tracked by the registration's `calls` tracker), polled by the request that
/// started it: no task hop between the call and its response. If the response goes away
/// before the work ends (the client disconnected), the rest of the work is spawned, so the
/// call still ends properly — it runs on, or (stateless) sees its cancellation, tells the
/// upstream and is audited.
struct CallWork(Option<WorkFuture>);

impl std::future::Future for CallWork {
    type Output = Option<Value>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Value>> {
        let Some(work) = self.0.as_mut() else {
            return std::task::Poll::Ready(None);
        };
        let out = work.as_mut().poll(cx);
        if out.is_ready() {
            self.0 = None;
        }
        out
    }
}

impl Drop for CallWork {
    fn drop(&mut self) {
        if let Some(work) = self.0.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = work.await;
                });
            }
        }
    }
}

/// Runs a request and answers it: JSON if the result comes first, SSE if a notification
/// does (or the call outlives a keep-alive period).
pub(crate) async fn reply(
    mut ctx: RequestCtx,
    id: Value,
    method: String,
    params: Option<Value>,
    cancel: CancellationToken,
    opts: ReplyOpts,
) -> Response {
    let gw = ctx.gateway.clone();
    let stop = ctx.registration.cancel.clone();
    let guard = CancelOnDrop(opts.cancel_on_drop.then(|| cancel.clone()));
    let (ntx, mut nrx) = mpsc::channel::<Value>(gw.sessions().config().queue.max(1));
    ctx.notify = Some(ntx);
    let session = ctx.session.clone();
    let calls = ctx.registration.calls.clone();
    let call_method = method.clone();
    let work = async move {
        let r = dispatch::handle_request(&ctx, id.clone(), &call_method, params, cancel).await;
        if let Some(s) = &session {
            s.end_call(&id);
        }
        drop(ctx);
        r
    };
    let mut work = CallWork(Some(Box::pin(calls.track_future(work))));
    let period = Duration::from_secs(gw.config().keepalive_s.max(1));
    let first = tokio::select! {
        biased;
        n = nrx.recv() => match n {
            Some(n) => First::Stream(Some(n)),
            None => First::Done((&mut work).await),
        },
        r = &mut work => First::Done(r),
        _ = tokio::time::sleep(period) => First::Stream(None),
    };
    let finish = |v: Value| match opts.finish {
        Some(f) => f(v, &opts.method),
        None => v,
    };
    // Notifications the call sent in the poll in which it ended are still queued: they go
    // out first, on a stream, before the result.
    let mut early = Vec::new();
    if matches!(first, First::Done(Some(_))) {
        while let Ok(n) = nrx.try_recv() {
            early.push(n);
        }
    }
    let streamed = |notes: Vec<Value>, ended: Option<Value>, live, guard| {
        let mut pending = VecDeque::new();
        if opts.priming {
            pending.push_back(priming_event());
        }
        pending.extend(notes.iter().map(|n| sse_json("message", n)));
        pending.extend(ended.map(|v| sse_json("message", &finish(v))));
        let (notes, result) = match live {
            Some((notes, work)) => (Some(notes), Some(work)),
            None => (None, None),
        };
        let st = ReplyStream {
            pending,
            notes,
            result,
            ticker: tokio::time::interval_at(tokio::time::Instant::now() + period, period),
            stop: stop.clone(),
            guard,
            finish: opts.finish,
            method: opts.method.clone(),
        };
        sse_response(Body::from_stream(futures::stream::unfold(st, next_event)))
    };
    match first {
        First::Done(Some(v)) if early.is_empty() => {
            let mut guard = guard;
            guard.0 = None;
            json_response(StatusCode::OK, &finish(v))
        }
        First::Done(Some(v)) => {
            let mut guard = guard;
            guard.0 = None;
            streamed(early, Some(v), None, guard)
        }
        First::Done(None) => {
            let mut guard = guard;
            guard.0 = None;
            if stop.is_cancelled() {
                return http_error(
                    StatusCode::NOT_FOUND,
                    jsonrpc::INVALID_REQUEST,
                    "registration released",
                );
            }
            // Cancelled by the client: no reply follows, the stream just ends.
            sse_response(Body::empty())
        }
        First::Stream(note) => streamed(note.into_iter().collect(), None, Some((nrx, work)), guard),
    }
}

/// The priming event (2025-11-25 and later): an event id and empty data, so a client has an
/// id to resume from before the first message.
fn priming_event() -> Bytes {
    Bytes::from(format!("id: {}\ndata: \n\n", random_b64(9)))
}

struct ReplyStream {
    pending: VecDeque<Bytes>,
    notes: Option<mpsc::Receiver<Value>>,
    result: Option<CallWork>,
    ticker: tokio::time::Interval,
    stop: CancellationToken,
    guard: CancelOnDrop,
    finish: Option<fn(Value, &str) -> Value>,
    method: String,
}

async fn recv_note(rx: &mut Option<mpsc::Receiver<Value>>) -> Option<Value> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

async fn next_event(mut st: ReplyStream) -> Option<(Result<Bytes, Infallible>, ReplyStream)> {
    loop {
        if let Some(b) = st.pending.pop_front() {
            return Some((Ok(b), st));
        }
        let mut result = st.result.take()?;
        tokio::select! {
            biased;
            _ = st.stop.cancelled() => return None,
            n = recv_note(&mut st.notes) => match n {
                Some(n) => st.pending.push_back(sse_json("message", &n)),
                None => st.notes = None,
            },
            r = &mut result => {
                st.guard.0 = None;
                let v = r?;
                let v = match st.finish {
                    Some(f) => f(v, &st.method),
                    None => v,
                };
                // Notifications sent in the poll in which the call ended come first.
                if let Some(notes) = st.notes.as_mut() {
                    while let Ok(n) = notes.try_recv() {
                        st.pending.push_back(sse_json("message", &n));
                    }
                }
                st.notes = None;
                st.pending.push_back(sse_json("message", &v));
                continue;
            }
            _ = st.ticker.tick() => st.pending.push_back(Bytes::from_static(b": keepalive\n\n")),
        }
        st.result = Some(result);
    }
}

fn sse_response(body: Body) -> Response {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-transform"),
    );
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// Clears a session's GET stream when the stream is dropped.
struct GetStreamGuard {
    session: Arc<Session>,
    tx: mpsc::Sender<Value>,
}

impl Drop for GetStreamGuard {
    fn drop(&mut self) {
        if self
            .session
            .outbound()
            .is_some_and(|cur| cur.same_channel(&self.tx))
        {
            self.session.set_outbound(None);
        }
        self.session.stream_closed();
    }
}

struct GetStream {
    pending: VecDeque<Bytes>,
    rx: mpsc::Receiver<Value>,
    cancel: CancellationToken,
    ticker: tokio::time::Interval,
    _guard: GetStreamGuard,
}

/// `GET /gw/<id>/mcp`: the session's server-to-client stream (one per session; 409 for a
/// second). `notifications/tools/list_changed` travel here.
pub async fn get(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let reg = match authorize(&gw, &id, super::Surface::Mcp, &headers) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    if !accepts(&headers, false, true) {
        return http_error(
            StatusCode::NOT_ACCEPTABLE,
            jsonrpc::INVALID_REQUEST,
            "not acceptable: Accept must list text/event-stream",
        );
    }
    if headers.get(SESSION_HEADER).is_none()
        && header_str(&headers, VERSION_HEADER) == Some(crate::mcp::MODERN_VERSION)
    {
        let mut r = http_error(
            StatusCode::METHOD_NOT_ALLOWED,
            jsonrpc::INVALID_REQUEST,
            "method not allowed: 2026-07-28 has no GET stream",
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return r;
    }
    let version = match legacy_version(&headers) {
        Ok(v) => v.to_string(),
        Err(r) => return r,
    };
    let session = match require_session(&gw, &reg, &headers) {
        Ok(s) => s,
        Err(r) => return r,
    };
    if session.outbound().is_some() {
        return http_error(
            StatusCode::CONFLICT,
            jsonrpc::INVALID_REQUEST,
            "conflict: this session already has a GET stream",
        );
    }
    let (tx, rx) = mpsc::channel(gw.sessions().config().queue.max(1));
    session.set_outbound(Some(tx.clone()));
    session.stream_opened();
    let period = Duration::from_secs(gw.config().keepalive_s.max(1));
    let mut pending = VecDeque::new();
    if version.as_str() >= PRIMING_SINCE {
        pending.push_back(priming_event());
    }
    let st = GetStream {
        pending,
        rx,
        cancel: session.cancel.clone(),
        ticker: tokio::time::interval_at(tokio::time::Instant::now() + period, period),
        _guard: GetStreamGuard {
            session: session.clone(),
            tx,
        },
    };
    let stream = futures::stream::unfold(st, |mut st| async move {
        if let Some(b) = st.pending.pop_front() {
            return Some((Ok::<_, Infallible>(b), st));
        }
        tokio::select! {
            biased;
            _ = st.cancel.cancelled() => None,
            msg = st.rx.recv() => msg.map(|v| (Ok(sse_json("message", &v)), st)),
            _ = st.ticker.tick() => Some((Ok(Bytes::from_static(b": keepalive\n\n")), st)),
        }
    });
    let mut resp = sse_response(Body::from_stream(stream));
    if let Ok(v) = HeaderValue::from_str(&session.id) {
        resp.headers_mut().insert(SESSION_HEADER, v);
    }
    resp
}

/// `DELETE /gw/<id>/mcp`: ends the session through the table's one close path.
pub async fn delete(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let reg = match authorize(&gw, &id, super::Surface::Mcp, &headers) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let session = match require_session(&gw, &reg, &headers) {
        Ok(s) => s,
        Err(r) => return r,
    };
    gw.sessions().close(&session.id);
    tracing::debug!(registration = %reg.id, session = %session.id, "streamable session deleted");
    StatusCode::OK.into_response()
}

/// Sends `notifications/tools/list_changed` to every session of a registration, each on its
/// one server-to-client stream (SSE stream or Streamable HTTP GET). Returns how many got it.
pub fn notify_tools_list_changed(gw: &Gateway, registration_id: &str) -> usize {
    let msg = jsonrpc::notification("notifications/tools/list_changed", None);
    gw.sessions()
        .sessions_of(registration_id)
        .iter()
        .filter_map(|s| s.outbound())
        .filter(|tx| tx.try_send(msg.clone()).is_ok())
        .count()
}
