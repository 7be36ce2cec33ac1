//! A governed tool call: grant check, limits, execution with timeout and cancellation,
//! and the audit record that must be written before the reply is sent.

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use serde_json::{json, Map, Value};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::audit::{args_digest, Outcome, Record};
use crate::mcp::jsonrpc::{self, Reply, RpcError};
use crate::mcp::request::RequestCtx;
use crate::tools::{Backend, ToolContext, ToolResult};
use crate::upstream::{CallIds, ForwardCall, ForwardError, ForwardOutcome, RawResult};

/// How a call ended, before it is turned into a reply.
enum Ended {
    /// A `CallToolResult` for the client.
    Result(Value, Outcome),
    /// An upstream's `CallToolResult`, as it wrote it.
    Raw(RawResult, Outcome),
    /// A JSON-RPC error for the client.
    Error(i64, String, Outcome),
    /// Cancelled: nothing is sent.
    Cancelled,
}

/// The call's record, borrowing its text from the request (registration, session, tool name):
/// building it allocates nothing.
fn base_record<'a>(ctx: &'a RequestCtx, tool: Option<&'a str>) -> Record<'a> {
    let mut r = ctx.registration.audit_record("governed_mcp_call");
    r.session_id = ctx.session_id().map(Cow::Borrowed);
    r.transport = Some(Cow::Borrowed(ctx.transport.as_str()));
    r.tool = tool.map(Cow::Borrowed);
    r
}

/// Takes one call of a `max_calls` budget: from the block this node holds, else from a new
/// block reserved from the store (one reservation at a time per registration). The budget
/// is never exceeded, across restarts too: a block is reserved (committed) before it is spent.
async fn take_call(
    hub: &crate::hub::Hub,
    reg: &crate::registry::RegistrationState,
    max: u64,
) -> Result<(), String> {
    let spent = || format!("limit max_calls ({max}) reached for this registration");
    loop {
        let granted = reg.calls_granted.load(Ordering::Acquire);
        let took = reg
            .calls_started
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max && n < granted).then_some(n + 1)
            });
        match took {
            Ok(_) => return Ok(()),
            Err(n) if n >= max => return Err(spent()),
            Err(_) => {}
        }
        // The block in hand is spent: reserve the next one (boxed: a rare path).
        let more = Box::pin(async {
            let _one = reg.budget.lock().await;
            if reg.calls_granted.load(Ordering::Acquire) != granted {
                return Ok(true); // another call reserved meanwhile
            }
            let block = crate::store::block_of(&reg.limits, hub.config().store.budget_block, true);
            match hub.store().reserve(&reg.id, block).await {
                Ok(0) => Ok(false),
                Ok(got) => {
                    reg.calls_granted.fetch_add(got, Ordering::AcqRel);
                    Ok(true)
                }
                Err(e) => Err(format!("the call budget cannot be reserved: {e}")),
            }
        })
        .await?;
        if !more {
            return Err(spent());
        }
    }
}

