//! Refused requests made visible (issue 41): every refusal of either listener has a reason
//! from a closed set ([`Reason`]), is counted on `/metrics` by listener, status and reason,
//! logs one `debug` line and, per reason, at most one `warn` summary per [`WARN_EVERY`] with
//! the count since the last; a wrong or missing token shown to a live registration (or to the
//! admin API) writes an `auth_failed` audit record, folded per registration and interval.
//!
//! A refusal is marked on its response ([`Refused`], a response extension: only refusals
//! carry one) and observed in one place, the accept loop of both listeners
//! (`server::serve_http1`), which knows the client's address.
//!
//! Invariant: nothing here is labelled or keyed by what a client chooses: metric labels are
//! the listener, the status and the reason; the fold table holds live registrations (and one
//! admin entry); log lines show at most a registration id's first characters, never a token
//! or a path.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;

use crate::audit::{Audit, Record};
use crate::registration::RegistrationState;
use crate::sync::{lock, HashMap};

/// At most one `warn` summary per reason per this period.
pub const WARN_EVERY: Duration = Duration::from_secs(10);
/// How many characters of a registration id a log line shows.
pub const ID_SHOWN: usize = 6;

/// Which listener refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Listener {
    Data,
    Admin,
}

impl Listener {
    pub fn as_str(self) -> &'static str {
        match self {
            Listener::Data => "data",
            Listener::Admin => "admin",
        }
    }
}

/// Why a request was refused: a closed set, the metric's `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// No registration has this id (404).
    UnknownRegistration,
    /// The registration was released (or expired) (404).
    Released,
    /// A token that is not the registration's (401).
    BadToken,
    /// No bearer token (401).
    MissingToken,
    /// An `Origin` not allowed (403).
    Origin,
    /// A `Host` not allowed (403).
    Host,
    /// A body over `max_body_bytes` (413).
    BodyTooLarge,
    /// A request head not received within `connections.header_timeout_s` (the connection is
    /// closed).
    HeaderTimeout,
    /// A body not received within `connections.body_timeout_s` (408).
    BodyTimeout,
    /// Too many requests in flight on a session (429).
    RateLimited,
    /// An unknown or ended session (404).
    SessionUnknown,
    /// Malformed or unacceptable: framing, headers, content type, JSON-RPC (400, 405, 406,
    /// 415, 431, 501, …).
    BadRequest,
    /// A wrong or missing admin token (401 on the admin listener).
    AdminAuth,
    /// No such path (404).
    NoRoute,
    /// A cap reached: connections or sessions (503).
    Overloaded,
    /// A fenced cluster node (`fence`): it cannot prove it is current with the registration
    /// store, so it serves no MCP path (503 with `Retry-After`; another node may serve).
    Fenced,
}

