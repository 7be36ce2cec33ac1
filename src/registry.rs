//! Registrations: their ids and tokens, the table that holds them, and scoped lookup.
//!
//! Invariant: a token is compared (in constant time) with its own registration's token only;
//! lookup is by id first, never by searching tokens.

use crate::sync::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use rand::rngs::OsRng;
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::audit::Record;
use crate::tools::{InProcessTool, ToolSet};

/// Random bytes from the OS CSPRNG, base64url without padding.
pub fn random_b64(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    OsRng.fill_bytes(&mut buf);
    URL_SAFE_NO_PAD.encode(buf)
}

/// A registration id: 128 bits.
pub fn new_registration_id() -> String {
    random_b64(16)
}

/// A registration id of a node: `<node>.<128 random bits, base64url>` with a node id
/// (`[a-z0-9]`, see `config::valid_node_id`), else a plain [`new_registration_id`]. `.` is in
/// neither part, so the node is everything before the first `.` (DESIGN.md §8).
pub fn new_registration_id_on(node: Option<&str>) -> String {
    match node {
        Some(node) => format!("{node}.{}", new_registration_id()),
        None => new_registration_id(),
    }
}

/// Is `id` shaped like a registration id: base64url characters, optionally after a node
/// prefix `<[a-z0-9]+>.`? (A shape check for fast paths; the registry decides what exists.)
pub fn id_shaped(id: &str) -> bool {
    // One table lookup per byte (the id, 22 bytes or more, is read on every request).
    const B64URL: [bool; 256] = {
        let mut t = [false; 256];
        let mut c = 0;
        while c < 256 {
            let b = c as u8;
            t[c] = b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
            c += 1;
        }
        t
    };
    let plain = |s: &str| !s.is_empty() && s.bytes().all(|c| B64URL[usize::from(c)]);
    // A byte scan for the `.`: a `str` search sets up a searcher that costs more than this
    // short id (it runs on every request). A `.` is one byte, so both halves are `str`s.
    match id.bytes().position(|c| c == b'.') {
        None => plain(id),
        Some(dot) => crate::config::valid_node_id(&id[..dot]) && plain(&id[dot + 1..]),
    }
}

/// A bearer token: 256 bits.
pub fn new_token() -> String {
    random_b64(32)
}

fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Limits bound to a registration (not to a session, so reconnecting does not reset them).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_timeout_s: Option<f64>,
}

/// A root the harness sets for an execution (MCP `Root`): what `roots/list` from an upstream
/// this registration owns answers, instead of asking the agent's client.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Root {
    /// A `file://` URI.
    pub uri: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Root {
    pub fn new(uri: impl Into<String>) -> Self {
        Root {
            uri: uri.into(),
            name: None,
        }
    }

    pub fn named(uri: impl Into<String>, name: impl Into<String>) -> Self {
        Root {
            uri: uri.into(),
            name: Some(name.into()),
        }
    }
}

/// Most roots one registration may set.
pub const MAX_ROOTS: usize = 64;

/// Checks a registration's roots: at most [`MAX_ROOTS`], each a `file://` URI of at most
/// 4,096 bytes and a name of at most 256, neither with control characters.
pub fn validate_roots(roots: &[Root]) -> Result<(), String> {
    if roots.len() > MAX_ROOTS {
        return Err(format!(
            "roots: at most {MAX_ROOTS} roots (got {})",
            roots.len()
        ));
    }
    for (i, r) in roots.iter().enumerate() {
        if !r.uri.starts_with("file://")
            || r.uri.len() > 4096
            || r.uri.chars().any(char::is_control)
        {
            return Err(format!(
                "roots[{i}].uri: must be a file:// URI of at most 4096 bytes without control characters"
            ));
        }
        if let Some(n) = &r.name {
            if n.len() > 256 || n.chars().any(char::is_control) {
                return Err(format!(
                    "roots[{i}].name: at most 256 bytes without control characters"
                ));
            }
        }
    }
    Ok(())
}

