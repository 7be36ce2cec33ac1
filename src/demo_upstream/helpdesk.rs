//! The helpdesk's protocol handling: requests, notifications, its tools and their calls.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::desk::*;
use super::wire::*;
use crate::protocol::jsonrpc::Message;
use crate::protocol::RpcError;

/// Key of the lease capability in `capabilities.experimental`.
pub use crate::protocol::meta::LEASE as LEASE_CAPABILITY;
/// `_meta` key carrying the lease id on every request.
pub use crate::protocol::meta::LEASE as LEASE_META_KEY;
/// Notification releasing a lease: `{"lease": id}`.
pub const LEASE_RELEASED_METHOD: &str = "notifications/io.gatehouse/lease_released";
/// Request `_meta` flag (`true`) asking for the request's `_meta` to be echoed in the result.
pub const TEST_ECHO_META_KEY: &str = "io.gatehouse.test/echo_meta";
/// Result `_meta` key holding the echoed request `_meta`.
pub const TEST_SEEN_META_KEY: &str = "io.gatehouse.test/seen_meta";

/// Requests handled at once; the reader waits for a slot beyond that (backpressure).
const MAX_IN_FLIGHT: usize = 256;
/// Lines queued for the writer task.
const OUTBOX_CAPACITY: usize = 1024;
/// Spacing of `notifications/progress` during `add_note_slow`.
const PROGRESS_INTERVAL_MS: u64 = 100;
/// Upper bound for `slow_ms` (keeps deadline arithmetic far from overflow).
const MAX_SLOW_MS: u64 = 24 * 60 * 60 * 1000;

/// How the helpdesk behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelpdeskOptions {
    /// Advertise and honour the `io.gatehouse/lease` extension (default `true`).
    pub lease_extension: bool,
    /// Duration of `add_note_slow` in milliseconds (default 2000, capped at 24 h).
    pub slow_ms: u64,
}

impl Default for HelpdeskOptions {
    fn default() -> Self {
        Self {
            lease_extension: true,
            slow_ms: 2000,
        }
    }
}

/// Serve MCP over newline-delimited JSON-RPC on the given reader/writer until EOF on the reader.
///
/// Requests run concurrently (each in a task owned by this call); all output goes through one
/// writer task, so lines never interleave. At EOF, `add_note_slow` calls still sleeping are
/// abandoned (no note, no response); every other request is answered before this returns.
///
/// # Errors
/// Reading the input fails, or the output fails while the input is still open.
pub async fn serve<R, W>(reader: R, writer: W, opts: HelpdeskOptions) -> anyhow::Result<()>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<String>(OUTBOX_CAPACITY);
    let mut writer_task = JoinSet::new();
    writer_task.spawn(write_lines(writer, rx));

    let ctx = Arc::new(Ctx {
        opts: HelpdeskOptions {
            slow_ms: opts.slow_ms.min(MAX_SLOW_MS),
            ..opts
        },
        desk: Desk::default(),
        outbox: Outbox { tx },
        shutdown: CancellationToken::new(),
    });
    let in_flight = InFlight::default();
    let mut requests: JoinSet<()> = JoinSet::new();
    let mut lines = LineReader::new(reader);
    tracing::info!(
        lease_extension = ctx.opts.lease_extension,
        slow_ms = ctx.opts.slow_ms,
        "helpdesk serving"
    );

    let read_result: anyhow::Result<()> = loop {
        let frame = tokio::select! {
            frame = lines.next_frame() => frame,
            Some(joined) = requests.join_next(), if !requests.is_empty() => {
                log_join(joined);
                continue;
            }
            () = ctx.outbox.tx.closed() => {
                break Err(anyhow::anyhow!("output closed while input still open"));
            }
        };
        let frame = match frame {
            Ok(Some(frame)) => frame,
            Ok(None) => break Ok(()),
            Err(err) => break Err(anyhow::Error::new(err).context("reading input")),
        };
        let msg = match decode(frame) {
            Decoded::Message(msg) => msg,
            Decoded::Skip => continue,
            Decoded::Reply(reply) => {
                ctx.outbox.send(reply).await;
                continue;
            }
        };
        match msg {
            Message::Request { id, method, params } => {
                while requests.len() >= MAX_IN_FLIGHT {
                    if let Some(joined) = requests.join_next().await {
                        log_join(joined);
                    }
                }
                let guard = in_flight.register(&id);
                let span =
                    tracing::debug_span!("request", jsonrpc.method = %method, jsonrpc.id = %id);
                let ctx = Arc::clone(&ctx);
                requests.spawn(
                    async move {
                        handle_request(&ctx, &guard, id, &method, params).await;
                        drop(guard);
                    }
                    .instrument(span),
                );
            }
            Message::Notification { method, params } => {
                handle_notification(&ctx, &in_flight, &method, params.as_ref());
            }
            Message::Response { .. } => tracing::debug!("ignoring a response from the client"),
        }
    };

    // Stop slow work, answer what is left, then let the writer drain and close.
    ctx.shutdown.cancel();
    while let Some(joined) = requests.join_next().await {
        log_join(joined);
    }
    drop(ctx);
    let write_result = match writer_task.join_next().await {
        Some(Ok(result)) => result,
        Some(Err(join_err)) => Err(std::io::Error::other(join_err)),
        None => Ok(()),
    };
    tracing::info!("helpdesk input closed");
    if let Err(err) = write_result {
        // The input is closed too, so the client is gone; nothing left to report to.
        tracing::debug!(error = %err, "output failed after input closed");
    }
    read_result
}

