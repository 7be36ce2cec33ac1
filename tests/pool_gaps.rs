//! Gaps of the upstream pool closed end to end: respawn backoff after repeated crashes, the idle
//! reaper on a paused clock, server → client requests on a Streamable HTTP call's own stream
//! (and their refusal for stateless requests), and `/v1/upstreams` during a slow call.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{http, spawn_sse_reader, text_of, SseClient, TestGateway};
use gatehouse::config::UpstreamConfig;
use gatehouse::testing::upstream::pool::{ForwardCall, ForwardOutcome, Pool};
use gatehouse::RegistrationSpec;
use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

const ACCEPT_BOTH: &str = "application/json, text/event-stream";

fn gateway(upstreams: Vec<UpstreamConfig>) -> TestGateway {
    TestGateway::with(|c| {
        c.upstreams = upstreams;
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
    })
}

fn upstream(toml_text: &str) -> UpstreamConfig {
    toml::from_str(toml_text).unwrap()
}

/// The helpdesk demo upstream (`demo-upstream` of the built binary).
fn helpdesk(id: &str, sharing: &str, extra: &[&str]) -> UpstreamConfig {
    common::helpdesk(id, sharing, extra, "")
}

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------------------------------------
// 1. Respawn backoff, end to end
// ---------------------------------------------------------------------------------------------

fn spawn_times(log: &std::path::Path) -> Vec<f64> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[tokio::test]
async fn crash_loop_backs_off_between_spawns_fails_calls_clearly_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("spawns.log");
    let marker = dir.path().join("crash-on-start");
    let cfg = upstream(&format!(
        "id = \"flaky\"\ncommand = \"python3\"\nargs = [{:?}, {:?}, {:?}]\nsharing = \"shared\"\ncall_timeout_s = 5\n",
        fixture("flaky_server.py"),
        log.to_string_lossy(),
        marker.to_string_lossy(),
    ));
    let gw = gateway(vec![cfg]);
    let reg = gw
        .gateway
        .register(RegistrationSpec::new("a").grant("flaky.*"))
        .await
        .unwrap();
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    c.initialize().await;
    assert_eq!(text_of(&c.call("flaky.ping", json!({})).await), "pong");
    assert_eq!(spawn_times(&log).len(), 1);

    // From now on every start crashes; the running one dies under a call.
    std::fs::write(&marker, b"").unwrap();
    let r = c.call("flaky.crash", json!({})).await;
    assert!(
        r.get("error").is_some() || r["result"]["isError"] == true,
        "{r}"
    );

    let failing = 5;
    for i in 0..failing {
        let started = tokio::time::Instant::now();
        let r = c.call("flaky.ping", json!({})).await;
        let took = started.elapsed();
        // A clear error, not a hang: the respawn failed and the call says so.
        let text = r.to_string();
        assert!(
            text.contains("upstream for tool flaky.ping failed"),
            "call {i}: {r}"
        );
        assert!(took < Duration::from_secs(4), "call {i} took {took:?}");
    }
    let times = spawn_times(&log);
    assert_eq!(
        times.len(),
        1 + failing,
        "one spawn attempt per call: {times:?}"
    );
    let gaps: Vec<f64> = times[1..].windows(2).map(|w| w[1] - w[0]).collect();
    eprintln!("gaps between failed spawn attempts: {gaps:?}");
    // Each gap holds the backoff before that attempt — 100, 200, 400, 800 ms — plus the round
    // trip of one failed call (a python start), which is about the same every time.
    for (i, g) in gaps.iter().enumerate() {
        let backoff = 0.1 * f64::from(1u32 << i);
        assert!(
            *g >= backoff * 0.95,
            "gap {i} below its backoff {backoff}: {gaps:?}"
        );
    }
    // (Expected +0.7 s; python start times vary a lot on a loaded machine, hence the margin.)
    assert!(gaps[3] > gaps[0] + 0.2, "backoff grows: {gaps:?}");
    assert!(
        gaps.iter().all(|g| *g < 5.5),
        "backoff is bounded: {gaps:?}"
    );

    // Healthy again: the next call respawns (after the current backoff) and succeeds.
    std::fs::remove_file(&marker).unwrap();
    let r = c.call("flaky.ping", json!({})).await;
    assert_eq!(text_of(&r), "pong", "{r}");
    assert_eq!(spawn_times(&log).len(), 2 + failing);
    // A success resets the backoff: a crash now respawns at once.
    let _ = c.call("flaky.crash", json!({})).await;
    let started = tokio::time::Instant::now();
    assert_eq!(text_of(&c.call("flaky.ping", json!({})).await), "pong");
    assert!(started.elapsed() < Duration::from_millis(1500));
    reg.release().await;
    gw.gateway.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 2. The idle reaper on a paused clock