/// What a harness asks for when it registers an execution.
#[derive(Debug, Clone, Default)]
pub struct RegistrationSpec {
    pub agent_id: String,
    /// Grants: `upstream.tool`, `upstream.*`, or in-process tool names of the gateway catalog.
    pub tools: Vec<String>,
    pub label: Option<String>,
    pub ttl_s: Option<u64>,
    pub limits: Limits,
    /// Tools private to this registration (always granted).
    pub local_tools: Vec<InProcessTool>,
    /// The execution's roots, set by the harness: upstreams this registration owns
    /// (`per_registration`, or its lease) get them for `roots/list`, and the agent's client
    /// is not asked. None: `roots/list` goes to a session whose client declared `roots`.
    pub roots: Option<Vec<Root>>,
    /// The id of a live registration this one is a child of (a sub-agent): its grants must
    /// be a subset of the parent's tools, its TTL and limits at most the parent's, its calls
    /// count against the parent's budget too, and it is released with the parent.
    pub parent: Option<String>,
}

impl RegistrationSpec {
    /// Makes this a child of the live registration `id`.
    pub fn parent(mut self, id: impl Into<String>) -> Self {
        self.parent = Some(id.into());
        self
    }

    pub fn new(agent_id: impl Into<String>) -> Self {
        RegistrationSpec {
            agent_id: agent_id.into(),
            ..Default::default()
        }
    }

    /// Grants a tool by name or glob.
    pub fn grant(mut self, pattern: impl Into<String>) -> Self {
        self.tools.push(pattern.into());
        self
    }

    /// Gives this registration its own in-process tool.
    pub fn with_tool(mut self, tool: InProcessTool) -> Self {
        self.local_tools.push(tool);
        self
    }

    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    pub fn ttl_s(mut self, ttl: u64) -> Self {
        self.ttl_s = Some(ttl);
        self
    }

    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Sets the execution's roots (answered to `roots/list` from upstreams it owns).
    pub fn roots(mut self, roots: Vec<Root>) -> Self {
        self.roots = Some(roots);
        self
    }
}

/// The live state of one registration. Shared by the registry, its sessions and its calls.
pub struct RegistrationState {
    pub id: String,
    token_digest: [u8; 32],
    pub agent_id: Arc<str>,
    pub label: Option<String>,
    pub tools: ToolSet,
    /// The grants as registered (`<upstream>.*`, `<upstream>.tool`, in-process names); the
    /// upstreams they name are the ones whose resources and prompts this registration sees.
    pub grants: Vec<String>,
    pub limits: Limits,
    /// The roots the harness set (`RegistrationSpec::roots`).
    pub roots: Option<Vec<Root>>,
    pub ttl_s: Option<u64>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// Unix ms at which the lease ends (0 = never). Renewing moves it.
    pub expires_at_ms: AtomicU64,
    /// Fires on release ([`RegistrationState::release`]): ends streams, cancels calls.
    pub cancel: CancellationToken,
    /// Set by [`RegistrationState::release`] before `cancel` fires: what a call reads to know
    /// (the token's `is_cancelled` takes its mutex, which every call of the registration shares).
    released: AtomicBool,
    /// Every call of this registration runs on this tracker, so release can wait for them.
    pub calls: TaskTracker,
    pub calls_started: AtomicU64,
    /// Calls of `max_calls` this node holds from the store (`store::Store::reserve`) and has
    /// not spent: a call takes one (compare-and-set); when none is left, another block is
    /// reserved under `budget`. A cluster node gives an idle block back by taking it all at
    /// once (a swap), so a call can never spend a call that was given back (issue 50).
    pub calls_left: AtomicU64,
    /// The calls of `max_calls` the store has handed out (to every node), as last known here:
    /// when none is left here and this says the budget is spent, a call is refused without
    /// asking the store. A cluster node learns it from the replicated registration (a block
    /// given back elsewhere lowers it); a single node counts its own reservations.
    pub store_reserved: AtomicU64,
    /// Held while a block is reserved, so that concurrent calls reserve one block, not many.
    pub budget: tokio::sync::Mutex<()>,
    pub calls_in_flight: AtomicUsize,
    /// The tools' definitions as granted, by digest, and their drift since (`pins`).
    pub pins: crate::pins::Pins,
    /// The family: the parent (a child's calls count against every ancestor's limits), the
    /// agent ids from the root down (in a child's audit records), the live children's ids,
    /// and the children closed with this one, which its release finishes first.
    pub family: Family,
}

