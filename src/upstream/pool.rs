//! The upstream pool: the configured upstreams, their catalogs and slots; which slot serves
//! which registration; the release order (cancel → lease release → close); the events of every
//! connection (crash accounting, `list_changed`, server → client requests); shutdown.
//!
//! Vocabulary: an `Upstream` is one `[[upstreams]]` entry (its transport, cached tool catalog
//! and slots); a slot (`slot`) is one logical connection that survives respawns.
//!
//! Invariants:
//! - No std lock is held across `.await`.
//! - Release: the registration's calls are cancelled (each sends `notifications/cancelled`
//!   with the upstream id) *before* [`Pool::release_registration`] runs; that releases the
//!   registration's leases (`lease`), bounded by [`RELEASE_TIMEOUT`]; a slot whose cleanup
//!   fails or times out is closed and leaves the pool.
//! - A slot with a call in flight or an open lease is never evicted (`reaper`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, Weak};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::catalog::Catalog;
use super::events::EventReceiver;
use super::lease::{self, RELEASE_TIMEOUT};
use super::reaper;
use super::routing::{ClientRequests, Incoming};
use super::slot::{effective_sharing, Slot, Slots, Spec};
use super::{Connection, Downstream, ForwardError, Transport, UpstreamError, UpstreamEvent};
use crate::audit::Audit;
use crate::config::{Sharing, UpstreamConfig};
use crate::sync::lock;
use crate::tools::GrantedTool;

/// The pool of upstream connections of one gateway. Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    pub(super) inner: Arc<PoolInner>,
}

pub(super) struct PoolInner {
    /// The configured upstreams; a config reload swaps the whole map (`Pool::reconfigure`).
    /// Read on every forwarded call (a shared lock: readers never wait for one another).
    upstreams: RwLock<Arc<BTreeMap<String, Arc<Upstream>>>>,
    /// Some upstream is configured for 2026-07-28 (set with the map): most gateways have
    /// none, and [`Pool::is_modern`] is asked on every session's call.
    any_modern: AtomicBool,
    pub(super) audit: Audit,
    pub tasks: TaskTracker,
    stop: CancellationToken,
    /// Where what the pool cannot handle itself goes (the gateway's hub).
    downstream: OnceLock<Weak<dyn Downstream>>,
    reaper_started: AtomicBool,
    pub(super) client_requests: ClientRequests,
    /// The tracer, when tracing is on (pool work gets traces of its own).
    pub(super) telemetry: OnceLock<Arc<crate::telemetry::Telemetry>>,
}

pub(super) struct Upstream {
    pub spec: Arc<Spec>,
    /// Held while probing, so concurrent first registrations spawn one probe.
    catalog: tokio::sync::Mutex<Option<Arc<Catalog>>>,
    /// Held while a catalog is compared with the registrations' pins (`Downstream::
    /// tools_changed`); true once the cached catalog was.
    compared: tokio::sync::Mutex<bool>,
    pub slots: Mutex<Slots>,
}

fn any_modern(upstreams: &BTreeMap<String, Arc<Upstream>>) -> bool {
    upstreams.values().any(|up| up.spec.is_modern())
}

fn upstream_of(config: UpstreamConfig, transport: Transport) -> Arc<Upstream> {
    Arc::new(Upstream {
        spec: Arc::new(Spec::new(config, transport)),
        catalog: tokio::sync::Mutex::new(None),
        compared: tokio::sync::Mutex::new(false),
        slots: Mutex::new(Slots::default()),
    })
}

impl PoolInner {
    /// The upstreams as configured now (a reload swaps the map; what a caller holds stays).
    pub(super) fn ups(&self) -> Arc<BTreeMap<String, Arc<Upstream>>> {
        // A poisoned lock only means a writer panicked between two whole-map swaps.
        self.upstreams
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn up(&self, id: &str) -> Option<Arc<Upstream>> {
        self.upstreams
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }
}

/// What `Pool::reconfigure` changed, by upstream id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconfigured {
    pub added: Vec<String>,
    pub changed: Vec<String>,
    pub removed: Vec<String>,
}

