//! The gateway benchmark: one run measures the gateway and its baselines side by side, on
//! loopback, with our own load client (hyper, one keep-alive connection per worker) that speaks
//! every transport, including legacy SSE (POST -> 202, reply on the stream).
//!
//! `cargo bench --bench gateway -- [--quick] [--out BENCHMARKS.md] [--only transports,proxy,scale,idle,console,store]
//!  [--external NAME=KIND:URL ...]`
//!
//! Figures are printed, never asserted. Targets are ratios against a baseline in the same run.
//! The proxy section's rows with an HTTP upstream over http and over https (issue 46) exist
//! only when `--targets` names them ("gateway → http upstream", "gateway → https upstream";
//! `upstream_http`, bench/callgrind_tls.sh).
#![allow(clippy::unwrap_used, clippy::expect_used)]

// The allocator `gatehouse serve` runs with (src/main.rs), so that the embedded gateway is
// measured as the daemon runs. The baselines in this process use it too.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use gatehouse::config::UpstreamConfig;
use gatehouse::{Config, Gateway, InProcessTool, RegistrationSpec, ToolResult};
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot};

mod console;
mod store;
mod upstream_http;

const GATEHOUSE_BIN: &str = env!("CARGO_BIN_EXE_gatehouse");

// ------------------------------------------------------------------------------------------
// Options
// ------------------------------------------------------------------------------------------

struct Opts {
    quick: bool,
    out: Option<String>,
    only: Vec<String>,
    external: Vec<(String, Target)>,
    duration: Duration,
    warmup: Duration,
    concurrency: Vec<usize>,
    /// `--calls N`: each load point makes exactly N calls (no warm-up) instead of running for
    /// `duration`; for instruction counts under callgrind.
    calls: Option<u64>,
    /// `--targets a;b`: in the proxy section, only the rows whose name contains one of these.
    targets: Vec<String>,
    /// `--rounds N`: the proxy section measures its baseline, its floors and the gateway's rows
    /// N times, alternating, and prints each row's median (3; 1 with `--quick`).
    rounds: usize,
}

fn opts() -> Opts {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut o = Opts {
        quick: false,
        out: None,
        only: Vec::new(),
        external: Vec::new(),
        duration: Duration::from_secs(3),
        warmup: Duration::from_millis(500),
        concurrency: vec![1, 8, 64],
        calls: None,
        targets: Vec::new(),
        rounds: 3,
    };
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--quick" => o.quick = true,
            "--out" => {
                i += 1;
                o.out = args.get(i).cloned();
            }
            "--only" => {
                i += 1;
                o.only = args
                    .get(i)
                    .map(|s| s.split(',').map(str::to_string).collect())
                    .unwrap_or_default();
            }
            "--external" => {
                // NAME=sse:http://host:port/sse  or  NAME=streamable:http://host:port/mcp
                i += 1;
                if let Some(spec) = args.get(i) {
                    if let Some(t) = parse_external(spec) {
                        o.external.push(t);
                    } else {
                        eprintln!("ignoring bad --external {spec}");
                    }
                }
            }
            "--clients" => {
                i += 1;
                if let Some(v) = args.get(i) {
                    o.concurrency = v.split(',').filter_map(|c| c.parse().ok()).collect();
                }
            }
            "--calls" => {
                i += 1;
                o.calls = args.get(i).and_then(|s| s.parse().ok());
            }
            "--targets" => {
                i += 1;
                o.targets = args
                    .get(i)
                    .map(|s| s.split(';').map(str::to_lowercase).collect())
                    .unwrap_or_default();
            }
            "--rounds" => {
                i += 1;
                if let Some(n) = args.get(i).and_then(|s| s.parse().ok()) {
                    o.rounds = n;
                }
            }
            "--duration-ms" => {
                i += 1;
                if let Some(ms) = args.get(i).and_then(|s| s.parse().ok()) {
                    o.duration = Duration::from_millis(ms);
                }
            }
            _ => {} // `cargo bench` passes `--bench`
        }
        i += 1;
    }
    if o.quick {
        o.duration = Duration::from_millis(1000);
        o.warmup = Duration::from_millis(200);
        o.rounds = 1;
    }
    o
}

/// `NAME=KIND:URL[|TOOL]` (the tool's name as the proxy exposes it; `echo` by default).
fn parse_external(spec: &str) -> Option<(String, Target)> {
    let (name, rest) = spec.split_once('=')?;
    let (rest, tool) = rest.split_once('|').unwrap_or((rest, "echo"));
    let (kind, url) = rest.split_once(':')?;
    let url = url.strip_prefix("//").map(|_| url).unwrap_or(url);
    let u: http::Uri = url.parse().ok()?;
    let host = u.authority()?.as_str().to_string();
    let addr: SocketAddr = host.replace("localhost", "127.0.0.1").parse().ok()?;
    let path = u.path().to_string();
    let target = match kind {
        "sse" => Target::Sse {
            addr,
            sse_path: path,
            token: None,
            tool: tool.into(),
        },
        "streamable" => Target::Streamable {
            addr,
            path,
            token: None,
            tool: tool.into(),
            version: "2025-03-26",
        },
        _ => return None,
    };
    Some((name.to_string(), target))
}

// ------------------------------------------------------------------------------------------
// Targets and the load client
// ------------------------------------------------------------------------------------------

#[derive(Clone)]
enum Target {
    /// A bare hyper server answering the canned reply.
    Ceiling { addr: SocketAddr, body: Bytes },
    Sse {
        addr: SocketAddr,
        sse_path: String,
        token: Option<String>,
        tool: String,
    },
    Streamable {
        addr: SocketAddr,
        path: String,
        token: Option<String>,
        tool: String,
        version: &'static str,
    },
    Stateless {
        addr: SocketAddr,
        path: String,
        token: String,
        tool: String,
    },
    /// The stdio upstream called directly (one child, requests multiplexed by id).
    Stdio(StdioMux),
}

#[derive(Clone, Debug, Default)]
struct Stats {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    errors: u64,
    /// Server-side CPU (threads `server*` and `gatehouse-audit`) per call, µs.
    cpu_us: f64,
}

async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

fn post(addr: SocketAddr, path: &str, body: Bytes) -> http::request::Builder {
    let _ = body;
    Request::builder()
        .method("POST")
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
}

async fn roundtrip(
    sender: &mut SendRequest<Full<Bytes>>,
    req: Request<Full<Bytes>>,
) -> Result<(http::StatusCode, http::HeaderMap, Bytes)> {
    sender.ready().await?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, headers, body))
}

fn call_body(id: u64, tool: &str, meta: Option<Value>) -> Bytes {
    let mut params = json!({"name": tool, "arguments": {"message": "hello", "text": "hello"}});
    if let Some(m) = meta {
        params["_meta"] = m;
    }
    Bytes::from(json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":params}).to_string())
}

fn init_body(version: &str) -> Bytes {
    Bytes::from(
        json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
            "protocolVersion":version,"capabilities":{},"clientInfo":{"name":"gatehouse-bench","version":"0"}}})
        .to_string(),
    )
}

const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

/// One worker's connection state, per transport.
enum Conn {
    Ceiling {
        s: SendRequest<Full<Bytes>>,
        addr: SocketAddr,
        body: Bytes,
    },
    Sse {
        s: SendRequest<Full<Bytes>>,
        addr: SocketAddr,
        post_path: String,
        token: Option<String>,
        tool: String,
        stream: SseReader,
    },
    Streamable {
        s: SendRequest<Full<Bytes>>,
        addr: SocketAddr,
        path: String,
        token: Option<String>,
        tool: String,
        session: Option<String>,
        version: &'static str,
    },
    Stateless {
        s: SendRequest<Full<Bytes>>,
        addr: SocketAddr,
        path: String,
        token: String,
        tool: String,
    },
    Stdio(StdioMux),
}

fn auth(b: http::request::Builder, token: &Option<String>) -> http::request::Builder {
    match token {
        Some(t) => b.header("authorization", format!("Bearer {t}")),
        None => b,
    }
}

struct SseReader {
    _get: SendRequest<Full<Bytes>>,
    body: Incoming,
    buf: Vec<u8>,
}

impl SseReader {
    /// The next event (name, data).
    async fn next(&mut self) -> Result<(String, String)> {
        loop {
            if let Some(pos) = find_event_end(&self.buf) {
                let block: Vec<u8> = self.buf.drain(..pos).collect();
                let text = String::from_utf8_lossy(&block);
                let mut event = "message".to_string();
                let mut data = Vec::new();
                for line in text.lines() {
                    let line = line.trim_end_matches('\r');
                    if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
                    }
                }
                if data.is_empty() {
                    continue;
                }
                return Ok((event, data.join("\n")));
            }
            let frame = self
                .body
                .frame()
                .await
                .ok_or_else(|| anyhow!("SSE stream ended"))??;
            if let Ok(d) = frame.into_data() {
                self.buf.extend_from_slice(&d);
            }
        }
    }
}

/// End (exclusive, past the blank line) of the first complete SSE event in `buf`.
fn find_event_end(buf: &[u8]) -> Option<usize> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|p| p + 2);
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

