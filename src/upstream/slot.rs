//! Slots and the sharing choice. A slot is one logical upstream connection that survives
//! respawns: one [`IdCounter`] (ids never reused), an epoch bumped on every (re)spawn, the
//! respawn backoff, crash accounting, the leases opened on it, and its teardown. Each new
//! epoch's tools are compared with the pins before its first request (`Pool::verify`). `shared` and
//! `leased` upstreams have one slot for everyone; `per_registration` upstreams (and `leased`
//! ones whose server lacks the extension) have one slot per registration.
//!
//! No std lock is held across `.await`: the connect path uses a tokio mutex per slot.

use crate::sync::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::events::{EventReceiver, EventSink};
use super::lease::Leases;
use super::{ConnectOptions, Connection, IdCounter, Transport, UpstreamError};
use crate::audit::{Audit, Record};
use crate::config::{Sharing, UpstreamConfig};
use crate::sync::lock;

/// What never changes about an upstream.
pub(super) struct Spec {
    pub id: String,
    pub config: UpstreamConfig,
    pub transport: Transport,
    /// Call notifications this upstream's connections could not deliver (metrics).
    pub refused: super::NotificationsRefused,
    /// An HTTP upstream's host and port (`server.address`/`.port` of CLIENT spans; never
    /// the URL's path or query); `None` for stdio.
    pub server: Option<(String, u16)>,
    /// The catalog fetch at the upstream's first use, as calls that waited on it link to it
    /// (tracing on).
    pub catalog_work: Mutex<Option<crate::telemetry::PoolWork>>,
    /// Why the last connection attempt failed, until one succeeds (`GET /v1/upstreams`).
    pub last_error: Mutex<Option<String>>,
    /// What its requests carry without a registration's own credential: `static` when the
    /// config sets headers (`upstream_auth`).
    pub static_auth: crate::registration::AuthKind,
    /// The resource URIs clients subscribed to on a 2026-07-28 HTTP upstream (asked on its
    /// `subscriptions/listen` stream; survives respawns).
    pub watched: super::subscriptions::Watched,
    /// `[upstreams.oauth]` (issue 47): its authorization server's client, and for
    /// `client_credentials` the gateway's own tokens, which every slot of it shares.
    pub oauth: Option<Arc<super::oauth::OAuthClient>>,
    pub own_tokens: Option<Arc<super::tokens::Tokens>>,
}

impl Spec {
    /// Configured for 2026-07-28 (the stateless era).
    pub fn is_modern(&self) -> bool {
        self.config.protocol.as_deref() == Some(super::MODERN_PROTOCOL_VERSION)
    }

    pub fn new(config: UpstreamConfig, transport: Transport) -> Spec {
        let server = match &transport {
            Transport::Http { url, .. } => reqwest::Url::parse(url).ok().and_then(|u| {
                let port = u.port_or_known_default()?;
                Some((u.host_str()?.to_string(), port))
            }),
            Transport::Stdio { .. } => None,
        };
        let oauth = match (&transport, &config.oauth) {
            (Transport::Http { .. }, Some(o)) => Some(Arc::new(super::oauth::OAuthClient::new(
                &config.id,
                o.clone(),
            ))),
            _ => None,
        };
        let own_tokens = oauth
            .as_ref()
            .filter(|c| c.grant() == crate::config::OAuthGrant::ClientCredentials)
            .map(|c| super::tokens::Tokens::own(c.clone()));
        let static_auth = match (&transport, &oauth) {
            (_, Some(c)) => match c.grant() {
                crate::config::OAuthGrant::ClientCredentials => {
                    crate::registration::AuthKind::ClientCredentials
                }
                crate::config::OAuthGrant::TokenExchange => {
                    crate::registration::AuthKind::TokenExchange
                }
            },
            (Transport::Http { headers, .. }, None) if !headers.is_empty() => {
                crate::registration::AuthKind::Static
            }
            _ => crate::registration::AuthKind::None,
        };
        Spec {
            static_auth,
            id: config.id.clone(),
            config,
            transport,
            refused: Default::default(),
            server,
            catalog_work: Mutex::new(None),
            last_error: Mutex::new(None),
            watched: Default::default(),
            oauth,
            own_tokens,
        }
    }

    /// Where this upstream's requests go, as spans say it.
    pub fn peer(&self) -> crate::telemetry::Peer<'_> {
        match &self.server {
            Some((address, port)) => crate::telemetry::Peer::Tcp {
                address,
                port: *port,
            },
            None => crate::telemetry::Peer::Pipe,
        }
    }
}

