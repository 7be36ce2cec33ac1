//! A registration's lifecycle on this gateway: the entry points of each path (create
//! [`Gateway::register`], renew, release — explicit, guard drop, TTL expiry, admin DELETE,
//! shutdown: all through `close_registration` then `finish_release` —, restore from the
//! store, and the clean stop that keeps registrations for the next start). Each path is
//! `crate::registration::lifecycle`'s; this file is the server's side it reaches through its
//! `Server` trait (the registry insert under the lifecycle lock, the sessions, upstream
//! connections and tasks a release ends).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::audit::Record;
use crate::registration::Record as Stored;
use crate::registration::{Family, RegistrationSpec, RegistrationState};
use crate::sync::lock;
use crate::tools::{InProcessTool, ToolSet};

use super::handle::Registration;
use super::{Gateway, GatewayError, ReleaseReason, Replica};

impl Gateway {
    /// Registers an execution (`registration::lifecycle::create`): resolves its grants,
    /// mints id and token, writes it through to the store, starts the server if it is not
    /// running, and writes `registration_created` to the audit.
    pub async fn register(&self, spec: RegistrationSpec) -> Result<Registration, GatewayError> {
        let c = crate::registration::lifecycle::create(self, spec).await?;
        Ok(Registration {
            gateway: self.clone(),
            state: c.state,
            token: c.token,
            base_url: c.base_url,
            released: false,
        })
    }

    /// The one release path: explicit release, guard drop, TTL expiry, admin DELETE, shutdown
    /// (`registration::lifecycle::close`).
    pub(crate) fn close_registration(
        &self,
        id: &str,
        reason: ReleaseReason,
    ) -> Option<Arc<RegistrationState>> {
        crate::registration::lifecycle::close(self, id, reason)
    }

    /// Extends a registration's TTL by `ttl_s` (default: its own `ttl_s`) from now and
    /// records `registration_renewed`. `None` if the registration is gone; `Some(None)` if it
    /// has no TTL.
    /// A store that fails is logged and answered `None` (the `memory` store never fails);
    /// [`Gateway::renew_committed`] reports it.
    pub async fn renew(&self, id: &str, ttl_s: Option<u64>) -> Option<Option<String>> {
        let r = self.renew_committed(id, ttl_s).await;
        logged(r, id, "renewal not stored", None)
    }

    /// [`Gateway::renew`], answered only once the store has committed the new expiry
    /// (`registration::lifecycle::renew`).
    pub async fn renew_committed(
        &self,
        id: &str,
        ttl_s: Option<u64>,
    ) -> Result<Option<Option<String>>, GatewayError> {
        Ok(crate::registration::lifecycle::renew(self, id, ttl_s).await?)
    }

    /// Releases a registration by id (admin API). Waits (bounded) for its calls to end.
    pub async fn release_id(&self, id: &str, reason: ReleaseReason) -> bool {
        let r = self.release_id_committed(id, reason).await;
        logged(r, id, "release not stored", true)
    }

