//! The writer: the open file (reopened when its path names another), the chain's position,
//! a batch encoded, written and (per the fsync policy) synced, the head brought up to date,
//! rotation, and the probe that ends an outage.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio::sync::oneshot;

use super::chain::{chain_tail, hex_digest, open_head, read_head, write_head_at, Head};
use super::clock::Clock;
use super::files::{ends_with_newline, segments, OWNER_ONLY};
use super::record::Record;
use crate::config::{AuditConfig, FsyncPolicy};

/// Why an audit operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuditError {
    #[error("audit log unavailable: {0}")]
    Unavailable(String),
    #[error("audit writer stopped")]
    Stopped,
}

pub(super) struct Job {
    /// `None`: only wakes the writer thread (an inline write failed: start probing).
    /// Owned: it waits in the channel after its caller moved on.
    pub(super) record: Option<Record<'static>>,
    pub(super) ack: Option<oneshot::Sender<Result<(), AuditError>>>,
}

/// Counters of the writer, for tests and metrics.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) batches: AtomicU64,
    pub(super) syncs: AtomicU64,
    pub(super) failures: AtomicU64,
    pub(super) rotations: AtomicU64,
}

/// The writer compares the file it holds with what its path names (a `statx`) at most this
/// often, not before every record (a syscall per call otherwise, ~1.4 µs; issue 19). A file
/// moved aside or replaced keeps the records of that last millisecond, in order, and the next
/// ones go to the new file: nothing is lost, the chain goes on across the two.
const IDENTITY_EVERY: Duration = Duration::from_millis(1);

/// Inline writers update the head sidecar at most this often; the thread brings a stale head
/// up to date within `HEAD_TRAIL`, and at the end. (Under `fsync = "always"` the head is
/// written after every batch.)
const HEAD_EVERY: Duration = Duration::from_millis(20);

pub(super) struct Writer {
    path: PathBuf,
    pub(super) file: Option<File>,
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
    pub(super) node_id: Option<String>,
    /// A cluster node's applied store revision (0: none), written into every record.
    pub(super) store_revision: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub(super) fsync: FsyncPolicy,
    pub(super) fsync_interval: Duration,
    pub(super) last_sync: Instant,
    pub(super) unsynced: bool,
    stdout: bool,
    rotate_bytes: u64,
    pub(super) counters: Arc<Counters>,
    last_error: Option<(String, Instant)>,
    /// The lines of a batch, encoded (kept between batches, see `keep_buf`).
    buf: Vec<u8>,
    clock: Clock,
}

/// A batch buffer larger than this is not kept for the next batch.
const KEEP_BUF: usize = 64 * 1024;

impl Writer {
    pub(super) fn open(
        config: &AuditConfig,
        counters: Arc<Counters>,
    ) -> Result<Writer, AuditError> {
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
            store_revision: std::sync::Arc::default(),
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

    pub(super) fn note(&mut self, result: &Result<(), AuditError>, healthy: &AtomicBool, n: usize) {
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
    pub(super) fn probe(&mut self, healthy: &AtomicBool) {
        let mut rec = Record::event("audit_resumed");
        if let Some((err, since)) = &self.last_error {
            rec.reason = Some(format!("audit was unavailable: {err}").into());
            rec.duration_ms = Some(since.elapsed().as_secs_f64() * 1000.0);
        }
        let result = self.write_batch(std::iter::once(&rec), true);
        if result.is_ok() {
            tracing::info!("audit writable again; tool calls resume");
        }
        self.note(&result, healthy, 1);
    }

    /// Writes a batch of records, in order (read, not taken: an inline write's record is its
    /// caller's, borrowed). `may_sync`: an `fsync` that is due may be done here (false when
    /// the caller is a runtime worker: the thread syncs instead).
    pub(super) fn write_batch<'r, 'a: 'r>(
        &mut self,
        records: impl IntoIterator<Item = &'r Record<'a>>,
        may_sync: bool,
    ) -> Result<(), AuditError> {
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
        let revision = Some(
            self.store_revision
                .load(std::sync::atomic::Ordering::Acquire),
        )
        .filter(|r| *r > 0);
        for r in records {
            seq += 1;
            let prev = match &last {
                Some(h) => std::str::from_utf8(h).unwrap_or_default(),
                None => &self.prev,
            };
            let start = buf.len();
            r.encode_line_at(self.node_id.as_deref(), revision, now, seq, prev, &mut buf);
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
    pub(super) fn refresh_head(&mut self, force: bool) {
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
