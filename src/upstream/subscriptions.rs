//! A 2026-07-28 HTTP upstream announces list changes only on the response stream of a
//! `subscriptions/listen` request (there is no GET stream and no session). One is kept open
//! on each such connection whose server says it announces them (`listChanged` in its
//! `server/discover` capabilities); what it carries is dispatched as any notification outside
//! a call (`pool::route_notification`: `tools/list_changed` refreshes the catalog and the
//! registrations' pins compare on it; prompts and resources list changes reach the
//! registrations granted the upstream; `resources/updated` reaches the sessions subscribed to
//! its URI). The URIs clients subscribed to ([`Watched`], at most [`MAX_WATCHED`]) are asked in
//! `resourceSubscriptions`; a new one reopens the stream with it.
//!
//! Owner: the task holds the connection and ends when it closes (its pending request fails
//! at once) or when the slot's `stop` fires (slot dropped). It reopens a stream the upstream
//! ended or that reached [`REOPEN_AFTER`], after a pause; it stops for good when the
//! upstream refuses the method.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Connection, RequestOptions, UpstreamError};

/// A stream is reopened this often (a request needs a deadline).
const REOPEN_AFTER: Duration = Duration::from_secs(3600);
/// The pause before reopening a stream the upstream ended.
const PAUSE: Duration = Duration::from_secs(1);

/// At most this many resource URIs are watched per upstream.
pub const MAX_WATCHED: usize = 1024;

/// The resource URIs clients subscribed to on one upstream (shared by its connections; a URI
/// stays watched until the gateway stops: delivery goes only to the sessions subscribed to it).
pub(crate) struct Watched(watch::Sender<BTreeSet<String>>);

impl Default for Watched {
    fn default() -> Self {
        Watched(watch::channel(BTreeSet::new()).0)
    }
}

impl Watched {
    /// Watches `uri`; false when [`MAX_WATCHED`] are watched already.
    pub fn add(&self, uri: &str) -> bool {
        let mut ok = true;
        self.0.send_if_modified(|set| {
            if set.contains(uri) {
                return false;
            }
            ok = set.len() < MAX_WATCHED;
            ok && set.insert(uri.to_string())
        });
        ok
    }
}

/// The `notifications` filter to ask for: what the upstream's capabilities announce, and the
/// watched URIs when it accepts subscriptions (None: nothing to listen for yet).
fn filter(conn: &Connection, uris: &BTreeSet<String>) -> Option<Value> {
    let caps = conn.initialize_result().get("capabilities")?;
    let mut wanted = Map::new();
    if caps.pointer("/resources/subscribe") == Some(&Value::Bool(true)) && !uris.is_empty() {
        wanted.insert("resourceSubscriptions".into(), json!(uris));
    }
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
/// server announces list changes or subscriptions; otherwise nothing is started) until it
/// closes or `stop`; reopened with the new filter when a URI is watched.
pub(super) fn keep_listening(conn: &Connection, watched: &Watched, stop: CancellationToken) {
    if !conn.is_modern() || conn.pid().is_some() {
        return;
    }
    let caps = conn.initialize_result().get("capabilities").cloned();
    let subscribable = caps.and_then(|c| c.pointer("/resources/subscribe").cloned());
    if filter(conn, &BTreeSet::new()).is_none() && subscribable != Some(Value::Bool(true)) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let conn = conn.clone();
    let mut uris = watched.0.subscribe();
    runtime.spawn(async move {
        while !conn.is_closed() && !stop.is_cancelled() {
            let wanted = filter(&conn, &uris.borrow_and_update());
            let this = stop.child_token();
            let opts = RequestOptions {
                timeout: Some(REOPEN_AFTER),
                cancel: this.clone(),
                ..RequestOptions::default()
            };
            let listened = async {
                match wanted {
                    Some(w) => {
                        let params = json!({ "notifications": w });
                        conn.request("subscriptions/listen", params, opts).await
                    }
                    // Nothing to ask yet: until a URI is watched.
                    None => std::future::pending().await,
                }
            };
            let done = tokio::select! {
                biased;
                r = listened => r,
                changed = uris.changed() => {
                    // A new URI: this stream ends (its request cancelled) and one reopens.
                    this.cancel();
                    if changed.is_err() { return; }
                    continue;
                }
                () = stop.cancelled() => return,
            };
            match done {
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
