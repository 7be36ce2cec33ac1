//! The audit trail: one writer (a thread that owns the file), records chained by hash, and
//! the reader behind `gatehouse audit`.
//!
//! Invariant: a record is written (reaches the OS, and the disk under `fsync = "always"`)
//! before the reply it describes is sent; records are never dropped. If writing fails, tool
//! calls are refused until a write succeeds again.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

use crate::config::{AuditConfig, FsyncPolicy};
use crate::sync::lock;

/// Why an audit operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuditError {
    #[error("audit log unavailable: {0}")]
    Unavailable(String),
    #[error("audit writer stopped")]
    Stopped,
}

/// One audit record. `ts`, `seq`, `node_id` and `prev` are set by the writer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Record {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ts: String,
    #[serde(default)]
    pub seq: u64,
    /// The node that wrote the record (`node_id` of the config; absent without one), so a
    /// collector gathering several nodes' lines can tell their chains apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    pub event: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registration_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_request_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args_digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prev: String,
}

/// The longest a tool name may be in an audit record (bytes); longer ones are cut and
/// digested ([`bound_text`]). MCP tool names are 1-128 characters; 256 leaves room for a
/// gateway prefix.
pub const MAX_TOOL_NAME_BYTES: usize = 256;
/// The longest free text (reason, label, agent id, signal) may be in an audit record (bytes).
pub const MAX_TEXT_BYTES: usize = 1024;

/// `s` if it fits in `max` bytes, else its first bytes (cut at a character boundary) then
/// `…[cut: N bytes, sha256:<hex of the whole>]`: a record stays small whatever a client
/// sent, and the digest still tells two long values apart.
pub fn bound_text(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let digest = hex::encode(Sha256::digest(s.as_bytes()));
    let mut end = max.min(s.len()) / 2;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let total = s.len();
    s.truncate(end);
    s.push_str(&format!("…[cut: {total} bytes, sha256:{digest}]"));
}

impl Record {
    /// Cuts over-long fields (tool names, free text) so that no request can make a record
    /// large: what a client controls is at most a few hundred bytes per field here.
    pub fn bounded(mut self) -> Self {
        for (field, max) in [
            (&mut self.tool, MAX_TOOL_NAME_BYTES),
            (&mut self.reason, MAX_TEXT_BYTES),
            (&mut self.label, MAX_TEXT_BYTES),
            (&mut self.agent_id, MAX_TEXT_BYTES),
            (&mut self.session_id, MAX_TOOL_NAME_BYTES),
            (&mut self.signal, MAX_TEXT_BYTES),
        ] {
            if let Some(s) = field {
                bound_text(s, max);
            }
        }
        if let Some(tools) = &mut self.tools {
            for t in tools {
                bound_text(t, MAX_TOOL_NAME_BYTES);
            }
        }
        self
    }

    pub fn event(event: &str) -> Self {
        Record {
            event: event.to_string(),
            ..Default::default()
        }
    }

    /// A record about one registration: its id, `agent_id` and label, as the registration
    /// holds them (`RegistrationState::audit_record` is the one caller, so `agent_id` never
    /// comes from a request).
    pub fn about(event: &str, registration_id: &str, agent_id: &str, label: Option<&str>) -> Self {
        Record {
            event: event.to_string(),
            registration_id: Some(registration_id.to_string()),
            agent_id: Some(agent_id.to_string()),
            label: label.map(str::to_string),
            ..Default::default()
        }
    }

    pub fn set_outcome(&mut self, outcome: Outcome) {
        self.outcome = Some(outcome.as_str().to_string());
    }

    /// Appends this record's line (without the newline) to `out`: the bytes
    /// `serde_json::to_string` writes for it, with `ts` (when the record has none), `seq` and
    /// `prev` given by the writer. Written field by field, with no intermediate `String`s: the
    /// chain hashes these exact bytes, and a test holds them equal to serde's.
    pub fn encode_line(&self, ts: &str, seq: u64, prev: &str, out: &mut Vec<u8>) {
        self.encode_line_on(None, ts, seq, prev, out)
    }

    /// [`Record::encode_line`] on a node: `node` (when the record has none) is its `node_id`.
    pub fn encode_line_on(
        &self,
        node: Option<&str>,
        ts: &str,
        seq: u64,
        prev: &str,
        out: &mut Vec<u8>,
    ) {
        let mut line = Line::open(out);
        let ts = if self.ts.is_empty() { ts } else { &self.ts };
        if !ts.is_empty() {
            line.str("ts", ts);
        }
        line.u64("seq", seq);
        if let Some(node) = self.node_id.as_deref().or(node) {
            line.str("node_id", node);
        }
        line.str("event", &self.event);
        line.opt_str("registration_id", &self.registration_id);
        line.opt_str("agent_id", &self.agent_id);
        line.opt_str("label", &self.label);
        line.opt_str("session_id", &self.session_id);
        line.opt_str("transport", &self.transport);
        line.opt_str("tool", &self.tool);
        line.opt_str("upstream", &self.upstream);
        if let Some(v) = self.upstream_request_id {
            line.u64("upstream_request_id", v);
        }
        if let Some(v) = self.epoch {
            line.u64("epoch", v);
        }
        line.opt_str("args_digest", &self.args_digest);
        if let Some(v) = &self.arguments {
            line.serde("arguments", v);
        }
        line.opt_str("outcome", &self.outcome);
        if let Some(v) = self.error_code {
            line.serde("error_code", &v);
        }
        line.opt_str("reason", &self.reason);
        if let Some(v) = self.duration_ms {
            line.serde("duration_ms", &v);
        }
        if let Some(v) = self.pid {
            line.u64("pid", u64::from(v));
        }
        line.opt_str("signal", &self.signal);
        if let Some(v) = &self.tools {
            line.serde("tools", v);
        }
        if !prev.is_empty() {
            line.str("prev", prev);
        }
        line.out.push(b'}');
    }
}