/// Runs `tools/call`. Returns the reply, or `None` when the call was cancelled. The rare,
/// large paths are boxed (ARCHITECTURE.md, Decisions: request futures).
pub async fn run(
    ctx: &RequestCtx,
    id: Value,
    params: Option<Value>,
    cancel: CancellationToken,
) -> Option<Reply> {
    let started = Instant::now();
    let gw = &ctx.hub;
    let mut params = match params {
        Some(Value::Object(m)) => m,
        _ => {
            return Box::pin(malformed(
                ctx,
                None,
                started,
                id,
                "params must be an object with a name",
                "tools/call needs params {\"name\": string, \"arguments\"?: object}",
            ))
            .await;
        }
    };
    // One pass over the params' members: a map lookup hashes its key (SipHash), and a
    // `tools/call` reads three of them. `arguments` is taken out (the upstream's params get
    // it back in its place, `upstream::forward`); `Null` is left there meanwhile.
    let mut name = None;
    let mut arguments = None;
    let mut progress_token = None;
    for (k, v) in params.iter_mut() {
        match k.as_str() {
            "name" => name = Some(&*v),
            "arguments" => arguments = Some(std::mem::take(v)),
            "_meta" => progress_token = v.get("progressToken").cloned(),
            _ => {}
        }
    }
    let name = match name {
        Some(Value::String(s)) => s.clone(),
        _ => {
            return Box::pin(malformed(
                ctx,
                None,
                started,
                id,
                "missing tool name",
                "tools/call: \"name\" must be a string",
            ))
            .await;
        }
    };
    let args = match arguments {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v,
        Some(_) => {
            return Box::pin(malformed(
                ctx,
                Some(&name),
                started,
                id,
                "arguments must be an object",
                "tools/call: \"arguments\" must be an object",
            ))
            .await;
        }
    };
    if name.len() > crate::audit::MAX_TOOL_NAME_BYTES {
        // Not echoed: the reply names the rule, the record a cut, digested copy.
        let mut rec = base_record(ctx, Some(&name));
        rec.set_outcome(Outcome::Denied);
        rec.reason = Some(
            format!(
                "tool name too long ({} bytes; at most {})",
                name.len(),
                crate::audit::MAX_TOOL_NAME_BYTES
            )
            .into(),
        );
        rec.error_code = Some(jsonrpc::INVALID_PARAMS);
        let e = Ended::Error(
            jsonrpc::INVALID_PARAMS,
            format!(
                "Unknown tool: the name is too long ({} bytes; tool names are at most {} bytes)",
                name.len(),
                crate::audit::MAX_TOOL_NAME_BYTES
            ),
            Outcome::Denied,
        );
        return Box::pin(finish(ctx, rec, started, id, e)).await;
    }
    let mut rec = base_record(ctx, Some(&name));
    // Redacted keys are left out of the digest too: a digest of a low-entropy secret could be
    // brute-forced offline.
    let redact_keys = &gw.config().audit.redact_keys;
    let redacted = (!redact_keys.is_empty()).then(|| redact(&args, redact_keys));
    let digest = args_digest(redacted.as_ref().unwrap_or(&args));
    rec.args_digest = Some(Cow::Borrowed(digest.as_str()));
    if gw.config().audit.record_arguments {
        rec.arguments = Some(redacted.unwrap_or_else(|| args.clone()));
    }
    let reg = &ctx.registration;
    let Some(tool) = reg.tools.get(&name) else {
        rec.set_outcome(Outcome::Denied);
        rec.reason = Some("unknown tool (not granted to this registration)".into());
        rec.error_code = Some(jsonrpc::INVALID_PARAMS);
        let e = Ended::Error(
            jsonrpc::INVALID_PARAMS,
            format!("Unknown tool: {name}"),
            Outcome::Denied,
        );
        return finish(ctx, rec, started, id, e).await;
    };
    rec.upstream = tool.upstream().map(Cow::Borrowed);

    if !gw.audit().is_healthy() {
        rec.set_outcome(Outcome::Denied);
        rec.reason = Some("audit log unavailable".into());
        let _ = gw.audit().record(rec).await;
        return Some(
            RpcError::new(
                Some(id),
                jsonrpc::INTERNAL_ERROR,
                "audit log unavailable: tool calls are refused until it can be written",
            )
            .to_value()
            .into(),
        );
    }

    // Limits, bound to the registration.
    if let Some(max) = reg.limits.max_calls {
        if let Err(why) = take_call(gw, reg, max).await {
            return Box::pin(deny(ctx, rec, started, id, why)).await;
        }
    } else {
        reg.calls_started.fetch_add(1, Ordering::AcqRel);
    }
    let max_conc = reg.limits.max_concurrent.unwrap_or(usize::MAX);
    if reg
        .calls_in_flight
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max_conc).then_some(n + 1)
        })
        .is_err()
    {
        let why = format!("limit max_concurrent ({max_conc}) reached for this registration");
        return Box::pin(deny(ctx, rec, started, id, why)).await;
    }
    let _in_flight = InFlight(reg.clone());

    let timeout = reg
        .limits
        .call_timeout_s
        .filter(|t| *t > 0.0 && t.is_finite())
        .map(Duration::from_secs_f64);

    // The upstream request id and epoch, kept even if the timeout below drops `exec`.
    let call_ids = CallIds::default();
    let exec = async {
        match &tool.backend {
            Backend::InProcess(t) => {
                let tctx = ToolContext {
                    registration_id: reg.id.as_str().into(),
                    agent_id: reg.agent_id.clone(),
                    label: reg.label.as_deref().map(Arc::from),
                    session_id: ctx.session_id().map(Arc::from),
                    cancel: cancel.clone(),
                    progress_token,
                    notify: ctx.notify.clone(),
                };
                match std::panic::AssertUnwindSafe(t.call(args, tctx))
                    .catch_unwind()
                    .await
                {
                    Ok(Ok(r)) => {
                        let o = if r.is_error() {
                            Outcome::ToolError
                        } else {
                            Outcome::Ok
                        };
                        Ended::Result(r.0, o)
                    }
                    Ok(Err(e)) => Ended::Result(ToolResult::error(e.0).0, Outcome::ToolError),
                    Err(_) => Ended::Error(
                        jsonrpc::INTERNAL_ERROR,
                        format!("tool {name} failed internally"),
                        Outcome::ProtocolError,
                    ),
                }
            }
            Backend::Upstream {
                upstream,
                tool: upstream_tool,
                ..
            } => {
                let fwd = Box::pin(gw.pool().forward(ForwardCall {
                    registration: reg,
                    session: ctx.session.clone(),
                    upstream,
                    tool: upstream_tool,
                    // Moved, not copied: nothing reads them after the call is under way.
                    params,
                    arguments: args,
                    cancel: &cancel,
                    notify: ctx.notify.clone(),
                    ids: Some(&call_ids),
                }))
                .await;
                upstream_ended(&name, fwd.outcome)
            }
        }
    };
    // An upstream call handles its own cancellation (it must send `notifications/cancelled`
    // upstream before the call ends), so only in-process calls are cut off here.
    // Without a registration timeout an upstream call is just awaited: a disabled `select!`
    // branch still builds its future (the token's waiter), and this is every proxied call.
    let is_upstream = matches!(tool.backend, Backend::Upstream { .. });
    let ended = if is_upstream && timeout.is_none() {
        exec.await
    } else {
        tokio::select! {
        biased;
        _ = cancel.cancelled(), if !is_upstream => Ended::Cancelled,
        e = exec => e,
        _ = sleep_opt(timeout) => {
            let secs = timeout.map(|d| d.as_secs_f64()).unwrap_or_default();
            rec.reason = Some(format!("call_timeout_s ({secs}) elapsed").into());
            Ended::Result(
                ToolResult::error(format!("tool call timed out after {secs} s (limit call_timeout_s)")).0,
                Outcome::Timeout,
            )
        }
        }
    };
    rec.upstream_request_id = call_ids.request_id();
    rec.epoch = call_ids.epoch();
    // A call whose cancellation raced with its completion counts as cancelled: no reply.
    let ended = if cancel.is_cancelled() {
        Ended::Cancelled
    } else {
        ended
    };
    finish(ctx, rec, started, id, ended).await
}

