//! An embedded gateway for the official MCP conformance suite (`tests/conformance/run.sh`).
//!
//! One registration whose tools come, over stdio, from the upstream command given after `--`
//! (the Python SDK's `tests/peers/conformance_server.py stdio`), exposed under their own names
//! (`bare_names`) because the suite calls fixed tool names. Prints one JSON line on stdout,
//! `{"mcp_url": ..., "sse_url": ..., "token": ...}`, then serves until stdin closes.
//!
//! `cargo run --example conformance_gateway -- python3 tests/peers/conformance_server.py stdio`
//! (`--declare elicitation` first: what the upstream connection declares)

use std::process::ExitCode;

use gatehouse::config::UpstreamConfig;
use gatehouse::{Config, Gateway, RegistrationSpec};
use serde_json::json;
use tokio::io::AsyncReadExt;

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    // `--declare CAPS`: the client capabilities the upstream connection declares (it is then
    // the registration's own, `per_registration`),
    // comma-separated (tests/fixtures/task_server.py's askers need `elicitation`).
    let mut declare: Option<Vec<String>> = None;
    if argv.first().map(String::as_str) == Some("--declare") && argv.len() > 1 {
        declare = Some(argv[1].split(',').map(str::to_string).collect());
        argv.drain(..2);
    }
    if argv.first().map(String::as_str) == Some("--") {
        argv.remove(0);
    }
    if argv.is_empty() {
        eprintln!("usage: conformance_gateway [--] UPSTREAM_COMMAND [ARGS...]");
        return ExitCode::from(2);
    }
    let command = argv.remove(0);
    let upstream: UpstreamConfig = match serde_json::from_value(json!({
        "id": "conformance",
        "command": command,
        "args": argv,
        // One registration either way; a connection that declares client capabilities is
        // the registration's own.
        "sharing": if declare.is_some() { "per_registration" } else { "shared" },
        "bare_names": true,
        "call_timeout_s": 60,
        "client_capabilities": declare,
    })) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("conformance_gateway: {e}");
            return ExitCode::FAILURE;
        }
    };
    let dir = std::env::temp_dir().join(format!("gatehouse-conformance-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let mut config = Config::default();
    config.audit.path = dir.join("audit.jsonl");
    config.audit.fsync = gatehouse::config::FsyncPolicy::Never;
    config.upstreams = vec![upstream];
    let gw = match Gateway::new(config) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("conformance_gateway: {e}");
            return ExitCode::FAILURE;
        }
    };
    let reg = match gw
        .register(RegistrationSpec::new("conformance-suite").grant("conformance.*"))
        .await
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("conformance_gateway: register: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "{}",
        json!({"mcp_url": reg.mcp_url(), "sse_url": reg.sse_url(), "token": reg.token(), "tools": reg.tools()})
    );
    // Serve until stdin closes (the harness holds it open) or SIGINT/SIGTERM arrives; each
    // ends in the graceful shutdown below, which tears the upstream's process group down (stdin
    // closed, then SIGTERM, then SIGKILL, `shutdown_grace_s` apart), so no upstream outlives
    // this process (run.sh checks it).
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 64];
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("conformance_gateway: SIGTERM handler: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::select! {
        _ = async { while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {} } => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    drop(reg);
    gw.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    ExitCode::SUCCESS
}
