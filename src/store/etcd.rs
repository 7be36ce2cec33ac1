//! The `etcd` store (cargo feature `cluster`; issue 36, CLUSTER.md §5.2): etcd v3 shared by
//! every node. A registration is the key `<prefix>reg/<id>` on its own etcd lease (its TTL;
//! none without a TTL); a release is a transactional delete at a revision R; a budget block
//! (at most what is left over the live nodes) is taken by compare-and-set on the key's
//! `mod_revision`. Values are JSON and carry the token's SHA-256 digest, never the token.
//!
//! The client connects on first use (the store is opened before the runtime's first await);
//! every operation is bounded by the client's request timeout. Replication (the range read,
//! the watch, the heartbeats) is `gateway::cluster`'s; this file is the key layout and the
//! single-key transactions.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, GetResponse, KeyValue, PutOptions, Txn,
    TxnOp, TxnResponse,
};
use futures::future::{BoxFuture, FutureExt};

use super::types::{Store, StoreError, StoreStats};
use crate::registration::Record;
use crate::sync::lock;

/// Compare-and-set retries before a budget or renewal write gives up (contention only).
const CAS_TRIES: usize = 64;
/// Releases (and creations) whose revision is kept for the release call's wait and the
/// records (oldest dropped first).
const RECENT_RELEASES: usize = 1024;

/// How to reach etcd (`[store] endpoints`, TLS, user).
#[derive(Debug, Clone, Default)]
pub struct EtcdOptions {
    pub endpoints: Vec<String>,
    /// Key prefix (default `/gatehouse/v1/`).
    pub prefix: String,
    pub user: Option<(String, String)>,
    /// PEM files: CA, and client certificate + key.
    pub ca_file: Option<std::path::PathBuf>,
    pub cert_file: Option<std::path::PathBuf>,
    pub key_file: Option<std::path::PathBuf>,
    /// Each request's bound.
    pub timeout: Duration,
}

/// A stored value, decoded (`None`: not a registration this version understands). The value
/// is a [`Record`]'s JSON.
pub fn decode(value: &[u8]) -> Option<Record> {
    serde_json::from_slice::<Record>(value).ok()
}

pub struct EtcdStore {
    options: EtcdOptions,
    /// One client per endpoint (connected on first use), used one at a time: `current` is
    /// the member in use, and a transport error moves it to the next. One balanced channel
    /// over every endpoint sends a share of the requests to a dead member, each refused
    /// (a 503 for a create or a release while the cluster still has its quorum).
    members: Vec<tokio::sync::OnceCell<Client>>,
    current: AtomicUsize,
    ops: AtomicU64,
    commits: AtomicU64,
    /// (id, revision of its release), newest last: what the release call waits for.
    releases: Mutex<std::collections::VecDeque<(String, i64)>>,
    /// (id, revision of its creation), newest last: the creation record's `store_revision`.
    creates: Mutex<std::collections::VecDeque<(String, i64)>>,
    /// The live nodes (heartbeat keys) as this node's replica last saw them: a budget block
    /// is at most what is left over this many, so one node never holds what another needs.
    live: AtomicUsize,
}

/// Keeps `(id, revision)` among the last [`RECENT_RELEASES`].
fn remember(list: &Mutex<std::collections::VecDeque<(String, i64)>>, id: &str, rev: i64) {
    let mut recent = lock(list);
    if recent.len() >= RECENT_RELEASES {
        recent.pop_front();
    }
    recent.push_back((id.to_string(), rev));
}

fn recall(list: &Mutex<std::collections::VecDeque<(String, i64)>>, id: &str) -> Option<i64> {
    lock(list)
        .iter()
        .rev()
        .find(|(i, _)| i == id)
        .map(|(_, r)| *r)
}

/// An error that says the request was not applied: refused before it reached the log (no
/// leader, no connection to send it on (refused), a bad or unauthorized request). Anything else (a
/// timeout, a stream broken after sending) leaves the outcome open.
fn not_committed(e: &etcd_client::Error) -> bool {
    // gRPC codes: 3 InvalidArgument, 7 PermissionDenied, 9 FailedPrecondition, 16
    // Unauthenticated.
    unsent(e)
        || matches!(e, etcd_client::Error::GRpcStatus(s) if matches!(s.code() as i32, 3 | 7 | 9 | 16))
}

