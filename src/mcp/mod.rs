//! The MCP protocol as the gateway serves it: JSON-RPC framing (`jsonrpc`) and method
//! dispatch (`dispatch`), shared by every downstream transport.

pub mod dispatch;
pub mod jsonrpc;
pub mod proxy;
pub mod request;

use serde_json::{json, Value};

/// Handshake-era revisions, oldest first.
pub const LEGACY_VERSIONS: &[&str] = &["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
/// The newest handshake-era revision (what `initialize` answers for an unknown version).
pub const LATEST_LEGACY: &str = "2025-11-25";
/// The stateless revision.
pub const MODERN_VERSION: &str = "2026-07-28";
/// Every revision served.
pub const ALL_VERSIONS: &[&str] = &[
    "2024-11-05",
    "2025-03-26",
    "2025-06-18",
    "2025-11-25",
    "2026-07-28",
];

/// Picks the version `initialize` answers: the client's if supported, else the latest.
pub fn negotiate(requested: Option<&str>) -> &'static str {
    requested
        .and_then(|r| LEGACY_VERSIONS.iter().find(|v| **v == r).copied())
        .unwrap_or(LATEST_LEGACY)
}

/// The server capabilities the gateway advertises.
pub fn server_capabilities() -> Value {
    json!({"tools": {"listChanged": true}, "logging": {}})
}

/// The gateway's `Implementation`.
pub fn server_info() -> Value {
    json!({"name": "gatehouse", "version": env!("CARGO_PKG_VERSION")})
}

/// RFC 5424 severities as MCP names them (`notifications/message`), least severe first.
pub const LOG_LEVELS: [&str; 8] = [
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// The index of a log level in [`LOG_LEVELS`].
pub fn log_level_index(level: &str) -> Option<u8> {
    LOG_LEVELS
        .iter()
        .position(|l| *l == level)
        .and_then(|i| u8::try_from(i).ok())
}