/// A JSON object being written by [`Record::encode_line`].
struct Line<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Line<'a> {
    fn open(out: &'a mut Vec<u8>) -> Self {
        out.push(b'{');
        Line { out, first: true }
    }

    /// `"key":`, after a comma unless it is the first field. Keys are plain ASCII.
    fn key(&mut self, key: &str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
    }

    fn str(&mut self, key: &str, v: &str) {
        self.key(key);
        json_str(self.out, v);
    }

    fn opt_str(&mut self, key: &str, v: &Option<String>) {
        if let Some(v) = v {
            self.str(key, v);
        }
    }

    fn u64(&mut self, key: &str, v: u64) {
        self.serde(key, &v);
    }

    /// A value serde_json writes itself (numbers, JSON values, lists).
    fn serde(&mut self, key: &str, v: &impl Serialize) {
        self.key(key);
        // Writing to a `Vec` cannot fail, and these values always serialize (map keys of a
        // `Value` are strings; a non-finite float is `null`).
        let _ = serde_json::to_writer(&mut *self.out, v);
    }
}

/// A JSON string as serde_json writes it: quotes, and `"`, `\\` and control characters escaped
/// (everything else, non-ASCII included, as is). Strings with nothing to escape — ids,
/// digests, timestamps, almost every name — are copied in one go.
fn json_str(out: &mut Vec<u8>, s: &str) {
    if needs_escape(s.as_bytes()) {
        let _ = serde_json::to_writer(&mut *out, s);
        return;
    }
    out.reserve(s.len() + 2);
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
}

/// Outcome of a governed call, as written in `outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    ToolError,
    ProtocolError,
    Denied,
    Cancelled,
    Timeout,
    UpstreamFailed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ToolError => "tool_error",
            Outcome::ProtocolError => "protocol_error",
            Outcome::Denied => "denied",
            Outcome::Cancelled => "cancelled",
            Outcome::Timeout => "timeout",
            Outcome::UpstreamFailed => "upstream_failed",
        }
    }
}

/// SHA-256 (hex) of a JSON value's compact serialization: the argument digest.
pub fn digest_value(v: &Value) -> String {
    // The same compact bytes as `to_string`, fed to the hash as they are written (no
    // intermediate buffer). Serializing a `Value` cannot fail (map keys are strings).
    let mut h = HashWriter(Sha256::new());
    let _ = serde_json::to_writer(&mut h, v);
    // `hex_digest` writes ASCII only (`hex::encode` builds its `String` char by char).
    std::str::from_utf8(&hex_digest(&h.0.finalize()))
        .unwrap_or_default()
        .to_owned()
}

/// An `io::Write` that feeds a SHA-256.
struct HashWriter(Sha256);

impl Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The hash that links a line to the next record's `prev`.
pub fn line_hash(line: &str) -> String {
    hex::encode(Sha256::digest(line.as_bytes()))
}

/// Does `s` hold a byte that JSON strings escape (`"`, `\\`, a control character)? Eight
/// bytes at a time: a byte is below `n` where `(x - n·0x01…) & !x & 0x80…` is set (exact as
/// to whether one exists, for `n` ≤ 0x80), and equal to `c` where `x ^ c·0x01…` is zero.
fn needs_escape(s: &[u8]) -> bool {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let below = |x: u64, n: u8| x.wrapping_sub(LO * u64::from(n)) & !x;
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        let x = u64::from_le_bytes(w);
        let hits = below(x, 0x20)
            | below(x ^ (LO * u64::from(b'"')), 1)
            | below(x ^ (LO * u64::from(b'\\')), 1);
        if hits & HI != 0 {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

/// Lowercase hex of a SHA-256 digest, without allocating.
fn hex_digest(d: &[u8]) -> [u8; 64] {
    let mut out = [0u8; 64];
    // A SHA-256 digest is 32 bytes, exactly half the buffer: this cannot fail.
    let _ = hex::encode_to_slice(d, &mut out);
    out
}

/// The genesis `prev` value of a new chain.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

pub mod summary;
pub mod verify;

struct Job {
    /// `None`: only wakes the writer thread (an inline write failed: start probing).
    record: Option<Record>,
    ack: Option<oneshot::Sender<Result<(), AuditError>>>,
}

/// A record handed to `Audit::record`: written already (inline), or queued for the thread.
enum Pending {
    Done(Result<(), AuditError>),
    Ack(oneshot::Receiver<Result<(), AuditError>>),
}

/// Counters of the writer, for tests and metrics.
#[derive(Debug, Default)]
struct Counters {
    batches: AtomicU64,
    syncs: AtomicU64,
    failures: AtomicU64,
    rotations: AtomicU64,
}

/// A snapshot of the writer's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditStats {
    /// Batches written successfully.
    pub batches: u64,
    /// `fsync` (sync_data) calls on the audit file.
    pub syncs: u64,
    /// Batches (or recovery probes) that failed to write.
    pub failures: u64,
    /// Files rotated away.
    pub rotations: u64,
}

/// Owns the writer thread: when the last `Audit` handle goes, its sender (a field declared
/// before this one) has closed the channel, so the writer drains, syncs and ends; this joins it.
struct WriterThread(Option<std::thread::JoinHandle<()>>);

impl Drop for WriterThread {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            let _ = h.join();
        }
    }
}

/// A cheap handle to the audit writer.
///
/// Under `fsync = "interval"` or `"never"` a record is written by its caller, under a short
/// `std` lock (no `.await` inside): one `write` to the page cache, no hand-off to another
/// thread and back. The writer thread then only syncs (every interval, outside the lock, on
/// a duplicate of the descriptor) and probes after a failure. Under `"always"` every record
/// waits for an `fsync`, which must not block a runtime worker: records go to the thread,
/// which writes and syncs them in batches (group commit).
#[derive(Clone)]
pub struct Audit {
    tx: std::sync::mpsc::Sender<Job>,
    writer: Arc<std::sync::Mutex<Writer>>,
    inline: bool,
    healthy: Arc<AtomicBool>,
    depth: Arc<AtomicUsize>,
    counters: Arc<Counters>,
    path: Arc<PathBuf>,
    _thread: Arc<WriterThread>,
}

