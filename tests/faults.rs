//! Faults: an upstream that crashes mid-call, hangs, writes garbage or partial lines, closes
//! stdout or floods notifications (tests/fixtures/faulty_server.py), and a slow SSE reader.
//! Each test states what the client sees and what the audit holds, and that another
//! registration is served throughout. (Audit disk full: tests/audit.rs
//! `audit_unwritable_refuses_calls_then_resumes_by_itself`; kill -9 under load:
//! `kill_9_under_load_loses_no_acknowledged_call`; SIGTERM mid-call: tests/daemon.rs.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use gatehouse::config::UpstreamConfig;
use gatehouse::{InProcessTool, RegistrationSpec, ToolResult};
use serde_json::{json, Value};

fn faulty(timeout_s: u64) -> UpstreamConfig {
    let script = format!(
        "{}/tests/fixtures/faulty_server.py",
        env!("CARGO_MANIFEST_DIR")
    );
    toml::from_str(&format!(
        "id = \"faulty\"\ncommand = \"python3\"\nargs = [{script:?}]\nsharing = \"shared\"\ncall_timeout_s = {timeout_s}\n"
    ))
    .unwrap()
}

fn rss_kb() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

struct Fx {
    tg: TestGateway,
    fa: SseClient,
    other: SseClient,
    _regs: Vec<gatehouse::Registration>,
}

async fn setup() -> Fx {
    let tg = TestGateway::with(|c| {
        c.upstreams = vec![faulty(2)];
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
    });
    let a = tg
        .gateway
        .register(RegistrationSpec::new("agent-faulty").grant("faulty.*"))
        .await
        .unwrap();
    let b = tg
        .gateway
        .register(RegistrationSpec::new("agent-other").with_tool(echo_tool("echo", "other")))
        .await
        .unwrap();
    let mut fa = SseClient::connect(&a.sse_url(), a.token()).await;
    fa.initialize().await;
    let mut other = SseClient::connect(&b.sse_url(), b.token()).await;
    other.initialize().await;
    Fx {
        tg,
        fa,
        other,
        _regs: vec![a, b],
    }
}

async fn other_serves(fx: &mut Fx) {
    let r = fx.other.call("echo", json!({"text":"still"})).await;
    assert_eq!(text_of(&r), "other:still");
}

fn is_error(r: &Value) -> bool {
    r.get("error").is_some() || r["result"]["isError"] == true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_faults_fail_the_call_and_are_audited_and_the_upstream_recovers() {
    let mut fx = setup().await;
    let mut figures = Vec::new();
    assert_eq!(text_of(&fx.fa.call("faulty.ok", json!({})).await), "ok");

    // Crash mid-call: the client gets an error at once; audit: upstream_failed; next call respawns.
    let t = Instant::now();
    let r = fx.fa.call("faulty.crash", json!({})).await;
    assert!(is_error(&r), "{r}");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "crash noticed at once"
    );
    assert_eq!(
        fx.tg.calls().last().unwrap().outcome.as_deref(),
        Some("upstream_failed")
    );
    other_serves(&mut fx).await;
    assert_eq!(
        text_of(&fx.fa.call("faulty.ok", json!({})).await),
        "ok",
        "respawned"
    );
    figures.push("crash mid-call");

    // Hang: the call times out after call_timeout_s (2 s); audit: timeout; the connection stays.
    let t = Instant::now();
    let r = fx.fa.call("faulty.hang", json!({})).await;
    assert!(is_error(&r), "{r}");
    assert!(t.elapsed() >= Duration::from_secs(2) && t.elapsed() < Duration::from_secs(5));
    assert_eq!(
        fx.tg.calls().last().unwrap().outcome.as_deref(),
        Some("timeout")
    );
    other_serves(&mut fx).await;
    assert_eq!(text_of(&fx.fa.call("faulty.ok", json!({})).await), "ok");
    figures.push("hang -> timeout");

    // Garbage lines and a reply for an unknown id are skipped; the real answer arrives.
    let r = fx.fa.call("faulty.garbage", json!({})).await;
    assert_eq!(text_of(&r), "after garbage", "{r}");
    assert_eq!(fx.tg.calls().last().unwrap().outcome.as_deref(), Some("ok"));
    figures.push("garbage lines");

    // A reply written in partial chunks is reassembled.
    let r = fx.fa.call("faulty.partial", json!({})).await;
    assert_eq!(text_of(&r), "reassembled", "{r}");
    figures.push("partial lines");

    // A notification flood (20 000 messages) neither blocks the call nor grows memory without bound.
    let rss0 = rss_kb();
    let r = fx.fa.call("faulty.flood", json!({"n": 20000})).await;
    assert_eq!(text_of(&r), "flooded", "{r}");
    let grown = rss_kb().saturating_sub(rss0);
    assert!(grown < 64 * 1024, "RSS grew {grown} kB during the flood");
    other_serves(&mut fx).await;
    figures.push("notification flood");

    // Stdout closed mid-call: the call fails promptly (EOF) and is audited; the next call respawns.
    let t = Instant::now();
    let r = fx.fa.call("faulty.close_stdout", json!({})).await;
    assert!(is_error(&r), "{r}");
    assert!(t.elapsed() < Duration::from_secs(3));
    let out = fx.tg.calls().last().unwrap().outcome.clone();
    assert!(
        matches!(out.as_deref(), Some("upstream_failed") | Some("timeout")),
        "{out:?}"
    );
    other_serves(&mut fx).await;
    assert_eq!(
        text_of(&fx.fa.call("faulty.ok", json!({})).await),
        "ok",
        "respawned"
    );
    figures.push("stdout closed");

    // Every call the client made has exactly one audit record under its own agent.
    let calls = fx.tg.calls();
    let mine = calls
        .iter()
        .filter(|r| r.agent_id.as_deref() == Some("agent-faulty"))
        .count();
    assert_eq!(mine, 10, "one record per call");
    fx.tg.gateway.shutdown().await;
    append_figures(
        "faults",
        json!({"upstream_faults_injected": figures, "records_checked": calls.len()}),
    );
}

