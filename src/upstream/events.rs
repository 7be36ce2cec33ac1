//! A slot's event channel, bounded: what its connections report that no call owns
//! (connection-wide notifications, progress without a sink, server → client requests) goes
//! through a queue of [`EVENT_QUEUE`] events and a per-connection rate limit
//! ([`EVENT_RATE_PER_S`], burst [`EVENT_BURST`]). Over either, an event is refused: counted in
//! [`NotificationsRefused`] (a server request is answered with an error instead), and the log
//! gets one line when refusals start and one summary per [`SUMMARY_EVERY`] — never a line per
//! event. `Closed` (one per connection epoch) has its own channel and is never refused.
//!
//! A barrier ([`EventSink::barrier`]) is queued like an event, outside the rate, and is
//! passed when the event task has handled everything queued before it: a call that a task ran
//! waits for it so that the task's last progress, read before its final status, reaches the
//! call's stream before the reply.
//!
//! [`Limiter`] is also what the stdio transport uses for its child's stderr lines.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{NotificationsRefused, UpstreamEvent};
use crate::sync::lock;

/// Events queued per slot before further ones are refused.
pub const EVENT_QUEUE: usize = 1024;
/// Sustained connection-wide events per second per connection.
pub const EVENT_RATE_PER_S: u32 = 100;
/// Events a connection may send in a burst above the sustained rate.
pub const EVENT_BURST: u32 = 500;
/// How often refusals are summed up in the log while they go on.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// A token bucket plus the refusal count of the current summary window.
pub(crate) struct Limiter {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
    refused: u64,
    /// When the current summary window began (None: nothing refused yet).
    window: Option<Instant>,
}

/// What a refusal asks the caller to log.
pub(crate) enum Refusal {
    /// The first refusal after a quiet period: say that refusals started.
    Started,
    /// Counted; the next summary will say it.
    Counted,
}

impl Limiter {
    pub(crate) fn new(rate_per_s: u32, burst: u32) -> Self {
        let now = Instant::now();
        Self {
            rate: f64::from(rate_per_s),
            burst: f64::from(burst.max(1)),
            tokens: f64::from(burst.max(1)),
            last: now,
            refused: 0,
            window: None,
        }
    }

    /// Takes a token if there is one.
    pub(crate) fn admit(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Counts one refusal.
    pub(crate) fn refuse(&mut self, now: Instant) -> Refusal {
        let quiet = self
            .window
            .is_none_or(|w| now.saturating_duration_since(w) >= SUMMARY_EVERY);
        if self.refused == 0 && quiet {
            // The first refusal, or the first after a quiet window: said at once, and it opens
            // a new window.
            self.window = Some(now);
            return Refusal::Started;
        }
        self.refused += 1;
        Refusal::Counted
    }

    /// The refusals of a window that is over (or of any window if `force`), once.
    pub(crate) fn summary(&mut self, now: Instant, force: bool) -> Option<u64> {
        let over = self
            .window
            .is_none_or(|w| now.saturating_duration_since(w) >= SUMMARY_EVERY);
        if self.refused == 0 || !(force || over) {
            return None;
        }
        self.window = Some(now);
        Some(std::mem::take(&mut self.refused))
    }
}

struct Gate {
    upstream_id: String,
    limiter: Mutex<Limiter>,
    refused: NotificationsRefused,
}

impl Gate {
    fn refuse(&self, what: &str, why: &str) {
        let started = matches!(lock(&self.limiter).refuse(Instant::now()), Refusal::Started);
        if started {
            tracing::warn!(upstream = %self.upstream_id, what, why, rate_per_s = EVENT_RATE_PER_S, burst = EVENT_BURST, queue = EVENT_QUEUE, "refusing connection-wide events from this upstream (counted; summed up every {} s while it goes on)", SUMMARY_EVERY.as_secs());
        }
    }

    fn flush(&self, force: bool) {
        let n = lock(&self.limiter).summary(Instant::now(), force);
        if let Some(n) = n {
            tracing::warn!(upstream = %self.upstream_id, refused = n, rate_per_s = EVENT_RATE_PER_S, burst = EVENT_BURST, "connection-wide events refused since the last summary");
        }
    }
}

/// What the event queue carries: an event, or a barrier to pass.
enum Queued {
    Event(UpstreamEvent),
    Barrier(Arc<tokio::sync::Notify>),
}

/// The sending side, one clone per connection of the slot.
#[derive(Clone)]
pub struct EventSink {
    events: mpsc::Sender<Queued>,
    closed: mpsc::UnboundedSender<UpstreamEvent>,
    gate: Arc<Gate>,
}

/// The receiving side: the slot's event task.
pub struct EventReceiver {
    events: mpsc::Receiver<Queued>,
    closed: mpsc::UnboundedReceiver<UpstreamEvent>,
    gate: Arc<Gate>,
}

/// A slot's event channel; refusals are counted in `refused`.
pub fn channel(upstream_id: &str, refused: NotificationsRefused) -> (EventSink, EventReceiver) {
    let (tx, rx) = mpsc::channel(EVENT_QUEUE);
    // bounded: carries `Closed` only, which each connection sends once (first `mark_closed`
    // wins); connections of a slot are made one at a time behind the respawn backoff.
    let (closed_tx, closed_rx) = mpsc::unbounded_channel(); // bounded: one `Closed` per connection epoch
    let gate = Arc::new(Gate {
        upstream_id: upstream_id.to_owned(),
        limiter: Mutex::new(Limiter::new(EVENT_RATE_PER_S, EVENT_BURST)),
        refused,
    });
    (
        EventSink {
            events: tx,
            closed: closed_tx,
            gate: gate.clone(),
        },
        EventReceiver {
            events: rx,
            closed: closed_rx,
            gate,
        },
    )
}

impl EventSink {
    /// `Closed`: always queued (the receiver may be gone: then nobody needs it).
    pub(crate) fn closed(&self, epoch: u64, reason: String) {
        let _ = self.closed.send(UpstreamEvent::Closed { epoch, reason });
    }