fn upstream_ended(name: &str, outcome: ForwardOutcome) -> Ended {
    use ForwardOutcome as F;
    match outcome {
        F::Result(raw) => {
            let o = if is_error(&raw) {
                Outcome::ToolError
            } else {
                Outcome::Ok
            };
            Ended::Raw(raw, o)
        }
        F::RpcError { code, message } => Ended::Error(code, message, Outcome::ToolError),
        F::Failed(why @ ForwardError::Busy { .. }) => {
            tracing::info!(tool = name, error = %why, "call refused: the registration holds its share of the upstream");
            Ended::Error(jsonrpc::BUSY, why.to_string(), Outcome::Denied)
        }
        F::Failed(why) => {
            tracing::warn!(tool = name, error = %why, side = ?why.side(), "upstream call failed");
            Ended::Error(
                jsonrpc::INTERNAL_ERROR,
                format!("upstream for tool {name} failed: {why}"),
                Outcome::UpstreamFailed,
            )
        }
        F::Timeout(d) => Ended::Result(
            ToolResult::error(format!(
                "tool call timed out after {} s (upstream call_timeout)",
                d.as_secs_f64()
            ))
            .0,
            Outcome::Timeout,
        ),
        F::Cancelled => Ended::Cancelled,
    }
}

/// Whether a tool result says `"isError": true`, read from its text (nothing else of it is
/// parsed; a result that is not an object is not an error result).
fn is_error(result: &RawResult) -> bool {
    #[derive(serde::Deserialize)]
    struct Flags<'a> {
        #[serde(rename = "isError", borrow)]
        is_error: Option<&'a serde_json::value::RawValue>,
    }
    // A derived struct would also read an array (`[true]`) by position: objects only.
    let text = result.get();
    if !text.trim_start().starts_with('{') || !may_say_is_error(text) {
        return false;
    }
    serde_json::from_str::<Flags>(text)
        .ok()
        .and_then(|f| f.is_error)
        .is_some_and(|v| v.get() == "true")
}

