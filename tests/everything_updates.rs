//! Issue 18 items 2, 3 and 5 with a real upstream and a real client: server-everything
//! (`toggle-subscriber-updates`, `toggle-simulated-logging`: every 5 s, outside any call, a
//! `notifications/resources/updated` for each subscribed URI and a log) on `per_registration`
//! connections, and three real clients, one registration each, all at once: the official
//! Python SDK 2.x (legacy SSE, Streamable HTTP, a 2026-07-28 `subscriptions/listen` stream)
//! and 1.x (legacy SSE, Streamable HTTP) through tests/peers/updates_client.py, and fastmcp 4.x
//! (legacy SSE; Streamable HTTP, where it settles on 2026-07-28 and listens) through
//! tests/peers/fastmcp_updates.py.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use gatehouse::config::UpstreamConfig;
use gatehouse::RegistrationSpec;
use serde_json::Value;

const URI: &str = "demo://resource/dynamic/text/1";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn everything() -> UpstreamConfig {
    let script = root()
        .join("tests/peers/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        script.exists(),
        "run tests/peers/setup.sh first ({} missing)",
        script.display()
    );
    toml::from_str(&format!(
        "id = \"everything\"\ncommand = \"node\"\nargs = [{:?}, \"stdio\"]\nsharing = \"per_registration\"\ncall_timeout_s = 30\n",
        script.display().to_string()
    ))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_updates_and_logs_reach_the_sdks_on_every_transport() {
    let py2 = root().join("tests/peers/.venv/bin/python");
    let py1 = root().join("tests/peers/.venv-mcp1/bin/python");
    let pyf = root().join("tests/peers/.venv-fastmcp/bin/python");
    for py in [&py2, &py1, &pyf] {
        assert!(
            py.exists(),
            "run tests/peers/setup.sh first ({} missing)",
            py.display()
        );
    }
    let tg = TestGateway::with(|c| {
        c.upstreams = vec![everything()];
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
    });
    let mut runs = Vec::new();
    let mut regs = Vec::new();
    for (sdk, py, transport) in [
        ("2.x", &py2, "sse"),
        ("2.x", &py2, "streamable"),
        ("2.x", &py2, "listen"),
        ("1.x", &py1, "sse"),
        ("1.x", &py1, "streamable"),
        ("fastmcp", &pyf, "sse"),
        ("fastmcp", &pyf, "listen"),
    ] {
        let reg = tg
            .gateway
            .register(
                RegistrationSpec::new(format!("agent-{sdk}-{transport}")).grant("everything.*"),
            )
            .await
            .unwrap();
        let mut cmd = tokio::process::Command::new(py);
        if sdk == "fastmcp" {
            // fastmcp picks the transport from the URL (Streamable HTTP: it settles on
            // 2026-07-28, so its updates come on a listen stream).
            let url = match transport {
                "sse" => reg.sse_url(),
                _ => reg.mcp_url(),
            };
            cmd.arg(root().join("tests/peers/fastmcp_updates.py"))
                .args(["--url", &url, "--uri", URI]);
        } else {
            cmd.arg(root().join("tests/peers/updates_client.py")).args([
                "--transport",
                transport,
                "--url",
                &reg.mcp_url(),
                "--uri",
                URI,
            ]);
        }
        cmd.arg(format!("--token={}", reg.token()))
            .args(["--seconds", "25"])
            .kill_on_drop(true);
        runs.push((
            format!("{sdk} {transport}"),
            tokio::spawn(async move {
                tokio::time::timeout(Duration::from_secs(60), cmd.output()).await
            }),
        ));
        regs.push(reg);
    }
    for (transport, run) in runs {
        let out = run
            .await
            .unwrap()
            .expect("the client ended in time")
            .unwrap();
        assert!(
            out.status.success(),
            "{transport}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        eprintln!("{transport}: {v}");
        assert!(
            v["updated"].as_u64().unwrap() >= 1,
            "{transport}: no resource update: {v}"
        );
        assert!(
            v["updated_uris"]
                .as_array()
                .unwrap()
                .iter()
                .all(|u| u == URI),
            "{transport}: only the subscribed URI: {v}"
        );
        if transport.ends_with("listen") {
            assert_eq!(v["protocol_version"], "2026-07-28", "{v}");
            assert_eq!(v["honored"]["resourceSubscriptions"][0], URI, "{v}");
            assert_eq!(v["logs"], 0, "logs never go on a listen stream: {v}");
        } else {
            assert!(
                v["logs"].as_u64().unwrap() >= 1,
                "{transport}: no out-of-call log: {v}"
            );
        }
    }
}