/// [`serve`] on the process's stdin/stdout (logs go to stderr only).
///
/// Installs a stderr `tracing` subscriber (filter from `RUST_LOG`, default `warn`) unless the
/// process already has one.
///
/// # Errors
/// As [`serve`].
pub async fn run_stdio(opts: HelpdeskOptions) -> anyhow::Result<()> {
    init_stderr_logging();
    serve(tokio::io::stdin(), tokio::io::stdout(), opts).await
}

pub(super) struct Ctx {
    pub(super) opts: HelpdeskOptions,
    pub(super) desk: Desk,
    pub(super) outbox: Outbox,
    /// Cancelled when the input reaches EOF: slow work stops.
    pub(super) shutdown: CancellationToken,
}

/// The sending side of the single writer task.
pub(super) struct Outbox {
    pub(super) tx: mpsc::Sender<String>,
}

impl Outbox {
    pub(super) async fn send(&self, message: Value) {
        if self.tx.send(message.to_string()).await.is_err() {
            tracing::debug!("output closed; message dropped");
        }
    }
}

pub(super) async fn write_lines<W>(writer: W, mut rx: mpsc::Receiver<String>) -> std::io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let mut out = BufWriter::new(writer);
    while let Some(line) = rx.recv().await {
        out.write_all(line.as_bytes()).await?;
        out.write_all(b"\n").await?;
        // Batch whatever is already queued into one flush.
        while let Ok(line) = rx.try_recv() {
            out.write_all(line.as_bytes()).await?;
            out.write_all(b"\n").await?;
        }
        out.flush().await?;
    }
    out.shutdown().await
}

pub(super) fn log_join(joined: Result<(), tokio::task::JoinError>) {
    if let Err(err) = joined {
        tracing::error!(error = %err, "request task failed");
    }
}

pub(super) async fn handle_request(
    ctx: &Ctx,
    guard: &InFlightGuard,
    id: Value,
    method: &str,
    params: Option<Value>,
) {
    if guard.cancel.is_cancelled() {
        tracing::debug!("cancelled before it started");
        return;
    }
    let outcome = match method {
        "initialize" => Some(Ok(initialize_result(
            params.as_ref(),
            "gatehouse-helpdesk",
            helpdesk_capabilities(ctx.opts.lease_extension),
            "Case-management demo. open_case opens a case and selects it for your session; \
             add_note and list_notes act on the selected case.",
        ))),
        "ping" => Some(Ok(json!({}))),
        "tools/list" => Some(Ok(json!({ "tools": helpdesk_tools() }))),
        "tools/call" => call_tool(ctx, &guard.cancel, params.as_ref()).await,
        other => Some(Err(RpcError::method_not_found(format!(
            "Method not found: {other}"
        )))),
    };
    match outcome {
        Some(Ok(result)) => ctx.outbox.send(response(id, result)).await,
        Some(Err(err)) => ctx.outbox.send(error_response(id, err)).await,
        None => tracing::debug!("cancelled; no response"),
    }
}

