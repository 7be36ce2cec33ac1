//! The audit trail: one writer (a thread that owns the file), records chained by hash, and
//! the reader behind `gatehouse audit`.
//!
//! Invariant: a record is written (reaches the OS, and the disk under `fsync = "always"`)
//! before the reply it describes is sent; records are never dropped. If writing fails, tool
//! calls are refused until a write succeeds again.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::oneshot;

use crate::config::{AuditConfig, FsyncPolicy};
use crate::sync::lock;

mod chain;
mod clock;
mod files;
mod record;
pub mod series;
pub mod summary;
pub mod tail;
mod thread;
pub mod verify;
mod writer;

pub use chain::{args_digest, digest_value, head_path, line_hash, read_head, HexDigest};
pub use files::{chain_files, read_chain, read_records, segments, Filter};
pub use record::{prefix, subject_of, Outcome, Record, Subject, EVENTS, MAX_TOOL_NAME_BYTES};
use thread::run;
pub use writer::AuditError;
use writer::{Counters, Job, Writer};

/// A record handed to `Audit::record`: written already (inline), or queued for the thread.
enum Pending {
    Done(Result<(), AuditError>),
    Ack(oneshot::Receiver<Result<(), AuditError>>),
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

/// The writer held by a test ([`Audit::stall`]) until this is dropped.
#[doc(hidden)]
pub struct Stall<'a>(#[allow(dead_code)] std::sync::MutexGuard<'a, Writer>);

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
    /// The console's live series, fed from every record once enabled (the daemon's admin
    /// router does; an embedded gateway never pays for it).
    series: Arc<std::sync::OnceLock<series::Series>>,
    /// A cluster node's applied store revision, stamped on every record (`store_revision`).
    store_revision: Arc<std::sync::atomic::AtomicU64>,
    _thread: Arc<WriterThread>,
}

impl Audit {
    /// Starts the writer thread; the file is created if absent and the chain continued.
    pub fn start(config: &AuditConfig) -> Result<Audit, AuditError> {
        Self::start_on(config, None)
    }

    /// [`Audit::start`] on a node: every record gets `node_id` (DESIGN.md §8).
    pub fn start_on(config: &AuditConfig, node_id: Option<&str>) -> Result<Audit, AuditError> {
        // Unbounded in count, bounded in practice: under `fsync = "always"` every queued
        // record's caller waits for its acknowledgement (one record per call in flight, which
        // `max_in_flight` and the connection limits bound), `record_detached` is for a few
        // lifecycle records, and the inline policies queue only wake-ups after a failed write.
        // why: each queued item has a waiting caller or is rare; `queue_depth` reports it.
        let (tx, rx) = std::sync::mpsc::channel();
        let healthy = Arc::new(AtomicBool::new(true));
        let depth = Arc::new(AtomicUsize::new(0));
        let counters = Arc::new(Counters::default());
        let mut writer = Writer::open(config, counters.clone())?;
        writer.node_id = node_id.map(str::to_string);
        let store_revision = writer.store_revision.clone();
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
            series: Arc::default(),
            store_revision,
            _thread: Arc::new(WriterThread(Some(handle))),
        })
    }

    /// A cluster node applied the store up to `revision`: later records carry it.
    pub fn set_store_revision(&self, revision: u64) {
        self.store_revision
            .fetch_max(revision, std::sync::atomic::Ordering::AcqRel);
    }

    /// Writes a record and waits until it is written (per the fsync policy).
    ///
    /// Under `interval` and `never` the record is written when this is called (the future
    /// only reports how that went), from the caller's own record: what it borrows is not
    /// copied. Under `always` it is queued then (as an owned copy, `Record::into_owned`), and
    /// the future waits for the writer's acknowledgement. Not an `async fn`: its future would
    /// hold the `Record` (hundreds of bytes) inside every caller's future, and borrow what
    /// the record borrows.
    pub fn record(
        &self,
        mut record: Record<'_>,
    ) -> impl std::future::Future<Output = Result<(), AuditError>> + Send + 'static {
        record.bounded();
        self.observe(&record);
        let pending = if self.inline {
            Pending::Done(self.write_inline(&record))
        } else {
            self.enqueue(record.into_owned())
        };
        async move {
            match pending {
                Pending::Done(result) => result,
                Pending::Ack(ack) => ack.await.map_err(|_| AuditError::Stopped)?,
            }
        }
    }

    /// Feeds the console's series, when enabled (one atomic load when not).
    fn observe(&self, record: &Record<'_>) {
        if let Some(s) = self.series.get() {
            s.observe(record);
        }
    }

    /// Turns the console's series on (idempotent): every record from now on feeds it.
    pub fn enable_series(&self) {
        self.series.get_or_init(series::Series::new);
    }

    /// The console's series, if enabled.
    pub fn series(&self) -> Option<&series::Series> {
        self.series.get()
    }

    /// Queues a record for the writer thread.
    fn enqueue(&self, record: Record<'static>) -> Pending {
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
    pub fn record_detached(&self, mut record: Record<'_>) {
        record.bounded();
        self.observe(&record);
        if self.inline {
            let _ = self.write_inline(&record);
            return;
        }
        self.depth.fetch_add(1, Ordering::Relaxed);
        let _ = self.tx.send(Job {
            record: Some(record.into_owned()),
            ack: None,
        });
    }

    /// Writes one record in the caller's thread (see the type's documentation).
    fn write_inline(&self, record: &Record<'_>) -> Result<(), AuditError> {
        let result = {
            let mut w = lock(&self.writer);
            let result = w.write_batch(std::iter::once(record), false);
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

    /// Tests: holds the writer until the guard is dropped, so a record handed to the writer
    /// thread (`fsync = "always"`) waits — a slow disk, as the caller sees it. Not for inline
    /// policies: their callers would block on the lock.
    #[doc(hidden)]
    pub fn stall(&self) -> Stall<'_> {
        Stall(lock(&self.writer))
    }
}