async fn open(target: &Target) -> Result<Conn> {
    match target {
        Target::Ceiling { addr, body } => Ok(Conn::Ceiling {
            s: connect(*addr).await?,
            addr: *addr,
            body: body.clone(),
        }),
        Target::Stdio(m) => Ok(Conn::Stdio(m.clone())),
        Target::Stateless {
            addr,
            path,
            token,
            tool,
        } => Ok(Conn::Stateless {
            s: connect(*addr).await?,
            addr: *addr,
            path: path.clone(),
            token: token.clone(),
            tool: tool.clone(),
        }),
        Target::Streamable {
            addr,
            path,
            token,
            tool,
            version,
        } => {
            let mut s = connect(*addr).await?;
            let req =
                auth(post(*addr, path, Bytes::new()), token).body(Full::new(init_body(version)))?;
            let (st, h, body) = roundtrip(&mut s, req).await?;
            if !st.is_success() {
                bail!("initialize: {st} {}", String::from_utf8_lossy(&body));
            }
            let session = h
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let mut b = auth(post(*addr, path, Bytes::new()), token)
                .header("mcp-protocol-version", *version);
            if let Some(sid) = &session {
                b = b.header("mcp-session-id", sid);
            }
            let (st, _, _) = roundtrip(
                &mut s,
                b.body(Full::new(Bytes::from_static(INITIALIZED.as_bytes())))?,
            )
            .await?;
            if !st.is_success() {
                bail!("notifications/initialized: {st}");
            }
            Ok(Conn::Streamable {
                s,
                addr: *addr,
                path: path.clone(),
                token: token.clone(),
                tool: tool.clone(),
                session,
                version,
            })
        }
        Target::Sse {
            addr,
            sse_path,
            token,
            tool,
        } => {
            let mut g = connect(*addr).await?;
            g.ready().await?;
            let req = auth(
                Request::builder()
                    .method("GET")
                    .uri(sse_path.as_str())
                    .header("host", addr.to_string())
                    .header("accept", "text/event-stream"),
                token,
            )
            .body(Full::new(Bytes::new()))?;
            let resp = g.send_request(req).await?;
            if !resp.status().is_success() {
                bail!("GET {sse_path}: {}", resp.status());
            }
            // Keep the GET connection's sender alive with the stream.
            let mut stream = SseReader {
                _get: g,
                body: resp.into_body(),
                buf: Vec::new(),
            };
            let (ev, endpoint) = stream.next().await?;
            if ev != "endpoint" {
                bail!("first SSE event is {ev}, not endpoint");
            }
            let post_path = if let Some(rest) = endpoint.strip_prefix("http") {
                let u: http::Uri = format!("http{rest}").parse()?;
                u.path_and_query()
                    .map(|p| p.to_string())
                    .unwrap_or_default()
            } else if endpoint.starts_with('/') {
                endpoint
            } else {
                // relative to the SSE path's directory
                let dir = sse_path.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
                format!("{dir}/{endpoint}")
            };
            let s = connect(*addr).await?;
            let mut c = Conn::Sse {
                s,
                addr: *addr,
                post_path,
                token: token.clone(),
                tool: tool.clone(),
                stream,
            };
            c.sse_request(init_body("2024-11-05"), Some(0)).await?;
            c.sse_request(Bytes::from_static(INITIALIZED.as_bytes()), None)
                .await?;
            Ok(c)
        }
    }
}

impl Conn {
    async fn sse_request(&mut self, body: Bytes, id: Option<u64>) -> Result<()> {
        let Conn::Sse {
            s,
            addr,
            post_path,
            token,
            stream,
            ..
        } = self
        else {
            bail!("not an SSE connection")
        };
        let req = auth(post(*addr, post_path, Bytes::new()), token).body(Full::new(body))?;
        let (st, _, b) = roundtrip(s, req).await?;
        if !st.is_success() {
            bail!("POST {post_path}: {st} {}", String::from_utf8_lossy(&b));
        }
        let Some(id) = id else { return Ok(()) };
        let want = format!("\"id\":{id}");
        loop {
            let (ev, data) = stream.next().await?;
            if ev == "message" && data.contains(&want) {
                if data.contains("\"error\"") {
                    bail!("error reply: {data}");
                }
                return Ok(());
            }
        }
    }

    async fn call(&mut self, id: u64) -> Result<()> {
        match self {
            Conn::Ceiling { s, addr, body } => {
                let req = post(*addr, "/", Bytes::new())
                    .header("authorization", "Bearer x")
                    .body(Full::new(call_body(id, "echo", None)))?;
                let (st, _, b) = roundtrip(s, req).await?;
                if !st.is_success() || b.len() != body.len() {
                    bail!("ceiling: {st}");
                }
                Ok(())
            }
            Conn::Stateless {
                s,
                addr,
                path,
                token,
                tool,
            } => {
                let meta = json!({
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {}
                });
                let req = post(*addr, path, Bytes::new())
                    .header("authorization", format!("Bearer {token}"))
                    .header("mcp-protocol-version", "2026-07-28")
                    .header("mcp-method", "tools/call")
                    .header("mcp-name", tool.as_str())
                    .body(Full::new(call_body(id, tool, Some(meta))))?;
                let (st, _, b) = roundtrip(s, req).await?;
                check_reply(st, &b)
            }
            Conn::Streamable {
                s,
                addr,
                path,
                token,
                tool,
                session,
                version,
            } => {
                let mut b = auth(post(*addr, path, Bytes::new()), token)
                    .header("mcp-protocol-version", *version);
                if let Some(sid) = session {
                    b = b.header("mcp-session-id", sid.as_str());
                }
                let req = b.body(Full::new(call_body(id, tool, None)))?;
                let (st, _, body) = roundtrip(s, req).await?;
                check_reply(st, &body)
            }
            Conn::Sse { tool, .. } => {
                let body = call_body(id, &tool.clone(), None);
                self.sse_request(body, Some(id)).await
            }
            Conn::Stdio(m) => m.call(id).await,
        }
    }
}

fn check_reply(st: http::StatusCode, body: &[u8]) -> Result<()> {
    if !st.is_success() {
        bail!("{st}: {}", String::from_utf8_lossy(body));
    }
    // JSON or an SSE-framed reply; either must carry a result, not an error.
    let text = String::from_utf8_lossy(body);
    if !text.contains("\"result\"") || text.contains("\"isError\":true") {
        bail!("bad reply: {text}");
    }
    Ok(())
}

/// Runs `concurrency` workers against `target` for `opts.duration` after a warm-up, or (with
/// `--calls N`) for exactly N calls without a warm-up.
async fn load(target: &Target, concurrency: usize, o: &Opts) -> Result<Stats> {
    let mut conns = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        conns.push(open(target).await?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let measuring = Arc::new(AtomicBool::new(o.calls.is_some()));
    // Calls left to start in `--calls` mode (never reaches zero otherwise).
    let left = Arc::new(AtomicU64::new(o.calls.unwrap_or(u64::MAX)));
    let errors = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(Mutex::new(None::<String>));
    let mut handles = Vec::new();
    let t0 = Instant::now();
    let cpu0 = server_cpu_ticks();
    for (w, mut c) in conns.into_iter().enumerate() {
        let (stop, measuring, left, errors, first_error) = (
            stop.clone(),
            measuring.clone(),
            left.clone(),
            errors.clone(),
            first_error.clone(),
        );
        handles.push(tokio::spawn(async move {
            let mut lat: Vec<u32> = Vec::with_capacity(1 << 16);
            let mut id = (w as u64) << 32;
            while !stop.load(Ordering::Relaxed) {
                if left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_err()
                {
                    break;
                }
                id += 1;
                let t = Instant::now();
                let r = c.call(id).await;
                let us = t.elapsed().as_micros() as u32;
                match r {
                    Ok(()) => {
                        if measuring.load(Ordering::Relaxed) {
                            lat.push(us);
                        }
                    }
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        first_error.lock().unwrap().get_or_insert(format!("{e:#}"));
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        if matches!(c, Conn::Sse { .. }) {
                            break; // a broken stream cannot recover
                        }
                    }
                }
            }
            lat
        }));
    }
    // Duration mode: the period and its CPU, taken as it ends (before the workers finish
    // their last calls).
    let timed = if o.calls.is_some() {
        None
    } else {
        tokio::time::sleep(o.warmup).await;
        measuring.store(true, Ordering::Relaxed);
        let t0 = Instant::now();
        let cpu0 = server_cpu_ticks();
        tokio::time::sleep(o.duration).await;
        measuring.store(false, Ordering::Relaxed);
        let cpu1 = server_cpu_ticks();
        let elapsed = t0.elapsed();
        stop.store(true, Ordering::Relaxed);
        Some((elapsed, cpu0, cpu1))
    };
    let mut all = Vec::new();
    let wait = if o.calls.is_some() {
        Duration::from_secs(3600)
    } else {
        Duration::from_secs(10)
    };
    for h in handles {
        if let Ok(Ok(v)) = tokio::time::timeout(wait, h).await {
            all.extend(v);
        }
    }
    let (elapsed, cpu0, cpu1) = timed.unwrap_or_else(|| (t0.elapsed(), cpu0, server_cpu_ticks()));
    if let Some(e) = first_error.lock().unwrap().take() {
        eprintln!("  first error: {e}");
    }
    let mut st = summarize(all, elapsed, errors.load(Ordering::Relaxed));
    let calls = st.rps * elapsed.as_secs_f64();
    st.cpu_us = (cpu1 - cpu0) as f64 * 1e6 / ticks_per_sec() / calls.max(1.0);
    Ok(st)
}

