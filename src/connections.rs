//! Connection bounds of both listeners (`server::serve_http1`): the cap on connections held
//! at once, the header-read timeout (slowloris) and the idle keep-alive timeout, and the
//! open-files limit they are sized from.
//!
//! The timeouts follow nginx's split rather than hyper's `header_read_timeout`: hyper starts
//! that timer whenever a connection waits for a head — on a kept-alive connection, right after
//! the previous response — so it would close idle connections at the header timeout. Here a
//! connection is, at any time, in one [`Phase`]:
//! - `Head`: waiting for (the rest of) a request head — from the accept, or from the first
//!   byte of a next request — for at most `header_timeout`; then the connection is closed;
//! - `Busy`: a request is in flight, from its head to the last byte of its response (an SSE
//!   stream stays busy while it is open): no timeout here;
//! - `Idle`: kept alive, nothing in flight, no byte of a next request: closed (a quiet EOF to
//!   hyper) after `idle_timeout`.
//!
//! The IO wrapper [`Guarded`] sees the bytes and owns the timer; the service wrapper marks a
//! request busy from its call until its response body ([`GuardedBody`]) is dropped, which
//! hyper does once the body is fully written or the connection ends.
//!
//! A request body the service did not read to its end (a refusal answered from the head: 401,
//! 404, a wrong admin token) is handed back through its [`Leftover`] and drained (at most
//! [`DRAIN_MAX_BYTES`], within `body_timeout`) before the response goes, so the connection
//! stays usable: hyper would otherwise close it after the response, unannounced, and a
//! client's pool would send its next request into the closed connection. A body that cannot
//! be drained is not read, and the response says `Connection: close` (issue 50).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::task::AtomicWaker;
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::config::ConnectionConfig;
use crate::sync::lock;

/// The auto cap never goes above this: at roughly 12-20 KiB per idle connection (hyper's
/// 8 KiB read buffer, the task, the socket's kernel buffers aside) 16384 connections stay in
/// the low hundreds of MB.
const AUTO_MAX: usize = 16_384;

/// The bounds one listener applies.
#[derive(Debug, Clone)]
pub struct Limits {
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    /// The longest wait for the rest of a request body the service left unread ([`Leftover`]).
    pub body_timeout: Duration,
    /// Connections held at once; beyond it a new connection gets `refusal` and is closed.
    pub max: usize,
    /// The canned response written to a connection over the cap.
    refusal: Bytes,
}

impl Limits {
    /// The data listener's: `connections.max`, or 3/4 of the open-files soft limit (at most
    /// [`AUTO_MAX`]) when it is 0.
    pub fn data(config: &ConnectionConfig) -> Limits {
        let max = match config.max {
            0 => auto_max(nofile_soft_limit()),
            n => n,
        };
        let mut body = Vec::new();
        crate::protocol::RpcError::internal("gateway connection limit reached: retry later")
            .write_json(&mut body);
        Limits::new(config, max, &body)
    }

    /// The admin listener's: the same timeouts, its own cap (1/16 of the open-files limit,
    /// 16-1024), so a flood of the data listener never takes the admin API's descriptors and
    /// the reverse.
    pub fn admin(config: &ConnectionConfig) -> Limits {
        let max = usize::try_from(nofile_soft_limit() / 16)
            .unwrap_or(1024)
            .clamp(16, 1024);
        Limits::new(
            config,
            max,
            br#"{"error":"admin connection limit reached: retry later"}"#,
        )
    }

    fn new(config: &ConnectionConfig, max: usize, body: &[u8]) -> Limits {
        let head = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n",
            body.len()
        );
        Limits {
            header_timeout: Duration::from_secs(config.header_timeout_s.max(1)),
            idle_timeout: Duration::from_secs(config.idle_timeout_s.max(1)),
            body_timeout: Duration::from_secs(config.body_timeout_s.max(1)),
            max: max.max(1),
            refusal: Bytes::from([head.as_bytes(), body].concat()),
        }
    }

    /// Answers a connection over the cap and closes it, without a task or a wait: the canned
    /// 503 goes into the fresh socket's empty send buffer in one non-blocking write, bytes the
    /// client already sent are read off (so the close is a FIN, not a reset that could discard
    /// the answer), then the socket is closed. A client whose request arrives after the close
    /// may see a reset instead.
    pub fn refuse(&self, tcp: TcpStream) {
        use std::io::{Read, Write};
        let Ok(mut tcp) = tcp.into_std() else { return };
        let _ = tcp.write(&self.refusal);
        let _ = tcp.shutdown(std::net::Shutdown::Write);
        let mut sink = [0u8; 4096];
        for _ in 0..4 {
            match tcp.read(&mut sink) {
                Ok(n) if n > 0 => continue,
                _ => break,
            }
        }
    }
}