/// One live upstream connection, as the admin API shows it (`GET /v1/upstreams`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConnectionInfo {
    pub epoch: u64,
    pub pid: Option<u32>,
    pub in_flight: usize,
    /// Registrations using it (leases on a shared or leased connection; 1 otherwise).
    pub registrations: usize,
}

/// One upstream's state, as the admin API shows it.
#[derive(Debug, Clone)]
pub struct UpstreamInfo {
    pub id: String,
    /// The sharing in effect once the server is known (None before its first use).
    pub effective_sharing: Option<Sharing>,
    /// Respawns after the first spawn, over all its connections.
    pub restarts: u64,
    /// Call notifications its connections could not deliver (`NotificationsRefused`).
    pub notifications_refused: u64,
    /// OAuth (issue 47): its token requests so far, (grant, outcome, count).
    pub token_requests: Vec<(&'static str, &'static str, u64)>,
    pub connections: Vec<ConnectionInfo>,
    /// Why its last connection attempt failed (a TLS failure names its cause), until a
    /// connection opens again.
    pub last_error: Option<String>,
}

/// Whether connections under `sharing` serve several registrations (their permits divided).
fn shares(sharing: Sharing) -> bool {
    matches!(sharing, Sharing::Shared | Sharing::Leased)
}

impl Pool {
    /// Builds the pool from the configured upstreams and their resolved transports (config
    /// loading resolves them); spawns nothing.
    pub fn new(upstreams: Vec<(UpstreamConfig, Transport)>, audit: Audit) -> Pool {
        let upstreams = upstreams
            .into_iter()
            .map(|(config, transport)| (config.id.clone(), upstream_of(config, transport)))
            .collect();
        Pool {
            inner: Arc::new(PoolInner {
                any_modern: AtomicBool::new(any_modern(&upstreams)),
                upstreams: RwLock::new(Arc::new(upstreams)),
                audit,
                tasks: TaskTracker::new(),
                stop: CancellationToken::new(),
                downstream: OnceLock::new(),
                reaper_started: AtomicBool::new(false),
                client_requests: ClientRequests::default(),
                telemetry: OnceLock::new(),
            }),
        }
    }

    /// Swaps in a new set of upstreams (a config reload). An unchanged upstream keeps its
    /// connections and catalog. A changed or removed one is drained: its connections stay for
    /// the calls in flight on them (each holds its slot) and are closed once idle (at most
    /// its `call_timeout_s` later); the next call uses the new definition, or fails naming
    /// the removed upstream (`ForwardError::UnknownUpstream`).
    pub fn reconfigure(&self, upstreams: Vec<(UpstreamConfig, Transport)>) -> Reconfigured {
        let mut done = Reconfigured::default();
        let mut map = BTreeMap::new();
        let retired: Vec<Arc<Upstream>> = {
            let mut current = self
                .inner
                .upstreams
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            for (config, transport) in upstreams {
                let id = config.id.clone();
                let up = match current.get(&id) {
                    Some(old)
                        if format!("{:?}", old.spec.config) == format!("{config:?}")
                            && format!("{:?}", old.spec.transport) == format!("{transport:?}") =>
                    {
                        old.clone()
                    }
                    Some(_) => {
                        done.changed.push(id.clone());
                        upstream_of(config, transport)
                    }
                    None => {
                        done.added.push(id.clone());
                        upstream_of(config, transport)
                    }
                };
                map.insert(id, up);
            }
            let retired = current
                .iter()
                .filter(|(id, old)| !map.get(*id).is_some_and(|new| Arc::ptr_eq(new, old)))
                .map(|(id, old)| {
                    if !map.contains_key(id) {
                        done.removed.push(id.clone());
                    }
                    old.clone()
                })
                .collect();
            self.inner
                .any_modern
                .store(any_modern(&map), Ordering::Release);
            *current = Arc::new(map);
            retired
        };
        for up in retired {
            let slots = {
                let mut s = lock(&up.slots);
                let mut all: Vec<Arc<Slot>> = s.per_registration.drain().map(|(_, v)| v).collect();
                all.extend(s.shared.take());
                all
            };
            let limit = Duration::from_secs(up.spec.config.call_timeout_s.max(1));
            for slot in slots {
                self.inner.tasks.spawn(async move {
                    let t0 = Instant::now();
                    while slot.in_flight.load(Ordering::Acquire) > 0 && t0.elapsed() < limit {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    let _ = tokio::time::timeout(
                        RELEASE_TIMEOUT,
                        slot.close("upstream changed or removed by a config reload"),
                    )
                    .await;
                    slot.stop.cancel();
                });
            }
        }
        done
    }

    /// Wires the pool to what routes `list_changed` and server → client requests.
    /// Traces pool work (spawn, `initialize`, catalog fetch and refresh) with `telemetry`.
    pub(crate) fn trace_with(&self, telemetry: Arc<crate::telemetry::Telemetry>) {
        let _ = self.inner.telemetry.set(telemetry);
    }

    /// `network.transport` of an upstream's requests (`pipe`, `tcp`), if it is configured.
    pub fn network_transport(&self, upstream_id: &str) -> Option<&'static str> {
        self.inner
            .up(upstream_id)
            .map(|u| u.spec.peer().transport())
    }

