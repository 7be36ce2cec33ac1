//! Legacy HTTP+SSE (2024-11-05): `GET /gw/<id>/sse` opens a session's stream, whose first
//! event names the POST endpoint; `POST /gw/<id>/messages/?session_id=…` answers 202 and the
//! reply travels on the stream. The session ends when its stream closes.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::door::{self, Authorized, Heads, Routed};
use super::event_stream::{self, sse_event};
use super::reply;
use super::{query_param, Rejection};
use crate::hub::Hub;
use crate::protocol::jsonrpc::{self, Body as RpcBody, Message};
use crate::session::{Outbound, Transport};

/// Closes the session when the stream is dropped (client gone, release, shutdown).
struct SessionGuard {
    hub: Arc<Hub>,
    session_id: String,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.hub.sessions().close(&self.session_id);
    }
}

/// `GET /gw/<id>/sse`.
pub async fn open(
    Authorized { gw, reg, .. }: Authorized<door::Sse>,
) -> Result<Response, Rejection> {
    let session = gw
        .sessions()
        .create(&reg, Transport::Sse)
        .map_err(|e| Rejection::unavailable(e.to_string()))?;
    let (tx, rx) = Outbound::new(gw.sessions().config());
    session.set_outbound(Some(tx));
    session.stream_opened();
    let endpoint = format!("/gw/{}/messages/?session_id={}", reg.id, session.id);
    let period = Duration::from_secs(gw.config().keepalive_s.max(1));
    let guard = SessionGuard {
        hub: gw.clone(),
        session_id: session.id.clone(),
    };
    tracing::debug!(registration = %reg.id, session = %session.id, "sse session opened");
    let first = VecDeque::from([sse_event("endpoint", &endpoint)]);
    Ok(event_stream::session_stream(
        first,
        rx,
        session.cancel.clone(),
        period,
        guard,
    ))
}

/// `POST /gw/<id>/messages/?session_id=…` (also `sessionId`).
pub fn message(
    State(gw): State<Arc<Hub>>,
    Path(id): Path<String>,
    req: Request,
) -> impl std::future::Future<Output = Result<Response, Rejection>> + Send {
    // The request taken whole: the `HeaderMap` and `Uri` extractors would clone them.
    let (parts, body) = req.into_parts();
    // Not an `async fn`: the request would stay in its state beside its parts.
    async move {
        let (uri, headers) = (&parts.uri, &parts.headers);
        let heads = Heads::of(headers);
        let reg = door::authorize_with(&gw, &id, super::Surface::Sse, headers, &heads)?;
        let sid = query_param(uri.query(), &["session_id", "sessionId"]);
        let session = door::session(&gw, &reg, sid, Transport::Sse)?;
        let bytes = door::json_body(&heads, body, gw.config())?.await?;
        // One valid request or notification is read directly; anything else takes the general
        // path, which words the errors.
        let msg = match jsonrpc::parse_request(&bytes) {
            Some(m) => m,
            None => general_message(&bytes)?,
        };
        // A request gets its own notes channel (`reply::to_session_stream`).
        let ctx = door::request_ctx(&gw, &reg, Some(&session), Transport::Sse, headers);
        match door::route(&ctx, &session, msg) {
            Routed::Call(c) => {
                reply::to_session_stream(ctx, session, c.id, c.method, c.params, c.cancel)
            }
            Routed::Refused(why, id) => return Err(Rejection::call_refused(why, id)),
            Routed::Handled => {}
        }
        // As the TypeScript SDK's SSE transport answers: 202 and "Accepted", no other header
        // (a `(StatusCode, &str)` response would add a `Content-Type`, a header insert per call).
        let mut accepted = Response::new(axum::body::Body::from(bytes::Bytes::from_static(
            b"Accepted",
        )));
        *accepted.status_mut() = StatusCode::ACCEPTED;
        Ok(accepted)
    }
}

/// A body the direct parse left alone: parsed into a `Value`, then classified.
fn general_message(bytes: &[u8]) -> Result<Message, Rejection> {
    match door::parse_body(bytes)? {
        RpcBody::Single(v) => jsonrpc::classify(v).map_err(Rejection::malformed),
        RpcBody::Batch(_) => Err(Rejection::bad_request(
            "invalid request: JSON-RPC batches are not accepted on the SSE transport",
        )),
    }
}