/// Refused by where it was sent, not by etcd's state: no connection could be made (nothing
/// was sent), or the member has no leader (nothing was proposed). Another member may take it.
fn unsent(e: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(s) = e else {
        return false;
    };
    let m = s.message();
    m.contains("connect error")
        || m.contains("no leader")
        || m.contains("there is no address available")
        || m.contains("there is no connection available")
}

/// The member, not the request, is at fault: unreachable, timed out, a broken connection,
/// no leader. The next request goes to another member.
fn member_lost(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    match e {
        // gRPC codes: 1 Cancelled (tonic's "Timeout expired"), 2 Unknown (a broken
        // stream), 4 DeadlineExceeded, 14 Unavailable.
        E::GRpcStatus(s) => unsent(e) || matches!(s.code() as i32, 1 | 2 | 4 | 14),
        E::TransportError(_) | E::IoError(_) | E::WatchError(_) | E::LeaseKeepAliveError(_) => true,
        _ => false,
    }
}

fn failed(e: impl std::fmt::Display) -> StoreError {
    StoreError::Failed(format!("etcd: {e}"))
}

impl EtcdStore {
    pub fn new(mut options: EtcdOptions) -> Result<EtcdStore, StoreError> {
        if options.endpoints.is_empty() {
            return Err(StoreError::Open {
                path: "etcd".into(),
                message: "no endpoints ([store] endpoints or GATEHOUSE_STORE=etcd://host:port,...)"
                    .into(),
            });
        }
        if options.prefix.is_empty() {
            options.prefix = "/gatehouse/v1/".into();
        }
        if options.timeout.is_zero() {
            options.timeout = Duration::from_secs(2);
        }
        Ok(EtcdStore {
            members: options
                .endpoints
                .iter()
                .map(|_| tokio::sync::OnceCell::new())
                .collect(),
            current: AtomicUsize::new(0),
            options,
            ops: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            releases: Mutex::new(std::collections::VecDeque::new()),
            creates: Mutex::new(std::collections::VecDeque::new()),
            live: AtomicUsize::new(1),
        })
    }

    /// How many nodes are live (the cluster's replica tells; at least 1).
    pub fn set_live(&self, nodes: usize) {
        self.live.store(nodes.max(1), Ordering::Release);
    }

    pub fn prefix(&self) -> &str {
        &self.options.prefix
    }

    /// The key of a registration.
    pub fn reg_key(&self, id: &str) -> String {
        format!("{}reg/{id}", self.options.prefix)
    }

    /// A client of the member in use (connected on first use; a clone shares its channel),
    /// and the member's index for [`EtcdStore::trouble`]. A member that cannot be connected
    /// to (its authentication refused or unreachable) is passed over for the next.
    pub async fn client(&self) -> Result<(usize, Client), StoreError> {
        let n = self.members.len();
        let start = self.current.load(Ordering::Acquire);
        let mut last = None;
        for k in 0..n {
            let i = (start + k) % n;
            match self.members[i].get_or_try_init(|| self.connect(i)).await {
                Ok(c) => {
                    if k > 0 {
                        let _ = self.current.compare_exchange(
                            start,
                            i,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        );
                    }
                    return Ok((i, c.clone()));
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| failed("no endpoints")))
    }

    /// A request to `member` failed with `e`: if the member (not the request) is at fault,
    /// the next request goes to the next member.
    pub fn trouble(&self, member: usize, e: &etcd_client::Error) {
        if member_lost(e) {
            self.move_on(member);
        }
    }

    /// The next request goes to the member after `member` (unless another request moved
    /// on already).
    pub fn move_on(&self, member: usize) {
        let next = (member + 1) % self.members.len().max(1);
        let _ = self
            .current
            .compare_exchange(member, next, Ordering::AcqRel, Ordering::Acquire);
    }

    /// `op` on the member in use, again on the next member while the error says nothing
    /// was sent (or, for an `idempotent` op, while the member is at fault), each member at
    /// most once. `Err`: no member could be connected to; `Ok(Err)`: etcd's last answer.
    async fn on_member<T, F, Fut>(
        &self,
        idempotent: bool,
        mut op: F,
    ) -> Result<Result<T, etcd_client::Error>, StoreError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut tries = 0;
        loop {
            let (i, c) = self.client().await?;
            let r = op(c).await;
            let Err(e) = &r else { return Ok(r) };
            self.trouble(i, e);
            tries += 1;
            let again = unsent(e) || (idempotent && member_lost(e));
            if !again || tries >= self.members.len() {
                return Ok(r);
            }
        }
    }

