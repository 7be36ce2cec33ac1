//! Soak: a bounded run (SOAK_SECS, default 12 s, after a warm-up phase of the same length; loopback only) of 200 concurrent agents
//! across 50 live registrations at a time, on legacy SSE, Streamable HTTP and stateless
//! 2026-07-28, calling in-process tools and upstreams in every sharing mode (shared, leased
//! helpdesk, per_registration), with random releases, lease expiries mid-call and client
//! disconnects. Every echo carries a registration-specific secret. Afterwards: no reply carried
//! another registration's secret; every success reply has exactly one audit record with the
//! right agent_id; no session, fd or child process outlives its registration; RSS returns to
//! within 10% of its start. Figures: target/reliability/soak.json.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use gatehouse::config::UpstreamConfig;
use gatehouse::RegistrationSpec;
use rand::Rng;
use serde_json::{json, Value};
use tokio::time::Instant;

const SLOTS: usize = 50;
const AGENTS_PER_REG: usize = 4;
const ACCEPT_BOTH: &str = "application/json, text/event-stream";

fn upstream(id: &str, toml_extra: &str) -> UpstreamConfig {
    let script = format!(
        "{}/tests/fixtures/faulty_server.py",
        env!("CARGO_MANIFEST_DIR")
    );
    toml::from_str(&format!(
        "id = \"{id}\"\ncommand = \"python3\"\nargs = [{script:?}]\ncall_timeout_s = 10\n{toml_extra}\n"
    ))
    .unwrap()
}

fn helpdesk() -> UpstreamConfig {
    std::env::set_var("GATEHOUSE_SELF_EXE", env!("CARGO_BIN_EXE_gatehouse"));
    toml::from_str("id = \"hd\"\ncommand = \"@self\"\nargs = [\"demo-upstream\"]\nsharing = \"leased\"\ncall_timeout_s = 10\n").unwrap()
}

fn status_kb(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Processes whose parent is this process.
fn children() -> Vec<u32> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.to_string();
                    rest.split_whitespace().nth(1).map(|p| p == me)
                })
                .unwrap_or(false)
        })
        .collect()
}

#[derive(Default)]
struct Tally {
    tried: AtomicU64,
    ok: AtomicU64,
    errors: AtomicU64,
    disconnects: AtomicU64,
    releases: AtomicU64,
    expiries: AtomicU64,
    registrations: AtomicU64,
    /// Secret leaks: replies that carried a secret not their own.
    leaks: Mutex<Vec<String>>,
    /// nonce -> agent_id of every success reply a client received.
    successes: Mutex<HashMap<String, String>>,
}

struct RegInfo {
    agent: String,
    secret: String,
    token: String,
    sse_url: String,
    mcp_url: String,
    tools: Vec<&'static str>,
}

fn check_secrets(t: &Tally, text: &str, own: &str) {
    for (i, _) in text.match_indices("SEC") {
        let s: String = text[i..].chars().take(own.len()).collect();
        if s != own {
            t.leaks
                .lock()
                .unwrap()
                .push(format!("{own} got {s} in {text}"));
        }
    }
}

/// One reply: records success (secret checked, nonce noted) or error.
fn account(t: &Tally, reg: &RegInfo, tool: &str, nonce: &str, reply: &Value) {
    let text = reply["result"]["content"][0]["text"].as_str().unwrap_or("");
    if reply.get("result").is_some() && reply["result"]["isError"] != true {
        t.ok.fetch_add(1, Ordering::Relaxed);
        if tool != "hd.list_notes" && !text.contains(&reg.secret) {
            t.leaks
                .lock()
                .unwrap()
                .push(format!("{} missing own secret: {text}", reg.agent));
        }
        check_secrets(t, text, &reg.secret);
        t.successes
            .lock()
            .unwrap()
            .insert(nonce.to_string(), reg.agent.clone());
    } else {
        check_secrets(t, &reply.to_string(), &reg.secret);
        t.errors.fetch_add(1, Ordering::Relaxed);
    }
}

fn call_body(id: u64, tool: &str, text: &str, meta: Option<Value>) -> Value {
    let mut params = json!({"name": tool, "arguments": {"text": text}});
    if let Some(m) = meta {
        params["_meta"] = m;
    }
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":params})
}