fn ticks_per_sec() -> f64 {
    100.0 // USER_HZ on Linux
}

/// CPU ticks (utime + stime) of this process's server-side threads.
fn server_cpu_ticks() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    let mut total = 0;
    for e in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let (Some(l), Some(r)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[l + 1..r];
        if !(comm.starts_with("server") || comm.starts_with("gatehouse-audit")) {
            continue;
        }
        let f: Vec<&str> = stat[r + 2..].split_whitespace().collect();
        // fields after comm: state(0) ... utime(11) stime(12)
        let ut: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0);
        let stt: u64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
        total += ut + stt;
    }
    total
}

fn summarize(mut all: Vec<u32>, elapsed: Duration, errors: u64) -> Stats {
    all.sort_unstable();
    let pct = |p: f64| -> f64 {
        if all.is_empty() {
            return f64::NAN;
        }
        let i = ((all.len() as f64 - 1.0) * p).round() as usize;
        all[i] as f64
    };
    Stats {
        rps: all.len() as f64 / elapsed.as_secs_f64(),
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        errors,
        cpu_us: f64::NAN,
    }
}

// ------------------------------------------------------------------------------------------
// Servers under test
// ------------------------------------------------------------------------------------------

fn server_runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("server")
        .enable_all()
        .build()
        .unwrap()
}

fn echo_tool() -> InProcessTool {
    InProcessTool::new(
        "echo",
        "Echoes its message",
        json!({"type":"object","properties":{"message":{"type":"string"}}}),
        |args, _ctx| async move {
            let text = args.get("message").and_then(Value::as_str).unwrap_or("");
            Ok(ToolResult::text(text))
        },
    )
}

fn gateway_config(dir: &std::path::Path) -> Config {
    let mut c = Config::default();
    c.audit.path = dir.join("audit.jsonl");
    c.linger_ms = 0;
    // Every load point opens its own sessions; the default cap (64 per registration) is a
    // product limit, not a cost, so the bench raises it.
    c.sessions.max_per_registration = 4096;
    // Tracing on (issue 38's cost figure): spans exported to this OTLP/HTTP traces URL.
    if let Ok(url) = std::env::var("GATEHOUSE_BENCH_OTLP_TRACES") {
        c.telemetry.traces_endpoint = Some(url);
        c.telemetry.delay_ms = 200;
    }
    c
}

/// A bare hyper server that answers every request with the same canned body.
async fn bare_server(body: Bytes) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let body = body.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let body = body.clone();
                    async move {
                        let _ = req.into_body().collect().await;
                        Ok::<_, std::convert::Infallible>(
                            http::Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(body))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok(addr)
}

// ------------------------------------------------------------------------------------------
// The proxy section's ceiling: a minimal HTTP -> stdio proxy
// ------------------------------------------------------------------------------------------

type MinimalPending = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

/// The least an HTTP -> stdio MCP proxy does: a hyper server, one shared `gatehouse
/// echo-upstream` child, ids rewritten from an atomic counter, a pending map, one writer task
/// for the child's stdin and one reader task for its stdout; no auth, no audit, no sessions.
/// The body is parsed into a `Value` and the reply re-encoded, as a proxy that rewrites ids
/// must. `initialize` is answered from the child's own (one) initialize result; notifications
/// get 202 and are not forwarded (the child was initialized once, by the proxy).
/// What every gateway must do per proxied call and the minimal proxy does not, done the
/// cheapest way: the bearer token checked (SHA-256 of the presented token against the
/// expected digest, constant time), the Host header checked, and one hash-chained audit line
/// per call (the record's fields, its argument digest, the previous line's hash) written to a
/// file with one `write` before the reply, as `fsync = "interval"` does between syncs.
struct Required {
    token_digest: [u8; 32],
    audit: Mutex<(std::fs::File, String, u64)>,
}

impl Required {
    fn new(token: &str, path: &std::path::Path) -> Result<Required> {
        use sha2::{Digest, Sha256};
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Required {
            token_digest: Sha256::digest(token.as_bytes()).into(),
            audit: Mutex::new((file, "0".repeat(64), 0)),
        })
    }

    /// 401/403 as the gateway would answer them, or `None` when the request may go on.
    fn refuse(&self, req: &Request<Incoming>) -> Option<u16> {
        use sha2::{Digest, Sha256};
        use subtle::ConstantTimeEq;
        let host = req.headers().get("host").and_then(|h| h.to_str().ok());
        if !host.is_some_and(|h| h.starts_with("127.0.0.1:") || h.starts_with("localhost:")) {
            return Some(403);
        }
        let Some(presented) = req
            .headers()
            .get("authorization")
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "))
        else {
            return Some(401);
        };
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        (!bool::from(digest.ct_eq(&self.token_digest))).then_some(401)
    }

    /// What the record needs from the request, taken before it is forwarded: the tool's
    /// name and the digest of the arguments.
    fn about(msg: &Value) -> Result<(String, String)> {
        use sha2::{Digest, Sha256};
        let args = serde_json::to_vec(&msg["params"]["arguments"])?;
        let name = msg["params"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        Ok((name, format!("{:x}", Sha256::digest(&args))))
    }

    /// The call's audit line, written before its reply is sent: the fields a gateway's
    /// record has, written directly (no map), chained by the previous line's hash.
    fn record(&self, about: &(String, String), reply: &Value, started: Instant) -> Result<()> {
        use sha2::{Digest, Sha256};
        use std::io::Write as _;
        let outcome = if reply["result"]["isError"] == json!(true) {
            "tool_error"
        } else {
            "ok"
        };
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        let tool = serde_json::to_string(&about.0)?;
        let mut audit = self.audit.lock().map_err(|_| anyhow!("audit lock"))?;
        let (file, prev, seq) = &mut *audit;
        *seq += 1;
        let mut line = Vec::with_capacity(512);
        write!(
            line,
            "{{\"seq\":{seq},\"ts\":{ts},\"event\":\"governed_mcp_call\",\"registration_id\":\"bench\",\"agent_id\":\"bench\",\"transport\":\"streamable_http\",\"tool\":{tool},\"upstream\":\"echo\",\"args_digest\":\"{}\",\"outcome\":\"{outcome}\",\"duration_ms\":{},\"prev\":\"{prev}\"}}",
            about.1,
            started.elapsed().as_secs_f64() * 1000.0,
        )?;
        *prev = format!("{:x}", Sha256::digest(&line));
        line.push(b'\n');
        file.write_all(&line)?;
        Ok(())
    }
}

type BenchBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

fn full(b: Bytes) -> BenchBody {
    Full::new(b).boxed()
}

fn status_only(status: u16) -> http::Response<BenchBody> {
    let mut resp = http::Response::new(full(Bytes::new()));
    *resp.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::OK);
    resp
}

/// The minimal proxy's legacy SSE side, the least that transport takes: `GET /sse` opens a
/// stream whose first event names `/messages?sid=N`; a `POST` there is answered 202 at once
/// and its call is spawned, its reply written to the session's stream as a `message` event.
#[derive(Clone, Default)]
struct MinimalSse {
    sessions: Arc<Mutex<HashMap<u64, mpsc::Sender<Bytes>>>>,
    next: Arc<AtomicU64>,
}

impl MinimalSse {
    async fn serve<F, Fut>(
        &self,
        req: Request<Incoming>,
        forward: &F,
        init_result: &Arc<Value>,
        required: Option<&Arc<Required>>,
    ) -> http::Response<BenchBody>
    where
        F: Fn(Value) -> Fut + Clone + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Value>> + Send + 'static,
    {
        if req.method() == http::Method::GET {
            let sid = self.next.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = mpsc::channel::<Bytes>(256);
            let first = format!("event: endpoint\ndata: /messages?sid={sid}\n\n");
            let _ = tx.try_send(Bytes::from(first));
            self.sessions.lock().unwrap().insert(sid, tx);
            let events = futures::stream::unfold(rx, |mut rx| async move {
                let b = rx.recv().await?;
                Some((Ok(hyper::body::Frame::data(b)), rx))
            });
            let mut resp = http::Response::new(http_body_util::StreamBody::new(events).boxed());
            resp.headers_mut().insert(
                "content-type",
                http::HeaderValue::from_static("text/event-stream"),
            );
            return resp;
        }
        let sid = req
            .uri()
            .query()
            .and_then(|q| q.strip_prefix("sid="))
            .and_then(|v| v.parse::<u64>().ok());
        let Some(tx) = sid.and_then(|sid| self.sessions.lock().unwrap().get(&sid).cloned()) else {
            return status_only(404);
        };
        let started = Instant::now();
        let Ok(body) = req.into_body().collect().await.map(|b| b.to_bytes()) else {
            return status_only(400);
        };
        let Ok(msg) = serde_json::from_slice::<Value>(&body) else {
            return status_only(400);
        };
        let event = |v: &Value| {
            let mut e = b"event: message\ndata: ".to_vec();
            let _ = serde_json::to_writer(&mut e, v);
            e.extend_from_slice(b"\n\n");
            Bytes::from(e)
        };
        match (
            msg.get("id").cloned(),
            msg.get("method").and_then(Value::as_str),
        ) {
            (None, _) => {}
            (Some(id), Some("initialize")) => {
                let v = json!({"jsonrpc":"2.0","id":id,"result":(**init_result).clone()});
                let _ = tx.send(event(&v)).await;
            }
            (Some(_), method) => {
                let about = match (required, method) {
                    (Some(_), Some("tools/call")) => Required::about(&msg).ok(),
                    _ => None,
                };
                let required = about.as_ref().and(required).cloned();
                let forward = forward.clone();
                tokio::spawn(async move {
                    let Ok(reply) = forward(msg).await else {
                        return;
                    };
                    if let (Some(r), Some(about)) = (&required, &about) {
                        if r.record(about, &reply, started).is_err() {
                            return;
                        }
                    }
                    let _ = tx.send(event(&reply)).await;
                });
            }
        }
        status_only(202)
    }
}

