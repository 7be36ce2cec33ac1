//! The data listener: the axum router for every registration's endpoints, and its serve loop.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use axum::{Json, Router};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

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
    // TCP_NODELAY: replies and SSE events are small writes; with Nagle on, an event written
    // while the previous one is unacknowledged waits for the peer's delayed ACK (tens of ms).
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
    });
    // `into_make_service`: each connection gets a clone of the router (an `Arc`). Served as a
    // plain `Router`, axum re-applies the state per connection, copying the route table
    // (~7 KiB per connection, held for its life: most of an idle SSE session's cost).
    let result = axum::serve(listener, router.into_make_service())
        .with_graceful_shutdown(stop.cancelled_owned())
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "data server failed");
    }
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
