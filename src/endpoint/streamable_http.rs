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
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;

use super::door::{self, Authorized, Heads, Routed};
use super::event_stream;
use super::reply::{call_work, reply, ReplyOpts};
use super::{
    header_str, json_response, Rejection, SESSION_HEADER, SESSION_NAME, VERSION_HEADER,
    VERSION_NAME,
};
use crate::hub::Hub;
use crate::methods::dispatch;
use crate::methods::request::RequestCtx;
use crate::protocol::jsonrpc::{self, Body as RpcBody, Message};
use crate::protocol::RpcError;
use crate::protocol::{Version, ALL_VERSIONS, BATCH_VERSION};
use crate::registration::RegistrationState;
use crate::session::{Outbound, Session, Transport};

/// What a handshake-era request without `MCP-Protocol-Version` is assumed to speak.
const ASSUMED_VERSION: Version = Version::BATCH;

/// `Accept` values listing exactly `application/json` and `text/event-stream`, as SDKs write them.
const COMMON_ACCEPTS: [&[u8]; 4] = [
    b"application/json, text/event-stream",
    b"text/event-stream, application/json",
    b"application/json,text/event-stream",
    b"text/event-stream,application/json",
];

/// Does `Accept` list both `application/json` and `text/event-stream`?
fn accepts(headers: &HeaderMap, json: bool, sse: bool) -> bool {
    let mut has_json = false;
    let mut has_sse = false;
    for v in headers.get_all(header::ACCEPT) {
        // What clients send nearly always, compared whole before the general parse below
        // (its splitting and trimming cost more than the rest of the header checks).
        if COMMON_ACCEPTS.contains(&v.as_bytes()) {
            has_json = true;
            has_sse = true;
            continue;
        }
        for item in v.as_bytes().split(|b| *b == b',') {
            let media = item
                .split(|b| *b == b';')
                .next()
                .unwrap_or_default()
                .trim_ascii();
            has_json |= media.eq_ignore_ascii_case(b"application/json");
            has_sse |= media.eq_ignore_ascii_case(b"text/event-stream");
        }
    }
    (!json || has_json) && (!sse || has_sse)
}

fn accepted() -> Result<Response, Rejection> {
    Ok(StatusCode::ACCEPTED.into_response())
}

/// The session a handshake-era request names ([`door::session`] on its first
/// `Mcp-Session-Id` value).
fn require_session(
    gw: &Hub,
    reg: &RegistrationState,
    session: Option<&HeaderValue>,
) -> Result<Arc<Session>, Rejection> {
    let sid = session.and_then(|v| v.to_str().ok());
    door::session(gw, reg, sid, Transport::StreamableHttp)
}

/// The handshake-era version of a request: the header, validated, or 2025-03-26.
fn legacy_version(headers: &HeaderMap) -> Result<Version, Rejection> {
    legacy_version_of(headers.get(&VERSION_NAME))
}

/// [`legacy_version`] of the request's first `MCP-Protocol-Version` value.
fn legacy_version_of(version: Option<&HeaderValue>) -> Result<Version, Rejection> {
    match version {
        None => Ok(ASSUMED_VERSION),
        Some(v) => match v.to_str().ok().and_then(Version::parse) {
            Some(v) if v.is_legacy() => Ok(v),
            _ => Err(Rejection::bad_request(format!(
                "bad request: unsupported MCP-Protocol-Version (supported: {})",
                ALL_VERSIONS.join(", ")
            ))),
        },
    }
}

/// `POST /gw/<id>/mcp`. Takes the whole request (not a `HeaderMap` extractor, which clones
/// every header) and keeps its headers.
///
/// Not an `async fn`: its arguments would sit in its state beside the parts taken from them
/// (the request, its parts, their headers: ~560 bytes), and this future is moved into the
/// connection's boxed request future with every request.
pub fn post(
    State(gw): State<Arc<Hub>>,
    Path(id): Path<String>,
    request: axum::extract::Request,
) -> impl std::future::Future<Output = Result<Response, Rejection>> + Send {
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    async move {
        let heads = Heads::of(&headers);
        let reg = door::authorize_with(&gw, &id, super::Surface::Mcp, &headers, &heads)?;
        if !accepts(&headers, true, true) {
            return Err(Rejection::new(
                crate::refusals::Reason::BadRequest,
                StatusCode::NOT_ACCEPTABLE,
                RpcError::invalid_request(
                    "not acceptable: Accept must list application/json and text/event-stream",
                ),
            ));
        }
        let bytes = door::json_body(&heads, body, gw.config())?.await?;
        // The common case: one valid request or notification, read without a `Value` envelope.
        if let Some(msg) = jsonrpc::parse_request(&bytes) {
            let stateless = super::stateless::is_stateless_with(
                msg.method(),
                msg.params(),
                heads.session,
                heads.version,
            );
            return if stateless {
                super::stateless::handle(gw, reg, headers, Ok(msg)).await
            } else {
                legacy_single(gw, reg, &headers, &heads, Ok(msg)).await
            };
        }
        // Everything else (responses, batches, malformed messages) is rare and boxed, like
        // `initialize` below (ARCHITECTURE.md, Decisions: request futures).
        Box::pin(post_general(gw, reg, headers, bytes)).await
    }
}

