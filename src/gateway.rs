//! The `Gateway` handle: registrations, and the one HTTP server they share, started lazily by
//! the first registration and stopped (after a linger) when the last one is released.
//!
//! Invariant: the lifecycle lock is taken before the registry is checked for emptiness, and
//! registration inserts happen under it too, so a registration arriving while the server is
//! stopping is served, never lost.

#[cfg(feature = "cluster")]
mod cluster;
pub mod probe;
mod reload;
#[cfg(feature = "cluster")]
mod replica;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::audit::{Audit, AuditError, Record};
use crate::config::Config;
use crate::config::StoreBackend;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::registration::expiry::Deadlines;
use crate::registration::{
    new_registration_id_on, new_token, Family, Grant, RegistrationSpec, RegistrationState, Registry,
};
use crate::session::SessionTable;
use crate::store::{Store, StoredRegistration, StoredTool};
use crate::sync::lock;
use crate::tools::{Backend, GrantedTool, InProcessTool, ToolSet};
use crate::upstream::Pool;

/// Why a gateway operation failed.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("invalid registration: {0}")]
    InvalidSpec(String),
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Audit(#[from] AuditError),
    #[error("the gateway is shutting down")]
    ShuttingDown,
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// Why a registration ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseReason {
    Released,
    Expired,
    Shutdown,
}

impl ReleaseReason {
    fn event(self) -> &'static str {
        match self {
            ReleaseReason::Released | ReleaseReason::Shutdown => "registration_released",
            ReleaseReason::Expired => "registration_expired",
        }
    }

    /// The metrics label of the reason.
    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseReason::Released => "released",
            ReleaseReason::Expired => "expired",
            ReleaseReason::Shutdown => "shutdown",
        }
    }
}

struct RunningServer {
    addr: SocketAddr,
    base_url: String,
    stop: CancellationToken,
}

#[derive(Default)]
struct Lifecycle {
    server: Option<RunningServer>,
    /// Bumped by every registration; a scheduled stop only proceeds if it is unchanged.
    generation: u64,
    /// Holders that keep the server up with no registration (the daemon).
    pins: usize,
    /// How many times the server was started (for tests and metrics).
    starts: u64,
}

pub(crate) struct Inner {
    /// The handles requests are served with (passed to the server, never this `Gateway`).
    hub: Arc<Hub>,
    catalog: Mutex<BTreeMap<String, InProcessTool>>,
    lifecycle: Mutex<Lifecycle>,
    /// Owns the server task and stop timers.
    tasks: TaskTracker,
    shutdown: CancellationToken,
    /// TTL deadlines; the sweep task expires them.
    deadlines: Arc<Deadlines>,
    sweeper_started: AtomicBool,
    /// The file the config was read from (the daemon's; what a reload reads again).
    config_path: Mutex<Option<std::path::PathBuf>>,
    /// Ids being created here (between the store's commit and the registry insert): the
    /// cluster's watch does not adopt them meanwhile.
    creating: Mutex<std::collections::HashSet<String>>,
    /// Ids whose release this node is committing to the store: the watch's delete, if it
    /// comes first, is this node's own release, not one made elsewhere.
    #[cfg(feature = "cluster")]
    releasing: Mutex<std::collections::HashSet<String>>,
    /// The `etcd` store, when the node is one of a cluster (`gateway::cluster`).
    #[cfg(feature = "cluster")]
    etcd: Option<Arc<crate::store::etcd::EtcdStore>>,
}

/// A cheap-to-clone handle to one gateway.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

impl Gateway {
    /// Builds a gateway. Opens the audit file; binds nothing until the first registration.
    /// Its store is `[store] backend`, by default `memory` (registrations end with the process).
    pub fn new(config: Config) -> Result<Gateway, GatewayError> {
        Gateway::with_store_default(config, StoreBackend::Memory)
    }

    /// [`Gateway::new`] with another default store backend (`gatehouse serve`: `sqlite`).
    /// Opens (and checks) the store before the audit: a store that cannot be read stops the
    /// start before anything is written.
    pub fn with_store_default(
        config: Config,
        default: StoreBackend,
    ) -> Result<Gateway, GatewayError> {
        config.validate()?;
        #[cfg(feature = "cluster")]
        let etcd = match config.store.backend.unwrap_or(default) {
            StoreBackend::Etcd => Some(crate::store::open_etcd(&config.store)?),
            _ => None,
        };
        #[cfg(feature = "cluster")]
        let store: Arc<dyn Store> = match &etcd {
            Some(e) => e.clone(),
            None => crate::store::open(&config.store, &config.audit.path, default)?,
        };
        #[cfg(not(feature = "cluster"))]
        let store = crate::store::open(&config.store, &config.audit.path, default)?;
        let audit = Audit::start_on(&config.audit, config.node_id.as_deref())?;
        let pool = Pool::new(
            crate::config_load::resolve_transports(&config)?,
            audit.clone(),
        );
        let telemetry =
            crate::telemetry::Telemetry::start(&config.telemetry, config.node_id.as_deref())
                .map_err(|e| GatewayError::Config(crate::config::ConfigError::Invalid(e)))?;
        let gw = Gateway {
            inner: Arc::new(Inner {
                hub: Hub::new(config, audit, pool, store, telemetry),
                catalog: Mutex::new(BTreeMap::new()),
                lifecycle: Mutex::new(Lifecycle::default()),
                tasks: TaskTracker::new(),
                shutdown: CancellationToken::new(),
                deadlines: Arc::new(Deadlines::default()),
                sweeper_started: AtomicBool::new(false),
                config_path: Mutex::new(None),
                creating: Mutex::new(std::collections::HashSet::new()),
                #[cfg(feature = "cluster")]
                releasing: Mutex::new(std::collections::HashSet::new()),
                #[cfg(feature = "cluster")]
                etcd,
            }),
        };
        // A cluster node replicates the store wherever its gateway is built (the daemon, an
        // embedded Rust or Python gateway): the gateway owns the tasks.
        #[cfg(feature = "cluster")]
        gw.start_cluster()?;
        Ok(gw)
    }