/// The writer compares the file it holds with what its path names (a `statx`) at most this
/// often, not before every record (a syscall per call otherwise, ~1.4 µs; issue 19). A file
/// moved aside or replaced keeps the records of that last millisecond, in order, and the next
/// ones go to the new file: nothing is lost, the chain goes on across the two.
const IDENTITY_EVERY: Duration = Duration::from_millis(1);

/// How long a failed writer waits between attempts to write again when no record is queued.
const RETRY_EVERY: Duration = Duration::from_millis(200);

/// Inline writers update the head sidecar at most this often; the thread brings a stale head
/// up to date within `HEAD_TRAIL`, and at the end. (Under `fsync = "always"` the head is
/// written after every batch.)
const HEAD_EVERY: Duration = Duration::from_millis(20);
const HEAD_TRAIL: Duration = Duration::from_millis(100);

impl Audit {
    /// Starts the writer thread; the file is created if absent and the chain continued.
    pub fn start(config: &AuditConfig) -> Result<Audit, AuditError> {
        Self::start_on(config, None)
    }

    /// [`Audit::start`] on a node: every record gets `node_id` (DESIGN.md §8).
    pub fn start_on(config: &AuditConfig, node_id: Option<&str>) -> Result<Audit, AuditError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let healthy = Arc::new(AtomicBool::new(true));
        let depth = Arc::new(AtomicUsize::new(0));
        let counters = Arc::new(Counters::default());
        let mut writer = Writer::open(config, counters.clone())?;
        writer.node_id = node_id.map(str::to_string);
        let writer = Arc::new(std::sync::Mutex::new(writer));
        let inline = config.fsync != FsyncPolicy::Always;
        let (h, d, w) = (healthy.clone(), depth.clone(), writer.clone());
        let handle = std::thread::Builder::new()
            .name("gatehouse-audit".into())
            .spawn(move || run(&w, rx, h, d, inline))
            .map_err(|e| AuditError::Unavailable(format!("cannot start writer: {e}")))?;
        Ok(Audit {
            tx,
            writer,
            inline,
            healthy,
            depth,
            counters,
            path: Arc::new(config.path.clone()),
            _thread: Arc::new(WriterThread(Some(handle))),
        })
    }

    /// Writes a record and waits until it is written (per the fsync policy).
    ///
    /// Under `interval` and `never` the record is written when this is called (the future
    /// only reports how that went); under `always` it is queued then, and the future waits
    /// for the writer's acknowledgement. Not an `async fn`: its future would hold the
    /// `Record` (hundreds of bytes) inside every caller's future.
    pub fn record(
        &self,
        record: Record,
    ) -> impl std::future::Future<Output = Result<(), AuditError>> + Send + 'static {
        let record = record.bounded();
        let pending = if self.inline {
            Pending::Done(self.write_inline(record))
        } else {
            self.enqueue(record)
        };
        async move {
            match pending {
                Pending::Done(result) => result,
                Pending::Ack(ack) => ack.await.map_err(|_| AuditError::Stopped)?,
            }
        }
    }

    /// Queues a record for the writer thread.
    fn enqueue(&self, record: Record) -> Pending {
        let (ack, done) = oneshot::channel();
        self.depth.fetch_add(1, Ordering::Relaxed);
        match self.tx.send(Job {
            record: Some(record),
            ack: Some(ack),
        }) {
            Ok(()) => Pending::Ack(done),
            Err(_) => Pending::Done(Err(AuditError::Stopped)),
        }
    }

    /// Writes a record without waiting for a sync (for `Drop` paths). It is still written, in
    /// order.
    pub fn record_detached(&self, record: Record) {
        let record = record.bounded();
        if self.inline {
            let _ = self.write_inline(record);
            return;
        }
        self.depth.fetch_add(1, Ordering::Relaxed);
        let _ = self.tx.send(Job {
            record: Some(record),
            ack: None,
        });
    }

    /// Writes one record in the caller's thread (see the type's documentation).
    fn write_inline(&self, record: Record) -> Result<(), AuditError> {
        let batch = [Job {
            record: Some(record),
            ack: None,
        }];
        let result = {
            let mut w = lock(&self.writer);
            let result = w.write_batch(&batch, false);
            w.note(&result, &self.healthy, 1);
            result
        };
        if result.is_err() {
            // The thread probes while unhealthy; make sure it is awake to.
            let _ = self.tx.send(Job {
                record: None,
                ack: None,
            });
        }
        result
    }

    /// False after a failed write, until a write succeeds again. The writer retries by
    /// itself (every 200 ms) while it is unhealthy, so service resumes without a caller.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    /// Records queued and not yet written.
    pub fn queue_depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    /// The writer's counters.
    pub fn stats(&self) -> AuditStats {
        let c = &self.counters;
        AuditStats {
            batches: c.batches.load(Ordering::Relaxed),
            syncs: c.syncs.load(Ordering::Relaxed),
            failures: c.failures.load(Ordering::Relaxed),
            rotations: c.rotations.load(Ordering::Relaxed),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The chain head sidecar of an audit file: `<path>.head`.
pub fn head_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".head");
    PathBuf::from(s)
}

/// The `(seq, hash)` of the last record written, as kept in the head sidecar.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    pub seq: u64,
    pub hash: String,
}

