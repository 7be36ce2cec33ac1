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
    /// Stateless calls waiting for the client's MRTR retry.
    held: HeldCalls,
    /// Open `subscriptions/listen` streams (2026-07-28).
    listeners: Listeners,
    /// The data listener's bound address, once the server started (a fallback base URL).
    local_addr: std::sync::Mutex<Option<std::net::SocketAddr>>,
    /// Where registrations are kept (written through; requests are served from `registry`).
    store: Arc<dyn Store>,
}

impl Hub {
    /// The hub, wired to its pool: what the pool cannot handle itself (tools changed, a
    /// server → client request to deliver) comes back here.
    pub fn new(config: Config, audit: Audit, pool: Pool, store: Arc<dyn Store>) -> Arc<Hub> {
        // The coarse deadlines' ticker (parked until a call waits): started with the gateway.
        crate::sync::coarse::start();
        let hub = Arc::new(Hub {
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
            for reg in self.registry.all() {
                if reg.tools.iter().any(|t| t.upstream() == Some(upstream_id)) {
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
            let level = (msg.get("method").and_then(Value::as_str)
                == Some("notifications/message"))
            .then(|| {
                msg.get("params")
                    .and_then(|p| p.get("level"))
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            });
            // A resource update goes to the sessions that subscribed to its URI only.
            let updated = (msg.get("method").and_then(Value::as_str)
                == Some("notifications/resources/updated"))
            .then(|| {
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
                    .any(|g| g.split_once('.').map(|(up, _)| up) == Some(upstream_id));
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
