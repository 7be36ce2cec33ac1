//! The interop matrix: clients written by others × upstreams written by others, all through
//! one gateway. Each cell is a real run: initialize (or `server/discover`), list, call,
//! progress, cancel — as far as the client can express it. The results table is written to
//! `target/interop-matrix.md` (README.md "Interop matrix" shows it); any failed step fails
//! the test. A missing peer environment fails too: run tests/peers/setup.sh.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use gatehouse::config::UpstreamConfig;
use gatehouse::{Registration, RegistrationSpec};
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tokio::time::Instant;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Client {
    Rmcp3Streamable,
    Rmcp010Sse,
    PySse,
    PyStreamable,
    PyHighLevel,
    TsSse,
    TsStreamable,
    InspectorCli,
}

impl Client {
    const ALL: [Client; 8] = [
        Client::Rmcp3Streamable,
        Client::Rmcp010Sse,
        Client::PySse,
        Client::PyStreamable,
        Client::PyHighLevel,
        Client::TsSse,
        Client::TsStreamable,
        Client::InspectorCli,
    ];
    fn label(self) -> &'static str {
        match self {
            Client::Rmcp3Streamable => "rmcp 3 (Streamable HTTP)",
            Client::Rmcp010Sse => "rmcp 0.10 (legacy SSE)",
            Client::PySse => "Python SDK `sse_client`",
            Client::PyStreamable => "Python SDK `streamable_http_client`",
            Client::PyHighLevel => "Python SDK `Client` (`server/discover`)",
            Client::TsSse => "TypeScript SDK SSE",
            Client::TsStreamable => "TypeScript SDK Streamable HTTP",
            Client::InspectorCli => "MCP Inspector CLI",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Up {
    InProcess,
    Helpdesk,
    Everything,
    PythonHttp,
}

/// What each upstream is driven with: (tool, args) for call, progress and cancel.
struct Plan {
    call: (&'static str, Value),
    progress: (&'static str, Value),
    cancel: (&'static str, Value),
}

impl Up {
    const ALL: [Up; 4] = [Up::InProcess, Up::Helpdesk, Up::Everything, Up::PythonHttp];
    fn label(self) -> &'static str {
        match self {
            Up::InProcess => "in-process tool",
            Up::Helpdesk => "helpdesk (stdio)",
            Up::Everything => "server-everything (stdio)",
            Up::PythonHttp => "Python SDK server (Streamable HTTP)",
        }
    }
    fn plan(self) -> Plan {
        match self {
            Up::InProcess => Plan {
                call: ("echo", json!({"text": "hi"})),
                progress: ("slow", json!({"ms": 300})),
                cancel: ("slow", json!({"ms": 20000})),
            },
            Up::Helpdesk => Plan {
                call: ("helpdesk.open_case", json!({"title": "matrix"})),
                progress: ("helpdesk.add_note_slow", json!({"text": "n"})),
                cancel: ("helpdesk.add_note_slow", json!({"text": "never"})),
            },
            Up::Everything => Plan {
                call: ("everything.echo", json!({"message": "hi"})),
                progress: (
                    "everything.trigger-long-running-operation",
                    json!({"duration": 0.6, "steps": 3}),
                ),
                cancel: (
                    "everything.trigger-long-running-operation",
                    json!({"duration": 30, "steps": 3}),
                ),
            },
            Up::PythonHttp => Plan {
                call: ("py.echo", json!({"message": "hi"})),
                progress: ("py.test_tool_with_progress", json!({})),
                cancel: ("py.test_long_operation", json!({"seconds": 20})),
            },
        }
    }
}

const STEPS: [&str; 5] = ["init", "list", "call", "progress", "cancel"];

/// The outcome of one step of one cell.
#[derive(Debug, Clone)]
enum Step {
    Pass(String),
    Fail(String),
    /// Not applicable, with the reason (shown under the table).
    Na(&'static str),
}

type Cell = BTreeMap<&'static str, Step>;

fn step(r: Result<String, String>) -> Step {
    match r {
        Ok(s) => Step::Pass(s),
        Err(e) => Step::Fail(e),
    }
}

const INSPECTOR_NA: &str =
    "the Inspector CLI (0.15.0) has no option to request progress or to cancel a call";

/// How long a cancel step waits before cancelling.
const CANCEL_AFTER_S: f64 = 0.5;

fn upstreams(py_url: &str) -> Vec<UpstreamConfig> {
    let py: UpstreamConfig = toml::from_str(&format!(
        "id = \"py\"\nurl = {py_url:?}\nsharing = \"shared\"\ncall_timeout_s = 60\n"
    ))
    .unwrap();
    vec![
        common::helpdesk(
            "helpdesk",
            "per_registration",
            &["--slow-ms", "1500"],
            "call_timeout_s = 60",
        ),
        common::everything("everything", "shared", 60, ""),
        py,
    ]
}

async fn register(tg: &TestGateway, up: Up, client: Client) -> Registration {
    let spec = RegistrationSpec::new(format!("matrix-{client:?}-{up:?}"));
    let spec = match up {
        Up::InProcess => spec
            .with_tool(echo_tool("echo", "E"))
            .with_tool(slow_tool("slow")),
        Up::Helpdesk => spec.grant("helpdesk.*"),
        Up::Everything => spec
            .grant("everything.echo")
            .grant("everything.trigger-long-running-operation"),
        Up::PythonHttp => spec.grant("py.*"),
    };
    tg.gateway.register(spec).await.unwrap()
}

async fn run(cmd: &mut tokio::process::Command, what: &str, secs: u64) -> Result<Value, String> {
    cmd.kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(secs), cmd.output())
        .await
        .map_err(|_| format!("{what}: timed out"))?
        .map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what}: exit {:?}: {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| {
        format!(
            "{what}: bad output ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Per-cell budget inside a batch (seconds); a step has its own smaller one.
const CELL_TIMEOUT_S: u64 = 30;

/// One `--batch` cell for py_client.py / ts_client.mjs: one connection, then call, progress
/// and cancel in that session.
fn batch_cell(client: Client, reg: &Registration, up: Up) -> Value {
    let (transport, url) = match client {
        Client::PySse | Client::TsSse => ("sse", reg.sse_url()),
        Client::PyHighLevel => ("client", reg.mcp_url()),
        _ => ("streamable", reg.mcp_url()),
    };
    let plan = up.plan();
    json!({
        "transport": transport,
        "url": url,
        "token": reg.token(),
        "timeout": CELL_TIMEOUT_S,
        "steps": [
            {"name": "call", "tool": plan.call.0, "args": plan.call.1, "timeout": 15},
            {"name": "progress", "tool": plan.progress.0, "args": plan.progress.1, "progress": true, "timeout": 15},
            {"name": "cancel", "tool": plan.cancel.0, "args": plan.cancel.1, "cancel_after": CANCEL_AFTER_S, "timeout": 15},
        ],
    })
}

/// All four upstream cells of one SDK client, in one interpreter / node process.
async fn batch_job(tg: &TestGateway, client: Client) -> Vec<(Up, Cell)> {
    let mut regs = Vec::new();
    for up in Up::ALL {
        regs.push((up, register(tg, up, client).await));
    }
    let cells: Vec<Value> = regs
        .iter()
        .map(|(up, reg)| batch_cell(client, reg, *up))
        .collect();
    let batch = Value::Array(cells).to_string();
    let mut cmd = match client {
        Client::PySse | Client::PyStreamable | Client::PyHighLevel => {
            let mut c = tokio::process::Command::new(root().join("tests/peers/.venv/bin/python"));
            c.arg(root().join("tests/peers/py_client.py"));
            c
        }
        _ => {
            let mut c = tokio::process::Command::new("node");
            c.arg(root().join("tests/peers/ts_client.mjs"));
            c
        }
    };
    cmd.args(["--batch", &batch]);
    let budget = CELL_TIMEOUT_S * Up::ALL.len() as u64 + 20;
    let out = run(&mut cmd, &format!("{client:?} --batch"), budget).await;
    let mut cells = Vec::new();
    for (i, (up, reg)) in regs.iter().enumerate() {
        let r = match &out {
            Ok(v) => v[i].clone(),
            Err(e) => json!({"error": e}),
        };
        cells.push((*up, judge_batch_cell(tg, client, *up, reg, &r).await));
    }
    cells
}

fn step_result(v: &Value, name: &str) -> Result<Value, String> {
    let s = &v["steps"][name];
    if let Some(e) = s["error"].as_str() {
        return Err(e.to_string());
    }
    if s["ok"].is_object() {
        Ok(s["ok"].clone())
    } else {
        Err(format!("step did not run: {s}"))
    }
}

fn check_progress(v: &Value) -> Result<String, String> {
    check_result(v)?;
    let n = v["progress"].as_array().map_or(0, Vec::len);
    if n == 0 {
        Err(format!("no progress received (result {})", v["call"]))
    } else {
        Ok(format!("{n} progress notifications"))
    }
}

async fn judge_batch_cell(
    tg: &TestGateway,
    client: Client,
    up: Up,
    reg: &Registration,
    r: &Value,
) -> Cell {
    let plan = up.plan();
    let mut cell = Cell::new();
    let v = match (r["error"].as_str(), r["ok"].is_object()) {
        (Some(e), _) => {
            cell.insert("init", Step::Fail(e.to_string()));
            return cell;
        }
        (None, true) => &r["ok"],
        (None, false) => {
            cell.insert("init", Step::Fail(format!("bad batch output: {r}")));
            return cell;
        }
    };
    let pv = v["protocol_version"].as_str().unwrap_or("").to_string();
    let want_modern = client == Client::PyHighLevel;
    cell.insert(
        "init",
        if pv.is_empty() || (want_modern && pv != "2026-07-28") {
            Step::Fail(format!("protocol version {pv:?}"))
        } else {
            Step::Pass(pv)
        },
    );
    cell.insert("list", step(check_listed(v, plan.call.0)));
    cell.insert(
        "call",
        step(step_result(v, "call").and_then(|c| check_result(&c))),
    );
    cell.insert(
        "progress",
        step(step_result(v, "progress").and_then(|c| check_progress(&c))),
    );
    let cancel = match step_result(v, "cancel") {
        Ok(c) if c["cancelled"] == json!(true) => audited_cancel(tg, reg).await,
        Ok(c) => Err(format!("call finished before the cancel: {}", c["call"])),
        Err(e) => Err(e),
    };
    cell.insert("cancel", step(cancel));
    cell
}

/// Did the gateway audit a cancelled call for this registration (the cancel reached it)?
async fn audited_cancel(tg: &TestGateway, reg: &Registration) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = tg.calls().iter().any(|c| {
            c.registration_id.as_deref() == Some(reg.id())
                && c.outcome.as_deref() == Some("cancelled")
        });
        if found {
            return Ok("audited cancelled".into());
        }
        if Instant::now() > deadline {
            return Err("no cancelled call in the audit".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn check_listed(v: &Value, tool: &str) -> Result<String, String> {
    let tools = v["tools"].as_array().cloned().unwrap_or_default();
    if tools.iter().any(|t| t == tool) {
        Ok(format!("{} tools", tools.len()))
    } else {
        Err(format!("{tool} not listed: {}", v["tools"]))
    }
}

fn check_result(v: &Value) -> Result<String, String> {
    let c = &v["call"];
    if c["isError"] == json!(true) || c["content"].as_array().is_none_or(|a| a.is_empty()) {
        return Err(format!("bad result: {c}"));
    }
    Ok("ok".into())
}

async fn inspector_cell(tg: &TestGateway, up: Up) -> Cell {
    let reg = register(tg, up, Client::InspectorCli).await;
    let plan = up.plan();
    let bin = root().join("tests/peers/node_modules/.bin/mcp-inspector");
    let auth = root().join("tests/peers/conformance/add-auth.mjs");
    let inspector = |extra: Vec<String>| {
        let mut c = tokio::process::Command::new(&bin);
        c.args(["--cli", &reg.mcp_url(), "--transport", "http"])
            .args(extra)
            .env("CONFORMANCE_BEARER_TOKEN", reg.token())
            .env("NODE_OPTIONS", format!("--import={}", auth.display()));
        c
    };
    let mut cell = Cell::new();
    let listed = run(
        &mut inspector(vec!["--method".into(), "tools/list".into()]),
        "inspector tools/list",
        45,
    )
    .await;
    match listed {
        Ok(v) => {
            cell.insert("init", Step::Pass("connected".into()));
            let names: Vec<Value> = v["tools"]
                .as_array()
                .map(|a| a.iter().map(|t| t["name"].clone()).collect())
                .unwrap_or_default();
            cell.insert(
                "list",
                step(check_listed(&json!({"tools": names}), plan.call.0)),
            );
        }
        Err(e) => {
            cell.insert("init", Step::Fail(e));
        }
    }
    let mut args = vec![
        "--method".into(),
        "tools/call".into(),
        "--tool-name".into(),
        plan.call.0.to_string(),
    ];
    for (k, v) in plan.call.1.as_object().unwrap() {
        args.push("--tool-arg".into());
        args.push(format!(
            "{k}={}",
            v.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string())
        ));
    }
    let called = run(&mut inspector(args), "inspector tools/call", 45).await;
    cell.insert(
        "call",
        step(called.and_then(|v| check_result(&json!({"call": v})))),
    );
    cell.insert("progress", Step::Na(INSPECTOR_NA));
    cell.insert("cancel", Step::Na(INSPECTOR_NA));
    cell
}

/// Progress notifications an rmcp client received (rmcp puts a progressToken on every request).
#[derive(Clone, Default)]
struct ProgressLog(Arc<std::sync::Mutex<Vec<f64>>>);

impl ProgressLog {
    fn take(&self) -> Vec<f64> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl rmcp::ClientHandler for ProgressLog {
    async fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        self.0.lock().unwrap().push(params.progress);
    }
}

impl rmcp_legacy_sse::ClientHandler for ProgressLog {
    async fn on_progress(
        &self,
        params: rmcp_legacy_sse::model::ProgressNotificationParam,
        _context: rmcp_legacy_sse::service::NotificationContext<rmcp_legacy_sse::RoleClient>,
    ) {
        self.0.lock().unwrap().push(params.progress);
    }
}

fn progress_note(n: usize) -> Result<String, String> {
    if n == 0 {
        Err("no progress received".into())
    } else {
        Ok(format!("{n} progress notifications"))
    }
}

async fn rmcp3_cell(tg: &TestGateway, up: Up) -> Cell {
    use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest, ServerResult};
    use rmcp::service::PeerRequestOptions;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::ServiceExt;
    let reg = register(tg, up, Client::Rmcp3Streamable).await;
    let plan = up.plan();
    let mut cell = Cell::new();
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(reg.mcp_url()).auth_header(reg.token()),
    );
    let log = ProgressLog::default();
    let client = match log.clone().serve(transport).await {
        Ok(c) => c,
        Err(e) => {
            cell.insert("init", Step::Fail(e.to_string()));
            return cell;
        }
    };
    let pv = client
        .peer_info()
        .map(|i| i.protocol_version.to_string())
        .unwrap_or_default();
    cell.insert("init", Step::Pass(pv));
    let names: Vec<String> = match client.list_all_tools().await {
        Ok(t) => t.into_iter().map(|t| t.name.to_string()).collect(),
        Err(e) => {
            cell.insert("list", Step::Fail(e.to_string()));
            return cell;
        }
    };
    cell.insert(
        "list",
        step(check_listed(&json!({"tools": names}), plan.call.0)),
    );
    let call = |(tool, args): (&'static str, Value)| {
        let params = CallToolRequestParams::new(tool)
            .with_arguments(args.as_object().cloned().unwrap_or_default());
        ClientRequest::CallToolRequest(CallToolRequest::new(params))
    };
    let result = |r: Result<ServerResult, rmcp::ServiceError>| match r {
        Ok(ServerResult::CallToolResult(r)) => {
            check_result(&json!({"call": serde_json::to_value(&r).unwrap()}))
        }
        Ok(other) => Err(format!("unexpected result: {other:?}")),
        Err(e) => Err(e.to_string()),
    };
    let r = tokio::time::timeout(
        Duration::from_secs(15),
        client.send_request(call(plan.call)),
    )
    .await
    .map_err(|_| "timed out".to_string())
    .and_then(result);
    cell.insert("call", step(r));
    log.take();
    let r = tokio::time::timeout(
        Duration::from_secs(15),
        client.send_request(call(plan.progress)),
    )
    .await
    .map_err(|_| "timed out".to_string())
    .and_then(result);
    // rmcp runs notification handlers in their own tasks: let the last one land.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = r.and_then(|_| progress_note(log.take().len()));
    cell.insert("progress", step(r));
    let r = match client
        .send_cancellable_request(call(plan.cancel), PeerRequestOptions::no_options())
        .await
    {
        Ok(mut handle) => {
            match tokio::time::timeout(Duration::from_secs_f64(CANCEL_AFTER_S), &mut handle.rx)
                .await
            {
                Ok(r) => Err(format!("call finished before the cancel: {r:?}")),
                Err(_) => match handle.cancel(Some("interop matrix".into())).await {
                    Ok(()) => audited_cancel(tg, &reg).await,
                    Err(e) => Err(e.to_string()),
                },
            }
        }
        Err(e) => Err(e.to_string()),
    };
    cell.insert("cancel", step(r));
    let _ = client.cancel().await;
    cell
}

async fn rmcp010_cell(tg: &TestGateway, up: Up) -> Cell {
    use rmcp_legacy_sse::model::{
        CallToolRequest, CallToolRequestParam, ClientRequest, ServerResult,
    };
    use rmcp_legacy_sse::service::PeerRequestOptions;
    use rmcp_legacy_sse::transport::{sse_client::SseClientConfig, SseClientTransport};
    use rmcp_legacy_sse::ServiceExt;
    let reg = register(tg, up, Client::Rmcp010Sse).await;
    let plan = up.plan();
    let mut cell = Cell::new();
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {}", reg.token()).parse().unwrap(),
    );
    let http = reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap();
    let transport = match SseClientTransport::start_with_client(
        http,
        SseClientConfig {
            sse_endpoint: reg.sse_url().into(),
            ..Default::default()
        },
    )
    .await
    {
        Ok(t) => t,
        Err(e) => {
            cell.insert("init", Step::Fail(e.to_string()));
            return cell;
        }
    };
    let log = ProgressLog::default();
    let client = match log.clone().serve(transport).await {
        Ok(c) => c,
        Err(e) => {
            cell.insert("init", Step::Fail(e.to_string()));
            return cell;
        }
    };
    let pv = client
        .peer_info()
        .map(|i| i.protocol_version.to_string())
        .unwrap_or_default();
    cell.insert("init", Step::Pass(pv));
    match client.list_tools(Default::default()).await {
        Ok(t) => {
            let names: Vec<String> = t.tools.iter().map(|t| t.name.to_string()).collect();
            cell.insert(
                "list",
                step(check_listed(&json!({"tools": names}), plan.call.0)),
            );
        }
        Err(e) => {
            cell.insert("list", Step::Fail(e.to_string()));
        }
    }
    let call = |(tool, args): (&'static str, Value)| {
        ClientRequest::CallToolRequest(CallToolRequest::new(CallToolRequestParam {
            name: tool.into(),
            arguments: args.as_object().cloned(),
        }))
    };
    let result = |r: Result<ServerResult, rmcp_legacy_sse::ServiceError>| match r {
        Ok(ServerResult::CallToolResult(r)) => {
            check_result(&json!({"call": serde_json::to_value(&r).unwrap()}))
        }
        Ok(other) => Err(format!("unexpected result: {other:?}")),
        Err(e) => Err(e.to_string()),
    };
    let r = tokio::time::timeout(
        Duration::from_secs(15),
        client.send_request(call(plan.call)),
    )
    .await
    .map_err(|_| "timed out".to_string())
    .and_then(result);
    cell.insert("call", step(r));
    log.take();
    let r = tokio::time::timeout(
        Duration::from_secs(15),
        client.send_request(call(plan.progress)),
    )
    .await
    .map_err(|_| "timed out".to_string())
    .and_then(result);
    // rmcp runs notification handlers in their own tasks: let the last one land.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = r.and_then(|_| progress_note(log.take().len()));
    cell.insert("progress", step(r));
    let r = match client
        .send_cancellable_request(call(plan.cancel), PeerRequestOptions::no_options())
        .await
    {
        Ok(mut handle) => {
            match tokio::time::timeout(Duration::from_secs_f64(CANCEL_AFTER_S), &mut handle.rx)
                .await
            {
                Ok(r) => Err(format!("call finished before the cancel: {r:?}")),
                Err(_) => match handle.cancel(Some("interop matrix".into())).await {
                    Ok(()) => audited_cancel(tg, &reg).await,
                    Err(e) => Err(e.to_string()),
                },
            }
        }
        Err(e) => Err(e.to_string()),
    };
    cell.insert("cancel", step(r));
    let _ = client.cancel().await;
    cell
}

fn table(results: &BTreeMap<(Client, Up), Cell>) -> String {
    let mut s = String::from(
        "Steps per cell: init (initialize, or `server/discover` for the Python `Client`) · list \
         (`tools/list` shows the cell's tool) · call · progress (at least one \
         `notifications/progress` from the upstream reached the client) · cancel (the client \
         cancelled mid-call and the gateway's audit log recorded the call `cancelled`). \
         ✓ passed, ✗ failed, n/a not applicable (reason below).\n\n| client \\ upstream |",
    );
    for up in Up::ALL {
        s.push_str(&format!(" {} |", up.label()));
    }
    s.push_str("\n|---|");
    for _ in Up::ALL {
        s.push_str("---|");
    }
    s.push('\n');
    let mut reasons: Vec<&'static str> = Vec::new();
    for c in Client::ALL {
        s.push_str(&format!("| {} |", c.label()));
        for up in Up::ALL {
            let cell = &results[&(c, up)];
            let parts: Vec<String> = STEPS
                .iter()
                .map(|name| match cell.get(name) {
                    Some(Step::Pass(_)) => format!("{name} ✓"),
                    Some(Step::Fail(_)) => format!("{name} ✗"),
                    Some(Step::Na(why)) => {
                        if !reasons.contains(why) {
                            reasons.push(why);
                        }
                        format!("{name} n/a")
                    }
                    None => format!("{name} ✗ (not run)"),
                })
                .collect();
            s.push_str(&format!(" {} |", parts.join(" · ")));
        }
        s.push('\n');
    }
    if !reasons.is_empty() {
        s.push('\n');
        for r in reasons {
            s.push_str(&format!("n/a: {r}.\n"));
        }
    }
    s.push_str("\nDetails (negotiated protocol version, progress count, or the failure):\n\n");
    for ((c, up), cell) in results {
        let parts: Vec<String> = STEPS
            .iter()
            .filter_map(|name| match cell.get(name) {
                Some(Step::Pass(n)) => Some(format!("{name}: {n}")),
                Some(Step::Fail(e)) => Some(format!("{name}: FAILED {e}")),
                Some(Step::Na(_)) => None,
                None => Some(format!("{name}: not run")),
            })
            .collect();
        s.push_str(&format!(
            "- {} × {}: {}\n",
            c.label(),
            up.label(),
            parts.join("; ")
        ));
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interop_matrix() {
    let started = Instant::now();
    let py = python_http_upstream().await;
    let tg = Arc::new(TestGateway::with(|c| {
        c.upstreams = upstreams(&py.url);
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
    }));
    // Bounded parallelism: at most 4 client processes (or rmcp cells) at once. The slowest
    // jobs (one Python interpreter per Python client, four cells each) start first.
    let limit = Arc::new(Semaphore::new(4));
    let mut set = tokio::task::JoinSet::new();
    let batch_clients = [
        Client::PyHighLevel,
        Client::PySse,
        Client::PyStreamable,
        Client::TsSse,
        Client::TsStreamable,
    ];
    for c in batch_clients {
        let (tg, limit) = (tg.clone(), limit.clone());
        set.spawn(async move {
            let _permit = limit.acquire_owned().await.unwrap();
            let t = Instant::now();
            let cells = batch_job(&tg, c).await;
            eprintln!("job {c:?} ({:.1} s)", t.elapsed().as_secs_f64());
            cells
                .into_iter()
                .map(|(up, cell)| ((c, up), cell))
                .collect::<Vec<_>>()
        });
    }
    for c in [
        Client::InspectorCli,
        Client::Rmcp3Streamable,
        Client::Rmcp010Sse,
    ] {
        for up in Up::ALL {
            let (tg, limit) = (tg.clone(), limit.clone());
            set.spawn(async move {
                let _permit = limit.acquire_owned().await.unwrap();
                let t = Instant::now();
                let run = async {
                    match c {
                        Client::Rmcp3Streamable => rmcp3_cell(&tg, up).await,
                        Client::Rmcp010Sse => rmcp010_cell(&tg, up).await,
                        _ => inspector_cell(&tg, up).await,
                    }
                };
                let cell = match tokio::time::timeout(Duration::from_secs(100), run).await {
                    Ok(cell) => cell,
                    Err(_) => {
                        Cell::from([("init", Step::Fail("cell timed out after 100 s".to_string()))])
                    }
                };
                eprintln!("job {c:?} x {up:?} ({:.1} s)", t.elapsed().as_secs_f64());
                vec![((c, up), cell)]
            });
        }
    }
    let mut results = BTreeMap::new();
    while let Some(r) = set.join_next().await {
        results.extend(r.unwrap());
    }
    let md = format!(
        "{}\nOne run of `cargo test --test interop_matrix`: {:.0} s.\n",
        table(&results),
        started.elapsed().as_secs_f64()
    );
    let path = root().join("target/interop-matrix.md");
    std::fs::write(&path, &md).unwrap();
    println!("{md}");
    let failures: Vec<String> = results
        .iter()
        .flat_map(|((c, up), cell)| {
            STEPS.iter().filter_map(move |name| match cell.get(name) {
                Some(Step::Fail(e)) => Some(format!("{} × {}: {name}: {e}", c.label(), up.label())),
                None => Some(format!("{} × {}: {name}: not run", c.label(), up.label())),
                _ => None,
            })
        })
        .collect();
    assert!(
        failures.is_empty(),
        "interop matrix failures:\n{}",
        failures.join("\n")
    );
    tg.gateway.shutdown().await;
}
