//! Step 4 of a call: it runs, in-process or upstream, under the registration's timeout, the
//! call's cancellation and a cluster's fence; how the upstream's answer ends the call.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::types::Ended;
use crate::audit::Outcome;
use crate::methods::request::RequestCtx;
use crate::telemetry::CallTrace;
use crate::tools::{Backend, GrantedTool, ToolContext, ToolResult};
use crate::upstream::{
    CallIds, ForwardCall, ForwardError, ForwardOutcome, RawResult, UpstreamError,
};

/// What [`execute`] runs: the granted tool and the call's parts, moved in.
pub(crate) struct Execution<'a> {
    pub tool: &'a GrantedTool,
    pub name: &'a str,
    pub params: Map<String, Value>,
    pub arguments: Value,
    pub progress_token: Option<Value>,
    /// Where an upstream call reports its request id and epoch (kept on timeout).
    pub ids: &'a CallIds,
    /// The call's SERVER span, parent of the upstream request's CLIENT span.
    pub trace: Option<&'a CallTrace>,
}

impl<'a> Execution<'a> {
    /// The execution of `tool` with the call's parts (`params`, `arguments` and progress token,
    /// as the plan prepared them).
    pub(crate) fn new(
        tool: &'a GrantedTool,
        name: &'a str,
        (params, arguments, progress_token): (Map<String, Value>, Value, Option<Value>),
        ids: &'a CallIds,
        trace: Option<&'a CallTrace>,
    ) -> Self {
        Self {
            tool,
            name,
            params,
            arguments,
            progress_token,
            ids,
            trace,
        }
    }
}

/// Step 3: runs an admitted call, in-process or upstream, under the registration's timeout
/// and the call's cancellation. A call whose cancellation raced with its end counts as
/// cancelled.
///
/// Not an `async fn`: its future would keep `exec` in its state beside the backend's future
/// that `exec` is moved into (ARCHITECTURE.md, Decisions: request futures).
pub(crate) fn execute<'a>(
    ctx: &'a RequestCtx,
    exec: Execution<'a>,
    cancel: &'a CancellationToken,
    timeout: Option<Duration>,
) -> impl std::future::Future<Output = Ended> + Send + 'a {
    // An upstream call handles its own cancellation (it must send `notifications/cancelled`
    // upstream before the call ends), so only in-process calls are cut off here.
    // Without a registration timeout an upstream call is just awaited: a disabled `select!`
    // branch still builds its future (the token's waiter), and this is every proxied call.
    let is_upstream = matches!(exec.tool.backend, Backend::Upstream { .. });
    // A cluster node that fences cancels its calls in flight (`fence`; `None` outside a
    // cluster).
    let fence = ctx.hub.fence().token();
    let run = run_backend(ctx, exec, cancel);
    // Combinators, not an `async` block: awaiting `run` inside one would move it into a
    // second slot of the block's state (this future is inside every call's).
    let ran = if is_upstream && timeout.is_none() && fence.is_none() {
        futures::future::Either::Left(run)
    } else {
        // An in-process tool, a registration timeout, a cluster's fence: the select is boxed,
        // so its state is not in every call's future.
        futures::future::Either::Right(Box::pin(async move {
            tokio::pin!(run);
            tokio::select! {
                biased;
                _ = cancel.cancelled(), if !is_upstream => Ended::Cancelled,
                e = &mut run => e,
                _ = fenced(fence.as_ref()) => {
                    // The call is cancelled as a client's cancel would be (an upstream call
                    // tells its upstream first), and ends as its backend ends it.
                    cancel.cancel();
                    run.await
                }
                _ = sleep_opt(timeout) => Ended::TimedOut(timeout.map(|d| d.as_secs_f64()).unwrap_or_default()),
            }
        }))
    };
    futures::FutureExt::map(ran, move |ended| {
        if cancel.is_cancelled() {
            Ended::Cancelled
        } else {
            ended
        }
    })
}

