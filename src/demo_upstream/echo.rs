//! The echo server's answers (a lean server for benchmarks).

use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};

use super::wire::*;
use crate::protocol::jsonrpc::Message;
use crate::protocol::RpcError;

/// A minimal MCP server with one tool, `echo {message: string}`, which returns the message as
/// text. Requests are handled one after another in arrival order (pipelining keeps order); output
/// is flushed whenever no further complete request is already buffered. Runs until EOF.
///
/// # Errors
/// Reading the input or writing the output fails.
pub async fn serve_echo<R, W>(reader: R, writer: W) -> anyhow::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut lines = LineReader::new(reader);
    let mut out = BufWriter::new(writer);
    while let Some(frame) = lines.next_frame().await? {
        let reply = match decode(frame) {
            Decoded::Reply(reply) => Some(reply),
            Decoded::Skip => None,
            Decoded::Message(Message::Request { id, method, params }) => {
                Some(match echo_request(&method, params.as_ref()) {
                    Ok(result) => response(id, result),
                    Err(err) => error_response(id, err),
                })
            }
            Decoded::Message(Message::Notification { .. } | Message::Response { .. }) => None,
        };
        if let Some(reply) = reply {
            let mut line = reply.to_string();
            line.push('\n');
            out.write_all(line.as_bytes()).await?;
        }
        if !lines.has_buffered_line() {
            out.flush().await?;
        }
    }
    out.flush().await?;
    out.shutdown().await?;
    Ok(())
}

/// [`serve_echo`] on the process's stdin/stdout (logs go to stderr only).
///
/// # Errors
/// As [`serve_echo`].
pub async fn run_echo_stdio() -> anyhow::Result<()> {
    init_stderr_logging();
    serve_echo(tokio::io::stdin(), tokio::io::stdout()).await
}

pub(super) fn echo_request(method: &str, params: Option<&Value>) -> Result<Value, RpcError> {
    match method {
        "initialize" => Ok(initialize_result(
            params,
            "gatehouse-echo",
            json!({ "tools": {} }),
            "Echo server for benchmarks.",
        )),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({ "tools": [{
            "name": "echo",
            "description": "Return the message unchanged.",
            "inputSchema": {
                "type": "object",
                "properties": { "message": { "type": "string" } },
                "required": ["message"],
                "additionalProperties": false
            },
            "annotations": { "readOnlyHint": true, "openWorldHint": false }
        }] })),
        "tools/call" => {
            let params = params.and_then(Value::as_object);
            let name = params.and_then(|p| p.get("name")).and_then(Value::as_str);
            match name {
                Some("echo") => {}
                Some(other) => {
                    return Err(RpcError::invalid_params(format!("Unknown tool: {other}")))
                }
                None => {
                    return Err(RpcError::invalid_params(
                        "tools/call needs a string \"name\"",
                    ))
                }
            }
            let message = params
                .and_then(|p| p.get("arguments"))
                .and_then(|a| a.get("message"));
            Ok(match message {
                Some(Value::String(message)) => json!({
                    "content": [{ "type": "text", "text": message }],
                    "isError": false
                }),
                _ => json!({
                    "content": [{ "type": "text", "text": "invalid arguments: missing required argument \"message\" (string)" }],
                    "isError": true
                }),
            })
        }
        other => Err(RpcError::method_not_found(format!(
            "Method not found: {other}"
        ))),
    }
}
