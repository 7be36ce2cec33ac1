//! Step 5 of a call, for every outcome, a refusal at any step included: the record built once
//! from a [`Summary`], the call's metric, the audit write, then the reply.

use std::borrow::Cow;

use serde_json::{json, Value};
use tokio::time::Instant;

use super::types::{Ended, Refused};
use crate::audit::Outcome;
use crate::methods::request::RequestCtx;
use crate::protocol::error::RpcError;
use crate::protocol::jsonrpc::{self, Reply};
use crate::registration::RegistrationState;
use crate::telemetry::CallTrace;
use crate::tools::ToolResult;
use crate::upstream::CallIds;

/// What [`finish`] builds the record from: the text it borrows, how the call ended.
pub(crate) struct Summary<'a> {
    pub tool: Option<&'a str>,
    /// `tool` is one of the registration's tools (the metric's label; else `_unknown`).
    pub granted: bool,
    pub upstream: Option<&'a str>,
    pub digest: Option<&'a str>,
    pub arguments: Option<Value>,
    /// The record's reason, if the step that ended the call gave one.
    pub reason: Option<Cow<'static, str>>,
    pub ids: Option<&'a CallIds>,
    pub ended: Ended,
    /// The call's SERVER span (tracing on), ended by [`finish`].
    pub trace: Option<Box<CallTrace>>,
    /// A cluster node: the store revision the call was admitted (or refused) against.
    pub revision: Option<u64>,
    /// The policy rule that denied the call, if one did.
    pub rule: Option<String>,
    /// The approval the call was held for (issue 49), if it was.
    pub approval_id: Option<String>,
}

/// A call refused by [`parse`] or [`admit`], through [`finish`].
pub(super) fn refuse<'c>(
    ctx: &'c RequestCtx,
    started: Instant,
    id: Value,
    r: Refused,
    upstream: Option<&str>,
    asked: Option<(&str, Option<Value>)>,
    trace: Option<Box<CallTrace>>,
) -> impl std::future::Future<Output = Option<Reply>> + Send + 'c {
    let (digest, arguments) = match asked {
        Some((d, a)) => (Some(d), a),
        None => (None, None),
    };
    finish(
        ctx,
        started,
        id,
        Summary {
            tool: r.tool.as_deref(),
            granted: r
                .tool
                .as_deref()
                .is_some_and(|t| ctx.registration.tools.get(t).is_some()),
            upstream,
            digest,
            arguments,
            reason: Some(r.reason),
            ids: None,
            ended: r.ended,
            trace,
            revision: ctx.hub.fence().decided_at(),
            rule: r.rule,
            approval_id: None,
        },
    )
}

/// What a call's end makes of its record and its reply (before the audit write).
#[derive(Debug)]
pub(crate) struct Conclusion {
    pub outcome: Outcome,
    pub reason: Option<Cow<'static, str>>,
    pub error_code: Option<i64>,
    /// `None`: nothing is sent (cancelled).
    pub reply: Option<Reply>,
    /// Sent even if the record cannot be written (the refusal says the audit is down).
    pub unconditional: bool,
}

/// How a call ended, as recorded and answered: pure, the half of [`finish`] that decides.
/// `reason` is the step's own; `released`: whether the registration was released (a
/// cancelled call's reason).
pub(crate) fn conclude(
    id: &Value,
    ended: Ended,
    reason: Option<Cow<'static, str>>,
    released: bool,
) -> Conclusion {
    let plain = |outcome, reply| Conclusion {
        outcome,
        reason: None,
        error_code: None,
        reply: Some(reply),
        unconditional: false,
    };
    let mut c = match ended {
        Ended::Cancelled => Conclusion {
            outcome: Outcome::Cancelled,
            reason: Some(if released {
                "registration released".into()
            } else {
                "cancelled by client or session end".into()
            }),
            error_code: None,
            reply: None,
            unconditional: false,
        },
        Ended::Result(result, outcome) => {
            plain(outcome, jsonrpc::success(id.clone(), result).into())
        }
        Ended::Raw(result, outcome) => plain(
            outcome,
            Reply::Raw {
                id: id.clone(),
                result,
            },
        ),
        Ended::AuthFailed(why, tag) => {
            let reply = jsonrpc::success(id.clone(), ToolResult::error(why).0).into();
            let mut c = plain(Outcome::UpstreamFailed, reply);
            c.reason = Some(tag.into());
            c
        }
        Ended::Limited(why) => {
            let reply = jsonrpc::success(id.clone(), ToolResult::error(why.clone()).0).into();
            let mut c = plain(Outcome::Denied, reply);
            c.reason = Some(why.into());
            c
        }
        Ended::RateLimited(message, retry_after_ms) => {
            let code = crate::protocol::error::BUSY;
            let reply = RpcError::new(Some(id.clone()), code, message)
                .with_data(json!({ "retry_after_ms": retry_after_ms }))
                .to_value()
                .into();
            let mut c = plain(Outcome::Denied, reply);
            c.error_code = Some(code);
            c.reason = Some("rate_limited".into());
            c
        }
        Ended::TimedOut(secs) => {
            let text = format!("tool call timed out after {secs} s (limit call_timeout_s)");
            let reply = jsonrpc::success(id.clone(), ToolResult::error(text).0).into();
            let mut c = plain(Outcome::Timeout, reply);
            c.reason = Some(format!("call_timeout_s ({secs}) elapsed").into());
            c
        }
        Ended::AuditDown => {
            let reply = RpcError::internal(
                "audit log unavailable: tool calls are refused until it can be written",
            )
            .answer(id)
            .into();
            let mut c = plain(Outcome::Denied, reply);
            c.unconditional = true;
            c
        }
        Ended::Error(code, message, outcome) => {
            let reply = RpcError::new(Some(id.clone()), code, message.as_str())
                .to_value()
                .into();
            let mut c = plain(outcome, reply);
            c.error_code = Some(code);
            if outcome == Outcome::Denied {
                c.reason = Some(message.into());
            }
            c
        }
    };
    // The step's own reason comes first.
    if reason.is_some() {
        c.reason = reason;
    }
    c
}

