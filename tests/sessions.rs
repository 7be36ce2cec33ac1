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
    busy.begin_call(&json!(1)).unwrap();
    streaming.stream_opened();

    tokio::time::sleep(10 * MIN).await;
    touched.touch();
    tokio::time::sleep(5 * MIN + Duration::from_secs(1)).await;
    settle().await;
    assert!(
        table.get(reg.id(), &idle.id, idle.transport).is_none(),
        "idle 15 min: reaped"
    );
    assert!(
        idle.cancel.is_cancelled(),
        "closed through close(): its token fired"
    );
    assert!(
        table
            .get(reg.id(), &touched.id, touched.transport)
            .is_some(),
        "touched at 10 min"
    );
    assert!(
        table.get(reg.id(), &busy.id, busy.transport).is_some(),
        "a call in flight"
    );
    assert!(
        table
            .get(reg.id(), &streaming.id, streaming.transport)
            .is_some(),
        "an open stream"
    );

    tokio::time::sleep(10 * MIN).await;
    settle().await;
    assert!(
        table
            .get(reg.id(), &touched.id, touched.transport)
            .is_none(),
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
    assert!(a1.cancel.is_cancelled() && t.get(a.id(), &a1.id, a1.transport).is_none());
    assert_eq!(t.count_for(a.id()), 2);
    // None idle: refused.
    a2.stream_opened();
    a3.begin_call(&json!(7)).unwrap();
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

/// Issue 17 item 10: a session is bound to the transport that minted it. A Streamable HTTP
/// session id on the legacy `/messages/` endpoint and a legacy SSE session id as
/// `Mcp-Session-Id` are unknown (404); each session keeps serving on its own transport.
#[tokio::test]
async fn a_session_id_is_unknown_on_the_other_transport() {
    let tg = TestGateway::start();
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("a").with_tool(echo_tool("e", "A")))
        .await
        .unwrap();
    let url = reg.mcp_url();
    let r = initialize(&url, reg.token()).await;
    assert_eq!(r.status(), 200);
    let streamable_sid = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let mut sse = SseClient::connect(&reg.sse_url(), reg.token()).await;
    sse.initialize().await;
    let sse_sid = sse
        .endpoint
        .split("session_id=")
        .nth(1)
        .unwrap()
        .to_string();
    let ping_body = json!({"jsonrpc":"2.0","id":9,"method":"ping"});
    let on_messages = http()
        .post(format!(
            "{}/gw/{}/messages/?session_id={streamable_sid}",
            reg.base_url(),
            reg.id()
        ))
        .bearer_auth(reg.token())
        .json(&ping_body)
        .send()
        .await
        .unwrap();
    let messages_status = on_messages.status().as_u16();
    let messages_body: Value = on_messages.json().await.unwrap();
    let on_mcp = ping(&url, reg.token(), &sse_sid).await;
    assert_eq!(
        messages_status, 404,
        "a Streamable HTTP session id on /messages/: {messages_body}"
    );
    assert_eq!(messages_body["error"]["code"], -32600, "{messages_body}");
    assert_eq!(on_mcp, 404, "a legacy SSE session id as Mcp-Session-Id");
    // Each still serves on its own transport.
    assert_eq!(ping(&url, reg.token(), &streamable_sid).await, 200);
    let pong = sse.request("ping", json!({})).await;
    assert_eq!(pong["result"], json!({}), "{pong}");
    write_figures(
        "transport_binding",
        json!({
            "streamable_id_on_messages_status": messages_status,
            "sse_id_on_mcp_status": on_mcp,
            "own_transport_still_served": true,
        }),
    );
}

fn write_figures(name: &str, v: Value) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/reliability");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_string_pretty(&v).unwrap(),
    )
    .unwrap();
}

async fn post_mcp(url: &str, token: &str, sid: &str, body: &Value) -> (u16, Value, Option<String>) {
    let r = http()
        .post(url)
        .bearer_auth(token)
        .header("accept", ACCEPT_BOTH)
        .header("mcp-session-id", sid)
        .header("mcp-protocol-version", "2025-06-18")
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let text = r.text().await.unwrap();
    let v = serde_json::from_str(&text)
        .or_else(|_| {
            // An SSE-framed reply: its last data line.
            text.lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .next_back()
                .map(serde_json::from_str)
                .unwrap_or(Ok(Value::Null))
        })
        .unwrap_or(Value::Null);
    (status, v, retry)
}

fn slow_call(id: i64, ms: u64) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"slow","arguments":{"ms":ms}}})
}

