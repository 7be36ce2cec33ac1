//! The protocol's vocabulary, the bottom layer: no I/O, no HTTP. Revisions ([`Version`]),
//! methods ([`Method`]), notifications ([`Notice`]), capabilities, `_meta` keys ([`meta`]),
//! JSON-RPC framing ([`jsonrpc`]) and the one error value ([`RpcError`]). The handlers that
//! serve methods are in `methods/`.

pub mod apps;
pub mod capability;
pub mod error;
pub mod jsonrpc;
pub mod meta;
pub mod method;
pub mod notice;
pub mod param_header;
pub mod version;

pub use capability::{
    log_level_index, server_capabilities, server_info, ClientCapability, LOG_LEVELS,
};
pub use error::RpcError;
pub use method::{method_name, Method};
pub use notice::{Notice, Route};
pub use version::{
    negotiate, Version, ALL_VERSIONS, BATCH_VERSION, LATEST_LEGACY, LEGACY_VERSIONS, MODERN_VERSION,
};
