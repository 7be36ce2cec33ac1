//! A 2026-07-28 HTTP upstream announces list changes only on the response stream of a
//! `subscriptions/listen` request (there is no GET stream and no session). One is kept open
//! on each such connection whose server says it announces them (`listChanged` in its
//! `server/discover` capabilities); what it carries is dispatched as any notification outside
//! a call (`pool::route_notification`: `tools/list_changed` refreshes the catalog and the
//! registrations' pins compare on it; prompts and resources list changes reach the
//! registrations granted the upstream).
//!
//! Owner: the task holds the connection and ends when it closes (its pending request fails
//! at once) or when the slot's `stop` fires (slot dropped). It reopens a stream the upstream
//! ended or that reached [`REOPEN_AFTER`], after a pause; it stops for good when the
//! upstream refuses the method.

use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::{Connection, RequestOptions, UpstreamError};

/// A stream is reopened this often (a request needs a deadline).
const REOPEN_AFTER: Duration = Duration::from_secs(3600);
/// The pause before reopening a stream the upstream ended.
const PAUSE: Duration = Duration::from_secs(1);

/// The `notifications` filter to ask for: what the upstream's capabilities announce (None:
/// nothing to listen for).
fn filter(conn: &Connection) -> Option<Value> {
    let caps = conn.initialize_result().get("capabilities")?;
    let mut wanted = Map::new();
    for (cap, key) in [
        ("tools", "toolsListChanged"),
        ("prompts", "promptsListChanged"),
        ("resources", "resourcesListChanged"),
    ] {
        if caps.pointer(&format!("/{cap}/listChanged")) == Some(&Value::Bool(true)) {
            wanted.insert(key.into(), Value::Bool(true));
        }
    }
    (!wanted.is_empty()).then_some(Value::Object(wanted))
}

/// Keeps a `subscriptions/listen` stream open on `conn` (a 2026-07-28 HTTP connection whose
/// server announces list changes; otherwise nothing is started) until it closes or `stop`.
pub(super) fn keep_listening(conn: &Connection, stop: CancellationToken) {
    if !conn.is_modern() || conn.pid().is_some() {
        return;
    }
    let Some(wanted) = filter(conn) else { return };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let conn = conn.clone();
    runtime.spawn(async move {
        while !conn.is_closed() && !stop.is_cancelled() {
            let opts = RequestOptions {
                timeout: Some(REOPEN_AFTER),
                cancel: stop.clone(),
                ..RequestOptions::default()
            };
            let params = json!({ "notifications": wanted.clone() });
            match conn.request("subscriptions/listen", params, opts).await {
                Err(UpstreamError::Timeout(_)) => continue,
                Ok(r) if r.outcome.is_err() => {
                    tracing::info!(upstream = %conn.upstream_id(), "upstream refused subscriptions/listen: its list changes are not heard");
                    return;
                }
                // The upstream ended the stream: reopened after a pause.
                Ok(_) => {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(PAUSE) => {}
                    }
                }
                Err(e) => {
                    tracing::debug!(upstream = %conn.upstream_id(), error = %e, "subscriptions/listen ended");
                    return;
                }
            }
        }
    });
}
