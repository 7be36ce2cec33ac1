//! Test fixtures: a gateway on 127.0.0.1:0 with a temporary audit file, and a small raw
//! legacy-SSE client that shows every byte the gateway sends.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

#[cfg(feature = "cluster")]
pub mod cluster;
pub mod daemon;
pub mod mcp_remote;
pub mod nginx;
pub mod peers;
pub mod relay;
pub mod whoami;

use std::path::PathBuf;
use std::time::Duration;

use futures::StreamExt;
use gatehouse::testing::audit::{read_records, Record};
use gatehouse::{Config, Gateway, InProcessTool, ToolResult};
use serde_json::{json, Value};
use tokio::sync::mpsc;

pub struct TestGateway {
    pub gateway: Gateway,
    pub dir: tempfile::TempDir,
}

impl TestGateway {
    pub fn start() -> Self {
        Self::with(|_| {})
    }

    pub fn with(f: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::default();
        config.audit.path = dir.path().join("audit.jsonl");
        config.linger_ms = 0;
        f(&mut config);
        let gateway = Gateway::new(config).unwrap();
        TestGateway { gateway, dir }
    }

    pub fn audit_path(&self) -> PathBuf {
        gatehouse::testing::audit(&self.gateway)
            .path()
            .to_path_buf()
    }

    pub fn audit(&self) -> Vec<Record<'static>> {
        read_records(&self.audit_path()).unwrap()
    }

    pub fn calls(&self) -> Vec<Record<'static>> {
        self.audit()
            .into_iter()
            .filter(|r| r.event == "governed_mcp_call")
            .collect()
    }
}

/// An in-process tool that echoes `text` prefixed by `tag`.
pub fn echo_tool(name: &str, tag: &str) -> InProcessTool {
    let tag = tag.to_string();
    InProcessTool::new(
        name,
        "Echoes its text with a tag",
        json!({"type":"object","properties":{"text":{"type":"string"}}}),
        move |args, _ctx| {
            let tag = tag.clone();
            async move {
                let text = args.get("text").and_then(Value::as_str).unwrap_or("");
                Ok(ToolResult::text(format!("{tag}:{text}")))
            }
        },
    )
}

/// A tool that sleeps `ms` (sending progress), honouring cancellation.
pub fn slow_tool(name: &str) -> InProcessTool {
    InProcessTool::new(
        name,
        "Sleeps for ms milliseconds, reporting progress",
        json!({"type":"object","properties":{"ms":{"type":"integer"}}}),
        |args, ctx| async move {
            let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(1000);
            let steps = 10u64;
            for i in 1..=steps {
                tokio::select! {
                    _ = ctx.cancel.cancelled() => return Ok(ToolResult::text("cancelled")),
                    _ = tokio::time::sleep(Duration::from_millis(ms / steps)) => {}
                }
                ctx.progress(i as f64, Some(steps as f64), Some("working"))
                    .await;
            }
            Ok(ToolResult::text("done"))
        },
    )
}

/// The helpdesk demo upstream: the built gatehouse binary's `demo-upstream <extra>`, named by
/// its path (no environment variable is set to reach `@self`: `config_load` takes the
/// environment as an argument, and its unit tests resolve `@self` that way). `more_toml`:
/// further lines (`call_timeout_s = 10`, naming).
pub fn helpdesk(
    id: &str,
    sharing: &str,
    extra: &[&str],
    more_toml: &str,
) -> gatehouse::config::UpstreamConfig {
    let mut args = vec!["demo-upstream"];
    args.extend_from_slice(extra);
    let exe = env!("CARGO_BIN_EXE_gatehouse");
    toml::from_str(&format!(
        "id = {id:?}\ncommand = {exe:?}\nargs = {args:?}\nsharing = {sharing:?}\n{more_toml}\n"
    ))
    .unwrap()
}

