//! TEMPORARY (issue 51): removed after call51 merges. What lived here moved: the protocol's
//! vocabulary to `protocol/`, the handlers to `methods/`; this module only re-exports them so
//! the files call51 restructures (and their `crate::mcp::…` imports) compile unchanged.
//! `tasks` stays here until call51 moves it.

// TEMPORARY (issue 51): removed after call51 merges
#![allow(unused_imports)]

pub mod tasks;

pub use crate::methods::{dispatch, proxy, request};
pub use crate::protocol::jsonrpc;
pub use crate::protocol::{
    log_level_index, method_name, negotiate, server_capabilities, server_info, ClientCapability,
    Notice, Route, ALL_VERSIONS, BATCH_VERSION, LATEST_LEGACY, LEGACY_VERSIONS, LOG_LEVELS,
    MODERN_VERSION, TASK_METHODS,
};
