//! The shipped demo upstreams: "helpdesk", a stdio MCP server with per-lease case selection that
//! implements the `io.gatehouse/lease` extension, and "echo", a lean stdio MCP server for benchmarks.
//!
//! Both speak the stdio transport: one JSON-RPC object per line on the reader, one per line on the
//! writer, nothing else on the writer (logs go through `tracing`, which the binary sends to stderr).
//!
//! Helpdesk state lives for one [`serve`] call (one process in production): cases and their notes
//! are global by case id (`case-1`, `case-2`, … from one counter), and each lease owns only its
//! *selected case*. The lease of a request is `params._meta["io.gatehouse/lease"]` (a string),
//! `""` when absent; with the extension switched off every caller shares the lease `""`, which is
//! how a server without the extension behaves behind the gateway.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

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

/// Protocol revisions echoed back when a client asks for them; anything else gets the latest.
const SUPPORTED_VERSIONS: [&str; 4] = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"];
const LATEST_VERSION: &str = "2025-11-25";
/// Longest accepted input line; longer lines are answered with a parse error and skipped.
const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;
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
            Message::Response => tracing::debug!("ignoring a response from the client"),
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
            Decoded::Message(Message::Notification { .. } | Message::Response) => None,
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

/// Install a stderr `tracing` subscriber filtered by `RUST_LOG` unless one is already set.
fn init_stderr_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // An error only means the binary installed its own subscriber first.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

// ---------------------------------------------------------------------------------------------
// Helpdesk state
// ---------------------------------------------------------------------------------------------

/// Cases, their notes, and the selected case of each lease. Cheap to clone; short locks only.
#[derive(Clone, Default)]
struct Desk {
    shared: Arc<Mutex<DeskState>>,
}

#[derive(Default)]
struct DeskState {
    next_case: u64,
    cases: HashMap<String, Case>,
    /// lease id → selected case id; entries are removed on release.
    selected: HashMap<String, String>,
}

struct Case {
    notes: Vec<String>,
}

impl Desk {
    fn lock(&self) -> MutexGuard<'_, DeskState> {
        // A poisoned lock still holds consistent data: every critical section is a few inserts.
        crate::sync::lock(&self.shared)
    }

    /// Open a case and select it for `lease`; returns its id.
    fn open_case(&self, lease: &str) -> String {
        let mut state = self.lock();
        state.next_case += 1;
        let case_id = format!("case-{}", state.next_case);
        state
            .cases
            .insert(case_id.clone(), Case { notes: Vec::new() });
        state.selected.insert(lease.to_owned(), case_id.clone());
        case_id
    }

    fn selected(&self, lease: &str) -> Option<String> {
        self.lock().selected.get(lease).cloned()
    }

    /// Append a note to the lease's selected case; returns the case id.
    fn add_note(&self, lease: &str, text: &str) -> Option<String> {
        let mut state = self.lock();
        let case_id = state.selected.get(lease)?.clone();
        let case = state.cases.get_mut(&case_id)?;
        case.notes.push(text.to_owned());
        Some(case_id)
    }

    /// The lease's selected case and its notes.
    fn list_notes(&self, lease: &str) -> Option<(String, Vec<String>)> {
        let state = self.lock();
        let case_id = state.selected.get(lease)?;
        let case = state.cases.get(case_id)?;
        Some((case_id.clone(), case.notes.clone()))
    }

    /// Forget the lease's selection; returns the case it had selected.
    fn release(&self, lease: &str) -> Option<String> {
        self.lock().selected.remove(lease)
    }
}

/// Cancellation handles of requests being handled, keyed by their JSON-RPC id.
#[derive(Clone, Default)]
struct InFlight {
    shared: Arc<Mutex<InFlightState>>,
}

#[derive(Default)]
struct InFlightState {
    next_seq: u64,
    by_id: HashMap<String, (u64, CancellationToken)>,
}

/// Removes its entry from [`InFlight`] on drop (unless a later request reused the id).
struct InFlightGuard {
    in_flight: InFlight,
    key: String,
    seq: u64,
    cancel: CancellationToken,
}