/// `@modelcontextprotocol/server-everything` (tests/peers, stdio) as upstream `id`;
/// `more_toml`: further lines (naming, renames).
pub fn everything(
    id: &str,
    sharing: &str,
    timeout_s: u64,
    more_toml: &str,
) -> gatehouse::config::UpstreamConfig {
    let script = repo_root()
        .join("tests/peers/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        script.exists(),
        "run tests/peers/setup.sh first ({} missing)",
        script.display()
    );
    toml::from_str(&format!(
        "id = {id:?}\ncommand = \"node\"\nargs = [{:?}, \"stdio\"]\nsharing = {sharing:?}\ncall_timeout_s = {timeout_s}\n{more_toml}\n",
        script.display().to_string()
    ))
    .unwrap()
}

/// The fastmcp upstream that bursts notifications (tests/peers/burst_server.py, stdio, one
/// process per registration, `call_timeout_s = 60`) as upstream `burst`.
pub fn burst() -> gatehouse::config::UpstreamConfig {
    toml::from_str(&format!(
        "id = \"burst\"\ncommand = {:?}\nargs = [{:?}]\nsharing = \"per_registration\"\ncall_timeout_s = 60\n",
        peers::peer(".venv-fastmcp/bin/python").display().to_string(),
        peers::peer("burst_server.py").display().to_string()
    ))
    .unwrap()
}

/// tests/fixtures/faulty_server.py as a shared upstream (`call_timeout_s = timeout_s`).
pub fn faulty(id: &str, timeout_s: u64, more_toml: &str) -> gatehouse::config::UpstreamConfig {
    let script = format!(
        "{}/tests/fixtures/faulty_server.py",
        env!("CARGO_MANIFEST_DIR")
    );
    toml::from_str(&format!(
        "id = \"{id}\"\ncommand = \"python3\"\nargs = [{script:?}]\nsharing = \"shared\"\ncall_timeout_s = {timeout_s}\n{more_toml}\n"
    ))
    .unwrap()
}

pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// A raw legacy SSE client.
pub struct SseClient {
    pub base: String,
    pub token: String,
    pub endpoint: String,
    pub events: mpsc::UnboundedReceiver<(String, String)>,
    task: tokio::task::JoinHandle<()>,
    next_id: i64,
    pub http: reqwest::Client,
}

impl Drop for SseClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Splits an SSE byte stream into (event, data) pairs; comments are reported as ("comment", text).
pub fn spawn_sse_reader(
    resp: reqwest::Response,
) -> (
    mpsc::UnboundedReceiver<(String, String)>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut stream = resp.bytes_stream();
        let mut buf = String::new();
        while let Some(Ok(chunk)) = stream.next().await {
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(pos) = buf.find("\n\n") {
                let block: String = buf.drain(..pos + 2).collect();
                let mut event = "message".to_string();
                let mut data = Vec::new();
                let mut comment = None;
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
                    } else if let Some(v) = line.strip_prefix(':') {
                        comment = Some(v.trim().to_string());
                    }
                }
                if data.is_empty() {
                    if let Some(c) = comment {
                        let _ = tx.send(("comment".to_string(), c));
                    }
                    continue;
                }
                let _ = tx.send((event, data.join("\n")));
            }
        }
        let _ = tx.send(("closed".to_string(), String::new()));
    });
    (rx, task)
}

impl SseClient {
    pub async fn connect(sse_url: &str, token: &str) -> SseClient {
        let http = http();
        let resp = http
            .get(sse_url)
            .bearer_auth(token)
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "GET {sse_url}");
        assert_eq!(
            resp.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        let (mut events, task) = spawn_sse_reader(resp);
        let (ev, data) = tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(ev, "endpoint");
        assert!(
            data.starts_with("/gw/"),
            "endpoint is an absolute path: {data}"
        );
        let base = sse_url.split("/gw/").next().unwrap().to_string();
        SseClient {
            base,
            token: token.to_string(),
            endpoint: data,
            events,
            task,
            next_id: 0,
            http,
        }
    }

    pub fn post_url(&self) -> String {
        format!("{}{}", self.base, self.endpoint)
    }

    pub async fn post(&self, body: Value) -> reqwest::Response {
        self.http
            .post(self.post_url())
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// Next `message` event (skipping keep-alives), within `secs`.
    pub async fn next_message(&mut self, secs: u64) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        loop {
            let ev = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .ok()??;
            match ev.0.as_str() {
                "message" => return serde_json::from_str(&ev.1).ok(),
                "closed" => return None,
                _ => continue,
            }
        }
    }

