//! The registration wing: one owner per fact of a registration.
//!
//! - [`spec`]: what a harness asks for ([`RegistrationSpec`], the admin API's body) and the
//!   checks every registration passes;
//! - [`grant`]: a grant, parsed once, and the one rule that matches it;
//! - [`record`]: the durable fields, exactly as every store keeps them ([`Record`]);
//! - [`state`]: the live registration ([`RegistrationState`]), whose changing parts change
//!   through its methods only;
//! - [`budget`]: the call counters, written by its methods only; [`slot`]: the admission of
//!   a call against them, which hands out a [`Slot`] guard;
//! - [`family`], [`expiry`], [`pins`]: sub-agents, TTL deadlines, pinned tool definitions;
//! - [`table`]: the live registrations by id ([`Registry`]);
//! - [`lifecycle`]: close, finish and renew, one path each, reaching the server through
//!   `lifecycle::Server` (the gateway implements it);
//! - [`ids`]: registration ids and bearer tokens;
//! - [`credentials`]: its upstream credentials (issue 47), read per upstream request.
//!
//! Invariant: a token is compared (in constant time) with its own registration's token only;
//! lookup is by id first, never by searching tokens.

mod budget;
pub mod credentials;
pub mod expiry;
pub mod family;
mod grant;
mod ids;
pub mod lifecycle;
pub mod pins;
mod record;
mod slot;
mod spec;
mod state;
mod table;

pub use budget::Budget;
pub(crate) use budget::Reserve;
pub use credentials::{
    AuthCell, AuthKind, AuthState, Credential, CredentialSet, Credentials, Secret,
};
pub use grant::Grant;
pub use ids::{id_shaped, new_registration_id, new_registration_id_on, new_token, random_b64};
pub use record::{agent_paths, restore_order, Record, StoredTool};
pub(crate) use slot::Slot;
pub use spec::{resolve, Limits, RegistrationSpec, Root};
pub use state::Family;
pub use state::RegistrationState;
pub use table::Registry;
