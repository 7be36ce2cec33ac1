//! The audit trail: one writer (a thread that owns the file), records chained by hash, and
//! the reader behind `gatehouse audit`.
//!
//! Invariant: a record is written (reaches the OS, and the disk under `fsync = "always"`)
//! before the reply it describes is sent; records are never dropped. If writing fails, tool
//! calls are refused until a write succeeds again.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

use crate::config::{AuditConfig, FsyncPolicy};

/// Why an audit operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuditError {
    #[error("audit log unavailable: {0}")]
    Unavailable(String),
    #[error("audit writer stopped")]
    Stopped,
}

/// One audit record. `ts`, `seq` and `prev` are set by the writer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Record {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ts: String,
    #[serde(default)]
    pub seq: u64,
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

impl Record {
    pub fn event(event: &str) -> Self {
        Record {
            event: event.to_string(),
            ..Default::default()
        }
    }
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
    hex::encode(Sha256::digest(v.to_string().as_bytes()))
}

/// The hash that links a line to the next record's `prev`.
pub fn line_hash(line: &str) -> String {
    hex::encode(Sha256::digest(line.as_bytes()))
}

/// The genesis `prev` value of a new chain.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

struct Job {
    record: Record,
    ack: Option<oneshot::Sender<Result<(), AuditError>>>,
}

/// A cheap handle to the audit writer.
#[derive(Clone)]
pub struct Audit {
    tx: mpsc::UnboundedSender<Job>,
    healthy: Arc<AtomicBool>,
    depth: Arc<AtomicUsize>,
    path: Arc<PathBuf>,
}

