//! The writer thread: group commit under `fsync = "always"`, the interval sync and the
//! head's trail under inline writing, probes while unhealthy, the last sync at the end.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::writer::{Job, Writer};
use crate::config::FsyncPolicy;
use crate::sync::lock;

/// How long a failed writer waits between attempts to write again when no record is queued.
const RETRY_EVERY: Duration = Duration::from_millis(200);

const HEAD_TRAIL: Duration = Duration::from_millis(100);

/// The writer thread. Thread mode (`fsync = "always"`): writes queued records in batches and
/// acknowledges them. Inline mode: records are written by their callers; this syncs the file
/// every interval and, while unhealthy, probes every `RETRY_EVERY`. Ends when every handle
/// is gone (the channel closes), after a last sync.
pub(super) fn run(
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
            let records = batch.iter().filter_map(|j| j.record.as_ref());
            let result = w.write_batch(records, !inline);
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