    /// A read of one key or (with `prefix`) of every key under it; tried on each member.
    pub async fn read(&self, key: String, prefix: bool) -> Result<GetResponse, StoreError> {
        let opts = prefix.then(|| GetOptions::new().with_prefix());
        self.on_member(true, |mut c| {
            let (key, opts) = (key.clone(), opts.clone());
            async move { c.get(key, opts).await }
        })
        .await?
        .map_err(failed)
    }

    async fn connect(&self, member: usize) -> Result<Client, StoreError> {
        let o = &self.options;
        let mut opts = ConnectOptions::new()
            .with_timeout(o.timeout)
            .with_connect_timeout(o.timeout)
            .with_keep_alive(Duration::from_millis(500), o.timeout)
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        if let Some((u, p)) = &o.user {
            opts = opts.with_user(u.clone(), p.clone());
        }
        if o.ca_file.is_some() || o.cert_file.is_some() {
            let mut tls = etcd_client::TlsOptions::new();
            if let Some(ca) = &o.ca_file {
                let pem =
                    std::fs::read(ca).map_err(|e| failed(format!("{}: {e}", ca.display())))?;
                tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
            }
            if let (Some(c), Some(k)) = (&o.cert_file, &o.key_file) {
                let cert = std::fs::read(c).map_err(|e| failed(format!("{}: {e}", c.display())))?;
                let key = std::fs::read(k).map_err(|e| failed(format!("{}: {e}", k.display())))?;
                tls = tls.identity(etcd_client::Identity::from_pem(cert, key));
            }
            opts = opts.with_tls(tls);
        }
        let endpoint = o.endpoints.get(member).map(String::as_str).unwrap_or("");
        Client::connect([endpoint], Some(opts))
            .await
            .map_err(failed)
    }

