//! No notification dropped on any transport (DESIGN.md §5; issue 18 item 1): a fastmcp
//! upstream (`tests/peers/burst_server.py`, stdio) sends 1,000 progress notifications and
//! 1,000 logs, alternating, as fast as it can; the official Python SDK 1.x
//! (`tests/peers/mcp1_client.py`) over legacy SSE and Streamable HTTP, and fastmcp
//! (`tests/peers/fastmcp_client.py`) over stateless 2026-07-28 and legacy SSE, and the SDK 2.x
//! (`tests/peers/py_client.py`) over all three, receive all
//! 2,000, in the upstream's order, then the result; `gatehouse_notifications_refused` stays 0.
//! Before the fix the SDK 1.x over legacy SSE got 403 progress and 566 logs of 1,000.
//! A missing peer fails the test: run tests/peers/setup.sh.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use gatehouse::config::UpstreamConfig;
use gatehouse::{Registration, RegistrationSpec};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const N: u64 = 1000;

async fn run_py(venv: &str, script: &str, args: Vec<String>) -> Value {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(common::peers::peer(&format!("{venv}/bin/python")))
            .arg(common::peers::peer(script))
            .args(&args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the peer finishes")
    .unwrap();
    assert!(
        out.status.success(),
        "{script} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn args(reg: &Registration, url: &str, transport: Option<&str>) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    if let Some(t) = transport {
        a.extend(["--transport".into(), t.into()]);
    }
    a.extend([
        "--url".into(),
        url.into(),
        // `=`: a base64url token may begin with `-`.
        format!("--token={}", reg.token()),
        "--call".into(),
        "burst.burst".into(),
        "--args".into(),
        format!("{{\"n\":{N}}}"),
        "--progress".into(),
    ]);
    a
}

fn assert_whole_burst(what: &str, out: &Value) {
    let progress: Vec<u64> = out["progress"]
        .as_array()
        .unwrap()
        .iter()
        // [progress, total, message] (1.x, fastmcp) or {"progress", …} (the SDK 2.x client).
        .map(|p| p.get("progress").unwrap_or(&p[0]).as_f64().unwrap() as u64)
        .collect();
    let logs: Vec<String> = out["logs"]
        .as_array()
        .unwrap()
        .iter()
        // fastmcp's `ctx.info` sends `data: {"msg": …, "extra": …}`; the SDK 2.x client
        // reports {"level", "logger", "data"}.
        .map(|l| l.get("data").unwrap_or(l))
        .filter_map(|l| l.get("msg").unwrap_or(l).as_str().map(String::from))
        .collect();
    assert_eq!(
        (progress.len(), logs.len()),
        (N as usize, N as usize),
        "{what}: received {} progress notifications and {} logs of {N} each",
        progress.len(),
        logs.len()
    );
    assert_eq!(
        progress,
        (1..=N).collect::<Vec<_>>(),
        "{what}: progress out of order"
    );
    let want: Vec<String> = (1..=N).map(|i| format!("l{i}")).collect();
    assert_eq!(logs, want, "{what}: logs out of order");
    assert_eq!(
        out["call"]["content"][0]["text"],
        format!("sent {N}"),
        "{what}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_arrive_whole_and_in_order_on_every_transport() {
    let tg = TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.upstreams = vec![burst()];
    });
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("burst").grant("burst.*"))
        .await
        .unwrap();

    let out = run_py(
        ".venv-mcp1",
        "mcp1_client.py",
        args(&reg, &reg.sse_url(), Some("sse")),
    )
    .await;
    assert_whole_burst("Python SDK 1.x over legacy SSE", &out);
    let out = run_py(
        ".venv-mcp1",
        "mcp1_client.py",
        args(&reg, &reg.mcp_url(), Some("streamable")),
    )
    .await;
    assert_whole_burst("Python SDK 1.x over Streamable HTTP", &out);
    let out = run_py(
        ".venv-fastmcp",
        "fastmcp_client.py",
        args(&reg, &reg.mcp_url(), None),
    )
    .await;
    assert_whole_burst("fastmcp, stateless 2026-07-28", &out);
    let out = run_py(
        ".venv-fastmcp",
        "fastmcp_client.py",
        args(&reg, &reg.sse_url(), None),
    )
    .await;
    assert_whole_burst("fastmcp over legacy SSE", &out);
    for (t, url, what, era) in [
        ("sse", reg.sse_url(), "Python SDK 2.x over legacy SSE", None),
        (
            "streamable",
            reg.mcp_url(),
            "Python SDK 2.x over Streamable HTTP",
            None,
        ),
        (
            "client",
            reg.mcp_url(),
            "Python SDK 2.x Client, stateless 2026-07-28",
            Some("2026-07-28"),
        ),
    ] {
        let mut a = args(&reg, &url, Some(t));
        if let Some(m) = era {
            a.extend(["--mode".into(), m.into()]);
        }
        let out = run_py(".venv", "py_client.py", a).await;
        assert_whole_burst(what, &out);
    }
    let transports: Vec<String> = tg
        .calls()
        .iter()
        .map(|r| r.transport.clone().unwrap().into())
        .collect();
    assert_eq!(
        transports,
        vec![
            "sse",
            "streamable_http",
            "stateless",
            "sse",
            "sse",
            "streamable_http",
            "stateless"
        ]
    );

    // Nothing was refused, and the metric says so.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let server = tokio::spawn(gatehouse::testing::admin::serve(
        listener,
        gatehouse::testing::admin::router(tg.gateway.clone(), "admin-secret"),
        stop.clone(),
    ));
    let metrics = http()
        .get(format!("{admin}/metrics"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"gatehouse_notifications_refused_total{upstream="burst"} 0"#),
        "{metrics}"
    );
    stop.cancel();
    let _ = server.await;
    tg.gateway.shutdown().await;
}

