//! Coarse deadlines: waits that end within one tick ([`TICK`], 100 ms) after their time, for
//! the per-call waits whose precision does not matter (a reply's keep-alive period, an
//! upstream request's timeout) and which nearly always end otherwise, long before it.
//!
//! A `tokio::time::Sleep` per call costs a timer-wheel entry: set up, registered on its first
//! poll, polled again on every wake of its task and taken out when dropped — about 1,200
//! instructions, twice per proxied `tools/call` (bench/callgrind.sh). Here a wait is one slot
//! in a process-wide table, taken on its first poll and given back when it is dropped (a
//! short lock each), and checked on later polls with one atomic load. A single thread (the
//! ticker) advances the tick count once per tick and wakes the waits that are due; it runs
//! only while a wait is live (with none it is parked: an idle process has no wake-ups). It
//! is started when the first gateway is built ([`start`], or by the first wait) and lives as
//! long as the process, like tokio's own timer thread; it owns nothing but the count and the
//! wakes.
//!
//! The ticks are real time (`std::time::Instant`), not tokio's clock: a test that pauses
//! tokio's clock does not move these deadlines.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use super::lock;

/// The resolution of a coarse wait: it ends between its duration and one tick later.
pub const TICK: Duration = Duration::from_millis(100);

/// The live waits: `(due tick, waker)` per slot (the waker is taken when it is woken).
#[derive(Default)]
struct Table {
    slots: Vec<Option<(u64, Option<Waker>)>>,
    free: Vec<usize>,
    live: usize,
}

static TABLE: Mutex<Table> = Mutex::new(Table {
    slots: Vec::new(),
    free: Vec::new(),
    live: 0,
});
/// Ticks since [`EPOCH`], as of the last tick (or of the first wait after a pause).
static TICKS: AtomicU64 = AtomicU64::new(0);
static EPOCH: OnceLock<Instant> = OnceLock::new();
static TICKER: OnceLock<Option<std::thread::Thread>> = OnceLock::new();

