//! mcp-remote (tests/peers/node_modules/mcp-remote, the stdio ↔ remote bridge desktop
//! clients use) driven over its stdin/stdout: the test is the stdio client. It waits for
//! each request's answer before it writes the next one (mcp-remote forwards each line as it
//! comes; a request written before initialize's answer can reach the gateway before the
//! session exists), and it answers the server → client requests mcp-remote writes to its
//! stdout (sampling, elicitation, roots) like a client with those callbacks would.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// What the stdio client answers to a server → client request (None: -32601, as a client
/// without that callback).
#[derive(Default, Clone)]
pub struct Answers {
    pub sampling: Option<String>,
    pub elicit: Option<Value>,
    pub roots: Option<Vec<Value>>,
}

pub struct McpRemote {
    child: Child,
    input: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    next_id: i64,
    pub answers: Answers,
    /// Every notification and server request read so far, in arrival order.
    pub seen: Vec<Value>,
    home: tempfile::TempDir,
}

pub fn proxy_js() -> PathBuf {
    let p = super::repo_root().join("tests/peers/node_modules/mcp-remote/dist/proxy.js");
    assert!(
        p.exists(),
        "{} is missing: run tests/peers/setup.sh",
        p.display()
    );
    p
}

impl McpRemote {
    /// `node proxy.js URL --header "Authorization:Bearer T" EXTRA…` (e.g. `--transport
    /// http-only`, `--protocol auto`), its OAuth state in a fresh $HOME, stderr to a file.
    pub fn start(url: &str, token: &str, extra: &[&str]) -> Self {
        let home = tempfile::tempdir().unwrap();
        let stderr = std::fs::File::create(home.path().join("stderr.log")).unwrap();
        let mut child = tokio::process::Command::new("node")
            .arg(proxy_js())
            .arg(url)
            .args(extra)
            .args(["--header", &format!("Authorization:Bearer {token}")])
            .env("HOME", home.path())
            .env("MCP_REMOTE_CONFIG_DIR", home.path().join(".mcp-auth"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true)
            .spawn()
            .expect("node runs mcp-remote");
        let input = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        McpRemote {
            child,
            input,
            lines,
            next_id: 1,
            answers: Answers::default(),
            seen: Vec::new(),
            home,
        }
    }

    /// What mcp-remote wrote on stderr so far (for failure messages).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.home.path().join("stderr.log")).unwrap_or_default()
    }

    async fn write(&mut self, msg: &Value) {
        let line = format!("{msg}\n");
        self.input.write_all(line.as_bytes()).await.unwrap();
    }

    pub async fn notify(&mut self, method: &str, params: Value) {
        let mut m = json!({"jsonrpc": "2.0", "method": method});
        if !params.is_null() {
            m["params"] = params;
        }
        self.write(&m).await;
    }

    /// `initialize` with these client capabilities, its answer awaited, then `initialized`.
    pub async fn initialize(&mut self, capabilities: Value, secs: u64) -> Value {
        let r = self
            .request(
                "initialize",
                json!({"protocolVersion": "2025-06-18", "capabilities": capabilities,
                       "clientInfo": {"name": "gatehouse-test", "version": "1"}}),
                secs,
            )
            .await;
        assert!(
            r["result"]["protocolVersion"].is_string(),
            "initialize through mcp-remote: {r}\n{}",
            self.stderr()
        );
        self.notify("notifications/initialized", Value::Null).await;
        r
    }

    /// One request; reads (answering server requests, keeping notifications in `seen`)
    /// until its answer. Panics after `secs` with what mcp-remote said.
    pub async fn request(&mut self, method: &str, params: Value, secs: u64) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.write(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        match self
            .read_until(deadline, |v| v["id"] == id && v.get("method").is_none())
            .await
        {
            Some(v) => v,
            None => panic!(
                "no answer to {method} through mcp-remote within {secs} s; seen {} messages\n{}",
                self.seen.len(),
                self.stderr()
            ),
        }
    }

    /// Reads until a message matching `pred` (returned; notifications and server requests
    /// go to `seen` too) or the deadline (None).
    pub async fn read_until(
        &mut self,
        deadline: tokio::time::Instant,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Option<Value> {
        loop {
            let line = tokio::time::timeout_at(deadline, self.lines.next_line())
                .await
                .ok()?
                .ok()??;
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if v.get("method").is_some() {
                self.seen.push(v.clone());
                if v.get("id").is_some() {
                    let answer = self.answer(&v);
                    self.write(&answer).await;
                }
            }
            if pred(&v) {
                return Some(v);
            }
        }
    }

    /// Reads for `secs` (answering server requests); everything goes to `seen`.
    pub async fn idle(&mut self, secs: f64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(secs);
        let _ = self.read_until(deadline, |_| false).await;
    }

    fn answer(&self, req: &Value) -> Value {
        let id = req["id"].clone();
        let result = match req["method"].as_str() {
            Some("sampling/createMessage") => self.answers.sampling.as_ref().map(|t| {
                json!({"role": "assistant", "content": {"type": "text", "text": t},
                       "model": "gatehouse-test-model", "stopReason": "endTurn"})
            }),
            Some("elicitation/create") => self
                .answers
                .elicit
                .as_ref()
                .map(|c| json!({"action": "accept", "content": c})),
            Some("roots/list") => self.answers.roots.as_ref().map(|r| json!({"roots": r})),
            Some("ping") => Some(json!({})),
            _ => None,
        };
        match result {
            Some(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
            None => json!({"jsonrpc": "2.0", "id": id,
                           "error": {"code": -32601, "message": "not supported by this client"}}),
        }
    }

    /// The server requests seen so far, by method, in order.
    pub fn asked(&self) -> Vec<String> {
        self.seen
            .iter()
            .filter(|m| m.get("id").is_some())
            .filter_map(|m| m["method"].as_str().map(String::from))
            .collect()
    }

    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