/// Reads the head sidecar of `path` (`Ok(None)` when there is none).
pub fn read_head(path: &Path) -> std::io::Result<Option<Head>> {
    match std::fs::read_to_string(head_path(path)) {
        // Created by a writer that has not written a record yet.
        Ok(s) if s.trim().is_empty() => Ok(None),
        Ok(s) => serde_json::from_str(s.trim())
            .map(Some)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The mode the audit file and its head sidecar are created with: records name agents,
/// tools and argument digests, so only the daemon's user reads them. Rotated segments are the
/// file renamed, so they keep it. An existing file keeps the mode it has (an operator may
/// have opened it to a log collector's group on purpose).
const OWNER_ONLY: u32 = 0o600;

/// Width of the head sidecar: its JSON padded with spaces, then a newline. Written in place
/// at offset 0 (one `pwrite` of one sector) so that updating it after every batch costs no
/// file creation, rename or writeback; `seq` only grows, so the JSON never outgrows it.
const HEAD_WIDTH: usize = 128;

/// The head sidecar's bytes: `{"seq":…,"hash":"…"}`, space-padded to `HEAD_WIDTH`.
fn head_bytes(head: &Head) -> std::io::Result<Vec<u8>> {
    let mut body = serde_json::to_vec(head)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    if body.len() >= HEAD_WIDTH {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "head record too long",
        ));
    }
    body.resize(HEAD_WIDTH - 1, b' ');
    body.push(b'\n');
    Ok(body)
}

/// Opens the head sidecar for in-place updates (created if absent, never truncated: until
/// the first update it keeps the head that was there).
/// A longer leftover (an older format) is cut to the width.
fn open_head(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(OWNER_ONLY)
        .open(head_path(path))?;
    if f.metadata()?.len() > HEAD_WIDTH as u64 {
        f.set_len(HEAD_WIDTH as u64)?;
    }
    Ok(f)
}

/// Writes the head in place.
fn write_head_at(f: &File, head: &Head) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    f.write_all_at(&head_bytes(head)?, 0)
}

/// Rotated files of `path`: `<path>.000001`, `<path>.000002`, … in chain order.
pub fn segments(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(Vec::new());
    };
    let dir = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(d) => d.to_path_buf(),
        None => PathBuf::from("."),
    };
    let rd = match std::fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let prefix = format!("{name}.");
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    for entry in rd {
        let entry = entry?;
        let fname = entry.file_name();
        let Some(fname) = fname.to_str() else {
            continue;
        };
        if let Some(n) = fname.strip_prefix(&prefix) {
            if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                if let Ok(k) = n.parse::<u64>() {
                    found.push((k, dir.join(fname)));
                }
            }
        }
    }
    found.sort();
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

/// The rotated segments of `path` followed by `path` itself (if it exists): the whole chain.
pub fn chain_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = segments(path)?;
    if path.exists() {
        files.push(path.to_path_buf());
    }
    Ok(files)
}

/// The writer thread. Thread mode (`fsync = "always"`): writes queued records in batches and
/// acknowledges them. Inline mode: records are written by their callers; this syncs the file
/// every interval and, while unhealthy, probes every `RETRY_EVERY`. Ends when every handle
/// is gone (the channel closes), after a last sync.
fn run(
    writer: &std::sync::Mutex<Writer>,
    rx: std::sync::mpsc::Receiver<Job>,
    healthy: Arc<AtomicBool>,
    depth: Arc<AtomicUsize>,
    inline: bool,
) {
    use std::sync::mpsc::RecvTimeoutError;
    loop {
        let wait = {
            let w = lock(writer);
            if !healthy.load(Ordering::Acquire) {
                Some(RETRY_EVERY)
            } else if inline {
                // Inline writers do not wake this thread: it looks every `HEAD_TRAIL` for a
                // stale head, and syncs when the interval is up.
                let sync_in = (w.fsync == FsyncPolicy::Interval && w.unsynced)
                    .then(|| w.fsync_interval.saturating_sub(w.last_sync.elapsed()));
                Some(sync_in.map_or(HEAD_TRAIL, |d| d.min(HEAD_TRAIL)))
            } else {
                None
            }
        };
        let first = match wait {
            None => match rx.recv() {
                Ok(j) => j,
                Err(_) => break,
            },
            Some(t) => match rx.recv_timeout(t) {
                Ok(j) => j,
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    if healthy.load(Ordering::Acquire) {
                        let due = {
                            let mut w = lock(writer);
                            w.refresh_head(true);
                            w.fsync == FsyncPolicy::Interval
                                && w.last_sync.elapsed() >= w.fsync_interval
                        };
                        if due {
                            sync_outside_lock(writer);
                        }
                    } else {
                        lock(writer).probe(&healthy);
                    }
                    continue;
                }
            },
        };
        let mut batch = vec![first];
        while batch.len() < 512 {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        batch.retain(|j| j.record.is_some());
        if batch.is_empty() {
            continue;
        }
        let n = batch.len();
        let result = {
            let mut w = lock(writer);
            let result = w.write_batch(&batch, !inline);
            w.note(&result, &healthy, n);
            result
        };
        depth.fetch_sub(n, Ordering::Relaxed);
        for job in batch {
            if let Some(ack) = job.ack {
                let _ = ack.send(result.clone());
            }
        }
    }
    lock(writer).refresh_head(true);
    sync_outside_lock(writer);
}

/// Syncs the file if records are unsynced, on a duplicate descriptor so that writers are
/// not held up by the `fsync`.
fn sync_outside_lock(writer: &std::sync::Mutex<Writer>) {
    let (file, counters) = {
        let mut w = lock(writer);
        if !w.unsynced {
            return;
        }
        w.unsynced = false;
        w.last_sync = Instant::now();
        (
            w.file.as_ref().and_then(|f| f.try_clone().ok()),
            w.counters.clone(),
        )
    };
    if let Some(f) = file {
        if f.sync_data().is_ok() {
            counters.syncs.fetch_add(1, Ordering::Relaxed);
        }
    }
}