    /// Every registration under the prefix and the revision of the read.
    pub async fn range(&self) -> Result<(Vec<(Record, i64)>, i64), StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let resp = self.read(self.reg_key(""), true).await?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let regs = resp
            .kvs()
            .iter()
            .filter_map(|kv| decode(kv.value()).map(|r| (r, kv.mod_revision())))
            .collect();
        Ok((regs, rev))
    }

    /// The revision at which `id` was released by this node, if it was lately.
    pub fn release_revision(&self, id: &str) -> Option<i64> {
        recall(&self.releases, id)
    }

    /// The revision at which `id` was created by this node, if it was lately.
    pub fn create_revision(&self, id: &str) -> Option<i64> {
        recall(&self.creates, id)
    }

    /// After a release whose answer was lost (a timeout): is the key gone? `Some(revision of
    /// the read)` if it is (the delete went through, or the registration ended otherwise:
    /// either way it is released, at a revision no later than the read's), `None` if it is
    /// still there. An error: the store did not answer (the outcome is unknown).
    async fn gone_at(&self, id: &str) -> Result<Option<i64>, StoreError> {
        let resp = self.read(self.reg_key(id), false).await?;
        let rev = resp.header().map_or(0, |h| h.revision());
        if resp.kvs().is_empty() {
            remember(&self.releases, id, rev);
            Ok(Some(rev))
        } else {
            Ok(None)
        }
    }

    async fn get(&self, id: &str) -> Result<Option<KeyValue>, StoreError> {
        let mut resp = self.read(self.reg_key(id), false).await?;
        Ok(resp.take_kvs().into_iter().next())
    }

    /// A transaction: tried on the next member only while nothing was sent (a lost answer
    /// may have been applied; the caller decides what it means).
    async fn txn(&self, txn: Txn) -> Result<Result<TxnResponse, etcd_client::Error>, StoreError> {
        self.on_member(false, |mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// Reads a registration, changes it with `f`, and writes it back only if nobody wrote it
    /// in between (compare on `mod_revision`; the key keeps its lease). `f` returns `None` to
    /// write nothing. `Ok(None)`: the key is gone.
    async fn update<T: Copy>(
        &self,
        id: &str,
        mut f: impl FnMut(&mut Record) -> Option<T>,
    ) -> Result<Option<T>, StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let key = self.reg_key(id);
        for _ in 0..CAS_TRIES {
            let Some(kv) = self.get(id).await? else {
                return Ok(None);
            };
            let Some(mut reg) = decode(kv.value()) else {
                return Err(failed(format!("registration {id}: value not understood")));
            };
            let Some(out) = f(&mut reg) else {
                return Ok(None);
            };
            let value = serde_json::to_vec(&reg).map_err(failed)?;
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key.clone(),
                    CompareOp::Equal,
                    kv.mod_revision(),
                )])
                .and_then([TxnOp::put(
                    key.clone(),
                    value,
                    Some(PutOptions::new().with_ignore_lease()),
                )]);
            if self.txn(txn).await?.map_err(failed)?.succeeded() {
                self.commits.fetch_add(1, Ordering::Relaxed);
                return Ok(Some(out));
            }
        }
        Err(failed(format!(
            "registration {id}: {CAS_TRIES} compare-and-set attempts lost to other writers"
        )))
    }

    async fn create_on(&self, reg: Record) -> Result<(), StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let value = serde_json::to_vec(&reg).map_err(failed)?;
        let mut put = PutOptions::new();
        if let Some(ttl) = reg.ttl_s.filter(|_| reg.expires_at_ms != 0) {
            // The lease runs a little past the TTL: each node expires it on its own clock
            // first (and audits it); the lease is the backstop for nodes that all died. A
            // lease granted for a create that then fails ends by itself.
            let ttl = i64::try_from(ttl).unwrap_or(i64::MAX / 2).saturating_add(2);
            let lease = self
                .on_member(true, |mut c| async move { c.lease_grant(ttl, None).await })
                .await?
                .map_err(failed)?;
            put = put.with_lease(lease.id());
        }
        let key = self.reg_key(&reg.id);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, value, Some(put))]);
        // Tried again on the next member even after a lost answer: the create is conditional
        // on the key's absence, so a second attempt after a first that went through finds
        // the key, and the key is read back (ours: created).
        let tried = self
            .on_member(true, |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        let ours =
            |kv: &KeyValue| decode(kv.value()).is_some_and(|d| d.token_sha256 == reg.token_sha256);
        let revision = match tried {
            Ok(resp) if resp.succeeded() => resp.header().map_or(0, |h| h.revision()),
            Ok(_) => match self.get(&reg.id).await? {
                Some(kv) if ours(&kv) => kv.create_revision(),
                _ => return Err(failed(format!("registration {}: id taken", reg.id))),
            },
            Err(e) if not_committed(&e) => return Err(failed(e)),
            // The answer was lost: read the key back. Ours (the token's digest), it was
            // created; absent, nothing changed; unreadable, the outcome is unknown.
            Err(e) => match self.get(&reg.id).await {
                Ok(Some(kv)) if ours(&kv) => kv.create_revision(),
                Ok(_) => return Err(failed(e)),
                Err(again) => {
                    return Err(StoreError::Unknown(format!(
                        "etcd: the create's answer was lost ({e}) and the key could not be read back ({again})"
                    )))
                }
            },
        };
        self.commits.fetch_add(1, Ordering::Relaxed);
        remember(&self.creates, &reg.id, revision);
        Ok(())
    }

    async fn renew_on(&self, id: &str, expires_at_ms: u64) -> Result<bool, StoreError> {
        let Some(kv) = self.get(id).await? else {
            return Ok(false);
        };
        if kv.lease() != 0 {
            // Renewing the lease: a new one for the remaining time would need a re-put, so
            // the key's own lease is kept alive once (its TTL is the registration's).
            let (lease, wait) = (kv.lease(), self.options.timeout);
            self.on_member(true, |mut c| async move {
                let (mut keeper, mut stream) = c.lease_keep_alive(lease).await?;
                keeper.keep_alive().await?;
                let _ = tokio::time::timeout(wait, stream.message()).await;
                Ok(())
            })
            .await?
            .map_err(failed)?;
        }
        Ok(self
            .update(id, |r| {
                r.expires_at_ms = expires_at_ms;
                Some(())
            })
            .await?
            .is_some())
    }

    async fn release_on(&self, id: &str) -> Result<bool, StoreError> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let key = self.reg_key(id);
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Greater, 0)])
            .and_then([TxnOp::delete(key, None)]);
        let resp = match self.txn(txn).await? {
            Ok(r) => r,
            Err(e) if not_committed(&e) => return Err(failed(e)),
            // The answer was lost (a timeout, a broken stream): the delete may have gone
            // through. Read the key back: gone, it is released (at a revision no later than
            // the read's); still there, nothing changed; unreadable, the outcome is unknown.
            Err(e) => {
                return match self.gone_at(id).await {
                    Ok(Some(_)) => {
                        self.commits.fetch_add(1, Ordering::Relaxed);
                        Ok(true)
                    }
                    Ok(None) => Err(failed(e)),
                    Err(again) => Err(StoreError::Unknown(format!(
                        "etcd: the delete's answer was lost ({e}) and the key could not be read back ({again})"
                    ))),
                };
            }
        };
        if !resp.succeeded() {
            return Ok(false);
        }
        self.commits.fetch_add(1, Ordering::Relaxed);
        remember(
            &self.releases,
            id,
            resp.header().map_or(0, |h| h.revision()),
        );
        Ok(true)
    }
}

