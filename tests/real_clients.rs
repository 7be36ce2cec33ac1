//! Clients and servers written by others, end to end through the gateway (issue 18 item 8):
//! the official Python SDK 1.x (`tests/peers/mcp1_client.py`, own venv) over legacy SSE and
//! Streamable HTTP, fastmcp 4.x (`tests/peers/fastmcp_client.py`) over Streamable HTTP (where
//! it settles on 2026-07-28, stateless) and legacy SSE, against an upstream written with
//! fastmcp (`tests/peers/burst_server.py`, stdio). mcp-remote is driven by tests/oauth.rs.
//! A missing peer fails the test: run tests/peers/setup.sh.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use gatehouse::{Registration, RegistrationSpec};
use serde_json::Value;

fn gateway() -> TestGateway {
    TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.upstreams = vec![burst()];
    })
}

async fn registration(tg: &TestGateway) -> Registration {
    tg.gateway
        .register(RegistrationSpec::new("real-clients").grant("burst.*"))
        .await
        .unwrap()
}

/// Runs a Python peer; its one JSON line.
async fn run_py(venv: &str, script: &str, args: &[String]) -> Value {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(common::peers::peer(&format!("{venv}/bin/python")))
            .arg(common::peers::peer(script))
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the peer finishes")
    .unwrap();
    assert!(
        out.status.success(),
        "{script} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

pub async fn mcp1(transport: &str, reg: &Registration, call: &str, args: &str) -> Value {
    let url = if transport == "sse" {
        reg.sse_url()
    } else {
        reg.mcp_url()
    };
    // `--token=…`: a base64url token may begin with `-`, which argparse would read as an option.
    let token = format!("--token={}", reg.token());
    let a = [
        "--transport",
        transport,
        "--url",
        &url,
        &token,
        "--call",
        call,
        "--args",
        args,
        "--progress",
    ];
    run_py(".venv-mcp1", "mcp1_client.py", &a.map(String::from)).await
}

pub async fn fastmcp(url: &str, reg: &Registration, call: &str, args: &str) -> Value {
    let token = format!("--token={}", reg.token());
    let a = [
        "--url",
        url,
        &token,
        "--call",
        call,
        "--args",
        args,
        "--progress",
    ];
    run_py(".venv-fastmcp", "fastmcp_client.py", &a.map(String::from)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_1x_over_sse_and_streamable_http() {
    let tg = gateway();
    let reg = registration(&tg).await;
    for transport in ["sse", "streamable"] {
        let out = mcp1(transport, &reg, "burst.echo", r#"{"message":"hi"}"#).await;
        assert_eq!(
            out["tools"],
            serde_json::json!(["burst.burst", "burst.echo"]),
            "{out}"
        );
        assert_eq!(out["call"]["content"][0]["text"], "hi", "{out}");
        assert_eq!(out["protocol_version"], "2025-11-25", "{out}");
    }
    let transports: Vec<String> = tg
        .calls()
        .iter()
        .map(|r| r.transport.clone().unwrap().into())
        .collect();
    assert_eq!(transports, vec!["sse", "streamable_http"]);
    tg.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastmcp_client_stateless_and_over_sse() {
    let tg = gateway();
    let reg = registration(&tg).await;
    let out = fastmcp(&reg.mcp_url(), &reg, "burst.echo", r#"{"message":"hi"}"#).await;
    assert_eq!(out["call"]["content"][0]["text"], "hi", "{out}");
    assert_eq!(
        out["tools"],
        serde_json::json!(["burst.burst", "burst.echo"])
    );
    let out = fastmcp(&reg.sse_url(), &reg, "burst.echo", r#"{"message":"hi"}"#).await;
    assert_eq!(out["call"]["content"][0]["text"], "hi", "{out}");
    let transports: Vec<String> = tg
        .calls()
        .iter()
        .map(|r| r.transport.clone().unwrap().into())
        .collect();
    // fastmcp settles on 2026-07-28 on /mcp (the gateway answers server/discover).
    assert_eq!(transports, vec!["stateless", "sse"]);
    tg.gateway.shutdown().await;
}