    /// The shared handles.
    pub(crate) fn hub(&self) -> &Arc<Hub> {
        &self.inner.hub
    }

    /// The upstream connection pool.
    pub(crate) fn pool(&self) -> &Pool {
        self.inner.hub.pool()
    }

    pub(crate) fn config(&self) -> &Arc<Config> {
        self.inner.hub.config()
    }

    pub(crate) fn audit(&self) -> &Audit {
        self.inner.hub.audit()
    }

    pub(crate) fn registry(&self) -> &Registry {
        self.inner.hub.registry()
    }

    pub(crate) fn sessions(&self) -> &SessionTable {
        self.inner.hub.sessions()
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        self.inner.hub.metrics()
    }

    pub(crate) fn deadlines(&self) -> &Deadlines {
        &self.inner.deadlines
    }

    /// Names the file the config was read from (what `reload_config` reads again).
    pub fn set_config_path(&self, path: std::path::PathBuf) {
        *lock(&self.inner.config_path) = Some(path);
    }

    pub(crate) fn config_path(&self) -> Option<std::path::PathBuf> {
        lock(&self.inner.config_path).clone()
    }

    /// The registration store.
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        self.inner.hub.store()
    }

    /// The store's kind (`memory`, `sqlite`) and file.
    pub fn store_location(&self) -> (&'static str, Option<std::path::PathBuf>) {
        let s = self.store();
        (
            s.kind().as_str(),
            s.path().map(std::path::Path::to_path_buf),
        )
    }

    /// Whether registrations outlive the process in the store (`sqlite`, `etcd`).
    pub fn store_durable(&self) -> bool {
        self.store().durable()
    }

    /// The store's counters (operations, commits).
    pub fn store_stats(&self) -> crate::store::StoreStats {
        self.store().stats()
    }

    /// Adds an in-process tool to the gateway's catalog; registrations grant it by name.
    pub fn add_tool(&self, tool: InProcessTool) {
        lock(&self.inner.catalog).insert(tool.name().to_string(), tool);
    }

    /// The data listener's address, if the server is running.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        lock(&self.inner.lifecycle).server.as_ref().map(|s| s.addr)
    }

    /// How many times the data server has been started.
    pub fn server_starts(&self) -> u64 {
        lock(&self.inner.lifecycle).starts
    }

    /// Keeps the server up with no registration (the daemon); returns its address.
    pub fn pin_server(&self) -> Result<SocketAddr, GatewayError> {
        let mut lc = lock(&self.inner.lifecycle);
        self.ensure_server(&mut lc)?;
        lc.pins += 1;
        lc.generation += 1;
        lc.server
            .as_ref()
            .map(|s| s.addr)
            .ok_or(GatewayError::ShuttingDown)
    }

    /// Registers an execution: resolves its grants, mints id and token, starts the server
    /// if it is not running, and writes `registration_created` to the audit.
    pub async fn register(&self, spec: RegistrationSpec) -> Result<Registration, GatewayError> {
        if self.inner.shutdown.is_cancelled() {
            return Err(GatewayError::ShuttingDown);
        }
        spec.check().map_err(GatewayError::InvalidSpec)?;
        // A child (a sub-agent) resolves among its parent's tools, within its parent's bounds.
        let (tools, family, spec) = match spec.parent.clone() {
            None => {
                let upstream_tools = self
                    .inner
                    .hub
                    .pool()
                    .tools_for_grants(&spec.tools)
                    .await
                    .map_err(GatewayError::InvalidSpec)?;
                let tools = self.resolve_grants(&spec, &upstream_tools)?;
                (tools, Family::default(), spec)
            }
            Some(pid) => {
                let parent = self.inner.hub.registry().get(&pid).ok_or_else(|| {
                    GatewayError::InvalidSpec(format!(
                        "parent {pid:?} is not a live registration (released, expired, or never made)"
                    ))
                })?;
                let now = chrono::Utc::now().timestamp_millis().max(0) as u64;
                let caps = &self.inner.hub.config().children;
                let c = crate::registration::family::child_of(&parent, spec, caps, now)
                    .map_err(GatewayError::InvalidSpec)?;
                (c.tools, c.family, c.spec)
            }
        };
        // In a cluster any node serves any registration: its id names no node.
        let node = match self.store().kind() {
            crate::store::StoreKind::Etcd => None,
            _ => self.inner.hub.config().node_id.as_deref(),
        };
        let id = new_registration_id_on(node);
        let token = new_token();
        let state = Arc::new(RegistrationState::new(id, &token, &spec, tools).with_family(family));
        // Written through before it is served: the 201 follows the store's commit.
        let store = self.store();
        let block = crate::store::block_of(
            &state.limits,
            self.config().store.budget_block,
            store.durable(),
        );
        if state.limits.max_calls.is_some() {
            // A cluster node holds none: the first call on any node reserves a block sized to
            // what is left over the live nodes, so no budget waits on a node without traffic.
            let block = if store.kind() == crate::store::StoreKind::Etcd {
                0
            } else {
                block
            };
            state.budget().first_block(block);
        }
        lock(&self.inner.creating).insert(state.id.clone());
        let reserved = state.budget().store_reserved();
        let created = store.create(stored_of(&state, reserved)).await;
        let served = created.map_err(GatewayError::from).and_then(|()| {
            let mut lc = lock(&self.inner.lifecycle);
            self.ensure_server(&mut lc).and_then(|()| {
                let url = lc
                    .server
                    .as_ref()
                    .map(|s| s.base_url.clone())
                    .ok_or(GatewayError::ShuttingDown)?;
                lc.generation += 1;
                self.inner.hub.registry().insert(state.clone());
                Ok(url)
            })
        });
        lock(&self.inner.creating).remove(&state.id);
        let base_url = match served {
            Ok(url) => url,
            Err(e @ GatewayError::Store(_)) => return Err(e),
            Err(e) => {
                // Never served: it must not come back at the next start either.
                let _ = store.release(&state.id).await;
                return Err(e);
            }
        };
        if let Some(parent) = &state.family.parent {
            parent.family.add_child(&state.id);
            // A parent released meanwhile took no note of this child: end it now.
            if parent.is_released() {
                if let Some(s) = self.close_registration(&state.id, ReleaseReason::Released) {
                    // Best effort: the child is not served either way.
                    let _ = self.finish_release(&s, ReleaseReason::Released).await;
                }
                return Err(GatewayError::InvalidSpec(format!(
                    "parent {:?} was released while this child was made",
                    parent.id
                )));
            }
        }
        let mut rec = lifecycle_record("registration_created", &state);
        rec.tools = Some(state.tools.names());
        // A cluster node: the revision the store committed the creation at.
        rec.store_revision = self.create_revision(&state.id);
        if let Err(e) = self.inner.hub.audit().record(rec).await {
            self.close_registration(&state.id, ReleaseReason::Released);
            let _ = store.release(&state.id).await;
            return Err(e.into());
        }
        if let Some(ttl) = state.ttl_s {
            self.set_deadline(&state, ttl);
        }
        // A cluster node: the 201 waits until every live node serves it, or has fenced.
        #[cfg(feature = "cluster")]
        let _ = self.create_acks(&state.id).await;
        self.inner.hub.metrics().registration_created();
        tracing::info!(registration = %state.id, agent_id = %state.agent_id, tools = state.tools.len(), "registered");
        Ok(Registration {
            gateway: self.clone(),
            state,
            token,
            base_url,
            released: false,
        })
    }

    fn resolve_grants(
        &self,
        spec: &RegistrationSpec,
        upstream_tools: &[GrantedTool],
    ) -> Result<ToolSet, GatewayError> {
        let catalog = lock(&self.inner.catalog).clone();
        let mut granted: Vec<GrantedTool> = Vec::new();
        for t in &spec.local_tools {
            granted.push(GrantedTool {
                name: t.name().to_string(),
                descriptor: t.shared_descriptor(),
                backend: Backend::InProcess(t.clone()),
            });
        }
        for pattern in &spec.tools {
            let grant = Grant::parse(pattern).map_err(GatewayError::InvalidSpec)?;
            let before = granted.len();
            for (name, t) in catalog.iter().filter(|(n, _)| grant.matches(n)) {
                granted.push(GrantedTool {
                    name: name.clone(),
                    descriptor: t.shared_descriptor(),
                    backend: Backend::InProcess(t.clone()),
                });
            }
            granted.extend(
                upstream_tools
                    .iter()
                    .filter(|t| matches!(t.backend, Backend::Upstream { .. }) && grant.grants(t))
                    .cloned(),
            );
            if granted.len() == before {
                let prefix = grant.upstream();
                return Err(GatewayError::InvalidSpec(match prefix {
                    Some(p) if self.inner.hub.pool().has_upstream(p) => format!(
                        "grant {pattern:?} matches no tool: upstream {p:?} has no tool by that name"
                    ),
                    Some(p) => format!(
                        "grant {pattern:?} matches no tool: {p:?} is not a configured upstream and no in-process tool has that name"
                    ),
                    None => format!(
                        "grant {pattern:?} matches no tool: no in-process tool or upstream tool has that name"
                    ),
                }));
            }
        }
        let described = granted.iter().map(|t| {
            let who = match &t.backend {
                Backend::InProcess(_) => format!("in-process tool {:?}", t.name),
                Backend::Upstream { grant_name, .. } => format!("upstream tool {grant_name:?}"),
            };
            (t.name.as_str(), who)
        });
        if let Some((name, a, b)) = crate::tool_name::first_collision(described) {
            return Err(GatewayError::InvalidSpec(format!(
                "tool name collision: {a} and {b} are both exposed as {name:?}; rename one (the upstream's `rename`) or choose another separator"
            )));
        }
        Ok(ToolSet::new(granted))
    }

    fn ensure_server(&self, lc: &mut Lifecycle) -> Result<(), GatewayError> {
        if lc.server.is_some() {
            return Ok(());
        }
        if self.inner.shutdown.is_cancelled() {
            return Err(GatewayError::ShuttingDown);
        }
        let addr_s = &self.inner.hub.config().listen;
        let bind_err = |source| GatewayError::Bind {
            addr: addr_s.clone(),
            source,
        };
        let std_listener = std::net::TcpListener::bind(addr_s.as_str()).map_err(bind_err)?;
        std_listener.set_nonblocking(true).map_err(bind_err)?;
        let addr = std_listener.local_addr().map_err(bind_err)?;
        let listener = tokio::net::TcpListener::from_std(std_listener).map_err(bind_err)?;
        let stop = self.inner.shutdown.child_token();
        let base_url = match &self.inner.hub.config().public_url {
            Some(u) => u.trim_end_matches('/').to_string(),
            None => format!("http://{addr}"),
        };
        self.inner.tasks.spawn(crate::server::serve(
            listener,
            self.inner.hub.clone(),
            stop.clone(),
        ));
        // The idle reaper lives as long as the server (same stop token, same tracker).
        let hub = self.inner.hub.clone();
        let reaper_stop = stop.clone();
        self.inner.tasks.spawn(async move {
            hub.sessions().run_reaper(reaper_stop).await;
        });
        // So does the writer of folded `auth_failed` counts (it writes what is left on stop).
        let hub = self.inner.hub.clone();
        let folder_stop = stop.clone();
        self.inner.tasks.spawn(async move {
            hub.refusals().run_folder(folder_stop).await;
        });
        lc.starts += 1;
        self.inner.hub.set_local_addr(addr);
        tracing::info!(%addr, "data server started");
        lc.server = Some(RunningServer {
            addr,
            base_url,
            stop,
        });
        Ok(())
    }

    /// The one release path: explicit release, guard drop, TTL expiry, admin DELETE, shutdown.
    /// The registry entry goes first, so the very next request answers 404.
    pub(crate) fn close_registration(
        &self,
        id: &str,
        reason: ReleaseReason,
    ) -> Option<Arc<RegistrationState>> {
        // Its descendants first, deepest first, each closed like this one; its release
        // (`finish_release`) finishes theirs before its own.
        let children = self
            .inner
            .hub
            .registry()
            .get(id)
            .map(|s| s.family.children())
            .unwrap_or_default();
        let mut closed_children = Vec::new();
        for child in children {
            if let Some(c) = self.close_registration(&child, reason) {
                closed_children.push(c);
            }
        }
        let removed = {
            let mut lc = lock(&self.inner.lifecycle);
            let removed = self.inner.hub.registry().remove(id);
            if removed.is_some() && self.inner.hub.registry().is_empty() && lc.pins == 0 {
                self.schedule_stop(&mut lc);
            }
            removed
        };
        let state = removed?;
        state.family.closed_with(closed_children);
        if let Some(parent) = &state.family.parent {
            parent.family.remove_child(id);
        }
        self.inner.deadlines.remove(id);
        self.inner
            .hub
            .metrics()
            .registration_closed(reason.as_str());
        state.release();
        state.close_calls();
        let closed = self.inner.hub.sessions().close_registration(id);
        tracing::info!(registration = %id, sessions = closed, ?reason, "released");
        Some(state)
    }

    fn schedule_stop(&self, lc: &mut Lifecycle) {
        let generation = lc.generation;
        let linger = Duration::from_millis(self.inner.hub.config().linger_ms);
        let inner = Arc::downgrade(&self.inner);
        let stop_now = |lc: &mut Lifecycle| {
            if let Some(s) = lc.server.take() {
                s.stop.cancel();
                tracing::info!(addr = %s.addr, "data server stopped: no registration left");
            }
        };
        if linger.is_zero() || tokio::runtime::Handle::try_current().is_err() {
            stop_now(lc);
            return;
        }
        self.inner.tasks.spawn(async move {
            tokio::time::sleep(linger).await;
            let Some(inner) = inner.upgrade() else { return };
            // Lock first, then check: a registration that arrived meanwhile bumped generation.
            let mut lc = lock(&inner.lifecycle);
            if lc.generation == generation && lc.pins == 0 && inner.hub.registry().is_empty() {
                stop_now(&mut lc);
            }
        });
    }

    /// Starts (or moves) the expiry deadline of `state`: it expires `ttl_s` from now unless renewed.
    /// A child's deadline is never past its parent's (its `ttl_s` is whole seconds, counted
    /// from a later instant).
    fn set_deadline(&self, state: &RegistrationState, ttl_s: u64) {
        let (at, after) = deadline_of(state, ttl_s);
        state.move_expiry(at);
        self.arm_deadline(&state.id, after);
    }

    /// Expires `id` after `after` unless it is renewed; starts the sweep on first use.
    fn arm_deadline(&self, id: &str, after: Duration) {
        self.inner.deadlines.set(id, after);
        self.start_sweep();
    }

    /// Starts the expiry sweep on first use.
    fn start_sweep(&self) {
        if !self.inner.sweeper_started.swap(true, Ordering::AcqRel) {
            let deadlines = self.inner.deadlines.clone();
            let weak = Arc::downgrade(&self.inner);
            let stop = self.inner.shutdown.clone();
            self.inner.tasks.spawn(sweep(weak, deadlines, stop));
        }
    }

    /// Extends a registration's TTL by `ttl_s` (default: its own `ttl_s`) from now and
    /// records `registration_renewed`. `None` if the registration is gone; `Some(None)` if it
    /// has no TTL.
    /// A store that fails is logged and answered `None` (the `memory` store never fails);
    /// [`Gateway::renew_committed`] reports it.
    pub async fn renew(&self, id: &str, ttl_s: Option<u64>) -> Option<Option<String>> {
        match self.renew_committed(id, ttl_s).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(registration = %id, error = %e, "renewal not stored");
                None
            }
        }
    }

    /// [`Gateway::renew`], answered only once the store has committed the new expiry.
    pub async fn renew_committed(
        &self,
        id: &str,
        ttl_s: Option<u64>,
    ) -> Result<Option<Option<String>>, GatewayError> {
        let Some(state) = self.inner.hub.registry().get(id) else {
            return Ok(None);
        };
        let Some(mut ttl) = ttl_s.or(state.ttl_s) else {
            return Ok(Some(None));
        };
        // A child's lease ends no later than its parent's.
        if let Some(parent) = &state.family.parent {
            let end = parent.expires_at_ms();
            if end != 0 {
                let now = chrono::Utc::now().timestamp_millis().max(0) as u64;
                ttl = ttl.min(end.saturating_sub(now).div_ceil(1000).max(1));
            }
        }
        // One decision with the expiry (`expiry::Deadlines::renew`): a deadline passed or
        // taken by the sweep is not moved, and the renewal is answered 404.
        let (at, after) = deadline_of(&state, ttl);
        let renewal = self.inner.deadlines.renew(id, after, || {
            state.move_expiry(at);
        });
        if renewal == crate::registration::expiry::Renewal::Expired {
            return Ok(None);
        }
        self.start_sweep();
        // A release that raced with the renewal wins: do not leave a deadline behind.
        if self.inner.hub.registry().get(id).is_none() || state.is_released() {
            self.inner.deadlines.remove(id);
            return Ok(None);
        }
        self.store().renew(id, state.expires_at_ms()).await?;
        let _ = self
            .inner
            .hub
            .audit()
            .record(lifecycle_record("registration_renewed", &state))
            .await;
        Ok(Some(state.expires_at()))
    }

    /// Releases a registration by id (admin API). Waits (bounded) for its calls to end.
    pub async fn release_id(&self, id: &str, reason: ReleaseReason) -> bool {
        match self.release_id_committed(id, reason).await {
            Ok(found) => found,
            Err(e) => {
                tracing::error!(registration = %id, error = %e, "release not stored");
                true
            }
        }
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
    async fn finish_release(
        &self,
        state: &Arc<RegistrationState>,
        reason: ReleaseReason,
    ) -> Result<(), crate::store::StoreError> {
        self.finish_release_from(state, reason, Replica::No).await
    }

    /// [`Gateway::finish_release`]; `replica`: the store's delete was seen in its watch (a
    /// cluster node): there is no row left to delete, and the audit record says where the
    /// release came from and carries its revision.
    async fn finish_release_from(
        &self,
        state: &Arc<RegistrationState>,
        reason: ReleaseReason,
        replica: Replica,
    ) -> Result<(), crate::store::StoreError> {
        // The children closed with it end first (their store rows, calls, leases and records).
        let children = state.family.take_closed();
        for child in children {
            if let Err(e) = Box::pin(self.finish_release_from(&child, reason, replica)).await {
                tracing::error!(registration = %child.id, error = %e, "a child's release not stored");
            }
        }
        let (stored, elsewhere, revision) = match replica {
            Replica::No => (
                self.store().release(&state.id).await.map(|_| ()),
                None,
                self.release_revision(&state.id),
            ),
            Replica::Deleted { why, revision } => (Ok(()), why, revision),
        };
        // Cancel first (the calls' tokens fired in `close_registration`; each upstream call sends
        // `notifications/cancelled` before its task ends), then release leases and connections.
        let _ = tokio::time::timeout(Duration::from_secs(5), state.calls.wait()).await;
        // Its live tasks are cancelled upstream (`tasks/cancel`) and audited while its
        // connections and leases still serve it.
        crate::mcp::tasks::release(&self.inner.hub, state).await;
        let _ = tokio::time::timeout(
            Duration::from_secs(10),
            self.inner.hub.pool().release_registration(&state.id),
        )
        .await;
        // Its folded failed authentications first: a record about it never follows its end.
        self.inner.hub.refusals().flush_registration(&state.id);
        let mut rec = lifecycle_record(reason.event(), state);
        if reason == ReleaseReason::Shutdown {
            rec.reason = Some("shutdown".into());
        }
        if let Some(why) = elsewhere {
            rec.reason = Some(why.into());
        }
        // A cluster node: the revision of the store's delete (R), the release's decision.
        rec.store_revision = revision;
        let cascade;
        if let Some(parent) = state.family.parent.as_ref().filter(|p| p.is_released()) {
            cascade = format!("with its parent {}", parent.id);
            rec.reason = Some(cascade.as_str().into());
        }
        let _ = self.inner.hub.audit().record(rec).await;
        stored
    }

    /// Stops everything: releases every registration, closes sessions, stops the server.
    pub async fn shutdown(&self) {
        for state in self.inner.hub.registry().all() {
            self.release_id(&state.id, ReleaseReason::Shutdown).await;
        }
        self.stop_serving().await;
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

    async fn stop_serving(&self) {
        self.inner.shutdown.cancel();
        self.inner.hub.sessions().close_all();
        self.inner.hub.pool().shutdown().await;
        {
            let mut lc = lock(&self.inner.lifecycle);
            if let Some(s) = lc.server.take() {
                s.stop.cancel();
            }
        }
        self.inner.tasks.close();
        let grace = Duration::from_secs(self.inner.hub.config().shutdown_grace_s.max(1));
        let _ = tokio::time::timeout(grace, self.inner.tasks.wait()).await;
        self.store().close().await;
        // The spans of the calls that just ended are posted before the process goes.
        if let Some(t) = self.inner.hub.telemetry().cloned() {
            let _ = tokio::task::spawn_blocking(move || t.shutdown(Duration::from_secs(5))).await;
        }
    }

    /// Loads the store's registrations (the daemon's start): each whose TTL has not passed is
    /// served again under its id and token (its sessions are gone: clients initialize again,
    /// and its upstream connections open on its first call); each whose TTL passed while the
    /// process was down is audited `registration_expired` with the time, then released.
    pub async fn restore(&self) -> Result<Restored, GatewayError> {
        let mut all = self.store().load_all().await?;
        // Parents before their children (a child may share its parent's millisecond).
        let depth_of = {
            let parents: std::collections::HashMap<&str, Option<&str>> = all
                .iter()
                .map(|s| (s.id.as_str(), s.parent.as_deref()))
                .collect();
            all.iter()
                .map(|s| {
                    let mut d = 0usize;
                    let mut at = s.parent.as_deref();
                    while let Some(p) = at.filter(|_| d < 64) {
                        d += 1;
                        at = parents.get(p).copied().flatten();
                    }
                    (s.id.clone(), d)
                })
                .collect::<std::collections::HashMap<String, usize>>()
        };
        all.sort_by_key(|s| (depth_of.get(&s.id).copied().unwrap_or(0), s.created_at_ms));
        // A child's agent path, from the stored rows (a child that does not come back is
        // audited with its chain too, as it would have been live).
        let paths = stored_agent_paths(&all);
        let now = chrono::Utc::now().timestamp_millis().max(0) as u64;
        let catalog = lock(&self.inner.catalog).clone();
        let mut done = Restored::default();
        for s in all {
            if s.expired_at(now) {
                let mut rec = Record::about(
                    "registration_expired",
                    &s.id,
                    &s.agent_id,
                    s.label.as_deref(),
                );
                rec.reason = Some("expired while the daemon was down".into());
                if let Some(pid) = &s.parent {
                    rec.rare_mut().parent_registration_id = Some(pid.as_str().into());
                    rec.rare_mut().agent_path = paths.get(&s.id).map(|p| p.as_slice().into());
                }
                rec.rare_mut().expired_at =
                    chrono::DateTime::from_timestamp_millis(s.expires_at_ms as i64).map(|t| {
                        t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                            .into()
                    });
                self.audit().record(rec).await?;
                self.store().release(&s.id).await?;
                done.expired += 1;
                continue;
            }
            // A child comes back under its parent (stored before it); one whose parent did not
            // come back ended with it.
            let family = match &s.parent {
                None => Family::default(),
                Some(pid) => match self.inner.hub.registry().get(pid) {
                    Some(p) => Family::child_of(&p, &s.agent_id),
                    None => {
                        let mut rec = Record::about(
                            "registration_released",
                            &s.id,
                            &s.agent_id,
                            s.label.as_deref(),
                        );
                        rec.reason = Some(format!("its parent {pid} did not come back").into());
                        rec.rare_mut().parent_registration_id = Some(pid.as_str().into());
                        rec.rare_mut().agent_path = paths.get(&s.id).map(|p| p.as_slice().into());
                        self.audit().record(rec).await?;
                        self.store().release(&s.id).await?;
                        done.expired += 1;
                        continue;
                    }
                },
            };
            let state = self.serve_stored(&s, &catalog, family, now)?;
            let mut rec = lifecycle_record("registration_restored", &state);
            rec.tools = Some(state.tools.names());
            self.audit().record(rec).await?;
            self.metrics().registration_created();
            done.live += 1;
        }
        // The upstreams' tools may have changed while the process was down: each upstream a
        // restored registration uses is asked for its catalog now, in the background, and
        // every registration compared with its pins (`pins`), as on a `list_changed`.
        let upstreams: std::collections::BTreeSet<String> = self
            .inner
            .hub
            .registry()
            .all()
            .iter()
            .flat_map(|r| {
                r.tools
                    .iter()
                    .filter_map(|t| t.upstream().map(str::to_string))
                    .collect::<Vec<_>>()
            })
            .collect();
        if !upstreams.is_empty() {
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
        Ok(done)
    }
}

/// What [`Gateway::restore`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// Served again.
    pub live: usize,
    /// Expired while the process was down: audited and released.
    pub expired: usize,
}

/// A registration as the store keeps it (the token's digest, never the token).
fn stored_of(state: &RegistrationState, calls_reserved: u64) -> StoredRegistration {
    let tools = state
        .tools
        .iter()
        .map(|t| match &t.backend {
            Backend::InProcess(_) => StoredTool {
                name: t.name.clone(),
                upstream: None,
                tool: None,
                grant_name: None,
                descriptor: None,
            },
            Backend::Upstream {
                upstream,
                tool,
                grant_name,
                ..
            } => StoredTool {
                name: t.name.clone(),
                upstream: Some(upstream.clone()),
                tool: Some(tool.clone()),
                grant_name: Some(grant_name.clone()),
                descriptor: Some(t.descriptor.clone()),
            },
        })
        .collect();
    StoredRegistration {
        id: state.id.clone(),
        agent_id: state.agent_id.to_string(),
        label: state.label.clone(),
        token_sha256: state.token_sha256(),
        grants: state
            .grants
            .iter()
            .map(|g| g.as_str().to_string())
            .collect(),
        tools,
        limits: state.limits.clone(),
        roots: state.roots.clone(),
        ttl_s: state.ttl_s,
        created_at_ms: state.created_at.timestamp_millis(),
        expires_at_ms: state.expires_at_ms(),
        node: state.id.split_once('.').map(|(n, _)| n.to_string()),
        calls_reserved,
        parent: state.family.parent.as_ref().map(|p| p.id.clone()),
    }
}

impl Gateway {
    /// Serves a stored registration here under its id and token digest, in `family` (a
    /// restart's restore and a cluster node's replica both come through here): its tools
    /// found again (`restored_tools`), its state linked under its parent and inserted, its
    /// TTL armed.
    fn serve_stored(
        &self,
        s: &StoredRegistration,
        catalog: &BTreeMap<String, InProcessTool>,
        family: Family,
        now: u64,
    ) -> Result<Arc<RegistrationState>, GatewayError> {
        let spec = RegistrationSpec {
            agent_id: s.agent_id.clone(),
            tools: s.grants.clone(),
            label: s.label.clone(),
            ttl_s: s.ttl_s,
            limits: s.limits.clone(),
            local_tools: Vec::new(),
            roots: s.roots.clone(),
            parent: s.parent.clone(),
        };
        // Calls reserved so far (by any node) count as spent: a node reserves its own
        // blocks (compare-and-set on the store) before its first call.
        let state = RegistrationState::restored(
            s.id.clone(),
            s.token_sha256,
            &spec,
            restored_tools(&s.tools, catalog),
            s.created_at_ms,
            s.expires_at_ms,
            s.calls_reserved,
        )
        .with_family(family);
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
}

/// The tool set of a restored registration: upstream tools as stored (their connection opens
/// on the first call), in-process ones found again in the catalog by name (one no longer
/// there is left out).
fn restored_tools(stored: &[StoredTool], catalog: &BTreeMap<String, InProcessTool>) -> ToolSet {
    let mut tools = Vec::with_capacity(stored.len());
    for t in stored {
        match (&t.upstream, &t.tool, &t.grant_name, &t.descriptor) {
            (Some(upstream), Some(tool), Some(grant_name), Some(descriptor)) => {
                tools.push(GrantedTool {
                    name: t.name.clone(),
                    descriptor: descriptor.clone(),
                    backend: Backend::Upstream {
                        upstream: upstream.clone(),
                        tool: tool.clone(),
                        grant_name: grant_name.clone(),
                        task_support: crate::tools::task_support(descriptor),
                    },
                })
            }
            _ => match catalog.get(&t.name) {
                Some(p) => tools.push(GrantedTool {
                    name: t.name.clone(),
                    descriptor: p.shared_descriptor(),
                    backend: Backend::InProcess(p.clone()),
                }),
                None => {
                    tracing::warn!(tool = %t.name, "restored registration: in-process tool no longer in the catalog")
                }
            },
        }
    }
    ToolSet::new(tools)
}

/// The wall-clock expiry (ms) of `state` renewed for `ttl_s` from now, never past its
/// parent's, and the time until it.
fn deadline_of(state: &RegistrationState, ttl_s: u64) -> (u64, Duration) {
    let wall = chrono::Utc::now().timestamp_millis().max(0) as u64;
    let mut at = wall.saturating_add(ttl_s.saturating_mul(1000));
    if let Some(parent) = &state.family.parent {
        let cap = parent.expires_at_ms();
        if cap != 0 {
            at = at.min(cap);
        }
    }
    (at, Duration::from_millis(at.saturating_sub(wall)))
}

/// Expiries the sweep runs at once.
const SWEEP_CONCURRENCY: usize = 64;

/// The lease sweep: sleeps until the earliest deadline, then expires through the one close
/// path (`close_registration` + the same finish as an explicit release).
async fn sweep(weak: std::sync::Weak<Inner>, deadlines: Arc<Deadlines>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = deadlines.wait_next() => {}
        }
        let expired = deadlines.take_expired(tokio::time::Instant::now());
        if expired.is_empty() {
            continue;
        }
        let Some(inner) = weak.upgrade() else { return };
        let gw = Gateway { inner };
        // Several at once (a batch of deadlines that fell together ends together, not one
        // release after another): a renewal of one of them has lost already
        // (`Deadlines::renew`), and the registration should not outlive that answer for long.
        let (gw, deadlines) = (&gw, &deadlines);
        futures::StreamExt::for_each_concurrent(
            futures::stream::iter(expired),
            SWEEP_CONCURRENCY,
            |id| async move {
                tracing::info!(registration = %id, "lease expired");
                match gw.release_id_committed(&id, ReleaseReason::Expired).await {
                    // Released (its deadline forgotten by the close), or already gone.
                    Ok(_) => deadlines.remove(&id),
                    Err(e) => {
                        // Not released (a cluster's store refused it): expire it again soon.
                        tracing::error!(registration = %id, error = %e, "expiry not stored; retried in 1 s");
                        if gw.registry().get(&id).is_some() {
                            deadlines.retry(&id, Duration::from_secs(1));
                        } else {
                            deadlines.remove(&id);
                        }
                    }
                }
            },
        )
        .await;
    }
}