impl Reason {
    /// Every reason, in the order of the enum.
    pub const ALL: [Reason; 16] = [
        Reason::UnknownRegistration,
        Reason::Released,
        Reason::BadToken,
        Reason::MissingToken,
        Reason::Origin,
        Reason::Host,
        Reason::BodyTooLarge,
        Reason::HeaderTimeout,
        Reason::BodyTimeout,
        Reason::RateLimited,
        Reason::SessionUnknown,
        Reason::BadRequest,
        Reason::AdminAuth,
        Reason::NoRoute,
        Reason::Overloaded,
        Reason::Fenced,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::UnknownRegistration => "unknown_registration",
            Reason::Released => "released",
            Reason::BadToken => "bad_token",
            Reason::MissingToken => "missing_token",
            Reason::Origin => "origin",
            Reason::Host => "host",
            Reason::BodyTooLarge => "body_too_large",
            Reason::HeaderTimeout => "header_timeout",
            Reason::BodyTimeout => "body_timeout",
            Reason::RateLimited => "rate_limited",
            Reason::SessionUnknown => "session_unknown",
            Reason::BadRequest => "bad_request",
            Reason::AdminAuth => "admin_auth",
            Reason::NoRoute => "no_route",
            Reason::Overloaded => "overloaded",
            Reason::Fenced => "fenced",
        }
    }

    fn index(self) -> usize {
        Reason::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }

    /// Why an id that is no live registration was refused: released lately, or never known
    /// (`Registry::was_released`).
    pub fn missing_registration(registry: &crate::registration::Registry, id: &str) -> Reason {
        if registry.was_released(id) {
            Reason::Released
        } else {
            Reason::UnknownRegistration
        }
    }

    /// The reason a status stands for when nothing more precise was said: a response of
    /// status ≥ 400 that carries no [`Refused`] (axum's own 405, hyper's own 400 or 431, the
    /// admin API's errors). Never a `Rejection`'s: each is built with its reason
    /// (`endpoint::rejection`).
    pub fn of_status(status: StatusCode) -> Reason {
        match status {
            StatusCode::UNAUTHORIZED => Reason::BadToken,
            StatusCode::FORBIDDEN => Reason::Origin,
            StatusCode::NOT_FOUND => Reason::NoRoute,
            StatusCode::REQUEST_TIMEOUT => Reason::BodyTimeout,
            StatusCode::PAYLOAD_TOO_LARGE => Reason::BodyTooLarge,
            StatusCode::TOO_MANY_REQUESTS => Reason::RateLimited,
            StatusCode::SERVICE_UNAVAILABLE => Reason::Overloaded,
            _ => Reason::BadRequest,
        }
    }
}

/// A wrong or missing token shown to a live registration, or to the admin API: what its
/// `auth_failed` record says.
#[derive(Clone)]
pub struct AuthFailure {
    /// The registration (None: the admin API).
    pub registration: Option<Arc<RegistrationState>>,
    /// The transport the request was for (`sse`, `streamable_http`; `admin`).
    pub transport: &'static str,
    /// No token at all (else a wrong one).
    pub missing: bool,
}

impl std::fmt::Debug for AuthFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthFailure")
            .field("registration", &self.registration.as_ref().map(|r| &r.id))
            .field("transport", &self.transport)
            .field("missing", &self.missing)
            .finish()
    }
}

/// The mark a refusal's response carries (an extension), read by the accept loop.
#[derive(Clone, Debug)]
pub struct Refused {
    pub reason: Reason,
    /// The registration id the request named, shortened for logs ([`ID_SHOWN`] characters).
    pub registration: Option<Box<str>>,
    /// Set when a live registration (or the admin API) was shown a wrong or missing token.
    pub auth: Option<AuthFailure>,
}

impl Refused {
    pub fn new(reason: Reason) -> Self {
        Refused {
            reason,
            registration: None,
            auth: None,
        }
    }

    /// Names the registration the request was for (shortened for logs).
    pub fn about(mut self, id: &str) -> Self {
        self.registration = Some(shorten(id).into());
        self
    }
}

/// An id as a log line may show it: its first [`ID_SHOWN`] characters and `…`.
pub fn shorten(id: &str) -> String {
    match id.char_indices().nth(ID_SHOWN) {
        Some((at, _)) => format!("{}…", &id[..at]),
        None => id.to_string(),
    }
}

/// Per reason: refusals since the last `warn` summary, and when that was.
struct WarnGate {
    since: AtomicU64,
    /// Milliseconds after `Refusals::epoch` of the last summary, plus one (0: never).
    last_ms: AtomicU64,
}

/// Refusals per second over the console's window, per reason.
pub const WINDOW_S: usize = 900;

struct Rings {
    /// The second (since the epoch) the rings were last advanced to.
    last: u64,
    /// Per reason (allocated whole with the gateway: 27 KB; counting grows nothing), a count
    /// that saturates at 65,535 a second.
    slots: Vec<[u16; WINDOW_S]>,
}

/// One registration's (or the admin API's) failed authentications, folded.
struct Fold {
    /// The registration (None: the admin API).
    registration: Option<Arc<RegistrationState>>,
    transport: &'static str,
    /// Failures since the last record.
    count: u64,
    /// The client address and the kind of the latest of them.
    addr: Option<SocketAddr>,
    missing: bool,
    /// When the last record was written.
    written: Instant,
}