pub(super) fn handle_notification(
    ctx: &Ctx,
    in_flight: &InFlight,
    method: &str,
    params: Option<&Value>,
) {
    match method {
        "notifications/initialized" => tracing::debug!("client initialized"),
        "notifications/cancelled" => {
            let Some(request_id) = params.and_then(|p| p.get("requestId")) else {
                tracing::debug!("cancellation without requestId ignored");
                return;
            };
            let found = in_flight.cancel(request_id);
            tracing::info!(request_id = %request_id, found, "cancellation received");
        }
        LEASE_RELEASED_METHOD if ctx.opts.lease_extension => {
            match params.and_then(|p| p.get("lease")).and_then(Value::as_str) {
                Some(lease) => {
                    let case = ctx.desk.release(lease);
                    tracing::info!(lease, selected_case = ?case, "lease released");
                }
                None => tracing::warn!("lease_released without a string \"lease\" ignored"),
            }
        }
        other => tracing::debug!(method = other, "notification ignored"),
    }
}

pub(super) fn helpdesk_capabilities(lease_extension: bool) -> Value {
    let mut capabilities = json!({ "tools": { "listChanged": true } });
    if lease_extension {
        capabilities["experimental"] = json!({ LEASE_CAPABILITY: {} });
    }
    capabilities
}

pub(super) fn helpdesk_tools() -> Value {
    let writes = json!({
        "readOnlyHint": false,
        "destructiveHint": false,
        "idempotentHint": false,
        "openWorldHint": false
    });
    let text_schema = |what: &str| {
        json!({
            "type": "object",
            "properties": { "text": { "type": "string", "description": what } },
            "required": ["text"],
            "additionalProperties": false
        })
    };
    json!([
        {
            "name": "open_case",
            "title": "Open case",
            "description": "Open a new case and select it for this session. Later add_note and list_notes calls act on it.",
            "inputSchema": {
                "type": "object",
                "properties": { "title": { "type": "string", "description": "Short summary of the case" } },
                "required": ["title"],
                "additionalProperties": false
            },
            "outputSchema": {
                "type": "object",
                "properties": {
                    "case_id": { "type": "string", "description": "The case opened (and selected)" },
                    "title": { "type": "string", "description": "Its title, as given" },
                    "lease": { "type": "string", "description": "The gateway lease it belongs to (empty without one)" }
                },
                "required": ["case_id", "title", "lease"]
            },
            "annotations": writes.clone()
        },
        {
            "name": "add_note",
            "title": "Add note",
            "description": "Append a note to the selected case (call open_case first).",
            "inputSchema": text_schema("The note"),
            "annotations": writes.clone()
        },
        {
            "name": "add_note_slow",
            "title": "Add note (slowly)",
            "description": "Like add_note but takes a while, reporting progress; can be cancelled.",
            "inputSchema": text_schema("The note"),
            "annotations": writes
        },
        {
            "name": "list_notes",
            "title": "List notes",
            "description": "List the notes of the selected case, one per line.",
            "inputSchema": {
                "type": "object",
                "properties": {},
                "required": [],
                "additionalProperties": false
            },
            "annotations": { "readOnlyHint": true, "openWorldHint": false }
        }
    ])
}

/// The parts of `tools/call` params every tool needs.
pub(super) struct Call<'a> {
    pub(super) name: &'a str,
    pub(super) args: Map<String, Value>,
    pub(super) meta: Option<&'a Map<String, Value>>,
    pub(super) lease: String,
}

