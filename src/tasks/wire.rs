//! MCP tasks on the wire, as pure translation: the two forms a task takes (2025-11-25, the
//! `Task` object the table keeps; 2026-07-28, the flat `DetailedTask` of the
//! `io.modelcontextprotocol/tasks` extension), what a `tools/call` asks or declares, and the
//! replies built from a task. Nothing here does I/O.

use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use crate::protocol::jsonrpc::{self, RpcError};
use crate::tasks::{Final, Status, Task, RELATED_TASK};
use crate::upstream::{On, Request};

/// The 2026-07-28 tasks extension's name, and its error when a request did not declare it.
pub const EXTENSION: &str = crate::upstream::TASKS_EXTENSION;
pub const EXTENSION_NOT_DECLARED: i64 = crate::protocol::error::MISSING_CAPABILITY;

/// A 2026-07-28 request's client capabilities, in its `_meta`.
const META_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// The server capability the gateway declares (2025-11-25) when a granted upstream runs tool
/// calls as tasks.
pub fn capability() -> Value {
    json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}})
}

/// Whether an upstream's `tasks` capability says it runs `tools/call` as tasks.
pub fn upstream_runs_tasks(tasks: &Value) -> bool {
    tasks
        .get("requests")
        .and_then(|r| r.get("tools"))
        .and_then(|t| t.get("call"))
        .is_some()
}

/// Prepares a `tools/call`'s params for the upstream: `task` is kept (its TTL cut to the
/// gateway's cap) on a session that can hold tasks, and dropped otherwise (stateless
/// 2026-07-28 requests: `params.task` is to be ignored there). Whether a task was asked.
pub fn prepare_call(params: &mut Map<String, Value>, session: bool, max_ttl: Duration) -> bool {
    if !session {
        params.remove("task");
        return false;
    }
    let Some(task) = params.get_mut("task") else {
        return false;
    };
    let Some(t) = task.as_object_mut() else {
        return false;
    };
    let max = u64::try_from(max_ttl.as_millis()).unwrap_or(u64::MAX);
    let asked = t.get("ttl").and_then(Value::as_u64).unwrap_or(max);
    t.insert("ttl".into(), Value::from(asked.min(max)));
    true
}

/// Whether a granted tool's upstream runs it only as a task (`execution.taskSupport:
/// "required"`, 2025-11-25).
pub fn requires_task(tool: &crate::tools::GrantedTool) -> bool {
    matches!(
        tool.backend,
        crate::tools::Backend::Upstream {
            task_support: crate::tools::TaskSupport::Required,
            ..
        }
    )
}

/// Whether a stateless (2026-07-28) call of an `optional` tool asks for a task: its request
/// declared the tasks extension. Read only for such tools (`params` is not looked at
/// otherwise).
pub fn stateless_asks(
    tool: &crate::tools::GrantedTool,
    params: &Map<String, Value>,
    stateless: bool,
) -> bool {
    stateless
        && matches!(
            tool.backend,
            crate::tools::Backend::Upstream {
                task_support: crate::tools::TaskSupport::Optional,
                ..
            }
        )
        && params
            .get("_meta")
            .and_then(|m| m.get(META_CAPABILITIES))
            .is_some_and(declares_extension)
}

/// Whether an upstream's answer to a call of `tool` may be a `CreateTaskResult`: the call
/// asked for a task (the client or the gateway), or the tool's descriptor says its upstream
/// runs it as a task (`optional`: it may answer one unasked). A tool without `taskSupport`
/// (forbidden) is not answered with a task (2025-11-25), so its result is not scanned.
pub fn may_answer_task(tool: &crate::tools::GrantedTool, asked: bool) -> bool {
    asked
        || matches!(
            tool.backend,
            crate::tools::Backend::Upstream {
                task_support: crate::tools::TaskSupport::Optional
                    | crate::tools::TaskSupport::Required,
                ..
            }
        )
}

/// Asks the upstream for a task on a call whose client did not (`params.task`, the TTL cap).
/// On a stateless request (`stateless`) that declares the 2026-07-28 tasks extension in its
/// `_meta`, the task is handed to the client in that form: `Some(the client capabilities
/// it declared)` (`ClientCapability::bits_of`). Read only here: a call of a tool that needs
/// a task, never on the ordinary call's path.
pub fn ask_task(params: &mut Map<String, Value>, max_ttl: Duration, stateless: bool) -> Option<u8> {
    let modern = if stateless {
        params
            .get("_meta")
            .and_then(|m| m.get(META_CAPABILITIES))
            .filter(|c| declares_extension(c))
            .map(|c| crate::protocol::ClientCapability::bits_of(Some(c)))
    } else {
        None
    };
    let max = u64::try_from(max_ttl.as_millis()).unwrap_or(u64::MAX);
    params.insert("task".into(), json!({"ttl": max}));
    modern
}

