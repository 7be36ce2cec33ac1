//! The front door: the checks every agent request passes, written once, each refusing with
//! the one `Rejection` (and its reason): Host and Origin, registration and token
//! ([`authorize`]), content type and body limits ([`json_body`]), the parse of what the direct
//! read left alone ([`parse_body`]), the session lookup ([`session`]); a request is then served
//! with the context [`request_ctx`] builds whole (trace headers included). The transports (`sse`, `streamable_http`, `stateless`) keep only
//! what differs: their routes, `Accept`, versions, and what a message leads to.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use bytes::Bytes;

use super::oauth::{self, Surface};
use super::{origin, Rejection, SESSION_NAME, VERSION_NAME};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::hub::Hub;
use crate::methods::request::RequestCtx;
use crate::protocol::jsonrpc;
use crate::protocol::RpcError;
use crate::registration::RegistrationState;
use crate::session::{Session, Transport};

/// The headers an agent request's checks read, found in one pass over the map (a lookup by
/// name hashes the name; comparing a standard name is comparing its tag): each the first
/// value of its name, as `HeaderMap::get` gives it.
#[derive(Default)]
pub(crate) struct Heads<'a> {
    pub host: Option<&'a HeaderValue>,
    pub origin: Option<&'a HeaderValue>,
    pub authorization: Option<&'a HeaderValue>,
    pub content_type: Option<&'a HeaderValue>,
    /// `Mcp-Session-Id`.
    pub session: Option<&'a HeaderValue>,
    /// `MCP-Protocol-Version`.
    pub version: Option<&'a HeaderValue>,
}

impl<'a> Heads<'a> {
    pub(crate) fn of(headers: &'a HeaderMap) -> Self {
        let mut h = Heads::default();
        for (name, value) in headers {
            let slot = if name == header::HOST {
                &mut h.host
            } else if name == header::ORIGIN {
                &mut h.origin
            } else if name == header::AUTHORIZATION {
                &mut h.authorization
            } else if name == header::CONTENT_TYPE {
                &mut h.content_type
            } else if name == SESSION_NAME {
                &mut h.session
            } else if name == VERSION_NAME {
                &mut h.version
            } else {
                continue;
            };
            if slot.is_none() {
                *slot = Some(value);
            }
        }
        h
    }
}

/// The bearer token in a request's `Authorization` value, if it has one.
fn bearer_of(authorization: Option<&HeaderValue>) -> Option<&str> {
    let v = authorization?.to_str().ok()?;
    // A byte scan (a `str` search costs more than this short value); a space is one byte.
    let at = v.bytes().position(|c| c == b' ')?;
    let (scheme, token) = (&v[..at], &v[at + 1..]);
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The checks every agent request passes, in order: Host and Origin (403), registration
/// (404), token (401, with the OAuth-aware challenge of `oauth::unauthorized`). The token is
/// compared with this registration's token only.
pub fn authorize(
    gw: &Hub,
    id: &str,
    surface: Surface,
    headers: &HeaderMap,
) -> Result<Arc<RegistrationState>, Rejection> {
    authorize_with(gw, id, surface, headers, &Heads::of(headers))
}

/// Which surface an [`Authorized`] request is checked for.
pub trait OnSurface {
    const SURFACE: Surface;
}

/// `GET /gw/<id>/sse`.
pub struct Sse;
/// `/gw/<id>/mcp`.
pub struct Mcp;

impl OnSurface for Sse {
    const SURFACE: Surface = Surface::Sse;
}

impl OnSurface for Mcp {
    const SURFACE: Surface = Surface::Mcp;
}

/// A stream or session request (`GET /gw/<id>/sse`, `GET` and `DELETE /gw/<id>/mcp`) that
/// passed [`authorize`] for surface `S`: the hub, the registration and the headers, taken
/// from the request. The POST paths, which read a body, authorize in their own futures.
pub struct Authorized<S> {
    pub gw: Arc<Hub>,
    pub reg: Arc<RegistrationState>,
    pub headers: HeaderMap,
    surface: std::marker::PhantomData<S>,
}

impl<S: OnSurface + Send> axum::extract::FromRequestParts<Arc<Hub>> for Authorized<S> {
    type Rejection = Rejection;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        gw: &Arc<Hub>,
    ) -> Result<Self, Rejection> {
        let axum::extract::Path(id) = axum::extract::Path::<String>::from_request_parts(parts, gw)
            .await
            .map_err(|e| Rejection::bad_request(e.body_text()))?;
        let reg = authorize(gw, &id, S::SURFACE, &parts.headers)?;
        Ok(Authorized {
            gw: gw.clone(),
            reg,
            headers: std::mem::take(&mut parts.headers),
            surface: std::marker::PhantomData,
        })
    }
}

