//! A governed tool call, as a pipeline of steps, each testable on its own and each a file:
//! [`parse`] the params, [`admit`] the call (grant, audit health, limits: the [`Admission`] it
//! returns gives back the concurrency slot it took when dropped), [`plan`] what it becomes
//! (a plain call, or one of the task forms; decided once), [`execute`] it (timeout,
//! cancellation, upstream or in-process), and [`finish`], the one place every outcome goes
//! through — a refusal at any step included: it builds the audit record once, from a
//! [`Summary`], and writes it and the call's metric before the reply is sent.

use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::methods::request::RequestCtx;
use crate::protocol::jsonrpc::Reply;
use crate::tools::GrantedTool;
use crate::upstream::CallIds;

mod admit;
mod approve;
mod execute;
mod finish;
pub(crate) mod input;
mod parse;
mod plan;
#[cfg(test)]
mod tests;
mod types;

pub(crate) use admit::{admit, Budget, Govern};
pub(crate) use approve::check_retry;
pub(crate) use execute::{execute, Execution};
pub(crate) use finish::{finish, Summary};
pub(crate) use parse::parse;
use types::ToolCall;

/// Runs `tools/call`: the steps in order. Returns the reply, or `None` when the call was
/// cancelled. The rare, large paths are boxed (ARCHITECTURE.md, Decisions: request futures).
///
/// Not an `async fn`: an `async fn` moves its arguments into locals of its own, so `id` and
/// `params` would take room twice in its state; the block uses its captures in place, and
/// binds what `parse` gives straight into the locals it needs (this future is moved with
/// every call: smaller is cheaper).
#[allow(clippy::manual_async_fn)] // an async fn would hold `id` and `params` twice (above)
pub fn run<'c>(
    ctx: &'c RequestCtx,
    id: Value,
    params: Option<Value>,
    cancel: CancellationToken,
) -> impl std::future::Future<Output = Option<Reply>> + Send + 'c {
    async move {
        let started = Instant::now();
        // The call read, and its SERVER span begun (tracing off: one `None` check, nothing
        // built); in a block, so the whole `ToolCall` is not kept in this future's state.
        let (trace, name, arguments, mut params, progress_token, task) = {
            let call = match parse(params) {
                Ok(c) => c,
                Err(r) => {
                    return Box::pin(finish::refuse(ctx, started, id, r, None, None, None)).await;
                }
            };
            let trace = ctx
                .hub
                .telemetry()
                .map(|t| parse::server_span(t, ctx, &id, &call));
            let ToolCall {
                name,
                arguments,
                params,
                progress_token,
                task,
            } = call;
            (trace, name, arguments, params, progress_token, task)
        };
        let (digest, recorded) = parse::asked(ctx, &arguments);
        let reg = &ctx.registration;
        let budget = Budget {
            store: &**ctx.hub.store(),
            block: ctx.hub.config().store.budget_block,
        };
        // A cluster node: the store revision the admission is decided against (everything
        // up to it applied; `None` outside a cluster: one atomic load).
        let revision = ctx.hub.fence().decided_at();
        let policy = ctx.hub.policy().current();
        let govern = Govern {
            config: policy.as_deref(),
            args: &arguments,
        };
        let healthy = ctx.hub.audit().is_healthy();
        let (tool, admission, hold) = match admit(budget, reg, &name, healthy, govern).await {
            Ok(a) => a,
            Err((tool, mut r)) => {
                if matches!(r.ended, types::Ended::RateLimited(..)) {
                    ctx.hub.metrics().rate_limited();
                }
                r.tool = Some(name);
                let upstream = tool.and_then(GrantedTool::upstream);
                let asked = Some((digest.as_str(), recorded));
                return Box::pin(finish::refuse(ctx, started, id, r, upstream, asked, trace)).await;
            }
        };
        // Held for approval (issue 49): run only once approved (its rule and approval id, boxed).
        let mut approved: Option<Box<(String, String)>> = None;
        if let Some(hold) = hold {
            let held_by = Some(hold.rule.clone());
            let held = approve::hold(ctx, tool, &arguments, digest.as_str(), hold, &cancel);
            match Box::pin(held).await {
                Ok(id) => approved = held_by.map(|r| Box::new((r, id))),
                Err(n) => {
                    let call = (name.as_str(), tool, digest.as_str(), recorded, held_by);
                    let refused = approve::refused(ctx, started, id, call, n, trace, revision);
                    return Box::pin(approve::with_slot(refused, admission)).await;
                }
            }
        }
        let mut plan = plan::plan(ctx, tool, &mut params, task, &arguments, &progress_token);
        let timeout = reg
            .limits
            .call_timeout_s
            .filter(|t| *t > 0.0 && t.is_finite())
            .map(Duration::from_secs_f64);
        // The upstream request id and epoch, kept even if the timeout drops the execution.
        let ids = CallIds::new(started.into_std());
        let parts = (params, arguments, progress_token);
        let exec = Execution::new(tool, &name, parts, &ids, trace.as_deref());
        let mut ended = execute(ctx, exec, &cancel, timeout).await;
        if let Some(parts) = plan.retry(ctx, &ended) {
            let exec = Execution::new(tool, &name, parts, &ids, trace.as_deref());
            ended = Box::pin(execute(ctx, exec, &cancel, timeout)).await;
        }
        let mut reason = None;
        if let Some(made) = plan.made(tool, &name, &ids, &ended) {
            (ended, reason) = Box::pin(plan::task_created(ctx, made, &cancel)).await;
        }
        if reason.is_none() {
            if let Some((upstream, epoch, result)) = plan.answered_at_once(ctx, tool, &ids, &ended)
            {
                let at_once = plan::ended_at_once(ctx, &name, upstream, epoch, result);
                (ended, reason) = Box::pin(at_once).await;
            }
        }
        let (rule, approval_id) = approved.map_or((None, None), |a| (Some(a.0), Some(a.1)));
        let summary = Summary {
            tool: Some(&name),
            granted: true,
            upstream: tool.upstream(),
            digest: Some(digest.as_str()),
            arguments: recorded,
            reason,
            ids: Some(&ids),
            ended,
            trace,
            revision,
            rule,
            approval_id,
        };
        let reply = finish(ctx, started, id, summary).await;
        // The slot is given back once the record is written, as `max_concurrent` counts it.
        drop(admission);
        reply
    }
}
