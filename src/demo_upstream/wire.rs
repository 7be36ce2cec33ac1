//! JSON-RPC over stdio lines, shared by both servers: bounded line framing and decoding
//! (classification is the gateway's own, `crate::protocol::jsonrpc`).

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

use crate::protocol::jsonrpc::Message;
use crate::protocol::RpcError;

/// Protocol revisions echoed back when a client asks for them; anything else gets the latest.
pub(super) const SUPPORTED_VERSIONS: [&str; 4] =
    ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
pub(super) const LATEST_VERSION: &str = "2025-11-25";
/// Longest accepted input line; longer lines are answered with a parse error and skipped.
pub(super) const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;

pub(super) fn initialize_result(
    params: Option<&Value>,
    name: &str,
    capabilities: Value,
    instructions: &str,
) -> Value {
    let requested = params
        .and_then(|p| p.get("protocolVersion"))
        .and_then(Value::as_str);
    let version = requested
        .filter(|v| SUPPORTED_VERSIONS.contains(v))
        .unwrap_or(LATEST_VERSION);
    json!({
        "protocolVersion": version,
        "capabilities": capabilities,
        "serverInfo": { "name": name, "version": env!("CARGO_PKG_VERSION") },
        "instructions": instructions
    })
}

pub(super) fn response(id: Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

pub(super) fn error_response(id: Value, err: RpcError) -> Value {
    err.to(id).to_value()
}

/// What to do with one input line.
pub(super) enum Decoded {
    Message(Message),
    /// Answer at once (parse error / invalid request).
    Reply(Value),
    /// Blank line.
    Skip,
}

pub(super) fn decode(frame: Frame) -> Decoded {
    let line = match frame {
        Frame::Line(line) => line,
        Frame::TooLong => {
            return Decoded::Reply(error_response(
                Value::Null,
                RpcError::parse_error(format!(
                    "Parse error: line longer than {MAX_LINE_BYTES} bytes"
                )),
            ))
        }
    };
    if line.iter().all(u8::is_ascii_whitespace) {
        return Decoded::Skip;
    }
    let value: Value = match serde_json::from_slice(&line) {
        Ok(value) => value,
        Err(err) => {
            tracing::debug!(error = %err, "unparsable input line");
            return Decoded::Reply(error_response(
                Value::Null,
                RpcError::parse_error("Parse error"),
            ));
        }
    };
    // The gateway's own classification: the same rules, one place.
    match crate::protocol::jsonrpc::classify(value) {
        Ok(msg) => Decoded::Message(msg),
        Err(e) => Decoded::Reply(e.to_value()),
    }
}

/// One input line, without its newline.
pub(super) enum Frame {
    Line(Vec<u8>),
    /// A line over [`MAX_LINE_BYTES`], already skipped.
    TooLong,
}

/// Splits the input into lines with a length bound. Cancel-safe: all state lives in `self`.
pub(super) struct LineReader<R> {
    pub(super) inner: BufReader<R>,
    pub(super) buf: Vec<u8>,
    pub(super) discarding: bool,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub(super) fn new(reader: R) -> Self {
        Self {
            inner: BufReader::new(reader),
            buf: Vec::new(),
            discarding: false,
        }
    }

    /// The next line, or `None` at EOF. A final line without a newline still counts.
    pub(super) async fn next_frame(&mut self) -> std::io::Result<Option<Frame>> {
        loop {
            let available = self.inner.fill_buf().await?;
            if available.is_empty() {
                return Ok(if std::mem::take(&mut self.discarding) {
                    Some(Frame::TooLong)
                } else if self.buf.is_empty() {
                    None
                } else {
                    Some(Frame::Line(std::mem::take(&mut self.buf)))
                });
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let chunk = &available[..newline.unwrap_or(available.len())];
            if !self.discarding {
                if self.buf.len() + chunk.len() > MAX_LINE_BYTES {
                    self.discarding = true;
                    self.buf = Vec::new();
                } else {
                    self.buf.extend_from_slice(chunk);
                }
            }
            let consumed = newline.map_or(available.len(), |i| i + 1);
            self.inner.consume(consumed);
            if newline.is_some() {
                return Ok(Some(if std::mem::take(&mut self.discarding) {
                    Frame::TooLong
                } else {
                    Frame::Line(std::mem::take(&mut self.buf))
                }));
            }
        }
    }

    /// True when a complete line is already buffered (reading it will not wait for input).
    pub(super) fn has_buffered_line(&self) -> bool {
        self.inner.buffer().contains(&b'\n')
    }
}

/// Install a stderr `tracing` subscriber filtered by `RUST_LOG` unless one is already set.
pub(super) fn init_stderr_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // An error only means the binary installed its own subscriber first.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}