/// [`authorize`] with the request's headers already found ([`Heads`]).
pub(crate) fn authorize_with(
    gw: &Hub,
    id: &str,
    surface: Surface,
    headers: &HeaderMap,
    heads: &Heads<'_>,
) -> Result<Arc<RegistrationState>, Rejection> {
    origin::check_host_origin_values(gw.config(), heads.host, heads.origin)?;
    let Some(reg) = gw.registry().get(id) else {
        return Err(Rejection::unknown_registration(gw.registry(), id));
    };
    let why = match bearer_of(heads.authorization) {
        Some(t) if reg.token_matches(t) => return Ok(reg),
        None => oauth::Refusal::Missing,
        Some(_) => oauth::Refusal::Invalid,
    };
    let transport = match surface {
        Surface::Mcp => "streamable_http",
        Surface::Sse => "sse",
    };
    Err(oauth::unauthorized(gw, headers, id, surface, why).auth_failed(reg, transport))
}

/// A request's context, complete: every transport builds it here, once, so none can leave out
/// the trace headers (a batch once did).
pub(crate) fn request_ctx(
    gw: &Arc<Hub>,
    reg: &Arc<RegistrationState>,
    session: Option<&Arc<Session>>,
    transport: Transport,
    headers: &HeaderMap,
) -> RequestCtx {
    RequestCtx::new(
        gw.clone(),
        reg.clone(),
        session.cloned(),
        transport,
        trace_headers(gw, headers),
    )
}

/// What a session's message leads to ([`route`]).
pub(crate) enum Routed {
    /// A request, begun on the session (its id in flight): the call the transport answers.
    Call(Begun),
    /// A request the session refuses (its id in flight already, or too many in flight).
    Refused(crate::session::CallRefused, Value),
    /// A notification or the client's response, handled: nothing to answer.
    Handled,
}

/// A request begun on a session: its id is in flight until the call ends.
pub(crate) struct Begun {
    pub id: Value,
    pub method: String,
    pub params: Option<Value>,
    pub cancel: CancellationToken,
}

/// A session's message, matched once for every session transport (legacy SSE, Streamable
/// HTTP and its batches): a notification is dispatched and a client's response delivered
/// here; a request is begun on the session and handed back as the call to answer.
pub(crate) fn route(ctx: &RequestCtx, session: &Session, msg: jsonrpc::Message) -> Routed {
    match msg {
        jsonrpc::Message::Request { id, method, params } => match session.begin_call(&id) {
            Ok(cancel) => Routed::Call(Begun {
                id,
                method,
                params,
                cancel,
            }),
            Err(why) => Routed::Refused(why, id),
        },
        jsonrpc::Message::Notification { method, params } => {
            crate::methods::dispatch::handle_notification(ctx, &method, params.as_ref());
            Routed::Handled
        }
        jsonrpc::Message::Response { id, body } => {
            let pool = ctx.hub.pool();
            if !pool.client_response(&ctx.registration.id, &session.id, &id, &body) {
                tracing::debug!(session = %session.id, "response from client ignored: no request pending");
            }
            Routed::Handled
        }
    }
}

/// The request's W3C `traceparent` (with `tracestate` and `baggage`), read only when tracing
/// is on: with it off a request pays one `None` check here.
pub(crate) fn trace_headers(
    gw: &Hub,
    headers: &HeaderMap,
) -> Option<Arc<crate::telemetry::TraceHeaders>> {
    gw.telemetry()?;
    let get = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    Some(Arc::new(crate::telemetry::TraceHeaders {
        traceparent: get("traceparent")?,
        tracestate: get("tracestate"),
        baggage: get("baggage"),
    }))
}

/// Is the request's Content-Type (its first value, [`Heads::content_type`]) JSON?
pub(crate) fn is_json(content_type: Option<&HeaderValue>) -> bool {
    let Some(v) = content_type else {
        return false;
    };
    // The media type, before any parameters, read from the bytes (a `str` split costs more
    // than the whole check): visible ASCII only, as `to_str` requires.
    let v = v.as_bytes();
    // What clients send nearly always, compared whole before the general reading.
    if v == b"application/json" {
        return true;
    }
    if !v.iter().all(|&c| c == b'\t' || (b' '..=b'~').contains(&c)) {
        return false;
    }
    let media = v.iter().position(|&c| c == b';').map_or(v, |at| &v[..at]);
    media.trim_ascii().eq_ignore_ascii_case(b"application/json")
}

/// Reads a body up to `max_body_bytes` (413 above it) within `connections.body_timeout_s` of
/// the request's start (408 after it: a body trickled a byte at a time holds nothing for
/// long). Either refusal closes the connection (`server::close_if_body_unread`). A body that
/// came with its head (nearly all of them) is read on the first poll and arms no timer.
#[allow(clippy::manual_async_fn)] // an async fn would hold the body twice (argument and local)
pub fn read_body(
    mut body: Body,
    config: &crate::config::Config,
) -> impl std::future::Future<Output = Result<Bytes, Rejection>> + Send + '_ {
    // Not an `async fn` with a timer in it: the common case's future is the body and what it
    // read (the slow path, with its timer, is boxed), and it is moved with every request.
    async move {
        let limit = config.max_body_bytes;
        let mut got = Read::default();
        // What arrived with the head, frame by frame, without a timer.
        loop {
            let next = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(
                    match axum::body::HttpBody::poll_frame(std::pin::Pin::new(&mut body), cx) {
                        std::task::Poll::Ready(frame) => Some(frame),
                        std::task::Poll::Pending => None,
                    },
                )
            })
            .await;
            match next {
                // A body whose length is known ends with its last byte: no poll for its end.
                Some(Some(frame)) => {
                    got.take(frame, limit)?;
                    if axum::body::HttpBody::is_end_stream(&body) {
                        return Ok(got.into_bytes());
                    }
                }
                Some(None) => return Ok(got.into_bytes()),
                None => break,
            }
        }
        let within = std::time::Duration::from_secs(config.connections.body_timeout_s.max(1));
        Box::pin(read_rest(body, got, limit, within)).await
    }
}

