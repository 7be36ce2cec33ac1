//! Approval of one exact call (issue 49 item 3): the table of calls an `approve` rule holds,
//! each waiting for one decision. A held call is announced here (the admin API's long poll and
//! SSE stream read [`Approvals::pending`] and wait on [`Approvals::changed`]); a decision
//! (`POST /v1/approvals/<id>`, or the client's answer) reaches the one call waiting on it.
//!
//! Bounds: at most `max_pending` held calls in all and `max_pending_per_registration` per
//! registration ([`Full`] says which); a decided or ended approval is remembered (for a 409)
//! among the last [`REMEMBERED`] only. A [`Ticket`] is the waiting call's hold on its entry:
//! dropping it (the call ended, was cancelled, or its registration released) removes the
//! entry, so nothing outlives its call. The lock is a std mutex, never held across `.await`.
//!
//! An approval is single-use and bound to one exact call ([`Binding`]: registration, tool,
//! the pinned definition's digest, the arguments' digest, expiry): the verdict is consumed by
//! the call that waited for it, and [`Binding::admits`] refuses any call that differs.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use rand::rngs::OsRng;
use rand::RngCore;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::sync::{lock, HashMap};

pub mod webhook;

/// Decided or ended approvals remembered, so a late decision gets 409 rather than 404.
pub const REMEMBERED: usize = 1024;
/// Defaults of `[policy] max_pending_approvals` and `max_pending_approvals_per_registration`.
pub const DEFAULT_MAX_PENDING: usize = 256;
pub const DEFAULT_MAX_PENDING_PER_REGISTRATION: usize = 16;
/// An `approve` rule without `timeout_s` waits this long.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// What one approval is bound to: the call it approves, exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Binding {
    pub registration_id: String,
    pub tool: String,
    /// SHA-256 of the tool's definition as the registration pinned it.
    pub definition_digest: String,
    /// SHA-256 of the arguments (redacted keys replaced, as the audit digests them).
    pub args_digest: String,
    /// Unix ms after which the approval is void.
    pub expires_at_ms: u64,
}

/// Why a call does not match the approval presented for it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("the approval is for another registration")]
    Registration,
    #[error("the approval is for another tool")]
    Tool,
    #[error(
        "the tool's definition changed since the approval was asked: a new approval is needed"
    )]
    Definition,
    #[error("the arguments differ from the ones approved: a new approval is needed")]
    Arguments,
    #[error("the approval has expired")]
    Expired,
}

impl Binding {
    /// Whether `call` (its registration, tool, definition and arguments digests) is the call
    /// this approval was given for, at `now_ms`.
    pub fn admits(&self, call: &Binding, now_ms: u64) -> Result<(), Mismatch> {
        if call.registration_id != self.registration_id {
            return Err(Mismatch::Registration);
        }
        if call.tool != self.tool {
            return Err(Mismatch::Tool);
        }
        if call.definition_digest != self.definition_digest {
            return Err(Mismatch::Definition);
        }
        if call.args_digest != self.args_digest {
            return Err(Mismatch::Arguments);
        }
        if now_ms > self.expires_at_ms {
            return Err(Mismatch::Expired);
        }
        Ok(())
    }
}

/// Who decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum By {
    Harness,
    Admin,
    Client,
    /// The gateway itself: a timeout, a release, a client that cannot be asked.
    Gatehouse,
}

impl By {
    pub fn as_str(self) -> &'static str {
        match self {
            By::Harness => "harness",
            By::Admin => "admin",
            By::Client => "client",
            By::Gatehouse => "gatehouse",
        }
    }
}

/// A decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub approve: bool,
    pub by: By,
    pub reason: Option<String>,
}

/// A held call as the admin API shows it (arguments with `redact_keys` applied).
#[derive(Debug, Clone, Serialize)]
pub struct Pending {
    pub id: String,
    pub registration_id: String,
    pub agent_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_path: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    pub tool: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// The `approve` rule that held the call.
    pub rule: String,
    /// `harness` or `client`.
    pub approver: &'static str,
    pub arguments: Value,
    pub args_digest: String,
    pub definition_digest: String,
    pub requested_at: String,
    pub expires_at: String,
}