impl<'a> Call<'a> {
    pub(super) fn parse(
        params: Option<&'a Value>,
        lease_extension: bool,
    ) -> Result<Self, RpcError> {
        let params = params
            .and_then(Value::as_object)
            .ok_or_else(|| RpcError::invalid_params("tools/call needs params with a tool name"))?;
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| RpcError::invalid_params("tools/call needs a string \"name\""))?;
        let args = match params.get("arguments") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(args)) => args.clone(),
            Some(_) => return Err(RpcError::invalid_params("\"arguments\" must be an object")),
        };
        let meta = params
            .get(crate::protocol::meta::META)
            .and_then(Value::as_object);
        let lease = match meta.and_then(|m| m.get(LEASE_META_KEY)) {
            _ if !lease_extension => String::new(),
            None => String::new(),
            Some(Value::String(lease)) => lease.clone(),
            Some(_) => {
                return Err(RpcError::invalid_params(format!(
                    "_meta[\"{LEASE_META_KEY}\"] must be a string"
                )))
            }
        };
        Ok(Self {
            name,
            args,
            meta,
            lease,
        })
    }

    pub(super) fn progress_token(&self) -> Option<Value> {
        self.meta
            .and_then(|m| m.get(crate::protocol::meta::PROGRESS_TOKEN))
            .filter(|t| t.is_string() || t.is_number())
            .cloned()
    }

    /// A successful result: text plus structured content, both stamped with the lease.
    pub(super) fn ok(&self, text: String, mut structured: Map<String, Value>) -> Value {
        structured.insert("lease".into(), Value::String(self.lease.clone()));
        self.finish(json!({
            "content": [{ "type": "text", "text": text }],
            "structuredContent": structured,
            "isError": false
        }))
    }

    /// A successful result whose text is the JSON of its structured content (stamped with
    /// the lease), as the spec asks of a tool that declares an `outputSchema`: a client that
    /// reads either form gets the same facts.
    pub(super) fn ok_structured(&self, mut structured: Map<String, Value>) -> Value {
        structured.insert("lease".into(), Value::String(self.lease.clone()));
        let structured = Value::Object(structured);
        self.finish(json!({
            "content": [{ "type": "text", "text": structured.to_string() }],
            "structuredContent": structured,
            "isError": false
        }))
    }

    /// A tool execution error (`isError: true`).
    pub(super) fn tool_error(&self, text: String) -> Value {
        self.finish(json!({
            "content": [{ "type": "text", "text": text }],
            "isError": true
        }))
    }

    pub(super) fn finish(&self, mut result: Value) -> Value {
        let mut meta = Map::new();
        meta.insert("lease".into(), Value::String(self.lease.clone()));
        if let Some(request_meta) = self.meta {
            if request_meta.get(TEST_ECHO_META_KEY) == Some(&Value::Bool(true)) {
                meta.insert(
                    TEST_SEEN_META_KEY.into(),
                    Value::Object(request_meta.clone()),
                );
            }
        }
        result[crate::protocol::meta::META] = Value::Object(meta);
        result
    }
}