/// Whether `text` could hold a key `isError` whose value is `true`: a key written as
/// `isError"` then `:` then `t` (whitespace allowed), or a `\u` escape, which could spell the
/// key (no other escape yields a letter). Inside a string a quote is escaped, so a string's
/// `isError\": true` is not such a key. When it is false the top-level flag cannot be true,
/// which spares the parse for the usual `"isError": false` or no flag at all.
///
/// One vectorised pass (`memchr2`) finds every backslash and `E`: a `str` search per byte
/// sought costs a searcher and a scan each, more than the whole check of a small result.
fn may_say_is_error(text: &str) -> bool {
    const KEY: &[u8] = b"isError\"";
    let bytes = text.as_bytes();
    // A backslash before this index was escaped by the one before it: it starts no escape.
    let mut escapes_from = 0;
    for at in memchr::memchr2_iter(b'\\', b'E', bytes) {
        if bytes[at] == b'\\' {
            if at < escapes_from {
                continue;
            }
            match bytes.get(at + 1) {
                Some(b'u') => return true,
                Some(b'\\') => escapes_from = at + 2,
                _ => {}
            }
            continue;
        }
        let Some(start) = at.checked_sub(2) else {
            continue;
        };
        if bytes[start..].starts_with(KEY) {
            let rest = bytes[start + KEY.len()..].trim_ascii_start();
            if rest
                .strip_prefix(b":")
                .is_some_and(|v| v.trim_ascii_start().starts_with(b"t"))
            {
                return true;
            }
        }
    }
    false
}

async fn sleep_opt(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// A `tools/call` whose params are malformed: audited as `protocol_error` (-32602) with the
/// reason, answered with a -32602 error carrying `message`.
async fn malformed(
    ctx: &RequestCtx,
    tool: Option<&str>,
    started: Instant,
    id: Value,
    reason: &str,
    message: &str,
) -> Option<Reply> {
    let mut rec = base_record(ctx, tool);
    rec.reason = Some(reason.into());
    finish(ctx, rec, started, id, invalid(message)).await
}

fn invalid(msg: &str) -> Ended {
    Ended::Error(
        jsonrpc::INVALID_PARAMS,
        msg.to_string(),
        Outcome::ProtocolError,
    )
}

async fn deny(
    ctx: &RequestCtx,
    mut rec: Record<'_>,
    started: Instant,
    id: Value,
    why: String,
) -> Option<Reply> {
    rec.reason = Some(why.clone().into());
    finish(
        ctx,
        rec,
        started,
        id,
        Ended::Result(ToolResult::error(why).0, Outcome::Denied),
    )
    .await
}

/// Writes the audit record, then builds the reply (`None`: the call was cancelled, or its
/// registration released meanwhile: nothing is sent).
///
/// Not an `async fn`: everything but the wait for the audit write is done when it is called,
/// so its future holds the reply, not the record (a 1.5 KB state inside every call's future
/// otherwise, copied with it).
fn finish<'c>(
    ctx: &'c RequestCtx,
    mut rec: Record<'_>,
    started: Instant,
    id: Value,
    ended: Ended,
) -> impl std::future::Future<Output = Option<Reply>> + Send + 'c {
    // One clock read for the record and the metric.
    let elapsed = started.elapsed();
    rec.duration_ms = Some(elapsed.as_secs_f64() * 1000.0);
    let reply = match ended {
        Ended::Cancelled => {
            rec.set_outcome(Outcome::Cancelled);
            if rec.reason.is_none() {
                rec.reason = Some(if ctx.registration.is_released() {
                    "registration released".into()
                } else {
                    "cancelled by client or session end".into()
                });
            }
            None
        }
        Ended::Result(result, outcome) => {
            rec.set_outcome(outcome);
            Some(jsonrpc::success(id.clone(), result).into())
        }
        Ended::Raw(result, outcome) => {
            rec.set_outcome(outcome);
            Some(Reply::Raw {
                id: id.clone(),
                result,
            })
        }
        Ended::Error(code, message, outcome) => {
            if outcome == Outcome::Denied && rec.reason.is_none() {
                rec.reason = Some(message.clone().into());
            }
            rec.set_outcome(outcome);
            rec.error_code = Some(code);
            Some(jsonrpc::error_response(Some(id.clone()), code, &message, None).into())
        }
    };
    let tool_label = match rec.tool.as_deref() {
        Some(t) if ctx.registration.tools.get(t).is_some() => t,
        Some(_) => "_unknown",
        None => "_none",
    };
    ctx.hub.metrics().observe_call(
        tool_label,
        rec.outcome.as_deref().unwrap_or("unknown"),
        elapsed,
    );
    let written = ctx.hub.audit().record(rec);
    async move {
        if let Err(e) = written.await {
            tracing::error!(error = %e, "audit record not written; reply withheld");
            return reply.map(|_| {
                jsonrpc::error_response(
                    Some(id),
                    jsonrpc::INTERNAL_ERROR,
                    "audit log unavailable: the call's result is withheld",
                    None,
                )
                .into()
            });
        }
        // A call cancelled while its record was being written is not answered.
        if ctx.registration.is_released() {
            return None;
        }
        reply
    }
}