    pub(crate) fn attach(&self, downstream: Weak<dyn Downstream>) {
        let _ = self.inner.downstream.set(downstream);
    }

    pub fn has_upstream(&self, id: &str) -> bool {
        self.inner.up(id).is_some()
    }

    /// The config of an upstream (for exposed names).
    pub fn upstream_config(&self, id: &str) -> Option<UpstreamConfig> {
        self.inner.up(id).map(|u| u.spec.config.clone())
    }

    /// A client subscribed to `uri` on `upstream_id`: a 2026-07-28 HTTP upstream hears it on
    /// its `subscriptions/listen` stream (Some: whether the URI is watched now); any other
    /// upstream is asked `resources/subscribe` by the caller (None).
    pub fn watch_resource(&self, upstream_id: &str, uri: &str) -> Option<bool> {
        let up = self.inner.up(upstream_id)?;
        let http = matches!(up.spec.transport, Transport::Http { .. });
        (self.is_modern(upstream_id) && http).then(|| up.spec.watched.add(uri))
    }

    /// Whether `upstream_id` is configured for 2026-07-28.
    pub fn is_modern(&self, upstream_id: &str) -> bool {
        self.inner.any_modern.load(Ordering::Acquire)
            && self
                .inner
                .up(upstream_id)
                .is_some_and(|up| up.spec.is_modern())
    }

    /// The configs of the upstreams in effect now (a reload may have changed them since the
    /// gateway started), in id order.
    pub fn upstream_configs(&self) -> Vec<UpstreamConfig> {
        self.inner
            .ups()
            .values()
            .map(|u| u.spec.config.clone())
            .collect()
    }

    /// The upstream's catalog, fetched on first use: connect, `initialize`, `tools/list`. The
    /// probe's connection becomes the shared slot when the upstream is shared; otherwise it
    /// is closed (per-registration connections are spawned per registration).
    pub async fn catalog(&self, upstream_id: &str) -> Result<Arc<Catalog>, UpstreamError> {
        self.catalog_with(upstream_id, None).await
    }