/// The sharing in effect once the server is known: `leased` without the lease extension
/// falls back to one connection per registration.
pub(super) fn effective_sharing(spec: &Spec, supports_lease: bool) -> Sharing {
    match spec.config.sharing {
        Sharing::Leased if !supports_lease => {
            tracing::warn!(
                upstream = %spec.id,
                "sharing = \"leased\" but the server did not advertise {} during initialize: falling back to per_registration",
                super::LEASE_CAPABILITY
            );
            Sharing::PerRegistration
        }
        s => s,
    }
}

/// An upstream's slots.
#[derive(Default)]
pub(super) struct Slots {
    /// Sharing in effect once the server is known (None before its first use).
    pub effective: Option<Sharing>,
    pub shared: Option<Arc<Slot>>,
    pub per_registration: HashMap<String, Arc<Slot>>,
}

impl Slots {
    /// The slot serving `registration_id`, if there is one yet.
    pub fn find(&self, registration_id: &str) -> Option<Arc<Slot>> {
        match self.effective {
            Some(Sharing::PerRegistration) | None => {
                self.per_registration.get(registration_id).cloned()
            }
            Some(_) => self.shared.clone(),
        }
    }

    pub fn all(&self) -> Vec<Arc<Slot>> {
        self.per_registration
            .values()
            .cloned()
            .chain(self.shared.clone())
            .collect()
    }
}