/// The admin API's key in the fold table (registration ids are base64url: no `:`).
const ADMIN_KEY: &str = ":admin";

/// Everything a gateway keeps about refusals.
pub struct Refusals {
    audit: Audit,
    fold_every: Duration,
    epoch: Instant,
    /// Per listener and reason ([`gate_index`]).
    gates: [WarnGate; 2 * Reason::ALL.len()],
    rings: Mutex<Rings>,
    folds: Mutex<HashMap<String, Fold>>,
    /// Wakes the folder when a fold has a count to write.
    pending: tokio::sync::Notify,
}

impl Refusals {
    pub fn new(audit: Audit, fold_every: Duration) -> Self {
        Refusals {
            audit,
            fold_every: fold_every.max(Duration::from_millis(100)),
            epoch: Instant::now(),
            gates: std::array::from_fn(|_| WarnGate {
                since: AtomicU64::new(0),
                last_ms: AtomicU64::new(0),
            }),
            rings: Mutex::new(Rings {
                last: 0,
                slots: vec![[0; WINDOW_S]; Reason::ALL.len()],
            }),
            folds: Mutex::new(HashMap::default()),
            pending: tokio::sync::Notify::new(),
        }
    }

    /// Observes one refusal: the series, the log lines, the audit fold. (The metric is
    /// counted by the caller, which holds the gateway's metrics.)
    pub fn observe(
        &self,
        listener: Listener,
        status: StatusCode,
        refused: &Refused,
        peer: Option<SocketAddr>,
    ) {
        let reason = refused.reason;
        tracing::debug!(
            listener = listener.as_str(),
            status = status.as_u16(),
            reason = reason.as_str(),
            registration = refused.registration.as_deref().unwrap_or("-"),
            peer = %peer.map_or_else(|| "-".to_string(), |p| p.to_string()),
            "request refused"
        );
        self.warn_gated(listener, reason);
        self.ring_add(reason);
        if let Some(auth) = &refused.auth {
            let key = auth
                .registration
                .as_ref()
                .map_or(ADMIN_KEY, |r| r.id.as_str());
            self.auth_failed(
                key,
                auth.registration.as_ref(),
                auth.transport,
                peer,
                auth.missing,
            );
        }
    }

    /// Counts toward the reason's `warn` summary; writes it when the period has passed.
    fn warn_gated(&self, listener: Listener, reason: Reason) {
        let gate = &self.gates[gate_index(listener, reason)];
        if gate.since.fetch_add(1, Ordering::AcqRel) == 0 {
            // A count the folder must write if no later refusal does.
            self.pending.notify_one();
        }
        self.warn_if_due(listener, reason, false);
    }

    /// Writes the `warn` summary of (listener, reason) if it has a count and its period has
    /// passed (or `force`).
    fn warn_if_due(&self, listener: Listener, reason: Reason, force: bool) {
        let gate = &self.gates[gate_index(listener, reason)];
        if gate.since.load(Ordering::Acquire) == 0 {
            return;
        }
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        let last = gate.last_ms.load(Ordering::Relaxed);
        if !force && last != 0 && now.saturating_sub(last) < WARN_EVERY.as_millis() as u64 {
            return;
        }
        if gate
            .last_ms
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let count = gate.since.swap(0, Ordering::AcqRel);
        if count == 0 {
            return;
        }
        tracing::warn!(
            listener = listener.as_str(),
            reason = reason.as_str(),
            count,
            period_s = WARN_EVERY.as_secs(),
            "requests refused ({count} {} since the last summary; at most one line per {} s per reason)",
            reason.as_str(),
            WARN_EVERY.as_secs()
        );
    }

    fn second(&self) -> u64 {
        self.epoch.elapsed().as_secs()
    }

    fn ring_add(&self, reason: Reason) {
        let now = self.second();
        let mut rings = lock(&self.rings);
        advance(&mut rings, now);
        let slot = &mut rings.slots[reason.index()][(now % WINDOW_S as u64) as usize];
        *slot = slot.saturating_add(1);
    }