    /// [`Pool::catalog`], fetched (when not cached yet) with a registration's own credential
    /// for the upstream (issue 47: an upstream that answers nothing without one): that probe
    /// connection is closed after, never kept as the shared one.
    pub(crate) async fn catalog_with(
        &self,
        upstream_id: &str,
        auth: Option<Arc<crate::registration::AuthCell>>,
    ) -> Result<Arc<Catalog>, UpstreamError> {
        let credentialed = auth.is_some();
        let up = self
            .inner
            .up(upstream_id)
            .ok_or_else(|| UpstreamError::Config(format!("unknown upstream {upstream_id:?}")))?;
        let mut cached = up.catalog.lock().await;
        if let Some(c) = cached.as_ref() {
            return Ok(c.clone());
        }
        // (`leased` is decided below, once the server's capabilities are known.)
        let probe = self.new_slot(&up.spec, false, None, auth, None);
        let span = self
            .inner
            .telemetry
            .get()
            .map(|t| t.pool_span("catalog", &up.spec.id, up.spec.peer()));
        let fetched = match probe.connection().await {
            Ok(conn) => Catalog::fetch(&conn, span.as_ref().map(|s| s.meta()))
                .await
                .map(|c| (conn, c)),
            Err(e) => Err(e),
        };
        if let Some(span) = span {
            let error = fetched.as_ref().err().map(|_| "catalog fetch failed");
            *lock(&up.spec.catalog_work) = span.end(None, error);
        }
        let (conn, catalog) = match fetched {
            Ok((conn, c)) => (conn, Arc::new(c)),
            Err(e) => {
                probe.close("catalog fetch failed").await;
                return Err(e);
            }
        };
        // The cached catalog is this connection's: its check (`Pool::verify`) need not list
        // the tools again.
        probe.catalogued.store(conn.epoch(), Ordering::SeqCst);
        let effective = effective_sharing(&up.spec, conn.supports_lease());
        let keep = {
            let mut slots = lock(&up.slots);
            slots.effective = Some(effective);
            if effective == Sharing::PerRegistration || credentialed {
                false
            } else {
                probe
                    .leased
                    .store(effective == Sharing::Leased, Ordering::SeqCst);
                slots.shared = Some(probe.clone());
                true
            }
        };
        *cached = Some(catalog.clone());
        drop(cached);
        if !keep {
            probe
                .close("probe connection not reused (per_registration, or a registration's own credential)")
                .await;
            // A registration's exchanged token that fetched it (issue 47) is not kept.
            probe.revoke_tokens();
        }
        Ok(catalog)
    }

    /// Compares a new connection's tools with the registrations' pins before its first
    /// request is sent (issue 50): a respawned or reconnected upstream may serve other
    /// definitions and announce nothing. Once per epoch of a slot (one atomic load after
    /// that): the tools are listed on `conn` (unless the cached catalog was fetched on it),
    /// the upstream's catalog replaced if they differ, and every registration granted the
    /// upstream compared with its pins (`Downstream::tools_changed`) when the catalog changed
    /// or was never compared. A connection whose tools cannot be listed serves nothing.
    pub(super) async fn verify(&self, slot: &Slot, conn: &Connection) -> Result<(), ForwardError> {
        let epoch = conn.epoch();
        if slot.verified.load(Ordering::Acquire) >= epoch {
            return Ok(());
        }
        let _one = slot.verifying.lock().await;
        if slot.verified.load(Ordering::Acquire) >= epoch {
            return Ok(());
        }
        let id = slot.spec.id.as_str();
        let up = self
            .inner
            .up(id)
            .ok_or_else(|| ForwardError::UnknownUpstream(id.to_string()))?;
        let fetched = if slot.catalogued.load(Ordering::SeqCst) == epoch {
            None
        } else {
            let listed = Catalog::fetch(conn, None).await.map_err(|source| {
                tracing::warn!(upstream = %id, epoch, error = %source, "a new connection's tools could not be listed: nothing is served on it");
                ForwardError::Unavailable {
                    upstream: id.to_string(),
                    source,
                }
            })?;
            Some(listed)
        };
        compare_catalog(&self.inner, &up, fetched, false).await;
        slot.verified.fetch_max(epoch, Ordering::AcqRel);
        Ok(())
    }

    /// The sharing in effect for an upstream, once its catalog was fetched.
    pub fn effective_sharing(&self, upstream_id: &str) -> Option<Sharing> {
        self.inner
            .up(upstream_id)
            .and_then(|u| lock(&u.slots).effective)
    }

    /// Every tool of the upstreams named by `grants` (`<upstream>.…`), as agents see them.
    pub async fn tools_for_grants(&self, grants: &[String]) -> Result<Vec<GrantedTool>, String> {
        self.tools_for_grants_with(grants, None).await
    }

