//! What the steps of a call hand each other: the call read ([`ToolCall`]), a refusal before
//! it runs ([`Refused`]), and how it ended ([`Ended`]).

use std::borrow::Cow;

use serde_json::{Map, Value};

use crate::audit::Outcome;
use crate::upstream::RawResult;

/// How a call ended (or was refused), before [`finish`] turns it into a record and a reply.
#[derive(Debug)]
pub(crate) enum Ended {
    /// A `CallToolResult` for the client.
    Result(Value, Outcome),
    /// An upstream's `CallToolResult`, as it wrote it.
    Raw(RawResult, Outcome),
    /// A JSON-RPC error for the client.
    Error(i64, String, Outcome),
    /// Refused by a limit: a tool error result saying why (the record's reason too).
    Limited(String),
    /// The upstream's credential failed (issue 47): a tool error result saying why, the
    /// record's outcome `upstream_failed` with this reason (`upstream_auth_failed`, or
    /// `authorization_server_failed` when no token could be had, `no_subject_token` when a
    /// token exchange has nothing to exchange).
    AuthFailed(String, &'static str),
    /// Over a rate limit (issue 49): a JSON-RPC error, its message and `retry_after_ms`.
    RateLimited(String, u64),
    /// The registration's `call_timeout_s` (seconds) elapsed.
    TimedOut(f64),
    /// Refused while the audit log cannot be written.
    AuditDown,
    /// Cancelled: nothing is sent.
    Cancelled,
}

/// A `tools/call`'s params, read in one pass: a map lookup hashes its key (SipHash), and a
/// `tools/call` reads three of them.
#[derive(Debug)]
pub(crate) struct ToolCall {
    pub name: String,
    pub arguments: Value,
    /// The params as sent, `arguments` taken out (`Null` in its place; the upstream's params
    /// get it back there, `upstream::forward`).
    pub params: Map<String, Value>,
    pub progress_token: Option<Value>,
    /// The params hold a `task` member (2025-11-25 tasks; `tasks::prepare_call`).
    pub task: bool,
}

/// A call refused before it runs: the tool name if it was read, the record's reason, and how
/// it ended.
#[derive(Debug)]
pub(crate) struct Refused {
    pub tool: Option<String>,
    pub reason: Cow<'static, str>,
    pub ended: Ended,
    /// The policy rule that denied the call (its audit record's `rule`).
    pub rule: Option<String>,
}
