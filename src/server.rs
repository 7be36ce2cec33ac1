//! The data listener: the routes of every registration's endpoints (a tool call's two routes
//! dispatched directly, the rest through the axum router), and the serve loop of both listeners.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{Method, Request, StatusCode};
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
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::endpoint;
use crate::gateway::Gateway;

/// The router of the data listener.
pub fn router(gateway: Gateway) -> Router {
    Router::new()
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
        .fallback(not_found)
        .with_state(gateway)
}

/// Serves until `stop` fires, then drains connections (streams end on their own tokens).
pub async fn serve(listener: TcpListener, gateway: Gateway, stop: CancellationToken) {
    let router = TowerToHyperService::new(router(gateway.clone()));
    let service = service_fn(move |req| dispatch(&gateway, &router, req));
    serve_http1(listener, service, stop, "data").await;
}

/// A request's future, boxed (one allocation per request, as axum's router makes): hyper
/// keeps the in-flight future inside every connection's state, so an unboxed one would make
/// every connection — idle SSE streams included — as large as the largest handler's future.
type Reply = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

/// The two routes every tool call takes — `POST /gw/<id>/mcp` and `POST /gw/<id>/messages/`
/// (or without the slash) with a plain id (base64url, or `<node>.<base64url>`) — go straight to their handlers; axum's
/// route match, path-parameter decoding and wrappers cost ~8% of such a request. Every other
/// request goes through the router, whose answers (404, 405 with `Allow`, percent-decoded
/// ids) stay the reference; for the ids routed directly, the router would extract the same
/// id (there is nothing to decode in `[A-Za-z0-9_.-]`).
fn dispatch(
    gateway: &Gateway,
    router: &TowerToHyperService<Router>,
    req: Request<Incoming>,
) -> Reply {
    if req.method() == Method::POST {
        if let Some((id, route)) = hot_route(req.uri().path()) {
            let (gw, id, req) = (
                State(gateway.clone()),
                Path(id.to_string()),
                req.map(Body::new),
            );
            return match route {
                Hot::Mcp => {
                    Box::pin(async move { Ok(endpoint::streamable_http::post(gw, id, req).await) })
                }
                Hot::Messages => {
                    Box::pin(async move { Ok(endpoint::sse::message(gw, id, req).await) })
                }
            };
        }
    }
    Box::pin(router.call(req))
}

#[derive(Debug, PartialEq)]
enum Hot {
    Mcp,
    Messages,
}

/// `/gw/<id>/mcp` or `/gw/<id>/messages[/]` with an id shaped like a registration id
/// (`registry::id_shaped`: base64url, optionally after `<node>.`).
fn hot_route(path: &str) -> Option<(&str, Hot)> {
    let (id, rest) = path.strip_prefix("/gw/")?.split_once('/')?;
    if !crate::registry::id_shaped(id) {
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
/// Written on hyper's HTTP/1 connection rather than `axum::serve`: axum serves through
/// hyper-util's protocol-detecting builder, which first reads up to 24 bytes into a buffer of
/// its own to tell HTTP/2 from HTTP/1 and then hands them back. hyper's first read then sees
/// an incomplete head, so its read buffer grows from 8 to 16 KiB on every connection (and
/// stays so while the connection lives: an idle SSE session's largest cost). We serve
/// HTTP/1.1 only, so there is nothing to detect.
pub async fn serve_http1<S>(listener: TcpListener, service: S, stop: CancellationToken, name: &str)
where
    S: Service<Request<Incoming>, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    let conns = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            r = listener.accept() => r,
        };
        let tcp = match accepted {
            Ok((tcp, _peer)) => tcp,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of fds or the like: say so, and do not spin.
                tracing::error!(listener = name, error = %e, "accept failed; retrying in 1 s");
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        // TCP_NODELAY: replies and SSE events are small writes; with Nagle on, an event
        // written while the previous one is unacknowledged waits for the peer's delayed ACK
        // (tens of ms).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        // A clone of the service is an `Arc` clone (no per-connection copy of the route table).
        let service = service.clone();
        let stop = stop.clone();
        conns.spawn(async move {
            let conn = http1::Builder::new().serve_connection(TokioIo::new(tcp), service);
            let mut conn = std::pin::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                tracing::trace!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    conns.close();
    conns.wait().await;
    tracing::debug!(listener = name, "server drained");
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

async fn healthz(State(gw): State<Gateway>) -> Json<serde_json::Value> {
    Json(json!({
        "ok": true,
        "registrations": gw.registry().len(),
        "sessions": gw.sessions().len(),
    }))
}

async fn not_found() -> Response {
    endpoint::http_error(
        StatusCode::NOT_FOUND,
        crate::mcp::jsonrpc::INVALID_REQUEST,
        "not found",
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

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