/// Whether a 2026-07-28 request's params declare the tasks extension (in `_meta`'s client
/// capabilities).
pub fn declares_tasks(params: Option<&Value>) -> bool {
    params
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(META_CAPABILITIES))
        .is_some_and(declares_extension)
}

/// Whether client capabilities (a 2026-07-28 request's `_meta`) declare the tasks extension.
fn declares_extension(caps: &Value) -> bool {
    caps.get("extensions")
        .and_then(|e| e.get(EXTENSION))
        .is_some_and(|v| !v.is_null())
}

/// A tool's definition as listed to clients: an upstream's `taskSupport: "required"` is shown
/// `"optional"` (the gateway runs the task itself for a client that calls it plainly).
pub fn listed(descriptor: &mut Value) {
    if let Some(ts) = descriptor
        .get_mut("execution")
        .and_then(|e| e.get_mut("taskSupport"))
    {
        if ts == "required" {
            *ts = Value::String("optional".into());
        }
    }
}

/// A `CreateTaskResult`'s task as a 2025-11-25 `Task` object, if `result` is one, and
/// whether it came in the 2026-07-28 form: a `task` object with a string `taskId` (2025), or
/// `resultType: "task"` with a flat `taskId` (2026); never with `content` (a tool result is
/// never taken for one). Read on upstream tool results that may be one: a substring scan
/// first, parsed only when it may be one.
pub fn create_task_result(result: &str) -> Option<(Value, bool)> {
    // A tool result nearly always starts with its `content` (which no task result has): not
    // even scanned.
    if result.starts_with(r#"{"content":"#) || !result.contains("\"taskId\"") {
        return None;
    }
    let mut v: Value = serde_json::from_str(result).ok()?;
    if v.get("content").is_some() {
        return None;
    }
    if v.get("resultType").and_then(Value::as_str) == Some("task") {
        v.get("taskId")?.as_str()?;
        return Some((from_modern(&v), true));
    }
    let task = v.get_mut("task")?.take();
    task.get("taskId")?.as_str()?;
    Some((task, false))
}

/// The fields a task has alike in both forms.
fn common_fields(t: &Value) -> Map<String, Value> {
    [
        "taskId",
        "status",
        "statusMessage",
        "createdAt",
        "lastUpdatedAt",
    ]
    .into_iter()
    .filter_map(|k| Some((k.to_string(), t.get(k)?.clone())))
    .collect()
}

/// A 2026-07-28 task object (flat; `ttlMs`, `pollIntervalMs`) as the 2025-11-25 `Task` the
/// table keeps (`ttl`, `pollInterval`); the outcome fields (`result`, `error`,
/// `inputRequests`) are read by the caller.
pub(crate) fn from_modern(t: &Value) -> Value {
    let mut m = common_fields(t);
    m.insert("ttl".into(), t.get("ttlMs").cloned().unwrap_or(Value::Null));
    if let Some(p) = t.get("pollIntervalMs") {
        m.insert("pollInterval".into(), p.clone());
    }
    Value::Object(m)
}

/// A task's common fields in the 2026-07-28 form (flat; `ttlMs`, `pollIntervalMs`).
fn modern_fields(task: &Task) -> Map<String, Value> {
    let view = task.view();
    let mut m = common_fields(&view);
    m.insert(
        "ttlMs".into(),
        view.get("ttl").cloned().unwrap_or(Value::Null),
    );
    if let Some(p) = view.get("pollInterval") {
        m.insert("pollIntervalMs".into(), p.clone());
    }
    m
}

/// The reply to a `tools/call` whose task is handed to a 2026-07-28 client.
pub fn modern_created(task: &Task) -> Value {
    let mut m = modern_fields(task);
    m.insert("resultType".into(), json!("task"));
    Value::Object(m)
}

/// `tasks/get`'s DetailedTask (2026-07-28): a settled task's answer inline — a tool result
/// (`isError` too) is `completed` with `result`, a JSON-RPC error `failed` with `error`, a
/// cancel `cancelled`; a live task waiting on its client lists its `inputRequests`.
pub(crate) fn detailed(task: &Task) -> Value {
    let mut m = modern_fields(task);
    m.insert("resultType".into(), json!("complete"));
    match task.final_answer().as_deref() {
        Some(Ok(result)) => {
            m.insert("status".into(), json!("completed"));
            m.insert("result".into(), result.clone());
        }
        Some(Err(e)) => {
            if m.get("status") != Some(&json!("cancelled")) {
                m.insert("status".into(), json!("failed"));
                m.insert("error".into(), e.clone());
            }
        }
        None => {
            let status = m
                .get("status")
                .and_then(Value::as_str)
                .and_then(Status::parse);
            if status.is_some_and(Status::is_terminal) {
                // Its outcome is not read yet (the upstream did not answer): still working.
                m.insert("status".into(), json!("working"));
            }
            // A task waits on its client while any parked request is unanswered (the
            // upstream may say `working` again once one of several is answered).
            let inputs = task.inputs();
            if !inputs.is_empty() {
                m.insert("status".into(), json!("input_required"));
            } else if m.get("status") == Some(&json!("input_required")) {
                // Nothing to answer: every request answered (sent upstream), or none handed
                // over yet (a 2025-11-25 upstream's come on the `tasks/result` opened once its
                // status is seen): working until one is parked (SEP-2322: never
                // `input_required` without `inputRequests`).
                m.insert("status".into(), json!("working"));
            }
            if m.get("status") == Some(&json!("input_required")) {
                m.insert("inputRequests".into(), Value::Object(inputs));
            }
        }
    }
    Value::Object(m)
}

