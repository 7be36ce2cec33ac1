//! Several nodes behind one L7 proxy (DESIGN.md §8, docs/scaling.md): two `gatehouse serve`
//! daemons with node ids (`n1` from the config file, `n2` from `GATEHOUSE_NODE_ID`) behind a
//! real nginx running the shipped deploy/nginx.conf (its addresses and ports rewritten to
//! loopback ones). Through the proxy: creation spreads over both nodes; each registration is
//! served by the official Python SDK over SSE and Streamable HTTP; the admin calls on one
//! registration (GET, renew — also by the CLI —, release) reach its node; release → 404; a
//! token of one node's registration is refused on the other's; Host checks still hold; with
//! n1 stopped, n2's registrations are still served and new ones land on n2. Every node's
//! audit lines (stdout JSON lines, as a collector reads them) carry its node id.
//!
//! nginx comes from the Debian package nginx-light (`bash tests/peers/setup.sh`); the Python
//! peer from tests/peers/.venv. Either missing fails the test. Every wait is bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::peers::python;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::nginx::{free_port_pair, Nginx};
use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use reqwest::Method;
use serde_json::{json, Value};

/// The admin token every node shares (`POST /v1/registrations` may land on any of them).
const ADMIN_TOKEN: &str = "fleet-admin-token-for-tests-only-0123456789";