/// 3/4 of the open-files limit, at most [`AUTO_MAX`] and at least 1: the rest is for the
/// admin listener, upstream pipes and HTTP clients, the audit file, and the runtime.
pub fn auto_max(nofile: u64) -> usize {
    usize::try_from(nofile / 4 * 3)
        .unwrap_or(AUTO_MAX)
        .clamp(1, AUTO_MAX)
}

/// The open-files soft limit (1024, the usual default, if it cannot be read).
pub fn nofile_soft_limit() -> u64 {
    use nix::sys::resource::{getrlimit, Resource};
    getrlimit(Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(1024)
}

/// Raises the open-files soft limit to the hard limit (the daemon, at start); returns
/// `(soft before, soft now)`.
pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(io::Error::from)?;
    }
    Ok((soft, soft.max(hard)))
}

/// What a connection waits for (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Head { since: Instant },
    Busy,
    Idle { since: Instant },
}

/// One connection's phase, shared by its IO ([`Guarded`]) and its requests ([`Busy`]).
#[derive(Debug)]
pub struct Activity {
    phase: Mutex<Phase>,
    in_flight: AtomicUsize,
    /// The connection task's waker, woken when the last request in flight ends (the idle
    /// timer must start even if no byte comes) — unless `covered`.
    waker: AtomicWaker,
    /// Set while busy once the IO has its timer registered at a deadline no later than the
    /// busy period's end plus `idle_timeout` ([`Guarded::poll_busy`]): the end of the request
    /// then needs no wake. The usual case (hyper reads on to see an EOF while a request is in
    /// flight); a wake from a running task reschedules it as a yield, which wakes an idle
    /// worker of the runtime to steal it — a futex wake and a worker's round trip per call.
    covered: AtomicBool,
    /// Set when the connection was closed because a request head did not arrive in time
    /// (counted as a refusal, `header_timeout`, by the accept loop).
    head_expired: AtomicBool,
}

impl Activity {
    /// Was the connection closed because a request head did not arrive in time?
    pub fn head_timed_out(&self) -> bool {
        self.head_expired.load(Ordering::Relaxed)
    }

    pub fn new() -> Arc<Activity> {
        Arc::new(Activity {
            phase: Mutex::new(Phase::Head {
                since: Instant::now(),
            }),
            in_flight: AtomicUsize::new(0),
            waker: AtomicWaker::new(),
            covered: AtomicBool::new(false),
            head_expired: AtomicBool::new(false),
        })
    }

    /// A request's head was read: the connection is busy until the guard drops.
    pub fn begin(self: &Arc<Self>) -> Busy {
        if self.in_flight.fetch_add(1, Ordering::SeqCst) == 0 {
            self.covered.store(false, Ordering::SeqCst);
        }
        *lock(&self.phase) = Phase::Busy;
        Busy(self.clone())
    }
}

/// Held by a request from its call to the end of its response body.
#[derive(Debug)]
pub struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            *lock(&self.0.phase) = Phase::Idle {
                since: Instant::now(),
            };
            if !self.0.covered.load(Ordering::SeqCst) {
                self.0.waker.wake();
            }
        }
    }
}

/// A response body that keeps its connection busy until it is dropped.
pub struct GuardedBody<B> {
    body: B,
    _busy: Busy,
}