/// A registration's place in its family of sub-agents.
#[derive(Debug, Default)]
pub struct Family {
    pub parent: Option<Arc<RegistrationState>>,
    /// The agent ids from the root registration down to this one (None for a root).
    pub agent_path: Option<Vec<String>>,
    /// 0 for a root registration.
    pub depth: usize,
    pub(crate) children: Mutex<Vec<String>>,
    pub(crate) closed_children: Mutex<Vec<Arc<RegistrationState>>>,
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
        crate::sync::lock(&self.children).clone()
    }

    /// The ancestors, nearest first.
    pub fn ancestors(&self) -> impl Iterator<Item = &Arc<RegistrationState>> {
        std::iter::successors(self.parent.as_ref(), |p| p.family.parent.as_ref())
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
            pins: crate::pins::Pins::of(&tools),
            family: Family::default(),
            tools,
            grants: spec.tools.clone(),
            limits: spec.limits.clone(),
            roots: spec.roots.clone(),
            ttl_s: spec.ttl_s,
            created_at,
            expires_at_ms: AtomicU64::new(expires),
            cancel: CancellationToken::new(),
            released: AtomicBool::new(false),
            calls: TaskTracker::new(),
            calls_started: AtomicU64::new(0),
            // The whole budget in hand (a store that dies with the process); `register` sets
            // the first block of a durable store.
            calls_left: AtomicU64::new(spec.limits.max_calls.unwrap_or(0)),
            store_reserved: AtomicU64::new(spec.limits.max_calls.unwrap_or(0)),
            budget: tokio::sync::Mutex::new(()),
            calls_in_flight: AtomicUsize::new(0),
        }
    }

    /// A registration read back from the store (`spec` holds what the harness asked for):
    /// its token digest, times and budget as stored (calls reserved before the restart count
    /// as spent: a crash loses the block in hand, never gives calls back).
    pub(crate) fn restored(
        id: String,
        token_sha256: [u8; 32],
        spec: &RegistrationSpec,
        tools: ToolSet,
        created_at_ms: i64,
        expires_at_ms: u64,
        calls_reserved: u64,
    ) -> Self {
        let created_at =
            chrono::DateTime::from_timestamp_millis(created_at_ms).unwrap_or_else(chrono::Utc::now);
        let mut state = RegistrationState::new(id, "", spec, tools);
        state.token_digest = token_sha256;
        state.created_at = created_at;
        state.expires_at_ms = AtomicU64::new(expires_at_ms);
        state.calls_started = AtomicU64::new(calls_reserved);
        state.calls_left = AtomicU64::new(0);
        state.store_reserved = AtomicU64::new(calls_reserved);
        state
    }

    /// Takes one call of the block in hand (false: none left here).
    pub(crate) fn take_call_in_hand(&self) -> bool {
        let took = self
            .calls_left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if took {
            self.calls_started.fetch_add(1, Ordering::AcqRel);
        }
        took
    }

    /// The SHA-256 digest of the token (what the store keeps; never the token).
    pub(crate) fn token_sha256(&self) -> [u8; 32] {
        self.token_digest
    }

    /// Takes every reserved call not spent out of this node's hand (to give it back to the
    /// store: a clean stop, or an idle block on a cluster node); no call can spend them after.
    pub(crate) fn take_unspent(&self) -> u64 {
        if self.limits.max_calls.is_none() {
            return 0;
        }
        self.calls_left.swap(0, Ordering::AcqRel)
    }

    /// Marks the registration released and fires its token (streams end, calls are cancelled).
    pub(crate) fn release(&self) {
        self.released.store(true, Ordering::Release);
        self.cancel.cancel();
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
    pub fn audit_record<'a>(&'a self, event: &'a str) -> Record<'a> {
        let mut r = Record::about(event, &self.id, &self.agent_id, self.label.as_deref());
        if let Some(p) = &self.family.parent {
            let rare = r.rare_mut();
            rare.parent_registration_id = Some(p.id.as_str().into());
            rare.agent_path = self.family.agent_path.as_deref().map(Into::into);
        }
        r
    }

    /// The expiry as RFC 3339, if the registration has a TTL.
    pub fn expires_at(&self) -> Option<String> {
        let ms = self.expires_at_ms.load(Ordering::Relaxed);
        (ms != 0)
            .then(|| chrono::DateTime::from_timestamp_millis(ms as i64))
            .flatten()
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
    }
}