/// Why a call could not be held.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Full {
    #[error("too many calls of this registration wait for approval (at most {0})")]
    Registration(usize),
    #[error("too many calls wait for approval (at most {0})")]
    Total(usize),
}

/// Why a decision was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    #[error("no such approval")]
    Unknown,
    #[error("approval already {0}")]
    Ended(String),
    #[error("this approval is asked of the MCP client's user, not of the harness")]
    ClientsOwn,
}

struct Entry {
    pending: Pending,
    binding: Binding,
    /// The gateway's id of the input request that asks the client (approver `client`).
    asked_as: Option<String>,
    tx: Option<oneshot::Sender<Verdict>>,
}

#[derive(Default)]
struct Table {
    entries: HashMap<String, Entry>,
    per_registration: HashMap<String, usize>,
    /// Ids decided or ended lately, with what became of them (oldest first).
    ended: VecDeque<(String, String)>,
}

impl Table {
    fn remember(&mut self, id: String, what: String) {
        if self.ended.len() >= REMEMBERED {
            self.ended.pop_front();
        }
        self.ended.push_back((id, what));
    }

    fn take(&mut self, id: &str) -> Option<Entry> {
        let e = self.entries.remove(id)?;
        let reg = &e.pending.registration_id;
        if let Some(n) = self.per_registration.get_mut(reg) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_registration.remove(reg);
            }
        }
        Some(e)
    }
}

/// The held calls of one gateway.
pub struct Approvals {
    table: Mutex<Table>,
    /// Bumped on every change (a call held, decided, or gone): what long polls wait on.
    version: watch::Sender<u64>,
    max_pending: usize,
    max_per_registration: usize,
}