impl<B> GuardedBody<B> {
    pub fn new(body: B, busy: Busy) -> Self {
        GuardedBody { body, _busy: busy }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for GuardedBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The most bytes of a request body left unread that the listener reads off to keep its
/// connection (module docs); a longer one gets `Connection: close` instead.
pub const DRAIN_MAX_BYTES: u64 = 1024 * 1024;

/// A request body as the service sees it (`server::serve_http1`): dropped before its end, it
/// leaves the rest in its [`Leftover`].
pub struct RequestBody {
    body: Option<hyper::body::Incoming>,
    /// Its end (or an error: hyper then closes the connection itself) was read.
    done: bool,
    leftover: Leftover,
}

impl RequestBody {
    pub fn new(body: hyper::body::Incoming, leftover: Leftover) -> RequestBody {
        RequestBody {
            body: Some(body),
            done: false,
            leftover,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let me = self.get_mut();
        let Some(body) = me.body.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = futures::ready!(Pin::new(body).poll_frame(cx));
        match &frame {
            Some(Ok(_)) => {}
            None => me.done = true,
            // hyper closes the connection after a body it could not read.
            Some(Err(_)) => {
                me.done = true;
                *lock(&me.leftover.0) = Some(Rest::Broken);
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.body
            .as_ref()
            .map(Body::size_hint)
            .unwrap_or_else(|| SizeHint::with_exact(0))
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        if let Some(body) = self.body.take() {
            if !self.done && !body.is_end_stream() {
                *lock(&self.leftover.0) = Some(Rest::Unread(body));
            }
        }
    }
}

/// Where a [`RequestBody`] dropped before its end leaves the rest.
#[derive(Clone, Default)]
pub struct Leftover(Arc<Mutex<Option<Rest>>>);

/// What a request body left behind.
pub enum Rest {
    /// Dropped by the service before its end: the unread rest.
    Unread(hyper::body::Incoming),
    /// It could not be read (bad framing): hyper closes the connection.
    Broken,
}

impl Leftover {
    /// What the last request's body left, if anything.
    pub fn take(&self) -> Option<Rest> {
        lock(&self.0).take()
    }
}

/// Reads `rest` to its end and drops it, at most [`DRAIN_MAX_BYTES`] within `within`: true if
/// it ended (the connection can serve the next request), false if not (it must close).
pub async fn drain(mut rest: hyper::body::Incoming, within: Duration) -> bool {
    if rest.size_hint().lower() > DRAIN_MAX_BYTES {
        return false;
    }
    let read = async {
        let mut got = 0u64;
        while let Some(frame) = http_body_util::BodyExt::frame(&mut rest).await {
            let Ok(frame) = frame else { return false };
            if let Some(data) = frame.data_ref() {
                got += data.len() as u64;
                if got > DRAIN_MAX_BYTES {
                    return false;
                }
            }
        }
        true
    };
    tokio::time::timeout(within, read).await.unwrap_or(false)
}

/// A TCP stream that enforces the header and idle timeouts of its connection.
pub struct Guarded {
    io: TcpStream,
    activity: Arc<Activity>,
    header_timeout: Duration,
    idle_timeout: Duration,
    /// The timer and the deadline it is set to (allocated on the first wait).
    timer: Option<(Pin<Box<Sleep>>, Instant)>,
}

impl Guarded {
    pub fn new(io: TcpStream, activity: Arc<Activity>, limits: &Limits) -> Guarded {
        Guarded {
            io,
            activity,
            header_timeout: limits.header_timeout,
            idle_timeout: limits.idle_timeout,
            timer: None,
        }
    }

    /// Nothing to read now: `Ready` with the verdict if the phase's deadline has passed (or
    /// passes while the timer is polled), else `Pending` with the timer armed.
    ///
    /// The timer is moved only to an earlier deadline: a later one (every kept-alive
    /// request's idle deadline is) stays unarmed until the armed one fires, which then
    /// re-arms at the phase's deadline of that moment. So a request costs no timer reset and
    /// no clock read here, and the timer never fires late.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.activity.waker.register(cx.waker());
        loop {
            let phase = *lock(&self.activity.phase);
            let (deadline, expired) = match phase {
                Phase::Busy => return self.poll_busy(cx),
                Phase::Head { since } => (
                    since + self.header_timeout,
                    Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "request head not received in time",
                    )),
                ),
                // A quiet EOF: hyper closes an idle connection without an error.
                Phase::Idle { since } => (since + self.idle_timeout, Ok(())),
            };
            let (sleep, armed) = match &mut self.timer {
                Some((sleep, armed)) => {
                    if deadline < *armed {
                        sleep.as_mut().reset(deadline);
                        *armed = deadline;
                    }
                    (sleep, armed)
                }
                None => {
                    if Instant::now() >= deadline {
                        return Poll::Ready(self.expire(expired));
                    }
                    let (sleep, armed) = self
                        .timer
                        .insert((Box::pin(tokio::time::sleep_until(deadline)), deadline));
                    (sleep, armed)
                }
            };
            match sleep.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                // Fired at (or after) this phase's deadline.
                Poll::Ready(()) if *armed >= deadline => return Poll::Ready(self.expire(expired)),
                // Fired at an earlier deadline that has since moved on: wait for this one.
                Poll::Ready(()) => {
                    sleep.as_mut().reset(deadline);
                    *armed = deadline;
                }
            }
        }
    }

    /// The verdict of a phase whose deadline passed: a head not received in time is marked.
    fn expire(&self, verdict: io::Result<()>) -> io::Result<()> {
        if verdict.is_err() {
            self.activity.head_expired.store(true, Ordering::Relaxed);
        }
        verdict
    }

    /// Busy: no timeout, but the timer stays registered at a deadline no later than this busy
    /// period's end plus `idle_timeout` (the armed one if it is such and has not fired, else
    /// now plus `idle_timeout`), and `covered` says so. When the request ends, its
    /// [`Busy`] then needs no wake: the timer wakes the connection in time to arm the idle
    /// deadline (earlier is harmless: it re-arms, as above). While a request outlives
    /// `idle_timeout` (an SSE stream), the timer fires once per `idle_timeout` and re-arms.
    fn poll_busy(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let idle = self.idle_timeout;
        // Every armed deadline is an instant already passed plus the header or the idle
        // timeout: no later than this busy period's end plus `idle_timeout`, unless the header
        // timeout is the longer one (then the clock says).
        let header_longer = self.header_timeout > idle;
        let in_time = match &self.timer {
            Some((sleep, armed)) => {
                !sleep.is_elapsed() && (!header_longer || *armed <= Instant::now() + idle)
            }
            None => false,
        };
        if !in_time {
            let deadline = Instant::now() + idle;
            match &mut self.timer {
                Some((sleep, armed)) => {
                    sleep.as_mut().reset(deadline);
                    *armed = deadline;
                }
                None => self.timer = Some((Box::pin(tokio::time::sleep_until(deadline)), deadline)),
            }
        }
        // This poll registers it (a deadline just re-armed is at least 1 s ahead).
        if let Some((sleep, _)) = &mut self.timer {
            if sleep.as_mut().poll(cx).is_pending() {
                self.activity.covered.store(true, Ordering::SeqCst);
            }
        }
        Poll::Pending
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    // The first byte of a next request starts its header timeout.
                    let mut phase = lock(&this.activity.phase);
                    if matches!(*phase, Phase::Idle { .. }) {
                        *phase = Phase::Head {
                            since: Instant::now(),
                        };
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.poll_deadline(cx),
        }
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_cap_is_three_quarters_of_the_fd_limit_within_bounds() {
        assert_eq!(auto_max(1024), 768);
        assert_eq!(auto_max(256), 192);
        assert_eq!(auto_max(1 << 20), AUTO_MAX);
        assert_eq!(auto_max(0), 1);
    }

    /// Serves `io` as hyper would for one-byte requests: a byte starts a request (`Head`);
    /// the first `complete` of them are answered at once (`Busy`, then `Idle`), later ones
    /// stay an unfinished head. Returns how the reading ended and when.
    async fn serve_bytes(
        io: TcpStream,
        limits: Limits,
        complete: usize,
    ) -> (io::Result<()>, std::time::Duration) {
        use tokio::io::AsyncReadExt;
        let started = Instant::now();
        let activity = Activity::new();
        let mut g = Guarded::new(io, activity.clone(), &limits);
        let mut seen = 0;
        let mut buf = [0u8; 16];
        loop {
            match g.read(&mut buf).await {
                Ok(0) => return (Ok(()), started.elapsed()),
                Ok(n) => {
                    for _ in 0..n {
                        seen += 1;
                        if seen <= complete {
                            drop(activity.begin());
                        }
                    }
                }
                Err(e) => return (Err(e), started.elapsed()),
            }
        }
    }

    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        (c, s)
    }

    fn limits(header_ms: u64, idle_ms: u64) -> Limits {
        Limits {
            header_timeout: Duration::from_millis(header_ms),
            idle_timeout: Duration::from_millis(idle_ms),
            body_timeout: Duration::from_secs(1),
            max: 1,
            refusal: Bytes::new(),
        }
    }

    /// The timer is moved only to an earlier deadline: a later idle deadline is waited for
    /// after the armed one fires, so a kept-alive connection is closed at its last request's
    /// idle deadline, neither at the armed (earlier) one nor later.
    #[tokio::test]
    async fn idle_deadline_follows_the_last_request() {
        use tokio::io::AsyncWriteExt;
        let (mut c, s) = pair().await;
        let server = tokio::spawn(serve_bytes(s, limits(200, 600), usize::MAX));
        c.write_all(b"a").await.unwrap();
        tokio::time::sleep(Duration::from_millis(350)).await;
        // Idle since ~0 (deadline ~600 armed); now idle since ~350: deadline ~950.
        c.write_all(b"b").await.unwrap();
        let (end, at) = server.await.unwrap();
        assert!(end.is_ok(), "an idle connection ends quietly: {end:?}");
        assert!(
            at >= Duration::from_millis(900) && at < Duration::from_millis(2000),
            "closed at the last request's idle deadline (~950 ms), not at {at:?}"
        );
    }

    /// A request that ends while its connection waits (hyper reads on, for an EOF, while a
    /// request is in flight) wakes no one: the timer registered while busy wakes the connection
    /// in time, and the idle deadline follows the request's end — also when the request
    /// outlived the idle timeout.
    #[tokio::test]
    async fn a_request_ending_on_a_waiting_connection_needs_no_wake() {
        use std::sync::atomic::AtomicUsize;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        struct Count(AtomicUsize);
        impl futures::task::ArcWake for Count {
            fn wake_by_ref(me: &Arc<Self>) {
                me.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        for busy_ms in [50u64, 700] {
            let (mut c, s) = pair().await;
            let activity = Activity::new();
            let mut g = Guarded::new(s, activity.clone(), &limits(200, 400));
            let mut buf = [0u8; 16];
            c.write_all(b"a").await.unwrap();
            assert_eq!(g.read(&mut buf).await.unwrap(), 1);
            let busy = activity.begin();
            let count = Arc::new(Count(AtomicUsize::new(0)));
            let waker = futures::task::waker(count.clone());
            let mut cx = Context::from_waker(&waker);
            let mut rb = ReadBuf::new(&mut buf);
            assert!(Pin::new(&mut g).poll_read(&mut cx, &mut rb).is_pending());
            tokio::time::sleep(Duration::from_millis(busy_ms)).await;
            // Woken by the timer meanwhile (a long request): polled again, as hyper does.
            let fired = count.0.load(Ordering::SeqCst);
            assert!(Pin::new(&mut g).poll_read(&mut cx, &mut rb).is_pending());
            let ended = Instant::now();
            drop(busy);
            assert_eq!(
                count.0.load(Ordering::SeqCst),
                fired,
                "the end of the request woke the connection"
            );
            // From here the connection is polled only when woken, as a task is.
            let mut seen = fired;
            let end = loop {
                if ended.elapsed() > Duration::from_secs(3) {
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                let now = count.0.load(Ordering::SeqCst);
                if now == seen {
                    continue;
                }
                seen = now;
                let mut rb = ReadBuf::new(&mut buf);
                if let Poll::Ready(r) = Pin::new(&mut g).poll_read(&mut cx, &mut rb) {
                    break Some(r.map(|()| rb.filled().len()));
                }
            };
            let at = ended.elapsed();
            assert!(
                matches!(end, Some(Ok(0))),
                "an idle connection is woken and ends quietly (busy {busy_ms} ms): {end:?}"
            );
            assert!(
                at >= Duration::from_millis(390) && at < Duration::from_millis(1300),
                "closed at the idle deadline after the request (~400 ms), not at {at:?} (busy {busy_ms} ms)"
            );
        }
    }

    /// A deadline earlier than the armed one moves the timer: an unfinished head on a
    /// kept-alive connection is cut at its header deadline, not at the idle one.
    #[tokio::test]
    async fn an_earlier_header_deadline_moves_the_timer() {
        use tokio::io::AsyncWriteExt;
        let (mut c, s) = pair().await;
        let server = tokio::spawn(serve_bytes(s, limits(200, 1500), 1));
        c.write_all(b"a").await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        // Idle deadline ~1500 armed; this byte starts a head that never completes: ~500.
        c.write_all(b"b").await.unwrap();
        let (end, at) = server.await.unwrap();
        assert_eq!(
            end.map_err(|e| e.kind()).err(),
            Some(io::ErrorKind::TimedOut),
            "the head timed out"
        );
        assert!(
            at >= Duration::from_millis(450) && at < Duration::from_millis(1300),
            "cut at the header deadline (~500 ms), not at {at:?}"
        );
    }
}
