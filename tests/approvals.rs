//! Approval of one exact call (issue 49 item 3) on a real `gatehouse serve` through real
//! sockets: a call an `approve` rule matches is held while the official Python SDK client waits
//! on it; the harness decides through the admin API's long poll, through the Python
//! `AdminClient`, or not in time (a denial); a release cancels it and the client gets its
//! error; bounds hold; the client's user decides through the SDK's elicitation callback or a
//! 2026-07-28 input request, whose retry must carry the very arguments approved.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::daemon::Daemon;
use gatehouse::testing::audit::Record;
use reqwest::Method;
use serde_json::{json, Value};

fn daemon(extra: &str) -> Daemon {
    Daemon::start(extra, "redact_keys = [\"card\"]", "warn", &[])
}

/// A rule holding `demo.echo` calls whose text starts with `pay` for `approver`.
fn pay_rule(approver: &str, timeout_s: u64) -> Value {
    json!([{"id": "pay", "when": "tool.name == 'demo.echo' && args.text.startsWith('pay')",
            "effect": "approve", "approver": approver, "timeout_s": timeout_s}])
}

/// The JSON-RPC answer of a POST: a JSON body (200, or 400 with a JSON-RPC error), or the
/// last `data:` of an event stream.
async fn answer(r: reqwest::Response) -> Value {
    let status = r.status().as_u16();
    assert!(status == 200 || status == 400, "{status}");
    let text = r.text().await.unwrap();
    if text.trim_start().starts_with('{') {
        return serde_json::from_str(&text).unwrap();
    }
    let last = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or_else(|| panic!("no answer in {text:?}"));
    serde_json::from_str(last).unwrap()
}

/// One stateless (2026-07-28) `tools/call` with `extra` params (`requestState`,
/// `inputResponses`) and the client capabilities `caps`: the JSON-RPC answer.
async fn call(reg: &Value, args: Value, caps: Value, extra: Value) -> Value {
    call_tool(reg, "demo.echo", args, caps, extra).await
}

/// [`call`] of another tool.
async fn call_tool(reg: &Value, tool: &str, args: Value, caps: Value, extra: Value) -> Value {
    let mut params = json!({
        "name": tool,
        "arguments": args,
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": caps},
    });
    for (k, v) in extra.as_object().unwrap() {
        params[k] = v.clone();
    }
    let r = reqwest::Client::builder()
        .timeout(Duration::from_secs(90))
        .build()
        .unwrap()
        .post(reg["mcp_url"].as_str().unwrap())
        .bearer_auth(reg["token"].as_str().unwrap())
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .json(&json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}))
        .send()
        .await
        .unwrap();
    answer(r).await
}

/// The text of a call's result, and whether it is a tool error.
fn text(v: &Value) -> (String, bool) {
    let r = &v["result"];
    (
        r["content"][0]["text"].as_str().unwrap_or("").to_string(),
        r["isError"].as_bool().unwrap_or(false),
    )
}

/// `GET /v1/approvals?wait=N`: the pending approvals.
async fn pending(d: &Daemon, wait: u64) -> Vec<Value> {
    let (s, v) = d
        .admin_call(Method::GET, &format!("/v1/approvals?wait={wait}"), None)
        .await;
    assert_eq!(s, 200, "{v}");
    v["approvals"].as_array().unwrap().clone()
}

