//! Legacy HTTP+SSE (2024-11-05): `GET /gw/<id>/sse` opens a session's stream, whose first
//! event names the POST endpoint; `POST /gw/<id>/messages/?session_id=…` answers 202 and the
//! reply travels on the stream. The session ends when its stream closes.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{authorize, http_error, is_json, query_param, read_body};
use crate::gateway::Gateway;
use crate::mcp::dispatch::{self, RequestCtx};
use crate::mcp::jsonrpc::{self, Body as RpcBody, Message};
use crate::session::{Session, Transport};

/// Closes the session when the stream is dropped (client gone, release, shutdown).
struct SessionGuard {
    gateway: Gateway,
    session_id: String,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.gateway.sessions().close(&self.session_id);
    }
}

struct StreamState {
    endpoint: Option<String>,
    rx: mpsc::Receiver<Value>,
    cancel: CancellationToken,
    ticker: tokio::time::Interval,
    _guard: SessionGuard,
}

/// The SSE framing of one message.
/// An SSE event whose data is a JSON value. Compact JSON holds no line break (control
/// characters in strings are escaped), so it is one `data:` line, encoded in place.
pub fn sse_json(event: &str, value: &serde_json::Value) -> Bytes {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    let head = out.len();
    // Serializing a `Value` into a `Vec` cannot fail (map keys are strings, a `Vec` write does
    // not fail); should it, the event carries `null` rather than half a value.
    if serde_json::to_writer(&mut out, value).is_err() {
        out.truncate(head);
        out.extend_from_slice(b"null");
    }
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

pub fn sse_event(event: &str, data: &str) -> Bytes {
    let mut s = String::with_capacity(data.len() + event.len() + 16);
    s.push_str("event: ");
    s.push_str(event);
    s.push('\n');
    // Every line ending SSE knows (CRLF, LF, lone CR) starts a new `data:` line, so no text
    // can end the event early or inject a field.
    let mut rest = data;
    loop {
        let end = rest.find(['\r', '\n']).unwrap_or(rest.len());
        s.push_str("data: ");
        s.push_str(&rest[..end]);
        s.push('\n');
        if end == rest.len() {
            break;
        }
        let skip = if rest[end..].starts_with("\r\n") {
            2
        } else {
            1
        };
        rest = &rest[end + skip..];
    }
    s.push('\n');
    Bytes::from(s)
}

/// `GET /gw/<id>/sse`.
pub async fn open(
    State(gw): State<Gateway>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let reg = match authorize(&gw, &id, super::Surface::Sse, &headers) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let session = match gw.sessions().create(&reg, Transport::Sse) {
        Ok(s) => s,
        Err(e) => {
            return http_error(
                StatusCode::SERVICE_UNAVAILABLE,
                jsonrpc::INTERNAL_ERROR,
                &e.to_string(),
            )
        }
    };
    let (tx, rx) = mpsc::channel(gw.sessions().config().queue.max(1));
    session.set_outbound(Some(tx));
    session.stream_opened();
    let endpoint = format!("/gw/{}/messages/?session_id={}", reg.id, session.id);
    let period = Duration::from_secs(gw.config().keepalive_s.max(1));
    let state = StreamState {
        endpoint: Some(endpoint),
        rx,
        cancel: session.cancel.clone(),
        ticker: tokio::time::interval_at(tokio::time::Instant::now() + period, period),
        _guard: SessionGuard {
            gateway: gw.clone(),
            session_id: session.id.clone(),
        },
    };
    tracing::debug!(registration = %reg.id, session = %session.id, "sse session opened");
    let stream = futures::stream::unfold(state, |mut st| async move {
        if let Some(ep) = st.endpoint.take() {
            return Some((Ok::<_, Infallible>(sse_event("endpoint", &ep)), st));
        }
        tokio::select! {
            biased;
            _ = st.cancel.cancelled() => None,
            msg = st.rx.recv() => msg.map(|v| (Ok(sse_json("message", &v)), st)),
            _ = st.ticker.tick() => Some((Ok(Bytes::from_static(b": keepalive\n\n")), st)),
        }
    });
    let mut resp = Response::new(Body::from_stream(stream));
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

/// Sends a message on a session's stream; a reader stuck past the grace
/// (`sessions.slow_reader_grace_ms`) loses its session. Returns whether the message was queued.
pub async fn deliver(gw: &Gateway, session: &Session, msg: Value) -> bool {
    let Some(tx) = session.outbound() else {
        return false;
    };
    if session.cancel.is_cancelled() {
        return false;
    }
    // Room in the queue (the usual case): no deadline to set up.
    let msg = match tx.try_send(msg) {
        Ok(()) => return true,
        Err(mpsc::error::TrySendError::Closed(_)) => return false,
        Err(mpsc::error::TrySendError::Full(msg)) => msg,
    };
    let grace = Duration::from_millis(gw.sessions().config().slow_reader_grace_ms);
    match tx.send_timeout(msg, grace).await {
        Ok(()) => true,
        Err(e) => {
            if matches!(e, mpsc::error::SendTimeoutError::Timeout(_)) {
                tracing::warn!(session = %session.id, "slow SSE reader: session closed");
                gw.sessions().close(&session.id);
            }
            false
        }
    }
}

/// `POST /gw/<id>/messages/?session_id=…` (also `sessionId`).
pub async fn message(State(gw): State<Gateway>, Path(id): Path<String>, req: Request) -> Response {
    // The request taken whole: the `HeaderMap` and `Uri` extractors would clone them.
    let (parts, body) = req.into_parts();
    let (uri, headers) = (&parts.uri, &parts.headers);
    let reg = match authorize(&gw, &id, super::Surface::Sse, headers) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let Some(sid) =
        query_param(uri.query(), &["session_id", "sessionId"]).filter(|s| !s.is_empty())
    else {
        return http_error(
            StatusCode::BAD_REQUEST,
            jsonrpc::INVALID_REQUEST,
            "session_id is required",
        );
    };
    let Some(session) = gw.sessions().get(&reg.id, sid) else {
        return http_error(
            StatusCode::NOT_FOUND,
            jsonrpc::INVALID_REQUEST,
            "session not found",
        );
    };
    session.touch();
    if !is_json(headers) {
        return http_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            jsonrpc::INVALID_REQUEST,
            "Content-Type must be application/json",
        );
    }
    let bytes = match read_body(body, gw.config().max_body_bytes).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    // One valid request or notification is read directly; anything else takes the general
    // path, which words the errors.
    let msg = match jsonrpc::parse_request(&bytes) {
        Some(m) => m,
        None => match general_message(&bytes) {
            Ok(m) => m,
            Err(resp) => return resp,
        },
    };
    let ctx = RequestCtx {
        gateway: gw.clone(),
        registration: reg.clone(),
        session: Some(session.clone()),
        transport: Transport::Sse,
        protocol_version: session.protocol_version().unwrap_or("2024-11-05"),
        notify: session.outbound(),
    };
    match msg {
        Message::Request { id, method, params } => {
            let cancel = session.begin_call(&id);
            spawn_request(ctx, session, id, method, params, cancel);
        }
        Message::Notification { method, params } => {
            dispatch::handle_notification(&ctx, &method, params.as_ref());
        }
        Message::Response { id, body } => {
            if !gw.pool().client_response(&reg.id, &session.id, &id, &body) {
                tracing::debug!(session = %session.id, "response from client ignored: no request pending");
            }
        }
    }
    (StatusCode::ACCEPTED, "Accepted").into_response()
}

/// A body the direct parse left alone: parsed into a `Value`, then classified.
fn general_message(bytes: &[u8]) -> Result<Message, Response> {
    match jsonrpc::parse_body(bytes) {
        Ok(RpcBody::Single(v)) => jsonrpc::classify(v)
            .map_err(|e| super::json_response(StatusCode::BAD_REQUEST, &e.to_value())),
        Ok(RpcBody::Batch(_)) => Err(http_error(
            StatusCode::BAD_REQUEST,
            jsonrpc::INVALID_REQUEST,
            "invalid request: JSON-RPC batches are not accepted on the SSE transport",
        )),
        Err(e) => Err(super::json_response(StatusCode::BAD_REQUEST, &e.to_value())),
    }
}

fn spawn_request(
    ctx: RequestCtx,
    session: Arc<Session>,
    id: Value,
    method: String,
    params: Option<Value>,
    cancel: CancellationToken,
) {
    let calls = ctx.registration.calls.clone();
    let work = async move {
        // Notifications of this call (progress, logs) go through `deliver` too, so a stuck
        // reader closes the session instead of blocking the call forever on a full queue.
        // They are delivered in order, before the reply.
        let (ntx, mut nrx) = mpsc::channel::<Value>(1);
        let mut ctx = ctx;
        ctx.notify = Some(ntx);
        let gw = ctx.gateway.clone();
        let call_id = id.clone();
        let work = async move {
            dispatch::handle_request(&ctx, call_id, &method, params, cancel).await
            // `ctx` (and its sender) is dropped here.
        };
        tokio::pin!(work);
        let mut notes_open = true;
        let reply = loop {
            tokio::select! {
                biased;
                n = nrx.recv(), if notes_open => match n {
                    Some(n) => {
                        deliver(&gw, &session, n).await;
                    }
                    None => notes_open = false,
                },
                r = &mut work => break r,
            }
        };
        while let Ok(n) = nrx.try_recv() {
            deliver(&gw, &session, n).await;
        }
        session.end_call(&id);
        if let Some(r) = reply {
            deliver(&gw, &session, r).await;
        }
    };
    // Spawned, not polled here first: the POST is answered 202 at once, whatever the tool does
    // (even one that blocks its thread), and the reply follows on the stream.
    calls.spawn(work);
}