/// [`read_body`]'s slow path: the rest of a body that did not come with its head, within the
/// body timeout (408 after it).
async fn read_rest(
    mut body: Body,
    mut got: Read,
    limit: usize,
    within: std::time::Duration,
) -> Result<Bytes, Rejection> {
    let rest = async {
        while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
            got.take(frame, limit)?;
        }
        Ok(got.into_bytes())
    };
    match tokio::time::timeout(within, rest).await {
        Ok(r) => r,
        Err(_) => Err(Rejection::new(
            crate::refusals::Reason::BodyTimeout,
            StatusCode::REQUEST_TIMEOUT,
            RpcError::invalid_request(format!(
                "request body not received within {} s (connections.body_timeout_s)",
                within.as_secs()
            )),
        )),
    }
}

/// A body read so far: one frame's bytes as they came (nearly every body is one frame), or
/// several copied together.
#[derive(Default)]
struct Read {
    first: Bytes,
    joined: Vec<u8>,
}

impl Read {
    /// Takes a frame: its data counted against `limit` (413 above it, as is a body that fails
    /// to be read); trailers ignored.
    fn take(
        &mut self,
        frame: Result<hyper::body::Frame<Bytes>, axum::Error>,
        limit: usize,
    ) -> Result<(), Rejection> {
        let too_large = || {
            Rejection::new(
                crate::refusals::Reason::BodyTooLarge,
                StatusCode::PAYLOAD_TOO_LARGE,
                RpcError::invalid_request(format!(
                    "request body exceeds the limit of {limit} bytes"
                )),
            )
        };
        let Ok(data) = frame.map_err(|_| too_large())?.into_data() else {
            return Ok(());
        };
        let had = self.first.len() + self.joined.len();
        if had.saturating_add(data.len()) > limit {
            return Err(too_large());
        }
        if had == 0 {
            self.first = data;
        } else {
            if self.joined.is_empty() {
                self.joined.extend_from_slice(&self.first);
                self.first = Bytes::new();
            }
            self.joined.extend_from_slice(&data);
        }
        Ok(())
    }

    fn into_bytes(self) -> Bytes {
        if self.joined.is_empty() {
            self.first
        } else {
            Bytes::from(self.joined)
        }
    }
}

/// Content type (415 unless JSON), then the body within its limits ([`read_body`]: 413, 408):
/// a POST's JSON body. Not an `async fn`: the check is done when it is called, and the future
/// is `read_body`'s own.
pub(crate) fn json_body<'c>(
    heads: &Heads<'_>,
    body: Body,
    config: &'c crate::config::Config,
) -> Result<impl std::future::Future<Output = Result<Bytes, Rejection>> + 'c, Rejection> {
    if !is_json(heads.content_type) {
        return Err(Rejection::new(
            crate::refusals::Reason::BadRequest,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            RpcError::invalid_request(
                "unsupported media type: Content-Type must be application/json",
            ),
        ));
    }
    Ok(read_body(body, config))
}

/// A body the direct read (`jsonrpc::parse_request`) left alone: parsed into a `Value` (one
/// message or a batch; malformed: 400 with the JSON-RPC error).
pub(crate) fn parse_body(bytes: &[u8]) -> Result<jsonrpc::Body, Rejection> {
    jsonrpc::parse_body(bytes).map_err(Rejection::malformed)
}

/// The session a request names (`sid`: legacy SSE's `session_id` query parameter, Streamable
/// HTTP's `Mcp-Session-Id`), scoped by its registration and transport (400 when none is
/// named, 404 when unknown); looked up only after [`authorize`], and touched.
pub(crate) fn session(
    gw: &Hub,
    reg: &RegistrationState,
    sid: Option<&str>,
    transport: Transport,
) -> Result<Arc<Session>, Rejection> {
    let sse = transport == Transport::Sse;
    let Some(sid) = sid.filter(|s| !s.is_empty()) else {
        return Err(Rejection::bad_request(if sse {
            "session_id is required"
        } else {
            "bad request: Mcp-Session-Id header is required (send initialize first)"
        }));
    };
    let Some(session) = gw.sessions().get(&reg.id, sid, transport) else {
        return Err(Rejection::not_found(
            crate::refusals::Reason::SessionUnknown,
            if sse {
                "session not found"
            } else {
                "session not found: initialize again without Mcp-Session-Id"
            },
        ));
    };
    session.touch();
    Ok(session)
}