    /// The slot serving `registration_id` on `upstream_id` (the sharing choice), created on
    /// first use, and whether the slot is shared between registrations (`shared`, or `leased`
    /// with the extension): its permits are then divided.
    ///
    /// `auth`: the registration's own credential for the upstream (issue 47): then the slot
    /// is its own whatever the sharing, reading that cell ([`Pool::own_slot`]).
    pub(super) async fn slot_for(
        &self,
        upstream_id: &str,
        registration_id: &str,
        auth: Option<&super::tokens::OwnAuth>,
    ) -> Result<(Arc<Slot>, bool), ForwardError> {
        let up = self
            .inner
            .up(upstream_id)
            .ok_or_else(|| ForwardError::UnknownUpstream(upstream_id.to_string()))?;
        // The common case under one lock (every call of the upstream takes it).
        let uncatalogued = {
            let slots = lock(&up.slots);
            if auth.is_none() {
                if let (Some(sharing), Some(slot)) = (slots.effective, slots.find(registration_id))
                {
                    return Ok((slot, shares(sharing)));
                }
            }
            slots.effective.is_none()
        };
        if uncatalogued {
            // Boxed: the first call's rare path (spawn, initialize, tools/list) would otherwise
            // make every forwarded call's future as large as it (BENCHMARKS.md, issue 19).
            Box::pin(self.catalog_with(upstream_id, auth.map(|a| a.cell.clone())))
                .await
                .map_err(|source| ForwardError::Unavailable {
                    upstream: upstream_id.to_string(),
                    source,
                })?;
        }
        if let Some(a) = auth {
            return Ok((self.own_slot(&up, registration_id, a), false));
        }
        let mut slots = lock(&up.slots);
        let shared = slots.effective.is_some_and(shares);
        if let Some(s) = slots.find(registration_id) {
            return Ok((s, shared));
        }
        let slot = match slots.effective {
            Some(Sharing::PerRegistration) | None => slots
                .per_registration
                .entry(registration_id.to_string())
                .or_insert_with(|| {
                    self.new_slot(&up.spec, false, Some(registration_id), None, None)
                })
                .clone(),
            Some(sharing) => {
                let leased = sharing == Sharing::Leased;
                slots
                    .shared
                    .get_or_insert_with(|| self.new_slot(&up.spec, leased, None, None, None))
                    .clone()
            }
        };
        Ok((slot, shared))
    }

    /// Releases what a registration holds: its lease on shared connections
    /// (`notifications/io.gatehouse/lease_released`), its own connections (closed). Call it
    /// after the registration's calls were cancelled. Each step is bounded; a slot whose
    /// cleanup fails or times out is closed and removed from the pool.
    pub async fn release_registration(&self, registration_id: &str) {
        self.inner
            .client_requests
            .forget_registration(registration_id);
        for up in self.inner.ups().values() {
            let (own, shared) = {
                let mut slots = lock(&up.slots);
                (
                    slots.per_registration.remove(registration_id),
                    slots.shared.clone(),
                )
            };
            if let Some(slot) = own {
                let _ = tokio::time::timeout(RELEASE_TIMEOUT, slot.close("registration released"))
                    .await;
                slot.stop.cancel();
                // Its exchanged tokens (issue 47) dropped, and revoked where offered.
                slot.revoke_tokens();
            }
            let Some(slot) = shared else { continue };
            let Some(lease) = slot.leases.remove(registration_id) else {
                continue;
            };
            let Some(conn) = slot.live() else {
                continue;
            };
            match lease::release(&conn, &lease).await {
                Ok(()) => {
                    tracing::debug!(upstream = %up.spec.id, registration = %registration_id, "lease released")
                }
                Err(why) => self.evict_shared(up, &slot, why).await,
            }
        }
    }

    async fn evict_shared(&self, up: &Upstream, slot: &Arc<Slot>, why: &str) {
        {
            let mut slots = lock(&up.slots);
            if slots.shared.as_ref().is_some_and(|s| Arc::ptr_eq(s, slot)) {
                slots.shared = None;
            }
        }
        let _ = tokio::time::timeout(RELEASE_TIMEOUT, slot.close(why)).await;
        slot.stop.cancel();
    }

