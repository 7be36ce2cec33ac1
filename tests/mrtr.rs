//! Issue 18 item 5 (MRTR): a server → client request during a stateless (2026-07-28)
//! `tools/call` becomes an `input_required` result with `inputRequests` and an HMAC-protected
//! `requestState`; the client's retry with `inputResponses` continues the held upstream call.
//! Through the official Python SDK 2.x `Client` (which drives the rounds itself) and raw HTTP
//! (tampering, another registration, replay, an undeclared capability, release while held).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::peers::python;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use gatehouse::config::UpstreamConfig;
use gatehouse::{Registration, RegistrationSpec};
use serde_json::{json, Value};

fn asker() -> UpstreamConfig {
    common::faulty("fl", 30, "")
}

const ACCEPT_BOTH: &str = "application/json, text/event-stream";

fn meta(caps: Value) -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
           "io.modelcontextprotocol/clientCapabilities": caps})
}

/// One stateless `tools/call` POST: status and JSON body.
async fn call(reg: &Registration, id: u64, tool: &str, params: Value) -> (u16, Value) {
    let mut p = params;
    p["name"] = json!(tool);
    request(reg, id, "tools/call", tool, p).await
}

/// One stateless request POST (`name`: the Mcp-Name header).
async fn request(reg: &Registration, id: u64, method: &str, name: &str, p: Value) -> (u16, Value) {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": p});
    let r = http()
        .post(reg.mcp_url())
        .bearer_auth(reg.token())
        .header("accept", ACCEPT_BOTH)
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method)
        .header("mcp-name", name)
        .json(&body)
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    (s, r.json::<Value>().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_request_in_a_stateless_call_becomes_input_required_and_the_retry_continues_it() {
    let tg = TestGateway::with(|c| {
        c.upstreams = vec![asker()];
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
    });
    let a = tg
        .gateway
        .register(RegistrationSpec::new("agent-a").grant("fl.*"))
        .await
        .unwrap();
    let b = tg
        .gateway
        .register(RegistrationSpec::new("agent-b").grant("fl.*"))
        .await
        .unwrap();
    let caps = json!({"sampling": {}, "elicitation": {}});

    // Round one: the upstream asked for a sample; the client is asked instead, at once.
    let (s, v) = call(
        &a,
        1,
        "fl.ask",
        json!({"arguments": {}, "_meta": meta(caps.clone())}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let r = &v["result"];
    assert_eq!(v["id"], 1, "{v}");
    assert_eq!(r["resultType"], "input_required", "{v}");
    let requests = r["inputRequests"].as_object().unwrap();
    assert_eq!(requests.len(), 1, "{v}");
    let (key, asked) = requests.iter().next().unwrap();
    assert_eq!(asked["method"], "sampling/createMessage", "{v}");
    assert_eq!(
        asked["params"]["maxTokens"], 20,
        "the server's params pass through: {v}"
    );
    let state = r["requestState"].as_str().unwrap().to_owned();
    let answer = json!({key.clone(): {"role": "assistant", "model": "m",
        "content": {"type": "text", "text": "hello from the client"}}});

    // A forged, another registration's, or a malformed state is refused: 400, -32602.
    let mut forged = state.clone();
    forged.pop();
    forged.push(if state.ends_with('A') { 'B' } else { 'A' });
    for (who, bad) in [(&a, json!(forged)), (&b, json!(state)), (&a, json!(7))] {
        let (s, v) = call(
            who,
            2,
            "fl.ask",
            json!({"arguments": {}, "_meta": meta(caps.clone()), "requestState": bad, "inputResponses": answer}),
        )
        .await;
        assert_eq!((s, v["error"]["code"].clone()), (400, json!(-32602)), "{v}");
    }

    // The genuine retry (a new id) continues the held call: the upstream got the answer.
    let (s, v) = call(
        &a,
        3,
        "fl.ask",
        json!({"arguments": {}, "_meta": meta(caps.clone()), "requestState": state, "inputResponses": answer}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["id"], 3, "the result answers the retry: {v}");
    assert_eq!(v["result"]["resultType"], "complete", "{v}");
    assert_eq!(text_of(&v), "sampled: hello from the client", "{v}");
    // Used once: a replay names no held call.
    let (s, v) = call(
        &a,
        4,
        "fl.ask",
        json!({"arguments": {}, "_meta": meta(caps.clone()), "requestState": state, "inputResponses": answer}),
    )
    .await;
    assert_eq!((s, v["error"]["code"].clone()), (400, json!(-32602)), "{v}");

    // Two rounds: sampling, then elicitation.
    let (_, v) = call(
        &a,
        5,
        "fl.ask_twice",
        json!({"arguments": {}, "_meta": meta(caps.clone())}),
    )
    .await;
    let (key, _) = v["result"]["inputRequests"]
        .as_object()
        .unwrap()
        .iter()
        .next()
        .unwrap();
    let state = v["result"]["requestState"].as_str().unwrap();
    let (_, v) = call(
        &a,
        6,
        "fl.ask_twice",
        json!({"arguments": {}, "_meta": meta(caps.clone()), "requestState": state,
               "inputResponses": {key.clone(): {"role": "assistant", "model": "m", "content": {"type": "text", "text": "one"}}}}),
    )
    .await;
    assert_eq!(v["result"]["resultType"], "input_required", "{v}");
    let (key, asked) = v["result"]["inputRequests"]
        .as_object()
        .unwrap()
        .iter()
        .next()
        .unwrap();
    assert_eq!(asked["method"], "elicitation/create", "{v}");
    let state = v["result"]["requestState"].as_str().unwrap();
    let (_, v) = call(
        &a,
        7,
        "fl.ask_twice",
        json!({"arguments": {}, "_meta": meta(caps.clone()), "requestState": state,
               "inputResponses": {key.clone(): {"action": "accept", "content": {"username": "u"}}}}),
    )
    .await;
    assert_eq!(text_of(&v), "sampled: one; elicited: accept", "{v}");

    // prompts/get and resources/read take MRTR rounds too (the only other methods allowed).
    for (n, method, field, name) in [
        (20, "prompts/get", "name", "fl.asked"),
        (22, "resources/read", "uri", "faulty://asked"),
    ] {
        let (s, v) = request(
            &a,
            n,
            method,
            name,
            json!({field: name, "_meta": meta(caps.clone())}),
        )
        .await;
        assert_eq!(
            (s, &v["result"]["resultType"]),
            (200, &json!("input_required")),
            "{method}: {v}"
        );
        let (key, _) = v["result"]["inputRequests"]
            .as_object()
            .unwrap()
            .iter()
            .next()
            .unwrap();
        let state = v["result"]["requestState"].as_str().unwrap();
        let (s, v) = request(
            &a,
            n + 1,
            method,
            name,
            json!({field: name, "_meta": meta(caps.clone()), "requestState": state,
                   "inputResponses": {key.clone(): {"role": "assistant", "model": "m", "content": {"type": "text", "text": "p"}}}}),
        )
        .await;
        assert_eq!(s, 200, "{method}: {v}");
        assert_eq!(v["id"], n + 1, "{method}: {v}");
        assert_eq!(
            v["result"]["content"][0]["text"], "sampled: p",
            "{method}: {v}"
        );
    }

    // A client that did not declare sampling is never asked: the upstream is refused at once.
    // `"sampling": null` declares nothing, as at a session's `initialize` (issue 40: one
    // reading of client capabilities; MRTR took a null for a declaration).
    for (id, caps) in [(8, json!({})), (18, json!({"sampling": null}))] {
        let (s, v) = call(
            &a,
            id,
            "fl.ask",
            json!({"arguments": {}, "_meta": meta(caps)}),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["result"]["resultType"], "complete", "{v}");
        assert!(
            text_of(&v).starts_with(
                "refused: gatehouse: sampling/createMessage refused: the client did not declare"
            ),
            "{v}"
        );
    }

    // Release while a call is held: the call ends (audited cancelled), the upstream is told.
    let (_, v) = call(
        &b,
        9,
        "fl.ask",
        json!({"arguments": {}, "_meta": meta(caps.clone())}),
    )
    .await;
    assert_eq!(v["result"]["resultType"], "input_required", "{v}");
    let b_id = b.id().to_owned();
    b.release().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let cancelled = || {
        tg.calls().into_iter().any(|r| {
            r.registration_id.as_deref() == Some(b_id.as_str())
                && r.outcome.as_deref() == Some("cancelled")
        })
    };
    while !cancelled() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        cancelled(),
        "the held call of a released registration is audited cancelled"
    );

    // Every call of A has one audit record under its own agent; rounds are not extra calls.
    let a_calls: Vec<_> = tg
        .calls()
        .into_iter()
        .filter(|r| r.registration_id.as_deref() == Some(a.id()))
        .collect();
    assert_eq!(a_calls.len(), 4, "{a_calls:?}");
    assert!(a_calls
        .iter()
        .all(|r| r.agent_id.as_deref() == Some("agent-a") && r.outcome.as_deref() == Some("ok")));
    assert_eq!(
        gatehouse::testing::held_calls(&tg.gateway),
        0,
        "nothing stays held"
    );

    // The official Python SDK 2.x drives the rounds itself (sampling and elicitation callbacks).
    for (tool, want) in [
        ("fl.ask", "sampled: This is a test response from the client"),
        (
            "fl.ask_twice",
            "sampled: This is a test response from the client; elicited: accept",
        ),
    ] {
        let out = tokio::process::Command::new(python())
            .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers/py_client.py"))
            .args([
                "--transport",
                "client",
                "--mode",
                "2026-07-28",
                "--url",
                &a.mcp_url(),
            ])
            .arg(format!("--token={}", a.token()))
            .args(["--call", tool, "--timeout", "20"])
            .kill_on_drop(true)
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "py_client: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["protocol_version"], "2026-07-28", "{v}");
        assert_eq!(v["call"]["content"][0]["text"], want, "{v}");
    }
}

/// The case that motivated MRTR: a real server that samples (server-everything's
/// `trigger-sampling-request`, listed because the owned connection declares sampling) called
/// by clients that settle on 2026-07-28 — fastmcp (its default) and the SDK 2.x `Client` — get
/// the sample through `input_required` rounds and the server's result back. (fastmcp's call
/// opens the connection, and server-everything's tools/list_changed right after initialize
/// makes the gateway refresh the catalog while the call is pending: the stdio attribution
/// counts only requests made for a client, so the refresh does not hide the call.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_stateless_clients_answer_server_everything_sampling_through_mrtr() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let pyf = root.join("tests/peers/.venv-fastmcp/bin/python");
    assert!(
        pyf.exists(),
        "run tests/peers/setup.sh first ({} missing)",
        pyf.display()
    );
    let up = common::everything("everything", "per_registration", 30, "");
    let tg = TestGateway::with(|c| {
        c.upstreams = vec![up];
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
    });
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("agent-s").grant("everything.*"))
        .await
        .unwrap();
    let args = r#"{"prompt":"hello","maxTokens":5}"#;
    let runs: Vec<(&str, PathBuf, Vec<String>, &str)> = vec![
        (
            "fastmcp (stateless by default)",
            pyf.clone(),
            vec![
                root.join("tests/peers/fastmcp_client.py")
                    .display()
                    .to_string(),
                "--url".into(),
                reg.mcp_url(),
                "--sampling-reply".into(),
                "sampled by fastmcp".into(),
            ],
            "sampled by fastmcp",
        ),
        (
            "SDK 2.x Client, 2026-07-28",
            python(),
            vec![
                root.join("tests/peers/py_client.py").display().to_string(),
                "--transport".into(),
                "client".into(),
                "--mode".into(),
                "2026-07-28".into(),
                "--url".into(),
                reg.mcp_url(),
            ],
            "This is a test response from the client",
        ),
    ];
    for (what, py, mut a, want) in runs {
        a.extend([
            format!("--token={}", reg.token()),
            "--call".into(),
            "everything.trigger-sampling-request".into(),
            "--args".into(),
            args.into(),
        ]);
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            tokio::process::Command::new(py)
                .args(&a)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["protocol_version"], "2026-07-28", "{what}: {v}");
        let text = v["call"]["content"][0]["text"].as_str().unwrap_or_default();
        assert!(
            text.contains(want),
            "{what}: the server's result carries the sample: {v}"
        );
    }
    assert_eq!(gatehouse::testing::held_calls(&tg.gateway), 0);
}