    /// The console's series: per reason with any refusal in the window, refusals per second,
    /// oldest second first (the shape of `audit::series`' keys: `key` and `calls`).
    pub fn series(&self) -> serde_json::Value {
        let now = self.second();
        let mut rings = lock(&self.rings);
        advance(&mut rings, now);
        let mut out = Vec::new();
        for (reason, ring) in Reason::ALL.iter().zip(rings.slots.iter()) {
            let total: u64 = ring.iter().map(|&c| u64::from(c)).sum();
            if total == 0 {
                continue;
            }
            let calls: Vec<u16> = (0..WINDOW_S as u64)
                .map(|j| ring[((now + 1 + j) % WINDOW_S as u64) as usize])
                .collect();
            out.push(serde_json::json!({
                "key": reason.as_str(),
                "calls_total": total,
                "calls": calls,
            }));
        }
        serde_json::Value::Array(out)
    }

    /// A failed authentication: the first of a period is written at once (`count` 1); the
    /// rest are folded and written by [`Refusals::run_folder`] once the period has passed.
    fn auth_failed(
        &self,
        key: &str,
        registration: Option<&Arc<RegistrationState>>,
        transport: &'static str,
        peer: Option<SocketAddr>,
        missing: bool,
    ) {
        let now = Instant::now();
        let write_now = {
            let mut folds = lock(&self.folds);
            match folds.get_mut(key) {
                Some(f) => {
                    f.count += 1;
                    f.addr = peer;
                    f.missing = missing;
                    if f.count == 1 {
                        self.pending.notify_one();
                    }
                    false
                }
                None => {
                    // The folder forgets the entry once its period has passed.
                    self.pending.notify_one();
                    folds.insert(
                        key.to_string(),
                        Fold {
                            registration: registration.cloned(),
                            transport,
                            count: 0,
                            addr: peer,
                            missing,
                            written: now,
                        },
                    );
                    true
                }
            }
        };
        if write_now {
            self.write(registration.map(|r| &**r), transport, 1, peer, missing);
        }
    }

    fn write(
        &self,
        registration: Option<&RegistrationState>,
        transport: &'static str,
        count: u64,
        peer: Option<SocketAddr>,
        missing: bool,
    ) {
        const EVENT: &str = "auth_failed";
        let mut rec = match registration {
            Some(r) => r.audit_record(EVENT),
            None => Record::event(EVENT),
        };
        rec.transport = Some(transport.into());
        rec.reason = Some(
            if missing {
                "missing_token"
            } else {
                "bad_token"
            }
            .into(),
        );
        rec.rare_mut().count = Some(count);
        rec.rare_mut().client_addr = peer.map(|p| p.to_string().into());
        self.audit.record_detached(rec);
    }

    /// Writes every fold whose period has passed and has a count; forgets the ones with none
    /// (so the table holds only registrations failing now). `all`: write every count now
    /// (at shutdown, or a registration's release).
    fn flush(&self, all: bool, only: Option<&str>) {
        let now = Instant::now();
        let mut due = Vec::new();
        {
            let mut folds = lock(&self.folds);
            folds.retain(|key, f| {
                if only.is_some_and(|o| o != key) {
                    return true;
                }
                // A released registration's count is written now (a failure that raced
                // with its release), and the entry lets go of it.
                let all = all || f.registration.as_ref().is_some_and(|r| r.is_released());
                let passed = now.duration_since(f.written) >= self.fold_every;
                if f.count > 0 && (passed || all) {
                    due.push((
                        f.registration.clone(),
                        f.transport,
                        f.count,
                        f.addr,
                        f.missing,
                    ));
                    f.count = 0;
                    f.written = now;
                    return !all;
                }
                !(passed || all)
            });
            if folds.is_empty() {
                folds.shrink_to(0);
            }
        }
        for (reg, transport, count, addr, missing) in due {
            self.write(reg.as_deref(), transport, count, addr, missing);
        }
    }

