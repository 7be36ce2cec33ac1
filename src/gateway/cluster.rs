//! A cluster node on etcd (cargo feature `cluster`; issue 36, CLUSTER.md §5.3-5.5).
//!
//! Started by every `Gateway` whose store is `etcd` (the daemon's and an embedded one alike:
//! `Gateway::new` inside a tokio runtime). Four tasks, owned by the gateway (its task
//! tracker; they hold it weakly) and ended by its shutdown:
//! - **replicate**: a range read of the whole prefix (registrations and heartbeats) at a
//!   revision R0, reconciled into the registry (`gateway::replica`), then a watch from R0+1
//!   applied event by event. A compacted or cancelled watch, or a broken stream, goes back to
//!   the range read. The applied revision advances only through applied events (or a
//!   completed read), never on a timeout.
//! - **heartbeat**: every `cluster.heartbeat_ms` (and at once after applying a release or
//!   a registration new here: its releaser or creator waits for it), the
//!   node writes `beat/<node>` = {seq, applied} on a lease of its own, noting the monotonic
//!   time t_b before the write. When the watch brings that write back, every write
//!   committed before t_b has been applied: the node is fresh until t_b + B.
//! - **fence**: every 10 ms, closes the fence (`fence::Fence`: 503, calls cancelled, sessions
//!   and their streams closed) once the freshness proof has run out, and opens it when a new
//!   one arrives.
//! - **budget**: gives back to the store a `max_calls` block not drawn from for B, so the
//!   budget follows the traffic to other nodes (issue 50).
//!
//! Requests are served from the registry; nothing here is on a request's path.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{EventType, PutOptions, WatchOptions};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{Gateway, GatewayError, Inner};
use crate::audit::Record;
use crate::hub::Hub;
use crate::store::etcd::{decode, EtcdStore};
use crate::sync::lock;

/// Heartbeats whose send time is remembered (a watch further behind proves nothing new).
const PENDING_BEATS: usize = 256;

#[derive(Debug, Serialize, Deserialize)]
struct Beat {
    seq: u64,
    applied: i64,
}

struct Node {
    /// The gateway, held weakly: its last handle dropped ends these tasks.
    gw: std::sync::Weak<Inner>,
    hub: Arc<Hub>,
    store: Arc<EtcdStore>,
    id: String,
    bound: Duration,
    beat_every: Duration,
    /// The last revision applied (through an event or a full read).
    applied: AtomicI64,
    /// Until when the last proof of freshness holds.
    fresh_until: Mutex<Option<Instant>>,
    /// Heartbeats written and not yet seen back: (seq, time before the write).
    pending: Mutex<VecDeque<(u64, Instant)>>,
    /// Asks for a heartbeat now (after a release is applied: the releasing node waits).
    beat_now: tokio::sync::Notify,
    /// A heartbeat was written (the first one comes before the first read of the store).
    first_beat: tokio::sync::Notify,
}

impl Node {
    fn gw(&self) -> Option<Gateway> {
        self.gw.upgrade().map(|inner| Gateway { inner })
    }

    /// The gateway is gone (its last handle dropped without a shutdown).
    fn orphaned(&self) -> bool {
        self.gw.strong_count() == 0
    }

    fn beat_key(&self, node: &str) -> String {
        format!("{}beat/{node}", self.store.prefix())
    }

    /// The applied revision, told to the fence (this node's own ack) and the audit.
    fn published(&self) {
        let applied = self.applied.load(Ordering::Acquire);
        self.hub.fence().peer_applied(&self.id, applied);
        self.store.set_live(self.hub.fence().live());
        let applied = u64::try_from(applied).unwrap_or(0);
        // What a call admitted from now on records as its decision's revision.
        self.hub.fence().set_applied(applied);
        self.hub.audit().set_store_revision(applied);
    }

    fn proved(&self, at: Instant) {
        let until = at + self.bound;
        let mut f = lock(&self.fresh_until);
        if f.is_none_or(|old| old < until) {
            *f = Some(until);
        }
    }

    fn is_fresh(&self) -> bool {
        lock(&self.fresh_until).is_some_and(|f| Instant::now() < f)
    }

    fn own_beat(&self, seq: u64) {
        let mut at = None;
        {
            let mut pending = lock(&self.pending);
            while let Some(&(s, t)) = pending.front() {
                if s > seq {
                    break;
                }
                pending.pop_front();
                if s == seq {
                    at = Some(t);
                }
            }
        }
        if let Some(t) = at {
            self.proved(t);
        }
    }

