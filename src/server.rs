//! The data listener: the routes of every registration's endpoints (a tool call's two routes
//! dispatched directly, the rest through the axum router), and the serve loop of both listeners.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::{service_fn, Service};
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connections::{Activity, Guarded, GuardedBody, Leftover, Limits, RequestBody, Rest};
use crate::endpoint;
use crate::hub::Hub;
use crate::refusals::{self, Listener, Reason};
use crate::sync::unless_cancelled;

/// The router of the data listener.
pub fn router(hub: Arc<Hub>) -> Router {
    let routes = Router::new()
        .route("/healthz", get(healthz))
        .route("/gw/{id}/sse", get(endpoint::sse::open))
        .route("/gw/{id}/messages/", post(endpoint::sse::message))
        .route("/gw/{id}/messages", post(endpoint::sse::message))
        .route(
            "/gw/{id}/mcp",
            post(endpoint::streamable_http::post)
                .get(endpoint::streamable_http::get)
                .delete(endpoint::streamable_http::delete),
        )
        // OAuth-aware clients after a 401 (endpoint::oauth): the RFC 9728 document of each
        // endpoint, and the discovery/registration paths they fall back to, which answer
        // that tokens are issued out of band.
        .route(
            "/.well-known/oauth-protected-resource/gw/{id}/{tail}",
            get(endpoint::oauth::protected_resource),
        )
        .route(
            endpoint::oauth::PRM_PREFIX,
            get(endpoint::oauth::no_authorization_server),
        )
        .route("/register", post(endpoint::oauth::no_client_registration));
    // Authorization-server discovery (RFC 8414, OpenID), bare and path-suffixed: none here.
    let router = [
        "/.well-known/oauth-authorization-server",
        "/.well-known/oauth-authorization-server/{*rest}",
        "/.well-known/openid-configuration",
        "/.well-known/openid-configuration/{*rest}",
    ]
    .into_iter()
    .fold(routes, |r, path| {
        r.route(path, get(endpoint::oauth::no_authorization_server))
    });
    router.fallback(not_found).with_state(hub)
}

/// Serves until `stop` fires, then drains connections (streams end on their own tokens).
pub async fn serve(listener: TcpListener, hub: Arc<Hub>, stop: CancellationToken) {
    let limits = Limits::data(&hub.config().connections);
    let router = TowerToHyperService::new(router(hub.clone()));
    let observer = hub.clone();
    let service = service_fn(move |req| dispatch(&hub, &router, req));
    serve_http1(listener, service, stop, (observer, Listener::Data), limits).await;
}

/// A request's future, boxed: hyper keeps it inside the connection's state, and an idle
/// connection should not be as large as the largest handler's future (ARCHITECTURE.md).
type Reply = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

/// A tool call's two routes (`POST /gw/<id>/mcp`, `POST /gw/<id>/messages[/]` with a plain id:
/// base64url, or `<node>.<base64url>`, which the router would decode to the same id) go
/// straight to their handlers; every other request goes through the router, the reference
/// for 404, 405 and decoding.
fn dispatch(hub: &Arc<Hub>, router: &TowerToHyperService<Router>, req: Request<Body>) -> Reply {
    if let Err(refused) = strict_http(req.version(), req.headers()) {
        let mut resp = endpoint::Rejection::new(
            // 400, 431 or 501: framing or headers.
            Reason::BadRequest,
            refused.status,
            crate::protocol::RpcError::invalid_request(refused.message),
        )
        .into_response();
        refused.close(&mut resp);
        return Box::pin(std::future::ready(Ok(resp)));
    }
    // A fenced cluster node serves no MCP path (`fence`): 503, try again (another node).
    if hub.fence().is_fenced() && req.uri().path().starts_with("/gw/") {
        return Box::pin(std::future::ready(Ok(fenced_reply())));
    }
    if req.method() == Method::POST {
        if let Some((id, route)) = hot_route(req.uri().path()) {
            let (gw, id) = (State(hub.clone()), Path(id.to_string()));
            // `map`, not an `async` block: the block would keep the request in its state
            // beside the handler's future made from it.
            return match route {
                Hot::Mcp => Box::pin(futures::FutureExt::map(
                    endpoint::streamable_http::post(gw, id, req),
                    |r| Ok(r.into_response()),
                )),
                Hot::Messages => Box::pin(futures::FutureExt::map(
                    endpoint::sse::message(gw, id, req),
                    |r| Ok(r.into_response()),
                )),
            };
        }
    }
    Box::pin(router.call(req))
}