    /// Queues a notification or progress event within the rate and the queue's room;
    /// otherwise refuses it (counted). Returns whether it was queued.
    pub(crate) fn notify(&self, event: UpstreamEvent) -> bool {
        match self.offer(event) {
            Ok(()) => true,
            Err(why) => {
                self.gate.refused.inc();
                self.gate.refuse("notification", why);
                false
            }
        }
    }

    /// Queues a server → client request, or says why not (the caller answers the upstream).
    pub(crate) fn request(&self, event: UpstreamEvent) -> Result<(), &'static str> {
        self.offer(event)
            .inspect_err(|why| self.gate.refuse("request", why))
    }

    fn offer(&self, event: UpstreamEvent) -> Result<(), &'static str> {
        if !lock(&self.gate.limiter).admit(Instant::now()) {
            return Err("over the connection's rate limit");
        }
        // bounded: EVENT_QUEUE; full means the event task is behind: refused and counted.
        let sent = self.events.try_send(Queued::Event(event)); // bounded: EVENT_QUEUE, full → refused and counted
        match sent {
            // bounded: EVENT_QUEUE, full → refused and counted
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => Err("the event queue is full"),
            Err(mpsc::error::TrySendError::Closed(_)) => Err("nobody reads this slot's events"),
        }
    }
}

impl EventSink {
    /// Queues a barrier (outside the rate; bounded by the queue) and waits, at most `within`,
    /// until the event task reached it: every event queued before it has been handled. False
    /// when the queue was full or closed, or the wait ran out.
    pub(crate) async fn barrier(&self, within: Duration) -> bool {
        let passed = Arc::new(tokio::sync::Notify::new());
        let barrier = Queued::Barrier(passed.clone());
        let queued = self.events.try_send(barrier); // bounded: EVENT_QUEUE; full → no wait (false)
        if queued.is_err() {
            return false;
        }
        tokio::time::timeout(within, passed.notified())
            .await
            .is_ok()
    }
}

impl EventReceiver {
    /// The next event: what was queued before a `Closed` is seen first. A barrier is passed
    /// here (the caller handled every event before it before asking for the next).
    pub async fn recv(&mut self) -> Option<UpstreamEvent> {
        loop {
            let queued = tokio::select! {
                biased;
                Some(q) = self.events.recv() => q,
                Some(ev) = self.closed.recv() => return Some(ev),
                else => return None,
            };
            match queued {
                Queued::Event(ev) => return Some(ev),
                Queued::Barrier(passed) => passed.notify_one(),
            }
        }
    }

    /// Logs the refusals of a finished summary window (or all so far if `force`).
    pub(crate) fn summarise(&self, force: bool) {
        self.gate.flush(force);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_admits_the_burst_then_the_rate() {
        let mut l = Limiter::new(100, 500);
        let t0 = Instant::now();
        let admitted = (0..10_000).filter(|_| l.admit(t0)).count();
        assert_eq!(admitted, 500);
        // 1 s later: 100 more tokens, not more.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!((0..1_000).filter(|_| l.admit(t1)).count(), 100);
        // Never above the burst, however long the pause.
        let t2 = t1 + Duration::from_secs(3_600);
        assert_eq!((0..10_000).filter(|_| l.admit(t2)).count(), 500);
    }

    #[test]
    fn refusals_are_said_once_then_summed_per_window() {
        let mut l = Limiter::new(1, 1);
        let t0 = Instant::now();
        assert!(matches!(l.refuse(t0), Refusal::Started));
        for _ in 0..9_999 {
            assert!(matches!(l.refuse(t0), Refusal::Counted));
        }
        assert_eq!(l.summary(t0, false), None, "the window is not over");
        let t1 = t0 + SUMMARY_EVERY;
        assert_eq!(l.summary(t1, false), Some(9_999));
        assert_eq!(l.summary(t1, true), None, "said once");
        // Refusals going on: counted into the new window, not said one by one.
        assert!(matches!(l.refuse(t1), Refusal::Counted));
        assert_eq!(l.summary(t1, true), Some(1));
        // After a quiet window the next refusal is said at once again.
        let t2 = t1 + SUMMARY_EVERY;
        assert!(matches!(l.refuse(t2), Refusal::Started));
    }
}