    /// Applies one watch event. True if it ended a registration or began serving one (its
    /// releaser or creator waits for this node's heartbeat to say so).
    fn apply(&self, kind: EventType, key: &str, value: &[u8], revision: i64) -> bool {
        let Some(rest) = key.strip_prefix(self.store.prefix()) else {
            return false;
        };
        let mut ack = false;
        if let Some(id) = rest.strip_prefix("reg/") {
            let Some(gw) = self.gw() else { return false };
            match kind {
                EventType::Put => match decode(value) {
                    Some(s) => match gw.adopt(s) {
                        Ok(new) => ack = new,
                        Err(e) => {
                            tracing::error!(registration = %id, error = %e, "replicated registration not served");
                        }
                    },
                    None => tracing::warn!(registration = %id, "store value not understood"),
                },
                EventType::Delete => {
                    gw.drop_replica(
                        id,
                        "released on another node, or its etcd lease ended",
                        u64::try_from(revision).ok(),
                    );
                    ack = true;
                }
            }
        } else if let Some(node) = rest.strip_prefix("beat/") {
            let fence = self.hub.fence();
            match kind {
                EventType::Put => {
                    if let Ok(b) = serde_json::from_slice::<Beat>(value) {
                        if node == self.id {
                            self.own_beat(b.seq);
                        } else {
                            fence.peer_applied(node, b.applied);
                        }
                    }
                }
                EventType::Delete => fence.peer_gone(node),
            }
        }
        self.applied.fetch_max(revision, Ordering::AcqRel);
        ack
    }

    /// The whole prefix at one revision: registrations, peers' applied revisions, revision.
    async fn full_read(
        &self,
    ) -> Result<(Vec<crate::registration::Record>, BTreeMap<String, i64>, i64), String> {
        let resp = self
            .store
            .read(self.store.prefix().to_string(), true)
            .await
            .map_err(|e| e.to_string())?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let mut regs = Vec::new();
        let mut peers = BTreeMap::new();
        for kv in resp.kvs() {
            let Ok(key) = kv.key_str() else { continue };
            let Some(rest) = key.strip_prefix(self.store.prefix()) else {
                continue;
            };
            if rest.starts_with("reg/") {
                if let Some(s) = decode(kv.value()) {
                    regs.push(s);
                }
            } else if let Some(node) = rest.strip_prefix("beat/") {
                if let Ok(b) = serde_json::from_slice::<Beat>(kv.value()) {
                    peers.insert(node.to_string(), b.applied);
                }
            }
        }
        Ok((regs, peers, rev))
    }
}

impl Gateway {
    /// Starts the node's tasks (a `Gateway` with the `etcd` store, as it is built; inside a
    /// tokio runtime). The node is fenced until its first proof of freshness.
    pub(super) fn start_cluster(&self) -> Result<(), GatewayError> {
        let gw = self;
        let Some(store) = gw.etcd().cloned() else {
            return Ok(());
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(GatewayError::Config(crate::config::ConfigError::Invalid(
                "store.backend = \"etcd\": the gateway replicates the store in tasks of its own; build it inside a tokio runtime"
                    .into(),
            )));
        }
        let config = gw.config().clone();
        // `Config::validate` refused an etcd store without `node_id`.
        let id = config.node_id.clone().unwrap_or_default();
        let node = Arc::new(Node {
            gw: Arc::downgrade(&gw.inner),
            hub: gw.hub().clone(),
            store,
            id,
            bound: Duration::from_millis(config.cluster.release_bound_ms),
            beat_every: Duration::from_millis(config.cluster.heartbeat_ms),
            applied: AtomicI64::new(0),
            fresh_until: Mutex::new(None),
            pending: Mutex::new(VecDeque::new()),
            beat_now: tokio::sync::Notify::new(),
            first_beat: tokio::sync::Notify::new(),
        });
        gw.hub().fence().enable(&node.id);
        gw.hub().metrics().set_fenced(true);
        let stop = gw.shutdown_token();
        gw.spawn_owned(heartbeat(node.clone(), stop.clone()));
        gw.spawn_owned(replicate(node.clone(), stop.clone()));
        gw.spawn_owned(budget_keeper(node.clone(), stop.clone()));
        gw.spawn_owned(fence_keeper(node, stop));
        Ok(())
    }
}

impl Gateway {
    /// A cluster node: waits (`wait` at most) for its first proof of freshness. Returns how
    /// many registrations it serves, and whether it is fresh.
    pub(crate) async fn cluster_ready(&self, wait: Duration) -> (usize, bool) {
        let deadline = Instant::now() + wait;
        while self.hub().fence().is_fenced() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (self.registry().len(), !self.hub().fence().is_fenced())
    }
}

