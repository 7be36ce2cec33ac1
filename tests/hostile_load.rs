//! Hostile load against a real `gatehouse serve` at its shipped defaults (every bound of the
//! robustness work as `config/gatehouse.toml` writes it; only the ports, the token file and
//! the audit path are set): a stream never read while the same registration makes 1,000
//! calls per second; 10,000 sessions created and abandoned; a POST body trickled a byte a
//! second; a 64 KiB header; an upstream that answers twice, answers ids it was never sent,
//! or writes a 100 MB line. Each gets a clear error or a closed connection; a bystander
//! registration calling all along is always served; the daemon's memory comes back to within
//! 10 MB of its idle figure. The figures go to target/reliability/hostile_load.json
//! (RELIABILITY.md, "Hostile load at the defaults").
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

struct Daemon {
    child: Child,
    dir: tempfile::TempDir,
    /// Its stderr lines so far.
    log: Arc<Mutex<Vec<String>>>,
    data: String,
    admin: String,
    token: String,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn start() -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let script = format!(
            "{}/tests/fixtures/faulty_server.py",
            env!("CARGO_MANIFEST_DIR")
        );
        let config = dir.path().join("gatehouse.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nadmin_token_file = {:?}\n\
                 [audit]\npath = {:?}\n\
                 [[upstreams]]\nid = \"faulty\"\ncommand = \"python3\"\nargs = [{script:?}]\n",
                dir.path().join("admin.token").display().to_string(),
                dir.path().join("audit.jsonl").display().to_string(),
            ),
        )
        .unwrap();
        let mut cmd = common::daemon::serve_command(&config, "info");
        cmd.current_dir(dir.path());
        let (child, log, data, admin) = common::daemon::spawn_ready(cmd);
        let token = std::fs::read_to_string(dir.path().join("admin.token"))
            .unwrap()
            .trim()
            .to_string();
        Daemon {
            child,
            dir,
            log,
            data,
            admin,
            token,
        }
    }

    fn rss_kb(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    async fn register(&self, agent: &str) -> (String, String, String) {
        let resp = http()
            .post(format!("{}/v1/registrations", self.admin))
            .bearer_auth(&self.token)
            .json(&json!({"agent_id": agent, "tools": ["demo.*", "faulty.*"]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let v: Value = resp.json().await.unwrap();
        (
            v["id"].as_str().unwrap().to_string(),
            v["token"].as_str().unwrap().to_string(),
            v["mcp_url"].as_str().unwrap().to_string(),
        )
    }

    async fn release(&self, id: &str) {
        let resp = http()
            .delete(format!("{}/v1/registrations/{id}", self.admin))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success());
    }

    /// RSS after the allocator has had time to return what was freed (the lowest of a few
    /// readings over `secs`).
    async fn settled_rss_kb(&self, secs: u64) -> u64 {
        let mut low = u64::MAX;
        for _ in 0..(secs * 4) {
            low = low.min(self.rss_kb());
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        low
    }
}

/// A stateless `tools/call`; the reply's JSON, or the HTTP status as an error.
async fn call(
    client: &reqwest::Client,
    url: &str,
    token: &str,
    id: u64,
    tool: &str,
    args: Value,
) -> Result<Value, u16> {
    let r = client
        .post(url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .json(&json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{
            "name": tool, "arguments": args,
            "_meta": {"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}))
        .send()
        .await
        .map_err(|_| 0u16)?;
    if !r.status().is_success() {
        return Err(r.status().as_u16());
    }
    r.json::<Value>().await.map_err(|_| 1u16)
}

/// A registration calling `demo.echo` every 20 ms for as long as `stop` is unset: its worst
/// latency and any failure.
struct Bystander {
    worst_ms: Arc<AtomicU64>,
    calls: Arc<AtomicU64>,
    failures: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Bystander {
    fn start(url: String, token: String) -> Bystander {
        let worst_ms = Arc::new(AtomicU64::new(0));
        let calls = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (w, c, f, s) = (
            worst_ms.clone(),
            calls.clone(),
            failures.clone(),
            stop.clone(),
        );
        let task = tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut id = 0;
            while !s.load(Ordering::Relaxed) {
                id += 1;
                let t = Instant::now();
                let r = call(
                    &client,
                    &url,
                    &token,
                    id,
                    "demo.echo",
                    json!({"text": "hi"}),
                )
                .await;
                let ms = t.elapsed().as_millis() as u64;
                w.fetch_max(ms, Ordering::Relaxed);
                c.fetch_add(1, Ordering::Relaxed);
                if r.map(|v| text_of(&v)).unwrap_or_default() != "bystander:hi" {
                    f.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Bystander {
            worst_ms,
            calls,
            failures,
            stop,
            task,
        }
    }

    /// (worst latency ms, calls, failures) since the last reading; the worst is reset.
    fn reading(&self) -> (u64, u64, u64) {
        (
            self.worst_ms.swap(0, Ordering::Relaxed),
            self.calls.swap(0, Ordering::Relaxed),
            self.failures.swap(0, Ordering::Relaxed),
        )
    }
}

/// A raw HTTP/1.1 exchange: the status of the answer (0: closed without one).
fn raw_status(addr: &str, request: &[u8], read_for: Duration) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(read_for)).unwrap();
    let _ = s.write_all(request);
    let mut buf = vec![0u8; 4096];
    let n = s.read(&mut buf).unwrap_or(0);
    let head = String::from_utf8_lossy(&buf[..n]);
    head.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn host_of(url: &str) -> String {
    url.trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_load_at_the_defaults_is_refused_or_cut_and_nothing_else_slows() {
    let d = Daemon::start();
    let addr = host_of(&d.data);
    let client = reqwest::Client::new();

    // Warm-up: the shared upstream started, one call of each kind; then idle.
    let (by_id, by_token, by_url) = d.register("bystander").await;
    let r = call(
        &client,
        &by_url,
        &by_token,
        1,
        "faulty.echo",
        json!({"text": "x"}),
    )
    .await
    .unwrap();
    assert_eq!(text_of(&r), "echo:x");
    let idle_kb = d.settled_rss_kb(2).await;
    let bystander = Bystander::start(by_url.clone(), by_token.clone());
    let mut cases: Vec<Value> = Vec::new();

    // ---- A POST body trickled one byte per second, running beside the other cases.
    let (reg_id, reg_token, reg_url) = d.register("hostile").await;
    let path = reg_url
        .trim_start_matches(&format!("http://{addr}"))
        .to_string();
    let trickle = {
        let (addr, path, token) = (addr.clone(), path.clone(), reg_token.clone());
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(&addr).unwrap();
            let t0 = Instant::now();
            write!(
                s,
                "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n"
            )
            .unwrap();
            s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
            let mut got = Vec::new();
            let mut sent = 0;
            let closed_or_answered = loop {
                if s.write_all(b" ").is_ok() {
                    sent += 1;
                }
                let mut buf = [0u8; 4096];
                match s.read(&mut buf) {
                    Ok(0) => break true,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                    Err(e)
                        if e.kind() == std::io::ErrorKind::WouldBlock
                            || e.kind() == std::io::ErrorKind::TimedOut => {}
                    Err(_) => break true,
                }
                if t0.elapsed() > Duration::from_secs(90) {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(990));
            };
            // Whatever is left of the answer, then the close.
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut buf = [0u8; 4096];
            while let Ok(n) = s.read(&mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            (
                closed_or_answered,
                t0.elapsed(),
                sent,
                String::from_utf8_lossy(&got).into_owned(),
            )
        })
    };

    // ---- A stream never read while the same registration makes 1,000 calls per second.
    {
        let before = d.rss_kb();
        let sse_url = reg_url.replace("/mcp", "/sse");
        let sse_path = sse_url
            .trim_start_matches(&format!("http://{addr}"))
            .to_string();
        let mut s = TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "GET {sse_path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {reg_token}\r\nAccept: text/event-stream\r\n\r\n"
        )
        .unwrap();
        // Read the head and the endpoint event only, then never again.
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&got).contains("session_id=") {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0);
            got.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&got).into_owned();
        let post = text
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap()
            .trim()
            .to_string();
        let post_url = format!("http://{addr}{post}");
        // Its own session: calls whose 64 KiB replies go to the stream nobody reads.
        let big = "y".repeat(64 * 1024);
        let t_unread = Instant::now();
        let hostile_posts = {
            let (post_url, token, big) = (post_url.clone(), reg_token.clone(), big.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut statuses = std::collections::BTreeMap::<u16, u64>::new();
                let mut closed_after = None;
                for m in [
                    json!({"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"never-reads","version":"0"}}}),
                    json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
                ] {
                    let st = client
                        .post(&post_url)
                        .bearer_auth(&token)
                        .json(&m)
                        .send()
                        .await
                        .unwrap()
                        .status();
                    assert_eq!(st.as_u16(), 202);
                }
                for i in 0..4000u64 {
                    let st = client
                        .post(&post_url)
                        .bearer_auth(&token)
                        .json(&json!({"jsonrpc":"2.0","id":i,"method":"tools/call","params":{"name":"demo.echo","arguments":{"text":big}}}))
                        .send()
                        .await
                        .map(|r| r.status().as_u16())
                        .unwrap_or(0);
                    *statuses.entry(st).or_default() += 1;
                    if st == 404 {
                        closed_after = Some(t_unread.elapsed());
                        break;
                    }
                    if st == 429 {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                (statuses, closed_after)
            })
        };
        // The same registration, 1,000 calls a second for 5 s (64 at most in flight).
        let t0 = Instant::now();
        let mut lat = Vec::new();
        let mut failures = 0u64;
        let sem = Arc::new(tokio::sync::Semaphore::new(64));
        let mut tasks = Vec::new();
        for i in 0..5000u64 {
            let due = t0 + Duration::from_micros(i * 1000);
            tokio::time::sleep_until(due.into()).await;
            let permit = sem.clone().acquire_owned().await.unwrap();
            let (client, url, token) = (client.clone(), reg_url.clone(), reg_token.clone());
            tasks.push(tokio::spawn(async move {
                let _p = permit;
                let t = Instant::now();
                let r = call(
                    &client,
                    &url,
                    &token,
                    10_000 + i,
                    "demo.echo",
                    json!({"text": "z"}),
                )
                .await;
                (
                    t.elapsed(),
                    r.map(|v| text_of(&v) == "hostile:z").unwrap_or(false),
                )
            }));
        }
        for t in tasks {
            let (l, ok) = t.await.unwrap();
            lat.push(l.as_secs_f64() * 1000.0);
            if !ok {
                failures += 1;
            }
        }
        let wall = t0.elapsed().as_secs_f64();
        lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let peak = d.rss_kb();
        let (statuses, closed_after) = tokio::time::timeout(Duration::from_secs(60), hostile_posts)
            .await
            .expect("the unread session's posts never ended")
            .unwrap();
        let (worst, by_calls, by_failures) = bystander.reading();
        assert_eq!(failures, 0, "calls of the same registration failed");
        assert_eq!(by_failures, 0, "the bystander was refused");
        let closed_after = closed_after.unwrap_or_else(|| panic!("the unread session was never closed: {statuses:?}; rss {} kB, before {before} kB; {}", d.rss_kb(), d.log_text().lines().rev().take(15).collect::<Vec<_>>().join("\n")));
        cases.push(json!({
            "case": "a stream never read (legacy SSE, its own calls' 64 KiB replies queued to it) while the same registration makes 1,000 calls/s",
            "seen": format!("the unread session closed {} ms after its first call (slow_reader_grace 10 s, queue_bytes 4 MiB); its POSTs: {}; the registration's 5,000 other calls at {:.0}/s: all served, p50 {:.1} ms, p99 {:.1} ms, max {:.0} ms",
                closed_after.as_millis(),
                statuses.iter().map(|(k, v)| format!("{k} x{v}")).collect::<Vec<_>>().join(", "),
                5000.0 / wall, lat[lat.len() / 2], lat[lat.len() * 99 / 100], lat[lat.len() - 1]),
            "bystander": format!("{by_calls} calls, worst {worst} ms, 0 failed"),
            "rss_growth_kb": peak.saturating_sub(before),
            "ok": true,
        }));
        drop(s);
    }

    // ---- 10,000 sessions created and abandoned without DELETE.
    {
        let before = d.rss_kb();
        let t0 = Instant::now();
        let mut statuses = std::collections::BTreeMap::<u16, u64>::new();
        let sem = Arc::new(tokio::sync::Semaphore::new(32));
        let mut tasks = Vec::new();
        for i in 0..10_000u64 {
            let permit = sem.clone().acquire_owned().await.unwrap();
            let (client, url, token) = (client.clone(), reg_url.clone(), reg_token.clone());
            tasks.push(tokio::spawn(async move {
                let _p = permit;
                client
                    .post(&url)
                    .bearer_auth(&token)
                    .header("accept", "application/json, text/event-stream")
                    .json(&json!({"jsonrpc":"2.0","id":i,"method":"initialize","params":{
                        "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"abandon","version":"0"}}}))
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0)
            }));
        }
        for t in tasks {
            *statuses.entry(t.await.unwrap()).or_default() += 1;
        }
        let took = t0.elapsed();
        let peak = d.rss_kb();
        let health: Value = http()
            .get(format!("{}/healthz", d.data))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let (worst, by_calls, by_failures) = bystander.reading();
        assert_eq!(by_failures, 0, "the bystander was refused");
        assert!(
            statuses.keys().all(|s| *s == 200 || *s == 503),
            "{statuses:?}"
        );
        cases.push(json!({
            "case": "10,000 Streamable HTTP sessions initialized and abandoned (no DELETE), one registration",
            "seen": format!("{} in {} ms; sessions held after: {} (max_per_registration 64: the oldest idle evicted)",
                statuses.iter().map(|(k, v)| format!("{k} x{v}")).collect::<Vec<_>>().join(", "),
                took.as_millis(), health["sessions"]),
            "bystander": format!("{by_calls} calls, worst {worst} ms, 0 failed"),
            "rss_growth_kb": peak.saturating_sub(before),
            "ok": true,
        }));
    }

    // ---- A header of 64 KiB.
    {
        let big = "h".repeat(64 * 1024);
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {reg_token}\r\nX-Big: {big}\r\nContent-Length: 0\r\n\r\n"
        );
        let st = raw_status(&addr, req.as_bytes(), Duration::from_secs(10));
        let (worst, by_calls, by_failures) = bystander.reading();
        assert_eq!(st, 431, "a 64 KiB header");
        assert_eq!(by_failures, 0);
        cases.push(json!({
            "case": "a header of 64 KiB",
            "seen": format!("{st} (headers over 64 KiB), connection closed"),
            "bystander": format!("{by_calls} calls, worst {worst} ms, 0 failed"),
            "rss_growth_kb": 0,
            "ok": true,
        }));
    }

    // ---- An upstream that answers twice, answers ids it was never sent, writes a 100 MB line.
    {
        let before = d.rss_kb();
        let log_before = d.log_text().lines().count();
        let r = call(&client, &reg_url, &reg_token, 1, "faulty.twice", json!({}))
            .await
            .unwrap();
        let twice = text_of(&r);
        assert_eq!(twice, "first answer");
        let r = call(
            &client,
            &reg_url,
            &reg_token,
            2,
            "faulty.stray",
            json!({"n": 10_000}),
        )
        .await
        .unwrap();
        assert_eq!(text_of(&r), "after strays");
        let t = Instant::now();
        let r = call(
            &client,
            &reg_url,
            &reg_token,
            3,
            "faulty.huge",
            json!({"mb": 100}),
        )
        .await
        .unwrap();
        let huge_ms = t.elapsed().as_millis();
        let huge_error = r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            huge_error.contains("larger than"),
            "the 100 MB answer must fail its call with a clear error: {r}"
        );
        let peak = d.rss_kb();
        let r = call(
            &client,
            &reg_url,
            &reg_token,
            4,
            "faulty.echo",
            json!({"text": "after"}),
        )
        .await
        .unwrap();
        assert_eq!(
            text_of(&r),
            "echo:after",
            "the upstream serves on after the huge line"
        );
        let log_lines = d.log_text().lines().count() - log_before;
        let (worst, by_calls, by_failures) = bystander.reading();
        assert_eq!(by_failures, 0);
        assert!(
            log_lines < 200,
            "10,000 stray answers logged {log_lines} lines"
        );
        cases.push(json!({
            "case": "an upstream that answers a call twice, answers 10,000 ids it was never sent, and writes a 100 MB line",
            "seen": format!("twice: the first answer delivered, the second dropped; strays: all dropped, the call answered after them; 100 MB line: the call failed in {huge_ms} ms with {huge_error:?} (16 MiB line limit; the line's id read from its first bytes), the next call served; {log_lines} log lines for all of it"),
            "bystander": format!("{by_calls} calls, worst {worst} ms, 0 failed"),
            "rss_growth_kb": peak.saturating_sub(before),
            "ok": true,
        }));
    }

    // ---- The trickled body's end.
    let (closed, after, sent, answer) =
        tokio::task::spawn_blocking(move || trickle.join().unwrap())
            .await
            .unwrap();
    assert!(closed, "the trickled body was never cut off: {answer}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout_s"), "{answer}");
    cases.push(json!({
        "case": "a POST body trickled one byte per second (Content-Length 1000)",
        "seen": format!("408 with a JSON-RPC error naming connections.body_timeout_s after {} ms ({sent} bytes sent), connection closed", after.as_millis()),
        "bystander": "served throughout (see the rows above)",
        "rss_growth_kb": 0,
        "ok": true,
    }));

    // ---- Afterwards: everything released, memory back near idle.
    bystander.stop.store(true, Ordering::Relaxed);
    bystander.task.await.unwrap();
    d.release(&reg_id).await;
    d.release(&by_id).await;
    // The bystander registers again so the comparison is with one live registration, as idle.
    let (_id2, token2, url2) = d.register("bystander").await;
    call(
        &client,
        &url2,
        &token2,
        1,
        "faulty.echo",
        json!({"text": "x"}),
    )
    .await
    .unwrap();
    let after_kb = d.settled_rss_kb(5).await;
    let growth = after_kb as i64 - idle_kb as i64;
    let out = json!({
        "cases": cases,
        "idle_rss_kb": idle_kb,
        "after_rss_kb": after_kb,
        "growth_kb": growth,
        "bound_kb": 10 * 1024,
    });
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/reliability");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("hostile_load.json"),
        serde_json::to_vec_pretty(&out).unwrap(),
    )
    .unwrap();
    assert!(
        growth < 10 * 1024,
        "RSS {after_kb} kB after the hostile load, {idle_kb} kB idle: more than 10 MB kept"
    );
    let _ = &d.dir;
}
