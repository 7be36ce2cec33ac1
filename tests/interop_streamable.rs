//! Clients written by others against /gw/<id>/mcp (and /sse): rmcp 3.x over Streamable HTTP,
//! and the Python `mcp` SDK (`sse_client`, `streamable_http_client`, and the high-level
//! `Client` that probes `server/discover` first) via tests/peers/py_client.py.
//! A missing peer environment fails the test: run tests/peers/setup.sh.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::peers::python;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use gatehouse::{Registration, RegistrationSpec};
use rmcp::model::CallToolRequestParams;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::{json, Value};

async fn registration(tg: &TestGateway) -> Registration {
    tg.gateway
        .register(
            RegistrationSpec::new("interop")
                .with_tool(echo_tool("echo", "E"))
                .with_tool(slow_tool("slow")),
        )
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcp_streamable_http_client() {
    let tg = TestGateway::start();
    let reg = registration(&tg).await;
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(reg.mcp_url()).auth_header(reg.token()),
    );
    let client = ().serve(transport).await.expect("rmcp connects");
    let tools: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(tools, vec!["echo", "slow"]);
    let args = json!({"text": "from rmcp"}).as_object().unwrap().clone();
    let r = client
        .call_tool(CallToolRequestParams::new("echo").with_arguments(args))
        .await
        .unwrap();
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["content"][0]["text"], "E:from rmcp", "{v}");
    let calls = tg.calls();
    assert_eq!(calls.len(), 1);
    let transport = calls[0].transport.clone().unwrap();
    // rmcp 3.11 speaks the handshake era (initialize + Mcp-Session-Id).
    assert_eq!(transport, "streamable_http");
    client.cancel().await.unwrap();
}

async fn py_client(transport: &str, url: &str, token: &str, extra: &[&str]) -> Value {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(root.join("tests/peers/py_client.py"))
        .args(["--transport", transport, "--url", url])
        // `--token=…`, one argument: a token may begin with `-` (base64url), which argparse
        // would take for an option.
        .arg(format!("--token={token}"))
        .args(["--timeout", "20"])
        .args(extra)
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(40), cmd.output())
        .await
        .expect("py_client finished")
        .expect("py_client ran");
    assert!(
        out.status.success(),
        "py_client --transport {transport} {extra:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn assert_served(v: &Value, what: &str) {
    assert_eq!(v["tools"], json!(["echo", "slow"]), "{what}: {v}");
    assert_eq!(v["call"]["content"][0]["text"], "done", "{what}: {v}");
    let progress = v["progress"].as_array().unwrap();
    assert_eq!(progress.len(), 10, "{what}: progress forwarded: {v}");
    assert_eq!(progress[9]["progress"].as_f64(), Some(10.0), "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_sse_streamable_and_probing_client() {
    let tg = TestGateway::start();
    let reg = registration(&tg).await;
    let call = ["--call", "slow", "--args", r#"{"ms":300}"#, "--progress"];

    let v = py_client("sse", &reg.sse_url(), reg.token(), &call).await;
    assert_served(&v, "sse_client");

    let v = py_client("streamable", &reg.mcp_url(), reg.token(), &call).await;
    assert_served(&v, "streamable_http_client");
    assert_eq!(v["protocol_version"], "2025-11-25");

    // mcp.Client probes server/discover: the gateway answers, so it stays stateless.
    let v = py_client("client", &reg.mcp_url(), reg.token(), &call).await;
    assert_served(&v, "Client (auto)");
    assert_eq!(v["protocol_version"], "2026-07-28", "{v}");
    // ...and forced onto the handshake era it works too.
    let mut legacy = call.to_vec();
    legacy.extend(["--mode", "legacy"]);
    let v = py_client("client", &reg.mcp_url(), reg.token(), &legacy).await;
    assert_served(&v, "Client (legacy)");

    let transports: Vec<String> = tg
        .calls()
        .iter()
        .map(|c| c.transport.clone().unwrap().into())
        .collect();
    assert!(
        transports.contains(&"stateless".to_string()),
        "{transports:?}"
    );
    assert!(
        transports.contains(&"streamable_http".to_string()),
        "{transports:?}"
    );
    assert!(transports.contains(&"sse".to_string()), "{transports:?}");
    // Every Python session is gone or idle; nothing stateless was left behind.
    assert!(
        gatehouse::testing::sessions(&tg.gateway).len() <= 2,
        "{}",
        gatehouse::testing::sessions(&tg.gateway).len()
    );
}
