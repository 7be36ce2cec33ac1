//! The upstream pool: which connection serves which registration, leases on shared connections,
//! respawn with fresh epochs, the release order (cancel → lease release → close), idle eviction,
//! and routing of what upstreams send unprompted (server → client requests, `list_changed`).
//!
//! Vocabulary:
//! - An [`Upstream`] is one `[[upstreams]]` entry: its transport, its cached tool catalog and
//!   its slots.
//! - A [`Slot`] is one logical connection that survives respawns: one [`IdCounter`] (ids never
//!   reused), an epoch bumped on every (re)spawn, the map upstream id → pending call, the open
//!   leases, and one event task. `shared`/`leased` upstreams have one slot for everyone;
//!   `per_registration` upstreams (and `leased` ones whose server lacks the extension) have one
//!   slot per registration.
//!
//! Invariants:
//! - No std lock is held across `.await` (the connect path uses a tokio mutex per slot).
//! - A lease id is minted by the gateway per (slot, registration) and is the only value of
//!   `_meta["io.gatehouse/lease"]` an upstream ever sees from that registration.
//! - Release: the registration's calls are cancelled (each sends `notifications/cancelled` with the
//!   upstream id) *before* [`Pool::release_registration`] runs; that sends
//!   `notifications/io.gatehouse/lease_released`, bounded by [`RELEASE_TIMEOUT`]; a slot whose
//!   cleanup fails or times out is closed and leaves the pool.
//! - A slot with a call in flight or an open lease is never evicted.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{
    ConnectOptions, Connection, IdCounter, RequestOptions, Transport, UpstreamError, UpstreamEvent,
    LEASE_CAPABILITY,
};
use crate::audit::{Audit, Record};
use crate::config::{Sharing, UpstreamConfig};
use crate::gateway::WeakGateway;
use crate::registry::{random_b64, RegistrationState};
use crate::session::Session;
use crate::sync::lock;
use crate::tools::{Backend, GrantedTool};

/// `_meta` key carrying the lease id on every forwarded request.
pub const LEASE_META_KEY: &str = "io.gatehouse/lease";
/// Notification releasing a lease: `{"lease": id}`.
pub const LEASE_RELEASED_METHOD: &str = "notifications/io.gatehouse/lease_released";
/// `command = "@self"` means the running gatehouse executable.
pub const SELF_COMMAND: &str = "@self";
/// Overrides what `@self` resolves to (tests point it at the built binary).
pub const SELF_EXE_ENV: &str = "GATEHOUSE_SELF_EXE";
/// Upper bound for releasing one registration's resources on one upstream.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(3);
/// JSON-RPC error code for server → client requests the gateway refuses.
const REFUSED: i64 = -32603;
/// How long a server → client request may wait for room on a client stream.
const CLIENT_REQUEST_SEND_TIMEOUT: Duration = Duration::from_secs(2);

/// The pool of upstream connections of one gateway. Cheap to clone.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    upstreams: BTreeMap<String, Arc<Upstream>>,
    audit: Audit,
    tasks: TaskTracker,
    stop: CancellationToken,
    gateway: OnceLock<WeakGateway>,
    reaper_started: AtomicBool,
    /// Gateway-minted downstream id → the upstream request it stands for.
    client_requests: Mutex<HashMap<String, ClientRequest>>,
    next_client_request: AtomicU64,
}

struct ClientRequest {
    registration_id: String,
    session_id: String,
    conn: Connection,
    upstream_request_id: Value,
}

/// Rewrites a request's `_meta` for the upstream, the same for tool calls and for proxied
/// resources/prompts requests: nothing that carries the caller's bearer token, however it is
/// wrapped ("Bearer <token>", nested objects, keys); no 2026-07-28 envelope; the registration's
/// lease (never the caller's) when the slot is leased.
fn upstream_meta(params: &mut Map<String, Value>, registration: &RegistrationState, slot: &Slot) {
    let mut meta = match params.remove("_meta") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    meta.retain(|k, v| {
        !registration.token_in(v) && !registration.token_in(&Value::from(k.as_str()))
    });
    meta.remove(LEASE_META_KEY);
    strip_envelope(&mut meta);
    if slot.leased.load(Ordering::SeqCst) {
        meta.insert(
            LEASE_META_KEY.into(),
            Value::String(slot.lease_for(&registration.id)),
        );
    }
    if !meta.is_empty() {
        params.insert("_meta".into(), Value::Object(meta));
    }
}

/// One live upstream connection, as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    pub connections: Vec<ConnectionInfo>,
}

/// An upstream's tools as fetched at its first use (refreshed on `list_changed`).
#[derive(Debug, Clone)]
pub struct Catalog {
    pub tools: Vec<Value>,
    pub supports_lease: bool,
    /// The server's `capabilities` from its `initialize` result (`resources`, `prompts`, …).
    pub capabilities: Value,
}

/// What never changes about an upstream.
struct Spec {
    id: String,
    config: UpstreamConfig,
    transport: Transport,
}

struct Upstream {
    spec: Arc<Spec>,
    /// Held while probing, so concurrent first registrations spawn one probe.
    catalog: tokio::sync::Mutex<Option<Arc<Catalog>>>,
    slots: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    /// Sharing in effect once the server is known (`leased` without the extension → per registration).
    effective: Option<Sharing>,
    shared: Option<Arc<Slot>>,
    per_registration: HashMap<String, Arc<Slot>>,
}

