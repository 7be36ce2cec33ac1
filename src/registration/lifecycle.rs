//! The registration's side of its lifecycle, one path each: the creation ([`create`]: spec
//! checked, grants resolved, id and token minted, the store written before it is served,
//! audited), the close every release goes through ([`close`]: explicit release, guard drop,
//! TTL expiry, admin DELETE, shutdown), its finish ([`finish`]: store, calls, the server's
//! part, audit), the renewal ([`renew`]) and the restore of the store's registrations at a
//! start ([`restore`]).
//! The server's part is reached through [`Server`], which the gateway implements, so this
//! wing never names the gateway (no import circle).
//!
//! Invariant: the registry entry goes first, so the very next request answers 404; then
//! the registration is marked released and its token fires (streams end, calls are
//! cancelled), then its sessions close. Descendants close first, deepest first, and their
//! finish comes before their parent's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::audit::{Audit, AuditError, Record as AuditRecord};
use crate::config::Config;
use crate::store::{Store, StoreError, StoreKind};
use crate::tools::{InProcessTool, ToolSet};

use super::expiry::{Deadlines, Renewal};
use super::{
    agent_paths, new_registration_id_on, new_token, restore_order, Family, Record,
    RegistrationSpec, RegistrationState, Registry,
};

/// Why a registration ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseReason {
    Released,
    Expired,
    Shutdown,
}

impl ReleaseReason {
    /// The audit event of the release.
    pub(crate) fn event(self) -> &'static str {
        match self {
            ReleaseReason::Released | ReleaseReason::Shutdown => "registration_released",
            ReleaseReason::Expired => "registration_expired",
        }
    }

    /// The metrics label of the reason.
    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseReason::Released => "released",
            ReleaseReason::Expired => "expired",
            ReleaseReason::Shutdown => "shutdown",
        }
    }
}

/// Where a release's end comes from: this node's own release (it deletes the store's row),
/// or a delete a cluster node saw in the store's watch.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Replica {
    No,
    /// `why`: the record's reason (`None`: the delete was this node's own release, seen
    /// before its request finished); `revision`: the delete's.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    Deleted {
        why: Option<&'static str>,
        revision: Option<u64>,
    },
}

/// Why a creation was refused before anything was stored.
#[derive(Debug)]
pub(crate) enum Refused {
    ShuttingDown,
    /// What is wrong with the spec (or its parent), worded for the harness.
    InvalidSpec(String),
}

/// What the lifecycle needs of the server that serves registrations (the gateway).
pub(crate) trait Server: Sync {
    /// Why serving failed (a store's or the audit's failure among them).
    type Error: From<StoreError> + From<AuditError> + From<Refused>;
    /// The configuration in effect.
    fn config(&self) -> &Config;
    /// Whether the server is shutting down (a creation is refused).
    fn shutting_down(&self) -> bool;
    /// A root registration's tools, resolved from its grants: the upstreams' tools (through
    /// the pool) and the in-process catalog's.
    fn resolve_grants<'a>(
        &'a self,
        spec: &'a RegistrationSpec,
    ) -> BoxFuture<'a, Result<ToolSet, String>>;
    /// Marks `id` as being created (`on`), so a cluster's watch does not adopt it
    /// meanwhile, or no longer.
    fn creating(&self, id: &str, on: bool);
    /// Serves a new registration: the server started if need be, the registry insert under
    /// the server's lifecycle lock. Its base URL.
    fn serve_new(&self, state: &Arc<RegistrationState>) -> Result<String, Self::Error>;
    /// A cluster node: the store revision of this node's creation of `id`.
    fn create_revision(&self, id: &str) -> Option<u64>;
    /// A cluster node: waits until every live node serves `id`, or has fenced.
    fn await_served<'a>(&'a self, id: &'a str) -> BoxFuture<'a, ()>;
    /// The live registrations.
    fn registry(&self) -> &Registry;
    /// The TTL deadlines.
    fn deadlines(&self) -> &Deadlines;
    /// The registration store.
    fn store(&self) -> &dyn Store;
    /// The audit trail.
    fn audit(&self) -> &Audit;
    /// Takes `id` out of the registry under the server's lifecycle lock (the server stops
    /// after its linger when none is left).
    fn unserve(&self, id: &str) -> Option<Arc<RegistrationState>>;
    /// Ends a closed registration's sessions (the close counted under `reason`); how many.
    fn close_sessions(&self, id: &str, reason: ReleaseReason) -> usize;
    /// Starts the expiry sweep if it is not running.
    fn start_sweep(&self);
    /// Ends what the server holds for a released registration once its calls ended: its
    /// live tasks (cancelled upstream and audited while its connections still serve it), its
    /// upstream connections and leases, its folded failed authentications.
    fn end_served<'a>(&'a self, state: &'a Arc<RegistrationState>) -> BoxFuture<'a, ()>;
    /// A cluster node: the store revision of this node's release of `id`.
    fn release_revision(&self, id: &str) -> Option<u64>;
    /// The gateway's in-process tools, by name.
    fn catalog(&self) -> BTreeMap<String, InProcessTool>;
    /// Serves a stored registration again under its id and token digest, in `family`: its
    /// tools found again in `catalog`, the server started if need be, its TTL armed.
    fn serve_record(
        &self,
        r: &Record,
        catalog: &BTreeMap<String, InProcessTool>,
        family: Family,
        now_ms: u64,
    ) -> Result<Arc<RegistrationState>, Self::Error>;
    /// A registration is served (created or restored): counted.
    fn served(&self);
    /// Asks each of `upstreams` for its tools, in the background, and compares every
    /// registration with its pins, as on a `list_changed`.
    fn recheck_pins(&self, upstreams: BTreeSet<String>);
}

