//! Issue 18 items 2, 3 and 5 with a real upstream and a real client: server-everything
//! (`toggle-subscriber-updates`, `toggle-simulated-logging`: every 5 s, outside any call, a
//! `notifications/resources/updated` for each subscribed URI and a log) on `per_registration`
//! connections, and three real clients, one registration each, all at once: the official
//! Python SDK 2.x (legacy SSE, Streamable HTTP, a 2026-07-28 `subscriptions/listen` stream)
//! and 1.x (legacy SSE, Streamable HTTP) through tests/peers/updates_client.py, and fastmcp 4.x
//! (legacy SSE; Streamable HTTP, where it settles on 2026-07-28 and listens) through
//! tests/peers/fastmcp_updates.py.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use gatehouse::config::UpstreamConfig;
use gatehouse::RegistrationSpec;
use serde_json::Value;

const URI: &str = "demo://resource/dynamic/text/1";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn everything() -> UpstreamConfig {
    common::everything("everything", "per_registration", 30, "")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_updates_and_logs_reach_the_sdks_on_every_transport() {
    let py2 = root().join("tests/peers/.venv/bin/python");
    let py1 = root().join("tests/peers/.venv-mcp1/bin/python");
    let pyf = root().join("tests/peers/.venv-fastmcp/bin/python");
    for py in [&py2, &py1, &pyf] {
        assert!(
            py.exists(),
            "run tests/peers/setup.sh first ({} missing)",
            py.display()
        );
    }
    let tg = TestGateway::with(|c| {
        c.upstreams = vec![everything()];
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
    });
    let mut runs = Vec::new();
    let mut regs = Vec::new();
    for (sdk, py, transport) in [
        ("2.x", &py2, "sse"),
        ("2.x", &py2, "streamable"),
        ("2.x", &py2, "listen"),
        ("1.x", &py1, "sse"),
        ("1.x", &py1, "streamable"),
        ("fastmcp", &pyf, "sse"),
        ("fastmcp", &pyf, "listen"),
    ] {
        let reg = tg
            .gateway
            .register(
                RegistrationSpec::new(format!("agent-{sdk}-{transport}")).grant("everything.*"),
            )
            .await
            .unwrap();
        let mut cmd = tokio::process::Command::new(py);
        if sdk == "fastmcp" {
            // fastmcp picks the transport from the URL (Streamable HTTP: it settles on
            // 2026-07-28, so its updates come on a listen stream).
            let url = match transport {
                "sse" => reg.sse_url(),
                _ => reg.mcp_url(),
            };
            cmd.arg(root().join("tests/peers/fastmcp_updates.py"))
                .args(["--url", &url, "--uri", URI]);
        } else {
            cmd.arg(root().join("tests/peers/updates_client.py")).args([
                "--transport",
                transport,
                "--url",
                &reg.mcp_url(),
                "--uri",
                URI,
            ]);
        }
        cmd.arg(format!("--token={}", reg.token()))
            .args(["--seconds", "25"])
            .kill_on_drop(true);
        runs.push((
            format!("{sdk} {transport}"),
            tokio::spawn(async move {
                tokio::time::timeout(Duration::from_secs(60), cmd.output()).await
            }),
        ));
        regs.push(reg);
    }
    for (transport, run) in runs {
        let out = run
            .await
            .unwrap()
            .expect("the client ended in time")
            .unwrap();
        assert!(
            out.status.success(),
            "{transport}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        eprintln!("{transport}: {v}");
        assert!(
            v["updated"].as_u64().unwrap() >= 1,
            "{transport}: no resource update: {v}"
        );
        assert!(
            v["updated_uris"]
                .as_array()
                .unwrap()
                .iter()
                .all(|u| u == URI),
            "{transport}: only the subscribed URI: {v}"
        );
        if transport.ends_with("listen") {
            assert_eq!(v["protocol_version"], "2026-07-28", "{v}");
            assert_eq!(v["honored"]["resourceSubscriptions"][0], URI, "{v}");
            assert_eq!(v["logs"], 0, "logs never go on a listen stream: {v}");
        } else {
            assert!(
                v["logs"].as_u64().unwrap() >= 1,
                "{transport}: no out-of-call log: {v}"
            );
        }
    }
}

/// One stdout line answering `id` (or any line when `id` is None) within the deadline.
async fn read_until(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    deadline: tokio::time::Instant,
    mut pred: impl FnMut(&Value) -> bool,
) -> Option<Value> {
    loop {
        let l = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .ok()?
            .ok()??;
        let v: Value = serde_json::from_str(&l).unwrap_or(Value::Null);
        if pred(&v) {
            return Some(v);
        }
    }
}

/// mcp-remote (the stdio ↔ remote bridge many desktop clients use), once over Streamable HTTP
/// and once over legacy SSE: server-everything's resource update and out-of-call log reach
/// its stdout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_updates_and_logs_reach_mcp_remote_on_both_transports() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let proxy = root().join("tests/peers/node_modules/mcp-remote/dist/proxy.js");
    assert!(
        proxy.exists(),
        "run tests/peers/setup.sh first ({} missing)",
        proxy.display()
    );
    let tg = TestGateway::with(|c| {
        c.upstreams = vec![everything()];
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
    });
    for (mode, url_of) in [("http-only", 0), ("sse-only", 1)] {
        let reg = tg
            .gateway
            .register(RegistrationSpec::new(format!("agent-remote-{mode}")).grant("everything.*"))
            .await
            .unwrap();
        let url = if url_of == 0 {
            reg.mcp_url()
        } else {
            reg.sse_url()
        };
        let home = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new("node")
            .arg(&proxy)
            .arg(&url)
            .args(["--transport", mode])
            .args(["--header", &format!("Authorization:Bearer {}", reg.token())])
            .env("HOME", home.path())
            .env("MCP_REMOTE_CONFIG_DIR", home.path().join(".mcp-auth"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
        let init = serde_json::json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
            "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}});
        let init = format!("{init}\n");
        input.write_all(init.as_bytes()).await.unwrap();
        let r = read_until(&mut lines, deadline, |v| v["id"] == 1).await;
        assert!(
            r.is_some_and(|r| r["result"]["protocolVersion"].is_string()),
            "{mode}: initialize"
        );
        for (i, (method, params)) in [
            ("notifications/initialized", Value::Null),
            ("resources/subscribe", serde_json::json!({"uri": URI})),
            ("tools/call", serde_json::json!({"name": "everything.toggle-simulated-logging", "arguments": {}})),
            ("tools/call", serde_json::json!({"name": "everything.toggle-subscriber-updates", "arguments": {}})),
        ]
        .into_iter()
        .enumerate()
        {
            let mut m = serde_json::json!({"jsonrpc": "2.0", "method": method});
            if !params.is_null() {
                m["params"] = params;
            }
            let id = i as u64 + 10;
            if method != "notifications/initialized" {
                m["id"] = id.into();
            }
            input.write_all(format!("{m}\n").as_bytes()).await.unwrap();
            if method != "notifications/initialized" {
                let r = read_until(&mut lines, deadline, |v| v["id"] == id).await;
                assert!(r.as_ref().is_some_and(|r| r.get("result").is_some()), "{mode}: {method}: {r:?}");
            }
        }
        let (mut updated, mut logs) = (0, 0);
        while updated == 0 || logs == 0 {
            let Some(v) = read_until(&mut lines, deadline, |v| v.get("method").is_some()).await
            else {
                break;
            };
            match v["method"].as_str() {
                Some("notifications/resources/updated") => {
                    assert_eq!(v["params"]["uri"], URI, "{mode}: {v}");
                    updated += 1;
                }
                Some("notifications/message") => logs += 1,
                _ => {}
            }
        }
        assert!(
            updated >= 1 && logs >= 1,
            "{mode}: {updated} updates, {logs} logs through mcp-remote"
        );
        drop(input);
        let _ = child.kill().await;
    }
}
