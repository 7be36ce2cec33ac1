//! Issue 18 item 5 (`subscriptions/listen`, 2026-07-28): the stream is acknowledged with the
//! honored subset first, then carries exactly the types it asked for — the registration's
//! list changes and updates of the resources it subscribed to (the upstream accepted
//! `resources/subscribe`) — each with `_meta.subscriptionId`; a release ends it gracefully with
//! a `complete` result. Raw HTTP, and the official Python SDK 2.x `Client.listen`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use gatehouse::config::UpstreamConfig;
use gatehouse::{Registration, RegistrationSpec};
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;

const SUB: &str = "io.modelcontextprotocol/subscriptionId";

fn announcer() -> UpstreamConfig {
    let script = format!(
        "{}/tests/fixtures/faulty_server.py",
        env!("CARGO_MANIFEST_DIR")
    );
    toml::from_str(&format!(
        "id = \"fl\"\ncommand = \"python3\"\nargs = [{script:?}]\nsharing = \"per_registration\"\ncall_timeout_s = 30\non_tool_change = \"follow\"\n"
    ))
    .unwrap()
}

fn meta() -> Value {
    json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
           "io.modelcontextprotocol/clientCapabilities": {}})
}

async fn post(
    reg: &Registration,
    method: &str,
    name: Option<&str>,
    body: Value,
) -> reqwest::Response {
    let mut b = http()
        .post(reg.mcp_url())
        .bearer_auth(reg.token())
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(n) = name {
        b = b.header("mcp-name", n);
    }
    b.json(&body).send().await.unwrap()
}

async fn announce(reg: &Registration) {
    let r = post(
        reg,
        "tools/call",
        Some("fl.announce"),
        json!({"jsonrpc": "2.0", "id": 50, "method": "tools/call",
               "params": {"name": "fl.announce", "arguments": {}, "_meta": meta()}}),
    )
    .await;
    let v: Value = r.json().await.unwrap();
    assert_eq!(text_of(&v), "announced", "{v}");
}

/// The `data:` messages of an SSE byte stream, as they come.
fn messages(resp: reqwest::Response) -> tokio::sync::mpsc::Receiver<Value> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let mut body = resp.bytes_stream();
        let mut buf = String::new();
        while let Some(Ok(chunk)) = body.next().await {
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let event: String = buf.drain(..end + 2).collect();
                for l in event.lines() {
                    if let Some(d) = l.strip_prefix("data:") {
                        if let Ok(v) = serde_json::from_str::<Value>(d.trim()) {
                            if tx.send(v).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        }
    });
    rx
}

async fn next(rx: &mut tokio::sync::mpsc::Receiver<Value>, secs: u64) -> Option<Value> {
    tokio::time::timeout(Duration::from_secs(secs), rx.recv())
        .await
        .ok()
        .flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_stream_carries_exactly_what_it_asked_for_and_ends_gracefully() {
    let tg = TestGateway::with(|c| {
        c.upstreams = vec![announcer()];
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

    // Bad filters are answered with what to fix.
    let r = post(
        &a,
        "subscriptions/listen",
        None,
        json!({"jsonrpc": "2.0", "id": 1,
        "method": "subscriptions/listen", "params": {"_meta": meta()}}),
    )
    .await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], -32602, "{v}");

    let listen = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "subscriptions/listen", "params": {
            "_meta": meta(),
            "notifications": {"toolsListChanged": true,
                              "resourceSubscriptions": ["faulty://record", "faulty://nowhere"]}}})
    };
    let r = post(&a, "subscriptions/listen", None, listen(7)).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let mut rx = messages(r);
    let ack = next(&mut rx, 10).await.expect("acknowledged");
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );
    assert_eq!(ack["params"]["_meta"][SUB], 7, "{ack}");
    // Honored: tools, and the URI an upstream lists and accepted; not the unknown one, and
    // nothing that was not asked for.
    assert_eq!(
        ack["params"]["notifications"],
        json!({"toolsListChanged": true, "resourceSubscriptions": ["faulty://record"]}),
        "{ack}"
    );
    // B listens too (tools only): it must not hear A's resource update.
    let r = post(&b, "subscriptions/listen", None, json!({"jsonrpc": "2.0", "id": 8,
        "method": "subscriptions/listen", "params": {"_meta": meta(),
        "notifications": {"toolsListChanged": true, "resourceSubscriptions": ["faulty://record"]}}}))
    .await;
    let mut rx_b = messages(r);
    let _ack_b = next(&mut rx_b, 10).await.expect("B acknowledged");

    // A's upstream announces: tools changed, prompts changed (not asked), an update of an
    // unsubscribed URI and of the subscribed one.
    announce(&a).await;
    let mut got = Vec::new();
    while let Some(m) = next(&mut rx, 3).await {
        got.push(m);
    }
    // (The tools change is told once the catalog was fetched again: in either order.)
    let mut methods: Vec<&str> = got.iter().filter_map(|m| m["method"].as_str()).collect();
    methods.sort_unstable();
    assert_eq!(
        methods,
        [
            "notifications/resources/updated",
            "notifications/tools/list_changed"
        ],
        "{got:?}"
    );
    assert!(
        got.iter().all(|m| m["params"]["_meta"][SUB] == 7),
        "{got:?}"
    );
    let updated = got
        .iter()
        .find(|m| m["method"] == "notifications/resources/updated");
    assert_eq!(
        updated.unwrap()["params"]["uri"],
        "faulty://record",
        "{got:?}"
    );
    // B: the tools change only (its grant covers the same upstream); not A's resource update,
    // which A's own per-registration connection sent.
    let mut got_b = Vec::new();
    while let Some(m) = next(&mut rx_b, 1).await {
        got_b.push(m);
    }
    let methods_b: Vec<&str> = got_b.iter().filter_map(|m| m["method"].as_str()).collect();
    assert_eq!(methods_b, ["notifications/tools/list_changed"], "{got_b:?}");
    assert_eq!(got_b[0]["params"]["_meta"][SUB], 8);

    // Lists may be reused now that changes are heard; reads may not.
    let r = post(
        &a,
        "tools/list",
        None,
        json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list",
        "params": {"_meta": meta()}}),
    )
    .await;
    let v: Value = r.json().await.unwrap();
    assert!(v["result"]["ttlMs"].as_u64().unwrap() > 0, "{v}");

    // The official Python SDK 2.x: acknowledged, then the change arrives as an event.
    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers/.venv/bin/python");
    assert!(
        py.exists(),
        "run tests/peers/setup.sh: {} is missing",
        py.display()
    );
    let mut child = tokio::process::Command::new(py)
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/peers/listen_client.py"))
        .args([
            "--url",
            &a.mcp_url(),
            "--uri",
            "faulty://record",
            "--events",
            "2",
        ])
        .arg(format!("--token={}", a.token()))
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let acked: Value = serde_json::from_str(
        &tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .expect("python client acked"),
    )
    .unwrap();
    assert_eq!(acked["protocol_version"], "2026-07-28", "{acked}");
    assert_eq!(
        acked["acked"]["resourceSubscriptions"],
        json!(["faulty://record"]),
        "{acked}"
    );
    announce(&a).await;
    let mut events = Vec::new();
    while events.len() < 2 {
        let l = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .unwrap()
            .unwrap()
            .expect("an event line");
        events.push(serde_json::from_str::<Value>(&l).unwrap());
    }
    assert!(events.iter().all(|e| e["event"].is_string()), "{events:?}");
    let _ = child.wait().await;

    // Release: A's stream ends with a complete result naming the subscription.
    a.release().await;
    let mut last = None;
    while let Some(m) = next(&mut rx, 5).await {
        last = Some(m);
    }
    let last = last.expect("a final message");
    assert_eq!(last["id"], 7, "{last}");
    assert_eq!(last["result"]["resultType"], "complete", "{last}");
    assert_eq!(last["result"]["_meta"][SUB], 7, "{last}");
}

