//! The `Gateway` handle: registrations, and the one HTTP server they share, started lazily by
//! the first registration and stopped (after a linger) when the last one is released.
//!
//! Invariant: the lifecycle lock is taken before the registry is checked for emptiness, and
//! registration inserts happen under it too, so a registration arriving while the server is
//! stopping is served, never lost.

#[cfg(feature = "cluster")]
mod cluster;
mod credentials;
pub(crate) mod handle;
mod lifecycle;
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

use crate::audit::{Audit, AuditError};
use crate::config::Config;
use crate::config::StoreBackend;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::registration::expiry::Deadlines;
use crate::registration::Registry;
use crate::session::SessionTable;
use crate::store::Store;
use crate::sync::lock;
use crate::tools::InProcessTool;
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

impl From<crate::registration::lifecycle::Refused> for GatewayError {
    fn from(r: crate::registration::lifecycle::Refused) -> Self {
        match r {
            crate::registration::lifecycle::Refused::ShuttingDown => GatewayError::ShuttingDown,
            crate::registration::lifecycle::Refused::InvalidSpec(why) => {
                GatewayError::InvalidSpec(why)
            }
        }
    }
}

pub use crate::registration::lifecycle::ReleaseReason;
pub(crate) use crate::registration::lifecycle::Replica;

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
    /// Seals upstream credentials for a durable store (issue 47); `None` for `memory`.
    sealer: Option<Arc<crate::store::seal::Sealer>>,
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
        let sealer = Self::open_sealer(&config, store.as_ref())?;
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
                sealer,
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

    /// Fires when the gateway begins to stop (the admin API's long polls and streams end).
    pub(crate) fn stopping(&self) -> CancellationToken {
        self.inner.shutdown.clone()
    }

    /// Stops everything: releases every registration, closes sessions, stops the server.
    pub async fn shutdown(&self) {
        for state in self.inner.hub.registry().all() {
            self.release_id(&state.id, ReleaseReason::Shutdown).await;
        }
        self.stop_serving().await;
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
