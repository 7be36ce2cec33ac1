//! Step 3 of a call: its plan, decided once, after admission and before it runs — a plain
//! call, a task for the client (the 2025-11-25 form it asked for, or the 2026-07-28 form a
//! stateless client declared), a task the gateway asks for and runs itself, or a plain call
//! made again as a task when a 2026-07-28 upstream needs one. After the call ran, the plan
//! says what its answer becomes (a task taken into the table, `crate::methods::tasks`).

use std::borrow::Cow;
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use super::types::Ended;
use crate::audit::Outcome;
use crate::methods::request::RequestCtx;
use crate::tasks::wire;
use crate::tools::GrantedTool;
use crate::upstream::CallIds;

/// What a call that asks for a task (its client, or the gateway for a `required` tool) keeps
/// for it until the upstream answers.
pub(super) struct TaskCall {
    /// A stateless client that declared the 2026-07-28 tasks extension (the capabilities it
    /// declared).
    modern: Option<u8>,
    /// The client's progress token: routable until the task ends.
    progress: Option<Value>,
}

/// What a plain call keeps to be made again as a task: its params, arguments and progress
/// token.
pub(super) type Again = (Map<String, Value>, Value, Option<Value>);

/// What a call becomes. The payloads are boxed: the plan is one pointer in every call's
/// future, and most calls are [`Plan::Plain`].
pub(super) enum Plan {
    /// A plain call of a tool that never runs as a task: its result is not scanned for one.
    Plain,
    /// A plain call of a tool its upstream may run as a task (`optional`): a task it answers
    /// with is run by the gateway for the call, and a 2026-07-28 upstream that runs it only
    /// as a task answers -32021 (the tasks extension not declared), upon which the call is
    /// made again asking for one ([`Plan::retry`]).
    MayRunAsTask(Box<Again>),
    /// A task for the client, which asked for it (`params.task`, on a session: 2025-11-25).
    ClientTask(Box<TaskCall>),
    /// A task for a stateless client that declared the 2026-07-28 tasks extension: it gets
    /// the task in that form.
    ModernClientTask(Box<TaskCall>),
    /// A task the gateway asks for and waits for itself (the upstream runs the tool only as a
    /// task; the client did not ask): the call gets the task's result.
    GatewayTask(Box<TaskCall>),
}

/// What the plan reads of the request besides the call: whether it is stateless, and the
/// TTL a task is asked for with, at most (`[tasks] max_ttl_s`). Read again where needed, not
/// kept in the call's future.
#[derive(Debug, Clone, Copy)]
pub(super) struct Asking {
    stateless: bool,
    max_ttl: Duration,
}

impl Asking {
    fn of(ctx: &RequestCtx) -> Self {
        Self {
            stateless: ctx.session.is_none(),
            max_ttl: Duration::from_secs(ctx.hub.config().tasks.max_ttl_s.max(1)),
        }
    }
}

/// The plan of an admitted call of `tool`; `params` are prepared for it (`task` kept with its
/// TTL capped, dropped, or asked for). `task`: the params hold a `task` member (read by
/// `parse`'s one pass: most calls have none, and a lookup hashes).
pub(super) fn plan(
    ctx: &RequestCtx,
    tool: &GrantedTool,
    params: &mut Map<String, Value>,
    task: bool,
    arguments: &Value,
    progress_token: &Option<Value>,
) -> Plan {
    decide(
        tool,
        params,
        task,
        (arguments, progress_token),
        Asking::of(ctx),
    )
}

/// [`plan`], of what it reads of the request.
fn decide(
    tool: &GrantedTool,
    params: &mut Map<String, Value>,
    task: bool,
    (arguments, progress_token): (&Value, &Option<Value>),
    asking: Asking,
) -> Plan {
    let stateless = asking.stateless;
    // 2025-11-25 `params.task`: kept (TTL capped) on sessions, dropped on stateless requests.
    let asks_task = task && wire::prepare_call(params, !stateless, asking.max_ttl);
    // A tool its upstream runs only as a task, called without one: the gateway asks for the
    // task and waits for its end itself (`methods::tasks::run_for_call`), unless a stateless
    // client declared the 2026-07-28 tasks extension (it gets the task). A stateless client
    // that declared it gets a task of an `optional` tool too (the server decides, and runs
    // such a tool as a task for a client that opted in).
    if !asks_task && (wire::requires_task(tool) || wire::stateless_asks(tool, params, stateless)) {
        return asked_by_gateway(params, progress_token.clone(), asking);
    }
    if asks_task {
        let progress = progress_token.clone();
        return Plan::ClientTask(Box::new(TaskCall {
            modern: None,
            progress,
        }));
    }
    if wire::may_answer_task(tool, false) {
        let again = (params.clone(), arguments.clone(), progress_token.clone());
        return Plan::MayRunAsTask(Box::new(again));
    }
    Plan::Plain
}

