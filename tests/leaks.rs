//! No secret leaks: the real daemon runs with RUST_LOG=debug while registrations are created,
//! used (good and bad tokens, every transport), renewed and released; its whole stderr must
//! hold neither the admin token nor any registration token. A stdio upstream
//! (tests/fixtures/faulty_server.py) records its argv, env and every line it reads: the
//! client's token never reaches it. Figures: target/reliability/leaks.json.
//!
//! The proxy path (`prompts/get`, `resources/read`), next to `tools/call`: a caller smuggles its
//! token into the params, and the same recording upstream, over stdio and over HTTP, shows what
//! arrives. Figures: target/reliability/leaks_proxy.json.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    let upstream = format!(
        "[[upstreams]]\nid = \"up\"\ncommand = \"python3\"\nargs = [{script:?}]\nsharing = \"shared\"\nenv = {{ FAULTY_RECORD = {:?} }}\n",
        record.display().to_string(),
    );
    // The upstream table goes after [audit] (TOML tables last).
    std::fs::write(
        &config,
        common::daemon::config_text(dir.path(), "", &upstream),
    )
    .unwrap();
    let mut cmd =
        common::daemon::serve_command(&config, "trace,hyper=debug,h2=debug,reqwest=debug");
    cmd.stdout(Stdio::piped());
    let (mut child, stderr_lines, _data, admin) = common::daemon::spawn_ready(cmd);
    // Its stdout too: whatever it prints is searched with its stderr.
    let stdout_text = Arc::new(Mutex::new(String::new()));
    let reader = {
        let (out, stdout) = (stdout_text.clone(), child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                out.lock().unwrap().push_str(&line);
                out.lock().unwrap().push('\n');
            }
        })
    };
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
    let _ = reader.join();
    let mut logs = stderr_lines.lock().unwrap().join("\n");
    logs.push('\n');
    logs.push_str(&stdout_text.lock().unwrap());
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

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The caller's token, smuggled into the params of `prompts/get`, `resources/read` and — for
/// comparison — `tools/call`, as a recording upstream receives them over stdio and over HTTP
/// (tests/fixtures/faulty_server.py; `--http` records each request's headers too).
///
/// Scrubbed (one place for all three methods, `upstream::pool::upstream_meta`): every `_meta`
/// entry that carries the token — as its value, as "Bearer <token>", nested in an array, or as
/// its key — and a caller-supplied lease (`io.gatehouse/lease`). Other `_meta` entries pass
/// (`traceparent`).
///
/// Passed through unchanged, on all three methods alike: the caller's own data — `arguments`
/// and any other field of the params — token or not. The gateway does not rewrite what a
/// caller chooses to send its own tool, prompt or resource; a caller that pastes its token
/// into an argument sends it on purpose (the tool-call path has always done the same).
///
/// Never sent: the client's `Authorization` header, or the token in any header (HTTP), argv or
/// environment (stdio).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_smuggled_into_proxied_params_is_scrubbed_from_meta_and_never_a_header() {
    use common::*;
    use gatehouse::config::UpstreamConfig;
    use gatehouse::RegistrationSpec;
    use serde_json::Map;
    use tokio::io::AsyncBufReadExt;

    let script = format!(
        "{}/tests/fixtures/faulty_server.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let dirp = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/reliability");
    let _ = std::fs::remove_file(dirp.join("leaks_proxy.json"));
    let mut figures = Vec::new();
    for transport in ["stdio", "http"] {
        let dir = tempfile::tempdir().unwrap();
        let record = dir.path().join("record.jsonl");
        let record_s = record.display().to_string();
        let mut _http_server = None;
        let up: UpstreamConfig = if transport == "http" {
            let mut child = tokio::process::Command::new("python3")
                .args([script.as_str(), "--http"])
                .env("FAULTY_RECORD", &record)
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
            let first = lines.next_line().await.unwrap().unwrap();
            let port = first.strip_prefix("port ").unwrap().to_string();
            _http_server = Some(child);
            toml::from_str(&format!(
                "id = \"up\"\nurl = \"http://127.0.0.1:{port}/mcp\"\nsharing = \"shared\"\n"
            ))
            .unwrap()
        } else {
            toml::from_str(&format!(
                "id = \"up\"\ncommand = \"python3\"\nargs = [{script:?}]\nsharing = \"shared\"\nenv = {{ FAULTY_RECORD = {record_s:?} }}\n"
            ))
            .unwrap()
        };
        let tg = TestGateway::with(|c| c.upstreams = vec![up]);
        let reg = tg
            .gateway
            .register(RegistrationSpec::new("agent-smuggler").grant("up.echo"))
            .await
            .unwrap();
        let token = reg.token().to_string();
        let bearer = format!("Bearer {token}");
        let mut meta = Map::new();
        meta.insert("authorization".into(), json!(bearer));
        meta.insert("token".into(), json!(token));
        meta.insert("nested".into(), json!({"x": [bearer]}));
        meta.insert(token.clone(), json!("the token as a key"));
        meta.insert("io.gatehouse/lease".into(), json!("forged-lease"));
        meta.insert("traceparent".into(), json!(TRACEPARENT));
        let meta = Value::Object(meta);

        // The client sends `Authorization: Bearer <token>` on every request.
        let mut c = SseClient::connect(&reg.sse_url(), &token).await;
        c.initialize().await;
        let prompt_args = json!({"topic": "weather", "note": token, "deep": {"x": [bearer]}});
        let r = c
            .request(
                "prompts/get",
                json!({"name": "up.recorded", "arguments": prompt_args, "_meta": meta}),
            )
            .await;
        assert_eq!(
            r["result"]["messages"][0]["content"]["text"], "prompt:weather",
            "{transport}: {r}"
        );
        let extra = json!({"deep": [bearer], "token": token});
        let r = c
            .request(
                "resources/read",
                json!({"uri": "faulty://record", "extra": extra, "_meta": meta}),
            )
            .await;
        assert_eq!(
            r["result"]["contents"][0]["text"], "resource:faulty://record",
            "{transport}: {r}"
        );
        let tool_args = json!({"text": token});
        let r = c
            .request(
                "tools/call",
                json!({"name": "up.echo", "arguments": tool_args, "_meta": meta}),
            )
            .await;
        assert_eq!(text_of(&r), format!("echo:{token}"), "{transport}: {r}");

        // What the upstream received.
        let lines: Vec<Value> = std::fs::read_to_string(&record)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let mut messages = Vec::new();
        let mut http_requests = 0;
        for line in &lines {
            if line.get("argv").is_some() {
                assert!(
                    !line.to_string().contains(&token),
                    "{transport}: the token is in the upstream's argv or environment"
                );
            } else if let Some(headers) = line.get("headers") {
                http_requests += 1;
                assert!(
                    headers.get("authorization").is_none(),
                    "{transport}: an Authorization header went upstream: {headers}"
                );
                assert!(
                    !headers.to_string().contains(&token),
                    "{transport}: the token went upstream in a header: {headers}"
                );
                if let Ok(m) = serde_json::from_str::<Value>(line["body"].as_str().unwrap()) {
                    messages.push(m);
                }
            } else {
                messages.push(line.clone());
            }
        }
        if transport == "http" {
            assert!(http_requests > 0, "the HTTP upstream recorded its requests");
        }
        let sent = |method: &str| -> Vec<&Value> {
            messages
                .iter()
                .filter(|m| m["method"] == method && m["params"]["_meta"].is_object())
                .collect()
        };
        let (prompts, reads, calls) = (
            sent("prompts/get"),
            sent("resources/read"),
            sent("tools/call"),
        );
        assert_eq!(
            (prompts.len(), reads.len(), calls.len()),
            (1, 1, 1),
            "{transport}: each smuggling request reached the upstream once: {messages:?}"
        );
        let mut scrubbed = 0;
        for m in prompts.iter().chain(&reads).chain(&calls) {
            let up_meta = m["params"]["_meta"].as_object().unwrap();
            // Scrubbed: every entry carrying the token, and the forged lease.
            for key in ["authorization", "token", "nested", token.as_str()] {
                assert!(
                    !up_meta.contains_key(key),
                    "{transport}: _meta[{key:?}] reached the upstream: {m}"
                );
                scrubbed += 1;
            }
            assert_ne!(
                up_meta.get("io.gatehouse/lease"),
                Some(&json!("forged-lease")),
                "{transport}: a caller-supplied lease reached the upstream: {m}"
            );
            // Kept: an entry that carries no token.
            assert_eq!(up_meta.get("traceparent"), Some(&json!(TRACEPARENT)), "{m}");
        }
        // Passed through unchanged: the caller's own arguments and params, token and all.
        assert_eq!(prompts[0]["params"]["name"], "recorded");
        assert_eq!(prompts[0]["params"]["arguments"], prompt_args);
        assert_eq!(reads[0]["params"]["uri"], "faulty://record");
        assert_eq!(reads[0]["params"]["extra"], extra);
        assert_eq!(calls[0]["params"]["name"], "echo");
        assert_eq!(calls[0]["params"]["arguments"], tool_args);
        // Nowhere else: without those fields, no upstream message carries the token.
        for m in &messages {
            let mut rest = m.clone();
            if let Some(p) = rest.get_mut("params").and_then(Value::as_object_mut) {
                p.remove("arguments");
                p.remove("extra");
            }
            assert!(
                !rest.to_string().contains(&token),
                "{transport}: the token reached the upstream outside the caller's own data: {m}"
            );
        }
        figures.push(json!({
            "transport": transport,
            "smuggling_requests": 3,
            "meta_entries_scrubbed": scrubbed,
            "upstream_messages_checked": messages.len(),
            "http_requests_checked": http_requests,
        }));
        drop(c);
        tg.gateway.shutdown().await;
    }
    std::fs::create_dir_all(&dirp).unwrap();
    std::fs::write(
        dirp.join("leaks_proxy.json"),
        serde_json::to_string_pretty(&json!({ "upstreams": figures, "leaks_found": 0 })).unwrap(),
    )
    .unwrap();
}