/// Who a pending upstream request belongs to.
#[derive(Clone)]
struct PendingCall {
    registration_id: String,
    session: Option<Arc<Session>>,
    #[allow(dead_code)]
    downstream_id: Value,
    epoch: u64,
    /// The call's own downstream sink (Streamable HTTP: its POST's SSE response stream; legacy
    /// SSE: the session stream). Server → client requests related to the call go here first.
    notify: Option<mpsc::Sender<Value>>,
}

/// One logical connection: survives respawns, keeps its id counter and epochs.
struct Slot {
    spec: Arc<Spec>,
    pool: Weak<PoolInner>,
    leased: AtomicBool,
    ids: IdCounter,
    epoch: AtomicU64,
    /// The connect path (held across the spawn).
    conn: tokio::sync::Mutex<Option<Connection>>,
    /// The live connection, for sync readers (events, eviction).
    current: Mutex<Option<Connection>>,
    events_tx: mpsc::UnboundedSender<UpstreamEvent>,
    /// Consecutive failed spawns or crashes (drives the respawn backoff).
    crashes: AtomicU32,
    /// Epoch the gateway itself tore down last (its `Closed` event is not a crash).
    killed_epoch: AtomicU64,
    /// Last epoch counted in `crashes` (a failed spawn is seen twice: as the connect error and
    /// as its `Closed` event; it counts once).
    crash_epoch: AtomicU64,
    in_flight: AtomicUsize,
    permits: Arc<Semaphore>,
    last_used: Mutex<Instant>,
    /// Registration id → lease id.
    leases: Mutex<HashMap<String, String>>,
    pending: Mutex<HashMap<u64, PendingCall>>,
    stop: CancellationToken,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One forwarded `tools/call`.
pub struct ForwardCall<'a> {
    pub registration: &'a Arc<RegistrationState>,
    pub session: Option<Arc<Session>>,
    pub downstream_id: Value,
    pub upstream: &'a str,
    pub tool: &'a str,
    /// The downstream params (`name` and `arguments` are replaced).
    pub params: Map<String, Value>,
    pub arguments: Value,
    pub cancel: CancellationToken,
    /// Where `notifications/progress` for this call goes.
    pub notify: Option<mpsc::Sender<Value>>,
}

/// How a forwarded call ended.
#[derive(Debug)]
pub enum ForwardOutcome {
    /// The upstream's `CallToolResult`, unchanged.
    Result(Value),
    /// The upstream answered a JSON-RPC error.
    RpcError {
        code: i64,
        message: String,
    },
    /// The connection could not be made or died (`upstream_failed`).
    Failed(String),
    Timeout(Duration),
    Cancelled,
}

#[derive(Debug)]
pub struct Forwarded {
    pub upstream_request_id: Option<u64>,
    pub epoch: Option<u64>,
    pub outcome: ForwardOutcome,
}

/// Resolves `${NAME}` references in a header value from the environment.
fn resolve_env(upstream: &str, value: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(format!(
                "upstream {upstream:?}: unterminated ${{ in header value"
            ));
        };
        let name = &after[..end];
        let v = std::env::var(name).map_err(|_| {
            format!("upstream {upstream:?}: header refers to environment variable {name}, which is not set")
        })?;
        out.push_str(&v);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The transport of one configured upstream (`@self` and `${NAME}` resolved).
pub fn transport_for(config: &UpstreamConfig) -> Result<Transport, String> {
    if let Some(url) = &config.url {
        let mut headers = BTreeMap::new();
        for (k, v) in &config.headers {
            headers.insert(k.clone(), resolve_env(&config.id, v)?);
        }
        return Ok(Transport::Http {
            url: url.clone(),
            headers,
        });
    }
    let command = config
        .command
        .clone()
        .ok_or_else(|| format!("upstream {:?} has neither command nor url", config.id))?;
    let command = if command == SELF_COMMAND {
        match std::env::var_os(SELF_EXE_ENV) {
            Some(p) => PathBuf::from(p),
            None => std::env::current_exe()
                .map_err(|e| format!("upstream {:?}: cannot resolve @self: {e}", config.id))?,
        }
        .to_string_lossy()
        .into_owned()
    } else {
        command
    };
    Ok(Transport::Stdio {
        command,
        args: config.args.clone(),
        env: config.env.clone(),
        cwd: config.cwd.clone(),
    })
}

/// The name agents see for an upstream tool, and its grant name `<upstream>.<tool>`
/// (`tool_name`: `rename`, then the upstream's separator and model-safe rule).
pub fn exposed_name(config: &UpstreamConfig, tool: &str) -> (String, String) {
    let local = config.rename.get(tool).map(String::as_str).unwrap_or(tool);
    (
        crate::tool_name::exposed(&config.id, local, config.name_rule()),
        crate::tool_name::grant_name(&config.id, local),
    )
}

/// Drops the 2026-07-28 per-request envelope (`io.modelcontextprotocol/protocolVersion`,
/// `clientCapabilities`, …) from a forwarded `_meta`: it describes the client's request to the
/// gateway, not the gateway's connection to the upstream, and a handshake-era upstream rejects
/// requests that carry it.
pub fn strip_envelope(meta: &mut Map<String, Value>) {
    meta.retain(|k, _| !k.starts_with("io.modelcontextprotocol/"));
}

fn backoff(crashes: u32) -> Duration {
    if crashes < 2 {
        return Duration::ZERO;
    }
    let exp = (crashes - 2).min(6);
    Duration::from_millis(100u64 << exp).min(Duration::from_secs(5))
}