/// The answer of a fenced node: 503 with `Retry-After: 1` and a JSON-RPC error.
fn fenced_reply() -> Response {
    endpoint::Rejection::fenced(
        "this gateway node cannot prove it is current with the registration store (fenced); retry, or use another node",
    )
    .into_response()
}

/// Why a request was refused before routing (see [`strict_http`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Refused {
    pub status: StatusCode,
    pub message: &'static str,
}

impl Refused {
    /// Marks the response `Connection: close`: a client that sent ambiguous framing or
    /// identity headers is not kept for another request.
    pub fn close(&self, resp: &mut Response) {
        resp.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
}

/// A 413 (body over the limit) or 408 (body not whole in time) leaves the request body
/// unread, and hyper closes the connection after it: `Connection: close` says so, as nginx
/// does, or a client's pool may reuse the connection and see its next request fail
/// unanswered. Both listeners' responses pass here, whatever produced them.
///
/// Any other response whose request body the service left unread (`leftover`: a refusal
/// from the head, such as 401 or 404) first has the rest of that body read off
/// (`connections::drain`: bounded in bytes and by `body_timeout`), so the connection serves
/// the client's next request; a body that cannot be (too long, too slow, or held back for
/// `Expect: 100-continue`) is not read, and the response says `Connection: close` (issue 50).
async fn close_if_body_unread(
    resp: &mut Response,
    leftover: Option<Leftover>,
    expects_continue: bool,
    body_timeout: Duration,
) {
    let closing = matches!(
        resp.status(),
        StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT
    ) || resp
        .headers()
        .get(axum::http::header::CONNECTION)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    let kept = match leftover.and_then(|l| l.take()) {
        _ if closing => false,
        None => true,
        Some(Rest::Broken) => false,
        Some(Rest::Unread(_)) if expects_continue => false,
        // Boxed: the common case's future stays small.
        Some(Rest::Unread(rest)) => Box::pin(crate::connections::drain(rest, body_timeout)).await,
    };
    if !kept {
        resp.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
    }
}

/// Whether the client waits for `100 Continue` before it sends the body.
fn expects_continue(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// The most header bytes a request may carry (names, values and their separators), as
/// Envoy's default (60 KiB) and nginx's (4 × 8 KiB) bound them: answered 431.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// hyper's read buffer per connection (its default is ~400 KiB): a request head that does
/// not fit is refused by hyper (431, empty body) before [`strict_http`] sees it.
const MAX_HEAD_BUFFER: usize = 128 * 1024;

/// The strict-HTTP pre-check both listeners run before routing (the data listener in
/// [`dispatch`], `/healthz` included; the admin listener before its token check), on what
/// hyper leaves to the application:
/// - more than one `Authorization` → 400 (which one would count is ambiguous);
/// - HTTP/1.1 without exactly one `Host`, or any request with more than one → 400
///   (RFC 9112 §3.2; the Host/Origin allow-list then judges the one value);
/// - a `Transfer-Encoding` other than a single `chunked` → 501 (RFC 9112 §6.1). hyper
///   itself answers 400 when `chunked` is not the last coding (the length is unknowable,
///   §6.3), drops `Content-Length` beside `Transfer-Encoding` and closes the connection after
///   such a request, and refuses differing `Content-Length`s;
/// - headers of more than [`MAX_HEADER_BYTES`] in all → 431.
///
/// Messages name the rule, never a header's value (it may be a token).
pub fn strict_http(version: axum::http::Version, headers: &HeaderMap) -> Result<(), Refused> {
    use axum::http::header::{AUTHORIZATION, HOST, TRANSFER_ENCODING};
    let bad = |message| {
        Err(Refused {
            status: StatusCode::BAD_REQUEST,
            message,
        })
    };
    // hyper refuses a head beyond its read buffer (`MAX_HEAD_BUFFER`) only once a read leaves
    // the buffer full, so what it accepts depends on how the bytes arrived; this limit does not.
    // One pass over the headers also counts the ones checked below (a lookup by name hashes
    // it; comparing a standard name is comparing its tag).
    let (mut head, mut authorizations, mut hosts, mut te) = (0usize, 0usize, 0usize, false);
    for (k, v) in headers {
        head += k.as_str().len() + v.len() + 4;
        if k == AUTHORIZATION {
            authorizations += 1;
        } else if k == HOST {
            hosts += 1;
        } else if k == TRANSFER_ENCODING {
            te = true;
        }
    }
    if head > MAX_HEADER_BYTES {
        return Err(Refused {
            status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            message: "bad request: the request's headers are too large (at most 64 KiB in all)",
        });
    }
    if authorizations > 1 {
        return bad("bad request: more than one Authorization header");
    }
    if hosts > 1 {
        return bad("bad request: more than one Host header");
    }
    if hosts == 0 && version == axum::http::Version::HTTP_11 {
        return bad("bad request: an HTTP/1.1 request needs a Host header");
    }
    if !te {
        return Ok(());
    }
    let mut codings = headers
        .get_all(TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty());
    if let Some(first) = codings.next() {
        if !first.eq_ignore_ascii_case(b"chunked") || codings.next().is_some() {
            return Err(Refused {
                status: StatusCode::NOT_IMPLEMENTED,
                message: "not implemented: the only Transfer-Encoding accepted is a single chunked",
            });
        }
    }
    Ok(())
}

#[derive(Debug, PartialEq)]
enum Hot {
    Mcp,
    Messages,
}

/// `/gw/<id>/mcp` or `/gw/<id>/messages[/]` with an id shaped like a registration id
/// (`registry::id_shaped`: base64url, optionally after `<node>.`).
fn hot_route(path: &str) -> Option<(&str, Hot)> {
    let tail = path.strip_prefix("/gw/")?;
    // A byte scan (a `str` search costs more than the short id it crosses); `/` is one byte.
    let slash = tail.bytes().position(|c| c == b'/')?;
    let (id, rest) = (&tail[..slash], &tail[slash + 1..]);
    if !crate::registration::id_shaped(id) {
        return None;
    }
    match rest {
        "mcp" => Some((id, Hot::Mcp)),
        "messages/" | "messages" => Some((id, Hot::Messages)),
        _ => None,
    }
}

/// The accept loop of both listeners: one HTTP/1.1 connection task per socket, each owned by
/// a tracker that `stop` drains. On `stop` the listener closes at once (the port is free),
/// every connection is asked to finish its current exchange and close, and this returns
/// when all have.
///
/// `limits` (`crate::connections`): at most `limits.max` connections at once — one over it
/// gets a canned 503 and is closed, without a task — and each connection's header and idle
/// timeouts.
///
/// Written on hyper's HTTP/1 connection rather than `axum::serve`: axum serves through
/// hyper-util's protocol-detecting builder, which first reads up to 24 bytes into a buffer of
/// its own to tell HTTP/2 from HTTP/1 and then hands them back. hyper's first read then sees
/// an incomplete head, so its read buffer grows from 8 to 16 KiB on every connection (and
/// stays so while the connection lives: an idle SSE session's largest cost). We serve
/// HTTP/1.1 only, so there is nothing to detect.
///
/// `observer`: the gateway whose refusal counters, logs and audit folds see every refusal of
/// this listener (`Hub::refused`): a response of status ≥ 400, a connection refused at the
/// cap, a request head not received in time.
pub async fn serve_http1<S>(
    listener: TcpListener,
    service: S,
    stop: CancellationToken,
    observer: (Arc<Hub>, Listener),
    limits: Limits,
) where
    S: Service<Request<Body>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let (hub, which) = observer;
    let name = which.as_str();
    let conns = TaskTracker::new();
    let permits = Arc::new(Semaphore::new(limits.max));
    // Refusals since the cap was last reached (logged once per episode, not per connection).
    let mut refused: u64 = 0;
    while let Some((tcp, peer)) = next_connection(&listener, &stop, name).await {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if refused == 0 {
                    tracing::warn!(
                        listener = name,
                        max = limits.max,
                        "connection cap reached; refusing new connections with 503"
                    );
                }
                refused += 1;
                limits.refuse(tcp);
                hub.refused(which, StatusCode::SERVICE_UNAVAILABLE, None, Some(peer));
                continue;
            }
        };
        if refused > 0 {
            tracing::info!(listener = name, refused, "below the connection cap again");
            refused = 0;
        }
        // TCP_NODELAY: replies and SSE events are small writes; with Nagle on, an event
        // written while the previous one is unacknowledged waits for the peer's delayed ACK
        // (tens of ms).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        // A clone of the service is an `Arc` clone (no per-connection copy of the route table).
        let service = service.clone();
        let stop = stop.clone();
        let activity = Activity::new();
        let io = TokioIo::new(Guarded::new(tcp, activity.clone(), &limits));
        let hub = hub.clone();
        let body_timeout = limits.body_timeout;
        conns.spawn(async move {
            let _permit = permit;
            let timed_out = activity.clone();
            let observer = hub.clone();
            // Where a request body the service dropped before its end is left: one per
            // connection (its requests come one after another: hyper reads no next head
            // before the body before it has ended).
            let leftover = Leftover::default();
            // Busy from the call to the end of the response body (`connections` docs).
            let service = service_fn(move |req: Request<Incoming>| {
                let busy = activity.begin();
                // A request with a body reads it through `RequestBody`, which hands back the
                // rest if the service drops it before its end.
                let leftover =
                    (!hyper::body::Body::is_end_stream(req.body())).then(|| leftover.clone());
                let expects_continue = expects_continue(req.headers());
                let req = match &leftover {
                    Some(l) => req.map(|b| Body::new(RequestBody::new(b, l.clone()))),
                    None => req.map(Body::new),
                };
                let reply = service.call(req);
                let hub = hub.clone();
                async move {
                    let mut resp = reply.await?;
                    close_if_body_unread(&mut resp, leftover, expects_continue, body_timeout).await;
                    if resp.status().as_u16() >= 400 {
                        let mark = resp.extensions_mut().remove::<refusals::Refused>();
                        hub.refused(which, resp.status(), mark.as_ref(), Some(peer));
                    }
                    Ok::<_, Infallible>(resp.map(|body| GuardedBody::new(body, busy)))
                }
            });
            let conn = http1::Builder::new()
                .max_buf_size(MAX_HEAD_BUFFER)
                .serve_connection(io, service);
            let mut conn = std::pin::pin!(conn);
            // Not a `select!`: the stop token is polled only when it fires, not on every wake
            // of the connection (`sync::unless_cancelled`).
            let result = match unless_cancelled(&stop, conn.as_mut()).await {
                Some(r) => r,
                None => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            observe_end(&observer, which, peer, result, timed_out.head_timed_out());
        });
    }
    drop(listener);
    conns.close();
    conns.wait().await;
    tracing::debug!(listener = name, "server drained");
}

