//! The data listener: the axum router for every registration's endpoints, and its serve loop.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use std::time::Duration;
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
pub async fn serve(listener: TcpListener, router: Router, stop: CancellationToken) {
    serve_http1(listener, router, stop, "data").await;
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
pub async fn serve_http1(
    listener: TcpListener,
    router: Router,
    stop: CancellationToken,
    name: &str,
) {
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
        // A clone of the router is an `Arc` clone (no per-connection copy of the route table).
        let service = TowerToHyperService::new(router.clone());
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
