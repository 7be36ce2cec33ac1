//! Every `_meta` key the gateway reads or writes, named once.

/// The member of `params` (and of a result) that carries the keys below.
pub const META: &str = "_meta";
/// The prefix MCP reserves for its own keys (stripped before a lease is passed on).
pub const RESERVED_PREFIX: &str = "io.modelcontextprotocol/";
/// 2026-07-28: the request's protocol version.
pub const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// 2026-07-28: the capabilities the client declares with each request.
pub const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
/// 2026-07-28: the client's `Implementation`, with each request.
pub const CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
/// 2026-07-28: the server's `Implementation`, in `server/discover`.
pub const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
/// 2026-07-28: the `subscriptions/listen` stream a notification belongs to.
pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";
/// 2025-11-25 tasks: the task a message relates to.
pub const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";
/// The tasks extension's key (in capabilities and `_meta`).
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";
/// The token a request's progress notifications carry.
pub const PROGRESS_TOKEN: &str = "progressToken";
/// The gateway's lease extension: the registration holding a per-registration upstream
/// (capability and `_meta` key).
pub const LEASE: &str = "io.gatehouse/lease";
