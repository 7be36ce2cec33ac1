//! The live state of one registration ([`RegistrationState`]), shared by the registry, its
//! sessions and its calls.
//!
//! Invariant: what never changes after creation (id, agent id, label, tools, grants, limits,
//! roots, TTL, creation time, family) is readable in place; what changes (the expiry, the
//! release, the call counters) changes only through this module's methods and [`Budget`]'s.
//! A token is compared (in constant time) with its own registration's token only.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::audit::Record as AuditRecord;
use crate::tools::ToolSet;

use super::ids::token_digest;
use crate::sync::lock;

use super::{Budget, Grant, Limits, Record, RegistrationSpec, Root, StoredTool};

/// The live state of one registration. Shared by the registry, its sessions and its calls.
pub struct RegistrationState {
    pub id: String,
    token_digest: [u8; 32],
    pub agent_id: Arc<str>,
    pub label: Option<String>,
    pub tools: ToolSet,
    /// The grants as registered (`<upstream>.*`, `<upstream>.tool`, in-process names); the
    /// upstreams they name are the ones whose resources and prompts this registration sees.
    pub grants: Vec<Grant>,
    pub limits: Limits,
    /// The roots the harness set (`RegistrationSpec::roots`).
    pub roots: Option<Vec<Root>>,
    pub ttl_s: Option<u64>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// Unix ms at which the lease ends (0 = never). Renewing moves it.
    expires_at_ms: AtomicU64,
    /// Fires on release ([`RegistrationState::release`]): ends streams, cancels calls.
    pub cancel: Cancel,
    /// Set by [`RegistrationState::release`] before `cancel` fires: what a call reads to know
    /// (the token's `is_cancelled` takes its mutex, which every call of the registration shares).
    released: AtomicBool,
    /// Every call of this registration runs on this tracker, so release can wait for them.
    pub calls: Calls,
    /// The call counters (`max_calls`, `max_concurrent`): written by [`Budget`] only.
    budget: Budget,
    /// The tools' definitions as granted, by digest, and their drift since (`pins`).
    pub pins: super::pins::Pins,
    /// The family: the parent (a child's calls count against every ancestor's limits), the
    /// agent ids from the root down (in a child's audit records), the live children's ids,
    /// and the children closed with this one, which its release finishes first.
    pub family: Family,
    /// Its own upstream credentials (issue 47): rotated in place, read per upstream request.
    pub credentials: super::Credentials,
    /// Its own policy rules (`limits.policy`), compiled; `None` when it has none.
    pub policy: Option<crate::policy::Rules>,
    /// Its rate limits' token buckets (`limits.calls_per_minute`, `tool_calls_per_minute`).
    pub rate: crate::policy::Buckets,
}

/// A registration's cancellation, read-only outside this module: its calls and streams take
/// child tokens of it or wait for it; only [`RegistrationState::release`] (and a clean stop)
/// fires it.
#[derive(Debug, Default)]
pub struct Cancel(CancellationToken);

impl Cancel {
    pub fn child_token(&self) -> CancellationToken {
        self.0.child_token()
    }

    pub fn cancelled(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.0.cancelled()
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.is_cancelled()
    }

    /// A handle to wait on (a stream's stop): it fires with the registration's release.
    pub fn token(&self) -> CancellationToken {
        self.0.clone()
    }
}

/// The tracker every call of a registration runs on; closed and waited for by its release.
#[derive(Debug, Default, Clone)]
pub struct Calls(TaskTracker);

impl Calls {
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.0.spawn(task)
    }

    pub fn track_future<F: std::future::Future>(
        &self,
        future: F,
    ) -> tokio_util::task::task_tracker::TrackedFuture<F> {
        self.0.track_future(future)
    }

    /// Waits until the tracker is closed and every call on it ended.
    pub fn wait(&self) -> tokio_util::task::task_tracker::TaskTrackerWaitFuture<'_> {
        self.0.wait()
    }
}