/// A body the direct parse left alone: parsed into a `Value`, then classified (which words
/// the errors).
async fn post_general(
    gw: Arc<Hub>,
    reg: Arc<RegistrationState>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Result<Response, Rejection> {
    let parsed = door::parse_body(&bytes)?;
    match parsed {
        RpcBody::Single(v) => {
            let method = v.get("method").and_then(Value::as_str);
            if super::stateless::is_stateless(method, v.get("params"), &headers) {
                super::stateless::handle(gw, reg, headers, jsonrpc::classify(v)).await
            } else {
                let heads = Heads::of(&headers);
                legacy_single(gw, reg, &headers, &heads, jsonrpc::classify(v)).await
            }
        }
        RpcBody::Batch(items) => legacy_batch(gw, reg, &headers, items).await,
    }
}

/// A handshake-era message (or why it is not a valid one: reported after the version check).
async fn legacy_single(
    gw: Arc<Hub>,
    reg: Arc<RegistrationState>,
    headers: &HeaderMap,
    heads: &Heads<'_>,
    msg: Result<Message, jsonrpc::RpcError>,
) -> Result<Response, Rejection> {
    // Only whether priming events are sent depends on the version: no copy of it is kept.
    let priming = legacy_version_of(heads.version)? >= Version::PRIMING_SINCE;
    let msg = msg.map_err(Rejection::malformed)?;
    if let Message::Request { id, method, params } = &msg {
        if method == "initialize" {
            return Box::pin(initialize(gw, reg, id.clone(), params.clone(), headers)).await;
        }
    }
    let session = require_session(&gw, &reg, heads.session)?;
    let ctx = session_ctx(&gw, &reg, &session, headers);
    match door::route(&ctx, &session, msg) {
        Routed::Call(c) => {
            let opts = ReplyOpts {
                priming,
                cancel_on_drop: false,
                // Read by `finish` only (none here): no copy of the method.
                method: String::new(),
                finish: None,
                mrtr: None,
            };
            reply(ctx, c.id, c.method, c.params, c.cancel, opts).await
        }
        Routed::Refused(why, id) => Err(Rejection::call_refused(why, id)),
        Routed::Handled => accepted(),
    }
}

/// A session's request context ([`door::request_ctx`]: the HTTP trace headers included).
fn session_ctx(
    gw: &Arc<Hub>,
    reg: &Arc<RegistrationState>,
    session: &Arc<Session>,
    headers: &HeaderMap,
) -> RequestCtx {
    door::request_ctx(gw, reg, Some(session), Transport::StreamableHttp, headers)
}

/// `initialize`: mints a session bound to the registration. The session enters the table
/// only if the handshake succeeds; a failed one is closed at once.
async fn initialize(
    gw: Arc<Hub>,
    reg: Arc<RegistrationState>,
    id: Value,
    params: Option<Value>,
    headers: &HeaderMap,
) -> Result<Response, Rejection> {
    let session = gw
        .sessions()
        .create(&reg, Transport::StreamableHttp)
        .map_err(|e| Rejection::unavailable(e.to_string()))?;
    // The HTTP `traceparent` (tracing on) is the span's parent when `_meta` has none.
    let ctx = session_ctx(&gw, &reg, &session, headers);
    let reply =
        dispatch::handle_request(&ctx, id, "initialize", params, session.cancel.child_token())
            .await
            .map(jsonrpc::Reply::into_value);
    match reply {
        Some(r) if r.get("result").is_some() => {
            tracing::debug!(registration = %reg.id, session = %session.id, "streamable session opened");
            let mut resp = json_response(StatusCode::OK, &r);
            if let Ok(v) = HeaderValue::from_str(&session.id) {
                resp.headers_mut().insert(SESSION_HEADER, v);
            }
            Ok(resp)
        }
        other => {
            gw.sessions().close(&session.id);
            match other {
                Some(r) => Ok(json_response(StatusCode::BAD_REQUEST, &r)),
                None => Err(Rejection::bad_request("initialize failed")),
            }
        }
    }
}

/// A JSON-RPC batch (2025-03-26 only): every reply in one JSON array.
async fn legacy_batch(
    gw: Arc<Hub>,
    reg: Arc<RegistrationState>,
    headers: &HeaderMap,
    items: Vec<Value>,
) -> Result<Response, Rejection> {
    let version = legacy_version(headers)?;
    if items.is_empty() {
        return Err(Rejection::bad_request("invalid request: empty batch"));
    }
    let session = require_session(&gw, &reg, headers.get(&SESSION_NAME))?;
    if version != Version::BATCH || session.protocol_version() != Some(BATCH_VERSION) {
        return Err(Rejection::bad_request(
            format!("invalid request: JSON-RPC batches are accepted for protocol version {BATCH_VERSION} only"),
        ));
    }
    let ctx = session_ctx(&gw, &reg, &session, headers);
    let mut calls = Vec::new();
    let mut replies = Vec::new();
    for item in items {
        match jsonrpc::classify(item) {
            Err(e) => replies.push(e.to_value()),
            Ok(Message::Request { id, method, .. }) if method == "initialize" => replies.push(
                jsonrpc::RpcError::invalid_request(
                    "invalid request: initialize must not be part of a batch",
                )
                .to(id)
                .to_value(),
            ),
            Ok(msg) => match door::route(&ctx, &session, msg) {
                // Through the reply engine's `CallWork`, like every other call: if the client
                // goes away, the rest of each call is spawned, so it ends, is audited and
                // leaves the session's in-flight ids.
                Routed::Call(c) => {
                    calls.push(call_work(ctx.clone(), c.id, c.method, c.params, c.cancel))
                }
                Routed::Refused(why, id) => replies.push(Rejection::call_refused_value(why, id)),
                Routed::Handled => {}
            },
        }
    }
    replies.extend(
        futures::future::join_all(calls)
            .await
            .into_iter()
            .flatten()
            .map(jsonrpc::Reply::into_value),
    );
    if replies.is_empty() {
        return accepted();
    }
    Ok(json_response(StatusCode::OK, &Value::Array(replies)))
}

/// Clears a session's GET stream when the stream is dropped.
struct GetStreamGuard {
    session: Arc<Session>,
    tx: Outbound,
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

/// `GET /gw/<id>/mcp`: the session's server-to-client stream (one per session; 409 for a
/// second). `notifications/tools/list_changed` travel here.
pub async fn get(
    Authorized {
        gw, reg, headers, ..
    }: Authorized<door::Mcp>,
) -> Result<Response, Rejection> {
    if !accepts(&headers, false, true) {
        return Err(Rejection::new(
            crate::refusals::Reason::BadRequest,
            StatusCode::NOT_ACCEPTABLE,
            RpcError::invalid_request("not acceptable: Accept must list text/event-stream"),
        ));
    }
    if headers.get(SESSION_HEADER).is_none()
        && header_str(&headers, VERSION_HEADER) == Some(crate::protocol::MODERN_VERSION)
    {
        return Err(Rejection::new(
            crate::refusals::Reason::BadRequest,
            StatusCode::METHOD_NOT_ALLOWED,
            RpcError::invalid_request("method not allowed: 2026-07-28 has no GET stream"),
        )
        .with_header(header::ALLOW, HeaderValue::from_static("POST")));
    }
    let version = legacy_version(&headers)?;
    let session = require_session(&gw, &reg, headers.get(&SESSION_NAME))?;
    if session.has_outbound() {
        return Err(Rejection::new(
            crate::refusals::Reason::BadRequest,
            StatusCode::CONFLICT,
            RpcError::invalid_request("conflict: this session already has a GET stream"),
        ));
    }
    let (tx, rx) = Outbound::new(gw.sessions().config());
    session.set_outbound(Some(tx.clone()));
    session.stream_opened();
    let period = Duration::from_secs(gw.config().keepalive_s.max(1));
    let mut first = VecDeque::new();
    if version >= Version::PRIMING_SINCE {
        first.push_back(event_stream::priming_event());
    }
    let guard = GetStreamGuard {
        session: session.clone(),
        tx,
    };
    let mut resp = event_stream::session_stream(first, rx, session.cancel.clone(), period, guard);
    if let Ok(v) = HeaderValue::from_str(&session.id) {
        resp.headers_mut().insert(SESSION_HEADER, v);
    }
    Ok(resp)
}

/// `DELETE /gw/<id>/mcp`: ends the session through the table's one close path.
pub async fn delete(
    Authorized {
        gw, reg, headers, ..
    }: Authorized<door::Mcp>,
) -> Result<Response, Rejection> {
    let session = require_session(&gw, &reg, headers.get(&SESSION_NAME))?;
    gw.sessions().close(&session.id);
    tracing::debug!(registration = %reg.id, session = %session.id, "streamable session deleted");
    Ok(StatusCode::OK.into_response())
}