    /// [`Gateway::release_id`], answered once the store has committed the release (then it
    /// never comes back, not even after a restart); an error if the store failed.
    pub async fn release_id_committed(
        &self,
        id: &str,
        reason: ReleaseReason,
    ) -> Result<bool, GatewayError> {
        // A cluster node commits the release to the store before closing anything: a store
        // without quorum (or out of reach) fails it, and then nothing changed, here or on
        // any node. Once committed, it closes here at once (the watch's delete, if it comes
        // first, closes it instead, as this node's release) and the finish's own store
        // delete finds nothing left.
        #[cfg(feature = "cluster")]
        if self.hub().fence().enabled() && self.registry().get(id).is_some() {
            lock(&self.inner.releasing).insert(id.to_string());
            let committed = self.store().release(id).await;
            let closed = committed
                .is_ok()
                .then(|| self.close_registration(id, reason))
                .flatten();
            lock(&self.inner.releasing).remove(id);
            committed?;
            if let Some(state) = closed {
                self.finish_release(&state, reason).await?;
            }
            return Ok(true);
        }
        match self.close_registration(id, reason) {
            Some(state) => {
                self.finish_release(&state, reason).await?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The end of every release: the store's (first, so that it is committed early), the
    /// calls', the upstream connections', then the audit record.
    pub(super) async fn finish_release(
        &self,
        state: &Arc<RegistrationState>,
        reason: ReleaseReason,
    ) -> Result<(), crate::store::StoreError> {
        self.finish_release_from(state, reason, Replica::No).await
    }

    /// [`Gateway::finish_release`]; `replica`: the store's delete was seen in its watch (a
    /// cluster node): there is no row left to delete, and the audit record says where the
    /// release came from and carries its revision.
    pub(super) async fn finish_release_from(
        &self,
        state: &Arc<RegistrationState>,
        reason: ReleaseReason,
        replica: Replica,
    ) -> Result<(), crate::store::StoreError> {
        crate::registration::lifecycle::finish(self, state, reason, replica).await
    }

    /// Stops everything but keeps the registrations in the store for the next start (a
    /// durable store; the daemon's clean stop): calls in flight are cancelled and streams
    /// end, each registration's unspent budget block goes back to the store, and
    /// `node_stopped` is audited with how many registrations were kept. Returns that count.
    pub async fn shutdown_keeping(&self) -> usize {
        self.inner.shutdown.cancel();
        let kept = self.inner.hub.registry().all();
        for state in &kept {
            state.stop_calls();
        }
        for state in &kept {
            let _ = tokio::time::timeout(Duration::from_secs(5), state.calls.wait()).await;
        }
        let mut returned = 0u64;
        for state in &kept {
            let unused = state.take_unspent();
            if unused > 0 {
                match self.store().give_back(&state.id, unused).await {
                    Ok(()) => returned += unused,
                    Err(e) => {
                        tracing::warn!(registration = %state.id, error = %e, "unspent budget not returned")
                    }
                }
            }
        }
        let mut rec = Record::event("node_stopped");
        rec.rare_mut().registrations = Some(kept.len() as u64);
        rec.reason = Some(
            format!(
                "{} registration(s) kept in the {} store for the next start; {returned} reserved call(s) returned",
                kept.len(),
                self.store().kind().as_str()
            )
            .into(),
        );
        let _ = self.inner.hub.audit().record(rec).await;
        self.stop_serving().await;
        kept.len()
    }

    /// Loads the store's registrations (the daemon's start): each whose TTL has not passed is
    /// served again under its id and token (its sessions are gone: clients initialize again,
    /// and its upstream connections open on its first call); each whose TTL passed while the
    /// process was down is audited `registration_expired` with the time, then released
    /// (`registration::lifecycle::restore`).
    pub async fn restore(&self) -> Result<crate::registration::lifecycle::Restored, GatewayError> {
        crate::registration::lifecycle::restore(self).await
    }
}

/// The server's side of the registration lifecycle (`registration::lifecycle`).
impl crate::registration::lifecycle::Server for Gateway {
    type Error = GatewayError;

    fn config(&self) -> &crate::config::Config {
        self.inner.hub.config()
    }

    fn shutting_down(&self) -> bool {
        self.inner.shutdown.is_cancelled()
    }

    fn resolve_grants<'a>(
        &'a self,
        spec: &'a RegistrationSpec,
    ) -> futures::future::BoxFuture<'a, Result<ToolSet, String>> {
        Box::pin(async move {
            let pool = self.inner.hub.pool();
            let upstream_tools = pool.tools_for_grants(&spec.tools).await?;
            let catalog = lock(&self.inner.catalog).clone();
            let has_upstream = |p: &str| pool.has_upstream(p);
            crate::registration::resolve(spec, &catalog, &upstream_tools, has_upstream)
        })
    }

    fn creating(&self, id: &str, on: bool) {
        let mut creating = lock(&self.inner.creating);
        if on {
            creating.insert(id.to_owned());
        } else {
            creating.remove(id);
        }
    }

    fn serve_new(&self, state: &Arc<RegistrationState>) -> Result<String, GatewayError> {
        let mut lc = lock(&self.inner.lifecycle);
        self.ensure_server(&mut lc)?;
        let url = lc
            .server
            .as_ref()
            .map(|s| s.base_url.clone())
            .ok_or(GatewayError::ShuttingDown)?;
        lc.generation += 1;
        self.inner.hub.registry().insert(state.clone());
        Ok(url)
    }

    fn create_revision(&self, id: &str) -> Option<u64> {
        Gateway::create_revision(self, id)
    }

    fn await_served<'a>(&'a self, id: &'a str) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(async move {
            #[cfg(feature = "cluster")]
            let _ = self.create_acks(id).await;
            #[cfg(not(feature = "cluster"))]
            let _ = id;
        })
    }

    fn registry(&self) -> &crate::registration::Registry {
        self.inner.hub.registry()
    }

    fn deadlines(&self) -> &crate::registration::expiry::Deadlines {
        &self.inner.deadlines
    }

    fn store(&self) -> &dyn crate::store::Store {
        &**self.inner.hub.store()
    }

    fn audit(&self) -> &crate::audit::Audit {
        self.inner.hub.audit()
    }

    fn unserve(&self, id: &str) -> Option<Arc<RegistrationState>> {
        let mut lc = lock(&self.inner.lifecycle);
        let removed = self.inner.hub.registry().remove(id);
        if removed.is_some() && self.inner.hub.registry().is_empty() && lc.pins == 0 {
            self.schedule_stop(&mut lc);
        }
        removed
    }

    fn close_sessions(&self, id: &str, reason: ReleaseReason) -> usize {
        self.inner
            .hub
            .metrics()
            .registration_closed(reason.as_str());
        self.inner.hub.sessions().close_registration(id)
    }

    fn start_sweep(&self) {
        Gateway::start_sweep(self);
    }

    fn end_served<'a>(
        &'a self,
        state: &'a Arc<RegistrationState>,
    ) -> futures::future::BoxFuture<'a, ()> {
        Box::pin(async move {
            // Its live tasks are cancelled upstream (`tasks/cancel`) and audited while its
            // connections and leases still serve it.
            crate::tasks::driver::release(&self.inner.hub, state).await;
            let _ = tokio::time::timeout(
                Duration::from_secs(10),
                self.inner.hub.pool().release_registration(&state.id),
            )
            .await;
            // Its folded failed authentications first: a record about it never follows its end.
            self.inner.hub.refusals().flush_registration(&state.id);
        })
    }

    fn release_revision(&self, id: &str) -> Option<u64> {
        Gateway::release_revision(self, id)
    }

    fn catalog(&self) -> BTreeMap<String, InProcessTool> {
        lock(&self.inner.catalog).clone()
    }

    /// Serves a stored registration here under its id and token digest, in `family` (a
    /// restart's restore and a cluster node's replica both come through here): its tools
    /// found again (`Record::tool_set`), its state linked under its parent and inserted, its
    /// TTL armed.
    fn serve_record(
        &self,
        s: &Stored,
        catalog: &BTreeMap<String, InProcessTool>,
        family: Family,
        now: u64,
    ) -> Result<Arc<RegistrationState>, GatewayError> {
        // Calls reserved so far (by any node) count as spent: a node reserves its own
        // blocks (compare-and-set on the store) before its first call.
        let state = RegistrationState::from_record(s, s.tool_set(catalog)).with_family(family);
        let state = Arc::new(state);
        if let Some(p) = &state.family.parent {
            p.family.add_child(&state.id);
        }
        {
            let mut lc = lock(&self.inner.lifecycle);
            self.ensure_server(&mut lc)?;
            lc.generation += 1;
            self.inner.hub.registry().insert(state.clone());
        }
        if s.expires_at_ms != 0 {
            self.arm_deadline(
                &s.id,
                Duration::from_millis(s.expires_at_ms.saturating_sub(now)),
            );
        }
        Ok(state)
    }

    fn served(&self) {
        self.inner.hub.metrics().registration_created();
    }

    fn recheck_pins(&self, upstreams: std::collections::BTreeSet<String>) {
        let hub = self.inner.hub.clone();
        self.inner.tasks.spawn(async move {
            for id in upstreams {
                match hub.pool().catalog(&id).await {
                    Ok(_) => {
                        use crate::upstream::Downstream;
                        hub.tools_changed(&id).await;
                    }
                    Err(e) => tracing::warn!(upstream = %id, error = %e, "restored registrations: the upstream's tools could not be read to compare with their pins"),
                }
            }
        });
    }
}

/// A store's failure logged (`what`, naming the registration), answered `otherwise`.
fn logged<T>(r: Result<T, GatewayError>, id: &str, what: &str, otherwise: T) -> T {
    r.unwrap_or_else(|e| {
        tracing::error!(registration = %id, error = %e, "{what}");
        otherwise
    })
}