struct Writer {
    path: PathBuf,
    file: Option<File>,
    /// The head sidecar, open while `file` is (regular files only).
    head: Option<File>,
    /// The `seq` last written to the head, and when.
    head_seq: u64,
    head_at: Instant,
    /// The file's length, tracked (to take back a failed batch without a `stat`).
    len: u64,
    /// (dev, ino) of the open file, to notice that the path now names another file.
    identity: Option<(u64, u64)>,
    /// When `identity` was last compared with what the path names (see [`IDENTITY_EVERY`]).
    identity_checked: Instant,
    regular: bool,
    seq: u64,
    prev: String,
    /// Written into every record that has none (the config's `node_id`).
    node_id: Option<String>,
    fsync: FsyncPolicy,
    fsync_interval: Duration,
    last_sync: Instant,
    unsynced: bool,
    stdout: bool,
    rotate_bytes: u64,
    counters: Arc<Counters>,
    last_error: Option<(String, Instant)>,
    /// The lines of a batch, encoded (kept between batches, see `keep_buf`).
    buf: Vec<u8>,
    clock: Clock,
}

/// A batch buffer larger than this is not kept for the next batch.
const KEEP_BUF: usize = 64 * 1024;

/// The writer's timestamps, as chrono writes them (RFC 3339, UTC, microseconds, `Z`:
/// `2026-11-29T17:27:10.123456Z`); the text up to the seconds is formatted once per second.
#[derive(Default)]
struct Clock {
    /// The second `text` was formatted for, and where its fraction starts.
    cached: Option<(u64, usize)>,
    text: String,
}

impl Clock {
    fn now(&mut self) -> &str {
        let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) else {
            self.cached = None;
            self.text = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
            return &self.text;
        };
        match self.cached {
            Some((secs, frac)) if secs == d.as_secs() => {
                self.text.truncate(frac);
                let mut micros = d.subsec_micros();
                let mut digits = [b'0'; 6];
                for b in digits.iter_mut().rev() {
                    *b = b'0' + (micros % 10) as u8;
                    micros /= 10;
                }
                self.text
                    .push_str(std::str::from_utf8(&digits).unwrap_or("000000"));
                self.text.push('Z');
            }
            _ => {
                // The same conversion as `chrono::Utc::now()`.
                let t = i64::try_from(d.as_secs())
                    .ok()
                    .and_then(|s| chrono::DateTime::from_timestamp(s, d.subsec_nanos()))
                    .unwrap_or_else(chrono::Utc::now);
                self.text = t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
                // `….SS.ffffffZ`: the fraction is the 6 digits before the `Z`.
                let b = self.text.as_bytes();
                let n = b.len();
                self.cached =
                    (n >= 8 && b[n - 8] == b'.' && b[n - 1] == b'Z').then(|| (d.as_secs(), n - 7));
            }
        }
        &self.text
    }
}

impl Writer {
    fn open(config: &AuditConfig, counters: Arc<Counters>) -> Result<Writer, AuditError> {
        let unavailable =
            |e: std::io::Error| AuditError::Unavailable(format!("{}: {e}", config.path.display()));
        let (mut seq, mut prev) = chain_tail(&config.path).map_err(unavailable)?;
        // The head sidecar is ahead of the file: records were cut. Continue from the head so
        // the gap stays visible to `verify` instead of being papered over.
        if let Ok(Some(head)) = read_head(&config.path) {
            if head.seq > seq {
                tracing::error!(
                    file_seq = seq,
                    head_seq = head.seq,
                    "audit file ends before its recorded head: records were cut; continuing the chain from the head"
                );
                seq = head.seq;
                prev = head.hash;
            }
        }
        let mut w = Writer {
            path: config.path.clone(),
            file: None,
            head: None,
            head_seq: 0,
            head_at: Instant::now(),
            len: 0,
            identity: None,
            identity_checked: Instant::now(),
            regular: false,
            seq,
            prev,
            node_id: None,
            fsync: config.fsync,
            fsync_interval: Duration::from_millis(config.fsync_interval_ms),
            last_sync: Instant::now(),
            unsynced: false,
            stdout: config.stdout,
            rotate_bytes: config.rotate_bytes,
            counters,
            last_error: None,
            buf: Vec::new(),
            clock: Clock::default(),
        };
        w.ensure_open()?;
        Ok(w)
    }

    fn unavailable(&self, e: impl std::fmt::Display) -> AuditError {
        AuditError::Unavailable(format!("{}: {e}", self.path.display()))
    }

    /// Opens the file if needed, or again if the path now names another file (moved away,
    /// replaced). A torn last line (crash, failed write) is terminated first, so the next
    /// record starts on a line of its own.
    fn ensure_open(&mut self) -> Result<(), AuditError> {
        self.ensure_open_at(Instant::now())
    }

    /// [`Self::ensure_open`], with the time read once by the caller.
    fn ensure_open_at(&mut self, now: Instant) -> Result<(), AuditError> {
        use std::os::unix::fs::MetadataExt;
        if self.file.is_some()
            && now.saturating_duration_since(self.identity_checked) >= IDENTITY_EVERY
        {
            let named = std::fs::metadata(&self.path)
                .ok()
                .map(|m| (m.dev(), m.ino()));
            self.identity_checked = now;
            if named != self.identity {
                tracing::warn!(path = %self.path.display(), "audit path names another file now; reopening");
                self.file = None;
            }
        }
        if self.file.is_none() {
            if let Some(dir) = self.path.parent().filter(|p| !p.as_os_str().is_empty()) {
                let _ = std::fs::create_dir_all(dir);
            }
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = OpenOptions::new()
                .create(true)
                .append(true)
                .mode(OWNER_ONLY)
                .open(&self.path)
                .map_err(|e| self.unavailable(e))?;
            let meta = f.metadata().map_err(|e| self.unavailable(e))?;
            self.regular = meta.is_file();
            self.len = meta.len();
            if self.regular {
                if meta.len() > 0 && !ends_with_newline(&self.path, meta.len()) {
                    f.write_all(b"\n").map_err(|e| self.unavailable(e))?;
                    self.len += 1;
                }
                // Lines that reached the file although their batch failed (the truncation
                // back failed too) are on the chain: continue after them.
                let (seq, prev) = chain_tail(&self.path).map_err(|e| self.unavailable(e))?;
                if seq > self.seq {
                    self.seq = seq;
                    self.prev = prev;
                }
            }
            self.identity = Some((meta.dev(), meta.ino()));
            self.identity_checked = now;
            self.head_seq = 0;
            self.head = if self.regular {
                open_head(&self.path)
                    .map_err(|e| tracing::warn!(error = %e, "audit head sidecar cannot be opened; a cut tail may go unnoticed"))
                    .ok()
            } else {
                None
            };
            self.file = Some(f);
        }
        Ok(())
    }

