//! In-process tools that `gatehouse serve --test-tools` (a hidden flag) adds to the catalog,
//! so the daemon can be driven end to end without any upstream: `demo.echo`, `demo.slow`
//! (sleeps, honours cancellation) and `demo.block` (blocks its worker thread, ignoring
//! cancellation: the case a forced shutdown exists for).

use std::time::Duration;

use serde_json::{json, Value};

use crate::tools::{InProcessTool, ToolContext, ToolError, ToolResult};

pub fn all() -> Vec<InProcessTool> {
    const BLOCK: &str =
        "Blocks its thread for ms milliseconds, ignoring cancellation (tests forced shutdown)";
    const SLOW: &str = "Sleeps for ms milliseconds; stops when cancelled";
    vec![
        demo("demo.echo", "Echoes its text", ("text", "string"), echo),
        demo("demo.slow", SLOW, ("ms", "integer"), slow),
        demo("demo.block", BLOCK, ("ms", "integer"), block),
    ]
}

/// A demo tool taking one argument: its name and JSON type.
fn demo<F, Fut>(name: &str, description: &str, arg: (&str, &str), f: F) -> InProcessTool
where
    F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<ToolResult, ToolError>> + Send + 'static,
{
    let schema = json!({"type": "object", "properties": {arg.0: {"type": arg.1}}});
    InProcessTool::new(name, description, schema, f)
}

fn ms_arg(args: &Value) -> u64 {
    args.get("ms")
        .and_then(Value::as_u64)
        .unwrap_or(1000)
        .min(600_000)
}

async fn echo(args: Value, ctx: ToolContext) -> Result<ToolResult, ToolError> {
    let text = args.get("text").and_then(Value::as_str).unwrap_or("");
    Ok(ToolResult::text(format!("{}:{text}", ctx.agent_id)))
}

async fn slow(args: Value, ctx: ToolContext) -> Result<ToolResult, ToolError> {
    let sleep = tokio::time::sleep(Duration::from_millis(ms_arg(&args)));
    tokio::select! {
        _ = ctx.cancel.cancelled() => Ok(ToolResult::text("cancelled")),
        _ = sleep => Ok(ToolResult::text("done")),
    }
}

async fn block(args: Value, _ctx: ToolContext) -> Result<ToolResult, ToolError> {
    std::thread::sleep(Duration::from_millis(ms_arg(&args)));
    Ok(ToolResult::text("done"))
}