    /// Each upstream's live connections (admin API `/v1/upstreams` and metrics).
    pub fn status(&self) -> Vec<UpstreamInfo> {
        self.inner
            .ups()
            .values()
            .map(|up| {
                let (effective, slots) = {
                    let s = lock(&up.slots);
                    (s.effective, s.all())
                };
                let mut restarts = 0;
                let mut connections = Vec::new();
                for slot in slots {
                    let epoch = slot.epoch.load(Ordering::Acquire);
                    restarts += epoch.saturating_sub(1);
                    if let Some(c) = slot.live() {
                        connections.push(ConnectionInfo {
                            epoch: c.epoch(),
                            pid: c.pid(),
                            in_flight: slot.in_flight.load(Ordering::Acquire),
                            registrations: slot
                                .leases
                                .len()
                                .max(usize::from(!slot.leased.load(Ordering::Acquire))),
                        });
                    }
                }
                UpstreamInfo {
                    id: up.spec.id.clone(),
                    effective_sharing: effective,
                    restarts,
                    notifications_refused: up.spec.refused.get(),
                    token_requests: up
                        .spec
                        .oauth
                        .as_ref()
                        .map(|c| c.counts())
                        .unwrap_or_default(),
                    connections,
                    last_error: lock(&up.spec.last_error).clone(),
                }
            })
            .collect()
    }

    /// Live upstream processes (pids) — for tests and diagnostics.
    pub fn pids(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for up in self.inner.ups().values() {
            let slots = lock(&up.slots).all();
            for slot in slots {
                if let Some(c) = slot.live() {
                    out.extend(c.pid());
                }
            }
        }
        out
    }

    /// Closes every connection and stops the pool's tasks.
    pub async fn shutdown(&self) {
        self.inner.stop.cancel();
        let mut closing = Vec::new();
        for up in self.inner.ups().values() {
            let slots = {
                let mut s = lock(&up.slots);
                let mut all: Vec<Arc<Slot>> = s.per_registration.drain().map(|(_, v)| v).collect();
                all.extend(s.shared.take());
                all
            };
            closing.extend(slots);
        }
        futures::future::join_all(closing.iter().map(|s| s.close("gateway shutdown"))).await;
        for s in &closing {
            s.stop.cancel();
        }
        self.inner.tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.inner.tasks.wait()).await;
    }

    pub(super) fn start_reaper(&self) {
        if self.inner.reaper_started.swap(true, Ordering::SeqCst) {
            return;
        }
        let Some(min_idle) = self
            .inner
            .ups()
            .values()
            .map(|u| u.spec.config.idle_timeout_s)
            .min()
        else {
            return;
        };
        let weak = Arc::downgrade(&self.inner);
        let stop = self.inner.stop.clone();
        self.inner
            .tasks
            .spawn(reaper::run(reaper::tick(min_idle), stop, move |now| {
                let inner = weak.upgrade()?;
                Some(async move { Pool { inner }.evict_idle(now).await })
            }));
    }

    /// Closes connections idle since before `now - idle_timeout`, skipping any with a call in
    /// flight or an open lease. Returns how many were closed.
    pub async fn evict_idle(&self, now: Instant) -> usize {
        let mut slots = Vec::new();
        for up in self.inner.ups().values() {
            let idle = Duration::from_secs(up.spec.config.idle_timeout_s);
            slots.extend(lock(&up.slots).all().into_iter().map(|s| (s, idle)));
        }
        reaper::evict(slots, now).await
    }
}