/// A registration made: served, stored and audited. Its token is given out once, here.
pub(crate) struct Created {
    pub state: Arc<RegistrationState>,
    pub token: String,
    pub base_url: String,
}

/// The one creation path: the spec checked, its tools resolved (a child's among its
/// parent's, within its parent's bounds), id and token minted, the record written through
/// to the store before it is served (the 201 follows the commit), then audited
/// `registration_created`, its TTL armed and, on a cluster node, served by every node.
pub(crate) async fn create<S: Server>(
    server: &S,
    spec: RegistrationSpec,
) -> Result<Created, S::Error> {
    if server.shutting_down() {
        return Err(Refused::ShuttingDown.into());
    }
    spec.check().map_err(Refused::InvalidSpec)?;
    let (tools, family, spec) = resolve(server, spec).await?;
    // In a cluster any node serves any registration: its id names no node.
    let node = match server.store().kind() {
        StoreKind::Etcd => None,
        _ => server.config().node_id.as_deref(),
    };
    let token = new_token();
    let state = RegistrationState::new(new_registration_id_on(node), &token, &spec, tools);
    let state = Arc::new(state.with_family(family));
    let base_url = store_and_serve(server, &state).await?;
    if let Some(parent) = &state.family.parent {
        parent.family.add_child(&state.id);
        // A parent released meanwhile took no note of this child: end it now.
        if parent.is_released() {
            if let Some(s) = close(server, &state.id, ReleaseReason::Released) {
                // Best effort: the child is not served either way.
                let _ = finish(server, &s, ReleaseReason::Released, Replica::No).await;
            }
            return Err(Refused::InvalidSpec(format!(
                "parent {:?} was released while this child was made",
                parent.id
            ))
            .into());
        }
    }
    let mut rec = state.audit_record("registration_created");
    rec.tools = Some(state.tools.names());
    // A cluster node: the revision the store committed the creation at.
    rec.store_revision = server.create_revision(&state.id);
    if let Err(e) = server.audit().record(rec).await {
        close(server, &state.id, ReleaseReason::Released);
        let _ = server.store().release(&state.id).await;
        return Err(e.into());
    }
    if let Some(ttl) = state.ttl_s {
        let (at, after) = state.renewed_deadline(ttl);
        state.move_expiry(at);
        server.deadlines().set(&state.id, after);
        server.start_sweep();
    }
    server.await_served(&state.id).await;
    server.served();
    tracing::info!(registration = %state.id, agent_id = %state.agent_id, tools = state.tools.len(), "registered");
    Ok(Created {
        state,
        token,
        base_url,
    })
}

/// What a registration is made of: its tools, resolved from its grants, and its family.
/// A child (a sub-agent) resolves among its parent's tools, within its parent's bounds.
async fn resolve<S: Server>(
    server: &S,
    spec: RegistrationSpec,
) -> Result<(ToolSet, Family, RegistrationSpec), Refused> {
    let Some(pid) = spec.parent.clone() else {
        let tools = server
            .resolve_grants(&spec)
            .await
            .map_err(Refused::InvalidSpec)?;
        return Ok((tools, Family::default(), spec));
    };
    let parent = server.registry().get(&pid).ok_or_else(|| {
        Refused::InvalidSpec(format!(
            "parent {pid:?} is not a live registration (released, expired, or never made)"
        ))
    })?;
    let now = chrono::Utc::now().timestamp_millis().max(0) as u64;
    let caps = &server.config().children;
    let c = super::family::child_of(&parent, spec, caps, now).map_err(Refused::InvalidSpec)?;
    Ok((c.tools, c.family, c.spec))
}