#[cfg(not(feature = "cluster"))]
impl Gateway {
    /// Outside a cluster a record carries no store revision.
    fn release_revision(&self, _id: &str) -> Option<u64> {
        None
    }

    fn create_revision(&self, _id: &str) -> Option<u64> {
        None
    }
}

/// Where a release's end comes from: this node's own release (it deletes the store's row),
/// or a delete a cluster node saw in the store's watch.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Replica {
    No,
    /// `why`: the record's reason (`None`: the delete was this node's own release, seen
    /// before its request finished); `revision`: the delete's.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    Deleted {
        why: Option<&'static str>,
        revision: Option<u64>,
    },
}

/// Each stored child's agent ids from its root down (`Family::child_of`'s `agent_path`), read
/// from the stored rows' parents; an ancestor the store no longer holds ends the walk (the
/// path then starts at the oldest one it holds).
fn stored_agent_paths(
    all: &[crate::store::StoredRegistration],
) -> std::collections::HashMap<String, Vec<String>> {
    let rows: std::collections::HashMap<&str, &crate::store::StoredRegistration> =
        all.iter().map(|s| (s.id.as_str(), s)).collect();
    all.iter()
        .filter(|s| s.parent.is_some())
        .map(|s| {
            let mut path = vec![s.agent_id.clone()];
            let mut at = s.parent.as_deref();
            while let Some(p) = at.and_then(|p| rows.get(p)).filter(|_| path.len() <= 64) {
                path.push(p.agent_id.clone());
                at = p.parent.as_deref();
            }
            path.reverse();
            (s.id.clone(), path)
        })
        .collect()
}

