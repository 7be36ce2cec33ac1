//! Seven (or `--count N`) sequential registrations in one process, each with its own tool,
//! each reached over real HTTP+SSE by a real MCP client (rmcp's legacy SSE client): each lists
//! only its own tool, calls it, is released, and its path then answers 404.
//!
//! `cargo run --example shared_gateway [-- --count 1000]` prints `gw N: OK` per registration
//! and exits non-zero if any is not OK.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use gatehouse::{Config, Gateway, InProcessTool, RegistrationSpec, ToolResult};
use rmcp_legacy_sse::model::{CallToolRequestParam, ClientInfo};
use rmcp_legacy_sse::transport::{sse_client::SseClientConfig, SseClientTransport};
use rmcp_legacy_sse::ServiceExt;
use serde_json::{json, Value};

fn tool_for(i: usize) -> InProcessTool {
    InProcessTool::new(
        &format!("whoami_{i}"),
        "Says which registration it belongs to",
        json!({"type":"object","properties":{"text":{"type":"string"}}}),
        move |args, ctx| async move {
            let text = args.get("text").and_then(Value::as_str).unwrap_or("");
            Ok(ToolResult::text(format!(
                "gw {i} ({}) says {text}",
                ctx.agent_id
            )))
        },
    )
}

async fn one(gw: &Gateway, i: usize) -> Result<(), String> {
    let reg = gw
        .register(RegistrationSpec::new(format!("demo-agent-{i}")).with_tool(tool_for(i)))
        .await
        .map_err(|e| format!("register: {e}"))?;
    let mut headers = reqwest::header::HeaderMap::new();
    let auth = format!("Bearer {}", reg.token());
    headers.insert(
        reqwest::header::AUTHORIZATION,
        auth.parse().map_err(|e| format!("header: {e}"))?,
    );
    let http = reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .map_err(|e| format!("http client: {e}"))?;
    let transport = SseClientTransport::start_with_client(
        http.clone(),
        SseClientConfig {
            sse_endpoint: reg.sse_url().into(),
            ..Default::default()
        },
    )
    .await
    .map_err(|e| format!("sse connect: {e}"))?;
    let client = ClientInfo::default()
        .serve(transport)
        .await
        .map_err(|e| format!("initialize: {e}"))?;
    let tools = client
        .list_tools(Default::default())
        .await
        .map_err(|e| format!("tools/list: {e}"))?;
    let names: Vec<String> = tools.tools.iter().map(|t| t.name.to_string()).collect();
    let want = format!("whoami_{i}");
    if names != vec![want.clone()] {
        return Err(format!("tools/list shows {names:?}, expected only {want}"));
    }
    let args = json!({"text": "hello"});
    let result = client
        .call_tool(CallToolRequestParam {
            name: want.into(),
            arguments: args.as_object().cloned(),
        })
        .await
        .map_err(|e| format!("tools/call: {e}"))?;
    let text = serde_json::to_value(&result.content)
        .ok()
        .and_then(|v| v[0]["text"].as_str().map(str::to_string))
        .unwrap_or_default();
    let expected = format!("gw {i} (demo-agent-{i}) says hello");
    if text != expected {
        return Err(format!(
            "tools/call answered {text:?}, expected {expected:?}"
        ));
    }
    let _ = client.cancel().await;
    let url = reg.sse_url();
    reg.release().await;
    let status = http
        .get(&url)
        .send()
        .await
        .map_err(|e| format!("after release: {e}"))?
        .status();
    if status != 404 {
        return Err(format!(
            "after release the path answered {status}, expected 404"
        ));
    }
    Ok(())
}

fn main() -> ExitCode {
    let mut count = 7usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next().and_then(|v| v.parse().ok())) {
            ("--count", Some(n)) => count = n,
            _ => {
                eprintln!("usage: shared_gateway [--count N]");
                return ExitCode::from(2);
            }
        }
    }
    let Ok(rt) = tokio::runtime::Runtime::new() else {
        eprintln!("cannot start a runtime");
        return ExitCode::FAILURE;
    };
    rt.block_on(async move {
        let dir = std::env::temp_dir().join(format!("gatehouse-demo-{}", std::process::id()));
        let mut config = Config::default();
        config.audit.path = dir.join("audit.jsonl");
        let gw = match Gateway::new(config) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("gateway: {e}");
                return ExitCode::FAILURE;
            }
        };
        let started = Instant::now();
        let mut failed = 0;
        for i in 1..=count {
            match tokio::time::timeout(Duration::from_secs(30), one(&gw, i)).await {
                Ok(Ok(())) => println!("gw {i}: OK"),
                Ok(Err(e)) => {
                    failed += 1;
                    println!("gw {i}: FAILED: {e}");
                }
                Err(_) => {
                    failed += 1;
                    println!("gw {i}: FAILED: timed out");
                }
            }
        }
        let calls = gatehouse::testing::audit::read_records(&config_path(&dir))
            .map(|r| r.iter().filter(|r| r.event == "governed_mcp_call").count())
            .unwrap_or(0);
        println!(
            "{} registrations, {} OK, {failed} failed, {calls} audited calls, {:.2}s, server started {} time(s)",
            count,
            count - failed,
            started.elapsed().as_secs_f64(),
            gw.server_starts()
        );
        let _ = std::fs::remove_dir_all(&dir);
        if failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    })
}

fn config_path(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("audit.jsonl")
}