// ---------------------------------------------------------------------------------------------

/// Runs `f` while keeping the runtime busy, so paused time does not auto-advance while `f`
/// waits on real I/O (child processes) or the audit writer (an OS thread).
async fn without_advance<F: std::future::Future>(f: F) -> F::Output {
    let spin = tokio::spawn(async {
        loop {
            tokio::task::yield_now().await;
        }
    });
    let out = f.await;
    spin.abort();
    out
}

/// Waits in real time (without advancing the paused clock) for `f`.
async fn settle(mut f: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    without_advance(async {
        while std::time::Instant::now() < deadline {
            if f() {
                return true;
            }
            tokio::task::yield_now().await;
        }
        f()
    })
    .await
}

fn live(pool: &Pool, id: &str) -> usize {
    pool.status()
        .into_iter()
        .find(|u| u.id == id)
        .map(|u| u.connections.len())
        .unwrap_or(0)
}

fn in_flight(pool: &Pool, id: &str) -> usize {
    pool.status()
        .into_iter()
        .find(|u| u.id == id)
        .map(|u| u.connections.iter().map(|c| c.in_flight).sum())
        .unwrap_or(0)
}

fn idle_helpdesk(id: &str, sharing: &str) -> UpstreamConfig {
    let mut c = helpdesk(id, sharing, &["--slow-ms", "600000"]);
    c.idle_timeout_s = 60;
    c.call_timeout_s = 3600;
    c
}

#[tokio::test(start_paused = true)]
async fn idle_reaper_on_a_paused_clock_spares_open_leases_and_calls_in_flight() {
    let gw = gateway(vec![
        idle_helpdesk("idle", "shared"),
        idle_helpdesk("busy", "shared"),
        idle_helpdesk("leasing", "leased"),
    ]);
    let pool = gatehouse::testing::pool(&gw.gateway).clone();
    let reg = without_advance(
        gw.gateway.register(
            RegistrationSpec::new("a")
                .grant("idle.*")
                .grant("busy.*")
                .grant("leasing.*"),
        ),
    )
    .await
    .unwrap();
    let state = gatehouse::testing::registry(&gw.gateway)
        .get(reg.id())
        .unwrap();
    assert_eq!(pool.pids().len(), 3);

    // An open lease on "leasing"; a case on "busy" (its slow note needs one).
    for upstream in ["leasing", "busy"] {
        let opened = without_advance(pool.forward(ForwardCall {
            registration: &state,
            session: None,
            upstream,
            tool: "open_case",
            params: Map::new(),
            arguments: json!({"title": "t"}),
            cancel: &CancellationToken::new(),
            notify: None,
            ids: None,
            trace: None,
            param_headers: None,
        }))
        .await;
        assert!(
            matches!(&opened.outcome, ForwardOutcome::Result(r)
                if serde_json::from_str::<Value>(r.get()).unwrap()["isError"] != true),
            "{opened:?}"
        );
    }

    // A call in flight on "busy" (the upstream sleeps 10 real minutes).
    let cancel = CancellationToken::new();
    let slow = {
        let (pool, state, cancel) = (pool.clone(), state.clone(), cancel.clone());
        tokio::spawn(async move {
            pool.forward(ForwardCall {
                registration: &state,
                session: None,
                upstream: "busy",
                tool: "add_note_slow",
                params: Map::new(),
                arguments: json!({"text": "x"}),
                cancel: &cancel,
                notify: None,
                ids: None,
                trace: None,
                param_headers: None,
            })
            .await
        })
    };
    assert!(settle(|| in_flight(&pool, "busy") == 1).await);

    // Half the idle timeout: the reaper has ticked, nothing is idle long enough yet.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        (
            live(&pool, "idle"),
            live(&pool, "busy"),
            live(&pool, "leasing")
        ),
        (1, 1, 1)
    );
    assert_eq!(in_flight(&pool, "busy"), 1);
    // Well past it: the reaper evicts "idle" on its own, and only it.
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(
        settle(|| live(&pool, "idle") == 0).await,
        "idle connection not evicted"
    );
    assert_eq!(
        live(&pool, "busy"),
        1,
        "a call in flight protects its connection: {:?}",
        gw.audit()
            .iter()
            .filter(|r| r.upstream.as_deref() == Some("busy"))
            .map(|r| (r.event.clone(), r.reason.clone()))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        live(&pool, "leasing"),
        1,
        "an open lease protects its connection"
    );
    assert!(!slow.is_finished(), "the slow call is still in flight");
    assert_eq!(pool.pids().len(), 2);

    // The call ends and the lease is released: both become idle from now.
    cancel.cancel();
    let ended = without_advance(slow).await.unwrap();
    assert!(
        matches!(ended.outcome, ForwardOutcome::Cancelled),
        "{ended:?}"
    );
    without_advance(reg.release()).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(live(&pool, "busy"), 1, "its call ended only 30 s ago");
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(
        settle(|| live(&pool, "busy") == 0 && live(&pool, "leasing") == 0).await,
        "idle connections not evicted once the call and the lease ended"
    );
    without_advance(gw.gateway.shutdown()).await;
}