async fn minimal_proxy(
    required: Option<Arc<Required>>,
) -> Result<(SocketAddr, tokio::process::Child)> {
    let mut child = tokio::process::Command::new(GATEHOUSE_BIN)
        .arg("echo-upstream")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let stdout = child.stdout.take().context("stdout")?;
    let pending: MinimalPending = Arc::new(Mutex::new(HashMap::new()));
    let next = Arc::new(AtomicU64::new(1));
    let (lines_tx, mut lines_rx) = mpsc::unbounded_channel::<Vec<u8>>();
    let p2 = pending.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            let Some(id) = v.get("id").and_then(Value::as_u64) else {
                continue;
            };
            let waiter = p2.lock().unwrap().remove(&id);
            if let Some(tx) = waiter {
                let _ = tx.send(v);
            }
        }
    });
    tokio::spawn(async move {
        while let Some(line) = lines_rx.recv().await {
            if stdin.write_all(&line).await.is_err() || stdin.flush().await.is_err() {
                break;
            }
        }
    });
    // One request through the child: rewrite the id, wait for the reply, restore the id.
    let forward = {
        let (pending, next, lines_tx) = (pending.clone(), next.clone(), lines_tx.clone());
        move |mut msg: Value| {
            let (pending, next, lines_tx) = (pending.clone(), next.clone(), lines_tx.clone());
            async move {
                let original = msg.get_mut("id").map(Value::take).unwrap_or(Value::Null);
                let id = next.fetch_add(1, Ordering::Relaxed);
                msg["id"] = Value::from(id);
                let (tx, rx) = oneshot::channel();
                pending.lock().unwrap().insert(id, tx);
                let mut line = serde_json::to_vec(&msg)?;
                line.push(b'\n');
                lines_tx
                    .send(line)
                    .map_err(|_| anyhow!("child stdin gone"))?;
                let mut reply = rx.await.map_err(|_| anyhow!("child gone"))?;
                reply["id"] = original;
                anyhow::Ok(reply)
            }
        }
    };
    let init = forward(serde_json::from_slice::<Value>(&init_body("2025-06-18"))?).await?;
    let mut initialized = INITIALIZED.as_bytes().to_vec();
    initialized.push(b'\n');
    lines_tx
        .send(initialized)
        .map_err(|_| anyhow!("child stdin gone"))?;
    let init_result = Arc::new(init.get("result").cloned().context("initialize result")?);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let sse = MinimalSse::default();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let (forward, init_result) = (forward.clone(), init_result.clone());
            let required = required.clone();
            let sse = sse.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (forward, init_result) = (forward.clone(), init_result.clone());
                    let required = required.clone();
                    let sse = sse.clone();
                    async move {
                        if let Some(status) = required.as_ref().and_then(|r| r.refuse(&req)) {
                            return Ok::<_, std::convert::Infallible>(status_only(status));
                        }
                        if req.uri().path() == "/sse" || req.uri().path() == "/messages" {
                            let resp = sse
                                .serve(req, &forward, &init_result, required.as_ref())
                                .await;
                            return Ok(resp);
                        }
                        let reply = async {
                            let started = Instant::now();
                            let body = req.into_body().collect().await?.to_bytes();
                            let msg: Value = serde_json::from_slice(&body)?;
                            let id = msg.get("id").cloned();
                            let method = msg.get("method").and_then(Value::as_str);
                            anyhow::Ok(match (id, method) {
                                (None, _) => None,
                                (Some(id), Some("initialize")) => Some(
                                    json!({"jsonrpc":"2.0","id":id,"result":(*init_result).clone()}),
                                ),
                                (Some(_), Some("tools/call")) if required.is_some() => {
                                    let about = Required::about(&msg)?;
                                    let reply = forward(msg).await?;
                                    if let Some(r) = &required {
                                        r.record(&about, &reply, started)?;
                                    }
                                    Some(reply)
                                }
                                _ => Some(forward(msg).await?),
                            })
                        }
                        .await;
                        let resp = match reply {
                            Ok(Some(v)) => http::Response::builder()
                                .header("content-type", "application/json")
                                .body(full(Bytes::from(
                                    serde_json::to_vec(&v).unwrap_or_default(),
                                ))),
                            Ok(None) => http::Response::builder()
                                .status(202)
                                .body(full(Bytes::new())),
                            Err(e) => http::Response::builder()
                                .status(500)
                                .body(full(Bytes::from(e.to_string()))),
                        };
                        Ok::<_, std::convert::Infallible>(resp.unwrap())
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Ok((addr, child))
}

// ------------------------------------------------------------------------------------------
// The stdio upstream, called directly
// ------------------------------------------------------------------------------------------

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<String>>>>;

#[derive(Clone)]
struct StdioMux {
    tx: mpsc::UnboundedSender<(u64, oneshot::Sender<String>)>,
}

impl StdioMux {
    async fn spawn() -> Result<(StdioMux, tokio::process::Child)> {
        let mut child = tokio::process::Command::new(GATEHOUSE_BIN)
            .arg("echo-upstream")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut stdin = child.stdin.take().context("stdin")?;
        let stdout = child.stdout.take().context("stdout")?;
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let (tx, mut rx) = mpsc::unbounded_channel::<(u64, oneshot::Sender<String>)>();
        let p2 = pending.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let id = serde_json::from_str::<Value>(&line)
                    .ok()
                    .and_then(|v| v.get("id").and_then(Value::as_u64));
                if let Some(id) = id {
                    if let Some(tx) = p2.lock().unwrap().remove(&id) {
                        let _ = tx.send(line);
                    }
                }
            }
        });
        tokio::spawn(async move {
            let mut buf = Vec::new();
            while let Some((id, done)) = rx.recv().await {
                let mut batch = vec![(id, done)];
                while let Ok(j) = rx.try_recv() {
                    batch.push(j);
                }
                buf.clear();
                for (id, done) in batch {
                    let msg = if id == 0 {
                        String::from_utf8_lossy(&init_body("2025-06-18")).into_owned()
                    } else {
                        String::from_utf8_lossy(&call_body(id, "echo", None)).into_owned()
                    };
                    pending.lock().unwrap().insert(id, done);
                    buf.extend_from_slice(msg.as_bytes());
                    buf.push(b'\n');
                    if id == 0 {
                        buf.extend_from_slice(INITIALIZED.as_bytes());
                        buf.push(b'\n');
                    }
                }
                if stdin.write_all(&buf).await.is_err() || stdin.flush().await.is_err() {
                    break;
                }
            }
        });
        let m = StdioMux { tx };
        m.call(0).await?;
        Ok((m, child))
    }

    async fn call(&self, id: u64) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send((id, tx))
            .map_err(|_| anyhow!("stdio writer gone"))?;
        let line = rx.await.map_err(|_| anyhow!("stdio reply lost"))?;
        if line.contains("\"error\"") {
            bail!("stdio error: {line}");
        }
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------
// Memory
// ------------------------------------------------------------------------------------------

/// Field `nth` (whitespace-separated) of the line of `/proc/self/<file>` that starts with `key`.
fn proc_self_field(file: &str, key: &str, nth: usize) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/self/{file}"))
        .ok()?
        .lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(nth)?
        .parse()
        .ok()
}

fn rss_kib() -> u64 {
    proc_self_field("status", "VmRSS:", 1).unwrap_or(0)
}

// ------------------------------------------------------------------------------------------
// Report
// ------------------------------------------------------------------------------------------

#[derive(Default)]
struct Report {
    md: String,
    verdicts: Vec<String>,
}

impl Report {
    fn line(&mut self, s: &str) {
        println!("{s}");
        self.md.push_str(s);
        self.md.push('\n');
    }

    fn verdict(&mut self, what: &str, ok: bool, detail: String) {
        let v = format!(
            "| {what} | {detail} | {} |",
            if ok { "met" } else { "**missed**" }
        );
        self.verdicts.push(v);
    }

    /// Target: `s` sustains at least `share` of `base`'s calls/s. `context`, if any, follows
    /// the figure.
    fn throughput_verdict(
        &mut self,
        what: &str,
        s: &Stats,
        base: &Stats,
        share: f64,
        context: Option<String>,
    ) {
        let mut detail = format!(
            "{:.0}% ({:.0} vs {:.0})",
            100.0 * s.rps / base.rps,
            s.rps,
            base.rps
        );
        if let Some(c) = context {
            detail = format!("{detail}; {c}");
        }
        self.verdict(what, s.rps >= share * base.rps, detail);
    }