/// A `gatehouse serve --test-tools` node; killed on drop.
struct Node {
    name: &'static str,
    child: Child,
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:PORT` of its data and admin listeners.
    data: String,
    admin: String,
    /// Its stdout: the audit records as JSON lines (`audit.stdout = true`).
    audit_lines: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Node {
    /// Starts node `name`. Its node id comes from the config file, or (`id_from_env`) from
    /// `GATEHOUSE_NODE_ID` only.
    fn start(name: &'static str, id_from_env: bool, public_url: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("gatehouse.toml");
        let node_line = if id_from_env {
            String::new()
        } else {
            format!("node_id = {name:?}\n")
        };
        let extra = format!(
            "{node_line}public_url = {public_url:?}\nallowed_hosts = [\"gw.example.com\"]\nkeepalive_s = 1\n[store]\nrelease_on_exit = true\n"
        );
        std::fs::write(
            &config,
            common::daemon::config_text(dir.path(), &extra, "stdout = true"),
        )
        .unwrap();
        let mut cmd = common::daemon::serve_command(&config, "info");
        cmd.env("GATEHOUSE_ADMIN_TOKEN", ADMIN_TOKEN)
            .stdout(Stdio::piped());
        if id_from_env {
            cmd.env("GATEHOUSE_NODE_ID", name);
        }
        let (mut child, stderr_lines, data, admin) = common::daemon::spawn_ready(cmd);
        // Its stdout: the audit records, one JSON line each.
        let audit_lines = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().unwrap();
        let lines = audit_lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                lines.lock().unwrap().push(line);
            }
        });
        Node {
            name,
            child,
            dir,
            data,
            admin,
            audit_lines,
            stderr: stderr_lines,
        }
    }

    /// SIGTERM, then waits (15 s at most) for a clean exit.
    fn stop(&mut self) -> Duration {
        let t0 = Instant::now();
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM).unwrap();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert_eq!(st.code(), Some(0), "{} exit", self.name);
                return t0.elapsed();
            }
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "{} still running 15 s after SIGTERM:\n{}",
                self.name,
                self.stderr.lock().unwrap().join("\n")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its audit records as the collector would read them from stdout.
    fn audit_records(&self) -> Vec<Value> {
        self.audit_lines
            .lock()
            .unwrap()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    }
}

/// One admin call with the fleet's token: (status, JSON body or the text as a string).
async fn admin(method: Method, url: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = http().request(method, url).bearer_auth(ADMIN_TOKEN);
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

/// `initialize` on a Streamable HTTP URL with `token` (and optionally another Host): status.
async fn initialize(mcp_url: &str, token: &str, host: Option<&str>) -> u16 {
    let mut req = http()
        .post(mcp_url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
            "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"nodes-test","version":"0"}}}));
    if let Some(h) = host {
        req = req.header("host", h);
    }
    req.send().await.unwrap().status().as_u16()
}

/// tests/peers/py_client.py (official Python SDK) in one process (`--batch`): for each
/// (transport, registration), one connection through the proxy that lists the tools and calls
/// `demo.echo`; asserts each was served. Returns the batch's wall time.
async fn served_by_python(cells: &[(&str, &Reg)], what: &str) -> Duration {
    let batch: Vec<Value> = cells
        .iter()
        .map(|(transport, r)| {
            json!({
                "transport": transport,
                "url": if *transport == "sse" { &r.sse_url } else { &r.mcp_url },
                "token": r.token,
                "timeout": 20,
                "steps": [{"name": "call", "tool": "demo.echo", "args": {"text": "via nginx"}, "timeout": 15}],
            })
        })
        .collect();
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(repo_root().join("tests/peers/py_client.py"))
        .arg("--batch")
        .arg(Value::Array(batch).to_string())
        .kill_on_drop(true);
    let t = Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(20 * cells.len() as u64 + 20),
        cmd.output(),
    )
    .await
    .expect("py_client finished in time")
    .expect("py_client ran");
    let took = t.elapsed();
    assert!(
        out.status.success(),
        "py_client --batch ({what}) failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(results.len(), cells.len());
    for ((transport, r), v) in cells.iter().zip(&results) {
        let what = format!("{what}: {transport} {}", r.id);
        let ok = &v["ok"];
        assert_eq!(ok["transport"], *transport, "{what}: {v}");
        assert_eq!(
            ok["tools"],
            json!(["demo.echo", "demo.slow"]),
            "{what}: {v}"
        );
        assert_eq!(
            ok["steps"]["call"]["ok"]["call"]["content"][0]["text"],
            format!("{}:via nginx", r.agent),
            "{what}: {v}"
        );
    }
    took
}

/// A registration as the proxy returned it.
#[derive(Clone, Debug)]
struct Reg {
    id: String,
    token: String,
    agent: String,
    sse_url: String,
    mcp_url: String,
}

impl Reg {
    fn node(&self) -> &str {
        self.id.split_once('.').unwrap().0
    }
}

/// `POST /v1/registrations` through the proxy.
async fn create(proxy_admin: &str, agent: &str) -> Reg {
    let (s, v) = admin(
        Method::POST,
        &format!("{proxy_admin}/v1/registrations"),
        Some(json!({"agent_id": agent, "tools": ["demo.echo", "demo.slow"]})),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    Reg {
        id: v["id"].as_str().unwrap().to_string(),
        token: v["token"].as_str().unwrap().to_string(),
        agent: agent.to_string(),
        sse_url: v["sse_url"].as_str().unwrap().to_string(),
        mcp_url: v["mcp_url"].as_str().unwrap().to_string(),
    }
}

/// `<node>.<22 base64url characters>` (128 bits), node one of ours.
fn assert_node_id(id: &str) {
    let (node, random) = id
        .split_once('.')
        .unwrap_or_else(|| panic!("{id}: no node prefix"));
    assert!(node == "n1" || node == "n2", "{id}");
    assert_eq!(random.len(), 22, "{id}");
    assert!(
        random
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
        "{id}"
    );
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_behind_nginx() {
    let t_all = Instant::now();
    let mut figures: Vec<(String, String)> = Vec::new();
    let (data_port, admin_port) = free_port_pair();
    let proxy = format!("http://127.0.0.1:{data_port}");
    let proxy_admin = format!("http://127.0.0.1:{admin_port}");

    let t = Instant::now();
    let mut n1 = Node::start("n1", false, &proxy);
    let n2 = Node::start("n2", true, &proxy);
    figures.push(("two nodes ready".into(), ms(t.elapsed())));
    let t = Instant::now();
    let nginx = Nginx::start_on(
        data_port,
        admin_port,
        &[(&n1.data, &n1.admin), (&n2.data, &n2.admin)],
    );
    figures.push(("nginx listening".into(), ms(t.elapsed())));

    // --- Creation spreads over both nodes; each id names the node that holds it.
    let t = Instant::now();
    let mut regs = Vec::new();
    for i in 0..6 {
        regs.push(create(&proxy_admin, &format!("agent-{i}")).await);
    }
    figures.push(("6 creations through nginx".into(), ms(t.elapsed())));
    for r in &regs {
        assert_node_id(&r.id);
        assert_eq!(
            r.mcp_url,
            format!("{proxy}/gw/{}/mcp", r.id),
            "URLs are the proxy's"
        );
        assert_eq!(r.sse_url, format!("{proxy}/gw/{}/sse", r.id));
    }
    let on = |node: &str, regs: &[Reg]| -> Vec<String> {
        let mut v: Vec<String> = regs
            .iter()
            .filter(|r| r.node() == node)
            .map(|r| r.id.clone())
            .collect();
        v.sort();
        v
    };
    let (on1, on2) = (on("n1", &regs), on("n2", &regs));
    figures.push((
        "creations per node (round robin)".into(),
        format!("n1 {}, n2 {}", on1.len(), on2.len()),
    ));
    assert_eq!(
        (on1.len(), on2.len()),
        (3, 3),
        "round robin: {regs:?}\nnginx:\n{}",
        nginx.logs()
    );
    // Each node holds exactly the registrations its prefix says (asked directly).
    for (node, want) in [(&n1, &on1), (&n2, &on2)] {
        let (s, v) = admin(
            Method::GET,
            &format!("{}/v1/registrations", node.admin),
            None,
        )
        .await;
        assert_eq!(s, 200);
        let mut held: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect();
        held.sort();
        assert_eq!(&held, want, "{}", node.name);
    }
    let a = regs.iter().find(|r| r.node() == "n1").unwrap().clone();
    let b = regs.iter().find(|r| r.node() == "n2").unwrap().clone();

    // --- Served through the proxy by the official Python SDK, SSE and Streamable HTTP.
    let took = served_by_python(
        &[
            ("sse", &a),
            ("streamable", &a),
            ("sse", &b),
            ("streamable", &b),
        ],
        "both nodes",
    )
    .await;
    figures.push((
        "py_client: 4 connections, 2 per node (one process)".into(),
        ms(took),
    ));

    // --- Streams are not buffered: the endpoint event, a call's reply and 1 s keep-alive
    // comments arrive through nginx as they are written.
    let t = Instant::now();
    let mut sse = SseClient::connect(&b.sse_url, &b.token).await;
    figures.push(("SSE endpoint event through nginx".into(), ms(t.elapsed())));
    assert!(sse.endpoint.starts_with(&format!("/gw/{}/messages/", b.id)));
    sse.initialize().await;
    let t = Instant::now();
    let reply = sse.call("demo.echo", json!({"text": "stream"})).await;
    figures.push((
        "SSE tools/call round trip through nginx".into(),
        ms(t.elapsed()),
    ));
    assert_eq!(text_of(&reply), format!("{}:stream", b.agent));
    let t = Instant::now();
    let comment = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match sse.events.recv().await {
                Some((ev, _)) if ev == "comment" => return true,
                Some(_) => continue,
                None => return false,
            }
        }
    })
    .await;
    assert_eq!(comment, Ok(true), "a keep-alive comment reaches the client");
    figures.push((
        "SSE keep-alive comment through nginx (keepalive_s = 1)".into(),
        ms(t.elapsed()),
    ));
    drop(sse);

    // --- Admin calls on one registration reach its node.
    for r in [&a, &b] {
        let url = format!("{proxy_admin}/v1/registrations/{}", r.id);
        let (s, v) = admin(Method::GET, &url, None).await;
        assert_eq!((s, v["id"].as_str()), (200, Some(r.id.as_str())), "{v}");
        assert_eq!(v["agent_id"], r.agent.as_str());
        let (s, v) = admin(
            Method::POST,
            &format!("{url}/renew"),
            Some(json!({"ttl_s": 600})),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        assert!(v["expires_at"].is_string(), "{v}");
    }
    // The CLI verbs take such ids (GATEHOUSE_ADMIN_URL = the proxy).
    let out = Command::new(env!("CARGO_BIN_EXE_gatehouse"))
        .args(["renew", &b.id, "--ttl", "10m"])
        .env("GATEHOUSE_ADMIN_URL", &proxy_admin)
        .env("GATEHOUSE_ADMIN_TOKEN", ADMIN_TOKEN)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.starts_with(&format!("{} expires at ", b.id)),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Unknown node, or a listing through the proxy (per node, not merged): refused by nginx.
    let (s, _) = admin(
        Method::GET,
        &format!("{proxy_admin}/v1/registrations/zz.abc"),
        None,
    )
    .await;
    assert_eq!(s, 404);
    let (s, _) = admin(
        Method::GET,
        &format!("{proxy_admin}/v1/registrations"),
        None,
    )
    .await;
    assert_eq!(s, 403);
    assert_eq!(
        initialize(&format!("{proxy}/gw/zz.abc/mcp"), &b.token, None).await,
        404
    );

    // --- Tokens and ids stay bound to their registration and node.
    assert_eq!(initialize(&b.mcp_url, &b.token, None).await, 200);
    assert_eq!(
        initialize(&b.mcp_url, &a.token, None).await,
        401,
        "n1's token on n2's registration"
    );
    assert_eq!(
        initialize(&a.mcp_url, &b.token, None).await,
        401,
        "n2's token on n1's registration"
    );
    // A percent-encoded `.` names the same registration on the proxy (which routes on the
    // decoded path) and on the node (which decodes the raw one it is passed).
    let encoded = b.id.replacen('.', "%2E", 1);
    assert_eq!(
        initialize(&format!("{proxy}/gw/{encoded}/mcp"), &b.token, None).await,
        200
    );
    let (s, v) = admin(
        Method::GET,
        &format!("{proxy_admin}/v1/registrations/{encoded}"),
        None,
    )
    .await;
    assert_eq!((s, v["id"].as_str()), (200, Some(b.id.as_str())), "{v}");
    // n2's random part under n1's prefix is routed to n1, which does not hold it.
    let moved = format!("{proxy}/gw/n1.{}/mcp", b.id.split_once('.').unwrap().1);
    assert_eq!(initialize(&moved, &b.token, None).await, 404);
    // Host checks still hold behind the proxy: the proxy passes the client's Host on.
    assert_eq!(
        initialize(&b.mcp_url, &b.token, Some("gw.example.com")).await,
        200,
        "allowed_hosts"
    );
    assert_eq!(
        initialize(&b.mcp_url, &b.token, Some("evil.example")).await,
        403,
        "DNS rebinding"
    );

    // --- Release through the proxy: its paths 404 at once, on the proxy as on the node.
    let a_rel = regs
        .iter()
        .filter(|r| r.node() == "n1")
        .nth(1)
        .unwrap()
        .clone();
    let b_rel = regs
        .iter()
        .filter(|r| r.node() == "n2")
        .nth(1)
        .unwrap()
        .clone();
    for r in [&a_rel, &b_rel] {
        assert_eq!(initialize(&r.mcp_url, &r.token, None).await, 200);
        let url = format!("{proxy_admin}/v1/registrations/{}", r.id);
        let (s, v) = admin(Method::DELETE, &url, None).await;
        assert_eq!(s, 204, "{v}");
        assert_eq!(initialize(&r.mcp_url, &r.token, None).await, 404);
        let status = http()
            .get(&r.sse_url)
            .bearer_auth(&r.token)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 404);
        assert_eq!(admin(Method::GET, &url, None).await.0, 404);
        assert_eq!(admin(Method::DELETE, &url, None).await.0, 404);
        assert_eq!(
            admin(Method::POST, &format!("{url}/renew"), None).await.0,
            404
        );
    }

    // --- n1 stops: n2's registrations are still served, new registrations land on n2.
    let took = n1.stop();
    figures.push(("n1 graceful stop (SIGTERM)".into(), ms(took)));
    // n1's registrations ended with it (`release_on_exit`; the harness registers again): its
    // requests go to a backup node, which does not hold them: 404.
    assert_eq!(initialize(&a.mcp_url, &a.token, None).await, 404);
    let t = Instant::now();
    let first = create(&proxy_admin, "after-stop-0").await;
    figures.push((
        "first creation after n1 stopped (fails over)".into(),
        ms(t.elapsed()),
    ));
    let mut later = vec![first];
    for i in 1..4 {
        later.push(create(&proxy_admin, &format!("after-stop-{i}")).await);
    }
    for r in &later {
        assert_eq!(r.node(), "n2", "{r:?}");
        assert_eq!(initialize(&r.mcp_url, &r.token, None).await, 200);
    }
    let took = served_by_python(
        &[("streamable", &b), ("sse", &b), ("streamable", &later[0])],
        "n1 stopped",
    )
    .await;
    figures.push((
        "py_client: 3 connections to n2, n1 stopped".into(),
        ms(took),
    ));

    // --- Audit: every node's lines (its stdout, as a collector reads it) carry its node id.
    // (n2 is still running: a line it is writing may not have been read yet; not counted.)
    let n1_records = n1.audit_records();
    let n2_records = n2.audit_records();
    for (node, records) in [("n1", &n1_records), ("n2", &n2_records)] {
        assert!(!records.is_empty(), "{node}: no audit lines");
        for r in records.iter() {
            assert_eq!(r["node_id"], node, "{r}");
            if let Some(id) = r["registration_id"].as_str() {
                assert!(id.starts_with(&format!("{node}.")), "{r}");
            }
        }
    }
    let calls_of = |records: &[Value], id: &str| {
        records
            .iter()
            .filter(|r| r["event"] == "governed_mcp_call" && r["registration_id"] == id)
            .count()
    };
    // sse, streamable (py_client); the raw SSE call (b only); after the stop twice more (b).
    assert_eq!(calls_of(&n1_records, &a.id), 2);
    assert_eq!(calls_of(&n2_records, &b.id), 5);
    assert!(n1_records.iter().any(|r| r["event"] == "daemon_stopped"));
    assert!(n1_records
        .iter()
        .any(|r| r["event"] == "registration_released"
            && r["registration_id"] == a_rel.id.as_str()
            && r["reason"].is_null()));
    // ...and the registrations n1 still held ended with it.
    assert!(n1_records
        .iter()
        .any(|r| r["event"] == "registration_released"
            && r["registration_id"] == a.id.as_str()
            && r["reason"] == "shutdown"));
    // The file chain of each node verifies with node_id in every line.
    for node in [&n1, &n2] {
        let out = Command::new(env!("CARGO_BIN_EXE_gatehouse"))
            .args(["audit", "verify"])
            .arg(node.dir.path().join("audit.jsonl"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}{}",
            node.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // n1 has exited: its stdout carries every line of its file (read to EOF within 5 s).
    let file_lines = std::fs::read_to_string(n1.dir.path().join("audit.jsonl"))
        .unwrap()
        .lines()
        .count();
    let t = Instant::now();
    while n1.audit_lines.lock().unwrap().len() < file_lines && t.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(n1.audit_lines.lock().unwrap().len(), file_lines);
    // nginx passed everything it was given (no error of its own but the stopped node).
    let log = nginx.logs();
    assert!(
        !log.contains("[emerg]") && !log.contains("[alert]"),
        "{log}"
    );
    nginx.stop();

    figures.push(("whole test".into(), ms(t_all.elapsed())));
    eprintln!("nodes.rs figures:");
    for (what, v) in &figures {
        eprintln!("  {what}: {v}");
    }
    write_figures(&figures);
    drop(n2);
}

/// target/reliability/nodes.json, beside the other tests' figures.
fn write_figures(figures: &[(String, String)]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/reliability");
    if std::fs::create_dir_all(&dir).is_ok() {
        let v: serde_json::Map<String, Value> = figures
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        let _ = std::fs::write(
            dir.join("nodes.json"),
            serde_json::to_string_pretty(&v).unwrap(),
        );
    }
}