impl Pool {
    /// Builds the pool from the configured upstreams; spawns nothing.
    pub fn new(configs: &[UpstreamConfig], audit: Audit) -> Result<Pool, String> {
        let mut upstreams = BTreeMap::new();
        for c in configs {
            let transport = transport_for(c)?;
            upstreams.insert(
                c.id.clone(),
                Arc::new(Upstream {
                    spec: Arc::new(Spec {
                        id: c.id.clone(),
                        config: c.clone(),
                        transport,
                    }),
                    catalog: tokio::sync::Mutex::new(None),
                    slots: Mutex::new(Slots::default()),
                }),
            );
        }
        Ok(Pool {
            inner: Arc::new(PoolInner {
                upstreams,
                audit,
                tasks: TaskTracker::new(),
                stop: CancellationToken::new(),
                gateway: OnceLock::new(),
                reaper_started: AtomicBool::new(false),
                client_requests: Mutex::new(HashMap::new()),
                next_client_request: AtomicU64::new(1),
            }),
        })
    }

    /// Lets the pool reach sessions (for `list_changed` and server → client requests).
    pub(crate) fn attach(&self, gateway: WeakGateway) {
        let _ = self.inner.gateway.set(gateway);
    }

    pub fn has_upstream(&self, id: &str) -> bool {
        self.inner.upstreams.contains_key(id)
    }