// ---------------------------------------------------------------------------------------------
// 3. Server → client requests over Streamable HTTP
// ---------------------------------------------------------------------------------------------

fn sampler() -> UpstreamConfig {
    upstream(&format!(
        "id = \"mock\"\ncommand = \"python3\"\nargs = [{:?}]\nsharing = \"shared\"\ncall_timeout_s = 10\n",
        fixture("sampling_server.py")
    ))
}

/// A handshake-era Streamable HTTP session (no GET stream).
struct Streamable {
    url: String,
    token: String,
    session: String,
    http: reqwest::Client,
}

impl Streamable {
    async fn open(url: &str, token: &str) -> Streamable {
        let http = http();
        let resp = http
            .post(url)
            .bearer_auth(token)
            .header("accept", ACCEPT_BOTH)
            .json(
                &json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
                "protocolVersion":"2025-11-25","capabilities":{"sampling":{}},
                "clientInfo":{"name":"t","version":"0"}}}),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let session = resp.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_string();
        let s = Streamable {
            url: url.into(),
            token: token.into(),
            session,
            http,
        };
        let resp = s
            .post(json!({"jsonrpc":"2.0","method":"notifications/initialized"}))
            .await;
        assert_eq!(resp.status(), 202);
        s
    }

    async fn post(&self, body: Value) -> reqwest::Response {
        self.http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("accept", ACCEPT_BOTH)
            .header("mcp-session-id", &self.session)
            .header("mcp-protocol-version", "2025-11-25")
            .json(&body)
            .send()
            .await
            .unwrap()
    }
}

/// Next JSON-RPC message on an SSE response stream (skipping priming events and keep-alives).
async fn next_message(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
) -> Option<Value> {
    loop {
        let (event, data) = tokio::time::timeout(Duration::from_secs(8), events.recv())
            .await
            .ok()??;
        match event.as_str() {
            "closed" => return None,
            "message" if !data.trim().is_empty() => return serde_json::from_str(&data).ok(),
            _ => continue,
        }
    }
}

#[tokio::test]
async fn sampling_request_rides_the_streamable_calls_own_response_stream() {
    let gw = gateway(vec![sampler()]);
    let reg = gw
        .gateway
        .register(RegistrationSpec::new("a").grant("mock.*"))
        .await
        .unwrap();
    let client = Streamable::open(&reg.mcp_url(), reg.token()).await;
    // No GET stream is open: the request can only reach the client on the POST's stream.
    let resp = client
        .post(json!({"jsonrpc":"2.0","id":1,"method":"tools/call",
                     "params":{"name":"mock.sample","arguments":{}}}))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let (mut events, _task) = spawn_sse_reader(resp);
    let req = next_message(&mut events)
        .await
        .expect("sampling request on the call's stream");
    assert_eq!(req["method"], "sampling/createMessage", "{req}");
    let down_id = req["id"].as_str().unwrap().to_string();
    assert!(down_id.starts_with("gatehouse-"), "{req}");

    let answered = client
        .post(json!({"jsonrpc":"2.0","id":down_id,
                     "result":{"role":"assistant","content":{"type":"text","text":"hi"}}}))
        .await;
    assert_eq!(answered.status(), 202);
    let reply = next_message(&mut events)
        .await
        .expect("the call's response");
    assert_eq!(reply["id"], 1, "{reply}");
    let answer = &reply["result"]["answer"];
    assert_eq!(
        answer["id"], "srv-sample-1",
        "the upstream got its own id back"
    );
    assert_eq!(answer["result"]["content"]["text"], "hi", "{reply}");
    // The answer is consumed: replaying it is ignored (still 202, nothing reaches upstream).
    let again = client
        .post(json!({"jsonrpc":"2.0","id":down_id,"result":{}}))
        .await;
    assert_eq!(again.status(), 202);
    reg.release().await;
    gw.gateway.shutdown().await;
}