impl Default for Approvals {
    fn default() -> Self {
        Approvals::new(DEFAULT_MAX_PENDING, DEFAULT_MAX_PENDING_PER_REGISTRATION)
    }
}

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn rfc3339(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(i64::try_from(ms).unwrap_or(i64::MAX))
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

impl Approvals {
    pub fn new(max_pending: usize, max_per_registration: usize) -> Approvals {
        Approvals {
            table: Mutex::new(Table::default()),
            version: watch::channel(0).0,
            max_pending,
            max_per_registration,
        }
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Holds a call: a fresh id (128 random bits), its entry announced. `pending` is filled
    /// in here (id, times); `timeout` is the wait its rule allows.
    pub fn hold(
        &self,
        mut pending: Pending,
        binding_of: impl FnOnce(u64) -> Binding,
        timeout: Duration,
    ) -> Result<Ticket<'_>, Full> {
        let mut raw = [0u8; 16];
        OsRng.fill_bytes(&mut raw);
        let id = B64.encode(raw);
        let now = now_ms();
        let expires = now.saturating_add(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        pending.id = id.clone();
        pending.requested_at = rfc3339(now);
        pending.expires_at = rfc3339(expires);
        let (tx, rx) = oneshot::channel();
        let binding = binding_of(expires);
        {
            let mut t = lock(&self.table);
            if t.entries.len() >= self.max_pending {
                return Err(Full::Total(self.max_pending));
            }
            let n = t
                .per_registration
                .get(&pending.registration_id)
                .copied()
                .unwrap_or(0);
            if n >= self.max_per_registration {
                return Err(Full::Registration(self.max_per_registration));
            }
            *t.per_registration
                .entry(pending.registration_id.clone())
                .or_default() += 1;
            t.entries.insert(
                id.clone(),
                Entry {
                    pending,
                    binding: binding.clone(),
                    asked_as: None,
                    tx: Some(tx),
                },
            );
        }
        self.bump();
        Ok(Ticket {
            approvals: self,
            binding,
            id,
            rx,
            timeout,
            held_at: tokio::time::Instant::now(),
        })
    }

    /// Decides approval `id` (the harness's, through the admin API): the waiting call gets
    /// the verdict. An approval the client is asked for is not the harness's to decide.
    pub fn decide(&self, id: &str, verdict: Verdict) -> Result<(), DecideError> {
        let entry = {
            let mut t = lock(&self.table);
            match t.entries.get(id) {
                None => {
                    return Err(match t.ended.iter().rev().find(|(i, _)| i == id) {
                        Some((_, what)) => DecideError::Ended(what.clone()),
                        None => DecideError::Unknown,
                    })
                }
                Some(e)
                    if e.pending.approver == "client"
                        && matches!(verdict.by, By::Harness | By::Admin) =>
                {
                    return Err(DecideError::ClientsOwn)
                }
                Some(_) => {}
            }
            let what = if verdict.approve {
                "approved"
            } else {
                "denied"
            };
            t.remember(id.to_string(), what.to_string());
            t.take(id)
        };
        self.bump();
        if let Some(tx) = entry.and_then(|mut e| e.tx.take()) {
            // The call may have ended meanwhile (its ticket dropped): nothing waits then.
            let _ = tx.send(verdict);
        }
        Ok(())
    }

    /// Notes that approval `id` is asked of the client as input request `request_id`.
    pub fn asked_as(&self, id: &str, request_id: &str) {
        if let Some(e) = lock(&self.table).entries.get_mut(id) {
            e.asked_as = Some(request_id.to_string());
        }
    }

    /// The approval (its id and binding) that input request `request_id` of
    /// `registration_id` asks the client about, if it is one.
    pub fn for_input(&self, registration_id: &str, request_id: &str) -> Option<(String, Binding)> {
        lock(&self.table)
            .entries
            .iter()
            .find(|(_, e)| {
                e.asked_as.as_deref() == Some(request_id)
                    && e.binding.registration_id == registration_id
            })
            .map(|(id, e)| (id.clone(), e.binding.clone()))
    }

    /// Approval `id` as it is shown, while it waits.
    pub fn get(&self, id: &str) -> Option<Pending> {
        lock(&self.table).entries.get(id).map(|e| e.pending.clone())
    }

    /// The calls waiting for a decision, oldest first.
    pub fn pending(&self) -> Vec<Pending> {
        let mut v: Vec<Pending> = lock(&self.table)
            .entries
            .values()
            .map(|e| e.pending.clone())
            .collect();
        v.sort_by(|a, b| {
            a.requested_at
                .cmp(&b.requested_at)
                .then_with(|| a.id.cmp(&b.id))
        });
        v
    }

    pub fn len(&self) -> usize {
        lock(&self.table).entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The change counter: its value now, and a receiver that wakes on the next change.
    pub fn changed(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Ends entry `id` without a decision (its call went away): remembered as `what`.
    fn end(&self, id: &str, what: &str) {
        let gone = {
            let mut t = lock(&self.table);
            let gone = t.take(id).is_some();
            if gone {
                t.remember(id.to_string(), what.to_string());
            }
            gone
        };
        if gone {
            self.bump();
        }
    }
}

/// How a held call's wait ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Waited {
    Decided(Verdict),
    /// Nobody decided within the rule's `timeout_s`.
    TimedOut(Duration),
    /// The call was cancelled (its client, or its registration's release).
    Cancelled,
}

/// A held call's hold on its entry; dropping it removes the entry (if still there).
pub struct Ticket<'a> {
    approvals: &'a Approvals,
    pub id: String,
    pub binding: Binding,
    rx: oneshot::Receiver<Verdict>,
    timeout: Duration,
    held_at: tokio::time::Instant,
}

impl Ticket<'_> {
    /// Waits for the decision, at most the rule's timeout, or until `cancel` fires.
    pub async fn wait(&mut self, cancel: &CancellationToken) -> Waited {
        let deadline = self.held_at + self.timeout;
        let waited = tokio::select! {
            // A verdict wins over a cancellation that came with it (a refused retry).
            biased;
            v = &mut self.rx => match v {
                Ok(v) => Waited::Decided(v),
                // The entry went without a verdict: only `end` does that, from this ticket.
                Err(_) => Waited::Cancelled,
            },
            () = tokio::time::sleep_until(deadline) => Waited::TimedOut(self.timeout),
            () = cancel.cancelled() => Waited::Cancelled,
        };
        match &waited {
            Waited::TimedOut(_) => self.approvals.end(&self.id, "timed out"),
            Waited::Cancelled => self.approvals.end(&self.id, "cancelled"),
            Waited::Decided(_) => {}
        }
        waited
    }

    /// How long the call has waited so far.
    pub fn waited(&self) -> Duration {
        self.held_at.elapsed()
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.approvals.end(&self.id, "ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pending(reg: &str) -> Pending {
        Pending {
            id: String::new(),
            registration_id: reg.into(),
            agent_id: "a".into(),
            agent_path: None,
            label: None,
            tool: "demo.echo".into(),
            upstream: Some("demo".into()),
            rule: "pay".into(),
            approver: "harness",
            arguments: json!({"amount": 10}),
            args_digest: "d".into(),
            definition_digest: "p".into(),
            requested_at: String::new(),
            expires_at: String::new(),
        }
    }

    fn binding(reg: &str, args: &str, exp: u64) -> Binding {
        Binding {
            registration_id: reg.into(),
            tool: "demo.echo".into(),
            definition_digest: "p".into(),
            args_digest: args.into(),
            expires_at_ms: exp,
        }
    }

    #[tokio::test]
    async fn bounds_hold_decisions_reach_the_one_call_and_late_ones_are_409() {
        let a = Approvals::new(3, 2);
        let b = |e| binding("r1", "d", e);
        let mut t1 = a.hold(pending("r1"), b, DEFAULT_TIMEOUT).unwrap();
        let t2 = a.hold(pending("r1"), b, DEFAULT_TIMEOUT).unwrap();
        assert_eq!(
            a.hold(pending("r1"), b, DEFAULT_TIMEOUT).err(),
            Some(Full::Registration(2))
        );
        let _t3 = a.hold(pending("r2"), b, DEFAULT_TIMEOUT).unwrap();
        assert_eq!(
            a.hold(pending("r3"), b, DEFAULT_TIMEOUT).err(),
            Some(Full::Total(3))
        );
        assert_eq!(a.len(), 3);
        let v = Verdict {
            approve: true,
            by: By::Harness,
            reason: None,
        };
        a.decide(&t1.id, v.clone()).unwrap();
        assert_eq!(
            t1.wait(&CancellationToken::new()).await,
            Waited::Decided(v.clone())
        );
        assert_eq!(
            a.decide(&t1.id, v.clone()),
            Err(DecideError::Ended("approved".into()))
        );
        assert_eq!(a.decide("nope", v.clone()), Err(DecideError::Unknown));
        // A dropped ticket (its call went away) leaves nothing behind.
        let id2 = t2.id.clone();
        drop(t2);
        assert_eq!(a.decide(&id2, v), Err(DecideError::Ended("ended".into())));
        assert_eq!(a.len(), 1);
        assert!(!lock(&a.table).per_registration.contains_key("r1"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_timeout_or_a_cancel_ends_the_wait() {
        let a = Approvals::default();
        let b = |e| binding("r", "d", e);
        let mut t = a.hold(pending("r"), b, Duration::from_secs(2)).unwrap();
        assert_eq!(
            t.wait(&CancellationToken::new()).await,
            Waited::TimedOut(Duration::from_secs(2))
        );
        assert!(a.is_empty());
        let mut t = a.hold(pending("r"), b, Duration::from_secs(2)).unwrap();
        let c = CancellationToken::new();
        c.cancel();
        assert_eq!(t.wait(&c).await, Waited::Cancelled);
        assert!(a.is_empty());
    }

    #[test]
    fn a_binding_admits_its_own_call_only() {
        let ok = binding("r", "d", 100);
        assert_eq!(ok.admits(&binding("r", "d", 0), 50), Ok(()));
        assert_eq!(
            ok.admits(&binding("r", "x", 0), 50),
            Err(Mismatch::Arguments)
        );
        assert_eq!(
            ok.admits(&binding("q", "d", 0), 50),
            Err(Mismatch::Registration)
        );
        let mut other = binding("r", "d", 0);
        other.definition_digest = "changed".into();
        assert_eq!(ok.admits(&other, 50), Err(Mismatch::Definition));
        assert_eq!(
            ok.admits(&binding("r", "d", 0), 101),
            Err(Mismatch::Expired)
        );
    }
}
