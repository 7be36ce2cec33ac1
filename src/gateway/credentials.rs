//! A registration's upstream credentials on this gateway (issue 47): checked against its
//! grant and the upstreams' transports at creation and rotation, rotated in place
//! (`PUT /v1/registrations/<id>/credentials`), written through to the store sealed
//! (`store::seal`), and opened again at a restore, or refused with the reason.
//!
//! Invariant: no value of a credential is ever logged, audited or answered; records and
//! replies name the upstreams only.

use std::sync::Arc;

use crate::registration::{CredentialSet, RegistrationState};
use crate::tools::{Backend, ToolSet};

use super::{Gateway, GatewayError};

impl Gateway {
    /// Checks `set` for a registration served with `tools`: every upstream it names is a
    /// configured HTTP upstream of which the grant gives a tool. The error names the upstream
    /// and the reason, never a value.
    pub(crate) fn check_credentials(
        &self,
        set: &CredentialSet,
        tools: &ToolSet,
    ) -> Result<(), GatewayError> {
        for up in set.keys() {
            let bad = |why: String| {
                GatewayError::InvalidSpec(format!("upstream_credentials.{up}: {why}"))
            };
            let Some(config) = self.pool().upstream_config(up) else {
                return Err(bad(format!("{up:?} is not a configured upstream")));
            };
            if config.url.is_none() {
                return Err(bad(format!(
                    "upstream {up:?} is a stdio upstream: credentials go only to HTTP upstreams"
                )));
            }
            let subject = matches!(
                set.get(up),
                Some(crate::registration::Credential::SubjectToken(_))
            );
            match (config.oauth.as_ref().map(|o| o.grant), subject) {
                (Some(crate::config::OAuthGrant::TokenExchange), false) => {
                    return Err(bad(format!(
                        "upstream {up:?} exchanges a subject token for its OAuth tokens (token_exchange): give {{\"subject_token\": \"…\"}}"
                    )))
                }
                (Some(crate::config::OAuthGrant::ClientCredentials), _) => {
                    return Err(bad(format!(
                        "upstream {up:?} is called with the gateway's own OAuth token (client_credentials): a registration's credential would not be sent"
                    )))
                }
                (None, true) => {
                    return Err(bad(format!(
                        "a subject_token goes only to an upstream with [upstreams.oauth] grant = \"token_exchange\"; {up:?} has none"
                    )))
                }
                _ => {}
            }
            let granted = tools.iter().any(
                |t| matches!(&t.backend, Backend::Upstream { upstream, .. } if upstream == up),
            );
            if !granted {
                return Err(bad(format!(
                    "the grant names no tool of upstream {up:?}: credentials go only to upstreams the registration is granted"
                )));
            }
        }
        Ok(())
    }

    /// Replaces the credentials of the live registration `id` with `set` (`None`: no such
    /// registration). Calls in flight finish with what they had; the next upstream request
    /// carries the new ones (same URL, same token). Written through to the store first,
    /// sealed; audited `credentials_rotated` naming the upstreams. Concurrent rotations of one
    /// registration are serialized.
    pub async fn rotate_credentials(
        &self,
        id: &str,
        set: CredentialSet,
    ) -> Result<Option<Arc<RegistrationState>>, GatewayError> {
        let Some(state) = self.registry().get(id) else {
            return Ok(None);
        };
        // One rotation of a registration at a time: the store and the cells end on the same.
        let one = state.credentials.rotating().await;
        self.check_credentials(&set, &state.tools)?;
        // Each value checked before anything is stored.
        crate::registration::Credentials::of(&set).map_err(GatewayError::InvalidSpec)?;
        let sealed = self.seal_credentials(id, &set)?;
        // Noted first: this node's own write, seen again in a cluster's watch, is no change.
        state.credentials.note_sealed(sealed.as_ref());
        if self.store().durable() && !self.store().set_credentials(id, sealed).await? {
            return Ok(None);
        }
        state
            .credentials
            .rotate(&set)
            .map_err(GatewayError::InvalidSpec)?;
        let mut rec = state.audit_record("credentials_rotated");
        rec.reason = Some(
            format!(
                "credentials set for upstream(s): {}",
                set.keys().cloned().collect::<Vec<_>>().join(", ")
            )
            .into(),
        );
        self.audit().record(rec).await?;
        tracing::info!(registration = %id, upstreams = set.len(), "upstream credentials rotated");
        drop(one);
        Ok(Some(state))
    }
}

