//! The client's bearer token never reaches an HTTP upstream: a Python SDK server over
//! Streamable HTTP (tests/peers/conformance_server.py) reports the headers each call arrived
//! with; the configured upstream header does arrive, the agent's token never does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::*;
use gatehouse::config::UpstreamConfig;
use gatehouse::RegistrationSpec;
use serde_json::{json, Value};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test]
async fn the_agent_token_never_reaches_an_http_upstream() {
    let py = root().join("tests/peers/.venv/bin/python");
    assert!(
        py.exists(),
        "tests/peers/.venv is missing: run `bash tests/peers/setup.sh` (or `bash tests/run.sh`)"
    );
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let _child = tokio::process::Command::new(py)
        .arg(root().join("tests/peers/conformance_server.py"))
        .args(["streamable-http", "--port", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "conformance_server.py did not start"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let up: UpstreamConfig = toml::from_str(&format!(
        "id = \"py\"\nurl = \"http://127.0.0.1:{port}/mcp\"\nheaders = {{ \"X-Upstream-Key\" = \"configured-upstream-credential\" }}\n"
    ))
    .unwrap();
    let tg = TestGateway::with(|c| c.upstreams = vec![up]);
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("agent-h").grant("py.test_request_headers"))
        .await
        .unwrap();
    let token = reg.token().to_string();
    let mut c = SseClient::connect(&reg.sse_url(), &token).await;
    c.initialize().await;
    // The caller tries to smuggle its token upstream in _meta, in several forms.
    let r = c
        .request(
            "tools/call",
            json!({"name": "py.test_request_headers", "arguments": {},
                   "_meta": {"authorization": format!("Bearer {token}"), "token": token,
                             "nested": {"x": [format!("Bearer {token}")]}}}),
        )
        .await;
    let result = &r["result"];
    assert!(result.is_object(), "{r}");
    let headers: Value = result
        .get("structuredContent")
        .cloned()
        .filter(|v| v.get("headers").is_some())
        .unwrap_or_else(|| {
            serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap()
        });
    let headers = &headers["headers"];
    assert!(headers.is_object(), "{r}");
    assert_eq!(
        headers["x-upstream-key"], "configured-upstream-credential",
        "configured upstream headers are sent: {headers}"
    );
    let all = headers.to_string();
    assert!(
        !all.contains(&token),
        "the agent's token reached the upstream: {all}"
    );
    assert!(
        headers.get("authorization").is_none(),
        "no Authorization header goes upstream: {headers}"
    );
    assert!(!r.to_string().contains(&token));
}