/// The table of live registrations, keyed by id.
#[derive(Default)]
pub struct Registry {
    map: Mutex<HashMap<String, Arc<RegistrationState>>>,
    /// The ids released lately, so that a refusal can say `released` rather than
    /// `unknown_registration` (for the operators only: both are the same 404).
    released: Mutex<RecentIds>,
}

/// The slots of the released-id memory (a 64-bit digest each: 64 KiB, allocated with the
/// registry, so that releasing grows nothing).
pub const RELEASED_SLOTS: usize = 8192;

/// A fixed memory of released ids, direct-mapped by a 64-bit digest: an id stays until a
/// later one lands in its slot (after N later releases it is still there with probability
/// ≈ e^(−N/8192): the last few thousand releases). A digest collision only names a refusal's
/// reason wrong; nothing is decided by it.
struct RecentIds {
    slots: Box<[u64]>,
    hasher: foldhash::fast::RandomState,
}

impl Default for RecentIds {
    fn default() -> Self {
        RecentIds {
            slots: vec![0; RELEASED_SLOTS].into_boxed_slice(),
            hasher: Default::default(),
        }
    }
}

impl RecentIds {
    /// The id's digest (never 0, the empty slot) and its slot.
    fn digest(&self, id: &str) -> (u64, usize) {
        let d = std::hash::BuildHasher::hash_one(&self.hasher, id) | 1;
        (d, (d >> 1) as usize % self.slots.len())
    }

    fn remember(&mut self, id: &str) {
        let (d, slot) = self.digest(id);
        self.slots[slot] = d;
    }

    fn contains(&self, id: &str) -> bool {
        let (d, slot) = self.digest(id);
        self.slots[slot] == d
    }
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<RegistrationState>>> {
        // A poisoned lock only means another thread panicked mid-update of a plain map insert
        // or remove; the map itself is still consistent.
        crate::sync::lock(&self.map)
    }

    pub fn get(&self, id: &str) -> Option<Arc<RegistrationState>> {
        self.lock().get(id).cloned()
    }

    pub(crate) fn insert(&self, state: Arc<RegistrationState>) {
        self.lock().insert(state.id.clone(), state);
    }

    pub(crate) fn remove(&self, id: &str) -> Option<Arc<RegistrationState>> {
        let mut map = self.lock();
        let removed = map.remove(id);
        if map.is_empty() {
            map.shrink_to(0);
        }
        drop(map);
        if removed.is_some() {
            crate::sync::lock(&self.released).remember(id);
        }
        removed
    }