    /// Target: `s` adds at most `max_us` to `base`'s p50. `context`, if any, follows the figure.
    fn latency_verdict(
        &mut self,
        what: &str,
        s: &Stats,
        base: &Stats,
        max_us: f64,
        context: Option<String>,
    ) {
        let d = s.p50_us - base.p50_us;
        let mut detail = format!("{d:+.0} µs ({:.0} vs {:.0})", s.p50_us, base.p50_us);
        if let Some(c) = context {
            detail = format!("{detail}; {c}");
        }
        self.verdict(what, d <= max_us, detail);
    }
}

/// How a target stood against the baseline round by round (each round measures the baseline,
/// then the target, back to back): the range of its calls/s share, or of its p50 over the
/// baseline's when `latency`. A verdict on the medians alone hides how often a round met the
/// line; `None` with fewer than two rounds.
fn round_spread(runs: &[Stats], base: &[Stats], latency: bool) -> Option<String> {
    let per_round: Vec<f64> = runs
        .iter()
        .zip(base)
        .map(|(s, b)| {
            if latency {
                s.p50_us - b.p50_us
            } else {
                100.0 * s.rps / b.rps
            }
        })
        .collect();
    if per_round.len() < 2 {
        return None;
    }
    let lo = per_round.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = per_round.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some(if latency {
        format!("rounds {lo:+.0} to {hi:+.0} µs")
    } else {
        format!("rounds {lo:.0}-{hi:.0}%")
    })
}

/// Each figure's median over `runs` (errors summed); `None` for no runs.
fn median(runs: &[Stats]) -> Option<Stats> {
    let mid = |f: fn(&Stats) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    Some(Stats {
        rps: mid(|s| s.rps)?,
        p50_us: mid(|s| s.p50_us)?,
        p99_us: mid(|s| s.p99_us)?,
        errors: runs.iter().map(|s| s.errors).sum(),
        cpu_us: mid(|s| s.cpu_us)?,
    })
}

fn row(r: &mut Report, name: &str, c: usize, s: &Stats, base: Option<&Stats>) {
    let ratio = base
        .map(|b| format!("{:.0}%", 100.0 * s.rps / b.rps))
        .unwrap_or_else(|| "—".into());
    let dp50 = base
        .map(|b| format!("{:+.0}", s.p50_us - b.p50_us))
        .unwrap_or_else(|| "—".into());
    r.line(&format!(
        "| {name} | {c} | {:.0} | {:.0} | {:.0} | {ratio} | {dp50} | {:.1} | {} |",
        s.rps, s.p50_us, s.p99_us, s.cpu_us, s.errors
    ));
}

const TABLE_HEAD: &str = "| target | clients | calls/s | p50 µs | p99 µs | vs baseline (calls/s) | Δp50 µs vs baseline | server CPU µs/call | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|";

// ------------------------------------------------------------------------------------------
// Sections
// ------------------------------------------------------------------------------------------

fn transports(r: &mut Report, o: &Opts, srv: &Runtime, cli: &Runtime) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = srv.block_on(async { Gateway::new(gateway_config(dir.path())) })?;
    let reg = srv.block_on(gw.register(RegistrationSpec::new("bench").with_tool(echo_tool())))?;
    let addr = gw.local_addr().context("no listener")?;
    let id = reg.id().to_string();
    let token = Some(reg.token().to_string());
    let mcp = format!("/gw/{id}/mcp");
    let streamable = Target::Streamable {
        addr,
        path: mcp.clone(),
        token: token.clone(),
        tool: "echo".into(),
        version: "2025-06-18",
    };
    // The canned reply is what the gateway answers to the same request.
    let canned = cli.block_on(async {
        let mut c = open(&streamable).await?;
        let Conn::Streamable {
            s,
            addr,
            path,
            token,
            session,
            ..
        } = &mut c
        else {
            bail!("unreachable")
        };
        let mut b = auth(post(*addr, path, Bytes::new()), token)
            .header("mcp-protocol-version", "2025-06-18");
        if let Some(sid) = session {
            b = b.header("mcp-session-id", sid.as_str());
        }
        let (_, _, body) = roundtrip(s, b.body(Full::new(call_body(1, "echo", None)))?).await?;
        Ok(body)
    })?;
    let ceiling_addr = srv.block_on(bare_server(canned.clone()))?;
    let ceiling = Target::Ceiling {
        addr: ceiling_addr,
        body: canned,
    };
    let targets = [
        (
            "gateway legacy SSE",
            Target::Sse {
                addr,
                sse_path: format!("/gw/{id}/sse"),
                token: token.clone(),
                tool: "echo".into(),
            },
        ),
        ("gateway Streamable HTTP (JSON)", streamable),
        (
            "gateway stateless 2026-07-28",
            Target::Stateless {
                addr,
                path: mcp,
                token: reg.token().to_string(),
                tool: "echo".into(),
            },
        ),
    ];
    r.line("\n### Transports: `tools/call` to an in-process echo tool, audit on\n");
    r.line(TABLE_HEAD);
    for &c in &o.concurrency {
        let base = cli.block_on(load(&ceiling, c, o))?;
        row(r, "ceiling: bare hyper, canned reply", c, &base, None);
        for (name, t) in &targets {
            let s = cli.block_on(load(t, c, o))?;
            row(r, name, c, &s, Some(&base));
            if c == 64 {
                let what = format!("{name}: ≥ 60% of ceiling calls/s at 64 clients");
                r.throughput_verdict(&what, &s, &base, 0.6, None);
            }
            if c == 1 {
                let what = format!("{name}: ≤ 50 µs p50 over ceiling at 1 client");
                r.latency_verdict(&what, &s, &base, 50.0, None);
            }
        }
    }
    let lines = std::fs::read_to_string(dir.path().join("audit.jsonl"))
        .map(|s| s.lines().count())
        .unwrap_or(0);
    r.line(&format!(
        "\nAudit records written during this section: {lines} (fsync policy `interval`, 1000 ms)."
    ));
    srv.block_on(async {
        reg.release().await;
        gw.shutdown().await;
    });
    Ok(())
}

/// The bench's gateway (`gateway_config`) with one upstream, `echo`: `gatehouse echo-upstream`.
fn echo_gateway(srv: &Runtime, dir: &std::path::Path) -> Result<Gateway> {
    echo_gateway_with(srv, dir, Vec::new())
}

/// [`echo_gateway`] with more upstreams after `echo`.
fn echo_gateway_with(
    srv: &Runtime,
    dir: &std::path::Path,
    more: Vec<UpstreamConfig>,
) -> Result<Gateway> {
    let mut cfg = gateway_config(dir);
    let up: UpstreamConfig = serde_json::from_value(json!({
        "id": "echo", "command": GATEHOUSE_BIN, "args": ["echo-upstream"]
    }))?;
    cfg.upstreams.push(up);
    cfg.upstreams.extend(more);
    Ok(srv.block_on(async { Gateway::new(cfg) })?)
}

