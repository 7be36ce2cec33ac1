//! The idle reaper: every tick, closes the connections idle past their upstream's
//! `idle_timeout_s` (a slot with a call in flight or an open lease is never evicted).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::slot::Slot;

/// A quarter of the shortest idle timeout, within 250 ms .. 30 s.
pub(super) fn tick(min_idle_s: u64) -> Duration {
    Duration::from_millis((min_idle_s.max(1) * 1000 / 4).clamp(250, 30_000))
}

/// Runs `evict(now)` every `tick` until `stop` fires or `evict` says the pool is gone (`None`).
pub(super) async fn run<F, Fut>(tick: Duration, stop: CancellationToken, mut evict: F)
where
    F: FnMut(Instant) -> Option<Fut>,
    Fut: Future<Output = usize>,
{
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(tick) => {}
        }
        let Some(pass) = evict(Instant::now()) else {
            return;
        };
        pass.await;
    }
}

/// Closes the idle connections among `slots`; returns how many.
pub(super) async fn evict(slots: Vec<(Arc<Slot>, Duration)>, now: Instant) -> usize {
    let mut n = 0;
    for (slot, idle) in slots {
        if slot.evict_if_idle(now, idle).await {
            n += 1;
        }
    }
    n
}