/// A notification outside any call (a log, a list change, a resource update), read once and
/// sent where [`crate::protocol::Notice::route`] says: the catalog refreshed (`tools/list_changed`),
/// the sessions of the registration that owns the connection (`per_registration`) or holds
/// the lease it names in `_meta["io.gatehouse/lease"]` (`leased`), every registration granted
/// the upstream where none can be named, or nowhere (counted in `notifications_refused`,
/// logged at debug).
async fn route_notification(
    pool: &Arc<PoolInner>,
    slot: &Arc<Slot>,
    owner: Option<&str>,
    epoch: u64,
    method: String,
    params: Option<Value>,
) {
    use crate::protocol::{Notice, Route};
    let notice = Notice::of(&method);
    let mut params = params;
    let named = match notice {
        Notice::ToolsListChanged | Notice::TaskStatus | Notice::Other => None,
        _ => named_registration(slot, owner, &mut params),
    };
    let route = notice.route(named);
    let downstream = pool.downstream.get().and_then(Weak::upgrade);
    match (route, downstream) {
        (Route::RefreshCatalog, _) => refresh_coalesced(pool, slot, epoch),
        // Routed by the task it names, never by connection: a task belongs to one
        // registration even on a shared connection.
        (Route::Task, ds) => {
            let n = match (ds, params) {
                (Some(ds), Some(p)) => ds.task_status(&slot.spec.id, epoch, p).await,
                _ => 0,
            };
            if n == 0 {
                slot.spec.refused.inc();
                tracing::debug!(upstream = %slot.spec.id, "task status notification not delivered: no session of the task's registration (counted)");
            }
        }
        (Route::Refused, _) | (_, None) => {
            slot.spec.refused.inc();
            tracing::debug!(upstream = %slot.spec.id, method, "connection-wide notification not delivered: no registration can be named (counted)");
        }
        (route, Some(ds)) => {
            let to = match &route {
                Route::Registration(r, _) => r.clone(),
                _ => "every registration granted the upstream".to_string(),
            };
            let msg = crate::protocol::jsonrpc::notification(&method, params);
            let n = ds.notify(&slot.spec.id, route, msg).await;
            tracing::debug!(upstream = %slot.spec.id, method, to, sessions = n, "connection-wide notification delivered");
        }
    }
}

/// The registration a message from the server is for, outside any call: the slot's owner
/// (`per_registration`), else the holder of the lease named in
/// `params._meta["io.gatehouse/lease"]` (`leased`); None on `shared`. The lease key is
/// stripped from `params` (it is the gateway's, not the client's).
fn named_registration(
    slot: &Slot,
    owner: Option<&str>,
    params: &mut Option<Value>,
) -> Option<String> {
    let meta = params
        .as_mut()
        .and_then(|p| p.get_mut("_meta"))
        .and_then(Value::as_object_mut);
    let lease = meta.and_then(|m| m.remove(super::lease::LEASE_META_KEY));
    owner.map(str::to_string).or_else(|| {
        lease
            .as_ref()
            .and_then(Value::as_str)
            .and_then(|l| slot.leases.registration_of(l))
    })
}

/// A slot's event task: what its connections report.
pub(super) async fn run_events(
    pool: Weak<PoolInner>,
    slot: Weak<Slot>,
    mut rx: EventReceiver,
    stop: CancellationToken,
    owner: Option<String>,
) {
    let mut summaries = tokio::time::interval(super::events::SUMMARY_EVERY);
    summaries.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let ev = tokio::select! {
            () = stop.cancelled() => {
                rx.summarise(true);
                return;
            }
            _ = summaries.tick() => {
                rx.summarise(false);
                continue;
            }
            ev = rx.recv() => match ev {
                Some(ev) => ev,
                None => {
                    rx.summarise(true);
                    return;
                }
            },
        };
        let Some(slot) = slot.upgrade() else { return };
        match ev {
            UpstreamEvent::Closed { epoch, reason } => slot.on_closed(epoch, reason),
            UpstreamEvent::Notification {
                method,
                epoch,
                params,
            } => {
                if let Some(pool) = pool.upgrade() {
                    route_notification(&pool, &slot, owner.as_deref(), epoch, method, params).await;
                }
            }
            UpstreamEvent::Progress { epoch, params, .. } => {
                // A task's progress after its creating call ended (routed by the task table;
                // anything else is dropped there).
                let downstream = pool
                    .upgrade()
                    .and_then(|p| p.downstream.get().and_then(Weak::upgrade));
                if let Some(ds) = downstream {
                    ds.task_progress(&slot.spec.id, epoch, params).await;
                }
            }
            UpstreamEvent::Request {
                epoch,
                id,
                method,
                params,
                related_tag,
                ..
            } => {
                let (Some(conn), Some(pool)) = (slot.current_of(epoch), pool.upgrade()) else {
                    continue;
                };
                let downstream = pool.downstream.get().and_then(Weak::upgrade);
                let mut params = params;
                let registration = named_registration(&slot, owner.as_deref(), &mut params);
                let req = Incoming {
                    upstream_id: slot.spec.id.clone(),
                    conn,
                    id,
                    method,
                    params,
                    related_tag,
                    registration,
                };
                pool.client_requests.route(req, downstream).await;
            }
        }
    }
}