/// The refusal of a 2026-07-28 `tasks/*` request, if it is refused before lookup.
pub(crate) fn stateless(id: Value, method: &str, params: Option<&Value>) -> Option<Value> {
    if matches!(method, "tasks/result" | "tasks/list") {
        // (Refused before dispatch by the stateless endpoint; kept for any other caller.)
        let why = format!("method not found: {method} (removed in 2026-07-28)");
        return Some(RpcError::method_not_found(why).answer(&id));
    }
    let declared = params
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(META_CAPABILITIES))
        .is_some_and(declares_extension);
    if !declared {
        return Some(
            RpcError::new(
                Some(id),
                EXTENSION_NOT_DECLARED,
                format!(
                    "{method} needs the {EXTENSION} extension, which this request did not declare"
                ),
            )
            .with_data(json!({"requiredCapabilities": {"extensions": {EXTENSION: {}}}}))
            .to_value(),
        );
    }
    None
}

/// The reply to `tasks/result` from a settled answer: the related-task `_meta` names the
/// gateway's id.
pub(crate) fn answer(id: Value, task: &Task, f: &Final) -> Value {
    match f {
        Ok(result) => {
            let mut result = result.clone();
            if let Some(m) = result.as_object_mut() {
                let meta = m
                    .entry("_meta")
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Some(meta) = meta.as_object_mut() {
                    meta.insert(RELATED_TASK.into(), json!({"taskId": task.id}));
                }
            }
            jsonrpc::success(id, result)
        }
        Err(e) => crate::protocol::error::RpcError::from_peer_or(e, "task failed")
            .to(id)
            .to_value(),
    }
}

/// `{taskId: <upstream id>}`.
fn upstream_params(task: &Task) -> Map<String, Value> {
    let mut p = Map::new();
    p.insert(
        "taskId".into(),
        Value::String(task.spec.upstream_id.clone()),
    );
    p
}

pub(crate) fn is_error(result: &Value) -> bool {
    result.get("isError") == Some(&Value::Bool(true))
}

/// A request about `task` to its upstream (`{taskId: <upstream id>}`), on the connection it
/// was created on.
pub(crate) fn upstream_request<'a>(
    task: &'a Task,
    method: &'a str,
    cancel: CancellationToken,
) -> Request<'a> {
    Request::new(
        &task.registration,
        &task.upstream,
        method,
        upstream_params(task),
        cancel,
        On::Epoch(task.epoch()),
    )
}

/// A task's error object for a cancel.
pub(crate) fn cancelled_error(why: &str) -> Value {
    crate::protocol::error::RpcError::new(
        None,
        crate::protocol::error::INTERNAL_ERROR,
        format!("task cancelled: {why}"),
    )
    .object()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn task_params_are_capped_and_dropped_without_a_session() {
        let max = Duration::from_secs(60);
        let mut p = params(json!({"name": "x", "task": {"ttl": 999_999_999}}));
        assert!(prepare_call(&mut p, true, max));
        assert_eq!(p["task"]["ttl"], 60_000);
        let mut p = params(json!({"name": "x", "task": {}}));
        assert!(prepare_call(&mut p, true, max));
        assert_eq!(p["task"]["ttl"], 60_000);
        let mut p = params(json!({"name": "x", "task": {}}));
        assert!(!prepare_call(&mut p, false, max));
        assert!(!p.contains_key("task"));
        let mut p = params(json!({"name": "x"}));
        assert!(!prepare_call(&mut p, true, max));
        assert!(create_task_result(r#"{"task":{"taskId":"u","status":"working"}}"#).is_some());
        assert!(create_task_result(r#"{"content":[{"type":"text","text":"taskId"}]}"#).is_none());
        assert!(
            create_task_result(r#"{"content":[],"task":{"taskId":"u"}}"#).is_none(),
            "a tool result is never a task"
        );
    }
}