/// What a connection's end says about refusals: a head hyper could not parse or took too long
/// to arrive (hyper answered those itself, without the service).
fn observe_end(
    observer: &Hub,
    which: Listener,
    peer: std::net::SocketAddr,
    result: Result<(), hyper::Error>,
    head_timed_out: bool,
) {
    if let Err(e) = result {
        tracing::trace!(error = %e, "connection ended with an error");
        // A head hyper could not parse (or too large for its buffer): it answered
        // 400 or 431 itself, without the service.
        if e.is_parse() || e.is_parse_too_large() {
            let status = if e.is_parse_too_large() {
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            } else {
                StatusCode::BAD_REQUEST
            };
            observer.refused(which, status, None, Some(peer));
        }
    }
    if head_timed_out {
        observer.refused(
            which,
            StatusCode::REQUEST_TIMEOUT,
            Some(&refusals::Refused::new(Reason::HeaderTimeout)),
            Some(peer),
        );
    }
}

/// The next accepted connection, or `None` once `stop` fires. Errors that concern one
/// connection are skipped; others (out of fds or the like) are said, and retried after 1 s
/// rather than spun on.
async fn next_connection(
    listener: &TcpListener,
    stop: &CancellationToken,
    name: &str,
) -> Option<(tokio::net::TcpStream, std::net::SocketAddr)> {
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.cancelled() => return None,
            r = listener.accept() => r,
        };
        match accepted {
            Ok(accepted) => return Some(accepted),
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                tracing::error!(listener = name, error = %e, "accept failed; retrying in 1 s");
                tokio::select! {
                    _ = stop.cancelled() => return None,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        }
    }
}