/// The JSON-RPC message in a JSON or SSE body that answers `id`.
fn reply_in(body: &str, id: u64) -> Option<Value> {
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        return Some(v);
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["id"] == json!(id))
}

/// A legacy SSE session: its POST URL, its events, and the reader task.
type SseConn = (
    String,
    tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
    tokio::task::JoinHandle<()>,
);

async fn agent(t: Arc<Tally>, reg: Arc<RegInfo>, kind: usize, until: Instant) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap();
    let mut id = 0u64;
    // Session setup per transport.
    let mut sse: Option<SseConn> = None;
    let mut session: Option<String> = None;
    let mut failures = 0;
    while Instant::now() < until && failures < 3 {
        id += 1;
        let tool = reg.tools[rand::thread_rng().gen_range(0..reg.tools.len())];
        let nonce = format!("{}-{kind}-{id}", reg.agent);
        let text = format!("{}|{nonce}", reg.secret);
        let disconnect = rand::thread_rng().gen_bool(0.03);
        t.tried.fetch_add(1, Ordering::Relaxed);
        let res: Result<Option<Value>, ()> = async {
            match kind % 3 {
                0 => {
                    if sse.is_none() {
                        let r = client.get(&reg.sse_url).bearer_auth(&reg.token).send().await.map_err(|_| ())?;
                        if r.status() != 200 { return Err(()); }
                        let (mut rx, task) = spawn_sse_reader(r);
                        let (_, ep) = rx.recv().await.ok_or(())?;
                        let base = reg.sse_url.split("/gw/").next().unwrap().to_string();
                        let url = format!("{base}{ep}");
                        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"soak","version":"0"}}});
                        client.post(&url).bearer_auth(&reg.token).json(&init).send().await.map_err(|_| ())?;
                        loop { let (ev, d) = rx.recv().await.ok_or(())?; if ev == "message" && d.contains("protocolVersion") { break; } else if ev == "closed" { return Err(()); } }
                        sse = Some((url, rx, task));
                    }
                    let (url, rx, _) = sse.as_mut().unwrap();
                    let r = client.post(url.as_str()).bearer_auth(&reg.token).json(&call_body(id, tool, &text, None)).send().await.map_err(|_| ())?;
                    if r.status() != 202 { return Err(()); }
                    if disconnect { return Ok(None); }
                    loop {
                        let (ev, d) = tokio::time::timeout(Duration::from_secs(15), rx.recv()).await.map_err(|_| ())?.ok_or(())?;
                        if ev == "closed" { return Err(()); }
                        if ev != "message" { continue; }
                        let v: Value = serde_json::from_str(&d).map_err(|_| ())?;
                        if v["id"] == json!(id) { return Ok(Some(v)); }
                    }
                }
                1 => {
                    if session.is_none() {
                        let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"soak","version":"0"}}});
                        let r = client.post(&reg.mcp_url).bearer_auth(&reg.token).header("accept", ACCEPT_BOTH).json(&init).send().await.map_err(|_| ())?;
                        if r.status() != 200 { return Err(()); }
                        session = Some(r.headers().get("mcp-session-id").ok_or(())?.to_str().map_err(|_| ())?.to_string());
                    }
                    let req = client.post(&reg.mcp_url).bearer_auth(&reg.token).header("accept", ACCEPT_BOTH)
                        .header("mcp-session-id", session.as_deref().unwrap()).header("mcp-protocol-version", "2025-06-18")
                        .json(&call_body(id, tool, &text, None)).send();
                    if disconnect {
                        let _ = tokio::time::timeout(Duration::from_millis(2), req).await;
                        return Ok(None);
                    }
                    let r = req.await.map_err(|_| ())?;
                    if r.status() != 200 { return Err(()); }
                    Ok(reply_in(&r.text().await.map_err(|_| ())?, id))
                }
                _ => {
                    let meta = json!({"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}});
                    let req = client.post(&reg.mcp_url).bearer_auth(&reg.token).header("accept", ACCEPT_BOTH)
                        .header("mcp-protocol-version", "2026-07-28").header("mcp-method", "tools/call").header("mcp-name", tool)
                        .json(&call_body(id, tool, &text, Some(meta))).send();
                    if disconnect {
                        let _ = tokio::time::timeout(Duration::from_millis(2), req).await;
                        return Ok(None);
                    }
                    let r = req.await.map_err(|_| ())?;
                    if r.status() != 200 { return Err(()); }
                    Ok(reply_in(&r.text().await.map_err(|_| ())?, id))
                }
            }
        }
        .await;
        match res {
            Ok(Some(v)) => account(&t, &reg, tool, &nonce, &v),
            Ok(None) => {
                t.disconnects.fetch_add(1, Ordering::Relaxed);
                // A dropped SSE client: the stream goes with it; reconnect next time.
                sse = None;
            }
            Err(()) => {
                t.errors.fetch_add(1, Ordering::Relaxed);
                failures += 1;
                sse = None;
                session = None;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_many_agents_many_registrations_nothing_crosses_nothing_lost_nothing_leaks() {
    let secs: u64 = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let tg = TestGateway::with(|c| {
        c.upstreams = vec![
            upstream("fs", "sharing = \"shared\""),
            upstream("fp", "sharing = \"per_registration\""),
            helpdesk(),
        ];
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.audit.record_arguments = true;
        c.linger_ms = 60_000;
    });
    let gw = tg.gateway.clone();
    gw.pin_server().unwrap();
    let t = Arc::new(Tally::default());
    // Warm-up at full load (allocator arenas, connection pools, shared upstreams), then the
    // baselines: what is left after everything is released must not grow with the work done.
    let warm = Arc::new(Tally::default());
    let warm_secs = secs;
    phase(
        &gw,
        &warm,
        Instant::now() + Duration::from_secs(warm_secs),
        "warm-",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fd0 = fd_count();
    let rss0 = status_kb("VmRSS:");
    let until = Instant::now() + Duration::from_secs(secs);
    phase(&gw, &t, until, "").await;
    // Everything is released: no session, no per-registration child, fds back.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(gw.registry().len(), 0, "registrations left");
    assert_eq!(
        gw.sessions().len(),
        0,
        "sessions outlived their registrations"
    );
    let kids_before_shutdown = children().len();
    assert!(
        kids_before_shutdown <= 2,
        "{kids_before_shutdown} children alive: only the shared fs and hd may remain"
    );
    gw.shutdown().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let kids = children();
    assert!(kids.is_empty(), "children outlived the gateway: {kids:?}");
    let fd1 = fd_count();
    let rss1 = status_kb("VmRSS:");

    // Audit: every success reply has exactly one record, with the right agent_id.
    let records = tg.calls();
    let mut by_nonce: HashMap<String, Vec<String>> = HashMap::new();
    for r in &records {
        let text = r
            .arguments
            .as_ref()
            .and_then(|a| a.get("text"))
            .and_then(Value::as_str)
            .unwrap_or("");
        if let Some((_, nonce)) = text.split_once('|') {
            by_nonce
                .entry(nonce.to_string())
                .or_default()
                .push(r.agent_id.clone().unwrap_or_default());
        }
    }
    let successes = t.successes.lock().unwrap().clone();
    let mut audit_mismatches = Vec::new();
    for (nonce, agent) in &successes {
        match by_nonce.get(nonce) {
            Some(v) if v.len() == 1 && &v[0] == agent => {}
            other => audit_mismatches.push(format!("{nonce}: {other:?}")),
        }
    }
    let leaks = t.leaks.lock().unwrap().clone();
    let figures = json!({
        "seconds": secs,
        "concurrent_agents": SLOTS * AGENTS_PER_REG,
        "live_registrations": SLOTS,
        "registrations_total": t.registrations.load(Ordering::Relaxed),
        "requests_tried": t.tried.load(Ordering::Relaxed),
        "success_replies": t.ok.load(Ordering::Relaxed),
        "error_replies_or_failed_requests": t.errors.load(Ordering::Relaxed),
        "client_disconnects_injected": t.disconnects.load(Ordering::Relaxed),
        "releases_mid_load": t.releases.load(Ordering::Relaxed),
        "lease_expiries_mid_load": t.expiries.load(Ordering::Relaxed),
        "audit_records_checked": records.len(),
        "audit_mismatches": audit_mismatches.len(),
        "secret_leaks": leaks.len(),
        "fds_start": fd0, "fds_end": fd1,
        "rss_kb_start": rss0, "rss_kb_end": rss1,
        "children_after_release": kids_before_shutdown,
    });
    write_figures("soak", &figures);
    assert!(
        leaks.is_empty(),
        "{} leaks: {:?}",
        leaks.len(),
        &leaks[..leaks.len().min(5)]
    );
    assert!(
        audit_mismatches.is_empty(),
        "{} of {} successes without exactly one right record: {:?}",
        audit_mismatches.len(),
        successes.len(),
        &audit_mismatches[..audit_mismatches.len().min(5)]
    );
    assert!(
        t.ok.load(Ordering::Relaxed) > 300,
        "too few successes: {figures}"
    );
    assert!(fd1 <= fd0 + 8, "fds {fd0} -> {fd1}");
    assert!(rss1 * 10 <= rss0 * 11, "RSS {rss0} kB -> {rss1} kB (> 10%)");
}

/// One load phase: 50 registration slots, each re-registering until `until`.
async fn phase(gw: &gatehouse::Gateway, t: &Arc<Tally>, until: Instant, prefix: &'static str) {
    let gen = Arc::new(AtomicU64::new(0));
    let mut slots = Vec::new();
    for slot in 0..SLOTS {
        let (gw, t, gen) = (gw.clone(), t.clone(), gen.clone());
        slots.push(tokio::spawn(async move {
            while Instant::now() < until {
                let g = gen.fetch_add(1, Ordering::Relaxed);
                let agent_id = format!("{prefix}agent-{slot}-{g}");
                let secret = format!(
                    "SEC{:05}{:06}",
                    g,
                    rand::thread_rng().gen_range(0..1_000_000)
                );
                let mut tools = vec!["echo", "fs.echo"];
                let mut spec = RegistrationSpec::new(agent_id.clone())
                    .with_tool(echo_tool("echo", &secret))
                    .grant("fs.echo");
                if slot % 10 == 0 {
                    spec = spec.grant("fp.echo");
                    tools.push("fp.echo");
                }
                if slot % 5 == 1 {
                    spec = spec.grant("hd.list_notes");
                    tools.push("hd.list_notes");
                }
                let expire = rand::thread_rng().gen_bool(0.3);
                let life = Duration::from_millis(rand::thread_rng().gen_range(1000..4000));
                if expire {
                    spec = spec.ttl_s(rand::thread_rng().gen_range(1..3));
                }
                let Ok(reg) = gw.register(spec).await else {
                    continue;
                };
                t.registrations.fetch_add(1, Ordering::Relaxed);
                let reg_id = reg.id().to_string();
                let info = Arc::new(RegInfo {
                    agent: agent_id,
                    secret,
                    token: reg.token().into(),
                    sse_url: reg.sse_url(),
                    mcp_url: reg.mcp_url(),
                    tools,
                });
                let end = (Instant::now() + life).min(until);
                let agents: Vec<_> = (0..AGENTS_PER_REG)
                    .map(|k| tokio::spawn(agent(t.clone(), info.clone(), k + slot, end)))
                    .collect();
                if expire {
                    // The lease expires mid-call; the handle is dropped only afterwards.
                    tokio::time::sleep_until(end).await;
                    t.expiries.fetch_add(1, Ordering::Relaxed);
                    let (_id, _tok) = reg.detach();
                } else {
                    tokio::time::sleep_until(end).await;
                    reg.release().await;
                    t.releases.fetch_add(1, Ordering::Relaxed);
                }
                for a in agents {
                    let _ = a.await;
                }
                if expire {
                    // Make sure it is gone (the lease may still be ticking when the agents stop).
                    gw.release_id(&reg_id, gatehouse::ReleaseReason::Released)
                        .await;
                }
            }
        }));
    }
    for s in slots {
        s.await.unwrap();
    }
}

fn write_figures(name: &str, v: &Value) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/reliability");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_string_pretty(v).unwrap(),
    )
    .unwrap();
}