/// The gateway asks the upstream for a task (`params.task`): for a stateless client that
/// declared the 2026-07-28 tasks extension, or to run it itself.
fn asked_by_gateway(
    params: &mut Map<String, Value>,
    progress: Option<Value>,
    asking: Asking,
) -> Plan {
    let modern = wire::ask_task(params, asking.max_ttl, asking.stateless);
    let call = Box::new(TaskCall { modern, progress });
    match modern {
        Some(_) => Plan::ModernClientTask(call),
        None => Plan::GatewayTask(call),
    }
}

impl Plan {
    /// The client asked for a task (2025-11-25 `params.task`).
    pub(super) fn asks_task(&self) -> bool {
        matches!(self, Plan::ClientTask(_))
    }

    /// A plain call that a 2026-07-28 upstream refused for want of a task: the plan becomes a
    /// task the gateway asks for, and the params, arguments and progress token to make the
    /// call again with are returned.
    pub(super) fn retry(&mut self, ctx: &RequestCtx, ended: &Ended) -> Option<Again> {
        let refused =
            matches!(ended, Ended::Error(code, ..) if *code == wire::EXTENSION_NOT_DECLARED);
        if !refused {
            return None;
        }
        self.again_as_task(Asking::of(ctx))
    }

    /// [`Plan::retry`] once the upstream refused: only a plain call that may run as a task is
    /// made again (as one); any other plan is kept as it is.
    fn again_as_task(&mut self, asking: Asking) -> Option<Again> {
        if !matches!(self, Plan::MayRunAsTask(_)) {
            return None;
        }
        let Plan::MayRunAsTask(again) = std::mem::replace(self, Plan::Plain) else {
            return None;
        };
        let (mut params, arguments, progress_token) = *again;
        *self = asked_by_gateway(&mut params, progress_token.clone(), asking);
        Some((params, arguments, progress_token))
    }

    /// The task an upstream answered the call with, if the plan allows one and the answer is
    /// a `CreateTaskResult` (scanned only where a task may be the answer: not a
    /// `taskSupport`-less tool's result, most calls).
    pub(super) fn made<'a>(
        &mut self,
        tool: &'a GrantedTool,
        name: &'a str,
        ids: &CallIds,
        ended: &Ended,
    ) -> Option<TaskMade<'a>> {
        let Ended::Raw(raw, Outcome::Ok) = ended else {
            return None;
        };
        let for_client = self.asks_task();
        let call = match self {
            Plan::Plain => return None,
            Plan::MayRunAsTask(_) => None,
            Plan::ClientTask(c) | Plan::ModernClientTask(c) | Plan::GatewayTask(c) => Some(c),
        };
        let ((upstream, epoch), task) = tool
            .upstream()
            .zip(ids.epoch())
            .zip(wire::create_task_result(raw.get()))?;
        Some(TaskMade {
            name,
            upstream,
            epoch,
            task,
            for_client,
            modern: call.as_ref().and_then(|t| t.modern),
            progress: call.and_then(|t| t.progress.take()).zip(ids.request_id()),
        })
    }

    /// Asked for a task and answered at once by a 2026-07-28 upstream: the upstream, epoch
    /// and result of the task the client gets, ended with that answer.
    pub(super) fn answered_at_once<'a>(
        &self,
        ctx: &RequestCtx,
        tool: &'a GrantedTool,
        ids: &CallIds,
        ended: &Ended,
    ) -> Option<(&'a str, u64, Value)> {
        if !self.asks_task() {
            return None;
        }
        let (Ended::Raw(raw, _), Some(upstream), Some(epoch)) =
            (ended, tool.upstream(), ids.epoch())
        else {
            return None;
        };
        if !crate::methods::tasks::modern_upstream(&ctx.hub, upstream) {
            return None;
        }
        let result = serde_json::from_str(raw.get()).unwrap_or(Value::Null);
        Some((upstream, epoch, result))
    }
}