impl InFlight {
    fn lock(&self) -> MutexGuard<'_, InFlightState> {
        crate::sync::lock(&self.shared)
    }

    fn register(&self, id: &Value) -> InFlightGuard {
        let key = id.to_string();
        let cancel = CancellationToken::new();
        let mut state = self.lock();
        state.next_seq += 1;
        let seq = state.next_seq;
        state.by_id.insert(key.clone(), (seq, cancel.clone()));
        InFlightGuard {
            in_flight: self.clone(),
            key,
            seq,
            cancel,
        }
    }

    /// Cancel the request with this id; false if it is not in flight.
    fn cancel(&self, id: &Value) -> bool {
        let token = self
            .lock()
            .by_id
            .get(&id.to_string())
            .map(|(_, t)| t.clone());
        token.map(|t| t.cancel()).is_some()
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let mut state = self.in_flight.lock();
        if state
            .by_id
            .get(&self.key)
            .is_some_and(|(seq, _)| *seq == self.seq)
        {
            state.by_id.remove(&self.key);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Helpdesk protocol handling
// ---------------------------------------------------------------------------------------------

struct Ctx {
    opts: HelpdeskOptions,
    desk: Desk,
    outbox: Outbox,
    /// Cancelled when the input reaches EOF: slow work stops.
    shutdown: CancellationToken,
}

/// The sending side of the single writer task.
struct Outbox {
    tx: mpsc::Sender<String>,
}

impl Outbox {
    async fn send(&self, message: Value) {
        if self.tx.send(message.to_string()).await.is_err() {
            tracing::debug!("output closed; message dropped");
        }
    }
}

async fn write_lines<W>(writer: W, mut rx: mpsc::Receiver<String>) -> std::io::Result<()>
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

fn log_join(joined: Result<(), tokio::task::JoinError>) {
    if let Err(err) = joined {
        tracing::error!(error = %err, "request task failed");
    }
}

async fn handle_request(
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

fn handle_notification(ctx: &Ctx, in_flight: &InFlight, method: &str, params: Option<&Value>) {
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

fn helpdesk_capabilities(lease_extension: bool) -> Value {
    let mut capabilities = json!({ "tools": { "listChanged": true } });
    if lease_extension {
        capabilities["experimental"] = json!({ LEASE_CAPABILITY: {} });
    }
    capabilities
}

fn helpdesk_tools() -> Value {
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
struct Call<'a> {
    name: &'a str,
    args: Map<String, Value>,
    meta: Option<&'a Map<String, Value>>,
    lease: String,
}

impl<'a> Call<'a> {
    fn parse(params: Option<&'a Value>, lease_extension: bool) -> Result<Self, RpcError> {
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

    fn progress_token(&self) -> Option<Value> {
        self.meta
            .and_then(|m| m.get(crate::protocol::meta::PROGRESS_TOKEN))
            .filter(|t| t.is_string() || t.is_number())
            .cloned()
    }

    /// A successful result: text plus structured content, both stamped with the lease.
    fn ok(&self, text: String, mut structured: Map<String, Value>) -> Value {
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
    fn ok_structured(&self, mut structured: Map<String, Value>) -> Value {
        structured.insert("lease".into(), Value::String(self.lease.clone()));
        let structured = Value::Object(structured);
        self.finish(json!({
            "content": [{ "type": "text", "text": structured.to_string() }],
            "structuredContent": structured,
            "isError": false
        }))
    }

    /// A tool execution error (`isError: true`).
    fn tool_error(&self, text: String) -> Value {
        self.finish(json!({
            "content": [{ "type": "text", "text": text }],
            "isError": true
        }))
    }

    fn finish(&self, mut result: Value) -> Value {
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
enum ArgError {
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
fn string_args(
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

const NO_CASE: &str = "no case selected: call open_case first";

/// `None` means the call was cancelled and gets no response.
async fn call_tool(
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

fn add_note(desk: &Desk, call: &Call<'_>, text: &str) -> Value {
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
async fn wait_slowly(ctx: &Ctx, cancel: &CancellationToken, progress_token: Option<Value>) -> bool {
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

// ---------------------------------------------------------------------------------------------
// Echo
// ---------------------------------------------------------------------------------------------

fn echo_request(method: &str, params: Option<&Value>) -> Result<Value, RpcError> {
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

// ---------------------------------------------------------------------------------------------
// JSON-RPC framing shared by both servers
// ---------------------------------------------------------------------------------------------

fn initialize_result(
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

fn response(id: Value, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

fn error_response(id: Value, err: RpcError) -> Value {
    err.to(id).to_value()
}

/// One well-formed incoming JSON-RPC message.
enum Message {
    Request {
        id: Value,
        method: String,
        params: Option<Value>,
    },
    Notification {
        method: String,
        params: Option<Value>,
    },
    /// A response from the client; we never send requests, so it is ignored.
    Response,
}

/// What to do with one input line.
enum Decoded {
    Message(Message),
    /// Answer at once (parse error / invalid request).
    Reply(Value),
    /// Blank line.
    Skip,
}

fn decode(frame: Frame) -> Decoded {
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
    match classify(value) {
        Ok(msg) => Decoded::Message(msg),
        Err((id, reason)) => Decoded::Reply(error_response(
            id,
            RpcError::invalid_request(format!("Invalid Request: {reason}")),
        )),
    }
}

/// Sort a parsed value into a message, or say why it is not a valid one (with the id to answer).
fn classify(value: Value) -> Result<Message, (Value, &'static str)> {
    let Value::Object(mut obj) = value else {
        return Err((
            Value::Null,
            "expected a JSON object (batches are not supported)",
        ));
    };
    let id = obj.remove("id");
    let method = obj.remove("method");
    if method.is_none() && id.is_some() && (obj.contains_key("result") || obj.contains_key("error"))
    {
        return Ok(Message::Response);
    }
    let usable_id = match &id {
        Some(id @ (Value::String(_) | Value::Number(_))) => Some(id.clone()),
        _ => None,
    };
    let reply_id = usable_id.clone().unwrap_or(Value::Null);
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((reply_id, "\"jsonrpc\" must be \"2.0\""));
    }
    let params = obj.remove("params");
    match method {
        Some(Value::String(method)) => match (id, usable_id) {
            (None, _) => Ok(Message::Notification { method, params }),
            (Some(_), Some(id)) => Ok(Message::Request { id, method, params }),
            (Some(_), None) => Err((Value::Null, "\"id\" must be a string or an integer")),
        },
        Some(_) => Err((reply_id, "\"method\" must be a string")),
        None => Err((reply_id, "missing \"method\"")),
    }
}

/// One input line, without its newline.
enum Frame {
    Line(Vec<u8>),
    /// A line over [`MAX_LINE_BYTES`], already skipped.
    TooLong,
}

/// Splits the input into lines with a length bound. Cancel-safe: all state lives in `self`.
struct LineReader<R> {
    inner: BufReader<R>,
    buf: Vec<u8>,
    discarding: bool,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    fn new(reader: R) -> Self {
        Self {
            inner: BufReader::new(reader),
            buf: Vec::new(),
            discarding: false,
        }
    }

    /// The next line, or `None` at EOF. A final line without a newline still counts.
    async fn next_frame(&mut self) -> std::io::Result<Option<Frame>> {
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
    fn has_buffered_line(&self) -> bool {
        self.inner.buffer().contains(&b'\n')
    }
}
