//! Registrations that outlive the process (issue 35), on the real binary: `gatehouse serve`
//! with its default `sqlite` store, killed with -9 or stopped with SIGTERM, then started
//! again on the same file and port. The same URL and token serve after the client
//! initializes again; released and expired registrations stay gone; `max_calls` holds
//! across restarts; the file holds no token and is owner-only; a file the daemon cannot
//! read stops the start and is left as it is; SIGHUP reloads and never kills.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::peers::python;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use gatehouse::testing::audit::{read_records, Record};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

const HELPDESK: &str = "[[upstreams]]\nid = \"helpdesk\"\ncommand = \"@self\"\nargs = [\"demo-upstream\"]\nsharing = \"leased\"\n";

/// A directory with a config (a fixed data port, so URLs stay the same across restarts),
/// an audit log and the store beside it.
struct Site {
    dir: tempfile::TempDir,
    port: u16,
}

impl Site {
    fn new(extra: &str) -> Site {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let site = Site { dir, port };
        site.write_config(extra);
        site
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("gatehouse.toml")
    }

    fn write_config(&self, extra: &str) {
        std::fs::write(
            self.config(),
            format!(
                "listen = \"127.0.0.1:{}\"\nadmin_listen = \"127.0.0.1:0\"\nadmin_token_file = {:?}\nshutdown_grace_s = 5\n{extra}\n[audit]\npath = {:?}\nfsync = \"always\"\n",
                self.port,
                self.dir.path().join("admin.token").display().to_string(),
                self.audit_path().display().to_string(),
            ),
        )
        .unwrap();
    }

    fn audit_path(&self) -> PathBuf {
        self.dir.path().join("audit.jsonl")
    }

    /// The default store: beside the audit log.
    fn store_path(&self) -> PathBuf {
        self.dir.path().join("store.sqlite")
    }

    fn audit(&self) -> Vec<Record<'static>> {
        read_records(&self.audit_path()).unwrap()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = common::daemon::serve_command(&self.config(), "info");
        cmd.args(args);
        cmd
    }

    fn start(&self) -> Daemon {
        self.start_with(&[])
    }

    fn start_with(&self, args: &[&str]) -> Daemon {
        let (child, output, data, admin) = common::daemon::spawn_ready(self.command(args));
        assert_eq!(data, format!("http://127.0.0.1:{}", self.port));
        let token = std::fs::read_to_string(self.dir.path().join("admin.token"))
            .unwrap()
            .trim()
            .to_string();
        Daemon {
            child,
            admin,
            token,
            output,
        }
    }
}

struct Daemon {
    child: Child,
    admin: String,
    token: String,
    output: Arc<Mutex<Vec<String>>>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    fn stderr(&self) -> String {
        self.output.lock().unwrap().join("\n")
    }

    async fn admin(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = http()
            .request(method, format!("{}{path}", self.admin))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn register(&self, body: Value) -> Reg {
        let (s, v) = self
            .admin(reqwest::Method::POST, "/v1/registrations", Some(body))
            .await;
        assert_eq!(s, 201, "{v}");
        Reg {
            id: v["id"].as_str().unwrap().to_string(),
            token: v["token"].as_str().unwrap().to_string(),
            mcp_url: v["mcp_url"].as_str().unwrap().to_string(),
            sse_url: v["sse_url"].as_str().unwrap().to_string(),
        }
    }

    fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    /// SIGKILL, and waits for the process to be gone.
    fn kill9(mut self) {
        self.signal(Signal::SIGKILL);
        let _ = self.child.wait();
    }

    /// SIGTERM; waits for a clean exit.
    fn stop(mut self) -> String {
        self.signal(Signal::SIGTERM);
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert_eq!(st.code(), Some(0), "{}", self.stderr());
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "no exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // The reader thread has the last lines once the pipe closes.
        std::thread::sleep(Duration::from_millis(100));
        self.stderr()
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits until a line containing `needle` was printed.
    fn wait_line(&self, needle: &str) -> String {
        let t0 = Instant::now();
        loop {
            if let Some(l) = self
                .output
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(needle))
            {
                return l.clone();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "no line with {needle:?} in:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[derive(Debug, Clone)]
struct Reg {
    id: String,
    token: String,
    mcp_url: String,
    sse_url: String,
}

/// An rmcp (official Rust SDK) client over Streamable HTTP: initialize, then `demo.echo`.
/// Returns the echoed text, or the error.
async fn rmcp_echo(reg: &Reg, text: &str) -> Result<String, String> {
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::ServiceExt;
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(reg.mcp_url.clone())
            .auth_header(reg.token.clone()),
    );
    let client = ().serve(transport).await.map_err(|e| e.to_string())?;
    let args = json!({"text": text}).as_object().cloned().unwrap();
    let r = client
        .call_tool(CallToolRequestParams::new("demo.echo").with_arguments(args))
        .await
        .map_err(|e| e.to_string());
    let _ = client.cancel().await;
    let r = r?;
    let v = serde_json::to_value(&r).unwrap();
    Ok(text_of(&json!({"result": v})))
}

/// A raw Streamable HTTP `initialize`: (status, session id).
async fn initialize(reg: &Reg) -> (u16, Option<String>) {
    let r = http()
        .post(&reg.mcp_url)
        .bearer_auth(&reg.token)
        .header("accept", "application/json, text/event-stream")
        .json(
            &json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
            "protocolVersion":"2025-06-18","capabilities":{},
            "clientInfo":{"name":"store-test","version":"0"}}}),
        )
        .send()
        .await
        .unwrap();
    let sid = r
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_string());
    (r.status().as_u16(), sid)
}

