//! The real binary: `gatehouse serve` on ports 0 (addresses read back from its output),
//! the admin API over HTTP, an MCP client on the registration's URL, lease expiry, the CLI
//! verbs, and shutdown by SIGTERM mid-call (audit complete, no child left, bounded exit).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use gatehouse::testing::audit::{read_records, Record};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

use common::daemon::Daemon;

/// A `gatehouse serve --test-tools` (tests/common/daemon.rs) with `extra` in its config,
/// `RUST_LOG=info`.
fn daemon(extra: &str) -> Daemon {
    Daemon::start(extra, "", "info", &[])
}

/// The shipped demo upstream, as in config/gatehouse.toml (TOML tables go last).
const HELPDESK: &str = "[[upstreams]]\nid = \"helpdesk\"\ncommand = \"@self\"\nargs = [\"demo-upstream\"]\nsharing = \"leased\"\n";

fn mode_of(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn admin_api_mcp_client_cli_and_lease_expiry() {
    // A declared upstream (the built-in helpdesk): listed by /v1/upstreams and in metrics.
    let d = daemon(&format!("shutdown_grace_s = 5\n{HELPDESK}"));
    assert!(d.data.starts_with("http://127.0.0.1:") && !d.data.ends_with(":0"));
    assert!(d.admin.starts_with("http://127.0.0.1:") && d.admin != d.data);
    // The admin token: in an owner-only file whose path is printed; the token never is.
    assert_eq!(mode_of(&d.dir.path().join("admin.token")), 0o600);
    assert!(d.stderr().contains("admin token file"));
    assert!(!d.stderr().contains(&d.token));

    // Auth.
    let resp = http()
        .get(format!("{}/v1/registrations", d.admin))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    let resp = http()
        .get(format!("{}/v1/registrations", d.admin))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);

    // Bad bodies: 400 naming the field.
    use reqwest::Method as M;
    for (body, field) in [
        (json!({"tools": ["demo.echo"]}), "agent_id"),
        (json!({"agent_id": "", "tools": ["demo.echo"]}), "agent_id"),
        (json!({"agent_id": "a", "tools": "demo.echo"}), "tools"),
        (json!({"agent_id": "a", "tools": [1]}), "tools[0]"),
        (
            json!({"agent_id": "a", "tools": ["demo.echo"], "ttl_s": -1}),
            "ttl_s",
        ),
        (
            json!({"agent_id": "a", "tools": ["demo.echo"], "colour": 1}),
            "colour",
        ),
        (
            json!({"agent_id": "a", "tools": ["demo.echo"], "limits": {"max_cals": 1}}),
            "limits",
        ),
        (json!({"agent_id": "a", "tools": ["nope.*"]}), "nope.*"),
        (json!({"agent_id": "a", "tools": ["a*b"]}), "a*b"),
    ] {
        let (s, v) = d
            .admin_call(M::POST, "/v1/registrations", Some(body.clone()))
            .await;
        assert_eq!(s, 400, "{body} -> {v}");
        let msg = v["error"].as_str().unwrap();
        assert!(msg.contains(field), "{body}: {msg:?} does not name {field}");
    }

    // Create.
    let reg = d
        .register(json!({"agent_id": "agent-1", "tools": ["demo.echo"], "label": "run-7"}))
        .await;
    for k in [
        "id",
        "token",
        "agent_id",
        "tools",
        "sse_url",
        "mcp_url",
        "expires_at",
    ] {
        assert!(reg.get(k).is_some(), "create reply lacks {k}: {reg}");
    }
    assert_eq!(reg["tools"], json!(["demo.echo"]));
    assert_eq!(reg["expires_at"], Value::Null);
    let id = reg["id"].as_str().unwrap().to_string();
    let token = reg["token"].as_str().unwrap().to_string();
    assert!(reg["sse_url"].as_str().unwrap().starts_with(&d.data));

    // List: never tokens.
    let (s, list) = d.admin_call(M::GET, "/v1/registrations", None).await;
    assert_eq!(s, 200);
    assert_eq!(list[0]["id"], json!(id));
    assert_eq!(list[0]["label"], json!("run-7"));
    assert!(!list.to_string().contains(&token));

    // An MCP client calls a tool through the daemon.
    let mut c = SseClient::connect(reg["sse_url"].as_str().unwrap(), &token).await;
    c.initialize().await;
    assert_eq!(c.tool_names().await, vec!["demo.echo"]);
    let r = c.call("demo.echo", json!({"text": "hi"})).await;
    assert_eq!(text_of(&r), "agent-1:hi");
    c.call("made_up", json!({})).await;

    // Metrics in Prometheus text format.
    let m = d.metrics().await;
    for needle in [
        r#"gatehouse_tool_calls_total{tool="demo.echo",outcome="ok"} 1"#,
        r#"gatehouse_tool_calls_total{tool="_unknown",outcome="denied"} 1"#,
        r#"gatehouse_tool_call_duration_seconds_count{tool="demo.echo"} 1"#,
        "gatehouse_registrations 1",
        "gatehouse_sessions 1",
        "gatehouse_registrations_created_total 1",
        "# TYPE gatehouse_audit_queue_depth gauge",
        r#"gatehouse_upstream_connections{upstream="helpdesk"} "#,
        r#"gatehouse_upstream_in_flight{upstream="helpdesk"} "#,
        r#"gatehouse_upstream_restarts_total{upstream="helpdesk"} "#,
    ] {
        assert!(m.contains(needle), "metrics lack {needle}:\n{m}");
    }
    let (s, ups) = d.admin_call(M::GET, "/v1/upstreams", None).await;
    assert_eq!(s, 200);
    assert_eq!(ups[0]["id"], json!("helpdesk"));
    assert_eq!(ups[0]["transport"], json!("stdio"));
    assert!(ups[0]["connections"].is_array(), "{ups}");

    // Renew: a lease from now; 404 when gone.
    let (s, v) = d
        .admin_call(
            M::POST,
            &format!("/v1/registrations/{id}/renew"),
            Some(json!({"ttl_s": 600})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert!(v["expires_at"].is_string());
    let (s, _) = d
        .admin_call(M::POST, "/v1/registrations/nope/renew", None)
        .await;
    assert_eq!(s, 404);

    // Delete: 204, then every path 404, then 404 again.
    let (s, _) = d
        .admin_call(M::DELETE, &format!("/v1/registrations/{id}"), None)
        .await;
    assert_eq!(s, 204);
    assert!(c.next_message(5).await.is_none(), "stream ended on release");
    let resp = http()
        .get(reg["sse_url"].as_str().unwrap())
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let (s, _) = d
        .admin_call(M::DELETE, &format!("/v1/registrations/{id}"), None)
        .await;
    assert_eq!(s, 404);
    assert!(
        !d.stderr().contains(&token),
        "registration tokens are never logged"
    );

    // Lease expiry with a short ttl: gone by itself, audited as expired.
    let short = d
        .register(json!({"agent_id": "agent-2", "tools": ["demo.*"], "ttl_s": 1}))
        .await;
    assert!(short["expires_at"].is_string());
    let sid = short["id"].as_str().unwrap().to_string();
    // Its pinned surface's digest (issue 39): 64 hex digits.
    let (s, shown) = d
        .admin_call(M::GET, &format!("/v1/registrations/{sid}"), None)
        .await;
    assert_eq!(s, 200, "{shown}");
    let pins = shown["pins_digest"].as_str().unwrap_or_default();
    assert!(
        pins.len() == 64 && pins.bytes().all(|b| b.is_ascii_hexdigit()),
        "{shown}"
    );
    let t0 = Instant::now();
    loop {
        let (s, _) = d
            .admin_call(M::GET, &format!("/v1/registrations/{sid}"), None)
            .await;
        if s == 404 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "lease never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let expired_after = t0.elapsed();
    assert!(
        expired_after > Duration::from_millis(500),
        "{expired_after:?}"
    );
    let resp = http()
        .get(short["sse_url"].as_str().unwrap())
        .bearer_auth(short["token"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let (s, _) = d
        .admin_call(M::POST, &format!("/v1/registrations/{sid}/renew"), None)
        .await;
    assert_eq!(s, 404);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(d
        .audit()
        .iter()
        .any(|r| r.event == "registration_expired" && r.registration_id.as_deref() == Some(&sid)));
    assert!(d
        .metrics()
        .await
        .contains(r#"gatehouse_registrations_closed_total{reason="expired"} 1"#));

    // CLI verbs (token read from the config's token file).
    let out = d.cli(&[
        "register",
        "--agent-id",
        "cli-agent",
        "--tool",
        "demo.echo",
        "--ttl",
        "10m",
        "--label",
        "L",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cid = v["id"].as_str().unwrap().to_string();
    assert!(v["token"].is_string() && v["expires_at"].is_string());
    let out = d.cli(&[
        "register",
        "--agent-id",
        "sh",
        "--tool",
        "demo.echo",
        "--export",
    ]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    for var in [
        "GATEHOUSE_REGISTRATION_ID",
        "GATEHOUSE_TOKEN",
        "GATEHOUSE_SSE_URL",
        "GATEHOUSE_MCP_URL",
    ] {
        assert!(text.contains(&format!("export {var}='")), "{text}");
    }
    let out = d.cli(&["register", "--agent-id", "x", "--tool", "nope.*"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope.*"));
    let out = d.cli(&["list"]);
    let listing = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success() && listing.contains(&cid) && listing.contains("cli-agent"),
        "{listing}"
    );
    assert!(!listing.contains(v["token"].as_str().unwrap()));
    assert!(d.cli(&["renew", &cid, "--ttl", "5m"]).status.success());
    assert!(d.cli(&["release", &cid]).status.success());
    let again = d.cli(&["release", &cid]);
    assert!(!again.status.success());
    assert!(!d.cli(&["renew", &cid]).status.success());
}

#[tokio::test]
async fn sigterm_mid_call_cancels_it_audits_every_call_and_exits() {
    // `release_on_exit`: the stop releases its registrations (by default they are kept in
    // the store for the next start: tests/store.rs).
    let mut d = daemon(&format!(
        "shutdown_grace_s = 10\n{HELPDESK}[store]\nrelease_on_exit = true\n"
    ));
    let reg = d
        .register(json!({"agent_id": "agent-t", "tools": ["demo.*"]}))
        .await;
    let id = reg["id"].as_str().unwrap().to_string();
    let mut c = SseClient::connect(
        reg["sse_url"].as_str().unwrap(),
        reg["token"].as_str().unwrap(),
    )
    .await;
    c.initialize().await;
    for i in 0..3 {
        let r = c.call("demo.echo", json!({"text": i.to_string()})).await;
        assert_eq!(text_of(&r), format!("agent-t:{i}"));
    }
    let resp = c
        .post(json!({"jsonrpc":"2.0","id":99,"method":"tools/call","params":{"name":"demo.slow","arguments":{"ms":60000}}}))
        .await;
    assert_eq!(resp.status(), 202);
    d.wait_in_flight(&id, 1).await;
    assert!(
        !d.marked_processes().is_empty(),
        "the marker scan sees the daemon"
    );

    d.signal(Signal::SIGTERM);
    let (code, secs) = d.wait_exit(Duration::from_secs(10));
    eprintln!("graceful shutdown with a call in flight took {secs:.3} s");
    assert_eq!(code, Some(0), "{}", d.stderr());
    assert!(secs < 5.0, "shutdown took {secs} s");
    // The stream ended; the cancelled call got no reply.
    assert!(c.next_message(2).await.is_none());

    let audit = d.audit();
    let calls: Vec<&Record> = audit
        .iter()
        .filter(|r| r.event == "governed_mcp_call")
        .collect();
    assert_eq!(calls.len(), 4, "every call is audited: {calls:?}");
    assert_eq!(
        calls
            .iter()
            .filter(|r| r.outcome.as_deref() == Some("ok"))
            .count(),
        3
    );
    let slow = calls
        .iter()
        .find(|r| r.tool.as_deref() == Some("demo.slow"))
        .unwrap();
    assert_eq!(slow.outcome.as_deref(), Some("cancelled"));
    assert!(audit.iter().any(|r| r.event == "registration_released"
        && r.registration_id.as_deref() == Some(&id)
        && r.reason.as_deref() == Some("shutdown")));
    assert_eq!(
        audit.last().unwrap().event,
        "daemon_stopped",
        "audit flushed to the end"
    );
    // The chain is intact.
    let verify = Command::new(env!("CARGO_BIN_EXE_gatehouse"))
        .args(["audit", "--json", "--file"])
        .arg(d.dir.path().join("audit.jsonl"))
        .output()
        .unwrap();
    assert!(verify.status.success());
    // No process of this daemon remains (children inherit the marker).
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(d.marked_processes(), Vec::<u32>::new());
}

#[tokio::test]
async fn second_signal_forces_exit() {
    let mut d = daemon("shutdown_grace_s = 60");
    let reg = d
        .register(json!({"agent_id": "stuck", "tools": ["demo.block"]}))
        .await;
    let id = reg["id"].as_str().unwrap().to_string();
    let mut c = SseClient::connect(
        reg["sse_url"].as_str().unwrap(),
        reg["token"].as_str().unwrap(),
    )
    .await;
    c.initialize().await;
    let resp = c
        .post(json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"demo.block","arguments":{"ms":20000}}}))
        .await;
    assert_eq!(resp.status(), 202);
    d.wait_in_flight(&id, 1).await;
    d.signal(Signal::SIGTERM);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        d.child.try_wait().unwrap().is_none(),
        "still draining after one signal"
    );
    d.signal(Signal::SIGTERM);
    let (code, secs) = d.wait_exit(Duration::from_secs(5));
    eprintln!("second signal: exit {secs:.3} s after it");
    assert_eq!(code, Some(2), "{}", d.stderr());
    assert!(d.stderr().contains("second signal: forced exit"));
}

#[tokio::test]
async fn grace_period_bounds_shutdown() {
    let mut d = daemon("shutdown_grace_s = 1");
    let reg = d
        .register(json!({"agent_id": "stuck", "tools": ["demo.block"]}))
        .await;
    let id = reg["id"].as_str().unwrap().to_string();
    let mut c = SseClient::connect(
        reg["sse_url"].as_str().unwrap(),
        reg["token"].as_str().unwrap(),
    )
    .await;
    c.initialize().await;
    let resp = c
        .post(json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"demo.block","arguments":{"ms":20000}}}))
        .await;
    assert_eq!(resp.status(), 202);
    d.wait_in_flight(&id, 1).await;
    d.signal(Signal::SIGTERM);
    let (code, secs) = d.wait_exit(Duration::from_secs(8));
    eprintln!("grace 1 s with a stuck call: exit after {secs:.3} s");
    assert_eq!(code, Some(2), "{}", d.stderr());
    assert!((0.9..4.0).contains(&secs), "{secs}");
    assert!(d.stderr().contains("grace period over: forced exit"));
}

#[tokio::test]
async fn shipped_config_alone_serves_with_env_overrides() {
    // `gatehouse serve` with no --config: GATEHOUSE_CONFIG names the shipped file; the
    // listeners and audit path come from the environment (ports 0 so tests never collide),
    // and the admin token from GATEHOUSE_ADMIN_TOKEN (so no token file is written).
    let dir = tempfile::tempdir().unwrap();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/gatehouse.toml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_gatehouse"))
        .arg("serve")
        .current_dir(dir.path())
        .env("GATEHOUSE_CONFIG", &shipped)
        .env("GATEHOUSE_LISTEN", "127.0.0.1:0")
        .env("GATEHOUSE_ADMIN_LISTEN", "127.0.0.1:0")
        .env("GATEHOUSE_AUDIT_PATH", dir.path().join("a.jsonl"))
        .env("GATEHOUSE_ADMIN_TOKEN", "env-admin-token-123")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let mut admin = None;
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(u) = line.strip_prefix("gatehouse: admin listener on ") {
            admin = Some(u.to_string());
        }
        let ready = line == "gatehouse: ready";
        seen.push(line);
        if ready {
            break;
        }
    }
    let out = seen.join("\n");
    assert!(
        out.contains("gatehouse: data listener on http://127.0.0.1:"),
        "{out}"
    );
    assert!(
        out.contains("admin token from GATEHOUSE_ADMIN_TOKEN"),
        "{out}"
    );
    assert!(!out.contains("env-admin-token-123"));
    assert!(!dir.path().join("gatehouse-admin.token").exists());
    let admin = admin.unwrap();
    let resp = http()
        .get(format!("{admin}/v1/upstreams"))
        .bearer_auth("env-admin-token-123")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let ups: Value = resp.json().await.unwrap();
    assert_eq!(ups[0]["id"], json!("helpdesk"), "the shipped demo upstream");
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    let audit = read_records(&dir.path().join("a.jsonl")).unwrap();
    assert_eq!(audit.last().unwrap().event, "daemon_stopped");
}

/// The shipped demo upstream through the daemon: pids listed, no child left after SIGTERM.
#[tokio::test]
async fn helpdesk_call_through_the_daemon_and_no_child_after_sigterm() {
    let mut d = daemon(&format!("shutdown_grace_s = 10\n{HELPDESK}"));
    let reg = d
        .register(json!({"agent_id": "agent-h", "tools": ["helpdesk.*"]}))
        .await;
    let id = reg["id"].as_str().unwrap().to_string();
    let mut c = SseClient::connect(
        reg["sse_url"].as_str().unwrap(),
        reg["token"].as_str().unwrap(),
    )
    .await;
    c.initialize().await;
    let names = c.tool_names().await;
    assert!(
        names.contains(&"helpdesk.open_case".to_string()),
        "{names:?}"
    );
    let r = c
        .call("helpdesk.open_case", json!({"title": "printer on fire"}))
        .await;
    assert!(r["result"].is_object(), "{r}");
    let resp = c
        .post(json!({"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"helpdesk.add_note_slow","arguments":{"text":"slow"}}}))
        .await;
    assert_eq!(resp.status(), 202);
    d.wait_in_flight(&id, 1).await;
    assert!(
        d.marked_processes().len() >= 2,
        "the daemon and its helpdesk child"
    );
    let (s, ups) = d
        .admin_call(reqwest::Method::GET, "/v1/upstreams", None)
        .await;
    assert_eq!(s, 200);
    assert!(ups[0]["connections"][0]["pid"].is_u64(), "{ups}");
    d.signal(Signal::SIGTERM);
    let (code, secs) = d.wait_exit(Duration::from_secs(15));
    eprintln!("shutdown with a helpdesk call in flight took {secs:.3} s");
    assert_eq!(code, Some(0), "{}", d.stderr());
    let audit = d.audit();
    let calls: Vec<&Record> = audit
        .iter()
        .filter(|r| r.event == "governed_mcp_call")
        .collect();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0].outcome.as_deref(), Some("ok"));
    assert_eq!(calls[1].outcome.as_deref(), Some("cancelled"));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(d.marked_processes(), Vec::<u32>::new(), "no child remains");
}

/// SIGTERM under load: 3 registrations × 4 concurrent SSE clients calling in a loop. The daemon
/// exits 0 within the grace, every success reply a client received has exactly one audit record
/// with its registration's agent, the chain ends with `daemon_stopped`, and no process remains.
#[tokio::test]
async fn sigterm_under_load_loses_no_acknowledged_call() {
    let mut d = daemon(&format!("shutdown_grace_s = 10\n{HELPDESK}"));
    let mut tasks = Vec::new();
    for r in 0..3 {
        let agent = format!("agent-load-{r}");
        let reg = d
            .register(json!({"agent_id": agent, "tools": ["demo.*"]}))
            .await;
        for w in 0..4 {
            let (url, token, agent) = (
                reg["sse_url"].as_str().unwrap().to_string(),
                reg["token"].as_str().unwrap().to_string(),
                agent.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut c = SseClient::connect(&url, &token).await;
                c.initialize().await;
                let mut acked = Vec::new();
                for n in 0.. {
                    let text = format!("{agent}/{w}/{n}");
                    let args = json!({"text": text});
                    let Ok(resp) = c
                        .http
                        .post(c.post_url())
                        .bearer_auth(&c.token)
                        .json(&json!({"jsonrpc":"2.0","id":n,"method":"tools/call","params":{"name":"demo.echo","arguments":args}}))
                        .send()
                        .await
                    else {
                        break;
                    };
                    if resp.status() != 202 {
                        break;
                    }
                    match c.next_message(5).await {
                        Some(m) if m["id"] == json!(n) && m["result"].is_object() => {
                            assert_eq!(text_of(&m), format!("{agent}:{text}"));
                            acked.push((agent.clone(), gatehouse::testing::audit::digest_value(&args)));
                        }
                        _ => break,
                    }
                }
                acked
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    d.signal(Signal::SIGTERM);
    let (code, secs) = d.wait_exit(Duration::from_secs(15));
    assert_eq!(code, Some(0), "{}", d.stderr());
    let mut acked = Vec::new();
    for t in tasks {
        acked.extend(t.await.unwrap());
    }
    assert!(
        acked.len() > 12,
        "load ran: {} acknowledged calls",
        acked.len()
    );
    let audit = d.audit();
    for (agent, digest) in &acked {
        let n = audit
            .iter()
            .filter(|r| {
                r.event == "governed_mcp_call"
                    && r.args_digest.as_deref() == Some(digest)
                    && r.outcome.as_deref() == Some("ok")
            })
            .inspect(|r| assert_eq!(r.agent_id.as_deref(), Some(agent.as_str())))
            .count();
        assert_eq!(n, 1, "an acknowledged call has exactly one record");
    }
    assert_eq!(audit.last().unwrap().event, "daemon_stopped");
    eprintln!(
        "SIGTERM under load: {} acknowledged calls, all audited; exit after {secs:.3} s",
        acked.len()
    );
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(d.marked_processes(), Vec::<u32>::new());
}

/// `(pid, ppid, pgrp, state)` of every process in /proc.
fn processes() -> Vec<(i32, i32, i32, char)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp …`; comm may hold spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if let (Some(state), Some(ppid), Some(pgrp)) = (
            f.first().and_then(|s| s.chars().next()),
            f.get(1).and_then(|s| s.parse().ok()),
            f.get(2).and_then(|s| s.parse().ok()),
        ) {
            out.push((pid, ppid, pgrp, state));
        }
    }
    out
}

/// Every process (zombies included) in process group `pgid`.
fn group_members(pgid: i32) -> Vec<(i32, char)> {
    processes()
        .into_iter()
        .filter(|p| p.2 == pgid)
        .map(|p| (p.0, p.3))
        .collect()
}

/// Polls until group `pgid` has no live process, then none at all (zombies reaped: by init,
/// for members whose parent is gone); returns both times in ms, or None.
fn wait_group_gone(pgid: i32, limit: Duration) -> (Option<u128>, Option<u128>) {
    let t0 = Instant::now();
    let mut live_gone = None;
    while t0.elapsed() < limit {
        let members = group_members(pgid);
        if live_gone.is_none() && members.iter().all(|(_, state)| *state == 'Z') {
            live_gone = Some(t0.elapsed().as_millis());
        }
        if members.is_empty() {
            return (live_gone, Some(t0.elapsed().as_millis()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (live_gone, None)
}

/// SIGKILLs the pids it holds when dropped (the setsid() grandchildren nothing else reaches).
struct KillOnDrop(Vec<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = kill(Pid::from_raw(*p), Signal::SIGKILL);
        }
    }
}

/// Teardown of a child that ignores SIGTERM and stdin EOF and has a grandchild that ignores
/// SIGTERM too: a release (admin DELETE) and the daemon's exit — graceful (grace 10 s) and
/// forced (grace 2 s, shorter than the polite steps) — each end with no process left in the
/// group (/proc, zombies included). A second grandchild calls setsid(): it leaves the group,
/// and survives, as docs/upstreams.md says.
#[tokio::test]
async fn release_and_daemon_exit_leave_no_process_of_a_stubborn_group() {
    let script = format!(
        "{}/tests/fixtures/faulty_server.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let upstream = format!(
        "[[upstreams]]\nid = \"stubborn\"\ncommand = \"python3\"\nargs = [{script:?}, \"--stubborn\", \"--setsid-grandchild\"]\nsharing = \"per_registration\"\n"
    );
    let mut runs = Vec::new();
    for grace in [10u64, 2] {
        let mut d = daemon(&format!("shutdown_grace_s = {grace}\n{upstream}"));
        let daemon_pid = d.child.id() as i32;
        let mut leaders: Vec<i32> = Vec::new();
        let mut ids = Vec::new();
        let mut clients = Vec::new();
        for agent in ["released", "kept"] {
            let reg = d
                .register(json!({"agent_id": agent, "tools": ["stubborn.*"]}))
                .await;
            let mut c = SseClient::connect(
                reg["sse_url"].as_str().unwrap(),
                reg["token"].as_str().unwrap(),
            )
            .await;
            c.initialize().await;
            let r = c.call("stubborn.echo", json!({"text": "hi"})).await;
            assert_eq!(text_of(&r), "echo:hi", "{r}");
            let new: Vec<i32> = processes()
                .into_iter()
                .filter(|p| p.1 == daemon_pid && !leaders.contains(&p.0))
                .map(|p| p.0)
                .collect();
            assert_eq!(new.len(), 1, "one child per registration: {new:?}");
            leaders.push(new[0]);
            ids.push(reg["id"].as_str().unwrap().to_string());
            clients.push(c);
        }
        // Each group: the child and its grandchild; the setsid() grandchild is outside it.
        // (The pool's start-up probe spawned a child too: its setsid() grandchild is out
        // there as well; `marked_processes` finds them all below.)
        let mut escapees = KillOnDrop(
            processes()
                .into_iter()
                .filter(|p| leaders.contains(&p.1) && !leaders.contains(&p.2))
                .map(|p| p.0)
                .collect(),
        );
        assert_eq!(escapees.0.len(), 2, "one setsid() grandchild per child");
        let members: Vec<usize> = leaders.iter().map(|l| group_members(*l).len()).collect();
        assert!(members.iter().all(|n| *n >= 2), "{members:?}");

        let t_release = Instant::now();
        let (s, _) = d
            .admin_call(
                reqwest::Method::DELETE,
                &format!("/v1/registrations/{}", ids[0]),
                None,
            )
            .await;
        assert_eq!(s, 204);
        let release_ms = t_release.elapsed().as_millis();
        let released_ms = wait_group_gone(leaders[0], Duration::from_secs(15));
        assert!(
            released_ms.1.is_some(),
            "released group left: {:?}",
            group_members(leaders[0])
        );

        let t0 = Instant::now();
        d.signal(Signal::SIGTERM);
        let (code, exit_s) = d.wait_exit(Duration::from_secs(30));
        let exit_gone_ms = wait_group_gone(leaders[1], Duration::from_secs(5));
        let total_ms = t0.elapsed().as_millis();
        assert!(
            exit_gone_ms.1.is_some(),
            "group left after the daemon's exit (grace {grace}): {:?}\n{}",
            group_members(leaders[1]),
            d.stderr()
        );
        // Graceful within a 10 s grace; a 2 s grace is shorter than the polite steps.
        assert_eq!(
            code,
            Some(if grace == 10 { 0 } else { 2 }),
            "{}",
            d.stderr()
        );
        // What is left of everything the daemon started: only the setsid() grandchildren
        // (each the leader of its own session), the probe's included.
        let left = d.marked_processes();
        escapees.0.extend(left.iter().map(|p| *p as i32));
        let sessions: Vec<i32> = processes()
            .into_iter()
            .filter(|p| left.contains(&(p.0 as u32)) && p.2 == p.0 && p.3 != 'Z')
            .map(|p| p.0)
            .collect();
        assert_eq!(
            sessions.len(),
            left.len(),
            "processes left that did not leave their group: {left:?} (setsid: {sessions:?})"
        );
        assert!(
            left.len() >= 2,
            "the setsid() grandchildren outlive the group: {left:?}"
        );
        runs.push(json!({
            "shutdown_grace_s": grace,
            "group_members_before": members,
            "release_returned_after_ms": release_ms,
            "release_group_no_live_process_after_ms": released_ms.0.map(|m| m + release_ms),
            "release_group_empty_after_ms": released_ms.1.map(|m| m + release_ms),
            "daemon_exit_code": code,
            "daemon_exit_ms": (exit_s * 1000.0).round(),
            "exit_group_no_live_process_after_ms": exit_gone_ms.0,
            "exit_group_empty_after_ms": exit_gone_ms.1,
            "since_sigterm_ms": total_ms,
            "processes_left_in_groups": leaders.iter().map(|l| group_members(*l).len()).sum::<usize>(),
            "setsid_grandchildren_left": left.len(),
        }));
        drop(escapees);
    }
    write_figures("teardown", json!({ "runs": runs }));
}

/// Writes a test's figures to target/reliability/<name>.json (RELIABILITY.md is built from them).
fn write_figures(name: &str, v: Value) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/reliability");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_string_pretty(&v).unwrap(),
    )
    .unwrap();
}

/// One request on a raw connection; returns (status, body) or None if the connection ended
/// first. Reads exactly one response (by content-length), so the connection stays usable.
async fn raw_get(tcp: &mut tokio::net::TcpStream, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let req = format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n");
    tcp.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(|v| v.trim().parse().unwrap_or(0))
                })
                .unwrap_or(0);
            if body.len() >= len {
                let status = head.get(9..12)?.parse().ok()?;
                return Some((status, body[..len].to_string()));
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut chunk))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Waits until the peer closes `tcp` (EOF or reset); returns the ms it took, or None.
async fn closed_after(tcp: &mut tokio::net::TcpStream, limit: Duration) -> Option<u128> {
    use tokio::io::AsyncReadExt;
    let t0 = Instant::now();
    let mut sink = [0u8; 1024];
    loop {
        let left = limit.checked_sub(t0.elapsed())?;
        match tokio::time::timeout(left, tcp.read(&mut sink)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(t0.elapsed().as_millis()),
            Ok(Ok(_)) => continue,
        }
    }
}

/// Connection bounds, through the daemon with an open-files limit of 256 (soft) / 512 (hard):
/// it raises the soft limit to the hard one and caps data connections at 3/4 of it. 1,000
/// sockets that send nothing neither lock the admin API out nor an open connection; a new
/// connection gets a fast 503 until the silent ones hit the header timeout, then a bystander
/// is served. A slowloris head is cut at the header timeout, an idle kept-alive connection at
/// the idle timeout (not the header timeout), while an SSE stream and a call longer than both
/// stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_cap_and_timeouts_keep_bystanders_and_the_admin_api_served() {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;
    const SILENT: usize = 1000;
    let d = Daemon::start_wrapped(
        "keepalive_s = 1\n[connections]\nheader_timeout_s = 1\nidle_timeout_s = 2\n",
        "",
        "info",
        &[],
        Some("ulimit -Sn 256 && ulimit -Hn 512"),
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", d.child.id())).unwrap();
    let nofile: Vec<u64> = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(nofile, vec![512, 512], "soft limit raised to the hard one");
    assert!(
        d.stderr().contains("data connections at most 384"),
        "{}",
        d.stderr()
    );
    let data = d.data.trim_start_matches("http://").to_string();

    // Open before the flood, kept alive through it.
    let mut kept = TcpStream::connect(&data).await.unwrap();
    assert_eq!(raw_get(&mut kept, "/healthz").await.map(|r| r.0), Some(200));

    let t_flood = Instant::now();
    let mut silent = Vec::with_capacity(SILENT);
    let mut kept_used = Instant::now();
    for _ in 0..SILENT {
        silent.push(TcpStream::connect(&data).await.unwrap());
        // The open connection is used during the flood too, and so kept well inside the idle
        // timeout (2 s) however long 1,000 connects take on a loaded machine: what is tested
        // is that it stays served at the cap, not that it survives being idle.
        if kept_used.elapsed() > Duration::from_millis(500) {
            assert_eq!(
                raw_get(&mut kept, "/healthz").await.map(|r| r.0),
                Some(200),
                "an open connection keeps working during the flood"
            );
            kept_used = Instant::now();
        }
    }
    let flood_ms = t_flood.elapsed().as_millis();
    // The admin API answers at once.
    let t = Instant::now();
    let (s, _) = d
        .admin_call(reqwest::Method::GET, "/v1/registrations", None)
        .await;
    let admin_ms = t.elapsed().as_millis();
    assert_eq!(s, 200);
    // The open connection still serves.
    assert_eq!(
        raw_get(&mut kept, "/healthz").await.map(|r| r.0),
        Some(200),
        "an open connection keeps working at the cap"
    );
    // A new connection is refused fast, with a clear 503 — while the cap is full. On a loaded
    // machine the flood can be slow enough for the header timeout (1 s) to have freed slots
    // already; then (a new connection served instead) silent sockets are added until one is
    // refused.
    let (status, body, refused_ms) = loop {
        let t = Instant::now();
        let mut fresh = TcpStream::connect(&data).await.unwrap();
        let refused = raw_get(&mut fresh, "/healthz").await;
        let refused_ms = t.elapsed().as_millis();
        let (status, body) = refused.expect("an answer, not a reset");
        if status == 503 {
            break (status, body, refused_ms);
        }
        assert_eq!(status, 200, "{body}");
        assert!(
            silent.len() < 2 * SILENT,
            "no connection refused after {} silent sockets",
            silent.len()
        );
        for _ in 0..100 {
            silent.push(TcpStream::connect(&data).await.unwrap());
        }
    };
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("connection limit"), "{body}");
    let held_window_ms = t_flood.elapsed().as_millis();
    // A bystander retrying is served once the silent sockets hit the header timeout.
    let mut attempts = 0;
    let bystander_ms = loop {
        attempts += 1;
        let mut tcp = TcpStream::connect(&data).await.unwrap();
        if raw_get(&mut tcp, "/healthz").await.map(|r| r.0) == Some(200) {
            break t_flood.elapsed().as_millis();
        }
        assert!(
            t_flood.elapsed() < Duration::from_secs(10),
            "bystander never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Every silent socket was answered 503 at once or closed by the header timeout.
    let (mut got_503, mut closed_silently) = (0, 0);
    let opened = silent.len();
    for mut tcp in silent {
        use tokio::io::AsyncReadExt;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(3), tcp.read_to_end(&mut out)).await;
        if out.starts_with(b"HTTP/1.1 503") {
            got_503 += 1;
        } else if out.is_empty() {
            closed_silently += 1;
        }
    }
    assert_eq!(got_503 + closed_silently, opened);
    // At most 384 held at once; more than 384 in all when the flood outlasts the header
    // timeout (slots freed by it are taken by the next silent sockets).
    let rounds = 1 + held_window_ms as usize / 1000;
    assert!(
        got_503 > 0 && closed_silently <= 384 * rounds,
        "{got_503} refused / {closed_silently} held, flood {flood_ms} ms"
    );
    assert!(bystander_ms < 5000, "{bystander_ms}");

    // Slowloris: a header line every 200 ms, never the end of the head.
    let mut slow = TcpStream::connect(&data).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n")
        .await
        .unwrap();
    let t = Instant::now();
    let slowloris_ms = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if slow.write_all(b"x-slow: 1\r\n").await.is_err() {
            break t.elapsed().as_millis();
        }
        if let Ok(Some(ms)) = tokio::time::timeout(
            Duration::from_millis(1),
            closed_after(&mut slow, Duration::from_millis(1)),
        )
        .await
        {
            let _ = ms;
            break t.elapsed().as_millis();
        }
        assert!(t.elapsed() < Duration::from_secs(6), "slowloris never cut");
    };
    assert!((800..2500).contains(&slowloris_ms), "{slowloris_ms}");

    // Idle keep-alive: closed at the idle timeout (2 s), not the header timeout (1 s).
    let mut idle = TcpStream::connect(&data).await.unwrap();
    assert_eq!(raw_get(&mut idle, "/healthz").await.map(|r| r.0), Some(200));
    let idle_ms = closed_after(&mut idle, Duration::from_secs(6))
        .await
        .expect("idle connection closed");
    assert!((1800..3500).contains(&idle_ms), "{idle_ms}");

    // Not idle: an SSE stream open for 2x the idle timeout, a reply on it after a call that
    // outlasts both timeouts, and a Streamable HTTP call in flight as long.
    let reg = d
        .register(json!({"agent_id": "conn", "tools": ["demo.*"]}))
        .await;
    let token = reg["token"].as_str().unwrap().to_string();
    let mut sse = SseClient::connect(reg["sse_url"].as_str().unwrap(), &token).await;
    sse.initialize().await;
    let t = Instant::now();
    let r = sse.call("demo.slow", json!({"ms": 4000})).await;
    let sse_ms = t.elapsed().as_millis();
    assert_eq!(text_of(&r), "done", "{r}");
    let mcp = reg["mcp_url"].as_str().unwrap().to_string();
    let init = http()
        .post(&mcp)
        .bearer_auth(&token)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"0"}}}))
        .send()
        .await
        .unwrap();
    let sid = init.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    let t = Instant::now();
    let call = http()
        .post(&mcp)
        .bearer_auth(&token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &sid)
        .header("mcp-protocol-version", "2025-06-18")
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"demo.slow","arguments":{"ms":3000}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(call.status(), 200);
    let body = call.text().await.unwrap();
    let slow_call_ms = t.elapsed().as_millis();
    assert!(body.contains("done"), "{body}");

    write_figures(
        "connections",
        json!({
            "nofile_soft_at_start": 256,
            "nofile_after_raise": nofile[0],
            "data_connection_cap": 384,
            "header_timeout_s": 1,
            "idle_timeout_s": 2,
            "silent_sockets": opened,
            "silent_sockets_opened_in_ms": flood_ms,
            "silent_refused_with_503": got_503,
            "silent_held_then_closed_by_header_timeout": closed_silently,
            "admin_answered_during_flood_ms": admin_ms,
            "open_connection_served_during_flood": true,
            "refused_connection_answered_in_ms": refused_ms,
            "bystander_served_after_ms": bystander_ms,
            "bystander_attempts": attempts,
            "slowloris_cut_after_ms": slowloris_ms,
            "idle_keepalive_closed_after_ms": idle_ms,
            "sse_call_reply_after_ms": sse_ms,
            "streamable_call_in_flight_ms": slow_call_ms,
        }),
    );
}
