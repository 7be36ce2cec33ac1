//! The session table shared by SSE and Streamable HTTP: the idle reaper (paused time), the
//! caps (evict the oldest idle session, else 503), the idle clock only moving for
//! authenticated requests, and no growth from failed or abandoned session attempts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use gatehouse::testing::session::{SessionError, Transport};
use gatehouse::RegistrationSpec;
use serde_json::{json, Value};

const ACCEPT_BOTH: &str = "application/json, text/event-stream";
const MIN: Duration = Duration::from_secs(60);

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn reaper_closes_idle_sessions_through_the_close_path() {
    let tg = TestGateway::start();
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("a").with_tool(echo_tool("e", "A")))
        .await
        .unwrap();
    let state = gatehouse::testing::registry(&tg.gateway)
        .get(reg.id())
        .unwrap();
    let table = gatehouse::testing::sessions(&tg.gateway);
    let idle = table.create(&state, Transport::StreamableHttp).unwrap();
    let touched = table.create(&state, Transport::StreamableHttp).unwrap();
    let busy = table.create(&state, Transport::StreamableHttp).unwrap();
    let streaming = table.create(&state, Transport::Sse).unwrap();
    busy.begin_call(&json!(1));
    streaming.stream_opened();

    tokio::time::sleep(10 * MIN).await;
    touched.touch();
    tokio::time::sleep(5 * MIN + Duration::from_secs(1)).await;
    settle().await;
    assert!(
        table.get(reg.id(), &idle.id).is_none(),
        "idle 15 min: reaped"
    );
    assert!(
        idle.cancel.is_cancelled(),
        "closed through close(): its token fired"
    );
    assert!(
        table.get(reg.id(), &touched.id).is_some(),
        "touched at 10 min"
    );
    assert!(table.get(reg.id(), &busy.id).is_some(), "a call in flight");
    assert!(
        table.get(reg.id(), &streaming.id).is_some(),
        "an open stream"
    );

    tokio::time::sleep(10 * MIN).await;
    settle().await;
    assert!(
        table.get(reg.id(), &touched.id).is_none(),
        "reaped 15 min after its touch"
    );
    busy.end_call(&json!(1));
    streaming.stream_closed();
    tokio::time::sleep(14 * MIN).await;
    settle().await;
    assert_eq!(
        table.len(),
        2,
        "their clocks restarted when the call and stream ended"
    );
    tokio::time::sleep(2 * MIN).await;
    settle().await;
    assert_eq!(table.len(), 0);
    assert!(busy.cancel.is_cancelled() && streaming.cancel.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn caps_evict_the_oldest_idle_session_or_refuse() {
    let tg = TestGateway::with(|c| {
        c.sessions.max_per_registration = 2;
        c.sessions.max_sessions = 3;
    });
    let a = tg
        .gateway
        .register(RegistrationSpec::new("a").with_tool(echo_tool("e", "A")))
        .await
        .unwrap();
    let b = tg
        .gateway
        .register(RegistrationSpec::new("b").with_tool(echo_tool("e", "B")))
        .await
        .unwrap();
    let (sa, sb) = (
        gatehouse::testing::registry(&tg.gateway)
            .get(a.id())
            .unwrap(),
        gatehouse::testing::registry(&tg.gateway)
            .get(b.id())
            .unwrap(),
    );
    let t = gatehouse::testing::sessions(&tg.gateway);
    let a1 = t.create(&sa, Transport::StreamableHttp).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let a2 = t.create(&sa, Transport::StreamableHttp).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Per-registration cap: a1 (oldest idle) goes.
    let a3 = t.create(&sa, Transport::StreamableHttp).unwrap();
    assert!(a1.cancel.is_cancelled() && t.get(a.id(), &a1.id).is_none());
    assert_eq!(t.count_for(a.id()), 2);
    // None idle: refused.
    a2.stream_opened();
    a3.begin_call(&json!(7));
    assert!(matches!(
        t.create(&sa, Transport::StreamableHttp),
        Err(SessionError::RegistrationCap(2))
    ));
    // Global cap (3): b1 fits; b2 evicts the oldest idle session anywhere (b1 — a2 and a3 are busy).
    let b1 = t.create(&sb, Transport::Sse).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let b2 = t.create(&sb, Transport::Sse).unwrap();
    assert!(b1.cancel.is_cancelled());
    assert_eq!(t.len(), 3);
    b2.stream_opened();
    assert!(matches!(
        t.create(&sb, Transport::Sse),
        Err(SessionError::GlobalCap(3))
    ));
    assert!(!a2.cancel.is_cancelled() && !a3.cancel.is_cancelled() && !b2.cancel.is_cancelled());
}

async fn initialize(url: &str, token: &str) -> reqwest::Response {
    http()
        .post(url)
        .bearer_auth(token)
        .header("accept", ACCEPT_BOTH)
        .json(&json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}))
        .send()
        .await
        .unwrap()
}