impl Store for EtcdStore {
    fn kind(&self) -> crate::store::StoreKind {
        crate::store::StoreKind::Etcd
    }

    fn load_all(&self) -> BoxFuture<'_, Result<Vec<Record>, StoreError>> {
        async move {
            let (mut all, _) = self.range().await?;
            all.sort_by(|(a, _), (b, _)| {
                a.created_at_ms.cmp(&b.created_at_ms).then(a.id.cmp(&b.id))
            });
            Ok(all.into_iter().map(|(r, _)| r).collect())
        }
        .boxed()
    }

    fn create(&self, reg: Record) -> BoxFuture<'_, Result<(), StoreError>> {
        self.create_on(reg).boxed()
    }

    fn renew(&self, id: &str, expires_at_ms: u64) -> BoxFuture<'_, Result<bool, StoreError>> {
        let id = id.to_string();
        async move { self.renew_on(&id, expires_at_ms).await }.boxed()
    }

    fn release(&self, id: &str) -> BoxFuture<'_, Result<bool, StoreError>> {
        let id = id.to_string();
        async move { self.release_on(&id).await }.boxed()
    }

    fn reserve(&self, id: &str, want: u64) -> BoxFuture<'_, Result<u64, StoreError>> {
        let id = id.to_string();
        let live = self.live.load(Ordering::Acquire).max(1) as u64;
        async move {
            let got = self
                .update(&id, |r| {
                    let left = r
                        .limits
                        .max_calls
                        .map_or(want, |max| max.saturating_sub(r.calls_reserved));
                    // At most an equal share of what is left among the live nodes (rounded
                    // up: the last call is still handed out), so a block never strands the
                    // budget on one node while the traffic goes to another (issue 50).
                    let got = want.min(left).min(left.div_ceil(live));
                    if got == 0 {
                        return None;
                    }
                    r.calls_reserved += got;
                    Some(got)
                })
                .await?;
            Ok(got.unwrap_or(0))
        }
        .boxed()
    }

    fn give_back(&self, id: &str, unused: u64) -> BoxFuture<'_, Result<(), StoreError>> {
        let id = id.to_string();
        async move {
            self.update(&id, |r| {
                r.calls_reserved = r.calls_reserved.saturating_sub(unused);
                Some(())
            })
            .await?;
            Ok(())
        }
        .boxed()
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            ops: self.ops.load(Ordering::Relaxed),
            commits: self.commits.load(Ordering::Relaxed),
        }
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        futures::future::ready(()).boxed()
    }
}