fn proxy(r: &mut Report, o: &Opts, srv: &Runtime, cli: &Runtime) -> Result<()> {
    let dir = tempfile::tempdir()?;
    // Issue 46: the gateway in front of a Streamable HTTP upstream over http and over https,
    // only when `--targets` names those rows (`upstream_http`; bench/callgrind_tls.sh).
    let http_upstreams = match upstream_http::wanted(&o.targets) {
        (false, false) => None,
        which => {
            let rt = upstream_http::upstream_runtime()?;
            let ups = upstream_http::start(&rt, dir.path(), which)?;
            Some((rt, ups))
        }
    };
    let more = http_upstreams
        .iter()
        .flat_map(|(_, ups)| ups.iter().map(|(_, up)| up.clone()))
        .collect();
    let gw = echo_gateway_with(srv, dir.path(), more)?;
    let reg = srv.block_on(gw.register(RegistrationSpec::new("bench").grant("echo.echo")))?;
    let addr = gw.local_addr().context("no listener")?;
    let id = reg.id().to_string();
    let token = Some(reg.token().to_string());
    // One registration per HTTP upstream (`plain.echo`, `https.echo`), each its row.
    let mut http_regs = Vec::new();
    let mut http_targets = Vec::new();
    if let Some((_, ups)) = &http_upstreams {
        for (row, up) in ups {
            let tool = format!("{}.echo", up.id);
            let reg = srv.block_on(gw.register(RegistrationSpec::new("bench").grant(&tool)))?;
            http_targets.push((
                row.to_string(),
                Target::Streamable {
                    addr,
                    path: format!("/gw/{}/mcp", reg.id()),
                    token: Some(reg.token().to_string()),
                    tool,
                    version: "2025-06-18",
                },
            ));
            http_regs.push(reg);
        }
    }
    let (mux, _child) = srv.block_on(StdioMux::spawn())?;
    let direct = Target::Stdio(mux);
    let mut targets: Vec<(String, Target)> = vec![
        (
            "gateway → stdio, Streamable HTTP".into(),
            Target::Streamable {
                addr,
                path: format!("/gw/{id}/mcp"),
                token: token.clone(),
                tool: "echo.echo".into(),
                version: "2025-06-18",
            },
        ),
        (
            "gateway → stdio, legacy SSE".into(),
            Target::Sse {
                addr,
                sse_path: format!("/gw/{id}/sse"),
                token,
                tool: "echo.echo".into(),
            },
        ),
    ];
    targets.extend(http_targets);
    targets.extend(o.external.iter().cloned());
    // The section's ceiling: a minimal HTTP -> stdio proxy in front of its own child.
    let (min_addr, _min_child) = srv.block_on(minimal_proxy(None))?;
    let minimal = Target::Streamable {
        addr: min_addr,
        path: "/mcp".into(),
        token: None,
        tool: "echo".into(),
        version: "2025-06-18",
    };
    // The same proxy doing only what any gateway must do per call (`Required`).
    let required_token = "bench-required-work-token";
    let required = Arc::new(Required::new(
        required_token,
        &dir.path().join("required-audit.jsonl"),
    )?);
    let (req_addr, _req_child) = srv.block_on(minimal_proxy(Some(required)))?;
    let minimal_required = Target::Streamable {
        addr: req_addr,
        path: "/mcp".into(),
        token: Some(required_token.into()),
        tool: "echo".into(),
        version: "2025-06-18",
    };
    // The same two proxies, spoken to over legacy SSE: what that transport itself costs.
    let minimal_sse = Target::Sse {
        addr: min_addr,
        sse_path: "/sse".into(),
        token: None,
        tool: "echo".into(),
    };
    let minimal_required_sse = Target::Sse {
        addr: req_addr,
        sse_path: "/sse".into(),
        token: Some(required_token.into()),
        tool: "echo".into(),
    };
    const MINIMAL: &str = "ceiling: minimal HTTP→stdio proxy (Streamable HTTP)";
    const MINIMAL_SSE: &str =
        "minimal proxy over legacy SSE (POST answered 202, the call spawned, its reply an event)";
    const REQUIRED_SSE: &str = "minimal proxy over legacy SSE + the required work";
    const REQUIRED: &str =
        "minimal proxy + the required work (token, Host, hash-chained audit line written per call)";
    const DIRECT: &str = "for scale: upstream alone (stdio, multiplexed)";
    const BARE: &str = "for scale: bare hyper, canned reply (no upstream)";
    // What any HTTP front end can reach here: a bare hyper server with a canned tool result.
    let canned = Bytes::from(
        json!({"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"x"}],"isError":false}})
            .to_string(),
    );
    let ceiling = Target::Ceiling {
        addr: srv.block_on(bare_server(canned.clone()))?,
        body: canned,
    };
    let wanted = |name: &str| {
        let name = name.to_lowercase();
        o.targets.is_empty() || o.targets.iter().any(|t| name.contains(t.as_str()))
    };
    r.line("\n### Proxy overhead: the stdio echo upstream (`gatehouse echo-upstream`) behind each proxy, against a minimal proxy\n");
    r.line("The baseline of this section is a minimal HTTP→stdio proxy built into the bench (hyper, one shared `gatehouse echo-upstream` child, ids rewritten from an atomic counter, a pending map, the body parsed into a `Value` and the reply re-encoded; no auth, no audit, no sessions). Every row's ratio is to it. The gateway runs with audit on (fsync `interval`), token and Host/Origin checks on. The row \"minimal proxy + the required work\" is that proxy doing, the cheapest way, only what any gateway must do per call and the minimal proxy does not: the bearer token checked (SHA-256, constant time), the Host header checked, and one hash-chained audit line (the record's fields, an argument digest, the previous line's hash) written with one `write` before the reply; its ratio is the most a gateway with those duties can reach on this machine. The two rows \"minimal proxy over legacy SSE\" are the same two proxies spoken to over the legacy transport, done the least way (`GET /sse` opens the stream, a `POST /messages?sid=N` is answered 202 at once and its call spawned, the reply written to the stream as a `message` event): what that transport costs by itself, the ceiling of the gateway's SSE row. The baseline, these rows and the gateway's are measured `--rounds` times (3 here unless stated), alternating, and each figure is the median of its rounds; the other rows run once.\n");
    r.line(TABLE_HEAD);
    let gateway_row = |name: &str| name.starts_with("gateway");
    for &c in &o.concurrency {
        // The baseline, the floors and the gateway's rows, `rounds` times, alternating (this
        // VM's run-to-run spread is larger than most differences between them).
        // (row, target, how a verdict names it)
        let floors = [
            (REQUIRED, &minimal_required, "with the required work"),
            (MINIMAL_SSE, &minimal_sse, "the minimal proxy over SSE"),
            (
                REQUIRED_SSE,
                &minimal_required_sse,
                "over SSE with the required work",
            ),
        ];
        let mut base_runs = Vec::new();
        let mut floor_runs: Vec<Vec<Stats>> = vec![Vec::new(); floors.len()];
        let mut gw_runs: Vec<Result<Vec<Stats>, String>> = vec![Ok(Vec::new()); targets.len()];
        for _ in 0..o.rounds.max(1) {
            if wanted(MINIMAL) {
                base_runs.push(cli.block_on(load(&minimal, c, o))?);
            }
            for (i, (name, t, _)) in floors.iter().enumerate() {
                if wanted(name) {
                    floor_runs[i].push(cli.block_on(load(t, c, o))?);
                }
            }
            for (i, (name, t)) in targets.iter().enumerate() {
                if !gateway_row(name) || !wanted(name) {
                    continue;
                }
                if let Ok(runs) = &mut gw_runs[i] {
                    match cli.block_on(load(t, c, o)) {
                        Ok(s) => runs.push(s),
                        Err(e) => gw_runs[i] = Err(format!("{e:#}")),
                    }
                }
            }
        }
        let base = median(&base_runs);
        if let Some(b) = &base {
            row(r, MINIMAL, c, b, None);
        }
        let mut floor: Vec<(&str, &str, Stats, Option<String>)> = Vec::new();
        for ((name, _, label), runs) in floors.iter().zip(&floor_runs) {
            if let Some(s) = median(runs) {
                row(r, name, c, &s, base.as_ref());
                let spread = round_spread(runs, &base_runs, c == 1);
                floor.push((name, label, s, spread));
            }
        }
        if wanted(DIRECT) {
            let s = cli.block_on(load(&direct, c, o))?;
            row(r, DIRECT, c, &s, base.as_ref());
        }
        if wanted(BARE) {
            let s = cli.block_on(load(&ceiling, c, o))?;
            row(r, BARE, c, &s, base.as_ref());
        }
        let mut seen: Vec<(String, Stats)> = Vec::new();
        for ((name, t), runs) in targets.iter().zip(&gw_runs) {
            if !wanted(name) {
                continue;
            }
            let measured = if gateway_row(name) {
                match runs {
                    Ok(runs) => median(runs).ok_or_else(|| "no run".to_string()),
                    Err(e) => Err(e.clone()),
                }
            } else {
                cli.block_on(load(t, c, o)).map_err(|e| format!("{e:#}"))
            };
            let s = match measured {
                Ok(s) => s,
                Err(e) => {
                    r.line(&format!("| {name} | {c} | failed: {e} | | | | | | |"));
                    continue;
                }
            };
            row(r, name, c, &s, base.as_ref());
            seen.push((name.clone(), s));
        }
        let Some(base) = base else { continue };
        let get = |prefix: &str| {
            seen.iter()
                .find(|(n, _)| n.starts_with(prefix))
                .map(|(_, s)| s)
        };
        let streamable = get("gateway → stdio, Streamable");
        let sse = get("gateway → stdio, legacy SSE");
        // The gateway row's own rounds against the baseline's, as "rounds a-b%".
        let spread_of = |prefix: &str, latency: bool| {
            targets
                .iter()
                .zip(&gw_runs)
                .find(|((n, _), _)| n.starts_with(prefix))
                .and_then(|(_, runs)| runs.as_ref().ok())
                .and_then(|runs| round_spread(runs, &base_runs, latency))
        };
        // What the minimal proxy reaches doing the required work (and over SSE), for context,
        // each with its own rounds' spread; the gateway row's spread first.
        let reach = |own: Option<String>, names: &[&str]| {
            let parts: Vec<String> = own
                .into_iter()
                .chain(floor.iter().filter(|(n, _, _, _)| names.contains(n)).map(
                    |(_, what, s, spread)| {
                        let share = if c == 1 {
                            format!("{what} {:+.0} µs", s.p50_us - base.p50_us)
                        } else {
                            format!("{what} {:.0}%", 100.0 * s.rps / base.rps)
                        };
                        match spread {
                            Some(sp) => format!("{share} ({sp})"),
                            None => share,
                        }
                    },
                ))
                .collect();
            (!parts.is_empty()).then(|| parts.join("; "))
        };
        let own = |latency| spread_of("gateway → stdio, Streamable", latency);
        match (c, streamable) {
            (64, Some(s)) => {
                r.throughput_verdict(
                    "proxy Streamable HTTP: ≥ 75% of the minimal proxy's calls/s at 64 clients",
                    s,
                    &base,
                    0.75,
                    reach(own(false), &[REQUIRED]),
                );
                if let Some(m) = get("Rust mcp-proxy") {
                    r.verdict(
                        "proxy Streamable HTTP: ≥ 2× the Rust mcp-proxy 0.6.0 at 64 clients",
                        s.rps >= 2.0 * m.rps,
                        format!("{:.2}× ({:.0} vs {:.0})", s.rps / m.rps, s.rps, m.rps),
                    );
                }
            }
            (8, Some(s)) => r.throughput_verdict(
                "proxy Streamable HTTP: ≥ 80% of the minimal proxy's calls/s at 8 clients",
                s,
                &base,
                0.8,
                reach(own(false), &[REQUIRED]),
            ),
            (1, Some(s)) => r.latency_verdict(
                "proxy Streamable HTTP: ≤ 20 µs p50 over the minimal proxy at 1 client",
                s,
                &base,
                20.0,
                reach(own(true), &[REQUIRED]),
            ),
            _ => {}
        }
        if let (64, Some(s)) = (c, sse) {
            r.throughput_verdict(
                "proxy legacy SSE: ≥ 65% of the minimal proxy's calls/s at 64 clients",
                s,
                &base,
                0.65,
                reach(
                    spread_of("gateway → stdio, legacy SSE", false),
                    &[MINIMAL_SSE, REQUIRED_SSE],
                ),
            );
        }
    }
    srv.block_on(async {
        reg.release().await;
        for reg in http_regs {
            reg.release().await;
        }
        gw.shutdown().await;
    });
    if let Some((rt, _)) = http_upstreams {
        rt.shutdown_timeout(Duration::from_secs(1));
    }
    Ok(())
}

/// One full registration cycle: register, connect (stateless), list, call, release.
async fn cycle(gw: &Gateway, sender: &mut Option<SendRequest<Full<Bytes>>>) -> Result<()> {
    served(gw, sender).await?.release().await;
    Ok(())
}

/// Register, connect (stateless), list, call: returns once the call's reply is read.
async fn served(
    gw: &Gateway,
    sender: &mut Option<SendRequest<Full<Bytes>>>,
) -> Result<gatehouse::Registration> {
    let reg = gw
        .register(RegistrationSpec::new("bench").with_tool(echo_tool()))
        .await?;
    let addr = gw.local_addr().context("no listener")?;
    if sender.as_ref().is_none_or(|s| s.is_closed()) {
        *sender = Some(connect(addr).await?);
    }
    let s = sender.as_mut().context("no connection")?;
    let path = format!("/gw/{}/mcp", reg.id());
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}
    });
    let list = Bytes::from(
        json!({"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":meta}}).to_string(),
    );
    let req = post(addr, &path, Bytes::new())
        .header("authorization", format!("Bearer {}", reg.token()))
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/list")
        .body(Full::new(list))?;
    let (st, _, b) = roundtrip(s, req).await?;
    check_reply(st, &b)?;
    let req = post(addr, &path, Bytes::new())
        .header("authorization", format!("Bearer {}", reg.token()))
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "echo")
        .body(Full::new(call_body(2, "echo", Some(meta))))?;
    let (st, _, b) = roundtrip(s, req).await?;
    check_reply(st, &b)?;
    Ok(reg)
}