    /// Was `id` released lately (see [`RELEASED_SLOTS`])?
    pub fn was_released(&self, id: &str) -> bool {
        crate::sync::lock(&self.released).contains(id)
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    pub fn all(&self) -> Vec<Arc<RegistrationState>> {
        let mut v: Vec<_> = self.lock().values().cloned().collect();
        v.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_block_given_back_is_never_spent_by_a_racing_call() {
        // Issue 50: a cluster node gives an idle block back while calls may be taking from
        // it; every call of the block is either spent here or given back, never both.
        for _ in 0..200 {
            let mut spec = RegistrationSpec::new("agent");
            spec.limits.max_calls = Some(1000);
            let reg = Arc::new(RegistrationState::new(
                "r".into(),
                "t",
                &spec,
                ToolSet::default(),
            ));
            reg.calls_left.store(64, Ordering::Release);
            let takers: Vec<_> = (0..4)
                .map(|_| {
                    let reg = reg.clone();
                    std::thread::spawn(move || {
                        let mut n = 0u64;
                        while reg.take_call_in_hand() {
                            n += 1;
                        }
                        n
                    })
                })
                .collect();
            let given = reg.take_unspent();
            let spent: u64 = takers.into_iter().map(|t| t.join().unwrap_or(0)).sum();
            assert_eq!(spent + given, 64, "spent {spent} + given back {given}");
            assert_eq!(reg.calls_started.load(Ordering::Acquire), spent);
            assert!(!reg.take_call_in_hand(), "nothing left after the give back");
        }
    }

    #[test]
    fn ids_and_tokens_are_long_and_distinct() {
        let a = new_registration_id();
        let b = new_registration_id();
        assert_ne!(a, b);
        assert_eq!(URL_SAFE_NO_PAD.decode(&a).map(|v| v.len()).ok(), Some(16));
        let t = new_token();
        assert_eq!(URL_SAFE_NO_PAD.decode(&t).map(|v| v.len()).ok(), Some(32));
    }

    #[test]
    fn node_ids_prefix_the_random_part_and_keep_128_bits() {
        assert_eq!(new_registration_id_on(None).len(), 22);
        let a = new_registration_id_on(Some("n1"));
        let (node, random) = a.split_once('.').unwrap();
        assert_eq!(node, "n1");
        assert_eq!(
            URL_SAFE_NO_PAD.decode(random).map(|v| v.len()).ok(),
            Some(16)
        );
        assert!(!random.contains('.'));
        assert_ne!(a, new_registration_id_on(Some("n1")));
        for id in [a.as_str(), "abc", "-x_Y", "n1.-x", "0.a"] {
            assert!(id_shaped(id), "{id}");
        }
        for id in [
            "", ".", "n1.", ".abc", "N1.abc", "a.b.c", "..", "a-b.c", "a%2Eb", "a/b",
        ] {
            assert!(!id_shaped(id), "{id}");
        }
    }

    #[test]
    fn released_ids_are_remembered_within_the_bound() {
        let reg = Registry::default();
        let spec = RegistrationSpec::new("a");
        let st = Arc::new(RegistrationState::new(
            "r1".into(),
            "t",
            &spec,
            ToolSet::default(),
        ));
        reg.insert(st);
        assert!(!reg.was_released("r1"));
        assert!(reg.remove("r1").is_some());
        assert!(reg.was_released("r1") && !reg.was_released("r2"));
        // A fixed table: the newest ids are there, most of a table's worth back still are,
        // the oldest mostly gone, and the memory never grows.
        let mut recent = RecentIds::default();
        let n = 4 * RELEASED_SLOTS;
        for i in 0..n {
            recent.remember(&format!("id{i}"));
        }
        assert_eq!(recent.slots.len(), RELEASED_SLOTS);
        assert!(recent.contains(&format!("id{}", n - 1)));
        let last = (n - 1000..n)
            .filter(|i| recent.contains(&format!("id{i}")))
            .count();
        assert!(last > 850, "{last} of the last 1,000");
        let old = (0..1000)
            .filter(|i| recent.contains(&format!("id{i}")))
            .count();
        assert!(old < 100, "{old} of the oldest 1,000");
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