/// A `tools/call` of `demo.echo` on an existing session: the HTTP status.
async fn call_on_session(reg: &Reg, sid: &str) -> u16 {
    http()
        .post(&reg.mcp_url)
        .bearer_auth(&reg.token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", sid)
        .header("mcp-protocol-version", "2025-06-18")
        .json(&json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"demo.echo","arguments":{"text":"x"}}}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// tests/peers/py_client.py (the official Python SDK) in one process: over Streamable HTTP and
/// over legacy SSE, a new connection that initializes, lists the tools and calls `demo.echo`.
/// Returns each echoed text.
async fn python_sdk_echo(reg: &Reg) -> Vec<String> {
    let batch: Vec<Value> = ["streamable", "sse"]
        .iter()
        .map(|transport| {
            json!({
                "transport": transport,
                "url": if *transport == "sse" { &reg.sse_url } else { &reg.mcp_url },
                "token": reg.token,
                "timeout": 20,
                "steps": [{"name": "call", "tool": "demo.echo", "args": {"text": transport}, "timeout": 15}],
            })
        })
        .collect();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(python())
            .arg(repo_root().join("tests/peers/py_client.py"))
            .arg("--batch")
            .arg(Value::Array(batch).to_string())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("py_client finished in time")
    .expect("py_client ran");
    assert!(
        out.status.success(),
        "py_client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    results
        .iter()
        .map(|v| {
            v["ok"]["steps"]["call"]["ok"]["call"]["content"][0]["text"]
                .as_str()
                .unwrap_or_else(|| panic!("{v}"))
                .to_string()
        })
        .collect()
}

fn mode_of(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// Does any file of the store (the database, its WAL) contain `needle`?
fn store_contains(site: &Site, needle: &str) -> bool {
    let name = site.store_path();
    let prefix = name.file_name().unwrap().to_string_lossy().to_string();
    std::fs::read_dir(site.dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .any(|e| {
            let bytes = std::fs::read(e.path()).unwrap();
            bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
        })
}

#[tokio::test]
async fn registrations_survive_kill9_and_sigterm_released_and_expired_ones_do_not() {
    let site = Site::new("");
    let d = site.start();
    assert!(
        d.stderr().contains(&format!(
            "registration store sqlite {}: 0 registration(s) restored",
            site.store_path().display()
        )),
        "{}",
        d.stderr()
    );
    let kept = d
        .register(
            json!({"agent_id": "agent-k", "tools": ["demo.*"], "ttl_s": 600, "label": "kept"}),
        )
        .await;
    let released = d
        .register(json!({"agent_id": "agent-r", "tools": ["demo.*"]}))
        .await;
    assert_eq!(rmcp_echo(&kept, "before").await.unwrap(), "agent-k:before");
    assert_eq!(
        python_sdk_echo(&kept).await,
        ["agent-k:streamable", "agent-k:sse"]
    );
    let (s, old_session) = initialize(&kept).await;
    assert_eq!(s, 200);
    let old_session = old_session.unwrap();
    let (s, _) = d
        .admin(
            reqwest::Method::DELETE,
            &format!("/v1/registrations/{}", released.id),
            None,
        )
        .await;
    assert_eq!(s, 204);

    // Registered last: its 2 s TTL passes while the daemon is down.
    let expiring = d
        .register(json!({"agent_id": "agent-e", "tools": ["demo.*"], "ttl_s": 2}))
        .await;
    // The store holds no token, and is the owner's only.
    assert_eq!(mode_of(&site.store_path()), 0o600);
    for r in [&kept, &released, &expiring] {
        assert!(!store_contains(&site, &r.token), "a token is in the store");
        assert!(!d.stderr().contains(&r.token));
    }
    assert!(store_contains(&site, &kept.id));

    // kill -9; the expiring one's TTL passes while the daemon is down.
    d.kill9();
    std::thread::sleep(Duration::from_millis(2500));
    let d = site.start();
    assert!(
        d.stderr()
            .contains("1 registration(s) restored, 1 expired while stopped"),
        "{}",
        d.stderr()
    );
    // The old session is gone (clients initialize again, as the spec says)...
    assert_eq!(call_on_session(&kept, &old_session).await, 404);
    // ...and the same URL and token serve after it does: Streamable HTTP (rmcp) and SSE.
    assert_eq!(rmcp_echo(&kept, "after").await.unwrap(), "agent-k:after");
    let mut sse = SseClient::connect(&kept.sse_url, &kept.token).await;
    sse.initialize().await;
    let r = sse.call("demo.echo", json!({"text": "sse"})).await;
    assert_eq!(text_of(&r), "agent-k:sse");
    drop(sse);
    // A stateless (2026-07-28) client notices nothing: its next request is simply served.
    let r = stateless(
        &kept.mcp_url,
        &kept.token,
        7,
        "tools/call",
        json!({"name": "demo.echo", "arguments": {"text": "stateless"}}),
    )
    .await;
    assert_eq!(text_of(&r), "agent-k:stateless", "{r}");
    // The official Python SDK, both transports, new connections on the same URLs and token.
    assert_eq!(
        python_sdk_echo(&kept).await,
        ["agent-k:streamable", "agent-k:sse"]
    );
    // Released before the kill, expired during it: 404.
    assert_eq!(initialize(&released).await.0, 404);
    assert_eq!(initialize(&expiring).await.0, 404);
    let audit = site.audit();
    let expired = audit
        .iter()
        .find(|r| {
            r.event == "registration_expired" && r.registration_id.as_deref() == Some(&expiring.id)
        })
        .expect("the expired registration is audited");
    assert!(expired.rare().expired_at.is_some(), "{expired:?}");
    assert!(audit.iter().any(|r| r.event == "registration_restored"
        && r.registration_id.as_deref() == Some(&kept.id)
        && r.label.as_deref() == Some("kept")));

    // A clean stop keeps it too (and says so), then the next start serves it again.
    let out = d.stop();
    assert!(out.contains("1 registration(s) kept in the store"), "{out}");
    let stopped = site
        .audit()
        .into_iter()
        .find(|r| r.event == "node_stopped")
        .expect("node_stopped audited");
    assert_eq!(stopped.rare().registrations, Some(1));
    let d = site.start();
    assert_eq!(rmcp_echo(&kept, "again").await.unwrap(), "agent-k:again");
    for r in [&kept, &released, &expiring] {
        assert!(!store_contains(&site, &r.token), "a token is in the store");
    }
    // A registration released now is gone for good, across a kill -9 too.
    let (s, _) = d
        .admin(
            reqwest::Method::DELETE,
            &format!("/v1/registrations/{}", kept.id),
            None,
        )
        .await;
    assert_eq!(s, 204);
    d.kill9();
    let d = site.start();
    assert!(
        d.stderr().contains("0 registration(s) restored"),
        "{}",
        d.stderr()
    );
    assert_eq!(initialize(&kept).await.0, 404);
    drop(d);

    // The audit chain runs across the restarts and the kills: intact (a line torn by a
    // kill would be named as torn, not as tampering).
    let verify = Command::new(env!("CARGO_BIN_EXE_gatehouse"))
        .args(["audit", "verify"])
        .arg(site.audit_path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&verify.stdout).to_string()
        + &String::from_utf8_lossy(&verify.stderr);
    assert!(verify.status.success(), "{text}");
    assert!(text.contains("intact"), "{text}");
}

#[tokio::test]
async fn max_calls_is_never_exceeded_across_kill9_and_restarts() {
    // Blocks of 8 calls: a kill -9 loses at most the block in hand (fewer calls, never more);
    // a clean stop gives the unspent part back.
    let site = Site::new("[store]\nbudget_block = 8");
    let d = site.start();
    let reg = d
        .register(json!({"agent_id": "agent-b", "tools": ["demo.*"], "limits": {"max_calls": 30}}))
        .await;
    let mut ok = 0;
    let calls = |n: usize| {
        let reg = reg.clone();
        async move {
            let mut c = SseClient::connect(&reg.sse_url, &reg.token).await;
            c.initialize().await;
            let mut ok = 0;
            for i in 0..n {
                let r = c.call("demo.echo", json!({"text": i.to_string()})).await;
                if r.get("result").is_some() && r["result"]["isError"] != json!(true) {
                    ok += 1;
                }
            }
            ok
        }
    };
    // 5 calls: the first block (8) is in hand, 3 unspent when the process dies.
    ok += calls(5).await;
    d.kill9();
    let d = site.start();
    // 5 more from a new block (8..16), then a clean stop returns the 3 unspent.
    ok += calls(5).await;
    d.stop();
    let d = site.start();
    // What is left: 30 - 8 (first block, 3 of it lost) - 5 = 17 calls, then refusals.
    let more = calls(25).await;
    ok += more;
    assert_eq!(more, 17, "calls after the restarts");
    assert_eq!(
        ok, 27,
        "30 max_calls, minus the 3 lost with the killed process"
    );
    assert!(ok <= 30);
    let denied = site
        .audit()
        .into_iter()
        .filter(|r| {
            r.event == "governed_mcp_call"
                && r.reason
                    .as_deref()
                    .is_some_and(|why| why.contains("max_calls (30) reached"))
        })
        .count();
    assert_eq!(denied, 25 - 17);
    drop(d);
}

#[test]
fn a_store_it_cannot_read_stops_the_start_and_is_left_as_it_is() {
    // A file of a newer schema version.
    let site = Site::new("");
    {
        let c = rusqlite::Connection::open(site.store_path()).unwrap();
        c.execute_batch("CREATE TABLE t (x); PRAGMA user_version = 7;")
            .unwrap();
    }
    let garbage: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    for (what, bytes) in [("newer schema", None), ("garbage", Some(garbage))] {
        if let Some(b) = &bytes {
            std::fs::write(site.store_path(), b).unwrap();
        }
        let before = std::fs::read(site.store_path()).unwrap();
        let out = site.command(&[]).stdin(Stdio::null()).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what}: {err}");
        assert!(
            err.contains(&site.store_path().display().to_string()),
            "{what}: the message names the file: {err}"
        );
        if bytes.is_none() {
            assert!(err.contains("schema version 7"), "{err}");
        }
        assert_eq!(
            std::fs::read(site.store_path()).unwrap(),
            before,
            "{what}: the file was changed"
        );
        assert!(!err.contains("ready"));
    }
}

/// A second demo upstream, `other`, one connection per registration.
const OTHER: &str =
    "[[upstreams]]\nid = \"other\"\ncommand = \"@self\"\nargs = [\"demo-upstream\"]\n";

#[tokio::test]
async fn sighup_applies_upstream_changes_refuses_a_bad_file_and_never_kills() {
    let site = Site::new(HELPDESK);
    let mut d = site.start();
    let reg = d
        .register(json!({"agent_id": "agent-h", "tools": ["demo.*", "helpdesk.*"]}))
        .await;
    let mut c = SseClient::connect(&reg.sse_url, &reg.token).await;
    c.initialize().await;
    let r = c.call("helpdesk.open_case", json!({"title": "t"})).await;
    assert!(r.get("result").is_some(), "{r}");
    // A new registration cannot grant an upstream that is not configured yet.
    let (s, _) = d
        .admin(
            reqwest::Method::POST,
            "/v1/registrations",
            Some(json!({"agent_id": "a", "tools": ["other.*"]})),
        )
        .await;
    assert_eq!(s, 400);

    // Unchanged.
    d.signal(Signal::SIGHUP);
    d.wait_line("SIGHUP: config reloaded");
    assert!(d.alive());

    // A call in flight on helpdesk (add_note_slow: 2 s) while helpdesk is changed and other
    // added: the call finishes on its old connection; the session hears tools/list_changed.
    let resp = c
        .post(json!({"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"helpdesk.add_note_slow","arguments":{"text":"slow"}}}))
        .await;
    assert_eq!(resp.status(), 202);
    tokio::time::sleep(Duration::from_millis(300)).await;
    site.write_config(&format!("{}{OTHER}", HELPDESK.replace("leased", "shared")));
    d.signal(Signal::SIGHUP);
    let line = d.wait_line("upstreams.other (added)");
    assert!(line.contains("applied:"), "{line}");
    assert!(line.contains("upstreams.helpdesk (changed)"), "{line}");
    assert!(d.alive());
    let (mut slow, mut list_changed) = (None, false);
    while slow.is_none() {
        let m = c
            .next_message(10)
            .await
            .expect("the call in flight answers");
        if m["method"] == "notifications/tools/list_changed" {
            list_changed = true;
        }
        if m["id"] == 77 {
            slow = Some(m);
        }
    }
    let slow = slow.unwrap();
    assert!(
        slow.get("result").is_some() && slow["result"]["isError"] != json!(true),
        "{slow}"
    );
    assert!(
        list_changed,
        "tools/list_changed before the slow call's reply"
    );
    // The next call uses the new definition (a new connection).
    let r = c.call("helpdesk.open_case", json!({"title": "t2"})).await;
    assert!(
        r.get("result").is_some() && r["result"]["isError"] != json!(true),
        "{r}"
    );
    // GET /v1/upstreams shows the upstreams in effect now.
    let (_, ups) = d.admin(reqwest::Method::GET, "/v1/upstreams", None).await;
    let ids: Vec<&str> = ups
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["helpdesk", "other"], "{ups}");
    assert_eq!(ups[0]["sharing"], "shared", "{ups}");
    // The added upstream serves new registrations.
    let added = d
        .register(json!({"agent_id": "agent-o", "tools": ["other.*"]}))
        .await;
    let mut o = SseClient::connect(&added.sse_url, &added.token).await;
    o.initialize().await;
    let r = o.call("other.open_case", json!({"title": "o"})).await;
    assert!(
        r.get("result").is_some() && r["result"]["isError"] != json!(true),
        "{r}"
    );

    // Removed: the next call fails naming the upstream; new grants of it are refused.
    site.write_config("");
    d.signal(Signal::SIGHUP);
    let line = d.wait_line("upstreams.helpdesk (removed)");
    assert!(line.contains("upstreams.other (removed)"), "{line}");
    assert!(d.alive());
    let (_, ups) = d.admin(reqwest::Method::GET, "/v1/upstreams", None).await;
    assert_eq!(ups, json!([]), "{ups}");
    let r = c.call("helpdesk.open_case", json!({"title": "t3"})).await;
    assert!(
        r["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("unknown upstream \"helpdesk\"")),
        "{r}"
    );
    let r = c.call("demo.echo", json!({"text": "still"})).await;
    assert_eq!(text_of(&r), "agent-h:still");

    // A bad file: refused with the reason; the daemon lives on and serves.
    std::fs::write(site.config(), "listen = 5\n").unwrap();
    d.signal(Signal::SIGHUP);
    let line = d.wait_line("config not reloaded");
    assert!(line.contains("listen"), "{line}");
    assert!(d.alive());
    let (s, v) = d.admin(reqwest::Method::POST, "/v1/reload", None).await;
    assert_eq!(s, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("listen"), "{v}");
    assert_eq!(rmcp_echo(&reg, "hup").await.unwrap(), "agent-h:hup");
    // The API and the CLI verb on a good file: the helpdesk comes back; a key that cannot
    // change live is reported and kept.
    site.write_config(&format!("linger_ms = 7\n{HELPDESK}"));
    let (s, v) = d.admin(reqwest::Method::POST, "/v1/reload", None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["applied"], json!(["upstreams.helpdesk (added)"]), "{v}");
    assert_eq!(v["needs_restart"], json!(["linger_ms"]), "{v}");
    let out = Command::new(env!("CARGO_BIN_EXE_gatehouse"))
        .args(["reload", "--config"])
        .arg(site.config())
        .env("GATEHOUSE_ADMIN_URL", &d.admin)
        .env_remove("GATEHOUSE_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = c.call("helpdesk.open_case", json!({"title": "t4"})).await;
    assert!(
        r.get("result").is_some() && r["result"]["isError"] != json!(true),
        "{r}"
    );
    assert!(d.alive());
    let reloads: Vec<_> = site
        .audit()
        .into_iter()
        .filter(|r| r.event == "config_reloaded")
        .collect();
    assert_eq!(reloads.len(), 5, "{reloads:?}");
    assert!(reloads
        .iter()
        .all(|r| r.rare().digest.as_ref().is_some_and(|d| d.len() == 64)));
    assert!(reloads[1]
        .reason
        .as_deref()
        .is_some_and(|w| w.contains("applied: upstreams.other (added)")));
    drop((c, o));
    let out = d.stop();
    assert!(!out.contains("forced"), "{out}");
}

/// `gatehouse audit verify` on the site's audit log: (success, stdout + stderr).
fn verify(site: &Site) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gatehouse"))
        .args(["audit", "verify"])
        .arg(site.audit_path())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[tokio::test]
async fn a_line_torn_by_kill9_is_named_torn_and_the_chain_goes_on_after_the_restart() {
    let site = Site::new("");
    let d = site.start();
    let reg = d
        .register(json!({"agent_id": "agent-t", "tools": ["demo.*"]}))
        .await;
    assert_eq!(rmcp_echo(&reg, "a").await.unwrap(), "agent-t:a");
    d.kill9();
    // What a kill in the middle of a write leaves: the start of a line, no newline.
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(site.audit_path())
            .unwrap();
        f.write_all(b"{\"ts\":\"2026-12-04T00:00:00.000000Z\",\"seq\":99,\"ev")
            .unwrap();
    }
    let (ok, text) = verify(&site);
    assert!(ok, "{text}");
    assert!(text.contains("torn last line"), "{text}");
    assert!(
        !text.contains("edited") && !text.contains("inserted"),
        "{text}"
    );
    // The next start terminates the torn line and the chain continues over it.
    let d = site.start();
    assert_eq!(rmcp_echo(&reg, "b").await.unwrap(), "agent-t:b");
    let out = d.stop();
    assert!(out.contains("1 registration(s) kept"), "{out}");
    let (ok, text) = verify(&site);
    assert!(ok, "{text}");
    assert!(text.contains("chain intact"), "{text}");
    assert!(text.contains("torn line"), "{text}");
}

#[tokio::test]
async fn concurrent_calls_around_a_kill9_never_exceed_max_calls() {
    let site = Site::new("[store]\nbudget_block = 4");
    let d = site.start();
    let reg = d
        .register(json!({"agent_id": "agent-c", "tools": ["demo.*"], "limits": {"max_calls": 40}}))
        .await;
    // 8 stateless callers, each as fast as it can, while the daemon is killed under them.
    let burst = |n: usize| {
        let reg = reg.clone();
        async move {
            let mut tasks = Vec::new();
            for w in 0..8u64 {
                let reg = reg.clone();
                tasks.push(tokio::spawn(async move {
                    let mut ok = 0;
                    for i in 0..n as u64 {
                        let r = http()
                            .post(&reg.mcp_url)
                            .bearer_auth(&reg.token)
                            .header("accept", "application/json, text/event-stream")
                            .header("mcp-protocol-version", "2026-07-28")
                            .header("mcp-method", "tools/call")
                            .header("mcp-name", "demo.echo")
                            .json(&json!({"jsonrpc":"2.0","id":w * 1000 + i,"method":"tools/call","params":{
                                "name":"demo.echo","arguments":{"text":"x"},
                                "_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}))
                            .send()
                            .await;
                        let Ok(r) = r else { continue };
                        let Ok(v) = r.json::<Value>().await else { continue };
                        if v["result"]["content"][0]["text"] == "agent-c:x" {
                            ok += 1;
                        }
                    }
                    ok
                }));
            }
            let mut ok = 0;
            for t in tasks {
                ok += t.await.unwrap();
            }
            ok
        }
    };
    let first = tokio::spawn(burst(10));
    tokio::time::sleep(Duration::from_millis(30)).await;
    d.kill9();
    let before_kill = first.await.unwrap();
    let d = site.start();
    let after = burst(10).await;
    let total = before_kill + after;
    eprintln!("served {before_kill} before the kill, {after} after; max_calls 40");
    assert!(total <= 40, "{total} calls served, max_calls 40");
    // The audit agrees: never more than 40 calls ran.
    let ran = site
        .audit()
        .into_iter()
        .filter(|r| r.event == "governed_mcp_call" && r.outcome.as_deref() == Some("ok"))
        .count();
    assert!(ran <= 40, "{ran} calls audited ok");
    // What a kill costs: the block in hand (4) and the calls it cut off in flight (8 callers).
    assert!(total >= 40 - 4 - 8, "{total}");
    drop(d);
}