/// A task an upstream created for a call.
pub(super) struct TaskMade<'a> {
    name: &'a str,
    upstream: &'a str,
    epoch: u64,
    /// The task (a 2025-11-25 `Task` object), and whether its upstream answered in the
    /// 2026-07-28 form.
    task: (Value, bool),
    /// The client asked for it (`params.task`): it gets the task; else the call waits for
    /// the task's end and gets its result.
    for_client: bool,
    /// A stateless client that declared the 2026-07-28 tasks extension: it gets the task in
    /// that form (the capabilities it declared, `ClientCapability::bits_of`).
    modern: Option<u8>,
    /// The client's progress token and the call's upstream request id.
    progress: Option<(Value, u64)>,
}

/// An upstream answered a call with a `CreateTaskResult`: the task is the gateway's now
/// (`tasks::created`). A client that asked for it gets it under the gateway's id; one
/// that did not gets the task's result on this call (`tasks::run_for_call`).
pub(super) async fn task_created(
    ctx: &RequestCtx,
    made: TaskMade<'_>,
    cancel: &CancellationToken,
) -> (Ended, Option<Cow<'static, str>>) {
    use crate::methods::tasks::NotCreated;
    let internal = !made.for_client && made.modern.is_none();
    let created = crate::methods::tasks::created(
        ctx,
        made.name,
        made.upstream,
        made.epoch,
        made.task,
        internal,
        made.modern,
        made.progress,
    )
    .await;
    match created {
        Ok(task) if internal => {
            let why = format!("run as task {} for a client without tasks", task.id);
            let ended = match crate::methods::tasks::run_for_call(ctx, &task, cancel).await {
                None => Ended::Cancelled,
                Some(f) => match &*f {
                    Ok(result) => {
                        let o = if result.get("isError") == Some(&Value::Bool(true)) {
                            Outcome::ToolError
                        } else {
                            Outcome::Ok
                        };
                        Ended::Result(result.clone(), o)
                    }
                    Err(e) => Ended::Error(
                        e.get("code")
                            .and_then(Value::as_i64)
                            .unwrap_or(crate::protocol::error::INTERNAL_ERROR),
                        e.get("message")
                            .and_then(Value::as_str)
                            .unwrap_or("task failed")
                            .to_string(),
                        Outcome::ToolError,
                    ),
                },
            };
            (ended, Some(why.into()))
        }
        Ok(task) => {
            let why = format!("task created: {}", task.id);
            let result = match made.modern {
                Some(_) => crate::tasks::wire::modern_created(&task),
                None => json!({"task": task.view()}),
            };
            (Ended::Result(result, Outcome::Ok), Some(why.into()))
        }
        Err(NotCreated::Full(n)) => tasks_full(format!(
            "limit tasks.max_live_per_registration ({n}) reached: the task was cancelled upstream"
        )),
        Err(NotCreated::Released) => (Ended::Cancelled, None),
    }
}

/// A task refused at the registration's cap of live tasks: denied, saying `why`.
fn tasks_full(why: String) -> (Ended, Option<Cow<'static, str>>) {
    let ended = Ended::Error(
        crate::protocol::error::INTERNAL_ERROR,
        why.clone(),
        Outcome::Denied,
    );
    (ended, Some(why.into()))
}