/// A registration's place in its family of sub-agents.
#[derive(Debug, Default)]
pub struct Family {
    pub parent: Option<Arc<RegistrationState>>,
    /// The agent ids from the root registration down to this one (None for a root).
    pub agent_path: Option<Vec<String>>,
    /// 0 for a root registration.
    pub depth: usize,
    children: Mutex<Vec<String>>,
    closed_children: Mutex<Vec<Arc<RegistrationState>>>,
}

impl Family {
    /// The family of a child of `parent`.
    pub fn child_of(parent: &Arc<RegistrationState>, agent_id: &str) -> Family {
        let mut path = parent
            .family
            .agent_path
            .clone()
            .unwrap_or_else(|| vec![parent.agent_id.to_string()]);
        path.push(agent_id.to_string());
        Family {
            parent: Some(parent.clone()),
            agent_path: Some(path),
            depth: parent.family.depth + 1,
            ..Family::default()
        }
    }

    /// The ids of the live children.
    pub fn children(&self) -> Vec<String> {
        lock(&self.children).clone()
    }

    /// How many live children it has.
    pub fn child_count(&self) -> usize {
        lock(&self.children).len()
    }

    /// The ancestors, nearest first.
    pub fn ancestors(&self) -> impl Iterator<Item = &Arc<RegistrationState>> {
        std::iter::successors(self.parent.as_ref(), |p| p.family.parent.as_ref())
    }

    /// Notes a live child (under its parent, once it is served).
    pub(crate) fn add_child(&self, id: &str) {
        lock(&self.children).push(id.to_string());
    }

    /// Forgets a child that closed.
    pub(crate) fn remove_child(&self, id: &str) {
        lock(&self.children).retain(|c| c != id);
    }

    /// Keeps the children closed with this registration, for its release to finish first.
    pub(crate) fn closed_with(&self, children: Vec<Arc<RegistrationState>>) {
        lock(&self.closed_children).extend(children);
    }

    /// Takes the children closed with this registration (its release finishes them).
    pub(crate) fn take_closed(&self) -> Vec<Arc<RegistrationState>> {
        std::mem::take(&mut *lock(&self.closed_children))
    }
}

impl std::fmt::Debug for RegistrationState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistrationState")
            .field("id", &self.id)
            .field("agent_id", &self.agent_id)
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

impl RegistrationState {
    /// A new registration (its grants checked by `RegistrationSpec::check`; one that is not
    /// well-formed is left out).
    pub(crate) fn new(id: String, token: &str, spec: &RegistrationSpec, tools: ToolSet) -> Self {
        let created_at = chrono::Utc::now();
        let expires = spec
            .ttl_s
            .map(|t| created_at.timestamp_millis() as u64 + t.saturating_mul(1000))
            .unwrap_or(0);
        RegistrationState {
            id,
            token_digest: token_digest(token),
            agent_id: Arc::from(spec.agent_id.as_str()),
            label: spec.label.clone(),
            pins: super::pins::Pins::of(&tools),
            family: Family::default(),
            tools,
            grants: spec
                .tools
                .iter()
                .filter_map(|g| Grant::parse(g).ok())
                .collect(),
            limits: spec.limits.clone(),
            roots: spec.roots.clone(),
            ttl_s: spec.ttl_s,
            created_at,
            expires_at_ms: AtomicU64::new(expires),
            cancel: Cancel::default(),
            released: AtomicBool::new(false),
            calls: Calls::default(),
            // The whole budget in hand (a store that dies with the process); `register` sets
            // the first block of a durable store.
            budget: Budget::new(spec.limits.max_calls.unwrap_or(0)),
            // Checked by `Gateway::register` before (`Credentials::of` fails the same way).
            credentials: super::Credentials::of(&spec.upstream_credentials).unwrap_or_default(),
            // Checked by `RegistrationSpec::check`; a stored one that no longer compiles
            // denies every call (an empty list would allow them).
            policy: (!spec.limits.policy.is_empty()).then(|| {
                crate::policy::compile(&spec.limits.policy, "policy", false)
                    .unwrap_or_else(|_| crate::policy::Rules::deny_all())
            }),
            rate: crate::policy::Buckets::new(
                spec.limits.calls_per_minute,
                spec.limits.tool_calls_per_minute.as_ref(),
            ),
        }
    }

