//! No secret leaks: the real daemon runs with RUST_LOG=debug while registrations are created,
//! used (good and bad tokens, every transport), renewed and released; its whole stderr must
//! hold neither the admin token nor any registration token. A stdio upstream
//! (tests/fixtures/faulty_server.py) records its argv, env and every line it reads: the
//! client's token never reaches it. Figures: target/reliability/leaks.json.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const ACCEPT_BOTH: &str = "application/json, text/event-stream";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_token_in_logs_and_none_reaches_an_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let record = dir.path().join("upstream-record.jsonl");
    let script = format!(
        "{}/tests/fixtures/faulty_server.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let config = dir.path().join("gatehouse.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nadmin_token_file = {:?}\n[audit]\npath = {:?}\nfsync = \"never\"\n[[upstreams]]\nid = \"up\"\ncommand = \"python3\"\nargs = [{script:?}]\nsharing = \"shared\"\nenv = {{ FAULTY_RECORD = {:?} }}\n",
            dir.path().join("admin.token").display().to_string(),
            dir.path().join("audit.jsonl").display().to_string(),
            record.display().to_string(),
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gatehouse"))
        .args(["serve", "--test-tools", "--config"])
        .arg(&config)
        .env_remove("GATEHOUSE_ADMIN_TOKEN")
        .env_remove("GATEHOUSE_LISTEN")
        .env_remove("GATEHOUSE_ADMIN_LISTEN")
        .env_remove("GATEHOUSE_AUDIT_PATH")
        .env("RUST_LOG", "trace,hyper=debug,h2=debug,reqwest=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let logs = Arc::new(Mutex::new(String::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    for stream in [
        Box::new(child.stderr.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stdout.take().unwrap()),
    ] {
        let (logs, tx) = (logs.clone(), tx.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                logs.lock().unwrap().push_str(&line);
                logs.lock().unwrap().push('\n');
                let _ = tx.send(line);
            }
        });
    }
    let (mut data, mut admin) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
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
    let (_data, admin) = (data.unwrap(), admin.unwrap());
    let admin_token = std::fs::read_to_string(dir.path().join("admin.token"))
        .unwrap()
        .trim()
        .to_string();
    let http = reqwest::Client::new();
    let mut tokens = vec![admin_token.clone()];
    let mut requests = 0;
    for i in 0..5 {
        let r: Value = http
            .post(format!("{admin}/v1/registrations"))
            .bearer_auth(&admin_token)
            .json(&json!({"agent_id": format!("agent-{i}"), "tools": ["demo.*", "up.*"], "ttl_s": 60}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let (id, token, mcp) = (
            r["id"].as_str().unwrap().to_string(),
            r["token"].as_str().unwrap().to_string(),
            r["mcp_url"].as_str().unwrap().to_string(),
        );
        tokens.push(token.clone());
        // Initialize; call an in-process tool and the recording upstream; wrong tokens too.
        let init = http
            .post(&mcp)
            .bearer_auth(&token)
            .header("accept", ACCEPT_BOTH)
            .json(&json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"l","version":"0"}}}))
            .send()
            .await
            .unwrap();
        let sid = init.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_string();
        for (tool, args) in [
            ("demo.echo", json!({"text": token.clone()})),
            ("up.record", json!({})),
            ("up.echo", json!({"text": "x"})),
            ("up.nope", json!({})),
        ] {
            let r: Value = http
                .post(&mcp)
                .bearer_auth(&token)
                .header("accept", ACCEPT_BOTH)
                .header("mcp-session-id", &sid)
                .header("mcp-protocol-version", "2025-06-18")
                .json(&json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":tool,"arguments":args,"_meta":{"leak":token.clone(),"authorization":format!("Bearer {token}")}}}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            requests += 1;
            if tool == "up.record" {
                let text = r["result"]["content"][0]["text"].as_str().unwrap();
                assert!(text.contains("\"stdin\""), "{text}");
                assert!(
                    !text.contains(&token),
                    "the token reached the upstream: {text}"
                );
                assert!(
                    !text.contains(&admin_token),
                    "the admin token reached the upstream"
                );
            }
        }
        for bad in [format!("{token}x"), admin_token.clone(), tokens[0].clone()] {
            let s = http
                .post(&mcp)
                .bearer_auth(&bad)
                .header("accept", ACCEPT_BOTH)
                .json(&json!({"jsonrpc":"2.0","id":3,"method":"ping"}))
                .send()
                .await
                .unwrap()
                .status();
            assert_eq!(s, 401);
            requests += 1;
        }
        // Admin with a registration token (wrong), renew, then release.
        let s = http
            .get(format!("{admin}/v1/registrations"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(s, 401);
        http.post(format!("{admin}/v1/registrations/{id}/renew"))
            .bearer_auth(&admin_token)
            .json(&json!({"ttl_s": 30}))
            .send()
            .await
            .unwrap();
        let s = http
            .delete(format!("{admin}/v1/registrations/{id}"))
            .bearer_auth(&admin_token)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(s, 204);
        requests += 3;
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let _ = child.wait();
    std::thread::sleep(Duration::from_millis(200));
    let logs = logs.lock().unwrap().clone();
    let upstream_saw = std::fs::read_to_string(&record).unwrap();
    assert!(
        logs.len() > 2_000,
        "debug logs were captured ({} bytes)",
        logs.len()
    );
    assert!(
        upstream_saw.contains("tools/call"),
        "the upstream recorded its input"
    );
    let mut leaks = Vec::new();
    for t in &tokens {
        if logs.contains(t.as_str()) {
            leaks.push("a token in the daemon's logs".to_string());
        }
        if upstream_saw.contains(t.as_str()) {
            leaks.push("a token in the upstream's argv/env/stdin".to_string());
        }
    }
    let dirp = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/reliability");
    std::fs::create_dir_all(&dirp).unwrap();
    std::fs::write(
        dirp.join("leaks.json"),
        serde_json::to_string_pretty(&json!({
            "tokens_checked": tokens.len(),
            "requests": requests,
            "log_bytes_scanned": logs.len(),
            "upstream_record_bytes_scanned": upstream_saw.len(),
            "leaks_found": leaks.len(),
        }))
        .unwrap(),
    )
    .unwrap();
    assert!(leaks.is_empty(), "{leaks:?}");
}