/// A task that ended at once ([`crate::methods::tasks::ended_at_once`]), for the client that asked.
pub(super) async fn ended_at_once(
    ctx: &RequestCtx,
    name: &str,
    upstream: &str,
    epoch: u64,
    result: Value,
) -> (Ended, Option<Cow<'static, str>>) {
    match crate::methods::tasks::ended_at_once(ctx, name, upstream, epoch, result).await {
        Ok(task) => {
            let why = format!("task created: {} (answered at once upstream)", task.id);
            (
                Ended::Result(json!({"task": task.view()}), Outcome::Ok),
                Some(why.into()),
            )
        }
        Err(crate::methods::tasks::NotCreated::Full(n)) => tasks_full(format!(
            "limit tasks.max_live_per_registration ({n}) reached"
        )),
        Err(crate::methods::tasks::NotCreated::Released) => (Ended::Cancelled, None),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::tools::{Backend, TaskSupport};

    fn tool(task_support: TaskSupport) -> GrantedTool {
        GrantedTool {
            name: "u.t".into(),
            descriptor: Arc::new(json!({"name": "u.t"})),
            backend: Backend::Upstream {
                upstream: "u".into(),
                tool: "t".into(),
                grant_name: "u.t".into(),
                task_support,
            },
        }
    }

    fn params(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    const SESSION: Asking = Asking {
        stateless: false,
        max_ttl: Duration::from_secs(60),
    };
    const STATELESS: Asking = Asking {
        stateless: true,
        max_ttl: Duration::from_secs(60),
    };

    /// The plan's name, and the params it leaves for the upstream.
    fn decided(ts: TaskSupport, p: Value, asking: Asking) -> (&'static str, Value) {
        let mut p = params(p);
        let task = p.contains_key("task");
        let progress = Some(json!("tok"));
        let plan = decide(&tool(ts), &mut p, task, (&json!({}), &progress), asking);
        (name(&plan), Value::Object(p))
    }

    fn name(plan: &Plan) -> &'static str {
        match plan {
            Plan::Plain => "plain",
            Plan::MayRunAsTask(_) => "may run as task",
            Plan::ClientTask(_) => "client task",
            Plan::ModernClientTask(_) => "modern client task",
            Plan::GatewayTask(_) => "gateway task",
        }
    }

    #[test]
    fn each_call_gets_one_plan_and_params_to_match() {
        use TaskSupport::{Forbidden, Optional, Required};
        let declared = json!({"name": "t", "_meta": {"io.modelcontextprotocol/clientCapabilities":
            {"extensions": {"io.modelcontextprotocol/tasks": {}}}}});
        let with_task = json!({"name": "t", "task": {"ttl": 999_999_999}});
        assert_eq!(decided(Forbidden, json!({"name": "t"}), SESSION).0, "plain");
        assert_eq!(
            decided(Optional, json!({"name": "t"}), SESSION).0,
            "may run as task"
        );
        // The client's task: its TTL capped on a session, dropped on a stateless request.
        let (plan, p) = decided(Forbidden, with_task.clone(), SESSION);
        assert_eq!((plan, &p["task"]["ttl"]), ("client task", &json!(60_000)));
        let (plan, p) = decided(Forbidden, with_task.clone(), STATELESS);
        assert_eq!((plan, p.get("task")), ("plain", None));
        let (plan, p) = decided(Required, with_task, SESSION);
        assert_eq!((plan, &p["task"]["ttl"]), ("client task", &json!(60_000)));
        // The gateway asks: for itself, or for a stateless client that declared the extension.
        let (plan, p) = decided(Required, json!({"name": "t"}), SESSION);
        assert_eq!(
            (plan, &p["task"]),
            ("gateway task", &json!({"ttl": 60_000}))
        );
        assert_eq!(
            decided(Required, json!({"name": "t"}), STATELESS).0,
            "gateway task"
        );
        assert_eq!(
            decided(Required, declared.clone(), STATELESS).0,
            "modern client task"
        );
        assert_eq!(
            decided(Optional, declared.clone(), STATELESS).0,
            "modern client task"
        );
        assert_eq!(decided(Optional, declared, SESSION).0, "may run as task");
    }

    /// The plan of a call of an `optional` tool on a session.
    fn optional(p: &mut Map<String, Value>, task: bool, parts: (&Value, &Option<Value>)) -> Plan {
        decide(&tool(TaskSupport::Optional), p, task, parts, SESSION)
    }

    #[test]
    fn only_a_call_that_may_run_as_a_task_is_made_again_as_one() {
        let mut p = params(json!({"name": "t"}));
        let progress = Some(json!("tok"));
        let args = json!({"a": 1});
        let mut plan = optional(&mut p, false, (&args, &progress));
        let (again, arguments, token) = plan.again_as_task(SESSION).unwrap();
        assert_eq!(name(&plan), "gateway task");
        assert_eq!(again.get("task"), Some(&json!({"ttl": 60_000})));
        assert_eq!((&arguments, &token), (&args, &progress));
        // Once a task, never again; a plan that is no plain call is kept as it is.
        assert!(plan.again_as_task(SESSION).is_none());
        assert_eq!(name(&plan), "gateway task");
        let mut p = params(json!({"name": "t", "task": {}}));
        let none = None;
        let mut plan = optional(&mut p, true, (&args, &none));
        assert!(plan.again_as_task(SESSION).is_none());
        assert!(plan.asks_task());
    }
}