/// On a `shared` connection no registration can be named: a list change goes to every
/// registration granted the upstream, a resource update only to the streams (and sessions)
/// that subscribed to its URI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_shared_connection_list_changes_reach_every_grantee_and_updates_only_subscribers() {
    let mut up = announcer();
    up.sharing = gatehouse::config::Sharing::Shared;
    let tg = TestGateway::with(|c| {
        c.upstreams = vec![up];
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
    });
    let mut regs = Vec::new();
    let mut streams = Vec::new();
    for (i, uris) in [json!(["faulty://record"]), json!([])]
        .into_iter()
        .enumerate()
    {
        let reg = tg
            .gateway
            .register(RegistrationSpec::new(format!("agent-{i}")).grant("fl.*"))
            .await
            .unwrap();
        let r = post(
            &reg,
            "subscriptions/listen",
            None,
            json!({"jsonrpc": "2.0", "id": i,
            "method": "subscriptions/listen", "params": {"_meta": meta(), "notifications":
            {"promptsListChanged": true, "resourceSubscriptions": uris}}}),
        )
        .await;
        let mut rx = messages(r);
        let ack = next(&mut rx, 10).await.expect("acknowledged");
        assert_eq!(
            ack["params"]["notifications"]["promptsListChanged"], true,
            "{ack}"
        );
        regs.push(reg);
        streams.push(rx);
    }
    let other = tg
        .gateway
        .register(RegistrationSpec::new("not-granted").with_tool(echo_tool("echo", "x")))
        .await
        .unwrap();
    let r = post(
        &other,
        "subscriptions/listen",
        None,
        json!({"jsonrpc": "2.0", "id": 9,
        "method": "subscriptions/listen", "params": {"_meta": meta(), "notifications":
        {"promptsListChanged": true, "toolsListChanged": true}}}),
    )
    .await;
    let mut rx_other = messages(r);
    let _ = next(&mut rx_other, 10).await.expect("acknowledged");

    announce(&regs[1]).await;
    for (i, rx) in streams.iter_mut().enumerate() {
        let mut got = Vec::new();
        while let Some(m) = next(rx, 2).await {
            got.push(m["method"].as_str().unwrap_or("").to_string());
        }
        got.sort();
        let want: &[&str] = if i == 0 {
            &[
                "notifications/prompts/list_changed",
                "notifications/resources/updated",
            ]
        } else {
            &["notifications/prompts/list_changed"]
        };
        assert_eq!(got, want, "registration {i}");
    }
    assert!(
        next(&mut rx_other, 1).await.is_none(),
        "not granted the upstream: nothing"
    );
}
