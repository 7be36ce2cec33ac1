//! The shipped demo upstreams: "helpdesk", a stdio MCP server with per-lease case selection that
//! implements the `io.gatehouse/lease` extension, and "echo", a lean stdio MCP server for benchmarks.
//!
//! Both speak the stdio transport: one JSON-RPC object per line on the reader, one per line on the
//! writer, nothing else on the writer (logs go through `tracing`, which the binary sends to stderr).
//!
//! Helpdesk state lives for one [`serve`] call (one process in production): cases and their notes
//! are global by case id (`case-1`, `case-2`, … from one counter), and each lease owns only its
//! *selected case*. The lease of a request is `params._meta["io.gatehouse/lease"]` (a string),
//! `""` when absent; with the extension switched off every caller shares the lease `""`, which is
//! how a server without the extension behaves behind the gateway.

mod desk;
mod echo;
mod helpdesk;
mod wire;

pub use echo::{run_echo_stdio, serve_echo};
pub use helpdesk::{run_stdio, serve, HelpdeskOptions};
