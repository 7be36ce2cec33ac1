//! The shared handles every request is served with: config, registrations, sessions, the
//! upstream pool, the audit writer and the metrics. `Gateway` builds one and passes it down;
//! endpoints, dispatch and the governed call take what they need from it and never see the
//! `Gateway` (which alone starts and stops the server).

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::audit::Audit;
use crate::config::Config;
use crate::listen::Listeners;
use crate::mcp::jsonrpc;
use crate::metrics::Metrics;
use crate::mrtr::{Held, HeldCalls};
use crate::pins::Drift;
use crate::registry::{RegistrationState, Registry};
use crate::session::{Session, SessionTable};
use crate::store::Store;
use crate::upstream::{Downstream, Pool, STATELESS_SESSION};

/// The client-response body that refuses a server → client request on the gateway's behalf.
pub(crate) fn refusal_body(why: &str) -> Value {
    serde_json::json!({"error": {"code": -32603, "message": format!("gatehouse: {why}")}})
}

pub struct Hub {
    config: Arc<Config>,
    registry: Registry,
    sessions: SessionTable,
    pool: Pool,
    audit: Audit,
    metrics: Metrics,
    /// Refused requests: series, log lines, `auth_failed` records.
    refusals: crate::refusals::Refusals,
    /// Stateless calls waiting for the client's MRTR retry.
    held: HeldCalls,
    /// Open `subscriptions/listen` streams (2026-07-28).
    listeners: Listeners,
    /// The data listener's bound address, once the server started (a fallback base URL).
    local_addr: std::sync::Mutex<Option<std::net::SocketAddr>>,
    /// Where registrations are kept (written through; requests are served from `registry`).
    store: Arc<dyn Store>,
    /// OpenTelemetry traces; `None` (off) unless an endpoint is configured.
    telemetry: Option<Arc<crate::telemetry::Telemetry>>,
}

impl Hub {
    /// The hub, wired to its pool: what the pool cannot handle itself (tools changed, a
    /// server → client request to deliver) comes back here.
    pub fn new(
        config: Config,
        audit: Audit,
        pool: Pool,
        store: Arc<dyn Store>,
        telemetry: Option<Arc<crate::telemetry::Telemetry>>,
    ) -> Arc<Hub> {
        // The coarse deadlines' ticker (parked until a call waits): started with the gateway.
        crate::sync::coarse::start();
        let fold_every = std::time::Duration::from_secs(config.audit.auth_failed_interval_s);
        let hub = Arc::new(Hub {
            refusals: crate::refusals::Refusals::new(audit.clone(), fold_every),
            sessions: SessionTable::new(config.sessions.clone()),
            config: Arc::new(config),
            registry: Registry::default(),
            pool,
            audit,
            metrics: Metrics::new(),
            held: HeldCalls::default(),
            listeners: Listeners::default(),
            local_addr: std::sync::Mutex::new(None),
            store,
            telemetry,
        });
        let weak: std::sync::Weak<dyn Downstream> = Arc::downgrade(&hub) as _;
        hub.pool.attach(weak);
        hub
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The tracer, if tracing is on.
    pub fn telemetry(&self) -> Option<&Arc<crate::telemetry::Telemetry>> {
        self.telemetry.as_ref()
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn sessions(&self) -> &SessionTable {
        &self.sessions
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn audit(&self) -> &Audit {
        &self.audit
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn refusals(&self) -> &crate::refusals::Refusals {
        &self.refusals
    }

    /// Observes a refused request (a response of status ≥ 400 on either listener): the
    /// metric, and `refusals::Refusals::observe` with its reason (the response's mark, else
    /// what its status stands for).
    pub fn refused(
        &self,
        listener: crate::refusals::Listener,
        status: axum::http::StatusCode,
        mark: Option<&crate::refusals::Refused>,
        peer: Option<std::net::SocketAddr>,
    ) {
        let fallback;
        let refused = match mark {
            Some(m) => m,
            None => {
                fallback =
                    crate::refusals::Refused::new(crate::refusals::Reason::of_status(status));
                &fallback
            }
        };
        self.metrics
            .refused(listener.as_str(), status.as_u16(), refused.reason.as_str());
        self.refusals.observe(listener, status, refused, peer);
    }

    pub fn listeners(&self) -> &Listeners {
        &self.listeners
    }

    pub fn held(&self) -> &HeldCalls {
        &self.held
    }

    /// Ends held calls that will not be resumed: the server requests they asked are answered
    /// with an error upstream (the server never waits), then each call is cancelled (dropped).
    pub fn drop_held(&self, held: Vec<Held>, why: &str) {
        for h in held {
            for id in &h.asked {
                let err = refusal_body(why);
                self.pool.client_response(
                    &h.registration_id,
                    STATELESS_SESSION,
                    &Value::from(id.as_str()),
                    &err,
                );
            }
        }
    }

    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        *crate::sync::lock(&self.local_addr)
    }

    pub(crate) fn set_local_addr(&self, addr: std::net::SocketAddr) {
        *crate::sync::lock(&self.local_addr) = Some(addr);
    }

    /// Sends `notifications/tools/list_changed` to every session of a registration, each on
    /// its one server-to-client stream. Returns how many sessions got it.
    pub async fn notify_tools_list_changed(&self, registration_id: &str) -> usize {
        let msg = jsonrpc::notification("notifications/tools/list_changed", None);
        let mut n = self.listeners.deliver(registration_id, &msg);
        for s in self.sessions.sessions_of(registration_id) {
            if self.sessions.deliver(&s, msg.clone()).await {
                n += 1;
            }
        }
        n
    }
}

impl Downstream for Hub {
    fn tools_changed<'a>(&'a self, upstream_id: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let regs: Vec<_> = self
                .registry
                .all()
                .into_iter()
                .filter(|r| r.tools.iter().any(|t| t.upstream() == Some(upstream_id)))
                .collect();
            if regs.is_empty() {
                return;
            }
            // The upstream's tools now (its catalog was just refreshed), against each
            // registration's pins (`pins`): only a registration whose list changed is told.
            let grant = [format!("{upstream_id}.*")];
            let current = match self.pool.tools_for_grants(&grant).await {
                Ok(tools) => tools
                    .into_iter()
                    .map(|t| (t.name, t.descriptor))
                    .collect::<crate::sync::HashMap<_, _>>(),
                Err(e) => {
                    tracing::warn!(upstream = %upstream_id, error = %e, "tools changed, but the new list could not be read; registrations keep their surface");
                    return;
                }
            };
            // As in effect now (a reload may have changed it).
            let policy = self
                .pool
                .upstream_config(upstream_id)
                .map(|u| u.on_tool_change)
                .unwrap_or_default();
            for reg in regs {
                let compared = reg.pins.compare(&reg.tools, upstream_id, &current, policy);
                for c in &compared.changes {
                    let mut rec = reg.audit_record("tool_changed");
                    rec.tool = Some(c.tool.as_str().into());
                    rec.upstream = Some(c.upstream.as_str().into());
                    rec.pin_digest = Some(c.pinned.as_str().into());
                    let (new, reason) = match &c.now {
                        None => (Some(c.pinned.as_str()), "restored: the upstream's definition is the pinned one again"),
                        Some(Drift::Removed) => (None, "removed by the upstream: the tool left the registration's list"),
                        Some(Drift::Refused { digest }) => (Some(digest.as_str()), "changed: calls are refused (on_tool_change = refuse)"),
                        Some(Drift::Followed { digest, .. }) => (Some(digest.as_str()), "changed: the registration follows the new definition (on_tool_change = follow)"),
                    };
                    rec.new_digest = new.map(Into::into);
                    rec.reason = Some(reason.into());
                    tracing::warn!(registration = %crate::refusals::shorten(&reg.id), tool = %c.tool, reason, "a granted tool's definition changed upstream");
                    let _ = self.audit.record(rec).await;
                }
                if compared.list_changed {
                    self.notify_tools_list_changed(&reg.id).await;
                }
            }
        })
    }