fn now_ticks() -> u64 {
    let n = EPOCH.get_or_init(Instant::now).elapsed().as_nanos() / TICK.as_nanos();
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Starts the ticker thread if it is not running yet (the gateway does so when it is built,
/// so that the thread is there from a process's idle start: tests/soak.rs counts threads).
pub fn start() {
    let _ = ticker();
}

/// The ticker thread, started once; `None` if it could not be (waits then use tokio's timer).
fn ticker() -> Option<&'static std::thread::Thread> {
    TICKER
        .get_or_init(|| {
            std::thread::Builder::new()
                .name("gatehouse-ticks".into())
                .spawn(run)
                .ok()
                .map(|h| h.thread().clone())
        })
        .as_ref()
}

fn run() {
    let mut due = Vec::new();
    loop {
        if lock(&TABLE).live == 0 {
            // Unparked by the first wait to register (an unpark that comes before this park
            // makes it return at once, so none is missed).
            std::thread::park();
            continue;
        }
        std::thread::sleep(TICK);
        let now = now_ticks();
        TICKS.store(now, Ordering::Release);
        {
            let mut table = lock(&TABLE);
            for (at, waker) in table.slots.iter_mut().flatten() {
                if *at <= now {
                    if let Some(w) = waker.take() {
                        due.push(w);
                    }
                }
            }
        }
        // Woken outside the lock.
        for w in due.drain(..) {
            w.wake();
        }
    }
}

/// A coarse wait (see the module); made by [`sleep`].
pub struct Sleep {
    ticks: u64,
    state: State,
}

enum State {
    /// Not polled yet.
    New,
    /// In the table at `slot`, due at tick `due`, registered with the waker identified by
    /// `waker` (its data pointer and vtable, compared as `Waker::will_wake` would).
    Waiting {
        slot: usize,
        due: u64,
        waker: (usize, &'static std::task::RawWakerVTable),
    },
    /// The ticker could not be started: tokio's timer.
    Fallback(Pin<Box<tokio::time::Sleep>>),
    Done,
}

/// Waits for `d` or up to one [`TICK`] longer (not less, as far as the ticker thread is
/// scheduled on time). Nothing happens before its first poll; dropping it ends the wait.
pub fn sleep(d: Duration) -> Sleep {
    // The count read at the first poll may be up to one tick old: one tick more is waited.
    let n = d.as_nanos().div_ceil(TICK.as_nanos()).saturating_add(1);
    Sleep {
        ticks: u64::try_from(n).unwrap_or(u64::MAX),
        state: State::New,
    }
}

fn waker_id(w: &Waker) -> (usize, &'static std::task::RawWakerVTable) {
    (w.data() as usize, w.vtable())
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        match &mut this.state {
            State::New => {
                let Some(thread) = ticker() else {
                    let d = TICK.saturating_mul(u32::try_from(this.ticks).unwrap_or(u32::MAX));
                    let mut s = Box::pin(tokio::time::sleep(d));
                    let polled = s.as_mut().poll(cx);
                    this.state = State::Fallback(s);
                    return polled;
                };
                let (slot, due, woke_ticker) = {
                    let mut table = lock(&TABLE);
                    let woke_ticker = table.live == 0;
                    if woke_ticker {
                        // The ticker was parked: its count may be old.
                        TICKS.store(now_ticks(), Ordering::Release);
                    }
                    let due = TICKS.load(Ordering::Acquire).saturating_add(this.ticks);
                    let entry = Some((due, Some(cx.waker().clone())));
                    let slot = match table.free.pop() {
                        Some(i) => {
                            table.slots[i] = entry;
                            i
                        }
                        None => {
                            table.slots.push(entry);
                            table.slots.len() - 1
                        }
                    };
                    table.live += 1;
                    (slot, due, woke_ticker)
                };
                if woke_ticker {
                    thread.unpark();
                }
                this.state = State::Waiting {
                    slot,
                    due,
                    waker: waker_id(cx.waker()),
                };
                Poll::Pending
            }
            State::Waiting { slot, due, waker } => {
                if TICKS.load(Ordering::Acquire) < *due {
                    // Polled by another task than the one registered (a call's work moved to
                    // a task of its own): the wake goes to this one from now on.
                    if *waker != waker_id(cx.waker()) {
                        *waker = waker_id(cx.waker());
                        let mut table = lock(&TABLE);
                        if let Some(Some((_, w))) = table.slots.get_mut(*slot) {
                            *w = Some(cx.waker().clone());
                        }
                    }
                    return Poll::Pending;
                }
                this.release();
                this.state = State::Done;
                Poll::Ready(())
            }
            State::Fallback(s) => s.as_mut().poll(cx),
            State::Done => Poll::Ready(()),
        }
    }
}

impl Sleep {
    /// Gives its slot back, if it holds one.
    fn release(&mut self) {
        if let State::Waiting { slot, .. } = self.state {
            let mut table = lock(&TABLE);
            if let Some(entry) = table.slots.get_mut(slot) {
                *entry = None;
                table.free.push(slot);
                table.live = table.live.saturating_sub(1);
            }
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_coarse_sleep_is_not_short_and_at_most_two_ticks_long() {
        for ms in [0u64, 1, 100, 250] {
            let d = Duration::from_millis(ms);
            let began = Instant::now();
            sleep(d).await;
            let took = began.elapsed();
            assert!(took >= d, "{ms} ms slept {took:?}");
            assert!(
                took <= d + 2 * TICK + Duration::from_millis(150),
                "{ms} ms slept {took:?}"
            );
        }
    }

    #[tokio::test]
    async fn many_waits_end_and_dropped_ones_give_their_slots_back() {
        let began = Instant::now();
        let waits: Vec<_> = (0..100)
            .map(|_| tokio::spawn(sleep(Duration::from_millis(200))))
            .collect();
        for w in waits {
            assert!(w.await.is_ok());
        }
        assert!(began.elapsed() >= Duration::from_millis(200));
        // Dropped before their time: their slots are free again (other tests' waits may be
        // live meanwhile, so the table is only bounded, not empty).
        for _ in 0..1000 {
            let cut =
                tokio::time::timeout(Duration::from_millis(1), sleep(Duration::from_secs(60)));
            assert!(cut.await.is_err());
        }
        assert!(lock(&TABLE).slots.len() < 500);
    }

    /// A wait moved to another task (as a call's work is when its response goes away) wakes
    /// that task.
    #[tokio::test]
    async fn a_wait_moved_to_another_task_wakes_it() {
        let mut s = Box::pin(sleep(Duration::from_millis(150)));
        // First polled here, by this task...
        assert!(futures::poll!(s.as_mut()).is_pending());
        // ...then finished by another.
        let took = tokio::time::timeout(Duration::from_secs(5), tokio::spawn(s)).await;
        assert!(matches!(took, Ok(Ok(()))), "{took:?}");
    }
}