    fn note(&mut self, result: &Result<(), AuditError>, healthy: &AtomicBool, n: usize) {
        match result {
            Ok(()) => {
                self.counters.batches.fetch_add(1, Ordering::Relaxed);
                healthy.store(true, Ordering::Release);
                self.last_error = None;
            }
            Err(e) => {
                self.counters.failures.fetch_add(1, Ordering::Relaxed);
                healthy.store(false, Ordering::Release);
                if self.last_error.is_none() {
                    tracing::error!(error = %e, records = n, "audit write failed; tool calls are refused until it works again");
                    self.last_error = Some((e.to_string(), Instant::now()));
                }
            }
        }
    }

    /// While unhealthy and idle: try to write an `audit_resumed` record, which states the
    /// outage. Success makes the audit healthy again without waiting for a tool call.
    fn probe(&mut self, healthy: &AtomicBool) {
        let mut rec = Record::event("audit_resumed");
        if let Some((err, since)) = &self.last_error {
            rec.reason = Some(format!("audit was unavailable: {err}"));
            rec.duration_ms = Some(since.elapsed().as_secs_f64() * 1000.0);
        }
        let batch = [Job {
            record: Some(rec),
            ack: None,
        }];
        let result = self.write_batch(&batch, true);
        if result.is_ok() {
            tracing::info!("audit writable again; tool calls resume");
        }
        self.note(&result, healthy, 1);
    }

    /// Writes a batch. `may_sync`: an `fsync` that is due may be done here (false when the
    /// caller is a runtime worker: the thread syncs instead).
    fn write_batch(&mut self, batch: &[Job], may_sync: bool) -> Result<(), AuditError> {
        // One clock read for the batch's checks (identity, fsync due, head due).
        let mono = Instant::now();
        // Open (or reopen) first: reopening may move the chain past lines already on file.
        self.ensure_open_at(mono)?;
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let mut seq = self.seq;
        // The hash of the last line encoded, once there is one (`self.prev` until then).
        let mut last: Option<[u8; 64]> = None;
        let now = self.clock.now();
        for job in batch.iter() {
            let Some(r) = job.record.as_ref() else {
                continue;
            };
            seq += 1;
            let prev = match &last {
                Some(h) => std::str::from_utf8(h).unwrap_or_default(),
                None => &self.prev,
            };
            let start = buf.len();
            r.encode_line_on(self.node_id.as_deref(), now, seq, prev, &mut buf);
            last = Some(hex_digest(&Sha256::digest(&buf[start..])));
            buf.push(b'\n');
        }
        let due = may_sync
            && match self.fsync {
                FsyncPolicy::Always => true,
                FsyncPolicy::Interval => {
                    mono.saturating_duration_since(self.last_sync) >= self.fsync_interval
                }
                FsyncPolicy::Never => false,
            };
        let regular = self.regular;
        // Opened at the top of this function (one identity check per batch).
        let Some(f) = self.file.as_mut() else {
            return Err(AuditError::Unavailable("no file".into()));
        };
        let before = regular.then_some(self.len);
        let res = f.write_all(&buf).and_then(|_| f.flush()).and_then(|_| {
            if due {
                f.sync_data()
            } else {
                Ok(())
            }
        });
        if let Err(e) = res {
            // Take back what part of the batch reached the file: its callers are told it was
            // not written. If that fails too, the reopen continues the chain after it.
            if let Some(len) = before {
                let _ = f.set_len(len);
            }
            self.file = None;
            return Err(self.unavailable(format!("write: {e}")));
        }
        if due {
            self.counters.syncs.fetch_add(1, Ordering::Relaxed);
            self.last_sync = Instant::now();
            self.unsynced = false;
        } else {
            self.unsynced = self.fsync != FsyncPolicy::Never;
        }
        self.seq = seq;
        if let Some(h) = &last {
            self.prev.clear();
            self.prev
                .push_str(std::str::from_utf8(h).unwrap_or_default());
        }
        self.len += buf.len() as u64;
        self.refresh_head_at(may_sync, mono);
        if self.stdout {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(&buf);
            let _ = out.flush();
        }
        self.keep_buf(buf);
        self.maybe_rotate();
        Ok(())
    }

    /// Keeps a batch's buffer for the next one, unless it grew large (a big batch, or large
    /// recorded arguments): its memory is not held for good.
    fn keep_buf(&mut self, buf: Vec<u8>) {
        if buf.capacity() <= KEEP_BUF {
            self.buf = buf;
        }
    }

    /// Brings the head sidecar up to date if it is stale and `force` is set or the last
    /// update is `HEAD_EVERY` old.
    fn refresh_head(&mut self, force: bool) {
        self.refresh_head_at(force, Instant::now());
    }

    /// [`Self::refresh_head`], with the time read once by the caller.
    fn refresh_head_at(&mut self, force: bool, now: Instant) {
        if self.head_seq >= self.seq
            || !(force || now.saturating_duration_since(self.head_at) >= HEAD_EVERY)
        {
            return;
        }
        let Some(h) = &self.head else { return };
        let head = Head {
            seq: self.seq,
            hash: self.prev.clone(),
        };
        match write_head_at(h, &head) {
            Ok(()) => {
                self.head_seq = self.seq;
                self.head_at = now;
            }
            Err(e) => {
                tracing::warn!(error = %e, "audit head not written; a cut tail may go unnoticed until it is")
            }
        }
    }