    /// The upstream's catalog, fetched on first use: connect, `initialize`, `tools/list`.
    pub async fn catalog(&self, upstream_id: &str) -> Result<Arc<Catalog>, UpstreamError> {
        let up =
            self.inner.upstreams.get(upstream_id).ok_or_else(|| {
                UpstreamError::Config(format!("unknown upstream {upstream_id:?}"))
            })?;
        let mut cached = up.catalog.lock().await;
        if let Some(c) = cached.as_ref() {
            return Ok(c.clone());
        }
        // The probe slot becomes the shared slot when the upstream is shared; otherwise it is
        // closed (per-registration connections are spawned per registration).
        let probe = self.new_slot(&up.spec, false);
        // (`leased` is decided below, once the server's capabilities are known.)
        let conn = probe.connection().await?;
        let tools = match conn.list_tools().await {
            Ok(t) => t,
            Err(e) => {
                probe.close("catalog fetch failed").await;
                return Err(e);
            }
        };
        let supports_lease = conn.supports_lease();
        let effective = match up.spec.config.sharing {
            Sharing::Leased if !supports_lease => {
                tracing::warn!(
                    upstream = %up.spec.id,
                    "sharing = \"leased\" but the server did not advertise {LEASE_CAPABILITY} during initialize: falling back to per_registration"
                );
                Sharing::PerRegistration
            }
            s => s,
        };
        let capabilities = conn
            .initialize_result()
            .get("capabilities")
            .cloned()
            .unwrap_or_else(|| json!({}));
        let catalog = Arc::new(Catalog {
            tools,
            supports_lease,
            capabilities,
        });
        let keep = {
            let mut slots = lock(&up.slots);
            slots.effective = Some(effective);
            if effective == Sharing::PerRegistration {
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
                .close("probe connection not reused (per_registration)")
                .await;
        }
        Ok(catalog)
    }

    /// The sharing in effect for an upstream, once its catalog was fetched.
    pub fn effective_sharing(&self, upstream_id: &str) -> Option<Sharing> {
        self.inner
            .upstreams
            .get(upstream_id)
            .and_then(|u| lock(&u.slots).effective)
    }

    /// Every tool of the upstreams named by `grants` (`<upstream>.…`), as agents see them.
    pub async fn tools_for_grants(&self, grants: &[String]) -> Result<Vec<GrantedTool>, String> {
        let mut named: Vec<&str> = Vec::new();
        for g in grants {
            if let Some((prefix, _)) = g.split_once('.') {
                if self.has_upstream(prefix) && !named.contains(&prefix) {
                    named.push(prefix);
                }
            }
        }
        let mut out = Vec::new();
        for id in named {
            let catalog = self
                .catalog(id)
                .await
                .map_err(|e| format!("upstream {id:?} is unavailable: {e}"))?;
            let Some(up) = self.inner.upstreams.get(id) else {
                continue;
            };
            for t in &catalog.tools {
                let Some(tool) = t.get("name").and_then(Value::as_str) else {
                    continue;
                };
                let (name, grant_name) = exposed_name(&up.spec.config, tool);
                if !crate::config::valid_tool_name(&name) {
                    tracing::warn!(upstream = %id, tool, "tool not exposed: its name is not 1-128 characters of [A-Za-z0-9_.-]");
                    continue;
                }
                let mut descriptor = t.clone();
                if let Some(m) = descriptor.as_object_mut() {
                    m.insert("name".into(), Value::String(name.clone()));
                }
                out.push(GrantedTool {
                    name,
                    descriptor: Arc::new(descriptor),
                    backend: Backend::Upstream {
                        upstream: id.to_string(),
                        tool: tool.to_string(),
                        grant_name,
                    },
                });
            }
        }
        Ok(out)
    }

    fn new_slot(&self, spec: &Arc<Spec>, leased: bool) -> Arc<Slot> {
        self.start_reaper();
        let (tx, rx) = mpsc::unbounded_channel();
        let slot = Arc::new(Slot {
            spec: spec.clone(),
            pool: Arc::downgrade(&self.inner),
            leased: AtomicBool::new(leased),
            ids: IdCounter::default(),
            epoch: AtomicU64::new(0),
            conn: tokio::sync::Mutex::new(None),
            current: Mutex::new(None),
            events_tx: tx,
            crashes: AtomicU32::new(0),
            killed_epoch: AtomicU64::new(0),
            crash_epoch: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            permits: Arc::new(Semaphore::new(spec.config.max_in_flight.max(1))),
            last_used: Mutex::new(Instant::now()),
            leases: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            stop: CancellationToken::new(),
        });
        self.inner
            .tasks
            .spawn(run_events(Arc::downgrade(&slot), rx, slot.stop.clone()));
        slot
    }

    async fn slot_for(
        &self,
        upstream_id: &str,
        registration_id: &str,
    ) -> Result<Arc<Slot>, String> {
        let up = self
            .inner
            .upstreams
            .get(upstream_id)
            .ok_or_else(|| format!("unknown upstream {upstream_id:?}"))?;
        if lock(&up.slots).effective.is_none() {
            self.catalog(upstream_id)
                .await
                .map_err(|e| format!("upstream {upstream_id:?} is unavailable: {e}"))?;
        }
        let existing = {
            let slots = lock(&up.slots);
            match slots.effective {
                Some(Sharing::PerRegistration) | None => {
                    slots.per_registration.get(registration_id).cloned()
                }
                Some(_) => slots.shared.clone(),
            }
        };
        if let Some(s) = existing {
            return Ok(s);
        }
        let mut slots = lock(&up.slots);
        match slots.effective {
            Some(Sharing::PerRegistration) | None => Ok(slots
                .per_registration
                .entry(registration_id.to_string())
                .or_insert_with(|| self.new_slot(&up.spec, false))
                .clone()),
            Some(sharing) => {
                let leased = sharing == Sharing::Leased;
                Ok(slots
                    .shared
                    .get_or_insert_with(|| self.new_slot(&up.spec, leased))
                    .clone())
            }
        }
    }

    /// Forwards one `tools/call`; never hangs past the call timeout, cancel, or connection death.
    pub async fn forward(&self, call: ForwardCall<'_>) -> Forwarded {
        let mut fwd = Forwarded {
            upstream_request_id: None,
            epoch: None,
            outcome: ForwardOutcome::Cancelled,
        };
        let in_use = match self
            .acquire(call.upstream, &call.registration.id, &call.cancel)
            .await
        {
            Ok(u) => u,
            Err(None) => return fwd,
            Err(Some(why)) => {
                fwd.outcome = ForwardOutcome::Failed(why);
                return fwd;
            }
        };
        let (slot, conn) = (&in_use.slot, &in_use.conn);
        fwd.epoch = Some(conn.epoch());

        let mut params = call.params;
        params.insert("name".into(), Value::String(call.tool.to_string()));
        params.insert("arguments".into(), call.arguments);
        upstream_meta(&mut params, call.registration, slot);

        let (started_tx, started_rx) = oneshot::channel();
        let (progress_tx, mut progress_rx) = match &call.notify {
            Some(_) => {
                let (tx, rx) = mpsc::channel(64);
                (Some(tx), Some(rx))
            }
            None => (None, None),
        };
        let (logs_tx, mut logs_rx) = match &call.notify {
            Some(_) => {
                let (tx, rx) = mpsc::channel(64);
                (Some(tx), Some(rx))
            }
            None => (None, None),
        };
        // Upstream logs pass the session's `logging/setLevel` filter on their way to the client.
        let session = call.session.clone();
        let forward_log = |msg: Value| {
            let level = msg
                .get("params")
                .and_then(|p| p.get("level"))
                .and_then(Value::as_str)
                .unwrap_or("");
            if let (Some(n), true) = (
                &call.notify,
                session.as_ref().is_none_or(|s| s.wants_log(level)),
            ) {
                let _ = n.try_send(msg);
            }
        };
        let timeout = Duration::from_secs(slot.spec.config.call_timeout_s.max(1));
        let opts = RequestOptions {
            timeout: Some(timeout),
            cancel: call.cancel.clone(),
            progress: progress_tx,
            started: Some(started_tx),
            notifications: logs_tx,
        };
        let request = conn.request("tools/call", Value::Object(params), opts);
        tokio::pin!(request);
        let mut started_rx = Some(started_rx);
        let result = loop {
            tokio::select! {
                biased;
                r = &mut request => break r,
                id = async { match started_rx.as_mut() { Some(rx) => rx.await.ok(), None => std::future::pending().await } } => {
                    started_rx = None;
                    if let Some(id) = id {
                        fwd.upstream_request_id = Some(id);
                        lock(&slot.pending).insert(id, PendingCall {
                            registration_id: call.registration.id.clone(),
                            session: call.session.clone(),
                            downstream_id: call.downstream_id.clone(),
                            epoch: conn.epoch(),
                            notify: call.notify.clone(),
                        });
                    }
                }
                l = async { match logs_rx.as_mut() { Some(rx) => rx.recv().await, None => std::future::pending().await } } => {
                    match l {
                        Some(l) => forward_log(l),
                        None => logs_rx = None,
                    }
                }
                p = async { match progress_rx.as_mut() { Some(rx) => rx.recv().await, None => std::future::pending().await } } => {
                    match (p, &call.notify) {
                        (Some(p), Some(n)) => {
                            let msg = crate::mcp::jsonrpc::notification("notifications/progress", Some(p));
                            let _ = n.try_send(msg);
                        }
                        _ => progress_rx = None,
                    }
                }
            }
        };
        // Logs and progress sent before the response are still delivered, and before the reply.
        if let Some(rx) = logs_rx.as_mut() {
            while let Ok(l) = rx.try_recv() {
                forward_log(l);
            }
        }
        if let (Some(rx), Some(n)) = (progress_rx.as_mut(), &call.notify) {
            while let Ok(p) = rx.try_recv() {
                let msg = crate::mcp::jsonrpc::notification("notifications/progress", Some(p));
                let _ = n.try_send(msg);
            }
        }
        if let Some(id) = fwd.upstream_request_id {
            lock(&slot.pending).remove(&id);
        }
        fwd.outcome = match result {
            Ok(resp) => {
                slot.crashes.store(0, Ordering::Relaxed);
                fwd.upstream_request_id = Some(resp.upstream_id);
                match resp.outcome {
                    Ok(v) => ForwardOutcome::Result(v),
                    Err(e) => ForwardOutcome::RpcError {
                        code: e.get("code").and_then(Value::as_i64).unwrap_or(-32603),
                        message: e
                            .get("message")
                            .and_then(Value::as_str)
                            .unwrap_or("upstream error")
                            .to_string(),
                    },
                }
            }
            Err(UpstreamError::Cancelled) => ForwardOutcome::Cancelled,
            Err(UpstreamError::Timeout(d)) => ForwardOutcome::Timeout(d),
            Err(e) => ForwardOutcome::Failed(e.to_string()),
        };
        fwd
    }

    /// Forwards one non-tool request (`resources/*`, `prompts/*`, `completion/complete`) to an
    /// upstream on the registration's connection: same slot, permits, lease `_meta` and timeout
    /// as [`Pool::forward`]; no progress or log routing. `Ok(Ok(result))`, `Ok(Err(error
    /// object))` as the upstream sent it, or `Err(why)` when the upstream could not answer.
    pub async fn forward_request(
        &self,
        registration: &Arc<RegistrationState>,
        upstream: &str,
        method: &str,
        params: Map<String, Value>,
        cancel: CancellationToken,
    ) -> Result<Result<Value, Value>, String> {
        let in_use = self
            .acquire(upstream, &registration.id, &cancel)
            .await
            .map_err(|why| why.unwrap_or_else(|| "cancelled".into()))?;
        let (slot, conn) = (&in_use.slot, &in_use.conn);
        let mut params = params;
        upstream_meta(&mut params, registration, slot);
        let opts = RequestOptions {
            timeout: Some(Duration::from_secs(slot.spec.config.call_timeout_s.max(1))),
            cancel,
            ..RequestOptions::default()
        };
        match conn.request(method, Value::Object(params), opts).await {
            Ok(resp) => {
                slot.crashes.store(0, Ordering::Relaxed);
                Ok(resp.outcome)
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// The config of an upstream (for exposed names).
    pub fn upstream_config(&self, id: &str) -> Option<&UpstreamConfig> {
        self.inner.upstreams.get(id).map(|u| &u.spec.config)
    }

    /// Releases what a registration holds: its lease on shared connections
    /// (`notifications/io.gatehouse/lease_released`), its own connections (closed). Call it
    /// after the registration's calls were cancelled. Each step is bounded; a slot whose cleanup
    /// fails or times out is closed and removed from the pool.
    pub async fn release_registration(&self, registration_id: &str) {
        lock(&self.inner.client_requests).retain(|_, r| r.registration_id != registration_id);
        for up in self.inner.upstreams.values() {
            let (own, shared) = {
                let mut slots = lock(&up.slots);
                (
                    slots.per_registration.remove(registration_id),
                    slots.shared.clone(),
                )
            };
            if let Some(slot) = own {
                slot.forget_registration(registration_id);
                let _ = tokio::time::timeout(RELEASE_TIMEOUT, slot.close("registration released"))
                    .await;
                slot.stop.cancel();
            }
            let Some(slot) = shared else { continue };
            slot.forget_registration(registration_id);
            let lease = lock(&slot.leases).remove(registration_id);
            let Some(lease) = lease else { continue };
            let conn = lock(&slot.current).clone();
            let Some(conn) = conn.filter(|c| !c.is_closed()) else {
                continue;
            };
            let sent = tokio::time::timeout(
                RELEASE_TIMEOUT,
                conn.notify(LEASE_RELEASED_METHOD, json!({ "lease": lease })),
            )
            .await;
            match sent {
                Ok(Ok(())) => {
                    tracing::debug!(upstream = %up.spec.id, registration = %registration_id, "lease released")
                }
                Ok(Err(e)) => {
                    tracing::warn!(upstream = %up.spec.id, error = %e, "lease release failed: connection leaves the pool");
                    self.evict_shared(up, &slot, "lease release failed").await;
                }
                Err(_) => {
                    tracing::warn!(upstream = %up.spec.id, "lease release timed out: connection leaves the pool");
                    self.evict_shared(up, &slot, "lease release timed out")
                        .await;
                }
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

    /// Passes a client's response to a server → client request back upstream. Returns whether
    /// the id was one the gateway minted for this registration and session.
    pub fn client_response(
        &self,
        registration_id: &str,
        session_id: &str,
        id: &Value,
        body: &Value,
    ) -> bool {
        let Some(key) = id.as_str() else { return false };
        let found = {
            let mut map = lock(&self.inner.client_requests);
            match map.get(key) {
                Some(r) if r.registration_id == registration_id && r.session_id == session_id => {
                    map.remove(key)
                }
                _ => None,
            }
        };
        let Some(req) = found else { return false };
        let outcome = match (body.get("result"), body.get("error")) {
            (Some(r), _) => Ok(r.clone()),
            (None, Some(e)) => Err(e.clone()),
            (None, None) => {
                Err(json!({"code": REFUSED, "message": "client sent an empty response"}))
            }
        };
        self.inner.tasks.spawn(async move {
            if let Err(e) = req.conn.respond(req.upstream_request_id, outcome).await {
                tracing::debug!(error = %e, "could not pass the client's response upstream");
            }
        });
        true
    }

    /// Each upstream's live connections (admin API `/v1/upstreams` and metrics).
    pub fn status(&self) -> Vec<UpstreamInfo> {
        self.inner
            .upstreams
            .values()
            .map(|up| {
                let effective = lock(&up.slots).effective;
                let mut restarts = 0;
                let mut connections = Vec::new();
                for slot in up.all_slots() {
                    let epoch = slot.epoch.load(Ordering::Acquire);
                    restarts += epoch.saturating_sub(1);
                    let live = lock(&slot.current)
                        .as_ref()
                        .filter(|c| !c.is_closed())
                        .cloned();
                    if let Some(c) = live {
                        let leases = lock(&slot.leases).len();
                        connections.push(ConnectionInfo {
                            epoch: c.epoch(),
                            pid: c.pid(),
                            in_flight: slot.in_flight.load(Ordering::Acquire),
                            registrations: leases
                                .max(usize::from(!slot.leased.load(Ordering::Acquire))),
                        });
                    }
                }
                UpstreamInfo {
                    id: up.spec.id.clone(),
                    effective_sharing: effective,
                    restarts,
                    connections,
                }
            })
            .collect()
    }

    /// Live upstream processes (pids) — for tests and diagnostics.
    pub fn pids(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for up in self.inner.upstreams.values() {
            for slot in up.all_slots() {
                if let Some(c) = lock(&slot.current).as_ref().filter(|c| !c.is_closed()) {
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
        for up in self.inner.upstreams.values() {
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

    fn start_reaper(&self) {
        if self.inner.reaper_started.swap(true, Ordering::SeqCst) {
            return;
        }
        let Some(min_idle) = self
            .inner
            .upstreams
            .values()
            .map(|u| u.spec.config.idle_timeout_s)
            .min()
        else {
            return;
        };
        let tick = Duration::from_millis((min_idle.max(1) * 1000 / 4).clamp(250, 30_000));
        let weak = Arc::downgrade(&self.inner);
        let stop = self.inner.stop.clone();
        self.inner.tasks.spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(tick) => {}
                }
                let Some(inner) = weak.upgrade() else { return };
                Pool { inner }.evict_idle(Instant::now()).await;
            }
        });
    }

    /// Closes connections idle since before `now - idle_timeout`, skipping any with a call in
    /// flight or an open lease. Returns how many were closed.
    pub async fn evict_idle(&self, now: Instant) -> usize {
        let mut n = 0;
        for up in self.inner.upstreams.values() {
            let idle = Duration::from_secs(up.spec.config.idle_timeout_s);
            for slot in up.all_slots() {
                if slot.evict_if_idle(now, idle).await {
                    n += 1;
                }
            }
        }
        n
    }
}

impl Upstream {
    fn all_slots(&self) -> Vec<Arc<Slot>> {
        let s = lock(&self.slots);
        s.per_registration
            .values()
            .cloned()
            .chain(s.shared.clone())
            .collect()
    }
}

/// What one forwarded request holds while it runs: its slot (marked busy), a permit on the
/// slot and the slot's live connection.
struct InUse {
    slot: Arc<Slot>,
    conn: Connection,
    _permit: tokio::sync::OwnedSemaphorePermit,
    _busy: Busy,
}

impl Pool {
    /// The slot serving `registration_id` on `upstream`, a permit on it and its connection
    /// (spawned if needed) — each step abandoned when `cancel` fires: `Err(None)` then,
    /// `Err(Some(why))` when the upstream cannot serve.
    async fn acquire(
        &self,
        upstream: &str,
        registration_id: &str,
        cancel: &CancellationToken,
    ) -> Result<InUse, Option<String>> {
        let slot = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(None),
            s = self.slot_for(upstream, registration_id) => s.map_err(Some)?,
        };
        let busy = Busy::new(&slot);
        let permit = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(None),
            p = slot.permits.clone().acquire_owned() => {
                p.map_err(|_| Some("upstream is shutting down".to_string()))?
            }
        };
        let conn = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(None),
            c = slot.connection() => c.map_err(|e| Some(e.to_string()))?,
        };
        Ok(InUse {
            slot,
            conn,
            _permit: permit,
            _busy: busy,
        })
    }
}

/// Counts a call in flight on a slot and stamps its last use when it ends.
struct Busy(Arc<Slot>);

impl Busy {
    fn new(slot: &Arc<Slot>) -> Self {
        slot.in_flight.fetch_add(1, Ordering::SeqCst);
        Busy(slot.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *lock(&self.0.last_used) = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Slot {
    fn audit(&self) -> Option<Audit> {
        self.pool.upgrade().map(|p| p.audit.clone())
    }

    fn record(&self, event: &str, epoch: u64, pid: Option<u32>, reason: Option<String>) {
        if let Some(a) = self.audit() {
            let mut r = Record::event(event);
            r.upstream = Some(self.spec.id.clone());
            r.epoch = Some(epoch);
            r.pid = pid;
            r.reason = reason;
            a.record_detached(r);
        }
    }

    /// The live connection, (re)spawning it with a new epoch when needed.
    async fn connection(&self) -> Result<Connection, UpstreamError> {
        let mut guard = self.conn.lock().await;
        if let Some(c) = guard.as_ref().filter(|c| !c.is_closed()) {
            return Ok(c.clone());
        }
        let wait = backoff(self.crashes.load(Ordering::Relaxed));
        if !wait.is_zero() {
            tracing::info!(upstream = %self.spec.id, ?wait, "respawn backoff after repeated failures");
            tokio::time::sleep(wait).await;
        }
        let epoch = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        let mut opts = ConnectOptions::new(self.spec.id.clone(), self.spec.transport.clone());
        opts.epoch = epoch;
        opts.ids = self.ids.clone();
        opts.request_timeout = Duration::from_secs(self.spec.config.call_timeout_s.max(1));
        match Connection::connect(opts, self.events_tx.clone()).await {
            Ok(c) => {
                tracing::info!(upstream = %self.spec.id, epoch, pid = ?c.pid(), lease = c.supports_lease(), "upstream connected");
                self.record("upstream_spawned", epoch, c.pid(), None);
                *guard = Some(c.clone());
                *lock(&self.current) = Some(c.clone());
                *lock(&self.last_used) = Instant::now();
                Ok(c)
            }
            Err(e) => {
                self.count_crash(epoch);
                Err(e)
            }
        }
    }

    /// Counts one failure of `epoch` towards the respawn backoff (at most once per epoch).
    fn count_crash(&self, epoch: u64) {
        if self.crash_epoch.swap(epoch, Ordering::SeqCst) != epoch {
            self.crashes.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn lease_for(&self, registration_id: &str) -> String {
        lock(&self.leases)
            .entry(registration_id.to_string())
            .or_insert_with(|| format!("lease-{}", random_b64(16)))
            .clone()
    }

    fn forget_registration(&self, registration_id: &str) {
        lock(&self.pending).retain(|_, p| p.registration_id != registration_id);
    }

    /// Tears the current connection down (graceful, bounded by the transport's grace periods).
    async fn close(&self, why: &str) {
        let conn = {
            let mut guard = self.conn.lock().await;
            lock(&self.current).take();
            guard.take()
        };
        self.close_conn(conn, why).await;
    }

    async fn close_conn(&self, conn: Option<Connection>, why: &str) {
        let Some(conn) = conn else { return };
        if conn.is_closed() {
            conn.close().await;
            return;
        }
        self.killed_epoch.store(conn.epoch(), Ordering::SeqCst);
        tracing::info!(upstream = %self.spec.id, epoch = conn.epoch(), pid = ?conn.pid(), why, "closing upstream connection");
        let pid = conn.pid();
        conn.close().await;
        self.record("upstream_killed", conn.epoch(), pid, Some(why.to_string()));
    }

    async fn evict_if_idle(&self, now: Instant, idle: Duration) -> bool {
        let Ok(mut guard) = self.conn.try_lock() else {
            return false; // connecting or closing right now
        };
        let live = guard.as_ref().is_some_and(|c| !c.is_closed());
        let last = *lock(&self.last_used);
        if !live
            || self.in_flight.load(Ordering::SeqCst) > 0
            || !lock(&self.leases).is_empty()
            || now.saturating_duration_since(last) < idle
        {
            return false;
        }
        let conn = guard.take();
        lock(&self.current).take();
        drop(guard);
        self.close_conn(conn, "idle timeout").await;
        true
    }

    async fn on_event(&self, ev: UpstreamEvent) {
        match ev {
            UpstreamEvent::Closed { epoch, reason } => {
                let pid = {
                    let cur = lock(&self.current);
                    cur.as_ref()
                        .filter(|c| c.epoch() == epoch)
                        .and_then(Connection::pid)
                };
                lock(&self.pending).retain(|_, p| p.epoch != epoch);
                if self.killed_epoch.load(Ordering::SeqCst) != epoch {
                    self.count_crash(epoch);
                    tracing::warn!(upstream = %self.spec.id, epoch, ?pid, %reason, "upstream connection died; the next call respawns it");
                    self.record("upstream_exited", epoch, pid, Some(reason));
                }
            }
            UpstreamEvent::Notification { method, epoch, .. } => {
                if method == "notifications/tools/list_changed" {
                    self.tools_changed(epoch).await;
                } else {
                    tracing::debug!(upstream = %self.spec.id, method, "upstream notification not routed");
                }
            }
            UpstreamEvent::Progress { .. } => {}
            UpstreamEvent::Request {
                epoch,
                id,
                method,
                params,
                related_request,
            } => {
                self.client_request(epoch, id, method, params, related_request)
                    .await
            }
        }
    }

    async fn tools_changed(&self, epoch: u64) {
        let Some(pool) = self.pool.upgrade() else {
            return;
        };
        let conn = lock(&self.current).clone().filter(|c| c.epoch() == epoch);
        if let (Some(conn), Some(up)) = (conn, pool.upstreams.get(&self.spec.id)) {
            match conn.list_tools().await {
                Ok(tools) => {
                    let supports_lease = conn.supports_lease();
                    let capabilities = conn
                        .initialize_result()
                        .get("capabilities")
                        .cloned()
                        .unwrap_or_else(|| json!({}));
                    *up.catalog.lock().await = Some(Arc::new(Catalog {
                        tools,
                        supports_lease,
                        capabilities,
                    }));
                    tracing::info!(upstream = %self.spec.id, "tool catalog refreshed");
                }
                Err(e) => {
                    tracing::warn!(upstream = %self.spec.id, error = %e, "tool catalog refresh failed")
                }
            }
        }
        let Some(gw) = pool.gateway.get().and_then(WeakGateway::upgrade) else {
            return;
        };
        let msg = crate::mcp::jsonrpc::notification("notifications/tools/list_changed", None);
        for reg in gw.registry().all() {
            if !reg
                .tools
                .iter()
                .any(|t| t.upstream() == Some(self.spec.id.as_str()))
            {
                continue;
            }
            for s in gw.sessions().sessions_of(&reg.id) {
                crate::endpoint::sse::deliver(&gw, &s, msg.clone()).await;
            }
        }
    }

    /// Routes a server → client request to the one session it belongs to, or refuses it.
    ///
    /// The request must be attributable to one pending call of a session. It goes on that
    /// call's own sink first (Streamable HTTP: the POST's SSE response stream, as MCP asks for
    /// requests related to a client request), else on the session's server-to-client stream
    /// (legacy SSE stream / Streamable HTTP GET stream). If neither takes it, or the call has no
    /// session (stateless 2026-07-28: MRTR is not implemented), the upstream gets an error at
    /// once: never a silent drop that leaves it waiting.
    async fn client_request(
        &self,
        epoch: u64,
        id: Value,
        method: String,
        params: Option<Value>,
        related: Option<u64>,
    ) {
        let Some(conn) = lock(&self.current).clone().filter(|c| c.epoch() == epoch) else {
            return;
        };
        let call = related.and_then(|r| lock(&self.pending).get(&r).cloned());
        let gw = self
            .pool
            .upgrade()
            .and_then(|p| p.gateway.get().and_then(WeakGateway::upgrade));
        let refuse = |why: &str| {
            tracing::warn!(upstream = %self.spec.id, method, why, "server → client request refused");
            json!({"code": REFUSED, "message": format!("gatehouse: {method} refused: {why}")})
        };
        let (call, session, gw, pool) = match (call, gw, self.pool.upgrade()) {
            (Some(c), Some(gw), Some(pool)) => match c.session.clone() {
                Some(s) if !s.cancel.is_cancelled() => (c, s, gw, pool),
                Some(_) => {
                    let err = refuse("the client session is closed");
                    let _ = conn.respond(id, Err(err)).await;
                    return;
                }
                None => {
                    let err = refuse(
                        "the call has no client session (stateless 2026-07-28 requests cannot take server requests: MRTR is not implemented)",
                    );
                    let _ = conn.respond(id, Err(err)).await;
                    return;
                }
            },
            _ => {
                let err = refuse("not attributable to one client session");
                let _ = conn.respond(id, Err(err)).await;
                return;
            }
        };
        let n = pool.next_client_request.fetch_add(1, Ordering::Relaxed);
        let down_id = format!("gatehouse-{}-{n}", self.spec.id);
        lock(&pool.client_requests).insert(
            down_id.clone(),
            ClientRequest {
                registration_id: call.registration_id.clone(),
                session_id: session.id.clone(),
                conn: conn.clone(),
                upstream_request_id: id.clone(),
            },
        );
        let mut msg = Map::new();
        msg.insert("jsonrpc".into(), json!("2.0"));
        msg.insert("id".into(), json!(down_id));
        msg.insert("method".into(), json!(method));
        if let Some(p) = params {
            msg.insert("params".into(), p);
        }
        let msg = Value::Object(msg);
        let on_call_stream = match &call.notify {
            Some(tx) => tx
                .send_timeout(msg.clone(), CLIENT_REQUEST_SEND_TIMEOUT)
                .await
                .is_ok(),
            None => false,
        };
        // (Legacy SSE: the call's sink *is* the session stream; the fallback then fails alike.)
        let delivered = on_call_stream
            || (session.outbound().is_some()
                && crate::endpoint::sse::deliver(&gw, &session, msg).await);
        if delivered {
            return;
        }
        lock(&pool.client_requests).remove(&down_id);
        let err = refuse("the client has no open stream to receive it");
        let _ = conn.respond(id, Err(err)).await;
    }
}

async fn run_events(
    slot: Weak<Slot>,
    mut rx: mpsc::UnboundedReceiver<UpstreamEvent>,
    stop: CancellationToken,
) {
    loop {
        let ev = tokio::select! {
            () = stop.cancelled() => return,
            ev = rx.recv() => match ev {
                Some(ev) => ev,
                None => return,
            },
        };
        let Some(slot) = slot.upgrade() else { return };
        slot.on_event(ev).await;
    }
}

// Unit tests only (never built into the daemon): an unwrap that fails is the test failing.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        assert_eq!(backoff(0), Duration::ZERO);
        assert_eq!(backoff(1), Duration::ZERO);
        assert_eq!(backoff(2), Duration::from_millis(100));
        assert_eq!(backoff(3), Duration::from_millis(200));
        assert_eq!(backoff(100), Duration::from_secs(5));
    }

    #[test]
    fn header_values_come_from_the_environment() {
        std::env::set_var("GATEHOUSE_TEST_HEADER_TOKEN", "s3cret");
        assert_eq!(
            resolve_env("u", "Bearer ${GATEHOUSE_TEST_HEADER_TOKEN}").unwrap(),
            "Bearer s3cret"
        );
        assert!(resolve_env("u", "${GATEHOUSE_TEST_SURELY_UNSET_VAR}").is_err());
        assert!(resolve_env("u", "${UNTERMINATED").is_err());
        assert_eq!(resolve_env("u", "plain").unwrap(), "plain");
    }
}