    /// The credential cell this registration's requests to `upstream` read: its own, else
    /// its nearest ancestor's (a child uses its parent's unless given its own). Without any
    /// credential in the family: one atomic load per generation, no lock.
    #[inline]
    pub fn upstream_auth(&self, upstream: &str) -> Option<std::sync::Arc<super::AuthCell>> {
        if let Some(c) = self.credentials.cell(upstream) {
            return Some(c);
        }
        self.family
            .ancestors()
            .find_map(|a| a.credentials.cell(upstream))
    }

    /// This registration placed in `family` (before it is shared).
    pub(crate) fn with_family(mut self, family: Family) -> Self {
        self.family = family;
        self
    }

    /// A registration read back from the store, served with `tools`: its token digest,
    /// times and budget as stored (calls reserved before the restart count as spent: a crash
    /// loses the block in hand, never gives calls back).
    pub(crate) fn from_record(r: &Record, tools: ToolSet) -> Self {
        let spec = RegistrationSpec {
            agent_id: r.agent_id.clone(),
            tools: r.grants.clone(),
            label: r.label.clone(),
            ttl_s: r.ttl_s,
            limits: r.limits.clone(),
            local_tools: Vec::new(),
            roots: r.roots.clone(),
            parent: r.parent.clone(),
            upstream_credentials: Default::default(),
        };
        let mut state = RegistrationState::new(r.id.clone(), "", &spec, tools);
        state.token_digest = r.token_sha256;
        state.created_at = chrono::DateTime::from_timestamp_millis(r.created_at_ms)
            .unwrap_or_else(chrono::Utc::now);
        state.expires_at_ms = AtomicU64::new(r.expires_at_ms);
        state.budget = Budget::restored(r.calls_reserved);
        state
    }

    /// This registration as the store keeps it (the token's digest, never the token), with
    /// `calls_reserved` of its budget handed out.
    pub(crate) fn record(&self, calls_reserved: u64) -> Record {
        Record {
            id: self.id.clone(),
            agent_id: self.agent_id.to_string(),
            label: self.label.clone(),
            token_sha256: self.token_digest,
            grants: self.grants.iter().map(|g| g.as_str().to_string()).collect(),
            tools: self.tools.iter().map(StoredTool::of).collect(),
            limits: self.limits.clone(),
            roots: self.roots.clone(),
            ttl_s: self.ttl_s,
            created_at_ms: self.created_at.timestamp_millis(),
            expires_at_ms: self.expires_at_ms(),
            node: self.id.split_once('.').map(|(n, _)| n.to_string()),
            calls_reserved,
            parent: self.family.parent.as_ref().map(|p| p.id.clone()),
            // Sealed by the gateway (`store::seal`) before it is written.
            credentials: None,
        }
    }

    /// The call counters (read them here; [`Budget`] is their only writer).
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// Takes every reserved call not spent out of this node's hand (to give it back to the
    /// store: a clean stop, or an idle block on a cluster node); no call can spend them after.
    pub(crate) fn take_unspent(&self) -> u64 {
        if self.limits.max_calls.is_none() {
            return 0;
        }
        self.budget.take_unspent()
    }

    /// Marks the registration released and fires its token (streams end, calls are cancelled).
    pub(crate) fn release(&self) {
        self.released.store(true, Ordering::Release);
        self.cancel.0.cancel();
    }

    /// A clean stop keeping the registration in the store: its calls are cancelled and its
    /// tracker closed (it is not marked released: it is served again at the next start).
    pub(crate) fn stop_calls(&self) {
        self.cancel.0.cancel();
        self.calls.0.close();
    }

    /// Closes the call tracker (no call starts after; [`Calls::wait`] can end).
    pub(crate) fn close_calls(&self) {
        self.calls.0.close();
    }

    /// Whether [`RegistrationState::release`] ran; no lock.
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Constant-time comparison of a presented token with this registration's token.
    pub fn token_matches(&self, presented: &str) -> bool {
        bool::from(token_digest(presented).ct_eq(&self.token_digest))
    }

