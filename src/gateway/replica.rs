//! A cluster node's replica of the shared store (issue 36): what `gateway::cluster` applies
//! from the store's watch. A registration created on another node is adopted (served here
//! under the same id and token digest); one released elsewhere, or whose etcd lease ended, is
//! closed here as a release is (calls cancelled, sessions closed), without a store write.

use std::sync::Arc;
use std::time::Duration;

use super::{Gateway, GatewayError, ReleaseReason, Replica};
use crate::registration::Record as Stored;
use crate::sync::lock;

impl Gateway {
    /// Serves a registration of the store here (a put seen in the watch or a full read). One
    /// already here only takes the store's expiry (a renewal made on another node). True if
    /// it is served here from now on (its creator waits for this node's acknowledgement).
    pub(crate) fn adopt(&self, s: Stored) -> Result<bool, GatewayError> {
        let now = chrono::Utc::now().timestamp_millis().max(0) as u64;
        if let Some(state) = self.registry().get(&s.id) {
            // The budget the store has handed out (a block reserved or given back anywhere).
            state.budget().learn_store_reserved(s.calls_reserved);
            let old = state.move_expiry(s.expires_at_ms);
            if old != s.expires_at_ms && s.expires_at_ms != 0 {
                self.arm_deadline(
                    &s.id,
                    Duration::from_millis(s.expires_at_ms.saturating_sub(now)),
                );
            }
            return Ok(false);
        }
        // Released here lately (ids are never reused), or being created here right now.
        if self.registry().was_released(&s.id) || lock(&self.inner.creating).contains(&s.id) {
            return Ok(false);
        }
        if s.expired_at(now) {
            // Its lease ends it on etcd; nothing to serve meanwhile.
            return Ok(false);
        }
        let family = match s.parent.as_deref().and_then(|p| self.registry().get(p)) {
            Some(p) => crate::registration::Family::child_of(&p, &s.agent_id),
            None => crate::registration::Family::default(),
        };
        let catalog = lock(&self.inner.catalog).clone();
        crate::registration::lifecycle::Server::serve_record(self, &s, &catalog, family, now)?;
        Ok(true)
    }

    /// Closes a registration the store no longer has (released on another node, or its
    /// lease ended; `revision`: the delete's): as a release, without a store write. A delete
    /// this node is committing itself (its watch was faster than the request) closes it as
    /// this node's release.
    pub(crate) fn drop_replica(&self, id: &str, why: &'static str, revision: Option<u64>) {
        let mine = lock(&self.inner.releasing).contains(id);
        if let Some(state) = self.close_registration(id, ReleaseReason::Released) {
            let gw = self.clone();
            let replica = Replica::Deleted {
                why: (!mine).then_some(why),
                revision,
            };
            self.inner.tasks.spawn(async move {
                let _ = gw
                    .finish_release_from(&state, ReleaseReason::Released, replica)
                    .await;
            });
        }
    }

    /// The revision of this node's release of `id` (the record's `store_revision`).
    pub(crate) fn release_revision(&self, id: &str) -> Option<u64> {
        self.etcd()?
            .release_revision(id)
            .and_then(|r| u64::try_from(r).ok())
    }

    /// The revision of this node's creation of `id` (the record's `store_revision`).
    pub(crate) fn create_revision(&self, id: &str) -> Option<u64> {
        self.etcd()?
            .create_revision(id)
            .and_then(|r| u64::try_from(r).ok())
    }

    /// After a full read of the store: adopts what it holds and closes each of `before` (the
    /// ids served here before the read began) that it no longer holds.
    pub(crate) fn reconcile(
        &self,
        before: Vec<String>,
        all: Vec<Stored>,
        revision: Option<u64>,
    ) -> usize {
        let present: std::collections::HashSet<String> = all.iter().map(|s| s.id.clone()).collect();
        // Parents before children.
        let mut all = all;
        all.sort_by_key(|s| (s.parent.is_some(), s.created_at_ms));
        for s in all {
            let id = s.id.clone();
            if let Err(e) = self.adopt(s) {
                tracing::error!(registration = %id, error = %e, "replicated registration not served");
            }
        }
        let mut dropped = 0;
        for id in before.iter().filter(|id| !present.contains(*id)) {
            self.drop_replica(
                id,
                "gone from the store while this node was behind",
                revision,
            );
            dropped += 1;
        }
        dropped
    }

    /// The ids served here now.
    pub(crate) fn served_ids(&self) -> Vec<String> {
        self.registry().all().iter().map(|s| s.id.clone()).collect()
    }

    /// After a release made here: waits until every live node has applied it, or the bound
    /// B passed (then the nodes behind have fenced); `None` outside a cluster. `state`: the
    /// registration released (taken before its release), whose agent (and a child's chain)
    /// the `release_acknowledged` record carries.
    pub async fn release_acks(
        &self,
        id: &str,
        state: Option<&crate::registration::RegistrationState>,
    ) -> Option<crate::fence::Acks> {
        let revision = self.etcd()?.release_revision(id)?;
        let bound = Duration::from_millis(self.config().cluster.release_bound_ms);
        let acks = self.hub().fence().await_applied(revision, bound).await;
        let took = if acks.fenced.is_empty() {
            acks.waited
        } else {
            bound
        };
        self.metrics().release_propagated(took.as_secs_f64());
        let mut rec = match state {
            Some(state) => state.audit_record("release_acknowledged"),
            None => {
                let mut rec = crate::audit::Record::event("release_acknowledged");
                rec.registration_id = Some(id.to_string().into());
                rec
            }
        };
        rec.reason = Some(
            format!(
                "revision {}: applied by [{}] within {} ms; fenced [{}]",
                acks.revision,
                acks.acked.join(","),
                acks.waited.as_millis(),
                acks.fenced.join(",")
            )
            .into(),
        );
        let _ = self.audit().record(rec).await;
        Some(acks)
    }

    /// After a creation made here (issue 50): waits until every live node has applied its
    /// revision, so serves it, or the bound B passed (then the nodes still behind have
    /// fenced: none of them answers 404 for it). A 201 means "served by every node that is
    /// not fenced", as a release's `acked` does. `None` outside a cluster.
    pub(crate) async fn create_acks(&self, id: &str) -> Option<crate::fence::Acks> {
        let revision = self.etcd()?.create_revision(id)?;
        let bound = Duration::from_millis(self.config().cluster.release_bound_ms);
        let acks = self.hub().fence().await_applied(revision, bound).await;
        if !acks.fenced.is_empty() {
            tracing::warn!(registration = %id, revision, fenced = ?acks.fenced, "created; nodes behind the bound (fenced until they apply it)");
        }
        Some(acks)
    }

    /// The `etcd` store of a cluster node.
    pub(crate) fn etcd(&self) -> Option<&Arc<crate::store::etcd::EtcdStore>> {
        self.inner.etcd.as_ref()
    }

    /// Spawns a task the gateway owns (it ends by the gateway's shutdown token).
    pub(crate) fn spawn_owned(&self, fut: impl std::future::Future<Output = ()> + Send + 'static) {
        self.inner.tasks.spawn(fut);
    }

    /// Fires when the gateway shuts down.
    pub(crate) fn shutdown_token(&self) -> tokio_util::sync::CancellationToken {
        self.inner.shutdown.clone()
    }
}
