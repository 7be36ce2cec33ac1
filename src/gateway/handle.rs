//! The handle a harness holds for one registration ([`Registration`]): its id, token and
//! URLs; dropping it releases the registration.

use std::sync::Arc;

use crate::registration::RegistrationState;

use super::{Gateway, ReleaseReason};

/// A live registration. Dropping it releases it; `release().await` does so and waits.
pub struct Registration {
    pub(super) gateway: Gateway,
    pub(super) state: Arc<RegistrationState>,
    pub(super) token: String,
    pub(super) base_url: String,
    pub(super) released: bool,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("id", &self.state.id)
            .field("agent_id", &self.state.agent_id)
            .field("token", &"<redacted>")
            .finish()
    }
}

impl Registration {
    pub fn id(&self) -> &str {
        &self.state.id
    }

    /// The bearer token; shown once, never logged.
    pub fn token(&self) -> &str {
        &self.token
    }

    pub fn agent_id(&self) -> &str {
        &self.state.agent_id
    }

    pub fn label(&self) -> Option<&str> {
        self.state.label.as_deref()
    }

    /// The names of the tools this registration may call, in `tools/list` order.
    pub fn tools(&self) -> Vec<String> {
        self.state.tools.names()
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Legacy HTTP+SSE endpoint.
    pub fn sse_url(&self) -> String {
        format!("{}/gw/{}/sse", self.base_url, self.state.id)
    }

    /// Streamable HTTP endpoint.
    pub fn mcp_url(&self) -> String {
        format!("{}/gw/{}/mcp", self.base_url, self.state.id)
    }

    pub fn expires_at(&self) -> Option<String> {
        self.state.expires_at()
    }

    /// Gives the registration up so that only an explicit `Gateway::release_id`, expiry or
    /// shutdown ends it (the daemon keeps registrations this way).
    pub fn detach(mut self) -> (String, String) {
        self.released = true;
        (self.state.id.clone(), std::mem::take(&mut self.token))
    }

    /// Releases now: cancels in-flight calls, ends streams, waits (bounded) for the calls to
    /// be recorded as cancelled, then records the release.
    pub async fn release(mut self) {
        self.released = true;
        if let Some(state) = self
            .gateway
            .close_registration(&self.state.id, ReleaseReason::Released)
        {
            if let Err(e) = self
                .gateway
                .finish_release(&state, ReleaseReason::Released)
                .await
            {
                tracing::error!(registration = %self.state.id, error = %e, "release not stored");
            }
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if let Some(state) = self
            .gateway
            .close_registration(&self.state.id, ReleaseReason::Released)
        {
            match tokio::runtime::Handle::try_current() {
                Ok(_) => {
                    let gw = self.gateway.clone();
                    self.gateway.inner.tasks.spawn(async move {
                        let _ = gw.finish_release(&state, ReleaseReason::Released).await;
                    });
                }
                Err(_) => {
                    // No runtime to wait on: the store's writer is a thread of its own.
                    let _ = futures::executor::block_on(self.gateway.store().release(&state.id));
                    self.gateway
                        .audit()
                        .record_detached(state.audit_record("registration_released"))
                }
            }
        }
    }
}