/// The tool itself: an in-process tool (a panic is caught: `protocol_error`) or the upstream.
///
/// Not an `async fn`: its future would hold `exec` twice (the argument and the local it is
/// moved into: 568 bytes), and it is moved into every call's future.
#[allow(clippy::manual_async_fn)] // an async fn would hold `exec` twice (above)
fn run_backend<'a>(
    ctx: &'a RequestCtx,
    exec: Execution<'a>,
    cancel: &'a CancellationToken,
) -> impl std::future::Future<Output = Ended> + Send + 'a {
    async move {
        let reg = &ctx.registration;
        let name = exec.name;
        match &exec.tool.backend {
            Backend::InProcess(t) => {
                let tctx = ToolContext {
                    registration_id: reg.id.as_str().into(),
                    agent_id: reg.agent_id.clone(),
                    label: reg.label.as_deref().map(Arc::from),
                    session_id: ctx.session_id().map(Arc::from),
                    cancel: cancel.clone(),
                    progress_token: exec.progress_token,
                    notify: ctx.notify.clone(),
                };
                match std::panic::AssertUnwindSafe(t.call(exec.arguments, tctx))
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
                        crate::protocol::error::INTERNAL_ERROR,
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
                let forward_call = |params, arguments| ForwardCall {
                    registration: reg,
                    session: ctx.session.clone(),
                    upstream,
                    tool: upstream_tool,
                    params,
                    arguments,
                    cancel,
                    notify: ctx.notify.clone(),
                    ids: Some(exec.ids),
                    trace: exec.trace,
                    param_headers: reg.tools.param_headers(&exec.tool.name),
                };
                // A 2025-era session on a 2026-07-28 upstream: an `input_required` answer is
                // asked of the client and the call retried (`input`), in a boxed future of
                // its own, which keeps the params; any other call moves them (nothing reads
                // them after the call starts), and its future holds no retry state.
                let modern = ctx
                    .session
                    .as_ref()
                    .filter(|_| ctx.hub.pool().is_modern(upstream));
                let fwd = match modern {
                    Some(s) => {
                        let parts = (exec.params, exec.arguments);
                        Box::pin(forward_asking(ctx, s, parts, cancel, &forward_call)).await
                    }
                    None => {
                        let first = forward_call(exec.params, exec.arguments);
                        Box::pin(ctx.hub.pool().forward(first)).await
                    }
                };
                let ended = upstream_ended(name, fwd.outcome);
                if let Some(span) = fwd.client_span {
                    let error_type = match &ended {
                        Ended::Raw(_, Outcome::Ok) | Ended::Result(_, Outcome::Ok) => None,
                        Ended::Error(code, ..) => Some(crate::telemetry::code_error_type(*code)),
                        Ended::Result(_, Outcome::Timeout) => Some("timeout"),
                        Ended::Cancelled => Some("cancelled"),
                        _ => Some("tool_error"),
                    };
                    span.end(fwd.upstream_request_id, error_type, None);
                }
                ended
            }
        }
    }
}

/// A call of a 2025-era `session` to a 2026-07-28 upstream: forwarded, and while the upstream
/// answers `input_required` (at most [`super::input::MAX_ROUNDS`] times), its input requests
/// are asked of the session's client and the call is retried with the answers.
async fn forward_asking<'a, F>(
    ctx: &'a RequestCtx,
    session: &'a Arc<crate::session::Session>,
    (params, arguments): (Map<String, Value>, Value),
    cancel: &'a CancellationToken,
    forward_call: &F,
) -> crate::upstream::Forwarded
where
    F: Fn(Map<String, Value>, Value) -> ForwardCall<'a> + Sync,
{
    let first = forward_call(params.clone(), arguments.clone());
    let mut fwd = Box::pin(ctx.hub.pool().forward(first)).await;
    for _ in 0..super::input::MAX_ROUNDS {
        let ForwardOutcome::Result(raw) = &fwd.outcome else {
            break;
        };
        let Some(asked) = super::input::input_required(raw) else {
            break;
        };
        let answers = Box::pin(super::input::answers(ctx, session, &asked, cancel)).await;
        let Some(answers) = answers else { break };
        let mut retried = params.clone();
        retried.extend(answers);
        if let Some(span) = fwd.client_span.take() {
            span.end(fwd.upstream_request_id, None, None);
        }
        let retry = forward_call(retried, arguments.clone());
        fwd = Box::pin(ctx.hub.pool().forward(retry)).await;
    }
    fwd
}