/// The reason (and event) of a call whose upstream rejected its credential (issue 47).
pub(crate) const UPSTREAM_AUTH_FAILED: &str = "upstream_auth_failed";

/// Step 4, for every outcome: builds the call's record once from `summary`, observes the
/// call's metric and writes the record; then the reply (`None`: the call was cancelled, or
/// its registration released meanwhile: nothing is sent). A reply whose record could not be
/// written is withheld (an error says so).
///
/// Not an `async fn`: everything but the wait for the audit write is done when it is called,
/// so its future holds the reply, not the record (a 1.5 KB state inside every call's future
/// otherwise, copied with it).
pub(crate) fn finish<'c>(
    ctx: &'c RequestCtx,
    started: Instant,
    id: Value,
    summary: Summary<'_>,
) -> impl std::future::Future<Output = Option<Reply>> + Send + 'c {
    // One clock read for the record and the metric.
    let elapsed = started.elapsed();
    let reg = &ctx.registration;
    let c = conclude(&id, summary.ended, summary.reason, reg.is_released());
    let mut rec = reg.audit_record("governed_mcp_call");
    rec.session_id = ctx.session_id().map(Cow::Borrowed);
    rec.transport = Some(Cow::Borrowed(ctx.transport.as_str()));
    rec.tool = summary.tool.map(Cow::Borrowed);
    rec.upstream = summary.upstream.map(Cow::Borrowed);
    rec.args_digest = summary.digest.map(Cow::Borrowed);
    rec.arguments = summary.arguments;
    rec.store_revision = summary.revision;
    let mut auth = None;
    if let Some(ids) = summary.ids {
        rec.upstream_request_id = ids.request_id();
        rec.epoch = ids.epoch();
        let kind = ids.upstream_auth();
        auth = kind.map(|a| a.as_str());
        // `none` is the record's default, written only in the span: absent, like `initiator`
        // (24 bytes fewer to hash in every call record of a gateway without credentials).
        rec.upstream_auth = kind
            .filter(|a| *a != crate::registration::AuthKind::None)
            .map(|a| Cow::Borrowed(a.as_str()));
    }
    let error_type = error_type_of(&c);
    if let Some(t) = summary.trace {
        end_server_span(t, reg, &mut rec, &c, error_type, summary.upstream, auth);
    }
    if c.reason.as_deref() == Some(UPSTREAM_AUTH_FAILED) {
        // Its own event too (issue 47), naming the upstream and the kind, never a value.
        let mut ev = reg.audit_record(UPSTREAM_AUTH_FAILED);
        ev.upstream = rec.upstream.clone();
        ev.tool = rec.tool.clone();
        ev.upstream_auth = rec.upstream_auth.clone();
        ev.reason = Some("the upstream answered 401 to a fresh credential".into());
        ctx.hub.audit().record_detached(ev);
    }
    rec.set_outcome(c.outcome);
    rec.error_code = c.error_code;
    rec.reason = c.reason;
    if let Some(rule) = summary.rule {
        rec.rare_mut().rule = Some(Cow::Owned(rule));
    }
    // A tool only an app's view can see: the call came from the view (MCP Apps).
    if summary.tool.is_some_and(|t| reg.tools.is_app_only(t)) {
        rec.rare_mut().initiator = Some(Cow::Borrowed(crate::protocol::apps::APP_INITIATOR));
    }
    if let Some(a) = summary.approval_id {
        rec.rare_mut().approval_id = Some(Cow::Owned(a));
    }
    rec.duration_ms = Some(duration_ms(elapsed));
    let tool_label = match summary.tool {
        Some(t) if summary.granted => t,
        Some(_) => "_unknown",
        None => "_none",
    };
    // The upstream's answer, when there was one (`mcp_client_operation_duration_seconds`).
    let client = summary
        .ids
        .and_then(|ids| ids.answered(elapsed))
        .map(|(d, stdio)| (if stdio { "pipe" } else { "tcp" }, d));
    ctx.hub
        .metrics()
        .observe_call(tool_label, c.outcome.as_str(), error_type, elapsed, client);
    let written = ctx.hub.audit().record(rec);
    let (reply, unconditional) = (c.reply, c.unconditional);
    async move {
        if let Err(e) = written.await {
            if !unconditional {
                tracing::error!(error = %e, "audit record not written; reply withheld");
                return reply.map(|_| {
                    RpcError::internal("audit log unavailable: the call's result is withheld")
                        .to(id)
                        .to_value()
                        .into()
                });
            }
        }
        // A call cancelled while its record was being written is not answered.
        if ctx.registration.is_released() {
            return None;
        }
        reply
    }
}