    fn notify_registration<'a>(
        &'a self,
        registration_id: &'a str,
        msg: Value,
    ) -> BoxFuture<'a, usize> {
        Box::pin(async move {
            let notice = crate::mcp::Notice::of_message(&msg);
            let level = (notice == crate::mcp::Notice::Log).then(|| {
                msg.get("params")
                    .and_then(|p| p.get("level"))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            });
            // A resource update goes to the sessions that subscribed to its URI only.
            let updated = (notice == crate::mcp::Notice::ResourcesUpdated).then(|| {
                msg.get("params")
                    .and_then(|p| p.get("uri"))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            });
            // Open listen streams take list changes and resource updates (never logs).
            let mut n = self.listeners.deliver(registration_id, &msg);
            for s in self.sessions.sessions_of(registration_id) {
                if level.as_deref().is_some_and(|l| !s.wants_log(l)) {
                    continue;
                }
                if updated.as_deref().is_some_and(|u| !s.is_subscribed(u)) {
                    continue;
                }
                if self.sessions.deliver(&s, msg.clone()).await {
                    n += 1;
                }
            }
            n
        })
    }

    fn notify_granted<'a>(&'a self, upstream_id: &'a str, msg: Value) -> BoxFuture<'a, usize> {
        Box::pin(async move {
            let mut n = 0;
            for reg in self.registry.all() {
                let granted = reg
                    .grants
                    .iter()
                    .any(|g| crate::tools::Grant::new(g).upstream() == Some(upstream_id));
                if granted {
                    n += self.notify_registration(&reg.id, msg.clone()).await;
                }
            }
            n
        })
    }

    fn deliver<'a>(&'a self, session: &'a Session, msg: Value) -> BoxFuture<'a, bool> {
        Box::pin(self.sessions.deliver(session, msg))
    }

    fn registration(&self, registration_id: &str) -> Option<Arc<RegistrationState>> {
        self.registry.get(registration_id)
    }

    fn sessions_of(&self, registration_id: &str) -> Vec<Arc<Session>> {
        self.sessions.sessions_of(registration_id)
    }
}