async fn replicate(node: Arc<Node>, stop: CancellationToken) {
    // The node's heartbeat key exists before it first reads the store: a release committed
    // after that read is waited for by its releaser (who sees this node among the live ones
    // once it has applied the release's revision), and one committed before it is in the read.
    tokio::select! {
        _ = stop.cancelled() => return,
        _ = tokio::time::timeout(Duration::from_secs(10), node.first_beat.notified()) => {}
    }
    let mut failing = false;
    loop {
        if stop.is_cancelled() {
            return;
        }
        let Some(gw) = node.gw() else { return };
        let before = gw.served_ids();
        let t0 = Instant::now();
        let (regs, peers, rev) = match node.full_read().await {
            Ok(r) => r,
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "cluster: store not readable; retrying");
                    failing = true;
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(node.beat_every) => continue,
                }
            }
        };
        let dropped = gw.reconcile(before, regs, u64::try_from(rev).ok());
        node.hub.fence().set_peers(peers);
        node.applied.fetch_max(rev, Ordering::AcqRel);
        node.published();
        // Creators and releasers waiting on this node hear of the read's revision now.
        node.beat_now.notify_one();
        // A linearizable read that completed proves what a heartbeat proves.
        node.proved(t0);
        if failing || dropped > 0 {
            tracing::info!(
                revision = rev,
                registrations = gw.registry().len(),
                dropped,
                "cluster: store read and reconciled"
            );
            failing = false;
        }
        drop(gw);
        let (member, mut c) = match node.store.client().await {
            Ok(c) => c,
            Err(_) => continue,
        };
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(node.applied.load(Ordering::Acquire) + 1);
        // In a task of its own, aborted if it outlives the wait: etcd-client asserts (panics)
        // when the watch's first answer is not a creation, and that must not end this loop.
        let prefix = node.store.prefix().to_string();
        let mut create = tokio::spawn(async move { c.watch(prefix, Some(opts)).await });
        let watched = tokio::select! {
            _ = stop.cancelled() => {
                create.abort();
                return;
            }
            w = tokio::time::timeout(node.bound.max(Duration::from_secs(1)), &mut create) => w,
        };
        if watched.is_err() {
            create.abort();
        }
        let (_watcher, mut stream) = match watched {
            Ok(Ok(Ok(w))) => w,
            failed => {
                match failed {
                    Ok(Ok(Err(e))) => node.store.trouble(member, &e),
                    // No answer within the wait: the member is not serving.
                    _ => node.store.move_on(member),
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(node.beat_every) => continue,
                }
            }
        };
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => return,
                m = stream.message() => m,
            };
            let resp = match msg {
                Ok(Some(r)) => r,
                Ok(None) | Err(_) => {
                    node.store.move_on(member);
                    tracing::warn!("cluster: watch ended; reading the store again");
                    break;
                }
            };
            if resp.compact_revision() > 0 || resp.canceled() {
                tracing::warn!(
                    compacted = resp.compact_revision(),
                    reason = resp.cancel_reason(),
                    "cluster: watch cancelled; reading the store again"
                );
                break;
            }
            let mut ack = false;
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                let Ok(key) = kv.key_str() else { continue };
                ack |= node.apply(ev.event_type(), key, kv.value(), kv.mod_revision());
            }
            node.published();
            if ack {
                node.beat_now.notify_one();
            }
        }
    }
}

async fn heartbeat(node: Arc<Node>, stop: CancellationToken) {
    let mut seq = 0u64;
    let mut failing = false;
    let mut lease: Option<i64> = None;
    let mut last_keep = Instant::now();
    let lease_ttl = i64::try_from(node.bound.as_secs().max(1) * 3)
        .unwrap_or(3)
        .max(3);
    let mut first = true;
    loop {
        if !first {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(node.beat_every) => {}
                _ = node.beat_now.notified() => {}
            }
        }
        first = false;
        if node.orphaned() {
            // Its gateway was dropped without a shutdown: the other tasks end with this.
            stop.cancel();
            break;
        }
        let Ok((member, mut c)) = node.store.client().await else {
            continue;
        };
        let id = match lease {
            Some(id) if last_keep.elapsed() < Duration::from_secs(1) => id,
            Some(id) => {
                // Kept alive once a second; a lease that ended (a long cut) is replaced.
                let keep = async {
                    let (mut keeper, mut stream) = c.lease_keep_alive(id).await?;
                    keeper.keep_alive().await?;
                    Ok::<_, etcd_client::Error>(
                        matches!(stream.message().await?, Some(r) if r.ttl() > 0),
                    )
                };
                // Bounded: a stream's message has no request timeout of its own.
                let alive = match tokio::time::timeout(node.bound, keep).await {
                    Ok(Ok(alive)) => alive,
                    Ok(Err(e)) => {
                        node.store.trouble(member, &e);
                        false
                    }
                    Err(_) => {
                        node.store.move_on(member);
                        false
                    }
                };
                if !alive {
                    lease = None;
                    continue;
                }
                last_keep = Instant::now();
                id
            }
            None => match c.lease_grant(lease_ttl, None).await {
                Ok(l) => {
                    lease = Some(l.id());
                    last_keep = Instant::now();
                    l.id()
                }
                Err(e) => {
                    node.store.trouble(member, &e);
                    if !failing {
                        tracing::warn!(error = %e, "cluster: heartbeat lease not granted; retrying");
                        failing = true;
                    }
                    continue;
                }
            },
        };
        seq += 1;
        let beat = Beat {
            seq,
            applied: node.applied.load(Ordering::Acquire),
        };
        let Ok(value) = serde_json::to_vec(&beat) else {
            continue;
        };
        {
            let mut pending = lock(&node.pending);
            if pending.len() >= PENDING_BEATS {
                pending.pop_front();
            }
            pending.push_back((seq, Instant::now()));
        }
        let put = c.put(
            node.beat_key(&node.id),
            value,
            Some(PutOptions::new().with_lease(id)),
        );
        match put.await {
            Ok(_) => {
                node.first_beat.notify_one();
                if failing {
                    tracing::info!("cluster: heartbeats written again");
                    failing = false;
                }
            }
            Err(e) => {
                node.store.trouble(member, &e);
                if !failing {
                    tracing::warn!(error = %e, "cluster: heartbeat not written; retrying");
                    failing = true;
                }
                // Perhaps the lease ended: a new one next time (an unknown lease fails the put).
                lease = None;
            }
        }
    }
    // A clean stop: the heartbeat's lease ends now, so peers stop waiting for this node.
    if let (Some(id), Ok((_, mut c))) = (lease, node.store.client().await) {
        let _ = tokio::time::timeout(Duration::from_millis(500), c.lease_revoke(id)).await;
    }
}