/// Errors that concern one connection, not the listener: keep accepting.
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// `GET /healthz`: the same Host/Origin allow-list as every other path (403), so a
/// rebinding page cannot read the counts either. A probe that sends the pod IP as Host needs
/// that address in `allowed_hosts`.
async fn healthz(
    State(gw): State<Arc<Hub>>,
    headers: axum::http::HeaderMap,
) -> Result<Json<serde_json::Value>, endpoint::Rejection> {
    endpoint::origin::check_host_origin(gw.config(), &headers)?;
    Ok(Json(json!({
        "ok": true,
        "registrations": gw.registry().len(),
        "sessions": gw.sessions().len(),
    })))
}

async fn not_found() -> Response {
    endpoint::Rejection::not_found(Reason::NoRoute, "not found").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_http_refuses_ambiguous_identity_and_framing_headers() {
        use axum::http::{HeaderValue, Version};
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.append(*k, HeaderValue::from_static(v));
            }
            h
        };
        let status = |v, pairs: &[(&'static str, &'static str)]| {
            strict_http(v, &headers(pairs)).map_err(|r| r.status.as_u16())
        };
        let h11 = Version::HTTP_11;
        let host = ("host", "localhost");
        assert_eq!(status(h11, &[host]), Ok(()));
        assert_eq!(
            status(h11, &[host, ("transfer-encoding", "Chunked")]),
            Ok(())
        );
        assert_eq!(status(Version::HTTP_10, &[]), Ok(()));
        let sized = |n: usize| {
            let mut h = headers(&[host]);
            h.insert("x-big", HeaderValue::from_str(&"b".repeat(n)).unwrap());
            strict_http(h11, &h).map_err(|r| r.status.as_u16())
        };
        // "host: localhost" is 4 + 9 + 4 bytes, "x-big: …" 5 + n + 4.
        assert_eq!(sized(MAX_HEADER_BYTES - 17 - 9), Ok(()));
        assert_eq!(sized(MAX_HEADER_BYTES - 17 - 8), Err(431));
        assert_eq!(status(h11, &[]), Err(400));
        assert_eq!(status(h11, &[host, host]), Err(400));
        assert_eq!(status(Version::HTTP_10, &[host, host]), Err(400));
        assert_eq!(
            status(
                h11,
                &[
                    host,
                    ("authorization", "Bearer a"),
                    ("authorization", "Bearer a")
                ]
            ),
            Err(400)
        );
        for te in ["gzip, chunked", "chunked, chunked", "identity", "x"] {
            assert_eq!(
                status(h11, &[host, ("transfer-encoding", te)]),
                Err(501),
                "{te}"
            );
        }
        assert_eq!(
            status(
                h11,
                &[
                    host,
                    ("transfer-encoding", "gzip"),
                    ("transfer-encoding", "chunked")
                ]
            ),
            Err(501)
        );
    }

    #[test]
    fn only_plain_ids_on_the_two_call_routes_are_routed_directly() {
        assert_eq!(hot_route("/gw/aZ0-_9/mcp"), Some(("aZ0-_9", Hot::Mcp)));
        assert_eq!(hot_route("/gw/-x/messages/"), Some(("-x", Hot::Messages)));
        assert_eq!(hot_route("/gw/x/messages"), Some(("x", Hot::Messages)));
        // A node's ids (DESIGN.md §8): `<node>.<base64url>`.
        assert_eq!(
            hot_route("/gw/n1.aZ0-_9/mcp"),
            Some(("n1.aZ0-_9", Hot::Mcp))
        );
        assert_eq!(
            hot_route("/gw/n1.-x/messages/"),
            Some(("n1.-x", Hot::Messages))
        );
        for path in [
            "/gw//mcp",
            "/gw/a%2Db/mcp",
            "/gw/n1%2Eab/mcp",
            "/gw/../mcp",
            "/gw/./mcp",
            "/gw/a.b.c/mcp",
            "/gw/A1.b/mcp",
            "/gw/n1./mcp",
            "/gw/x/mcp/",
            "/gw/x/mcp/extra",
            "/gw/x/sse",
            "/gw/x",
            "/gw/x/",
            "/healthz",
            "/gwx/a/mcp",
        ] {
            assert_eq!(hot_route(path), None, "{path}");
        }
    }
}