struct InFlight(std::sync::Arc<crate::registry::RegistrationState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.calls_in_flight.fetch_sub(1, Ordering::AcqRel);
    }
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

#[cfg(test)]
mod tests {
    use super::is_error;

    #[test]
    fn is_error_is_read_from_the_text() {
        let raw = |t: &str| serde_json::value::RawValue::from_string(t.to_string()).unwrap();
        assert!(is_error(&raw(r#"{"content":[],"isError":true}"#)));
        assert!(is_error(&raw(
            r#"{"isError" :  true , "x": {"isError": false}}"#
        )));
        assert!(!is_error(&raw(r#"{"content":[],"isError":false}"#)));
        assert!(!is_error(&raw(r#"{"content":[{"isError":true}]}"#)));
        assert!(!is_error(&raw(r#"{"isError":"true"}"#)));
        assert!(!is_error(&raw(r#"[true]"#)));
        assert!(!is_error(&raw(r#"{"content":[],"isError" : false}"#)));
        assert!(is_error(&raw(r#"{"a":{"isError":false},"isError":
 true}"#)));
        assert!(!is_error(&raw(
            r#"{"content":[{"type":"text","text":"isError\": true"}]}"#
        )));
        // The key spelled with escapes is the same key.
        assert!(is_error(&raw(r#"{"\u0069sError":true}"#)));
        assert!(!is_error(&raw(
            r#"{"content":[{"type":"text","text":"a\nb"}]}"#
        )));
        // An escaped backslash before a `u` is no `\u` escape; one after it is.
        assert!(!is_error(&raw(r#"{"text":"a\\u","isError":false}"#)));
        assert!(is_error(&raw(r#"{"text":"a\\\u0041","isError":true}"#)));
        assert!(is_error(&raw(r#"{"E":1,"isError":true}"#)));
        assert!(!is_error(&raw(r#"{"text":"Error","isError" : false}"#)));
    }

    /// The pre-check: true wherever the flag could be `true` (the parse then decides).
    #[test]
    fn may_say_is_error_reads_bytes() {
        for (t, maybe) in [
            (r#"{"content":[],"isError":true}"#, true),
            (r#"{"isError" :  true}"#, true),
            (r#"{"isError":false}"#, false),
            (r#"isError"#, false),
            (r#"E"#, false),
            (r#"sE"#, false),
            (r#"{"isError":"#, false),
            (r#"{"a\\":1,"isError":	true}"#, true),
            (r#"{"a\\u":1}"#, false),
            (r#"{"a\\\u0069":1}"#, true),
            (r#"\\"#, false),
            (r#"\"#, false),
            (r#"{"é\é":1}"#, false),
            (r#"{"EisError":true}"#, true),
            (r#"{"isErrorisError":true}"#, true),
            (r#"{"isErrorX":true}"#, false),
        ] {
            assert_eq!(super::may_say_is_error(t), maybe, "{t}");
        }
    }
}
