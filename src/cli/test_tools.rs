//! In-process tools that `gatehouse serve --test-tools` (a hidden flag) adds to the catalog,
//! so the daemon can be driven end to end without any upstream: `demo.echo`, `demo.slow`
//! (sleeps, honours cancellation) and `demo.block` (blocks its worker thread, ignoring
//! cancellation: the case a forced shutdown exists for).

use std::time::Duration;

use serde_json::{json, Value};

use crate::tools::{InProcessTool, ToolResult};

pub fn all() -> Vec<InProcessTool> {
    vec![echo(), slow(), block()]
}

fn ms_arg(args: &Value) -> u64 {
    args.get("ms")
        .and_then(Value::as_u64)
        .unwrap_or(1000)
        .min(600_000)
}

fn echo() -> InProcessTool {
    InProcessTool::new(
        "demo.echo",
        "Echoes its text",
        json!({"type":"object","properties":{"text":{"type":"string"}}}),
        |args, ctx| async move {
            let text = args.get("text").and_then(Value::as_str).unwrap_or("");
            Ok(ToolResult::text(format!("{}:{text}", ctx.agent_id)))
        },
    )
}

fn slow() -> InProcessTool {
    InProcessTool::new(
        "demo.slow",
        "Sleeps for ms milliseconds; stops when cancelled",
        json!({"type":"object","properties":{"ms":{"type":"integer"}}}),
        |args, ctx| async move {
            tokio::select! {
                _ = ctx.cancel.cancelled() => Ok(ToolResult::text("cancelled")),
                _ = tokio::time::sleep(Duration::from_millis(ms_arg(&args))) => Ok(ToolResult::text("done")),
            }
        },
    )
}

fn block() -> InProcessTool {
    InProcessTool::new(
        "demo.block",
        "Blocks its thread for ms milliseconds, ignoring cancellation (tests forced shutdown)",
        json!({"type":"object","properties":{"ms":{"type":"integer"}}}),
        |args, _ctx| async move {
            std::thread::sleep(Duration::from_millis(ms_arg(&args)));
            Ok(ToolResult::text("done"))
        },
    )
}