/// Writes a new registration through to the store (its first budget block reserved with
/// it), then serves it. Its base URL. A registration not served is deleted again, so it
/// does not come back at the next start either.
async fn store_and_serve<S: Server>(
    server: &S,
    state: &Arc<RegistrationState>,
) -> Result<String, S::Error> {
    let store = server.store();
    if state.limits.max_calls.is_some() {
        // A cluster node holds none: the first call on any node reserves a block sized to
        // what is left over the live nodes, so no budget waits on a node without traffic.
        let block = match store.kind() {
            StoreKind::Etcd => 0,
            _ => crate::store::block_of(
                &state.limits,
                server.config().store.budget_block,
                store.durable(),
            ),
        };
        state.budget().first_block(block);
    }
    server.creating(&state.id, true);
    let reserved = state.budget().store_reserved();
    let created = store.create(state.record(reserved)).await;
    let served = match created {
        Ok(()) => server.serve_new(state),
        Err(e) => {
            server.creating(&state.id, false);
            return Err(e.into());
        }
    };
    server.creating(&state.id, false);
    if served.is_err() {
        let _ = store.release(&state.id).await;
    }
    served
}

/// The one close path: descendants first, deepest first, each closed like this one (its
/// [`finish`] finishes theirs before its own); then the registry entry, the family links,
/// the deadline, the release (calls cancelled, streams ended) and the sessions.
pub(crate) fn close(
    server: &impl Server,
    id: &str,
    reason: ReleaseReason,
) -> Option<Arc<RegistrationState>> {
    let children = server
        .registry()
        .get(id)
        .map(|s| s.family.children())
        .unwrap_or_default();
    let mut closed_children = Vec::new();
    for child in children {
        if let Some(c) = close(server, &child, reason) {
            closed_children.push(c);
        }
    }
    let state = server.unserve(id)?;
    state.family.closed_with(closed_children);
    if let Some(parent) = &state.family.parent {
        parent.family.remove_child(id);
    }
    server.deadlines().remove(id);
    state.release();
    state.close_calls();
    let closed = server.close_sessions(id, reason);
    tracing::info!(registration = %id, sessions = closed, ?reason, "released");
    Some(state)
}

/// The end of every release: the children closed with it, the store's delete (first, so
/// that it is committed early; none when `replica` saw it deleted), the calls' end, the
/// server's part, then the audit record.
pub(crate) async fn finish(
    server: &impl Server,
    state: &Arc<RegistrationState>,
    reason: ReleaseReason,
    replica: Replica,
) -> Result<(), StoreError> {
    for child in state.family.take_closed() {
        if let Err(e) = Box::pin(finish(server, &child, reason, replica)).await {
            tracing::error!(registration = %child.id, error = %e, "a child's release not stored");
        }
    }
    let (stored, elsewhere, revision) = match replica {
        Replica::No => (
            server.store().release(&state.id).await.map(|_| ()),
            None,
            server.release_revision(&state.id),
        ),
        Replica::Deleted { why, revision } => (Ok(()), why, revision),
    };
    // Cancel first (the calls' tokens fired in `close`; each upstream call sends
    // `notifications/cancelled` before its task ends), then the server's part.
    let _ = tokio::time::timeout(Duration::from_secs(5), state.calls.wait()).await;
    server.end_served(state).await;
    let mut rec = state.audit_record(reason.event());
    if reason == ReleaseReason::Shutdown {
        rec.reason = Some("shutdown".into());
    }
    if let Some(why) = elsewhere {
        rec.reason = Some(why.into());
    }
    // A cluster node: the revision of the store's delete (R), the release's decision.
    rec.store_revision = revision;
    let cascade;
    if let Some(parent) = state.family.parent.as_ref().filter(|p| p.is_released()) {
        cascade = format!("with its parent {}", parent.id);
        rec.reason = Some(cascade.as_str().into());
    }
    let _ = server.audit().record(rec).await;
    stored
}