async fn ping(url: &str, token: &str, sid: &str) -> u16 {
    http()
        .post(url)
        .bearer_auth(token)
        .header("accept", ACCEPT_BOTH)
        .header("mcp-session-id", sid)
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn cap_over_http_is_a_clear_503_and_healthz_counts_sessions() {
    let tg = TestGateway::with(|c| c.sessions.max_per_registration = 2);
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("a").with_tool(echo_tool("e", "A")))
        .await
        .unwrap();
    let url = reg.mcp_url();
    let mut sids = Vec::new();
    for _ in 0..3 {
        let r = initialize(&url, reg.token()).await;
        assert_eq!(r.status(), 200);
        sids.push(r.headers()["mcp-session-id"].to_str().unwrap().to_string());
    }
    assert_eq!(
        ping(&url, reg.token(), &sids[0]).await,
        404,
        "oldest idle evicted"
    );
    let health: Value = http()
        .get(format!("{}/healthz", reg.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["sessions"], 2);
    // Both remaining sessions hold a GET stream: nothing can go, so 503.
    let mut streams = Vec::new();
    for sid in &sids[1..] {
        let r = http()
            .get(&url)
            .bearer_auth(reg.token())
            .header("accept", "text/event-stream")
            .header("mcp-session-id", sid)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        streams.push(r);
    }
    let r = initialize(&url, reg.token()).await;
    assert_eq!(r.status(), 503);
    assert!(r.text().await.unwrap().contains("too many sessions"));
}

#[tokio::test]
async fn unauthenticated_requests_do_not_keep_a_session_alive() {
    let tg = TestGateway::with(|c| c.sessions.idle_timeout_s = 1);
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("a").with_tool(echo_tool("e", "A")))
        .await
        .unwrap();
    let url = reg.mcp_url();
    let sid_of =
        |r: &reqwest::Response| r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let starved = sid_of(&initialize(&url, reg.token()).await);
    let fed = sid_of(&initialize(&url, reg.token()).await);
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(ping(&url, "wrong-token", &starved).await, 401);
        assert_eq!(ping(&url, reg.token(), &fed).await, 200);
    }
    assert_eq!(
        ping(&url, reg.token(), &starved).await,
        404,
        "expired despite 401 traffic"
    );
    assert_eq!(
        ping(&url, reg.token(), &fed).await,
        200,
        "authenticated traffic kept it"
    );
}

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// One failed or abandoned session attempt of kind `i % 8`.
async fn attempt(client: &reqwest::Client, url: &str, token: &str, i: usize) {
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}});
    let ping = json!({"jsonrpc":"2.0","id":1,"method":"ping"});
    let post = |tok: &str, accept: &str, body: &Value| {
        client
            .post(url)
            .bearer_auth(tok)
            .header("accept", accept)
            .header("content-type", "application/json")
            .body(body.to_string())
    };
    let status = match i % 8 {
        0 => post("bad", ACCEPT_BOTH, &init).send().await,
        1 => post(token, ACCEPT_BOTH, &ping).send().await,
        2 => post(token, ACCEPT_BOTH, &ping).header("mcp-session-id", "nope").send().await,
        3 => post(token, "application/json", &init).send().await,
        4 => post(token, ACCEPT_BOTH, &json!({"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":{
            "io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}))
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/list")
            .send()
            .await,
        5 => post(token, ACCEPT_BOTH, &json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":"x"})).send().await,
        6 => post(token, ACCEPT_BOTH, &init).send().await, // abandoned: never used again
        _ => {
            let r = post(token, ACCEPT_BOTH, &init).send().await.unwrap();
            let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
            client
                .delete(url)
                .bearer_auth(token)
                .header("mcp-session-id", sid)
                .send()
                .await
        }
    };
    let s = status.unwrap().status().as_u16();
    assert!(matches!(s, 200 | 400 | 401 | 404 | 406), "attempt {i}: {s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_failed_or_abandoned_attempts_leave_no_trace() {
    let tg = TestGateway::with(|c| {
        c.sessions.idle_timeout_s = 1;
        c.sessions.max_per_registration = 32;
    });
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("a").with_tool(echo_tool("e", "A")))
        .await
        .unwrap();
    let url: Arc<str> = reg.mcp_url().into();
    let token: Arc<str> = reg.token().into();
    let client = http();
    let run = |from: usize, to: usize| {
        let (url, token, client) = (url.clone(), token.clone(), client.clone());
        async move {
            let workers = 8;
            let mut handles = Vec::new();
            for w in 0..workers {
                let (url, token, client) = (url.clone(), token.clone(), client.clone());
                handles.push(tokio::spawn(async move {
                    let mut i = from + w;
                    while i < to {
                        attempt(&client, &url, &token, i).await;
                        i += workers;
                    }
                }));
            }
            for h in handles {
                h.await.unwrap();
            }
        }
    };
    run(0, 1000).await; // warm-up: allocator pools, connection pool
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (sessions_before, rss_before) = (gatehouse::testing::sessions(&tg.gateway).len(), rss_kb());
    run(1000, 11_000).await;
    assert!(
        gatehouse::testing::sessions(&tg.gateway).len() <= 32,
        "abandoned sessions are bounded by the cap"
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (sessions_after, rss_after) = (gatehouse::testing::sessions(&tg.gateway).len(), rss_kb());
    eprintln!(
        "10,000 attempts: sessions {sessions_before} -> {sessions_after}, RSS {rss_before} kB -> {rss_after} kB"
    );
    assert_eq!(sessions_before, 0);
    assert_eq!(sessions_after, 0, "the reaper took the abandoned sessions");
    assert!(
        rss_after < rss_before + 16 * 1024,
        "RSS grew by {} kB",
        rss_after.saturating_sub(rss_before)
    );
}