/// One logical connection: survives respawns, keeps its id counter and epochs.
pub(super) struct Slot {
    pub spec: Arc<Spec>,
    audit: Audit,
    pub leased: AtomicBool,
    ids: IdCounter,
    pub epoch: AtomicU64,
    /// The connect path (held across the spawn).
    conn: tokio::sync::Mutex<Option<Connection>>,
    /// The live connection, for sync readers (events, eviction).
    current: Mutex<Option<Connection>>,
    events_tx: EventSink,
    /// Consecutive failed spawns or crashes (drives the respawn backoff).
    crashes: AtomicU32,
    /// Epoch the gateway itself tore down last (its `Closed` event is not a crash).
    killed_epoch: AtomicU64,
    /// Last epoch counted in `crashes` (a failed spawn is seen twice: as the connect error and
    /// as its `Closed` event; it counts once).
    crash_epoch: AtomicU64,
    pub in_flight: AtomicUsize,
    /// The last epoch whose tools were compared with the registrations' pins before its first
    /// request (`Pool::verify`): a newer connection waits for its comparison (issue 50).
    pub verified: AtomicU64,
    /// The epoch the upstream's cached catalog was fetched on (the probe's), if it was.
    pub catalogued: AtomicU64,
    /// One comparison per new connection at a time.
    pub verifying: tokio::sync::Mutex<()>,
    pub permits: Arc<Semaphore>,
    /// Calls in flight (waiting for a permit included) per registration, for the
    /// per-registration share of a shared or leased slot's permits.
    pub holders: Mutex<HashMap<String, usize>>,
    /// `tools/list_changed` refreshes: one in flight, plus whether another was announced
    /// meanwhile.
    pub refresh: Mutex<Refresh>,
    last_used: Mutex<Instant>,
    pub leases: Leases,
    pub stop: CancellationToken,
    /// The tracer (tracing on): spawns are pool work with a trace of their own.
    telemetry: Option<Arc<crate::telemetry::Telemetry>>,
    /// The spawn of the live connection, as calls that waited on it link to it.
    spawn_work: Mutex<Option<crate::telemetry::PoolWork>>,
    /// The credential of the registration this slot serves alone (issue 47): its
    /// connections read it on every request. `None` for every other slot.
    pub auth: Option<Arc<crate::registration::AuthCell>>,
    /// OAuth (issue 47): the tokens its requests carry (the upstream's own for
    /// `client_credentials`; this registration's exchanged ones for `token_exchange`).
    pub tokens: Option<Arc<super::tokens::Tokens>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Slot {
    /// Waits (at most `within`) until the slot's event task has handled every event its
    /// connections queued so far ([`EventSink::barrier`]).
    pub(crate) async fn events_handled(&self, within: Duration) -> bool {
        self.events_tx.barrier(within).await
    }

    /// A slot with no connection yet, and the receiver of its connections' events.
    pub fn new(
        spec: &Arc<Spec>,
        audit: Audit,
        leased: bool,
        telemetry: Option<Arc<crate::telemetry::Telemetry>>,
        auth: Option<Arc<crate::registration::AuthCell>>,
        tokens: Option<Arc<super::tokens::Tokens>>,
    ) -> (Arc<Slot>, EventReceiver) {
        if let Some(c) = &spec.oauth {
            c.trace_with(telemetry.as_ref());
        }
        // Bounded and rate-limited per connection (events.rs).
        let (tx, rx) = super::events::channel(&spec.id, spec.refused.clone());
        let slot = Arc::new(Slot {
            spec: spec.clone(),
            audit,
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
            verified: AtomicU64::new(0),
            catalogued: AtomicU64::new(0),
            verifying: tokio::sync::Mutex::new(()),
            permits: Arc::new(Semaphore::new(spec.config.max_in_flight.max(1))),
            holders: Mutex::new(HashMap::default()),
            refresh: Mutex::new(Refresh::default()),
            last_used: Mutex::new(Instant::now()),
            leases: Leases::default(),
            stop: CancellationToken::new(),
            telemetry,
            spawn_work: Mutex::new(None),
            auth,
            tokens,
        });
        (slot, rx)
    }

    fn record(&self, event: &str, epoch: u64, pid: Option<u32>, reason: Option<String>) {
        let mut r = Record::event(event);
        r.upstream = Some(self.spec.id.as_str().into());
        r.epoch = Some(epoch);
        r.pid = pid;
        r.reason = reason.map(Into::into);
        self.audit.record_detached(r);
    }

    /// Drops a released registration's exchanged tokens (issue 47), revoking them where the
    /// authorization server offers it (in the background, bounded). The upstream's own
    /// (`client_credentials`) tokens are the gateway's and stay.
    pub fn revoke_tokens(&self) {
        if let Some(t) = &self.tokens {
            if t.grant() == crate::config::OAuthGrant::TokenExchange {
                t.revoke();
            }
        }
    }

    /// The current connection of `epoch`, if it is still the current one.
    pub fn current_of(&self, epoch: u64) -> Option<Connection> {
        lock(&self.current).clone().filter(|c| c.epoch() == epoch)
    }

    /// The current connection, if it is alive.
    pub fn live(&self) -> Option<Connection> {
        lock(&self.current).clone().filter(|c| !c.is_closed())
    }

    /// The live connection, (re)spawning it with a new epoch when needed.
    ///
    /// Not an `async fn`: the common case (a live connection) is answered without a future of
    /// its own, and the spawn path is boxed, so every forwarded call's future does not carry
    /// the spawn's state (its pool span made it 864 bytes, 16-aligned).
    pub fn connection(
        &self,
    ) -> impl std::future::Future<Output = Result<Connection, UpstreamError>> + Send + '_ {
        // The common case without the async lock (taken by every call otherwise): `current`
        // mirrors the live connection; spawning, closing and eviction still go through `conn`.
        let live = self.live();
        async move {
            match live {
                Some(c) => Ok(c),
                None => Box::pin(self.spawn_connection()).await,
            }
        }
    }

    /// [`Slot::connection`]'s rare path: under the async lock, the connection (re)spawned.
    async fn spawn_connection(&self) -> Result<Connection, UpstreamError> {
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
        opts.notifications_refused = self.spec.refused.clone();
        opts.notify_grace = Duration::from_millis(self.spec.config.notify_grace_ms.max(1));
        opts.request_timeout = Duration::from_secs(self.spec.config.call_timeout_s.max(1));
        opts.client_capabilities = super::routing::declared_capabilities(&self.spec.config);
        opts.modern = self.spec.config.protocol.as_deref() == Some(super::MODERN_PROTOCOL_VERSION);
        opts.auth = self.auth.clone();
        opts.tokens = self.tokens.clone();
        // Pool work: a trace of its own (tracing on), linked from the calls that waited; the
        // upstream's span of `initialize` joins it.
        let span = self
            .telemetry
            .as_ref()
            .map(|t| t.pool_span("spawn", &self.spec.id, self.spec.peer()));
        opts.trace = span.as_ref().map(|s| s.meta().clone());
        // Boxed: spawning is the rare path; inline, its future would make every forwarded
        // call's future (which awaits this one) as large as the handshake's (issue 19).
        let connected = Box::pin(Connection::connect(opts, self.events_tx.clone())).await;
        if let Some(span) = span {
            // Never the error's text: it may name the command.
            let error = connected
                .as_ref()
                .err()
                .map(|_| "spawn or initialize failed");
            *lock(&self.spawn_work) = span.end(Some(epoch), error);
        }
        match connected {
            Ok(c) => {
                tracing::info!(upstream = %self.spec.id, epoch, pid = ?c.pid(), lease = c.supports_lease(), "upstream connected");
                self.record("upstream_spawned", epoch, c.pid(), None);
                *guard = Some(c.clone());
                *lock(&self.current) = Some(c.clone());
                // A 2026-07-28 HTTP upstream's list changes come on `subscriptions/listen`.
                super::subscriptions::keep_listening(
                    &c,
                    &self.spec.watched,
                    self.stop.child_token(),
                );
                *lock(&self.last_used) = Instant::now();
                *lock(&self.spec.last_error) = None;
                Ok(c)
            }
            Err(e) => {
                *lock(&self.spec.last_error) = Some(e.to_string());
                self.count_crash(epoch);
                Err(e)
            }
        }
    }