fn lifecycle_record<'a>(event: &'a str, state: &'a RegistrationState) -> Record<'a> {
    state.audit_record(event)
}

/// A live registration. Dropping it releases it; `release().await` does so and waits.
pub struct Registration {
    gateway: Gateway,
    state: Arc<RegistrationState>,
    token: String,
    base_url: String,
    released: bool,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("id", &self.state.id)
            .field("agent_id", &self.state.agent_id)
            .field("token", &"<redacted>")
            .finish()
    }
}

impl Registration {
    pub fn id(&self) -> &str {
        &self.state.id
    }

    /// The bearer token; shown once, never logged.
    pub fn token(&self) -> &str {
        &self.token
    }

    pub fn agent_id(&self) -> &str {
        &self.state.agent_id
    }

    pub fn label(&self) -> Option<&str> {
        self.state.label.as_deref()
    }

    /// The names of the tools this registration may call, in `tools/list` order.
    pub fn tools(&self) -> Vec<String> {
        self.state.tools.names()
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Legacy HTTP+SSE endpoint.
    pub fn sse_url(&self) -> String {
        format!("{}/gw/{}/sse", self.base_url, self.state.id)
    }

    /// Streamable HTTP endpoint.
    pub fn mcp_url(&self) -> String {
        format!("{}/gw/{}/mcp", self.base_url, self.state.id)
    }

    pub fn expires_at(&self) -> Option<String> {
        self.state.expires_at()
    }

    /// Gives the registration up so that only an explicit `Gateway::release_id`, expiry or
    /// shutdown ends it (the daemon keeps registrations this way).
    pub fn detach(mut self) -> (String, String) {
        self.released = true;
        (self.state.id.clone(), std::mem::take(&mut self.token))
    }

    /// Releases now: cancels in-flight calls, ends streams, waits (bounded) for the calls to
    /// be recorded as cancelled, then records the release.
    pub async fn release(mut self) {
        self.released = true;
        if let Some(state) = self
            .gateway
            .close_registration(&self.state.id, ReleaseReason::Released)
        {
            if let Err(e) = self
                .gateway
                .finish_release(&state, ReleaseReason::Released)
                .await
            {
                tracing::error!(registration = %self.state.id, error = %e, "release not stored");
            }
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Some(state) = self
            .gateway
            .close_registration(&self.state.id, ReleaseReason::Released)
        {
            match tokio::runtime::Handle::try_current() {
                Ok(_) => {
                    let gw = self.gateway.clone();
                    self.gateway.inner.tasks.spawn(async move {
                        let _ = gw.finish_release(&state, ReleaseReason::Released).await;
                    });
                }
                Err(_) => {
                    // No runtime to wait on: the store's writer is a thread of its own.
                    let _ = futures::executor::block_on(self.gateway.store().release(&state.id));
                    self.gateway
                        .audit()
                        .record_detached(lifecycle_record("registration_released", &state))
                }
            }
        }
    }
}