/// Extends a registration's TTL by `ttl_s` (default: its own `ttl_s`) from now, never past
/// its parent's, and records `registration_renewed`, once the store committed it. `None`:
/// the registration is gone (or its deadline passed: one decision with the expiry,
/// `expiry::Deadlines::renew`); `Some(None)`: it has no TTL.
pub(crate) async fn renew(
    server: &impl Server,
    id: &str,
    ttl_s: Option<u64>,
) -> Result<Option<Option<String>>, StoreError> {
    let Some(state) = server.registry().get(id) else {
        return Ok(None);
    };
    let Some(ttl) = state.renewal_ttl(ttl_s) else {
        return Ok(Some(None));
    };
    let (at, after) = state.renewed_deadline(ttl);
    let renewal = server.deadlines().renew(id, after, || {
        state.move_expiry(at);
    });
    if renewal == Renewal::Expired {
        return Ok(None);
    }
    server.start_sweep();
    // A release that raced with the renewal wins: do not leave a deadline behind.
    if server.registry().get(id).is_none() || state.is_released() {
        server.deadlines().remove(id);
        return Ok(None);
    }
    server.store().renew(id, state.expires_at_ms()).await?;
    let _ = server
        .audit()
        .record(state.audit_record("registration_renewed"))
        .await;
    Ok(Some(state.expires_at()))
}

/// What [`restore`] found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// Served again.
    pub live: usize,
    /// Expired while the process was down, or a child whose parent did not come back:
    /// audited and released.
    pub expired: usize,
}

/// Loads the store's registrations (a start): parents before their children, each whose TTL
/// has not passed served again under its id and token (its sessions are gone: clients
/// initialize again, and its upstream connections open on its first call); each whose TTL
/// passed while the process was down is audited `registration_expired` with the time, then
/// released, and so is a child whose parent did not come back.
pub(crate) async fn restore<S: Server>(server: &S) -> Result<Restored, S::Error> {
    let mut all = server.store().load_all().await?;
    restore_order(&mut all);
    // A child's agent path, from the stored rows (a child that does not come back is
    // audited with its chain too, as it would have been live).
    let paths = agent_paths(&all);
    let now = chrono::Utc::now().timestamp_millis().max(0) as u64;
    let catalog = server.catalog();
    let mut done = Restored::default();
    for s in all {
        let parent = s.parent.as_deref();
        // A child comes back under its parent (stored before it).
        let family = match parent.map(|pid| server.registry().get(pid)) {
            None => Some(Family::default()),
            Some(p) => p.map(|p| Family::child_of(&p, &s.agent_id)),
        };
        let ended = if s.expired_at(now) {
            Some((
                "registration_expired",
                "expired while the daemon was down".to_string(),
            ))
        } else if family.is_none() {
            let pid = parent.unwrap_or_default();
            Some((
                "registration_released",
                format!("its parent {pid} did not come back"),
            ))
        } else {
            None
        };
        if let Some((event, why)) = ended {
            let mut rec = AuditRecord::about(event, &s.id, &s.agent_id, s.label.as_deref());
            rec.reason = Some(why.into());
            if let Some(pid) = parent {
                rec.rare_mut().parent_registration_id = Some(pid.into());
                rec.rare_mut().agent_path = paths.get(&s.id).map(|p| p.as_slice().into());
            }
            if s.expired_at(now) {
                rec.rare_mut().expired_at =
                    chrono::DateTime::from_timestamp_millis(s.expires_at_ms as i64).map(|t| {
                        t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                            .into()
                    });
            }
            server.audit().record(rec).await?;
            server.store().release(&s.id).await?;
            done.expired += 1;
            continue;
        }
        let state = server.serve_record(&s, &catalog, family.unwrap_or_default(), now)?;
        let mut rec = state.audit_record("registration_restored");
        rec.tools = Some(state.tools.names());
        server.audit().record(rec).await?;
        server.served();
        done.live += 1;
    }
    // The upstreams' tools may have changed while the process was down: every registration
    // is compared with its pins (`pins`) once its upstreams answered.
    let upstreams: BTreeSet<String> = server
        .registry()
        .all()
        .iter()
        .flat_map(|r| {
            r.tools
                .iter()
                .filter_map(|t| t.upstream().map(str::to_string))
                .collect::<Vec<_>>()
        })
        .collect();
    if !upstreams.is_empty() {
        server.recheck_pins(upstreams);
    }
    Ok(done)
}