    /// Writes a released registration's folded failures now (its record comes before the
    /// registration's release record is due, and the fold lets go of the registration).
    pub fn flush_registration(&self, id: &str) {
        self.flush(true, Some(id));
    }

    /// The `warn` summaries whose period has passed (all with a count: `force`).
    fn warn_due(&self, force: bool) {
        for listener in [Listener::Data, Listener::Admin] {
            for reason in Reason::ALL {
                self.warn_if_due(listener, reason, force);
            }
        }
    }

    /// Is anything left for the folder: a fold (to write or to forget), or a `warn`
    /// summary's count?
    fn anything_pending(&self) -> bool {
        !lock(&self.folds).is_empty()
            || self
                .gates
                .iter()
                .any(|g| g.since.load(Ordering::Acquire) > 0)
    }

    /// The folder: writes folded `auth_failed` counts and the `warn` summaries once their
    /// period has passed (also when no refusal follows), until `stop`; then writes what is
    /// left. Asleep while nothing is pending.
    pub async fn run_folder(&self, stop: tokio_util::sync::CancellationToken) {
        let tick = (self.fold_every.min(WARN_EVERY) / 4).max(Duration::from_millis(25));
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = self.pending.notified() => {}
            }
            // Something is pending: write it when its period has passed, and keep going while
            // refusals keep coming.
            loop {
                tokio::select! {
                    _ = stop.cancelled() => {
                        self.flush(true, None);
                        self.warn_due(true);
                        return;
                    }
                    _ = tokio::time::sleep(tick) => {}
                }
                self.flush(false, None);
                self.warn_due(false);
                if !self.anything_pending() {
                    break;
                }
            }
        }
        self.flush(true, None);
        self.warn_due(true);
    }
}

fn gate_index(listener: Listener, reason: Reason) -> usize {
    let base = match listener {
        Listener::Data => 0,
        Listener::Admin => Reason::ALL.len(),
    };
    base + reason.index()
}

fn advance(rings: &mut Rings, now: u64) {
    if now <= rings.last {
        return;
    }
    let steps = (now - rings.last).min(WINDOW_S as u64);
    for k in 1..=steps {
        let i = ((rings.last + k) % WINDOW_S as u64) as usize;
        for ring in rings.slots.iter_mut() {
            ring[i] = 0;
        }
    }
    rings.last = now;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Reason::ALL` holds every variant, in the enum's order: adding a variant breaks this
    /// match until it is placed (and then the assertions check `ALL` has it there).
    fn position(r: Reason) -> usize {
        match r {
            Reason::UnknownRegistration => 0,
            Reason::Released => 1,
            Reason::BadToken => 2,
            Reason::MissingToken => 3,
            Reason::Origin => 4,
            Reason::Host => 5,
            Reason::BodyTooLarge => 6,
            Reason::HeaderTimeout => 7,
            Reason::BodyTimeout => 8,
            Reason::RateLimited => 9,
            Reason::SessionUnknown => 10,
            Reason::BadRequest => 11,
            Reason::AdminAuth => 12,
            Reason::NoRoute => 13,
            Reason::Overloaded => 14,
            Reason::Fenced => 15,
        }
    }

    #[test]
    fn all_holds_every_reason_once() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(position(*r), i, "{r:?}");
        }
        assert_eq!(Reason::Fenced.as_str(), "fenced");
        assert_ne!(Reason::Fenced, Reason::Overloaded);
    }

    #[test]
    fn reasons_are_distinct_and_statuses_map() {
        let names: crate::sync::HashSet<_> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), Reason::ALL.len());
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
        assert_eq!(
            Reason::of_status(StatusCode::METHOD_NOT_ALLOWED),
            Reason::BadRequest
        );
        assert_eq!(
            Reason::of_status(StatusCode::PAYLOAD_TOO_LARGE),
            Reason::BodyTooLarge
        );
    }

    #[test]
    fn ids_are_shortened() {
        assert_eq!(shorten("abcdefghij"), "abcdef…");
        assert_eq!(shorten("abc"), "abc");
        assert_eq!(shorten("ééééééé"), "éééééé…");
    }
}