fn announcer(sharing: &str, lease: bool) -> UpstreamConfig {
    let script = repo_root().join("tests/fixtures/announcer_server.py");
    let args = if lease {
        format!("[{:?}, \"--lease\"]", script.display().to_string())
    } else {
        format!("[{:?}]", script.display().to_string())
    };
    toml::from_str(&format!(
        "id = \"ann\"\ncommand = \"python3\"\nargs = {args}\nsharing = \"{sharing}\"\ncall_timeout_s = 10\n"
    ))
    .unwrap()
}

/// Messages on a session's stream within `secs` (after the call's reply), by method.
async fn drain(c: &mut SseClient, secs: u64) -> Vec<Value> {
    let mut out = Vec::new();
    while let Some(m) = c.next_message(secs).await {
        out.push(m);
    }
    out
}

/// Issue 18 item 3: notifications outside any call go to the sessions of the registration
/// that owns the connection (`per_registration`) or holds the lease they name (`leased`), to
/// no one else; on `shared`, where no registration can be named, a log is counted and not
/// delivered, and a resource update goes to the sessions of any registration granted the
/// upstream that subscribed to its URI. Item 2: `resources/updated` only to the sessions
/// subscribed to the URI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_wide_notifications_go_to_the_owning_registration_only() {
    for (sharing, lease, delivered) in [
        ("per_registration", false, true),
        ("leased", true, true),
        ("shared", false, false),
    ] {
        let tg = TestGateway::with(|c| {
            c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
            c.upstreams = vec![announcer(sharing, lease)];
        });
        let a = tg
            .gateway
            .register(RegistrationSpec::new("a").grant("ann.*"))
            .await
            .unwrap();
        let b = tg
            .gateway
            .register(RegistrationSpec::new("b").grant("ann.*"))
            .await
            .unwrap();
        let mut ca = SseClient::connect(&a.sse_url(), a.token()).await;
        ca.initialize().await;
        // Item 2: A's first session subscribes to the URI; its second does not.
        let sub = ca
            .request(
                "resources/subscribe",
                serde_json::json!({"uri": "announcer://a1"}),
            )
            .await;
        assert!(sub.get("result").is_some(), "{sub}");
        let mut ca2 = SseClient::connect(&a.sse_url(), a.token()).await;
        ca2.initialize().await;
        let mut cb = SseClient::connect(&b.sse_url(), b.token()).await;
        cb.initialize().await;
        // B's connection exists too (its own process on per_registration).
        let announce =
            |tag: &str| serde_json::json!({"name": "ann.announce", "arguments": {"tag": tag}});
        let (r, _) = cb.request_with_notes("tools/call", announce("b0")).await;
        assert_eq!(text_of(&r), "announced b0", "{r}");
        let _ = drain(&mut cb, 1).await;
        // The notifications follow the reply upstream but take another path through the
        // gateway (no audit write): they may reach the stream before the reply.
        let (r, mut got_a) = ca.request_with_notes("tools/call", announce("a1")).await;
        assert_eq!(text_of(&r), "announced a1", "{r}");
        got_a.extend(drain(&mut ca, 2).await);
        let got_b = drain(&mut cb, 1).await;
        let got_a2 = drain(&mut ca2, 1).await;
        let methods = |v: &[Value]| -> Vec<String> {
            v.iter()
                .map(|m| m["method"].as_str().unwrap_or("").to_string())
                .collect()
        };
        if delivered {
            assert_eq!(
                methods(&got_a),
                vec!["notifications/message", "notifications/resources/updated"],
                "{sharing}: {got_a:?}"
            );
            assert_eq!(got_a[0]["params"]["data"], "outside a1", "{sharing}");
            assert_eq!(got_a[1]["params"]["uri"], "announcer://a1", "{sharing}");
            // The unsubscribed session of A hears the log, not the resource update.
            assert_eq!(
                methods(&got_a2),
                vec!["notifications/message"],
                "{sharing}: {got_a2:?}"
            );
            // The lease id is the gateway's business, not the client's.
            assert!(
                got_a[0]["params"]["_meta"]
                    .get("io.gatehouse/lease")
                    .is_none(),
                "{got_a:?}"
            );
        } else {
            // No registration can be named: the log is not delivered; the resource update goes
            // to whoever granted the upstream subscribed to its URI (A's first session only).
            assert_eq!(
                methods(&got_a),
                vec!["notifications/resources/updated"],
                "{sharing}: {got_a:?}"
            );
            assert_eq!(got_a[0]["params"]["uri"], "announcer://a1", "{sharing}");
            assert!(got_a2.is_empty(), "{sharing}: {got_a2:?}");
        }
        assert!(
            got_b.is_empty(),
            "{sharing}: B got A's notifications: {got_b:?}"
        );
        tg.gateway.shutdown().await;
    }
}