    /// Does any string in `v` (keys and values, at any depth) contain this registration's
    /// token as a word, e.g. `"Bearer <token>"`? Words are runs of base64url characters, so
    /// the cost is one digest per word, not per offset.
    pub fn token_in(&self, v: &serde_json::Value) -> bool {
        use serde_json::Value;
        let in_str = |s: &str| {
            s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
                .any(|w| !w.is_empty() && self.token_matches(w))
        };
        match v {
            Value::String(s) => in_str(s),
            Value::Array(a) => a.iter().any(|x| self.token_in(x)),
            Value::Object(m) => m.iter().any(|(k, x)| in_str(k) || self.token_in(x)),
            _ => false,
        }
    }

    /// An audit record about this registration (id, `agent_id`, label), borrowing them.
    pub fn audit_record<'a>(&'a self, event: &'a str) -> AuditRecord<'a> {
        let mut r = AuditRecord::about(event, &self.id, &self.agent_id, self.label.as_deref());
        if let Some(p) = &self.family.parent {
            let rare = r.rare_mut();
            rare.parent_registration_id = Some(p.id.as_str().into());
            rare.agent_path = self.family.agent_path.as_deref().map(Into::into);
        }
        r
    }

    /// Unix ms at which the lease ends (0 = never).
    pub fn expires_at_ms(&self) -> u64 {
        self.expires_at_ms.load(Ordering::Relaxed)
    }

    /// Moves the lease's end (a renewal, or the store's expiry seen on a cluster node);
    /// returns the old one.
    pub(crate) fn move_expiry(&self, at_ms: u64) -> u64 {
        self.expires_at_ms.swap(at_ms, Ordering::Relaxed)
    }

    /// The wall-clock end (ms) of this registration's lease renewed for `ttl_s` from now,
    /// never past its parent's, and the time until it.
    pub(crate) fn renewed_deadline(&self, ttl_s: u64) -> (u64, std::time::Duration) {
        let wall = chrono::Utc::now().timestamp_millis().max(0) as u64;
        let mut at = wall.saturating_add(ttl_s.saturating_mul(1000));
        if let Some(parent) = &self.family.parent {
            let cap = parent.expires_at_ms();
            if cap != 0 {
                at = at.min(cap);
            }
        }
        (
            at,
            std::time::Duration::from_millis(at.saturating_sub(wall)),
        )
    }

    /// A renewal's TTL: `ttl_s` (default: its own), cut so that a child's lease ends no later
    /// than its parent's. `None`: it has no TTL.
    pub(crate) fn renewal_ttl(&self, ttl_s: Option<u64>) -> Option<u64> {
        let mut ttl = ttl_s.or(self.ttl_s)?;
        if let Some(parent) = &self.family.parent {
            let end = parent.expires_at_ms();
            if end != 0 {
                let now = chrono::Utc::now().timestamp_millis().max(0) as u64;
                ttl = ttl.min(end.saturating_sub(now).div_ceil(1000).max(1));
            }
        }
        Some(ttl)
    }

    /// The expiry as RFC 3339, if the registration has a TTL.
    pub fn expires_at(&self) -> Option<String> {
        let ms = self.expires_at_ms();
        (ms != 0)
            .then(|| chrono::DateTime::from_timestamp_millis(ms as i64))
            .flatten()
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registration::{new_registration_id, new_token};

    #[test]
    fn release_is_read_without_the_token_and_fires_it() {
        let spec = RegistrationSpec::new("agent");
        let reg = RegistrationState::new("r".into(), "t", &spec, ToolSet::default());
        let session = reg.cancel.child_token();
        assert!(!reg.is_released() && !session.is_cancelled());
        reg.release();
        assert!(reg.is_released());
        assert!(reg.cancel.is_cancelled() && session.is_cancelled());
    }

    #[test]
    fn token_matches_only_itself() {
        let spec = RegistrationSpec::new("a");
        let t = new_token();
        let st = RegistrationState::new(new_registration_id(), &t, &spec, ToolSet::default());
        assert!(st.token_matches(&t));
        assert!(!st.token_matches(&new_token()));
        assert!(!st.token_matches(""));
    }
}