    /// Moves a full file to the next `<path>.NNNNNN`; the next record opens a new file and
    /// continues the chain (its `prev` is the hash of the rotated file's last line).
    fn maybe_rotate(&mut self) {
        if self.rotate_bytes == 0 || !self.regular {
            return;
        }
        if self.len < self.rotate_bytes {
            return;
        }
        // The head names the last record of the file being rotated away.
        self.refresh_head(true);
        let Some(f) = &self.file else { return };
        let _ = f.sync_data();
        let next = segments(&self.path)
            .ok()
            .and_then(|s| s.last().cloned())
            .and_then(|p| {
                p.extension()
                    .and_then(|e| e.to_str())
                    .and_then(|e| e.parse::<u64>().ok())
            })
            .unwrap_or(0)
            + 1;
        let mut target = self.path.as_os_str().to_os_string();
        target.push(format!(".{next:06}"));
        match std::fs::rename(&self.path, PathBuf::from(target)) {
            Ok(()) => {
                self.counters.rotations.fetch_add(1, Ordering::Relaxed);
                self.file = None;
                self.identity = None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "audit rotation failed; continuing in the same file")
            }
        }
    }
}

fn ends_with_newline(path: &Path, len: u64) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = File::open(path) else {
        return true;
    };
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(len - 1))
        .and_then(|_| f.read_exact(&mut b))
        .map(|_| b[0] == b'\n')
        .unwrap_or(true)
}

/// The (seq, hash) of the last complete record of a chain (the file, or if it holds no
/// record yet, its newest rotated segment), to continue it.
pub fn chain_tail(path: &Path) -> std::io::Result<(u64, String)> {
    if let Some(t) = file_tail(path)? {
        return Ok(t);
    }
    for seg in segments(path)?.iter().rev() {
        if let Some(t) = file_tail(seg)? {
            return Ok(t);
        }
    }
    Ok((0, GENESIS.into()))
}

fn file_tail(path: &Path) -> std::io::Result<Option<(u64, String)>> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if !f.metadata()?.is_file() {
        // A device or pipe (e.g. /dev/full in tests): nothing to continue.
        return Ok(None);
    }
    let mut last: Option<(u64, String)> = None;
    for line in BufReader::new(f).lines() {
        let line = line?;
        if let Ok(r) = serde_json::from_str::<Record>(&line) {
            last = Some((r.seq, line_hash(&line)));
        }
    }
    Ok(last)
}

/// Reads every record of an audit file (lines that do not parse are skipped).
pub fn read_records(path: &Path) -> std::io::Result<Vec<Record>> {
    let f = File::open(path)?;
    let mut out = Vec::new();
    for line in BufReader::new(f).lines() {
        let line = line?;
        if let Ok(r) = serde_json::from_str::<Record>(&line) {
            out.push(r);
        }
    }
    Ok(out)
}

/// Reads every record of a chain: the rotated segments of `path`, then `path`.
pub fn read_chain(path: &Path) -> std::io::Result<Vec<Record>> {
    let mut out = Vec::new();
    for f in chain_files(path)? {
        out.extend(read_records(&f)?);
    }
    Ok(out)
}

/// Filters for `gatehouse audit`.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub agent_id: Option<String>,
    pub registration_id: Option<String>,
    pub tool: Option<String>,
    pub outcome: Option<String>,
    pub label: Option<String>,
    pub event: Option<String>,
    /// Records at or after this time.
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    /// Records strictly before this time.
    pub until: Option<chrono::DateTime<chrono::Utc>>,
}

impl Filter {
    pub fn matches(&self, r: &Record) -> bool {
        fn eq(want: &Option<String>, have: &Option<String>) -> bool {
            want.as_ref().is_none_or(|w| have.as_deref() == Some(w))
        }
        let ts = || {
            chrono::DateTime::parse_from_rfc3339(&r.ts)
                .ok()
                .map(|t| t.with_timezone(&chrono::Utc))
        };
        eq(&self.agent_id, &r.agent_id)
            && eq(&self.registration_id, &r.registration_id)
            && eq(&self.tool, &r.tool)
            && eq(&self.outcome, &r.outcome)
            && eq(&self.label, &r.label)
            && self.event.as_ref().is_none_or(|e| &r.event == e)
            && self.since.is_none_or(|s| ts().is_some_and(|t| t >= s))
            && self.until.is_none_or(|u| ts().is_some_and(|t| t < u))
    }
}