    /// Sends a request and waits for its response (notifications before it are returned too).
    pub async fn request_with_notes(&mut self, method: &str, params: Value) -> (Value, Vec<Value>) {
        self.next_id += 1;
        let id = self.next_id;
        let resp = self
            .post(json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}))
            .await;
        assert_eq!(resp.status(), 202, "{method}");
        let mut notes = Vec::new();
        loop {
            let msg = self
                .next_message(20)
                .await
                .unwrap_or_else(|| panic!("no reply to {method}"));
            if msg.get("id") == Some(&json!(id)) {
                return (msg, notes);
            }
            notes.push(msg);
        }
    }

    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        self.request_with_notes(method, params).await.0
    }

    pub async fn notify(&self, method: &str, params: Value) {
        let resp = self
            .post(json!({"jsonrpc":"2.0","method":method,"params":params}))
            .await;
        assert_eq!(resp.status(), 202);
    }

    pub async fn initialize(&mut self) -> Value {
        self.initialize_with(json!({})).await
    }

    /// `initialize` declaring these client capabilities (e.g. `{"sampling": {}}`).
    pub async fn initialize_with(&mut self, capabilities: Value) -> Value {
        let r = self
            .request(
                "initialize",
                json!({"protocolVersion":"2024-11-05","capabilities":capabilities,"clientInfo":{"name":"test","version":"0"}}),
            )
            .await;
        self.notify("notifications/initialized", json!({})).await;
        r
    }

    pub async fn tool_names(&mut self) -> Vec<String> {
        let r = self.request("tools/list", json!({})).await;
        r["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    }

    pub async fn call(&mut self, tool: &str, args: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": args}))
            .await
    }
}

pub fn text_of(reply: &Value) -> String {
    reply["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// tests/peers/conformance_server.py (official Python SDK) serving Streamable HTTP on a free
/// loopback port; killed on drop. Fails (never skips) when the peers are not installed.
pub struct PythonHttpUpstream {
    _child: tokio::process::Child,
    pub url: String,
}

pub async fn python_http_upstream() -> PythonHttpUpstream {
    let py = repo_root().join("tests/peers/.venv/bin/python");
    assert!(
        py.exists(),
        "tests/peers/.venv is missing: run `bash tests/peers/setup.sh` (or `bash tests/run.sh`)"
    );
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let child = tokio::process::Command::new(py)
        .arg(repo_root().join("tests/peers/conformance_server.py"))
        .args(["streamable-http", "--port", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "conformance_server.py did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    PythonHttpUpstream {
        _child: child,
        url: format!("http://127.0.0.1:{port}/mcp"),
    }
}

/// Reads a starting `gatehouse serve`'s output lines from `rx` until `gatehouse: ready`
/// (30 s at most) and returns the data and admin listener URLs it printed.
pub fn wait_daemon_ready(rx: &std::sync::mpsc::Receiver<String>) -> (String, String) {
    let (mut data, mut admin) = (None, None);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            .expect("daemon did not get ready");
        if let Some(u) = line.strip_prefix("gatehouse: data listener on ") {
            data = Some(u.to_string());
        }
        if let Some(u) = line.strip_prefix("gatehouse: admin listener on ") {
            admin = Some(u.to_string());
        }
        if line == "gatehouse: ready" {
            break;
        }
    }
    (
        data.expect("no data listener line"),
        admin.expect("no admin listener line"),
    )
}

/// One stateless (2026-07-28) request: the revision's `_meta` in `params`, its headers
/// (`MCP-Method`, and `MCP-Name` from `params.name` or `params.uri`); the JSON reply.
pub async fn stateless(url: &str, token: &str, id: u64, method: &str, params: Value) -> Value {
    let mut params = params;
    params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}});
    let mut b = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", method);
    if let Some(n) = params.get("name").or_else(|| params.get("uri")) {
        b = b.header("mcp-name", n.as_str().unwrap().to_string());
    }
    let r = b
        .json(&json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}))
        .send()
        .await
        .unwrap();
    r.json::<Value>().await.unwrap()
}