    /// The pool work behind this slot's connection and its upstream's catalog (tracing on).
    pub fn pool_work(&self) -> [Option<crate::telemetry::PoolWork>; 2] {
        [
            lock(&self.spawn_work).clone(),
            lock(&self.spec.catalog_work).clone(),
        ]
    }

    /// A request was answered: the connection works, the backoff starts over.
    pub fn answered(&self) {
        self.crashes.store(0, Ordering::Relaxed);
    }

    /// Counts one failure of `epoch` towards the respawn backoff (at most once per epoch).
    fn count_crash(&self, epoch: u64) {
        if self.crash_epoch.swap(epoch, Ordering::SeqCst) != epoch {
            self.crashes.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Tears the current connection down (graceful, bounded by the transport's grace periods).
    pub async fn close(&self, why: &str) {
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

    /// Closes the connection if it is idle since before `now - idle`: no call in flight, no
    /// open lease, nobody connecting or closing it right now.
    pub async fn evict_if_idle(&self, now: Instant, idle: Duration) -> bool {
        let Ok(mut guard) = self.conn.try_lock() else {
            return false; // connecting or closing right now
        };
        let live = guard.as_ref().is_some_and(|c| !c.is_closed());
        let last = *lock(&self.last_used);
        if !live
            || self.in_flight.load(Ordering::SeqCst) > 0
            || !self.leases.is_empty()
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

    /// A connection of this slot closed: a crash unless the gateway closed it itself.
    pub fn on_closed(&self, epoch: u64, reason: String) {
        let pid = self.current_of(epoch).as_ref().and_then(Connection::pid);
        if self.killed_epoch.load(Ordering::SeqCst) != epoch {
            self.count_crash(epoch);
            tracing::warn!(upstream = %self.spec.id, epoch, ?pid, %reason, "upstream connection died; the next call respawns it");
            self.record("upstream_exited", epoch, pid, Some(reason));
        }
    }
}

/// The coalescing state of a slot's catalog refreshes.
#[derive(Debug, Default)]
pub(super) struct Refresh {
    pub in_flight: bool,
    pub dirty: bool,
}

/// One registration's call counted against its share of a shared slot's permits; the
/// count goes down when it ends.
pub(super) struct Share {
    slot: Arc<Slot>,
    registration_id: String,
}

impl Share {
    /// Counts one more call of `registration_id` on `slot`, unless it holds `cap` already.
    pub fn take(slot: &Arc<Slot>, registration_id: &str, cap: usize) -> Option<Share> {
        let mut holders = lock(&slot.holders);
        let n = holders.entry(registration_id.to_string()).or_insert(0);
        if *n >= cap {
            if *n == 0 {
                holders.remove(registration_id);
            }
            return None;
        }
        *n += 1;
        Some(Share {
            slot: slot.clone(),
            registration_id: registration_id.to_string(),
        })
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut holders = lock(&self.slot.holders);
        if let Some(n) = holders.get_mut(&self.registration_id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                holders.remove(&self.registration_id);
            }
        }
    }
}

/// Counts a call in flight on a slot and stamps its last use when it ends.
pub(super) struct Busy(Arc<Slot>);

impl Busy {
    pub fn new(slot: &Arc<Slot>) -> Self {
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

fn backoff(crashes: u32) -> Duration {
    if crashes < 2 {
        return Duration::ZERO;
    }
    let exp = (crashes - 2).min(6);
    Duration::from_millis(100u64 << exp).min(Duration::from_secs(5))
}

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
}