impl Audit {
    /// Starts the writer thread; the file is created if absent and the chain continued.
    pub fn start(config: &AuditConfig) -> Result<Audit, AuditError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let healthy = Arc::new(AtomicBool::new(true));
        let depth = Arc::new(AtomicUsize::new(0));
        let mut writer = Writer::open(config)?;
        let (h, d) = (healthy.clone(), depth.clone());
        std::thread::Builder::new()
            .name("gatehouse-audit".into())
            .spawn(move || writer.run(rx, h, d))
            .map_err(|e| AuditError::Unavailable(format!("cannot start writer: {e}")))?;
        Ok(Audit {
            tx,
            healthy,
            depth,
            path: Arc::new(config.path.clone()),
        })
    }

    /// Writes a record and waits until it is written (per the fsync policy).
    pub async fn record(&self, record: Record) -> Result<(), AuditError> {
        let (ack, done) = oneshot::channel();
        self.depth.fetch_add(1, Ordering::Relaxed);
        self.tx
            .send(Job {
                record,
                ack: Some(ack),
            })
            .map_err(|_| AuditError::Stopped)?;
        done.await.map_err(|_| AuditError::Stopped)?
    }

    /// Queues a record without waiting (for `Drop` paths). It is still written, in order.
    pub fn record_detached(&self, record: Record) {
        self.depth.fetch_add(1, Ordering::Relaxed);
        let _ = self.tx.send(Job { record, ack: None });
    }

    /// False after a failed write, until a write succeeds again.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    /// Records queued and not yet written.
    pub fn queue_depth(&self) -> usize {
        self.depth.load(Ordering::Relaxed)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

struct Writer {
    path: PathBuf,
    file: Option<File>,
    seq: u64,
    prev: String,
    fsync: FsyncPolicy,
    fsync_interval: Duration,
    last_sync: Instant,
    stdout: bool,
}

impl Writer {
    fn open(config: &AuditConfig) -> Result<Writer, AuditError> {
        let (seq, prev) = chain_tail(&config.path)
            .map_err(|e| AuditError::Unavailable(format!("{}: {e}", config.path.display())))?;
        let mut w = Writer {
            path: config.path.clone(),
            file: None,
            seq,
            prev,
            fsync: config.fsync,
            fsync_interval: Duration::from_millis(config.fsync_interval_ms),
            last_sync: Instant::now(),
            stdout: config.stdout,
        };
        w.ensure_open()?;
        Ok(w)
    }

    fn ensure_open(&mut self) -> Result<&mut File, AuditError> {
        if self.file.is_none() {
            if let Some(dir) = self.path.parent().filter(|p| !p.as_os_str().is_empty()) {
                let _ = std::fs::create_dir_all(dir);
            }
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
                .map_err(|e| AuditError::Unavailable(format!("{}: {e}", self.path.display())))?;
            self.file = Some(f);
        }
        self.file
            .as_mut()
            .ok_or_else(|| AuditError::Unavailable("no file".into()))
    }

    fn run(
        &mut self,
        mut rx: mpsc::UnboundedReceiver<Job>,
        healthy: Arc<AtomicBool>,
        depth: Arc<AtomicUsize>,
    ) {
        while let Some(first) = rx.blocking_recv() {
            let mut batch = vec![first];
            while batch.len() < 512 {
                match rx.try_recv() {
                    Ok(j) => batch.push(j),
                    Err(_) => break,
                }
            }
            let n = batch.len();
            let result = self.write_batch(&mut batch);
            healthy.store(result.is_ok(), Ordering::Release);
            if let Err(e) = &result {
                tracing::error!(error = %e, records = n, "audit write failed; tool calls are refused until it works again");
            }
            depth.fetch_sub(n, Ordering::Relaxed);
            for job in batch {
                if let Some(ack) = job.ack {
                    let _ = ack.send(result.clone());
                }
            }
        }
        if let Some(f) = &self.file {
            let _ = f.sync_data();
        }
    }

    fn write_batch(&mut self, batch: &mut [Job]) -> Result<(), AuditError> {
        let mut buf = String::new();
        let (mut seq, mut prev) = (self.seq, self.prev.clone());
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        for job in batch.iter_mut() {
            let r = &mut job.record;
            seq += 1;
            r.seq = seq;
            if r.ts.is_empty() {
                r.ts = now.clone();
            }
            r.prev = prev.clone();
            let line = serde_json::to_string(r)
                .map_err(|e| AuditError::Unavailable(format!("encode: {e}")))?;
            prev = line_hash(&line);
            buf.push_str(&line);
            buf.push('\n');
        }
        let policy = self.fsync;
        let due = match policy {
            FsyncPolicy::Always => true,
            FsyncPolicy::Interval => self.last_sync.elapsed() >= self.fsync_interval,
            FsyncPolicy::Never => false,
        };
        let res = (|| {
            let f = self.ensure_open()?;
            f.write_all(buf.as_bytes())
                .and_then(|_| f.flush())
                .and_then(|_| if due { f.sync_data() } else { Ok(()) })
                .map_err(|e| AuditError::Unavailable(format!("write: {e}")))
        })();
        if res.is_err() {
            // Reopen next time; the chain does not advance past records not written.
            self.file = None;
            return res;
        }
        if due {
            self.last_sync = Instant::now();
        }
        self.seq = seq;
        self.prev = prev;
        if self.stdout {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(buf.as_bytes());
            let _ = out.flush();
        }
        Ok(())
    }
}

/// The (seq, hash) of the last complete record of a file, to continue its chain.
pub fn chain_tail(path: &Path) -> std::io::Result<(u64, String)> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, GENESIS.into())),
        Err(e) => return Err(e),
    };
    if !f.metadata()?.is_file() {
        // A device or pipe (e.g. /dev/full in tests): nothing to continue.
        return Ok((0, GENESIS.into()));
    }
    let mut last: Option<String> = None;
    for line in BufReader::new(f).lines() {
        let line = line?;
        if serde_json::from_str::<Value>(&line).is_ok() {
            last = Some(line);
        }
    }
    Ok(match last {
        Some(line) => {
            let seq = serde_json::from_str::<Record>(&line)
                .map(|r| r.seq)
                .unwrap_or(0);
            (seq, line_hash(&line))
        }
        None => (0, GENESIS.into()),
    })
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

/// Filters for `gatehouse audit`.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub agent_id: Option<String>,
    pub registration_id: Option<String>,
    pub tool: Option<String>,
    pub outcome: Option<String>,
    pub label: Option<String>,
    pub event: Option<String>,
}

impl Filter {
    pub fn matches(&self, r: &Record) -> bool {
        fn eq(want: &Option<String>, have: &Option<String>) -> bool {
            want.as_ref().is_none_or(|w| have.as_deref() == Some(w))
        }
        eq(&self.agent_id, &r.agent_id)
            && eq(&self.registration_id, &r.registration_id)
            && eq(&self.tool, &r.tool)
            && eq(&self.outcome, &r.outcome)
            && eq(&self.label, &r.label)
            && self.event.as_ref().is_none_or(|e| &r.event == e)
    }
}