/// A server request during a stateless (2026-07-28) call is never sent as a JSON-RPC request
/// (2026-07-28 servers must not send any): a client that declared the capability gets an MRTR
/// `input_required` result (tests/mrtr.rs goes through the rounds); one that did not is never
/// asked, and the upstream gets an error at once, well before its own 10 s wait.
#[tokio::test]
async fn stateless_requests_turn_server_requests_into_input_required_or_refuse_them_at_once() {
    let gw = gateway(vec![sampler()]);
    let reg = gw
        .gateway
        .register(RegistrationSpec::new("a").grant("mock.*"))
        .await
        .unwrap();
    let post = |caps: Value| {
        http()
            .post(reg.mcp_url())
            .bearer_auth(reg.token())
            .header("accept", ACCEPT_BOTH)
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-method", "tools/call")
            .header("mcp-name", "mock.sample")
            .json(
                &json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{
                "name":"mock.sample","arguments":{},
                "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",
                         "io.modelcontextprotocol/clientCapabilities":caps}}}),
            )
            .send()
    };
    let reply_of = |text: &str| -> Value {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v.get("id") == Some(&json!(7)))
            .or_else(|| serde_json::from_str(text).ok())
            .unwrap_or_else(|| panic!("no reply: {text}"))
    };
    let started = tokio::time::Instant::now();
    let resp = post(json!({})).await.unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let reply = reply_of(&text);
    // The upstream got an error back (and answered with it).
    let answer = &reply["result"]["answer"];
    assert_eq!(answer["error"]["code"], -32603, "{reply}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("did not declare"),
        "{reply}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let resp = post(json!({"sampling": {}})).await.unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let reply = reply_of(&text);
    assert_eq!(reply["result"]["resultType"], "input_required", "{reply}");
    let requests = reply["result"]["inputRequests"].as_object().unwrap();
    assert_eq!(
        requests.values().next().unwrap()["method"],
        "sampling/createMessage",
        "{reply}"
    );
    assert!(reply["result"]["requestState"].is_string(), "{reply}");
    for l in text.lines().filter_map(|l| l.strip_prefix("data:")) {
        let v: Value = serde_json::from_str(l.trim()).unwrap_or(Value::Null);
        assert!(
            v.get("method").is_none() || v.get("id").is_none(),
            "a request was sent: {text}"
        );
    }
    reg.release().await;
    gw.gateway.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// 4. `/v1/upstreams` during a slow call
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn admin_upstreams_shows_the_live_connection_during_a_slow_call() {
    let gw = gateway(vec![helpdesk("helpdesk", "shared", &["--slow-ms", "3000"])]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let server = tokio::spawn(gatehouse::testing::admin::serve(
        listener,
        gatehouse::testing::admin::router(gw.gateway.clone(), "admin-secret"),
        stop.clone(),
    ));
    let reg = gw
        .gateway
        .register(RegistrationSpec::new("a").grant("helpdesk.*"))
        .await
        .unwrap();
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    c.initialize().await;
    let opened = c.call("helpdesk.open_case", json!({"title": "t"})).await;
    assert_ne!(opened["result"]["isError"], true, "{opened}");
    let resp = c
        .post(json!({"jsonrpc":"2.0","id":9,"method":"tools/call",
                     "params":{"name":"helpdesk.add_note_slow","arguments":{"text":"x"}}}))
        .await;
    assert_eq!(resp.status(), 202);
    let pool = gatehouse::testing::pool(&gw.gateway).clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while in_flight(&pool, "helpdesk") == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = pool.pids()[0];

    let unauth = http()
        .get(format!("{admin}/v1/upstreams"))
        .send()
        .await
        .unwrap();
    assert_eq!(unauth.status(), 401);
    let body: Value = http()
        .get(format!("{admin}/v1/upstreams"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let up = body
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["id"] == "helpdesk")
        .unwrap_or_else(|| panic!("{body}"));
    assert_eq!(up["transport"], "stdio", "{body}");
    assert_eq!(up["sharing"], "shared", "{body}");
    assert_eq!(up["restarts"], 0, "{body}");
    let conns = up["connections"].as_array().unwrap();
    assert_eq!(conns.len(), 1, "{body}");
    assert_eq!(conns[0]["pid"], pid, "{body}");
    assert_eq!(conns[0]["epoch"], 1, "{body}");
    assert_eq!(conns[0]["in_flight"], 1, "{body}");

    // Once the call is done the connection stays, idle.
    let reply = c.next_message(10).await.unwrap();
    assert_eq!(reply["id"], 9, "{reply}");
    let body: Value = http()
        .get(format!("{admin}/v1/upstreams"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body[0]["connections"][0]["in_flight"], 0, "{body}");
    assert_eq!(body[0]["connections"][0]["pid"], pid, "{body}");
    stop.cancel();
    let _ = server.await;
    reg.release().await;
    gw.gateway.shutdown().await;
}
