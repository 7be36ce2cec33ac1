//! What passes between the pool and the clients of its registrations, outside a call: a
//! client's response to a server → client request (back upstream, or to the gateway's own
//! request), the gateway's own requests to a session, and a client's
//! `notifications/roots/list_changed` (to the connections its registration owns).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::Value;

use super::pool::Pool;
use super::Downstream;
use crate::sync::lock;

impl Pool {
    /// Passes a client's response to a server → client request back upstream. Returns whether
    /// the id was one the gateway minted for this registration and session.
    pub fn client_response(
        &self,
        registration_id: &str,
        session_id: &str,
        id: &Value,
        body: &Value,
    ) -> bool {
        let Some((to, outcome)) =
            self.inner
                .client_requests
                .answer(registration_id, session_id, id, body)
        else {
            return false;
        };
        match to {
            super::routing::AnswerTo::Upstream(conn, upstream_id) => {
                self.inner.tasks.spawn(async move {
                    if let Err(e) = conn.respond(upstream_id, outcome).await {
                        tracing::debug!(error = %e, "could not pass the client's response upstream");
                    }
                });
            }
            super::routing::AnswerTo::Local(tx) => {
                let _ = tx.send(outcome);
            }
        }
        true
    }

    /// Sends a request of the gateway's own to a client's session (see
    /// `ClientRequests::ask_session`): the receiver of its answer, or `None` if it could not be
    /// sent.
    pub async fn ask_session(
        &self,
        session: &Arc<crate::session::Session>,
        method: &str,
        params: Value,
        ds: &dyn Downstream,
    ) -> Option<tokio::sync::oneshot::Receiver<Result<Value, Value>>> {
        self.inner
            .client_requests
            .ask_session(session, method, params, ds)
            .await
    }

    /// A request of the gateway's own about one call (`ClientRequests::ask_call`): its id, the
    /// message to send on the call's stream, the receiver of the answer.
    pub fn ask_call(
        &self,
        registration_id: &str,
        session: Option<&Arc<crate::session::Session>>,
        method: &str,
        params: Value,
    ) -> Option<super::routing::Asked> {
        self.inner
            .client_requests
            .ask_call(registration_id, session, method, params)
    }

    /// Forgets a request of the gateway's own whose call ended unanswered.
    pub fn forget_ask(&self, id: &str) {
        self.inner.client_requests.forget(id);
    }

    /// A client of `registration_id` said its roots changed (`notifications/roots/list_changed`):
    /// tell the live connections that declared `roots` and that this registration owns (its
    /// `per_registration` slots; on a leased slot, naming its lease in `_meta`). Shared
    /// connections are not told: they did not declare roots. Sent from the pool's tracker.
    pub fn roots_list_changed(&self, registration_id: &str) {
        let mut targets = Vec::new();
        for up in self.inner.ups().values() {
            if !up
                .spec
                .config
                .declared_client_capabilities()
                .contains(&"roots")
            {
                continue;
            }
            let slots = lock(&up.slots);
            if let Some(conn) = slots
                .per_registration
                .get(registration_id)
                .and_then(|s| s.live())
            {
                targets.push((conn, serde_json::json!({})));
            }
            if let Some(slot) = slots
                .shared
                .as_ref()
                .filter(|s| s.leased.load(Ordering::Acquire))
            {
                if let (Some(lease), Some(conn)) = (slot.leases.get(registration_id), slot.live()) {
                    let meta = serde_json::json!({ super::lease::LEASE_META_KEY: lease });
                    targets.push((conn, serde_json::json!({ "_meta": meta })));
                }
            }
        }
        if targets.is_empty() {
            return;
        }
        self.inner.tasks.spawn(async move {
            for (conn, params) in targets {
                if let Err(e) = conn.notify("notifications/roots/list_changed", params).await {
                    tracing::debug!(upstream = %conn.upstream_id(), error = %e, "roots/list_changed not passed upstream");
                }
            }
        });
    }
}