/// Waits (20 s at most) until `n` approvals are pending.
async fn until_pending(d: &Daemon, n: usize) -> Vec<Value> {
    let t0 = Instant::now();
    loop {
        let p = pending(d, 5).await;
        if p.len() >= n {
            return p;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{n} pending: {p:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn decide(d: &Daemon, id: &str, body: Value) -> (u16, Value) {
    d.admin_call(Method::POST, &format!("/v1/approvals/{id}"), Some(body))
        .await
}

/// The approval records and the call record of approval `id`, in the order written.
fn trail(d: &Daemon, id: &str) -> Vec<Record<'static>> {
    d.audit()
        .into_iter()
        .filter(|r| r.rare().approval_id.as_deref() == Some(id))
        .collect()
}

/// Checks the three records of one approval: requested, decided (`by`, `decision`), then the
/// call's record with `outcome`; consecutive in the chain's order.
fn assert_trail(
    d: &Daemon,
    id: &str,
    by: &str,
    decision: &str,
    outcome: &str,
) -> Vec<Record<'static>> {
    let t = trail(d, id);
    let events: Vec<&str> = t.iter().map(|r| r.event.as_ref()).collect();
    assert_eq!(
        events,
        [
            "approval_requested",
            "approval_decided",
            "governed_mcp_call"
        ],
        "{t:?}"
    );
    assert!(t[0].seq < t[1].seq && t[1].seq < t[2].seq);
    assert_eq!(t[1].rare().decided_by.as_deref(), Some(by), "{t:?}");
    assert_eq!(t[1].rare().decision.as_deref(), Some(decision), "{t:?}");
    assert!(t[1].rare().wait_ms.is_some());
    assert_eq!(t[2].outcome.as_deref(), Some(outcome), "{t:?}");
    for r in &t {
        assert_eq!(r.rare().rule.as_deref(), Some("pay"));
        assert_eq!(r.tool.as_deref(), Some("demo.echo"));
        assert_eq!(r.args_digest, t[0].args_digest);
    }
    t
}

/// The chain verifies (`gatehouse audit verify`).
fn assert_chain(d: &Daemon) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gatehouse"))
        .args(["audit", "verify"])
        .arg(d.audit_path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The official Python SDK client (Streamable HTTP) calling `demo.echo` with `args` once,
/// in the background: the cell's result.
fn sdk_call(reg: &Value, args: Value, elicit: Option<Value>) -> tokio::task::JoinHandle<Value> {
    let mut cell = json!({"transport": "streamable", "url": reg["mcp_url"], "token": reg["token"],
                          "steps": [{"name": "pay", "tool": "demo.echo", "args": args, "timeout": 60}]});
    if let Some(e) = elicit {
        cell["elicit"] = e;
    }
    tokio::spawn(async move {
        let cells = common::peers::batch(".venv", "py_client.py", &json!([cell])).await;
        cells[0].clone()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harness_approval_through_the_long_poll_while_the_sdk_client_waits() {
    let d = daemon("");
    let reg = d
        .register(
            json!({"agent_id": "payer", "tools": ["demo.*"], "policy": pay_rule("harness", 60)}),
        )
        .await;
    // Not held: a call the rule does not match runs at once.
    let (t, err) = text(&call(&reg, json!({"text": "hello"}), json!({}), json!({})).await);
    assert_eq!((t.as_str(), err), ("payer:hello", false));
    assert!(pending(&d, 0).await.is_empty());
    let client = sdk_call(&reg, json!({"text": "pay 10", "card": "4111"}), None);
    // The long poll answers once the call is held.
    let t0 = Instant::now();
    let p = pending(&d, 20).await;
    assert_eq!(p.len(), 1, "{p:?}");
    let a = &p[0];
    assert_eq!(a["tool"], "demo.echo");
    assert_eq!(a["agent_id"], "payer");
    assert_eq!(a["registration_id"], reg["id"]);
    assert_eq!(a["rule"], "pay");
    assert_eq!(a["approver"], "harness");
    // `redact_keys` applied to what the harness is shown.
    assert_eq!(
        a["arguments"],
        json!({"text": "pay 10", "card": "[redacted]"})
    );
    assert_eq!(a["definition_digest"].as_str().unwrap().len(), 64);
    let id = a["id"].as_str().unwrap();
    // The client waits meanwhile.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!client.is_finished());
    // Clear answers for bad decisions.
    let (s, v) = decide(&d, id, json!({"decision": "maybe"})).await;
    assert_eq!(s, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("decision"), "{v}");
    let (s, _) = decide(&d, id, json!({"decision": "approve", "colour": 1})).await;
    assert_eq!(s, 400);
    let (s, _) = decide(&d, "no-such-approval", json!({"decision": "approve"})).await;
    assert_eq!(s, 404);
    let (s, v) = decide(
        &d,
        id,
        json!({"decision": "approve", "reason": "ok by ops"}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    // Single use: a second decision is a conflict.
    let (s, v) = decide(&d, id, json!({"decision": "deny"})).await;
    assert_eq!(s, 409, "{v}");
    assert!(v["error"].as_str().unwrap().contains("approved"), "{v}");
    let cell = client.await.unwrap();
    let out = common::peers::ok("py_client.py", &cell);
    let step = &out["steps"]["pay"];
    assert_eq!(step["ok"]["call"]["isError"], json!(false), "{step}");
    assert_eq!(common::peers::step_text(step), "payer:pay 10");
    assert!(t0.elapsed() > Duration::from_millis(300));
    d.wait_audit(10, |r| {
        r.iter().filter(|r| r.event == "governed_mcp_call").count() >= 2
    })
    .await;
    let t = assert_trail(&d, id, "harness", "approve", "ok");
    assert_eq!(t[0].rare().approver.as_deref(), Some("harness"));
    assert_eq!(t[1].reason.as_deref(), Some("ok by ops"));
    assert_eq!(t[0].agent_id.as_deref(), Some("payer"));
    assert_chain(&d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harness_approval_through_the_python_admin_client_and_a_deny_carries_the_reason() {
    let d = daemon("");
    let reg = d
        .register(
            json!({"agent_id": "payer", "tools": ["demo.*"], "policy": pay_rule("harness", 60)}),
        )
        .await;
    // The Python package's AdminClient (pure Python: loaded from the source tree without the
    // native module), as a harness would run it: wait, approve the first, deny the second.
    let pkg = common::repo_root().join("bindings/python/python/gatehouse");
    let script = format!(
        r#"
import json, sys, types
pkg = types.ModuleType("gatehouse"); pkg.__path__ = [{pkg:?}]; sys.modules["gatehouse"] = pkg
from gatehouse._admin import AdminClient
from gatehouse._errors import AdminError
c = AdminClient(url={url:?}, token={token:?})
out = []
for decision in ["approve", "deny"]:
    [p] = c.approvals(wait=20)
    out.append(p)
    if decision == "approve":
        c.approve(p["id"])
    else:
        c.deny(p["id"], reason="over the weekly budget")
    try:
        c.approve(p["id"])
        out.append("decided twice")
    except AdminError as e:
        out.append(e.status)
    while c.approvals():
        pass
print(json.dumps(out))
"#,
        pkg = pkg.display().to_string(),
        url = d.admin,
        token = d.token,
    );
    let harness = tokio::process::Command::new(common::peers::python())
        .args(["-c", &script])
        .kill_on_drop(true)
        .output();
    let harness = tokio::spawn(harness);
    let first = sdk_call(&reg, json!({"text": "pay 10"}), None);
    let cell = first.await.unwrap();
    let out = common::peers::ok("py_client.py", &cell);
    assert_eq!(
        common::peers::step_text(&out["steps"]["pay"]),
        "payer:pay 10"
    );
    let second = sdk_call(&reg, json!({"text": "pay 20"}), None);
    let cell = second.await.unwrap();
    let out = common::peers::ok("py_client.py", &cell);
    let step = &out["steps"]["pay"];
    assert_eq!(step["ok"]["call"]["isError"], json!(true), "{step}");
    let t = common::peers::step_text(step);
    assert!(
        t.contains("over the weekly budget") && t.contains("harness"),
        "{t}"
    );
    let h = harness.await.unwrap().unwrap();
    assert!(h.status.success(), "{}", String::from_utf8_lossy(&h.stderr));
    let seen: Value = serde_json::from_slice(&h.stdout).unwrap();
    assert_eq!(seen[0]["arguments"], json!({"text": "pay 10"}), "{seen}");
    assert_eq!(seen[1], json!(409));
    assert_eq!(seen[2]["arguments"], json!({"text": "pay 20"}), "{seen}");
    assert_eq!(seen[3], json!(409));
    d.wait_audit(10, |r| {
        r.iter().filter(|r| r.event == "governed_mcp_call").count() >= 2
    })
    .await;
    assert_trail(
        &d,
        seen[0]["id"].as_str().unwrap(),
        "harness",
        "approve",
        "ok",
    );
    let t = assert_trail(
        &d,
        seen[2]["id"].as_str().unwrap(),
        "harness",
        "deny",
        "denied",
    );
    assert_eq!(t[1].reason.as_deref(), Some("over the weekly budget"));
    assert!(t[2]
        .reason
        .as_deref()
        .unwrap()
        .contains("over the weekly budget"));
    assert_chain(&d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_denies_the_call() {
    let d = daemon("");
    let reg = d
        .register(
            json!({"agent_id": "payer", "tools": ["demo.*"], "policy": pay_rule("harness", 1)}),
        )
        .await;
    let t0 = Instant::now();
    let (t, err) = text(&call(&reg, json!({"text": "pay 1"}), json!({}), json!({})).await);
    let took = t0.elapsed();
    assert!(err && t.contains("timed out") && t.contains("pay"), "{t}");
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert!(pending(&d, 0).await.is_empty());
    d.wait_audit(10, |r| r.iter().any(|r| r.event == "governed_mcp_call"))
        .await;
    let id = d
        .audit()
        .into_iter()
        .find(|r| r.event == "approval_requested")
        .and_then(|r| r.rare().approval_id.clone())
        .unwrap();
    let t = assert_trail(&d, &id, "gatehouse", "timeout", "denied");
    assert!(t[1].rare().wait_ms.unwrap() >= 1000);
    // Too late to decide now.
    let (s, v) = decide(&d, &id, json!({"decision": "approve"})).await;
    assert_eq!(s, 409, "{v}");
    assert!(v["error"].as_str().unwrap().contains("timed out"), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_the_registration_or_its_parent_cancels_held_calls_and_the_client_gets_its_error(
) {
    let d = daemon("");
    let reg = d
        .register(
            json!({"agent_id": "payer", "tools": ["demo.*"], "policy": pay_rule("harness", 60)}),
        )
        .await;
    let client = sdk_call(&reg, json!({"text": "pay 10"}), None);
    let p = until_pending(&d, 1).await;
    let id = p[0]["id"].as_str().unwrap().to_string();
    let t0 = Instant::now();
    let (s, _) = d
        .admin_call(
            Method::DELETE,
            &format!("/v1/registrations/{}", reg["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(s, 204);
    let cell = client.await.unwrap();
    // The SDK client's call ends in an error, promptly (not its 60 s step timeout).
    let step = &cell["ok"]["steps"]["pay"];
    assert!(step.get("error").is_some(), "{cell}");
    assert!(
        step["error"]
            .as_str()
            .unwrap()
            .contains("registration released"),
        "{step}"
    );
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    assert!(pending(&d, 0).await.is_empty());
    d.wait_audit(10, |r| r.iter().any(|r| r.event == "governed_mcp_call"))
        .await;
    let t = assert_trail(&d, &id, "gatehouse", "cancelled", "cancelled");
    assert_eq!(t[1].reason.as_deref(), Some("registration released"));
    let (s, _) = decide(&d, &id, json!({"decision": "approve"})).await;
    assert_eq!(s, 409);

    // A child's held call goes with its parent's release.
    let parent = d
        .register(json!({"agent_id": "planner", "tools": ["demo.*"]}))
        .await;
    let child = d
        .register(
            json!({"agent_id": "payer", "tools": ["demo.echo"], "parent": parent["id"],
                         "policy": pay_rule("harness", 60)}),
        )
        .await;
    let held =
        tokio::spawn(
            async move { call(&child, json!({"text": "pay 3"}), json!({}), json!({})).await },
        );
    let p = until_pending(&d, 1).await;
    assert_eq!(p[0]["agent_path"], json!(["planner", "payer"]));
    let (s, _) = d
        .admin_call(
            Method::DELETE,
            &format!("/v1/registrations/{}", parent["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(s, 204);
    // The stateless client's stream ends without a result.
    let ended = tokio::time::timeout(Duration::from_secs(10), held).await;
    assert!(
        ended.is_err() || ended.unwrap().is_err(),
        "no result after the release"
    );
    assert!(pending(&d, 0).await.is_empty());
    // The child's approval records carry its chain, like every record about it.
    let child_id = p[0]["id"].as_str().unwrap().to_string();
    d.wait_audit(10, |r| {
        r.iter().filter(|r| r.event == "approval_decided").count() >= 2
    })
    .await;
    let t = trail(&d, &child_id);
    assert!(t.len() >= 2, "{t:?}");
    for r in &t {
        assert_eq!(r.agent_id.as_deref(), Some("payer"));
        assert_eq!(
            r.rare().parent_registration_id.as_deref(),
            parent["id"].as_str()
        );
        assert_eq!(
            r.rare().agent_path.as_deref(),
            Some(&["planner".to_string(), "payer".to_string()][..])
        );
    }
    assert_eq!(t[1].rare().decision.as_deref(), Some("cancelled"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_calls_are_bounded_per_registration_and_in_all() {
    let d =
        daemon("[policy]\nmax_pending_approvals = 3\nmax_pending_approvals_per_registration = 2\n");
    let spec = json!({"agent_id": "payer", "tools": ["demo.*"], "policy": pay_rule("harness", 60)});
    let a = d.register(spec.clone()).await;
    let b = d.register(spec).await;
    let mut held = Vec::new();
    for reg in [&a, &a] {
        let reg = reg.clone();
        held.push(tokio::spawn(async move {
            call(&reg, json!({"text": "pay"}), json!({}), json!({})).await
        }));
    }
    until_pending(&d, 2).await;
    let (t, err) = text(&call(&a, json!({"text": "pay"}), json!({}), json!({})).await);
    assert!(
        err && t.contains("too many calls of this registration wait for approval (at most 2)"),
        "{t}"
    );
    let reg = b.clone();
    held.push(tokio::spawn(async move {
        call(&reg, json!({"text": "pay"}), json!({}), json!({})).await
    }));
    until_pending(&d, 3).await;
    let (t, err) = text(&call(&b, json!({"text": "pay"}), json!({}), json!({})).await);
    assert!(
        err && t.contains("too many calls wait for approval (at most 3)"),
        "{t}"
    );
    // Denied over the bound: audited with the reason, no approval asked.
    for p in pending(&d, 0).await {
        let (s, _) = decide(
            &d,
            p["id"].as_str().unwrap(),
            json!({"decision": "deny", "reason": "drill"}),
        )
        .await;
        assert_eq!(s, 200);
    }
    for h in held {
        let (t, err) = text(&h.await.unwrap());
        assert!(err && t.contains("drill"), "{t}");
    }
    d.wait_audit(10, |r| {
        r.iter().filter(|r| r.event == "governed_mcp_call").count() >= 5
    })
    .await;
    let over: Vec<_> = d
        .audit()
        .into_iter()
        .filter(|r| {
            r.event == "governed_mcp_call"
                && r.reason.as_deref().is_some_and(|x| x.contains("too many"))
        })
        .collect();
    assert_eq!(over.len(), 2, "{over:?}");
    assert!(over
        .iter()
        .all(|r| r.outcome.as_deref() == Some("denied") && r.rare().approval_id.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_approval_through_the_sdks_elicitation_callback() {
    let d = daemon("");
    let reg = d
        .register(
            json!({"agent_id": "payer", "tools": ["demo.*"], "policy": pay_rule("client", 60)}),
        )
        .await;
    // The user approves.
    let cell = sdk_call(
        &reg,
        json!({"text": "pay 10", "card": "4111"}),
        Some(json!({"approve": true})),
    )
    .await
    .unwrap();
    let out = common::peers::ok("py_client.py", &cell);
    assert_eq!(
        common::peers::step_text(&out["steps"]["pay"]),
        "payer:pay 10",
        "{out}"
    );
    assert_eq!(out["asked"], json!(["elicitation"]), "{out}");
    // The user says no, with a reason.
    let cell = sdk_call(
        &reg,
        json!({"text": "pay 20"}),
        Some(json!({"approve": false, "reason": "not today"})),
    )
    .await
    .unwrap();
    let out = common::peers::ok("py_client.py", &cell);
    let step = &out["steps"]["pay"];
    assert_eq!(step["ok"]["call"]["isError"], json!(true), "{step}");
    assert!(
        common::peers::step_text(step).contains("not today"),
        "{step}"
    );
    // A 2026-07-28 client (the SDK's `Client`, stateless): asked through an input request
    // (`input_required`), its elicitation callback answers, its retry runs the call.
    let cell = json!({"transport": "client", "mode": "2026-07-28", "url": reg["mcp_url"],
                      "token": reg["token"], "elicit": {"approve": true},
                      "steps": [{"name": "pay", "tool": "demo.echo", "args": {"text": "pay 30"}, "timeout": 60}]});
    let cells = common::peers::batch(".venv", "py_client.py", &json!([cell])).await;
    let out = common::peers::ok("py_client.py", &cells[0]);
    assert_eq!(out["protocol_version"], "2026-07-28", "{out}");
    assert_eq!(
        common::peers::step_text(&out["steps"]["pay"]),
        "payer:pay 30",
        "{out}"
    );
    assert_eq!(out["asked"], json!(["elicitation"]), "{out}");
    d.wait_audit(10, |r| {
        r.iter().filter(|r| r.event == "governed_mcp_call").count() >= 3
    })
    .await;
    let ids: Vec<String> = d
        .audit()
        .into_iter()
        .filter(|r| r.event == "approval_requested")
        .map(|r| r.rare().approval_id.clone().unwrap().into_owned())
        .collect();
    assert_eq!(ids.len(), 3);
    let t = assert_trail(&d, &ids[0], "client", "approve", "ok");
    assert_eq!(t[0].rare().approver.as_deref(), Some("client"));
    let t = assert_trail(&d, &ids[1], "client", "deny", "denied");
    assert_eq!(t[1].reason.as_deref(), Some("not today"));
    let t = assert_trail(&d, &ids[2], "client", "approve", "ok");
    assert_eq!(t[2].transport.as_deref(), Some("stateless"));
    assert_chain(&d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_clients_input_request_approves_only_the_arguments_shown() {
    let d = daemon("");
    let reg = d
        .register(
            json!({"agent_id": "payer", "tools": ["demo.*"], "policy": pay_rule("client", 60)}),
        )
        .await;
    // A client that declared no elicitation cannot be asked: denied with that reason.
    let (t, err) = text(&call(&reg, json!({"text": "pay 1"}), json!({}), json!({})).await);
    assert!(err && t.contains("declared neither elicitation nor"), "{t}");
    // One that did gets an input request showing the tool, the agent and the arguments
    // (redacted).
    let caps = json!({"elicitation": {}});
    let args = json!({"text": "pay 10", "card": "4111"});
    let first = call(&reg, args.clone(), caps.clone(), json!({})).await;
    let r = &first["result"];
    assert_eq!(r["resultType"], "input_required", "{first}");
    let (key, req) = r["inputRequests"]
        .as_object()
        .unwrap()
        .iter()
        .next()
        .unwrap();
    assert_eq!(req["method"], "elicitation/create");
    let msg = req["params"]["message"].as_str().unwrap();
    assert!(
        msg.contains("demo.echo") && msg.contains("payer") && msg.contains("pay 10"),
        "{msg}"
    );
    assert!(msg.contains("[redacted]") && !msg.contains("4111"), "{msg}");
    let state = r["requestState"].clone();
    let yes = json!({key.clone(): {"action": "accept", "content": {"approve": true}}});
    // Changing an argument after approval is refused, and the approval is spent.
    let changed = json!({"text": "pay 10000", "card": "4111"});
    let retry = call(
        &reg,
        changed,
        caps.clone(),
        json!({"requestState": state, "inputResponses": yes}),
    )
    .await;
    assert_eq!(retry["error"]["code"], json!(-32602), "{retry}");
    let m = retry["error"]["message"].as_str().unwrap();
    assert!(m.contains("arguments differ"), "{m}");
    let again = call(
        &reg,
        args.clone(),
        caps.clone(),
        json!({"requestState": state, "inputResponses": yes}),
    )
    .await;
    assert_eq!(again["error"]["code"], json!(-32602), "{again}");
    // A fresh call, retried with the very arguments shown, runs.
    let first = call(&reg, args.clone(), caps.clone(), json!({})).await;
    let r = &first["result"];
    let (key, _) = r["inputRequests"]
        .as_object()
        .unwrap()
        .iter()
        .next()
        .unwrap();
    let yes = json!({key.clone(): {"action": "accept", "content": {"approve": true}}});
    let done = call(
        &reg,
        args,
        caps,
        json!({"requestState": r["requestState"], "inputResponses": yes}),
    )
    .await;
    let (t, err) = text(&done);
    assert_eq!((t.as_str(), err), ("payer:pay 10", false), "{done}");
    d.wait_audit(10, |r| {
        r.iter().filter(|r| r.event == "governed_mcp_call").count() >= 3
    })
    .await;
    let ids: Vec<String> = d
        .audit()
        .into_iter()
        .filter(|r| r.event == "approval_requested")
        .map(|r| r.rare().approval_id.clone().unwrap().into_owned())
        .collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    let t = trail(&d, &ids[1]);
    let decided = t.iter().find(|r| r.event == "approval_decided").unwrap();
    assert_eq!(decided.rare().decision.as_deref(), Some("deny"));
    assert!(
        decided
            .reason
            .as_deref()
            .unwrap()
            .contains("arguments differ"),
        "{decided:?}"
    );
    assert_trail(&d, &ids[2], "client", "approve", "ok");
    assert_chain(&d);
}

/// A receiver of webhook POSTs on 127.0.0.1:0: its URL, and each POST's signature and body.
async fn webhook_receiver() -> (String, tokio::sync::mpsc::Receiver<(String, Vec<u8>)>) {
    use axum::routing::post;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let app = axum::Router::new().route(
        "/hook",
        post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let tx = tx.clone();
                async move {
                    let sig = headers
                        .get("x-gatehouse-signature")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string();
                    let _ = tx.send((sig, body.to_vec())).await;
                    axum::http::StatusCode::NO_CONTENT
                }
            },
        ),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    (url, rx)
}

/// HMAC-SHA256 as the receiver computes it (RFC 2104, independently of the gateway's).
fn hmac(key: &[u8], msg: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut k = [0u8; 64];
    k[..key.len()].copy_from_slice(key);
    let ipad: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
    let opad: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
    let inner = Sha256::new()
        .chain_update(&ipad)
        .chain_update(msg)
        .finalize();
    hex::encode(
        Sha256::new()
            .chain_update(&opad)
            .chain_update(inner)
            .finalize(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_announces_a_held_call_signed_and_the_cli_and_the_stream_decide_and_see_it() {
    let (url, mut hooks) = webhook_receiver().await;
    let secret_dir = tempfile::tempdir().unwrap();
    let secret_file = secret_dir.path().join("hook.secret");
    let secret = "a-shared-secret-of-32-bytes-long";
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    let d = daemon(&format!(
        "[policy.approval_webhook]\nurl = {url:?}\nsecret_file = {:?}\n",
        secret_file.display().to_string()
    ));
    let reg = d
        .register(
            json!({"agent_id": "payer", "tools": ["demo.*"], "policy": pay_rule("harness", 60)}),
        )
        .await;
    // The SSE stream: the list at once, then on every change.
    let stream = common::http()
        .get(format!("{}/v1/approvals/stream", d.admin))
        .bearer_auth(&d.token)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status().as_u16(), 200);
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    let mut stream = stream.bytes_stream();
    let mut seen = String::new();
    let mut next_event = async || -> Value {
        use futures::StreamExt;
        loop {
            if let Some(end) = seen.find("\n\n") {
                let frame: String = seen.drain(..end + 2).collect();
                if let Some(data) = frame.lines().find_map(|l| l.strip_prefix("data: ")) {
                    return serde_json::from_str(data).unwrap();
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(20), stream.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    };
    assert_eq!(next_event().await["approvals"], json!([]));
    let held = {
        let reg = reg.clone();
        tokio::spawn(async move {
            call(
                &reg,
                json!({"text": "pay 5", "card": "4111"}),
                json!({}),
                json!({}),
            )
            .await
        })
    };
    let listed = next_event().await;
    assert_eq!(listed["approvals"].as_array().unwrap().len(), 1, "{listed}");
    // The webhook: signed over the exact body, the arguments redacted.
    let (sig, body) = tokio::time::timeout(Duration::from_secs(10), hooks.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(sig, format!("sha256={}", hmac(secret.as_bytes(), &body)));
    let hook: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(hook["event"], "approval_requested");
    assert_eq!(hook["node_id"], Value::Null, "no node_id configured");
    assert_eq!(
        hook["approval"]["arguments"],
        json!({"text": "pay 5", "card": "[redacted]"})
    );
    let id = hook["approval"]["id"].as_str().unwrap().to_string();
    assert_eq!(listed["approvals"][0]["id"], json!(id));
    // The CLI lists it and approves it.
    let out = d.cli(&["approvals"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains(&id) && table.contains("demo.echo") && table.contains("[redacted]"),
        "{table}"
    );
    let out = d.cli(&["approve", &id, "--reason", "ok"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (t, err) = text(&held.await.unwrap());
    assert_eq!((t.as_str(), err), ("payer:pay 5", false));
    assert_eq!(next_event().await["approvals"], json!([]));
    // Deciding again: the CLI fails with the 409's reason.
    let out = d.cli(&["deny", &id]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already approved"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    d.wait_audit(10, |r| r.iter().any(|r| r.event == "governed_mcp_call"))
        .await;
    // Decided from the CLI: an operator's (admin) decision.
    assert_trail(&d, &id, "admin", "approve", "ok");
    // An open stream and a long poll do not hold up the daemon's stop (grace 10 s).
    let long_poll = {
        let (admin, token) = (d.admin.clone(), d.token.clone());
        tokio::spawn(async move {
            common::http()
                .get(format!("{admin}/v1/approvals?wait=60"))
                .bearer_auth(token)
                .send()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut d = d;
    d.signal(nix::sys::signal::Signal::SIGTERM);
    let (code, took) = d.wait_exit(Duration::from_secs(8));
    assert_eq!(code, Some(0));
    assert!(took < 5.0, "{took} s");
    let _ = long_poll.await;
    drop(stream);
    assert_eq!(d.audit().last().unwrap().event, "daemon_stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_is_void_when_the_tools_definition_changed_during_the_wait() {
    use nix::sys::signal::{kill, Signal};
    let scratch = tempfile::tempdir().unwrap();
    let pid_file = scratch.path().join("mutable.pid");
    let server = common::repo_root().join("tests/fixtures/mutable_server.py");
    let d = daemon(&format!(
        "[[upstreams]]\nid = \"mfol\"\ncommand = \"python3\"\nargs = [{:?}]\nsharing = \"shared\"\non_tool_change = \"follow\"\n[upstreams.env]\nMUTABLE_PID_FILE = {:?}\n",
        server.display().to_string(),
        pid_file.display().to_string(),
    ));
    let rule = json!([{"id": "pay", "when": "tool.name == 'mfol.greet'", "effect": "approve",
                       "approver": "harness", "timeout_s": 60}]);
    let reg = d
        .register(json!({"agent_id": "greeter", "tools": ["mfol.*"], "policy": rule}))
        .await;
    let held = {
        let reg = reg.clone();
        tokio::spawn(async move {
            call_tool(
                &reg,
                "mfol.greet",
                json!({"name": "ada"}),
                json!({}),
                json!({}),
            )
            .await
        })
    };
    let p = until_pending(&d, 1).await;
    let id = p[0]["id"].as_str().unwrap().to_string();
    let first_definition = p[0]["definition_digest"].clone();
    // The upstream changes the tool's contract while the call waits (`follow`: it is served).
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    kill(nix::unistd::Pid::from_raw(pid), Signal::SIGUSR1).unwrap();
    d.wait_audit(10, |r| r.iter().any(|r| r.event == "tool_changed"))
        .await;
    let (s, v) = decide(&d, &id, json!({"decision": "approve"})).await;
    assert_eq!(s, 200, "{v}");
    let (t, err) = text(&held.await.unwrap());
    assert!(
        err && t.contains("approval void") && t.contains("definition changed"),
        "{t}"
    );
    d.wait_audit(10, |r| r.iter().any(|r| r.event == "governed_mcp_call"))
        .await;
    let t = trail(&d, &id);
    let call = t.iter().find(|r| r.event == "governed_mcp_call").unwrap();
    assert_eq!(call.outcome.as_deref(), Some("denied"), "{t:?}");
    // A new call is held again, for the new definition, and runs once approved.
    let again = {
        let reg = reg.clone();
        tokio::spawn(async move {
            call_tool(
                &reg,
                "mfol.greet",
                json!({"name": "ada"}),
                json!({}),
                json!({}),
            )
            .await
        })
    };
    let p = until_pending(&d, 1).await;
    assert_ne!(p[0]["definition_digest"], first_definition);
    let (s, _) = decide(
        &d,
        p[0]["id"].as_str().unwrap(),
        json!({"decision": "approve"}),
    )
    .await;
    assert_eq!(s, 200);
    let (t2, err) = text(&again.await.unwrap());
    assert!(!err && t2.contains("ada"), "{t2}");
}