/// Item 1 through mcp-remote 0.15.1 (the stdio bridge; this test is its stdio client): the
/// same 1,000 progress + 1,000 logs burst of one call arrives whole and in order on its
/// stdout over legacy SSE (`--transport sse-only`), Streamable HTTP (`http-only`) and
/// stateless 2026-07-28 (`http-only --protocol auto`: mcp-remote probes `server/discover` and
/// rewrites each request into the modern era), then the call's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_remote_receives_the_whole_burst_on_every_transport() {
    use common::mcp_remote::McpRemote;
    let tg = TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.upstreams = vec![burst()];
    });
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("burst").grant("burst.*"))
        .await
        .unwrap();
    let cells: [(&str, String, &[&str]); 3] = [
        ("legacy SSE", reg.sse_url(), &["--transport", "sse-only"]),
        (
            "Streamable HTTP",
            reg.mcp_url(),
            &["--transport", "http-only"],
        ),
        (
            "stateless 2026-07-28",
            reg.mcp_url(),
            &["--transport", "http-only", "--protocol", "auto"],
        ),
    ];
    for (what, url, extra) in cells {
        let what = format!("mcp-remote over {what}");
        let mut remote = McpRemote::start(&url, reg.token(), extra);
        remote.initialize(serde_json::json!({}), 30).await;
        // A modern server sends logs only at a requested level; mcp-remote carries it.
        let r = remote
            .request(
                "logging/setLevel",
                serde_json::json!({"level": "debug"}),
                30,
            )
            .await;
        assert!(r.get("result").is_some(), "{what}: setLevel: {r}");
        let r = remote
            .request(
                "tools/call",
                serde_json::json!({"name": "burst.burst", "arguments": {"n": N},
                                   "_meta": {"progressToken": "p1"}}),
                60,
            )
            .await;
        let progress: Vec<Value> = remote
            .seen
            .iter()
            .filter(|m| m["method"] == "notifications/progress")
            // [progress] as the 1.x and fastmcp clients report it.
            .map(|m| serde_json::json!([m["params"]["progress"]]))
            .collect();
        let logs: Vec<Value> = remote
            .seen
            .iter()
            .filter(|m| m["method"] == "notifications/message")
            .map(|m| m["params"]["data"].clone())
            .collect();
        assert!(
            remote
                .seen
                .iter()
                .filter(|m| m["method"] == "notifications/progress")
                .all(|m| m["params"]["progressToken"] == "p1"),
            "{what}: a progress notification under another token"
        );
        let out = serde_json::json!({"progress": progress, "logs": logs, "call": r["result"]});
        assert_whole_burst(&what, &out);
        remote.stop().await;
    }
    let transports: Vec<String> = tg
        .calls()
        .iter()
        .map(|r| r.transport.clone().unwrap().into())
        .collect();
    assert_eq!(transports, vec!["sse", "streamable_http", "stateless"]);
    tg.gateway.shutdown().await;
}

/// A session's `logging/setLevel` filters the upstream logs of its calls (DESIGN.md §5): at
/// `warning`, the burst's `info` logs are left out while every progress notification still
/// arrives; at `debug`, all logs arrive, in order.
#[tokio::test]
async fn a_sessions_log_level_filters_the_logs_of_its_calls() {
    let tg = TestGateway::with(|c| {
        c.upstreams.push(burst());
    });
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("levels").grant("burst.burst"))
        .await
        .unwrap();
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    c.initialize().await;
    let n = 50;
    let params = serde_json::json!({"name": "burst.burst", "arguments": {"n": n},
                                    "_meta": {"progressToken": "lv"}});
    let count =
        |notes: &[Value], method: &str| notes.iter().filter(|m| m["method"] == method).count();
    let r = c
        .request("logging/setLevel", serde_json::json!({"level": "warning"}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let (reply, notes) = c.request_with_notes("tools/call", params.clone()).await;
    assert!(reply.get("result").is_some(), "{reply}");
    assert_eq!(count(&notes, "notifications/progress"), n, "{notes:?}");
    assert_eq!(count(&notes, "notifications/message"), 0, "{notes:?}");

    c.request("logging/setLevel", serde_json::json!({"level": "debug"}))
        .await;
    let (_, notes) = c.request_with_notes("tools/call", params).await;
    assert_eq!(count(&notes, "notifications/progress"), n);
    let logs: Vec<String> = notes
        .iter()
        .filter(|m| m["method"] == "notifications/message")
        // fastmcp's `ctx.info` sends `data: {"msg": …, "extra": …}`.
        .map(|m| {
            m["params"]["data"]["msg"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    let want: Vec<String> = (1..=n).map(|i| format!("l{i}")).collect();
    assert_eq!(logs, want);
}