impl Gateway {
    /// The sealing key of a durable store, read from `[store] secret_key_file` (default:
    /// beside the store's file, or the audit log's for `etcd`) or made there on first start.
    pub(super) fn open_sealer(
        config: &crate::config::Config,
        store: &dyn crate::store::Store,
    ) -> Result<Option<Arc<crate::store::seal::Sealer>>, GatewayError> {
        if !store.durable() {
            return Ok(None);
        }
        let path = config.store.secret_key_file.clone().unwrap_or_else(|| {
            let beside = store
                .path()
                .map(std::path::Path::to_path_buf)
                .unwrap_or_else(|| crate::config::StoreConfig::path_beside(&config.audit.path));
            crate::store::seal::key_path_beside(&beside)
        });
        let (sealer, made) = crate::store::seal::Sealer::load_or_create(&path)?;
        if made {
            tracing::info!(path = %path.display(), key_id = sealer.key_id(), "made the secret key file that seals upstream credentials in the store (keep it with the store; credentials sealed under another key cannot be opened)");
        }
        Ok(Some(Arc::new(sealer)))
    }

    /// `set` sealed for registration `id`, as the store keeps it (`None` when empty, or for a
    /// store that does not outlive the process).
    pub(crate) fn seal_credentials(
        &self,
        id: &str,
        set: &CredentialSet,
    ) -> Result<Option<std::collections::BTreeMap<String, String>>, GatewayError> {
        let Some(sealer) = &self.inner.sealer else {
            return Ok(None);
        };
        if set.is_empty() {
            return Ok(None);
        }
        Ok(Some(
            set.iter()
                .map(|(up, c)| {
                    let plain = serde_json::to_vec(&c.to_json()).unwrap_or_default();
                    (up.clone(), sealer.seal(id, up, &plain))
                })
                .collect(),
        ))
    }

    /// A restored registration's credentials opened again from `sealed` into `state`; each
    /// that does not open (another key, no key, damaged) is refused with its reason: logged,
    /// audited `credentials_refused`, and its calls fail naming it until a rotation.
    pub(super) fn open_credentials(
        &self,
        state: &Arc<RegistrationState>,
        sealed: &std::collections::BTreeMap<String, String>,
    ) {
        let mut set = CredentialSet::new();
        let mut refused = Vec::new();
        for (up, value) in sealed {
            let opened = match &self.inner.sealer {
                None => Err("this store keeps no sealing key".to_string()),
                Some(s) => s.open(&state.id, up, value).and_then(|plain| {
                    serde_json::from_slice::<serde_json::Value>(&plain)
                        .map_err(|_| "the opened value is not a credential".to_string())
                        .and_then(|v| crate::registration::Credential::from_json(up, &v))
                }),
            };
            match opened {
                Ok(c) => {
                    set.insert(up.clone(), c);
                }
                Err(why) => refused.push((up.clone(), why)),
            }
        }
        if let Err(e) = state.credentials.rotate(&set) {
            tracing::warn!(registration = %state.id, error = %e, "restored credentials not usable");
        }
        for (up, why) in refused {
            tracing::error!(registration = %state.id, upstream = %up, reason = %why, "restored registration: its upstream credentials cannot be opened and are refused; its calls to this upstream fail until the harness sets them again (PUT /v1/registrations/<id>/credentials)");
            state.credentials.refuse(&up, &why);
            let mut rec = state.audit_record("credentials_refused");
            rec.upstream = Some(up.clone().into());
            rec.reason = Some(why.into());
            self.audit().record_detached(rec);
        }
    }
}