/// `notifications/tools/list_changed`: the catalog is fetched again, and the sessions of every
/// registration granted a tool of this upstream are told (by the gateway's hub).
/// `tools/list_changed`, coalesced: one refresh in flight per slot (on the pool's tracker, so
/// the event task goes on reading) plus a dirty flag; a flood of N announcements costs at
/// most two refreshes after the first, not N.
fn refresh_coalesced(pool: &Arc<PoolInner>, slot: &Arc<Slot>, epoch: u64) {
    {
        let mut r = lock(&slot.refresh);
        if r.in_flight {
            r.dirty = true;
            return;
        }
        r.in_flight = true;
    }
    let (weak, slot) = (Arc::downgrade(pool), slot.clone());
    pool.tasks.spawn(async move {
        loop {
            let Some(pool) = weak.upgrade() else {
                lock(&slot.refresh).in_flight = false;
                return;
            };
            tools_changed(&pool, &slot, epoch).await;
            let mut r = lock(&slot.refresh);
            if !r.dirty {
                r.in_flight = false;
                return;
            }
            r.dirty = false;
        }
    });
}

async fn tools_changed(pool: &PoolInner, slot: &Slot, epoch: u64) {
    let conn = slot.current_of(epoch);
    if let (Some(conn), Some(up)) = (conn, pool.up(&slot.spec.id)) {
        // Pool work with a trace of its own; no call waits on a refresh, so none links it.
        let span = pool
            .telemetry
            .get()
            .map(|t| t.pool_span("catalog_refresh", &slot.spec.id, slot.spec.peer()));
        let fetched = Catalog::fetch(&conn, span.as_ref().map(|s| s.meta())).await;
        if let Some(span) = span {
            span.end(
                Some(epoch),
                fetched.as_ref().err().map(|_| "catalog refresh failed"),
            );
        }
        match fetched {
            Ok(c) => {
                tracing::info!(upstream = %slot.spec.id, "tool catalog refreshed");
                compare_catalog(pool, &up, Some(c), true).await;
                return;
            }
            Err(e) => {
                tracing::warn!(upstream = %slot.spec.id, error = %e, "tool catalog refresh failed")
            }
        }
    }
    if let Some(ds) = pool.downstream.get().and_then(Weak::upgrade) {
        ds.tools_changed(&slot.spec.id).await;
    }
}

/// Takes `fetched` (if any) as the upstream's catalog and compares the registrations granted
/// the upstream with their pins (`Downstream::tools_changed`) when it differs from the cached
/// one, when the cached one was never compared, or when `always`. One comparison at a time per
/// upstream, so a connection checked after another never passes on a comparison still under way.
async fn compare_catalog(pool: &PoolInner, up: &Upstream, fetched: Option<Catalog>, always: bool) {
    let mut compared = up.compared.lock().await;
    let changed = match fetched {
        None => false,
        Some(c) => {
            let mut cached = up.catalog.lock().await;
            let changed = cached.as_ref().is_none_or(|old| old.tools != c.tools);
            if changed {
                *cached = Some(Arc::new(c));
            }
            changed
        }
    };
    if !(changed || always || !*compared) {
        return;
    }
    if changed {
        tracing::warn!(upstream = %up.spec.id, "a new connection's tools differ from the catalog: comparing with the pins");
    }
    // The catalog lock is not held here: the comparison reads the catalog through it.
    if let Some(ds) = pool.downstream.get().and_then(Weak::upgrade) {
        ds.tools_changed(&up.spec.id).await;
    }
    *compared = true;
}