/// Argument validation failures, reported to the caller as tool errors.
#[derive(Debug, thiserror::Error)]
pub(super) enum ArgError {
    #[error("missing required argument \"{0}\" (string)")]
    Missing(&'static str),
    #[error("argument \"{0}\" must be a string")]
    NotString(&'static str),
    #[error("argument \"{0}\" must not be empty")]
    Empty(&'static str),
    #[error("unexpected argument \"{0}\"")]
    Unexpected(String),
}

/// Check that `args` has exactly the `expected` keys and return the string values in order.
pub(super) fn string_args(
    args: &Map<String, Value>,
    expected: &[&'static str],
) -> Result<Vec<String>, ArgError> {
    if let Some(extra) = args.keys().find(|k| !expected.contains(&k.as_str())) {
        return Err(ArgError::Unexpected(extra.clone()));
    }
    expected
        .iter()
        .map(|&name| match args.get(name) {
            None | Some(Value::Null) => Err(ArgError::Missing(name)),
            Some(Value::String(s)) if s.trim().is_empty() => Err(ArgError::Empty(name)),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(_) => Err(ArgError::NotString(name)),
        })
        .collect()
}

pub(super) const NO_CASE: &str = "no case selected: call open_case first";

/// `None` means the call was cancelled and gets no response.
pub(super) async fn call_tool(
    ctx: &Ctx,
    cancel: &CancellationToken,
    params: Option<&Value>,
) -> Option<Result<Value, RpcError>> {
    let call = match Call::parse(params, ctx.opts.lease_extension) {
        Ok(call) => call,
        Err(err) => return Some(Err(err)),
    };
    let expected: &[&'static str] = match call.name {
        "open_case" => &["title"],
        "add_note" | "add_note_slow" => &["text"],
        "list_notes" => &[],
        other => {
            return Some(Err(RpcError::invalid_params(format!(
                "Unknown tool: {other}"
            ))))
        }
    };
    let mut values = match string_args(&call.args, expected) {
        Ok(values) => values.into_iter(),
        Err(err) => return Some(Ok(call.tool_error(format!("invalid arguments: {err}")))),
    };
    let arg = values.next().unwrap_or_default();
    tracing::debug!(tool = call.name, lease = %call.lease, "tool call");
    let result = match call.name {
        "open_case" => {
            let case_id = ctx.desk.open_case(&call.lease);
            tracing::info!(lease = %call.lease, case = %case_id, "case opened");
            let mut structured = Map::new();
            structured.insert("case_id".into(), Value::String(case_id));
            structured.insert("title".into(), Value::String(arg));
            call.ok_structured(structured)
        }
        "add_note" => add_note(&ctx.desk, &call, &arg),
        "add_note_slow" => {
            if ctx.desk.selected(&call.lease).is_none() {
                return Some(Ok(call.tool_error(NO_CASE.into())));
            }
            if !wait_slowly(ctx, cancel, call.progress_token()).await {
                tracing::info!(lease = %call.lease, "add_note_slow cancelled; no note written");
                return None;
            }
            add_note(&ctx.desk, &call, &arg)
        }
        _ => match ctx.desk.list_notes(&call.lease) {
            Some((case_id, notes)) => {
                let mut structured = Map::new();
                structured.insert("case_id".into(), Value::String(case_id));
                let text = notes.join("\n");
                structured.insert("notes".into(), json!(notes));
                call.ok(text, structured)
            }
            None => call.tool_error(NO_CASE.into()),
        },
    };
    Some(Ok(result))
}

pub(super) fn add_note(desk: &Desk, call: &Call<'_>, text: &str) -> Value {
    match desk.add_note(&call.lease, text) {
        Some(case_id) => {
            let mut structured = Map::new();
            structured.insert("case_id".into(), Value::String(case_id.clone()));
            call.ok(format!("note added to {case_id}"), structured)
        }
        None => call.tool_error(NO_CASE.into()),
    }
}

/// Sleep `slow_ms`, reporting progress every [`PROGRESS_INTERVAL_MS`] when there is a token.
/// Returns false if the request was cancelled or the server is shutting down.
pub(super) async fn wait_slowly(
    ctx: &Ctx,
    cancel: &CancellationToken,
    progress_token: Option<Value>,
) -> bool {
    let total = ctx.opts.slow_ms;
    let start = Instant::now();
    let mut elapsed = 0;
    while elapsed < total {
        elapsed = (elapsed + PROGRESS_INTERVAL_MS).min(total);
        tokio::select! {
            biased;
            () = cancel.cancelled() => return false,
            () = ctx.shutdown.cancelled() => return false,
            () = tokio::time::sleep_until(start + Duration::from_millis(elapsed)) => {}
        }
        if let Some(token) = &progress_token {
            ctx.outbox
                .send(json!({
                    "jsonrpc": "2.0",
                    "method": "notifications/progress",
                    "params": {
                        "progressToken": token,
                        "progress": elapsed,
                        "total": total,
                        "message": format!("writing note: {elapsed}/{total} ms")
                    }
                }))
                .await;
        }
    }
    !cancel.is_cancelled()
}