/// A tool that pushes `n` progress notifications of ~1 KiB each, then answers.
fn chatty_tool() -> InProcessTool {
    InProcessTool::new(
        "chatty",
        "Floods progress",
        json!({"type":"object"}),
        |args, ctx| async move {
            let n = args.get("n").and_then(Value::as_u64).unwrap_or(100);
            let pad = "p".repeat(1024);
            for i in 0..n {
                if ctx.cancel.is_cancelled() {
                    return Ok(ToolResult::text("cancelled"));
                }
                ctx.progress(i as f64, Some(n as f64), Some(&pad)).await;
            }
            Ok(ToolResult::text("done"))
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_sse_reader_loses_its_session_and_others_are_unaffected() {
    let tg = TestGateway::with(|c| {
        c.sessions.queue = 4;
        c.sessions.slow_reader_grace_ms = 300;
    });
    let slow = tg
        .gateway
        .register(RegistrationSpec::new("slow").with_tool(chatty_tool()))
        .await
        .unwrap();
    let fast = tg
        .gateway
        .register(RegistrationSpec::new("fast").with_tool(echo_tool("echo", "fast")))
        .await
        .unwrap();
    let mut fc = SseClient::connect(&fast.sse_url(), fast.token()).await;
    fc.initialize().await;
    // The slow client: opens its stream, initializes, then never reads it again.
    let resp = http()
        .get(slow.sse_url())
        .bearer_auth(slow.token())
        .send()
        .await
        .unwrap();
    let mut stream = resp;
    let first = stream.chunk().await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&first).to_string();
    let endpoint = text
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap()
        .to_string();
    let base = slow.sse_url().split("/gw/").next().unwrap().to_string();
    let post = |body: Value| {
        http()
            .post(format!("{base}{endpoint}"))
            .bearer_auth(slow.token())
            .json(&body)
            .send()
    };
    post(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"s","version":"0"}}})).await.unwrap();
    let rss0 = rss_kb();
    let r = post(json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"chatty","arguments":{"n":100000},"_meta":{"progressToken":"p"}}})).await.unwrap();
    assert_eq!(r.status(), 202);
    // Others are served while the slow reader's queue is full.
    let t = Instant::now();
    let mut served = 0;
    let mut closed_after = None;
    while t.elapsed() < Duration::from_secs(20) {
        assert_eq!(
            text_of(&fc.call("echo", json!({"text":"x"})).await),
            "fast:x"
        );
        served += 1;
        if gatehouse::testing::sessions(&tg.gateway)
            .sessions_of(slow.id())
            .is_empty()
        {
            closed_after = Some(t.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let closed_after = closed_after.expect("the slow session was never closed");
    let grown = rss_kb().saturating_sub(rss0);
    assert!(
        grown < 64 * 1024,
        "RSS grew {grown} kB: the slow session's queue is not bounded"
    );
    // The slow session's POST endpoint is gone (404), its call ended, and it was audited once.
    let r = post(json!({"jsonrpc":"2.0","id":3,"method":"ping"}))
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    drop(stream);
    let mut rec = None;
    for _ in 0..100 {
        rec = tg
            .calls()
            .into_iter()
            .find(|r| r.agent_id.as_deref() == Some("slow"));
        if rec.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rec = rec.expect("the slow call was not audited");
    assert!(
        matches!(rec.outcome.as_deref(), Some("cancelled") | Some("ok")),
        "{:?}",
        rec.outcome
    );
    assert_eq!(
        text_of(&fc.call("echo", json!({"text":"y"})).await),
        "fast:y"
    );
    append_figures(
        "slow_reader",
        json!({"slow_session_closed_after_ms": closed_after.as_millis(), "other_calls_served_meanwhile": served, "rss_growth_kb": grown}),
    );
}

fn append_figures(name: &str, v: Value) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/reliability");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_string_pretty(&v).unwrap(),
    )
    .unwrap();
}
