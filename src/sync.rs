//! Small helpers shared by every module: the poison-tolerant std locks, the hasher of the
//! in-memory maps, [`unless_cancelled`], and coarse deadlines ([`coarse`]).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;
use tokio_util::sync::CancellationToken;

pub(crate) mod coarse;

/// Locks a std mutex, ignoring poisoning: a panic elsewhere mid-update leaves plain data that
/// every path keeps consistent, so the value is still usable. Never held across `.await`.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Read-locks a std `RwLock`, ignoring poisoning (as [`lock`]).
pub(crate) fn read<T>(rw: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    rw.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks a std `RwLock`, ignoring poisoning (as [`lock`]).
pub(crate) fn write<T>(rw: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    rw.write().unwrap_or_else(PoisonError::into_inner)
}

/// The map of the gateway's in-memory tables (registrations, sessions, in-flight requests,
/// slots, tools, metric handles): std's `HashMap` with foldhash, seeded per process. Their
/// keys are ids the gateway made, configured names, or a client's request ids (bounded per
/// session), looked up on every call, where SipHash cost more than the lookup itself.
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The set of the same tables (see [`HashMap`]).
pub(crate) type HashSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;

/// Runs `fut` to its end, or until `token` is cancelled (`None`; `fut` is then dropped, or
/// kept going by the caller if it passed `fut` by `Pin<&mut _>`).
///
/// Unlike a `select!` over `token.cancelled()`, the token's future is polled only when it
/// was woken (and once first, to register), not on every wake of the task: each poll of it
/// takes the token's lock and its waiter list's lock, and a long-lived task woken per request
/// (a connection) would take both — shared by every connection under the same token — each
/// time.
pub(crate) async fn unless_cancelled<F: Future>(
    token: &CancellationToken,
    fut: F,
) -> Option<F::Output> {
    let flag = Arc::new(WakeFlag::default());
    let waker = Waker::from(flag.clone());
    let mut cancelled = std::pin::pin!(token.cancelled());
    let mut fut = std::pin::pin!(fut);
    let mut first = true;
    std::future::poll_fn(|cx| {
        flag.task.register(cx.waker());
        if std::mem::take(&mut first) || flag.woken.swap(false, Ordering::AcqRel) {
            let mut own = Context::from_waker(&waker);
            if cancelled.as_mut().poll(&mut own).is_ready() {
                return Poll::Ready(None);
            }
        }
        fut.as_mut().poll(cx).map(Some)
    })
    .await
}

/// The waker given to the token's future: it marks the token as worth polling, then wakes
/// the task.
#[derive(Default)]
struct WakeFlag {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn unless_cancelled_ends_the_future_or_yields_to_the_token() {
        let token = CancellationToken::new();
        assert_eq!(unless_cancelled(&token, async { 7 }).await, Some(7));

        // A future that wakes its task often (as a connection does) still sees the token.
        let (t2, ticks) = (
            token.clone(),
            Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        );
        let n = ticks.clone();
        let busy = async move {
            loop {
                n.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        };
        let run = tokio::spawn(async move { unless_cancelled(&t2, busy).await.is_none() });
        tokio::time::sleep(Duration::from_millis(30)).await;
        token.cancel();
        let ended = tokio::time::timeout(Duration::from_secs(5), run).await;
        assert!(
            matches!(ended, Ok(Ok(true))),
            "cancelled while busy: {ended:?}"
        );
        assert!(
            ticks.load(Ordering::Relaxed) > 3,
            "the future ran meanwhile"
        );

        // Already cancelled: the future is not polled.
        let polled = AtomicBool::new(false);
        let out = unless_cancelled(&token, async { polled.store(true, Ordering::Relaxed) }).await;
        assert!(out.is_none() && !polled.load(Ordering::Relaxed));
    }
}