/// A call's `duration_ms`: to the microsecond, as the record's `ts` (not the nanosecond
/// clock's float, e.g. `0.41234199999999997`).
fn duration_ms(d: std::time::Duration) -> f64 {
    // In u64, not `as_micros`'s u128 (whose conversion to f64 is a library call).
    let micros = d
        .as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(d.subsec_micros()));
    micros as f64 / 1000.0
}

/// `error.type` of a call's end (the conventions' values; a closed set: a metric label):
/// the JSON-RPC code of an error reply, `tool_error` for a result with `isError`, `timeout`,
/// `cancelled`; `None` for success.
pub(crate) fn error_type_of(c: &Conclusion) -> Option<&'static str> {
    if let Some(code) = c.error_code {
        return Some(crate::telemetry::code_error_type(code));
    }
    match c.outcome {
        Outcome::Ok => None,
        Outcome::ToolError => Some("tool_error"),
        Outcome::Timeout => Some("timeout"),
        Outcome::Cancelled => Some("cancelled"),
        // The audit-down refusal is an error reply; other denials are `isError` results.
        Outcome::Denied if c.unconditional => {
            Some(RpcError::type_of(crate::protocol::error::INTERNAL_ERROR))
        }
        Outcome::Denied => Some("tool_error"),
        Outcome::ProtocolError | Outcome::UpstreamFailed => Some("_OTHER"),
    }
}

/// Ends a call's SERVER span from its conclusion; its trace id goes into the record.
#[cold]
fn end_server_span(
    mut t: Box<CallTrace>,
    reg: &RegistrationState,
    rec: &mut crate::audit::Record<'_>,
    c: &Conclusion,
    error_type: Option<&'static str>,
    upstream: Option<&str>,
    auth: Option<&'static str>,
) {
    rec.rare_mut().trace_id = Some(Cow::Owned(t.take_trace_id()));
    let mut more = vec![opentelemetry::KeyValue::new(
        "gatehouse.outcome",
        c.outcome.as_str(),
    )];
    if let Some(a) = auth {
        // Which kind of credential went upstream (issue 47), never the value.
        more.push(opentelemetry::KeyValue::new("gatehouse.upstream_auth", a));
    }
    if let Some(u) = upstream {
        more.push(opentelemetry::KeyValue::new(
            "gatehouse.upstream.name",
            u.to_string(),
        ));
    }
    if t.captures_tool_io() {
        // The reply as sent (`capture_tool_io`), cut; the result only, never an error's data.
        let result = match &c.reply {
            Some(Reply::Raw { result, .. }) => Some(result.get().to_string()),
            Some(Reply::Value(v)) => v.get("result").map(Value::to_string),
            None => None,
        };
        if let Some(r) = result.filter(|r| !reg.token_in(&Value::from(r.as_str()))) {
            more.push(opentelemetry::KeyValue::new(
                "gen_ai.tool.call.result",
                crate::telemetry::bounded_text(r),
            ));
        }
    }
    t.end(error_type, c.reason.as_deref(), more);
}

/// A copy of `args` with the values of `keys` (at any depth) replaced by `"[redacted]"`.
pub fn redact(args: &Value, keys: &[String]) -> Value {
    match args {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    if keys.iter().any(|r| r == k) {
                        (k.clone(), json!("[redacted]"))
                    } else {
                        (k.clone(), redact(v, keys))
                    }
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|v| redact(v, keys)).collect()),
        other => other.clone(),
    }
}
