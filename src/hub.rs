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
use crate::metrics::Metrics;
use crate::mrtr::{Held, HeldCalls};
use crate::protocol::{jsonrpc, Notice};
use crate::registration::pins::Drift;
use crate::registration::{RegistrationState, Registry};
use crate::session::{Session, SessionTable};
use crate::store::Store;
use crate::tasks::TaskTable;
use crate::upstream::{Downstream, Pool, STATELESS_SESSION};

/// The client-response body that refuses a server → client request on the gateway's behalf.
pub(crate) fn refusal_body(why: &str) -> Value {
    crate::protocol::RpcError::internal(format!("gatehouse: {why}")).to_body()
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
    /// MCP tasks, owned per registration (`tasks`).
    tasks: TaskTable,
    /// The data listener's bound address, once the server started (a fallback base URL).
    local_addr: std::sync::Mutex<Option<std::net::SocketAddr>>,
    /// Where registrations are kept (written through; requests are served from `registry`).
    store: Arc<dyn Store>,
    /// A cluster node's freshness fence (`fence`); open and off outside a cluster.
    fence: crate::fence::Fence,
    /// OpenTelemetry traces; `None` (off) unless an endpoint is configured.
    telemetry: Option<Arc<crate::telemetry::Telemetry>>,
    /// The config's policy rules (issue 49), replaced by a reload.
    policy: crate::policy::Live,
    /// Calls held for approval (issue 49).
    approvals: crate::approval::Approvals,
    /// `[policy.approval_webhook]`, when configured (and its secret could be read).
    webhook: Option<crate::approval::webhook::Webhook>,
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
        // Validated with the config (`Config::validate`): an error here cannot happen.
        let policy = crate::policy::Live::new(&config.policy).unwrap_or_default();
        let approvals = crate::approval::Approvals::new(
            config.policy.max_pending_approvals,
            config.policy.max_pending_approvals_per_registration,
        );
        let webhook = config.policy.approval_webhook.as_ref().and_then(|w| {
            crate::approval::webhook::Webhook::new(w, config.node_id.as_deref())
                .map_err(|e| tracing::error!(error = %e, "approval webhook off"))
                .ok()
        });
        let hub = Arc::new(Hub {
            policy,
            approvals,
            webhook,
            refusals: crate::refusals::Refusals::new(audit.clone(), fold_every),
            sessions: SessionTable::new(config.sessions.clone()).on_node(config.node_id.as_deref()),
            config: Arc::new(config),
            registry: Registry::default(),
            pool,
            audit,
            metrics: Metrics::new(),
            held: HeldCalls::default(),
            listeners: Listeners::default(),
            tasks: TaskTable::default(),
            local_addr: std::sync::Mutex::new(None),
            store,
            fence: crate::fence::Fence::default(),
            telemetry,
        });
        let weak: std::sync::Weak<dyn Downstream> = Arc::downgrade(&hub) as _;
        hub.pool.attach(weak);
        if let Some(t) = &hub.telemetry {
            hub.pool.trace_with(t.clone());
        }
        hub
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn fence(&self) -> &crate::fence::Fence {
        &self.fence
    }

    /// The config's policy rules as they are now (issue 49).
    pub fn policy(&self) -> &crate::policy::Live {
        &self.policy
    }

    /// Calls held for approval (issue 49).
    pub fn approvals(&self) -> &crate::approval::Approvals {
        &self.approvals
    }

    /// `[policy.approval_webhook]`, if configured.
    pub fn webhook(&self) -> Option<&crate::approval::webhook::Webhook> {
        self.webhook.as_ref()
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

    pub fn tasks(&self) -> &TaskTable {
        &self.tasks
    }

    /// A server → client request related to a task (`params._meta` names the upstream's
    /// task id) names the gateway's id instead: the registration's task with that upstream
    /// id; with none, the key is dropped (an upstream id never reaches a client).
    pub(crate) fn related_task_to_client(&self, registration_id: &str, msg: &mut Value) {
        let Some(meta) = msg
            .get_mut("params")
            .and_then(|p| p.get_mut(crate::protocol::meta::META))
            .and_then(Value::as_object_mut)
        else {
            return;
        };
        let Some(related) = meta.get(crate::protocol::meta::RELATED_TASK) else {
            return;
        };
        let ours = related
            .get("taskId")
            .and_then(Value::as_str)
            .and_then(|up| self.tasks.by_upstream_id_of(registration_id, up))
            .filter(|t| !t.spec.internal);
        match ours {
            Some(t) => {
                meta.insert(
                    crate::protocol::meta::RELATED_TASK.into(),
                    serde_json::json!({"taskId": t.id}),
                );
            }
            None => {
                meta.remove(crate::protocol::meta::RELATED_TASK);
            }
        }
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

impl Hub {
    /// Delivers `msg` (a notification of kind `notice`) to a registration's listen streams
    /// and sessions: a log only to the sessions whose level it reaches, a resource update only
    /// to those subscribed to its URI. How many it was queued on.
    async fn to_registration(&self, registration_id: &str, notice: Notice, msg: &Value) -> usize {
        let param = |key: &str| {
            msg.get("params")
                .and_then(|p| p.get(key))
                .and_then(Value::as_str)
                .unwrap_or("")
        };
        let level = (notice == Notice::Log).then(|| param("level"));
        let updated = (notice == Notice::ResourcesUpdated).then(|| param("uri"));
        // Open listen streams take list changes and resource updates (never logs).
        let mut n = self.listeners.deliver(registration_id, msg);
        for s in self.sessions.sessions_of(registration_id) {
            if level.is_some_and(|l| !s.wants_log(l)) {
                continue;
            }
            if updated.is_some_and(|u| !s.is_subscribed(u)) {
                continue;
            }
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
                    rec.rare_mut().pin_digest = Some(c.pinned.as_str().into());
                    let (new, reason) = match &c.now {
                        None => (Some(c.pinned.as_str()), "restored: the upstream's definition is the pinned one again"),
                        Some(Drift::Removed) => (None, "removed by the upstream: the tool left the registration's list"),
                        Some(Drift::Refused { digest }) => (Some(digest.as_str()), "changed: calls are refused (on_tool_change = refuse)"),
                        Some(Drift::Followed { digest, .. }) => (Some(digest.as_str()), "changed: the registration follows the new definition (on_tool_change = follow)"),
                    };
                    rec.rare_mut().new_digest = new.map(Into::into);
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

    fn notify<'a>(
        &'a self,
        upstream_id: &'a str,
        route: crate::protocol::Route,
        msg: Value,
    ) -> BoxFuture<'a, usize> {
        use crate::protocol::Route;
        Box::pin(async move {
            match route {
                Route::Registration(id, notice) => self.to_registration(&id, notice, &msg).await,
                Route::Grantees(notice) => {
                    let mut n = 0;
                    for reg in self.registry.all() {
                        let granted = reg.grants.iter().any(|g| g.upstream() == Some(upstream_id));
                        if granted {
                            n += self.to_registration(&reg.id, notice, &msg).await;
                        }
                    }
                    n
                }
                // The pool handles a catalog refresh itself; a refused one is counted there.
                Route::RefreshCatalog | Route::Task | Route::Refused => 0,
            }
        })
    }

    fn task_inputs(
        &self,
        upstream_id: &str,
        epoch: u64,
        upstream_task_id: &str,
    ) -> Option<(String, tokio::sync::mpsc::Sender<Value>)> {
        let task = self
            .tasks
            .by_upstream(upstream_id, epoch, upstream_task_id)?;
        let sink = task.input_sink()?;
        Some((task.registration.id.clone(), sink))
    }

    fn task_progress<'a>(
        &'a self,
        upstream_id: &'a str,
        _epoch: u64,
        params: Value,
    ) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let mut params = params;
            let task = params
                .get(crate::protocol::meta::PROGRESS_TOKEN)
                .and_then(Value::as_str)
                .and_then(|t| self.tasks.by_progress(upstream_id, t))
                // A settled task's progress still reaches the plain call it ran for while that
                // call has not answered (it waits for the events read before the task's final
                // status: `methods::tasks::run_for_call`); after that its sink is closed.
                .filter(|t| {
                    !t.is_settled()
                        || matches!(&t.spec.progress, Some(p) if matches!(p.to, crate::tasks::ProgressTo::Call(_)))
                });
            let Some(task) = task else {
                tracing::debug!(upstream = %upstream_id, "progress for a request that is no longer pending (no live task): dropped");
                return;
            };
            let Some(p) = &task.spec.progress else { return };
            params[crate::protocol::meta::PROGRESS_TOKEN] = p.client_token.clone();
            let msg = jsonrpc::notification("notifications/progress", Some(params));
            match &p.to {
                crate::tasks::ProgressTo::Session(s) => {
                    if let Some(s) = s.upgrade().filter(|s| !s.cancel.is_cancelled()) {
                        self.deliver(&s, msg).await;
                    }
                }
                crate::tasks::ProgressTo::Call(sink) if !sink.is_closed() => {
                    // Bounded: a call that does not take it in time loses this one.
                    let _ = sink
                        .send_timeout(msg, std::time::Duration::from_millis(100))
                        .await;
                }
                // The call answered: its stream is gone.
                crate::tasks::ProgressTo::Call(_) => {}
            }
        })
    }

    fn task_status<'a>(
        &'a self,
        upstream_id: &'a str,
        epoch: u64,
        params: Value,
    ) -> BoxFuture<'a, usize> {
        Box::pin(async move {
            let Some(task) = params
                .get("taskId")
                .and_then(Value::as_str)
                .and_then(|up| self.tasks.by_upstream(upstream_id, epoch, up))
            else {
                tracing::debug!(upstream = %upstream_id, "task status for a task the gateway does not hold: dropped");
                return 0;
            };
            // The table's view (the upstream's status unless the task is settled), our id in it.
            task.observe(params);
            task.wake.notify_one();
            if task.spec.internal || task.spec.modern.is_some() {
                // Run for a client that asked for no task: it is shown none. A 2026-form
                // task's client polls (its pushes go on `subscriptions/listen` streams only).
                return 1;
            }
            let msg = jsonrpc::notification("notifications/tasks/status", Some(task.view()));
            let mut n = 0;
            // Sessions of the revision that has tasks (2025-11-25) only.
            for s in self
                .sessions
                .sessions_of(&task.registration.id)
                .into_iter()
                .filter(|s| s.protocol_version() == Some("2025-11-25"))
            {
                if self.sessions.deliver(&s, msg.clone()).await {
                    n += 1;
                }
            }
            n
        })
    }

    fn deliver<'a>(&'a self, session: &'a Session, msg: Value) -> BoxFuture<'a, bool> {
        let mut msg = msg;
        self.related_task_to_client(&session.registration.id, &mut msg);
        Box::pin(self.sessions.deliver(session, msg))
    }

    fn registration(&self, registration_id: &str) -> Option<Arc<RegistrationState>> {
        self.registry.get(registration_id)
    }

    fn sessions_of(&self, registration_id: &str) -> Vec<Arc<Session>> {
        self.sessions.sessions_of(registration_id)
    }
}