/// What a call to a tool whose definition changed upstream answers (`on_tool_change =
/// "refuse"`).
pub(super) fn changed_tool_refusal(name: &str) -> String {
    format!(
        "the definition of tool {name} changed upstream since this registration was made; calls to it are refused (on_tool_change = \"refuse\")"
    )
}

fn upstream_ended(name: &str, outcome: ForwardOutcome) -> Ended {
    use ForwardOutcome as F;
    match outcome {
        // Found when its connection was checked (`upstream::Pool::verify`), after admission:
        // answered as admission answers it now.
        F::Failed(ForwardError::ToolChanged { removed: true, .. }) => Ended::Error(
            crate::protocol::error::INVALID_PARAMS,
            format!("Unknown tool: {name} (its upstream no longer offers it)"),
            Outcome::Denied,
        ),
        F::Failed(ForwardError::ToolChanged { removed: false, .. }) => {
            Ended::Limited(changed_tool_refusal(name))
        }
        F::Result(raw) => {
            let o = if is_error(&raw) {
                Outcome::ToolError
            } else {
                Outcome::Ok
            };
            Ended::Raw(raw, o)
        }
        F::RpcError { code, message } => Ended::Error(code, message, Outcome::ToolError),
        F::Failed(
            ForwardError::Upstream(e @ UpstreamError::AuthRejected { .. })
            | ForwardError::Unavailable {
                source: e @ UpstreamError::AuthRejected { .. },
                ..
            },
        ) => {
            tracing::warn!(tool = name, error = %e, "call failed: the upstream rejected the credentials");
            Ended::AuthFailed(e.to_string(), super::finish::UPSTREAM_AUTH_FAILED)
        }
        F::Failed(
            ForwardError::Upstream(UpstreamError::Auth(e))
            | ForwardError::Unavailable {
                source: UpstreamError::Auth(e),
                ..
            },
        ) => {
            tracing::warn!(tool = name, error = %e, "call failed: no upstream access token");
            let tag = match e {
                crate::upstream::oauth::OAuthError::NoSubject { .. } => "no_subject_token",
                _ => "authorization_server_failed",
            };
            Ended::AuthFailed(e.to_string(), tag)
        }
        F::Failed(why @ ForwardError::CredentialsRefused { .. }) => {
            tracing::warn!(tool = name, error = %why, "call refused: the registration's upstream credentials are refused");
            Ended::Limited(why.to_string())
        }
        F::Failed(why @ ForwardError::Busy { .. }) => {
            tracing::info!(tool = name, error = %why, "call refused: the registration holds its share of the upstream");
            Ended::Error(
                crate::protocol::error::BUSY,
                why.to_string(),
                Outcome::Denied,
            )
        }
        F::Failed(why) => {
            tracing::warn!(tool = name, error = %why, side = ?why.side(), "upstream call failed");
            Ended::Error(
                crate::protocol::error::INTERNAL_ERROR,
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
pub(super) fn is_error(result: &RawResult) -> bool {
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
pub(super) fn may_say_is_error(text: &str) -> bool {
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

/// The fence's cancellation, or never (outside a cluster).
async fn fenced(fence: Option<&CancellationToken>) {
    match fence {
        Some(f) => f.cancelled().await,
        None => std::future::pending().await,
    }
}

async fn sleep_opt(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}
