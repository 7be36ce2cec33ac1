//! A registration's own upstream credential in the pool (issue 47): the slot a registration
//! with its own credential for an upstream uses alone, whatever the upstream's sharing, and
//! its grants' catalogs fetched with that credential; the making of every slot with the OAuth
//! tokens its requests carry (`upstream::tokens`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::lease::RELEASE_TIMEOUT;
use super::pool::{Pool, Upstream};
use super::slot::{Slot, Spec};
use super::tokens::Tokens;
use crate::config::OAuthGrant;
use crate::sync::lock;
use crate::tools::GrantedTool;

impl Pool {
    /// A slot and its event task; `owner` is the registration a `per_registration` slot
    /// serves (connection-wide notifications go to its sessions). An OAuth upstream's slot
    /// carries its tokens: the upstream's own, or (`token_exchange`) those of `auth`'s
    /// subject token for `actor` (none: every request fails naming the missing subject).
    pub(super) fn new_slot(
        &self,
        spec: &Arc<Spec>,
        leased: bool,
        owner: Option<&str>,
        auth: Option<Arc<crate::registration::AuthCell>>,
        actor: Option<String>,
    ) -> Arc<Slot> {
        self.start_reaper();
        let tokens = match &spec.oauth {
            Some(c) if c.grant() == OAuthGrant::TokenExchange => {
                Some(Tokens::exchange(c.clone(), auth.clone(), actor))
            }
            Some(_) => spec.own_tokens.clone(),
            None => None,
        };
        let (slot, rx) = Slot::new(
            spec,
            self.inner.audit.clone(),
            leased,
            self.inner.telemetry.get().cloned(),
            auth,
            tokens,
        );
        self.inner.tasks.spawn(super::pool::run_events(
            Arc::downgrade(&self.inner),
            Arc::downgrade(&slot),
            rx,
            slot.stop.clone(),
            owner.map(str::to_string),
        ));
        slot
    }

    /// The slot a registration with its own credential for `up` uses alone (issue 47): one
    /// connection (one upstream HTTP session) per registration and credential cell, whatever
    /// the upstream's sharing, so no other registration's request ever rides it. A slot it
    /// had with another cell (made before a rotation gave it its own, or a child's own
    /// replacing its parent's) is drained and closed, as a reload drains a changed upstream.
    pub(super) fn own_slot(
        &self,
        up: &Arc<Upstream>,
        registration_id: &str,
        own: &super::tokens::OwnAuth,
    ) -> Arc<Slot> {
        let cell = &own.cell;
        let mut slots = lock(&up.slots);
        let same = |s: &Arc<Slot>| s.auth.as_ref().is_some_and(|a| Arc::ptr_eq(a, cell));
        if let Some(s) = slots
            .per_registration
            .get(registration_id)
            .filter(|s| same(s))
        {
            return s.clone();
        }
        let slot = self.new_slot(
            &up.spec,
            false,
            Some(registration_id),
            Some(cell.clone()),
            own.actor.clone(),
        );
        let old = slots
            .per_registration
            .insert(registration_id.to_string(), slot.clone());
        drop(slots);
        if let Some(old) = old {
            let limit = Duration::from_secs(up.spec.config.call_timeout_s.max(1));
            self.inner.tasks.spawn(async move {
                let t0 = Instant::now();
                while old.in_flight.load(Ordering::Acquire) > 0 && t0.elapsed() < limit {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let _ =
                    tokio::time::timeout(RELEASE_TIMEOUT, old.close("credentials changed")).await;
                old.stop.cancel();
                old.revoke_tokens();
            });
        }
        slot
    }

    /// [`Pool::tools_for_grants`], an upstream's catalog fetched (when not cached yet) with
    /// the registration's own credential for it, if `credentials` has one (issue 47).
    pub async fn tools_for_grants_with(
        &self,
        grants: &[String],
        credentials: Option<&crate::registration::Credentials>,
    ) -> Result<Vec<GrantedTool>, String> {
        let mut out = Vec::new();
        for id in crate::registration::Grant::upstreams_of(grants, |up| self.has_upstream(up)) {
            let auth = credentials.and_then(|c| c.cell(id));
            let catalog = self
                .catalog_with(id, auth)
                .await
                .map_err(|e| format!("upstream {id:?} is unavailable: {e}"))?;
            if let Some(up) = self.inner.up(id) {
                out.extend(catalog.granted_tools(&up.spec.config));
            }
        }
        Ok(out)
    }
}
