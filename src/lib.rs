//! gatehouse: a shared MCP gateway with per-execution registrations.
//!
//! One HTTP server per process serves many registrations; each owns its tools, its bearer
//! token and its `agent_id`. See ARCHITECTURE.md for the codemap and invariants.

// Errors carry JSON values (ids, data) and HTTP responses by design; they are built on
// error paths only, so their size does not matter on the hot path.
#![allow(clippy::result_large_err)]
#![forbid(unsafe_code)]

pub mod admin;
pub mod audit;
pub mod call;
pub mod cli;
pub mod config;
pub mod config_load;
pub mod connections;
pub mod demo_upstream;
pub mod endpoint;
pub mod gateway;
pub mod lease;
pub mod mcp;
pub mod metrics;
pub mod registry;
pub mod server;
pub mod session;
mod sync;
pub mod tool_name;
pub mod tools;
pub mod upstream;

pub use config::{Config, ConfigError};
pub use gateway::{Gateway, GatewayError, Registration, ReleaseReason};
pub use registry::{Limits, RegistrationSpec};
pub use tools::{InProcessTool, ToolContext, ToolError, ToolResult, LOG_LEVELS};
