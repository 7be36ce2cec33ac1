//! gatehouse: a shared MCP gateway with per-execution registrations.
//!
//! One HTTP server per process serves many registrations; each owns its tools, its bearer
//! token and its `agent_id`. See ARCHITECTURE.md for the codemap and invariants.

// Errors carry JSON values (ids, data) and HTTP responses by design; they are built on
// error paths only, so their size does not matter on the hot path.
#![allow(clippy::result_large_err)]
#![forbid(unsafe_code)]

// The public facade is what `pub use` names below, plus the config data types (`config`) and
// the binary's `cli`; every other module is crate-private. Integration tests and benches that
// need internals reach them through `testing`.
mod admin;
mod approval;
mod audit;
mod call;
#[doc(hidden)]
pub mod cli;
pub mod config;
mod config_load;
mod connections;
mod console;
mod demo_upstream;
mod endpoint;
mod fence;
mod gateway;
mod hub;
mod listen;
mod methods;
mod metrics;
mod mrtr;
pub mod policy;
mod protocol;
mod refusals;
mod registration;
mod sd_notify;
mod server;
mod session;
mod store;
mod sync;
mod tasks;
mod telemetry;
mod tls;
mod tool_name;
mod tools;
mod upstream;

pub use config::{Config, ConfigError};
pub use gateway::handle::Registration;
pub use gateway::probe::{
    Failure as ProbeFailure, Probe, ProbeError, Reason as ProbeReason, ToolsSeen, UpstreamSeen,
    UpstreamsSeen,
};
pub use gateway::{Gateway, GatewayError, ReleaseReason};
pub use protocol::LOG_LEVELS;
pub use registration::{Credential, CredentialSet, Limits, RegistrationSpec, Root, Secret};
pub use tools::{InProcessTool, ToolContext, ToolError, ToolResult};

/// Internals the integration tests and benches reach; not part of the public API.
#[doc(hidden)]
pub mod testing {
    use crate::gateway::Gateway;

    pub use crate::endpoint::event_stream::sse_event;
    pub use crate::endpoint::SESSION_HEADER;
    pub use crate::protocol::{error, jsonrpc};

    pub mod admin {
        pub use crate::admin::{router, serve};
    }
    pub mod audit {
        pub use crate::audit::series::Series;
        pub use crate::audit::verify;
        pub use crate::audit::{
            chain_files, digest_value, head_path, line_hash, read_chain, read_head, read_records,
            segments, Audit, Record,
        };
        pub use crate::audit::{subject_of, Subject, EVENTS};
    }
    pub mod config_load {
        pub use crate::config_load::{load_with_env, DEFAULT_CONFIG_PATH};
    }
    pub mod demo_upstream {
        pub use crate::demo_upstream::{serve, serve_echo, HelpdeskOptions};
    }
    pub mod registry {
        pub use crate::registration::{new_registration_id, new_token};
    }
    pub mod session {
        pub use crate::session::{SessionError, SessionTable, Transport};
    }
    pub mod upstream {
        pub use crate::upstream::{
            event_channel, ConnectOptions, Connection, EventReceiver, IdCounter,
            NotificationsRefused, RequestOptions, RequestTag, Transport, UpstreamError,
            UpstreamEvent, EVENT_BURST, EVENT_QUEUE, EVENT_RATE_PER_S,
        };
        pub mod pool {
            pub use crate::upstream::{CallIds, ForwardCall, ForwardOutcome, Pool};
        }
        /// OAuth toward an upstream: the token cache a request reads (benches/upstream_auth.rs).
        pub mod oauth {
            use std::sync::Arc;

            pub use crate::upstream::oauth::{OAuthClient, OAuthError, Token};
            pub use crate::upstream::Tokens;

            /// A registration's `token_exchange` holder whose subject token is `subject`
            /// (`None`: not a valid credential).
            pub fn exchange_tokens(client: Arc<OAuthClient>, subject: &str) -> Option<Arc<Tokens>> {
                let up = client.upstream().to_string();
                let set = crate::CredentialSet::from([(
                    up.clone(),
                    crate::Credential::SubjectToken(crate::Secret::new(subject)),
                )]);
                let creds = crate::registration::Credentials::of(&set).ok()?;
                Some(Tokens::exchange(client, creds.cell(&up), None))
            }
        }
    }

    pub fn pool(gateway: &Gateway) -> &crate::upstream::Pool {
        gateway.hub().pool()
    }

    /// Stateless calls held for their client's MRTR retry.
    pub fn held_calls(gateway: &Gateway) -> usize {
        gateway.hub().held().len()
    }

    pub fn sessions(gateway: &Gateway) -> &crate::session::SessionTable {
        gateway.hub().sessions()
    }

    pub fn registry(gateway: &Gateway) -> &crate::registration::Registry {
        gateway.hub().registry()
    }

    pub fn audit(gateway: &Gateway) -> &crate::audit::Audit {
        gateway.hub().audit()
    }

    /// Closes this gateway's freshness fence, as a cluster node that lost its proof does
    /// (`fence`): its MCP paths answer 503 until [`open_fence`].
    pub fn close_fence(gateway: &Gateway, node: &str) {
        gateway.hub().fence().enable(node);
    }

    /// Opens the fence [`close_fence`] closed.
    pub fn open_fence(gateway: &Gateway) {
        gateway.hub().fence().open();
    }

    /// Every refusal reason's metric label (`refusals::Reason::ALL`).
    pub fn refusal_reasons() -> Vec<&'static str> {
        crate::refusals::Reason::ALL
            .iter()
            .map(|r| r.as_str())
            .collect()
    }

    /// The gateway's metrics, as the admin API's `/metrics` serves them.
    pub fn metrics_text(gateway: &Gateway) -> String {
        gateway
            .hub()
            .metrics()
            .render(&crate::admin::snapshot(gateway))
    }

    pub fn deadlines(gateway: &Gateway) -> &crate::registration::expiry::Deadlines {
        gateway.deadlines()
    }

    /// `notifications/tools/list_changed` to every session of a registration, through the
    /// same path an upstream's `list_changed` takes. Returns how many sessions got it.
    pub async fn notify_tools_list_changed(gateway: &Gateway, registration_id: &str) -> usize {
        gateway
            .hub()
            .notify_tools_list_changed(registration_id)
            .await
    }
}