// Unit tests only (never built into the daemon): an unwrap that fails is the test failing.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// What the writer wrote before `encode_line`: serde's encoding of the record with `ts`
    /// (if it had none), `seq` and `prev` set.
    fn serde_line(r: &Record, ts: &str, seq: u64, prev: &str) -> String {
        serde_line_on(r, None, ts, seq, prev)
    }

    /// ...and with `node_id` (if it had none) set to `node`.
    fn serde_line_on(r: &Record, node: Option<&str>, ts: &str, seq: u64, prev: &str) -> String {
        let mut r = r.clone();
        if r.ts.is_empty() {
            r.ts = ts.to_string();
        }
        if r.node_id.is_none() {
            r.node_id = node.map(str::to_string);
        }
        r.seq = seq;
        r.prev = prev.to_string();
        serde_json::to_string(&r).unwrap()
    }

    fn encoded(r: &Record, ts: &str, seq: u64, prev: &str) -> String {
        let mut out = Vec::new();
        r.encode_line(ts, seq, prev, &mut out);
        String::from_utf8(out).unwrap()
    }

    fn encoded_on(r: &Record, node: Option<&str>, ts: &str, seq: u64, prev: &str) -> String {
        let mut out = Vec::new();
        r.encode_line_on(node, ts, seq, prev, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn encoded_lines_are_serdes_bytes() {
        let full = Record {
            ts: String::new(),
            seq: 0,
            node_id: None,
            event: "governed_mcp_call".into(),
            registration_id: Some("q0b6zN3Lq6m1o0m9v5d0Yw".into()),
            agent_id: Some("agent \"7\"\\\n\u{1}\u{7f}é🙂".into()),
            label: Some(String::new()),
            session_id: Some("s".into()),
            transport: Some("streamable_http".into()),
            tool: Some("echo".into()),
            upstream: Some("up".into()),
            upstream_request_id: Some(u64::MAX),
            epoch: Some(0),
            args_digest: Some(digest_value(&serde_json::json!({"b": 1, "a": [1.5, null]}))),
            arguments: Some(serde_json::json!({"z": "\u{0}", "a": {"x": -1e300}})),
            outcome: Some("ok".into()),
            error_code: Some(i64::MIN),
            reason: Some("line\r\nbreak\t".into()),
            duration_ms: Some(0.042),
            pid: Some(u32::MAX),
            signal: Some("SIGTERM".into()),
            tools: Some(vec!["a".into(), "b\"".into()]),
            prev: String::new(),
        };
        let ts = "2026-11-29T12:00:00.000000Z";
        let prev = GENESIS;
        for r in [
            full.clone(),
            Record::event("daemon_stopped"),
            Record {
                ts: "1999-01-01T00:00:00Z".into(),
                arguments: Some(Value::Null),
                ..Record::event("x")
            },
        ] {
            assert_eq!(encoded(&r, ts, 7, prev), serde_line(&r, ts, 7, prev));
            assert_eq!(encoded(&r, "", 1, ""), serde_line(&r, "", 1, ""));
            // On a node (DESIGN.md §8): the writer's node id, or the record's own.
            for node in [Some("n1"), Some("0"), None] {
                assert_eq!(
                    encoded_on(&r, node, ts, 7, prev),
                    serde_line_on(&r, node, ts, 7, prev)
                );
                let own = Record {
                    node_id: Some("own".into()),
                    ..r.clone()
                };
                assert_eq!(
                    encoded_on(&own, node, ts, 7, prev),
                    serde_line_on(&own, node, ts, 7, prev)
                );
            }
        }
        assert!(encoded_on(&full, Some("n1"), ts, 7, prev)
            .starts_with(r#"{"ts":"2026-11-29T12:00:00.000000Z","seq":7,"node_id":"n1","event":"#));
        for d in [
            f64::NAN,
            f64::INFINITY,
            -0.0,
            1e-7,
            123456789.0,
            0.1 + 0.2,
            1e21,
        ] {
            let r = Record {
                duration_ms: Some(d),
                ..full.clone()
            };
            assert_eq!(encoded(&r, ts, 1, prev), serde_line(&r, ts, 1, prev));
        }
    }

    proptest::proptest! {
        #[test]
        fn encoded_lines_match_serde_for_any_text(
            event in ".*",
            agent in proptest::option::of(".*"),
            reason in proptest::option::of("\\PC*"),
            tool in proptest::option::of("[\\x00-\\x7f]*"),
            code in proptest::option::of(proptest::num::i64::ANY),
            ms in proptest::option::of(proptest::num::f64::ANY),
            seq in proptest::num::u64::ANY,
            node in proptest::option::of("[a-z0-9]{1,16}"),
        ) {
            let r = Record {
                agent_id: agent,
                reason,
                tool,
                error_code: code,
                duration_ms: ms,
                ..Record::event(&event)
            };
            let ts = "2026-11-29T12:00:00.123456Z";
            proptest::prop_assert_eq!(encoded(&r, ts, seq, GENESIS), serde_line(&r, ts, seq, GENESIS));
            proptest::prop_assert_eq!(
                encoded_on(&r, node.as_deref(), ts, seq, GENESIS),
                serde_line_on(&r, node.as_deref(), ts, seq, GENESIS)
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn needs_escape_is_the_bytewise_test(s in proptest::collection::vec(proptest::num::u8::ANY, 0..40)) {
            let naive = s.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\');
            proptest::prop_assert_eq!(needs_escape(&s), naive);
        }
    }

    #[test]
    fn needs_escape_finds_each_byte_in_each_lane() {
        for b in 0..=255u8 {
            let naive = b < 0x20 || b == b'"' || b == b'\\';
            for at in 0..20 {
                let mut s = vec![b'a'; 20];
                s[at] = b;
                assert_eq!(needs_escape(&s), naive, "byte {b:#x} at {at}");
            }
        }
    }

    #[test]
    fn digests_and_clock_match_the_previous_formatting() {
        let v = serde_json::json!({"message": "hello", "n": [1, 2.5, null, {"k": "v"}]});
        assert_eq!(
            digest_value(&v),
            hex::encode(Sha256::digest(serde_json::to_vec(&v).unwrap()))
        );
        assert_eq!(line_hash("abc"), hex::encode(Sha256::digest(b"abc")));
        let mut c = Clock::default();
        for _ in 0..3 {
            let before = chrono::Utc::now();
            let t = c.now().to_string();
            let after = chrono::Utc::now();
            let parsed = chrono::DateTime::parse_from_rfc3339(&t).unwrap();
            assert!(before.timestamp_micros() <= parsed.timestamp_micros());
            assert!(parsed.timestamp_micros() <= after.timestamp_micros());
            assert_eq!(
                t,
                parsed
                    .with_timezone(&chrono::Utc)
                    .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
            );
        }
    }

    #[test]
    fn head_is_rewritten_in_place_and_a_longer_old_head_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl");
        // An older, longer sidecar (e.g. written by a previous version with extra spacing).
        std::fs::write(head_path(&path), format!("{}\n", " ".repeat(300))).unwrap();
        let f = open_head(&path).unwrap();
        for seq in [1u64, 10, 1_000_000_000_000] {
            let head = Head {
                seq,
                hash: line_hash(&seq.to_string()),
            };
            write_head_at(&f, &head).unwrap();
            assert_eq!(read_head(&path).unwrap(), Some(head));
            assert_eq!(
                std::fs::metadata(head_path(&path)).unwrap().len(),
                HEAD_WIDTH as u64
            );
        }
        // The largest possible head still fits.
        let max = Head {
            seq: u64::MAX,
            hash: "f".repeat(64),
        };
        assert!(head_bytes(&max).is_ok());
    }
}