/// Issue 17 items 4 and 3 (per session): a request id already in flight on the session is
/// refused with -32600 on both transports, and the in-flight call it names is the one a
/// later `notifications/cancelled` cancels (audited `cancelled`, never answered); a session at
/// `sessions.max_in_flight` gets a prompt 429 / -32030; a cancellation that arrives before its
/// request starts still reaches it.
#[tokio::test]
async fn reused_ids_in_flight_are_refused_and_cancellation_reaches_the_named_call() {
    let tg = TestGateway::with(|c| c.sessions.max_in_flight = 3);
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("a").with_tool(slow_tool("slow")))
        .await
        .unwrap();
    let url = reg.mcp_url();
    let r = initialize(&url, reg.token()).await;
    let sid = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let (token, u, s) = (reg.token().to_string(), url.clone(), sid.clone());
    // Streamable HTTP: id 7 runs 5 s.
    let first = tokio::spawn(async move { post_mcp(&u, &token, &s, &slow_call(7, 5_000)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = std::time::Instant::now();
    let (dup_status, dup, _) = post_mcp(&url, reg.token(), &sid, &slow_call(7, 10)).await;
    let dup_ms = t0.elapsed().as_millis() as u64;
    assert_eq!(dup_status, 400, "{dup}");
    assert_eq!(dup["error"]["code"], -32600, "{dup}");
    assert_eq!(dup["id"], 7, "{dup}");
    assert!(dup["error"]["message"]
        .as_str()
        .unwrap()
        .contains("already in flight"));
    // Two more in flight (ids 8, 9): the session holds its maximum of 3; a fourth is refused.
    let mut more = Vec::new();
    for id in [8, 9] {
        let (token, u, s) = (reg.token().to_string(), url.clone(), sid.clone());
        more.push(tokio::spawn(async move {
            post_mcp(&u, &token, &s, &slow_call(id, 1_500)).await
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t1 = std::time::Instant::now();
    let (busy_status, busy, retry) = post_mcp(&url, reg.token(), &sid, &slow_call(10, 10)).await;
    let busy_ms = t1.elapsed().as_millis() as u64;
    assert_eq!(busy_status, 429, "{busy}");
    assert_eq!(busy["error"]["code"], -32030, "{busy}");
    assert_eq!(retry.as_deref(), Some("1"));
    // The cancellation names id 7: the first call ends (cancelled), the others finish.
    let cancel =
        json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}});
    let (st, _, _) = post_mcp(&url, reg.token(), &sid, &cancel).await;
    assert_eq!(st, 202);
    for m in more {
        let (st, v, _) = m.await.unwrap();
        assert_eq!((st, text_of(&v)), (200, "done".to_string()), "{v}");
    }
    let _ = tokio::time::timeout(Duration::from_secs(3), first).await;
    // Once ended, the id is free again.
    let (st, v, _) = post_mcp(&url, reg.token(), &sid, &slow_call(7, 10)).await;
    assert_eq!((st, text_of(&v)), (200, "done".to_string()), "{v}");

    // Legacy SSE: the same rule on /messages/ (400 on the POST, nothing on the stream).
    let mut sse = SseClient::connect(&reg.sse_url(), reg.token()).await;
    sse.initialize().await;
    assert_eq!(sse.post(slow_call(5, 5_000)).await.status(), 202);
    let r = sse.post(slow_call(5, 10)).await;
    let sse_dup_status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    assert_eq!(sse_dup_status, 400, "{body}");
    assert_eq!(body["error"]["code"], -32600, "{body}");
    sse.notify("notifications/cancelled", json!({"requestId": 5}))
        .await;
    // A cancellation before its request: the request starts cancelled and is not answered.
    sse.notify("notifications/cancelled", json!({"requestId": 6}))
        .await;
    assert_eq!(sse.post(slow_call(6, 5_000)).await.status(), 202);
    let pong = sse.request("ping", json!({})).await;
    assert_eq!(pong["result"], json!({}));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let calls = tg.calls();
    let outcomes: Vec<String> = calls
        .iter()
        .map(|r| r.outcome.clone().unwrap().into())
        .collect();
    let cancelled = calls
        .iter()
        .filter(|r| r.outcome.as_deref() == Some("cancelled"))
        .count();
    let ok = calls
        .iter()
        .filter(|r| r.outcome.as_deref() == Some("ok"))
        .count();
    assert_eq!(
        (cancelled, ok),
        (3, 3),
        "ids 7 (streamable), 5 and 6 (sse) cancelled; 8, 9 and the second 7 ok: {:?}",
        outcomes
    );
    // Nothing for the refused duplicates and the busy refusal reached the audit as a call.
    assert_eq!(calls.len(), 6);
    write_figures(
        "call_ids",
        json!({
            "duplicate_id_status": dup_status,
            "duplicate_id_code": dup["error"]["code"],
            "duplicate_refused_in_ms": dup_ms,
            "sse_duplicate_id_status": sse_dup_status,
            "session_max_in_flight": 3,
            "over_session_max_status": busy_status,
            "over_session_max_code": busy["error"]["code"],
            "over_session_max_refused_in_ms": busy_ms,
            "cancelled_named_calls": cancelled,
            "other_calls_completed": ok,
            "early_cancel_reached_its_request": true,
        }),
    );
}