fn scale(r: &mut Report, o: &Opts, srv: &Runtime) -> Result<()> {
    r.line("\n### Scale (gateway and client in one process, 2 server threads)\n");
    // First registration to first served request, each time in a fresh gateway (one sample is
    // at the mercy of the machine: report the median and the worst of several).
    {
        let runs = if o.quick { 9 } else { 21 };
        let mut served_ms = Vec::with_capacity(runs);
        let mut release_ms = Vec::with_capacity(runs);
        for _ in 0..runs {
            let dir = tempfile::tempdir()?;
            let gw = srv.block_on(async { Gateway::new(gateway_config(dir.path())) })?;
            let t = Instant::now();
            let (ms, rel) = srv.block_on(async {
                let mut s = None;
                let reg = served(&gw, &mut s).await?;
                let ms = t.elapsed().as_secs_f64() * 1000.0;
                let t = Instant::now();
                reg.release().await;
                anyhow::Ok((ms, t.elapsed().as_secs_f64() * 1000.0))
            })?;
            served_ms.push(ms);
            release_ms.push(rel);
            srv.block_on(gw.shutdown());
        }
        served_ms.sort_by(f64::total_cmp);
        release_ms.sort_by(f64::total_cmp);
        let med = served_ms[runs / 2];
        let worst = served_ms[runs - 1];
        r.line(&format!(
            "- First registration → first served request, {runs} fresh gateways (register incl. starting the server and binding, connect, tools/list, tools/call reply read): median {med:.2} ms, best {:.2} ms, worst {worst:.2} ms; then its release (server stop, linger 0): median {:.2} ms",
            served_ms[0],
            release_ms[runs / 2]
        ));
        r.verdict(
            "first registration → first served request ≤ 5 ms",
            med <= 5.0,
            format!("median {med:.2} ms of {runs} fresh gateways (worst {worst:.2} ms)"),
        );
    }
    // Registrations per second through the full cycle, 8 concurrent harnesses.
    {
        let dir = tempfile::tempdir()?;
        let gw = srv.block_on(async { Gateway::new(gateway_config(dir.path())) })?;
        let dur = o.duration.max(Duration::from_secs(2));
        let (done, errs) = srv.block_on(async {
            let _ = gw.pin_server();
            let count = Arc::new(AtomicU64::new(0));
            let errs = Arc::new(AtomicU64::new(0));
            let deadline = Instant::now() + dur;
            let mut hs = Vec::new();
            for _ in 0..8 {
                let (gw, count, errs) = (gw.clone(), count.clone(), errs.clone());
                hs.push(tokio::spawn(async move {
                    let mut s = None;
                    while Instant::now() < deadline {
                        match cycle(&gw, &mut s).await {
                            Ok(()) => count.fetch_add(1, Ordering::Relaxed),
                            Err(_) => errs.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                }));
            }
            for h in hs {
                let _ = h.await;
            }
            (count.load(Ordering::Relaxed), errs.load(Ordering::Relaxed))
        });
        let rate = done as f64 / dur.as_secs_f64();
        r.line(&format!(
            "- Full registration cycles (register, list, call, release; 8 concurrent): {rate:.0}/s ({done} in {:.1} s, {errs} errors)",
            dur.as_secs_f64()
        ));
        r.verdict(
            "registration cycles ≥ 5,000/s on 2 cores",
            rate >= 5000.0,
            format!("{rate:.0}/s"),
        );
        srv.block_on(gw.shutdown());
    }
    // Sequential registrations: all served, RSS growth after the first 1,000.
    {
        let n: u64 = if o.quick { 10_000 } else { 100_000 };
        let dir = tempfile::tempdir()?;
        let gw = srv.block_on(async { Gateway::new(gateway_config(dir.path())) })?;
        let (rss1k, served, t) = srv.block_on(async {
            let _ = gw.pin_server();
            let mut s = None;
            let mut served = 0u64;
            let mut rss1k = 0;
            let t = Instant::now();
            for i in 0..n {
                if cycle(&gw, &mut s).await.is_ok() {
                    served += 1;
                }
                if i == 999 {
                    rss1k = rss_kib();
                }
            }
            (rss1k, served, t.elapsed())
        });
        let grow = rss_kib() as i64 - rss1k as i64;
        r.line(&format!(
            "- {n} sequential registrations: {served} served ({:.0}/s); RSS after 1,000: {} KiB, after {n}: {} KiB, growth {grow} KiB",
            n as f64 / t.as_secs_f64(),
            rss1k,
            rss_kib()
        ));
        r.verdict(
            &format!("{n} sequential registrations all served, RSS growth < 10 MB after 1,000"),
            served == n && grow < 10 * 1024,
            format!("{served}/{n} served, +{grow} KiB"),
        );
        srv.block_on(gw.shutdown());
    }
    Ok(())
}

fn idle(r: &mut Report, o: &Opts, srv: &Runtime) -> Result<()> {
    // Idle registrations and idle SSE sessions held at once. The sessions' client ends live
    // in a child process (this binary, `--idle-client`), so the RSS growth measured here is
    // the gateway's side only.
    let want: usize = if o.quick { 2_000 } else { 10_000 };
    let n = want.min(fd_limit().saturating_sub(1_000));
    let dir = tempfile::tempdir()?;
    let mut cfg = gateway_config(dir.path());
    // Both kinds of idle session are held at once.
    cfg.sessions.max_per_registration = 2 * n;
    cfg.sessions.max_sessions = cfg.sessions.max_sessions.max(2 * n);
    let gw = srv.block_on(async { Gateway::new(cfg) })?;
    // The harness's usual model: tools in the gateway catalog, granted by name.
    gw.add_tool(echo_tool());
    let (per_reg, per_sess, sessions, per_str, str_sessions) = srv.block_on(async {
        let _ = gw.pin_server();
        // One registration first: the server, the catalog and the allocator are warm.
        let first = gw
            .register(RegistrationSpec::new("idle").grant("echo"))
            .await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before = rss_kib();
        let mut regs = Vec::with_capacity(n);
        for _ in 0..n {
            regs.push(
                gw.register(RegistrationSpec::new("idle").grant("echo"))
                    .await?,
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after_regs = rss_kib();
        let addr = gw.local_addr().context("no listener")?;
        // Idle Streamable HTTP sessions (initialize + notifications/initialized, then nothing),
        // opened over one keep-alive connection and kept while the SSE sessions are measured.
        let mut s = connect(addr).await?;
        let path = format!("/gw/{}/mcp", first.id());
        let token = Some(first.token().to_string());
        for _ in 0..n {
            let req = auth(post(addr, &path, Bytes::new()), &token)
                .body(Full::new(init_body("2025-06-18")))?;
            let (st, h, _) = roundtrip(&mut s, req).await?;
            let sid = h
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
                .with_context(|| format!("initialize: {st}, no session id"))?;
            let req = auth(post(addr, &path, Bytes::new()), &token)
                .header("mcp-protocol-version", "2025-06-18")
                .header("mcp-session-id", sid)
                .body(Full::new(Bytes::from_static(INITIALIZED.as_bytes())))?;
            roundtrip(&mut s, req).await?;
        }
        drop(s);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after_streamable = rss_kib();
        let streamable_sessions = gatehouse::testing::sessions(&gw).len();
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .args(["--bench", "--idle-client"])
            .arg(addr.to_string())
            .arg(first.id())
            .arg(first.token())
            .arg(n.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut out = tokio::io::BufReader::new(child.stdout.take().context("stdout")?);
        let mut line = String::new();
        tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line).await?;
        if !line.starts_with("ready") {
            bail!("idle client: {line:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after_sess = rss_kib();
        let sessions = gatehouse::testing::sessions(&gw).len() - streamable_sessions;
        drop(child.stdin.take());
        let _ = child.wait().await;
        drop(regs);
        drop(first);
        anyhow::Ok((
            (after_regs.saturating_sub(before)) as f64 * 1024.0 / n as f64,
            (after_sess.saturating_sub(after_streamable)) as f64 * 1024.0 / sessions.max(1) as f64,
            sessions,
            (after_streamable.saturating_sub(after_regs)) as f64 * 1024.0
                / streamable_sessions.max(1) as f64,
            streamable_sessions,
        ))
    })?;
    r.line(&format!(
        "- {n} idle registrations (one catalog tool granted by name; the harness's `Registration` guards held in this process too): {:.2} KiB each",
        per_reg / 1024.0
    ));
    r.line(&format!(
        "- {sessions} idle legacy SSE sessions (stream open, endpoint event read; client ends in a child process, so this is the gateway's side alone): {:.2} KiB each",
        per_sess / 1024.0
    ));
    r.line(&format!(
        "- {str_sessions} idle Streamable HTTP sessions (initialized, no stream open; opened over one keep-alive connection): {:.2} KiB each",
        per_str / 1024.0
    ));
    r.verdict(
        "idle Streamable HTTP session ≤ 12 KiB",
        per_str <= 12.0 * 1024.0 && str_sessions == n,
        format!("{:.2} KiB ({str_sessions} sessions)", per_str / 1024.0),
    );
    let daemon = idle_daemon_rss_kib();
    r.line(&format!(
        "- Idle daemon (`gatehouse serve`, no upstream, no registration, 1 s after start): {}",
        daemon.as_ref().map_or_else(
            |e| format!("not measured: {e:#}"),
            |k| format!("{:.1} MB RSS", *k as f64 / 1024.0)
        )
    ));
    if let Ok(k) = daemon {
        r.verdict(
            "idle daemon ~10 MB RSS (≤ 12 MB)",
            k <= 12 * 1024,
            format!("{:.1} MB", k as f64 / 1024.0),
        );
    }
    r.verdict(
        "idle registration ≤ 4 KiB",
        per_reg <= 4096.0,
        format!("{:.2} KiB", per_reg / 1024.0),
    );
    r.verdict(
        "idle SSE session ≤ 16 KiB (gateway side)",
        per_sess <= 16384.0 && sessions == n,
        format!("{:.2} KiB ({sessions} sessions)", per_sess / 1024.0),
    );
    srv.block_on(gw.shutdown());
    Ok(())
}

/// RSS of an idle `gatehouse serve` (empty config, loopback listeners, audit in a temp dir).
fn idle_daemon_rss_kib() -> Result<u64> {
    let dir = tempfile::tempdir()?;
    let cfg = dir.path().join("gatehouse.toml");
    std::fs::write(&cfg, "")?;
    let mut child = std::process::Command::new(GATEHOUSE_BIN)
        .arg("serve")
        .arg("--config")
        .arg(&cfg)
        .env("GATEHOUSE_LISTEN", "127.0.0.1:0")
        .env("GATEHOUSE_ADMIN_LISTEN", "127.0.0.1:0")
        .env("GATEHOUSE_AUDIT_PATH", dir.path().join("audit.jsonl"))
        .env(
            "GATEHOUSE_ADMIN_TOKEN",
            "bench-admin-token-0123456789abcdef",
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    std::thread::sleep(Duration::from_secs(1));
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()));
    let _ = child.kill();
    let _ = child.wait();
    let status = status?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .context("no VmRSS (did the daemon exit?)")
}

/// `--idle-client ADDR ID TOKEN N`: opens N legacy SSE streams with plain blocking sockets,
/// reads each one's `endpoint` event, prints `ready N`, and holds them until stdin closes.
fn idle_client(args: &[String]) -> Result<()> {
    use std::io::{Read, Write};
    let [addr, id, token, n] = args else {
        bail!("usage: --idle-client ADDR ID TOKEN N");
    };
    let n: usize = n.parse()?;
    let mut held = Vec::with_capacity(n);
    let mut buf = vec![0u8; 4096];
    for i in 0..n {
        let mut s =
            std::net::TcpStream::connect(addr.as_str()).with_context(|| format!("connect #{i}"))?;
        // The request head in one write, as HTTP clients send it (`write!` on a bare socket
        // would send each formatted piece as its own segment).
        let head = format!(
            "GET /gw/{id}/sse HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\nAuthorization: Bearer {token}\r\n\r\n"
        );
        s.write_all(head.as_bytes())?;
        let mut got = Vec::new();
        loop {
            let k = s.read(&mut buf)?;
            if k == 0 {
                bail!("stream #{i} closed: {}", String::from_utf8_lossy(&got));
            }
            got.extend_from_slice(&buf[..k]);
            let text = String::from_utf8_lossy(&got);
            if let Some(at) = text.find("event: endpoint") {
                if text[at..].contains("\n\n") {
                    break;
                }
            }
            if !text.starts_with("HTTP/1.1 200") && text.contains("\r\n\r\n") {
                bail!("stream #{i}: {}", text.lines().next().unwrap_or(""));
            }
        }
        held.push(s);
    }
    println!("ready {}", held.len());
    std::io::stdout().flush()?;
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    Ok(())
}

fn fd_limit() -> usize {
    proc_self_field("limits", "Max open files", 3).map_or(1024, |n| n as usize)
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{cpu}, {cores} cores, {}, Linux {}",
        mem.split_whitespace().skip(1).collect::<Vec<_>>().join(" "),
        kernel.trim()
    )
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() -> Result<()> {
    // `cargo test --all-targets` runs this harness-less bench as a test binary without
    // `--bench`; the load run belongs to `cargo bench` / bench/run.sh, so leave at once.
    if !std::env::args().any(|a| a == "--bench") {
        println!("gateway bench: not run under cargo test; use `cargo bench --bench gateway` or bench/run.sh");
        return Ok(());
    }
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--idle-client") {
        return idle_client(&args[i + 1..]);
    }
    let o = opts();
    let srv = server_runtime();
    let cli = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("client")
        .on_thread_start(upstream_http::bench_role_client_thread)
        .enable_all()
        .build()?;
    let mut r = Report::default();
    let started = chrono::Utc::now();
    r.line("## Run\n");
    r.line(&format!(
        "- When: {}",
        started.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    ));
    r.line(&format!("- Machine: {}", machine()));
    r.line(&format!("- Load average at start: {}", loadavg()));
    r.line(&format!(
        "- Mode: {}; {} s measured per point after {} ms warm-up; clients {:?}; one keep-alive connection per client",
        if o.quick { "--quick" } else { "full" },
        o.duration.as_secs_f64(),
        o.warmup.as_millis(),
        o.concurrency
    ));
    r.line("- Gateway: embedded in the bench process on its own 2-thread runtime; load client on another 2-thread runtime (both share the machine's cores); audit on (fsync `interval`, 1000 ms), token check and Origin check on");
    let want = |s: &str| o.only.is_empty() || o.only.iter().any(|x| x == s);
    if want("transports") {
        transports(&mut r, &o, &srv, &cli)?;
    }
    if want("proxy") {
        proxy(&mut r, &o, &srv, &cli)?;
    }
    if want("scale") {
        scale(&mut r, &o, &srv)?;
    }
    if want("idle") {
        idle(&mut r, &o, &srv)?;
    }
    if want("console") {
        console::console(&mut r, &o, &srv, &cli)?;
    }
    if want("store") {
        store::store(&mut r, &o, &srv)?;
    }
    r.line(&format!("\n- Load average at end: {}", loadavg()));
    let mut md = String::new();
    let _ = writeln!(
        md,
        "\n### Targets\n\n| target | figure | verdict |\n|---|---|---|"
    );
    for v in &r.verdicts {
        let _ = writeln!(md, "{v}");
    }
    print!("{md}");
    r.md.push_str(&md);
    if let Some(path) = &o.out {
        std::fs::write(path, &r.md)?;
        eprintln!("wrote {path}");
    }
    srv.shutdown_timeout(Duration::from_secs(1));
    cli.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}