/// Gives back to the store each `max_calls` block this node holds and has not drawn from for
/// the bound B (issue 50): the traffic moved to other nodes, which can then reserve it. The
/// block is first taken out of the node's hand (a swap), so it is never spent twice; a give
/// back that fails loses it (the budget is never exceeded, only under-spent).
async fn budget_keeper(node: Arc<Node>, stop: CancellationToken) {
    use std::collections::HashMap;
    let idle = node.bound;
    let tick = (idle / 4).max(Duration::from_millis(10));
    // Registration id → (its calls started when last seen changing, since when).
    let mut seen: HashMap<String, (u64, Instant)> = HashMap::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(tick) => {}
        }
        let Some(gw) = node.gw() else { return };
        let now = Instant::now();
        let mut due = Vec::new();
        let mut holding = std::collections::HashSet::new();
        for reg in gw.registry().all() {
            if reg.limits.max_calls.is_none() || reg.budget().in_hand() == 0 {
                continue;
            }
            holding.insert(reg.id.clone());
            let started = reg.budget().started();
            let e = seen.entry(reg.id.clone()).or_insert((started, now));
            if e.0 != started {
                *e = (started, now);
            } else if now.duration_since(e.1) >= idle {
                due.push(reg);
            }
        }
        seen.retain(|id, _| holding.contains(id));
        for reg in due {
            seen.remove(&reg.id);
            let unused = reg.take_unspent();
            if unused == 0 {
                continue;
            }
            match gw.store().give_back(&reg.id, unused).await {
                Ok(()) => {
                    tracing::debug!(registration = %reg.id, unused, "cluster: idle budget block given back")
                }
                Err(e) => {
                    tracing::warn!(registration = %reg.id, unused, error = %e, "cluster: idle budget block not given back (lost: never over max_calls)")
                }
            }
        }
    }
}

async fn fence_keeper(node: Arc<Node>, stop: CancellationToken) {
    let fence = node.hub.fence();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        if node.orphaned() {
            return;
        }
        if node.is_fresh() {
            if fence.open() {
                node.hub.metrics().set_fenced(false);
                tracing::info!(node = %node.id, "cluster: fresh again; serving");
                let _ = node
                    .hub
                    .audit()
                    .record(Record::event("node_unfenced"))
                    .await;
            }
        } else {
            let closed = fence.close();
            // Its sessions end too, by the one close path (`SessionTable::close`): their
            // streams (legacy SSE, a Streamable HTTP GET) close, and a client that reconnects
            // gets 503 until the node is fresh. Swept on every tick while fenced, so a session
            // a request made as the fence closed ends as well.
            let sessions = node.hub.sessions().close_all();
            if !closed {
                continue;
            }
            node.hub.metrics().set_fenced(true);
            tracing::warn!(node = %node.id, bound_ms = node.bound.as_millis() as u64, sessions, "cluster: no proof of freshness within the bound; fenced (503, calls cancelled, sessions closed)");
            let mut rec = Record::event("node_fenced");
            rec.reason = Some(
                format!(
                    "no proof within {} ms that this node has applied the store's writes",
                    node.bound.as_millis()
                )
                .into(),
            );
            let _ = node.hub.audit().record(rec).await;
        }
    }
}
