//! The reply engine shared by every downstream transport: runs a request and answers it with
//! its notifications (progress, logs) first, then its result. Streamable HTTP and stateless
//! answer on the POST — JSON if the result comes first, an event stream if a notification
//! does or the call outlives a keep-alive period; legacy SSE answers on the session's stream.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::event_stream::{self, sse_json, KEEPALIVE};
use super::{json_response, reply_response, Rejection};
use crate::hub::Hub;
use crate::methods::dispatch;
use crate::methods::request::RequestCtx;
use crate::protocol::jsonrpc::{Reply, RpcError};
use crate::protocol::ClientCapability;
use crate::session::Session;

/// How a request's reply is framed.
pub(crate) struct ReplyOpts {
    /// Send a priming event (empty data with an id) first (clients at ≥ 2025-11-25).
    pub priming: bool,
    /// Cancel the call when the response is dropped (stateless: disconnect = cancel).
    pub cancel_on_drop: bool,
    /// The request's method, for `finish` (empty when there is none: nothing reads it).
    pub method: String,
    /// Applied to the final response (stateless: `resultType`, cache fields).
    pub finish: Option<fn(Value, &str) -> Value>,
    /// Stateless (2026-07-28): a server request of the call becomes an MRTR `input_required`
    /// result, and the call is held for the client's retry.
    pub mrtr: Option<Mrtr>,
}

/// What MRTR needs to know about the stateless request.
#[derive(Clone)]
pub(crate) struct Mrtr {
    /// The client capabilities its `_meta["io.modelcontextprotocol/clientCapabilities"]`
    /// declares, read as a session's `initialize` is (`ClientCapability::bits_of`: a key
    /// set to `null` declares nothing).
    pub declared: u8,
}

/// A server → client request the routing layer put on the call's sink (it has an id).
fn is_server_request(msg: &Value) -> bool {
    msg.get("method").is_some() && msg.get("id").is_some()
}

/// What the engine does with a server request on a stateless call: `Some(input_required
/// result)` once the call is held, or `None` when it was refused upstream (the client did not
/// declare the capability, or too many calls are held) and the call goes on.
struct Hold<'a> {
    hub: &'a Arc<Hub>,
    registration: &'a Arc<crate::registration::RegistrationState>,
    mrtr: &'a Mrtr,
}

impl Hold<'_> {
    /// Whether `request` can be asked of this client; refuses it upstream if not.
    fn admit(&self, request: &Value) -> bool {
        let method = request.get("method").and_then(Value::as_str).unwrap_or("");
        let declared =
            ClientCapability::for_method(method).is_some_and(|cap| cap.in_bits(self.mrtr.declared));
        let why = if !declared {
            format!("{method} refused: the client did not declare the capability it needs")
        } else if self.hub.held().len() >= crate::mrtr::MAX_HELD {
            format!("{method} refused: too many calls wait for their clients")
        } else {
            return true;
        };
        if let Some(id) = request.get("id") {
            let body = crate::hub::refusal_body(&why);
            self.hub.pool().client_response(
                &self.registration.id,
                crate::upstream::STATELESS_SESSION,
                id,
                &body,
            );
        }
        false
    }

    /// Holds the call (its work goes on in a task of the registration's tracker) and returns
    /// the `input_required` response to `id`.
    fn hold(
        &self,
        id: &Value,
        request: Value,
        notes: mpsc::Receiver<Value>,
        work: CallWork,
        guard: &mut CancelOnDrop,
    ) -> Value {
        let cancel = guard.0.take().unwrap_or_default();
        let (rtx, rrx) = tokio::sync::oneshot::channel();
        self.registration.calls.spawn(async move {
            let _ = rtx.send(work.await.map(Reply::into_value));
        });
        let asked = request
            .get("id")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .into_iter()
            .collect::<Vec<_>>();
        let key = asked.first().cloned().unwrap_or_default();
        let mut input = serde_json::Map::new();
        input.insert(
            "method".into(),
            request.get("method").cloned().unwrap_or(Value::Null),
        );
        if let Some(p) = request.get("params") {
            input.insert("params".into(), p.clone());
        }
        let state = self.hub.held().hold(crate::mrtr::Held {
            registration_id: self.registration.id.clone(),
            notes,
            result: rrx,
            cancel: cancel.drop_guard(),
            asked,
        });
        // The held call ends if its client does not come back in time, or with the
        // registration: its server requests are refused upstream, the call is cancelled.
        let (hub, reg) = (self.hub.clone(), self.registration.clone());
        self.registration.calls.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(crate::mrtr::HOLD_TTL + Duration::from_secs(1)) => {
                    let expired = hub.held().take_expired();
                    hub.drop_held(expired, "the client did not answer within the MRTR hold");
                }
                () = reg.cancel.cancelled() => {
                    let held = hub.held().forget_registration(&reg.id);
                    hub.drop_held(held, "registration released");
                }
            }
        });
        let mut requests = serde_json::Map::new();
        requests.insert(key, Value::Object(input));
        crate::protocol::jsonrpc::success(
            id.clone(),
            serde_json::json!({
                "resultType": "input_required",
                "inputRequests": requests,
                "requestState": state,
            }),
        )
    }
}

/// Cancels a call when dropped, unless disarmed (the call finished).
struct CancelOnDrop(Option<CancellationToken>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.cancel();
        }
    }
}

enum First {
    Done(Option<Reply>),
    Stream(Option<Value>),
}

type WorkFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Reply>> + Send>>;

/// A call's work (tracked by the registration's `calls` tracker), polled by the request that
/// started it: no task hop between the call and its response. If the response goes away
/// before the work ends (the client disconnected), the rest of the work is spawned, so the
/// call still ends properly — it runs on, or (stateless) sees its cancellation, tells the
/// upstream and is audited.
pub(crate) struct CallWork(Option<WorkFuture>);

impl std::future::Future for CallWork {
    type Output = Option<Reply>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Reply>> {
        let Some(work) = self.0.as_mut() else {
            return std::task::Poll::Ready(None);
        };
        let out = work.as_mut().poll(cx);
        if out.is_ready() {
            self.0 = None;
        }
        out
    }
}

impl Drop for CallWork {
    fn drop(&mut self) {
        if let Some(work) = self.0.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = work.await;
                });
            }
        }
    }
}

/// Runs a request and answers it: JSON if the result comes first, SSE if a notification
/// does (or the call outlives a keep-alive period).
///
/// Not an `async fn`: what it does before waiting is synchronous, so the future is just
/// [`answer`]'s (it is moved into the connection's boxed request future: smaller is cheaper).
pub(crate) fn reply(
    mut ctx: RequestCtx,
    id: Value,
    method: String,
    params: Option<Value>,
    cancel: CancellationToken,
    opts: ReplyOpts,
) -> impl std::future::Future<Output = Result<Response, Rejection>> + Send + 'static {
    let gw = ctx.hub.clone();
    let registration = ctx.registration.clone();
    let guard = CancelOnDrop(opts.cancel_on_drop.then(|| cancel.clone()));
    let (keep, nrx) = gw
        .sessions()
        .notes_channel(gw.sessions().config().queue.max(1));
    let ntx = keep.clone();
    ctx.notify = Some(ntx);
    let work = call_work(ctx, id.clone(), method, params, cancel);
    answer(gw, registration, id, (nrx, Some(keep)), work, guard, opts)
}

/// The notes still queued, in order, once a call's work has ended, taken with a no-op waker
/// left in the channel's place for the reader's: after it, dropping the last sender (or
/// keeping the channel, `SessionTable::recycle_notes`) wakes nobody.
///
/// The receiver's task registered its waker on the channel, and the channel's last sender
/// wakes it when dropped. The work drops its senders (in its `RequestCtx`) as it ends, in a
/// poll of that same task: a wake of a running task makes tokio reschedule it as a yield and
/// wake an idle worker to steal it — a `futex` wake and a worker's round trip per call, for
/// nothing. So the reading side holds one sender (`keep`) while the work runs, and drops it
/// last, after this handed the channel a no-op waker.
fn drain_quietly(notes: &mut mpsc::Receiver<Value>) -> Vec<Value> {
    let mut noop = std::task::Context::from_waker(std::task::Waker::noop());
    let mut found = Vec::new();
    while let std::task::Poll::Ready(Some(n)) = notes.poll_recv(&mut noop) {
        found.push(n);
    }
    found
}

/// The request's work, boxed. A plain function: built inside `reply`, the unboxed future
/// would stay in `reply`'s own state (its binding lives to the end), doubling its size.
/// A batch's items run through it too (`streamable_http::legacy_batch`).
pub(crate) fn call_work(
    ctx: RequestCtx,
    id: Value,
    method: String,
    params: Option<Value>,
    cancel: CancellationToken,
) -> CallWork {
    let calls = ctx.registration.calls.clone();
    let work = async move {
        let r = dispatch::handle_request(&ctx, id.clone(), &method, params, cancel).await;
        if let Some(s) = &ctx.session {
            s.end_call(&id);
        }
        drop(ctx);
        r
    };
    CallWork(Some(Box::pin(calls.track_future(work))))
}

/// Resumes a held stateless call for the client's retry `id`: its notifications, then its
/// result (under the retry's id), or the next `input_required`.
pub(crate) async fn resume(
    hub: Arc<Hub>,
    registration: Arc<crate::registration::RegistrationState>,
    id: Value,
    held: crate::mrtr::Held,
    opts: ReplyOpts,
) -> Result<Response, Rejection> {
    let crate::mrtr::Held {
        notes,
        result,
        cancel,
        ..
    } = held;
    let guard = CancelOnDrop(Some(cancel.disarm()));
    let retry_id = id.clone();
    let work = CallWork(Some(Box::pin(async move {
        let mut v = Reply::Value(result.await.ok().flatten()?);
        v.set_id(retry_id);
        Some(v)
    })));
    answer(hub, registration, id, (notes, None), work, guard, opts).await
}

/// Answers request `id` from its call's notes and result: JSON if the result comes first, an
/// event stream if a notification does (or the call outlives a keep-alive period). `keep`, a
/// sender of the notes held while the work runs ([`drain_quietly`]), if the work runs here.
async fn answer(
    gw: Arc<Hub>,
    registration: Arc<crate::registration::RegistrationState>,
    id: Value,
    (mut nrx, keep): (mpsc::Receiver<Value>, Option<mpsc::Sender<Value>>),
    mut work: CallWork,
    mut guard: CancelOnDrop,
    opts: ReplyOpts,
) -> Result<Response, Rejection> {
    let period = Duration::from_secs(gw.config().keepalive_s.max(1));
    // A coarse wait (within 100 ms of the period): a timer-wheel entry per call cost more
    // than the rest of this engine's work (`sync::coarse`).
    let sleep = crate::sync::coarse::sleep(period);
    tokio::pin!(sleep);
    let first = loop {
        let first = tokio::select! {
            biased;
            n = nrx.recv() => match n {
                Some(n) => First::Stream(Some(n)),
                None => First::Done((&mut work).await),
            },
            r = &mut work => First::Done(r),
            () = &mut sleep => First::Stream(None),
        };
        // Stateless: a server request first of all becomes the answer (`input_required`).
        if let (First::Stream(Some(n)), Some(mrtr)) = (&first, &opts.mrtr) {
            if is_server_request(n) {
                let hold = Hold {
                    hub: &gw,
                    registration: &registration,
                    mrtr,
                };
                if !hold.admit(n) {
                    continue;
                }
                let First::Stream(Some(n)) = first else {
                    continue;
                };
                let v = hold.hold(&id, n, nrx, work, &mut guard);
                guard.0 = None;
                return Ok(json_response(StatusCode::OK, &v));
            }
        }
        break first;
    };
    let finish = |v: Reply| finished(opts.finish, &opts.method, v);
    // Notifications the call sent in the poll in which it ended are still queued: they go
    // out first, on a stream, before the result.
    let mut early = Vec::new();
    if let First::Done(done) = &first {
        let found = drain_quietly(&mut nrx);
        if done.is_some() {
            early = found;
        }
    }
    // A call that ended with nothing queued leaves its channel to the next call, if nothing
    // else can reach it (`SessionTable::recycle_notes`); `keep` is dropped otherwise, and must not be the
    // last sender while the work runs on (a stream).
    let recycle = |keep: Option<mpsc::Sender<Value>>, nrx| match keep {
        Some(keep) => gw.sessions().recycle_notes(keep, nrx),
        None => drop(nrx),
    };
    let out = Out {
        gw: &gw,
        registration: &registration,
        id: &id,
        opts: &opts,
        period,
    };
    match first {
        First::Done(Some(v)) if early.is_empty() => {
            recycle(keep, nrx);
            let mut guard = guard;
            guard.0 = None;
            Ok(reply_response(&finish(v)))
        }
        First::Done(Some(v)) => {
            drop(keep);
            let mut guard = guard;
            guard.0 = None;
            Ok(out.stream(early, Some(v), None, guard))
        }
        First::Done(None) => {
            recycle(keep, nrx);
            let mut guard = guard;
            guard.0 = None;
            out.no_reply()
        }
        First::Stream(note) => {
            // Not the last sender while the work runs on: the stream ends with the work's.
            drop(keep);
            Ok(out.stream(note.into_iter().collect(), None, Some((nrx, work)), guard))
        }
    }
}

/// How [`answer`] answers once it knows its first event: the request and where it came from.
struct Out<'a> {
    gw: &'a Arc<Hub>,
    registration: &'a Arc<crate::registration::RegistrationState>,
    id: &'a Value,
    opts: &'a ReplyOpts,
    period: Duration,
}

impl Out<'_> {
    /// An event stream: the notes so far, the reply if the call ended, and (`live`) the
    /// notes and work still to come.
    fn stream(
        &self,
        notes: Vec<Value>,
        ended: Option<Reply>,
        live: Option<(mpsc::Receiver<Value>, CallWork)>,
        guard: CancelOnDrop,
    ) -> Response {
        let (gw, opts) = (self.gw, self.opts);
        let mut pending = VecDeque::new();
        if opts.priming {
            pending.push_back(event_stream::priming_event());
        }
        pending.extend(notes.iter().map(|n| sse_json("message", n)));
        pending.extend(
            ended.map(|v| event_stream::reply_event(&finished(opts.finish, &opts.method, v))),
        );
        let (notes, result) = match live {
            Some((notes, work)) => (Some(notes), Some(work)),
            None => (None, None),
        };
        let st = ReplyStream {
            pending,
            notes,
            result,
            fence: (gw.clone(), self.id.clone()),
            ticker: tokio::time::interval_at(
                tokio::time::Instant::now() + self.period,
                self.period,
            ),
            stop: self.registration.cancel.token(),
            guard,
            finish: opts.finish,
            method: opts.method.clone(),
            mrtr: opts
                .mrtr
                .clone()
                .map(|m| (gw.clone(), self.registration.clone(), self.id.clone(), m)),
        };
        event_stream::response(Body::from_stream(futures::stream::unfold(st, next_event)))
    }

    /// The call ended with no reply: released (404), cancelled by this node's fence (the same
    /// 503 a request arriving now gets, with the request's id), or by the client (the stream
    /// just ends).
    fn no_reply(&self) -> Result<Response, Rejection> {
        if self.registration.is_released() {
            return Err(Rejection::not_found(
                crate::refusals::Reason::Released,
                "registration released",
            ));
        }
        if self.gw.fence().is_fenced() {
            return Err(Rejection::fenced(FENCED_CALL).with_id(Some(self.id.clone())));
        }
        Ok(event_stream::response(Body::empty()))
    }
}

/// Why a call the fence cancelled got no result.
const FENCED_CALL: &str = "this gateway node lost its registration store (fenced: it cannot prove it is current) and cancelled the call; retry, or use another node";

/// The final response with `finish` applied (stateless: `resultType`, cache fields); a
/// passed-through result is parsed for it.
fn finished(finish: Option<fn(Value, &str) -> Value>, method: &str, v: Reply) -> Reply {
    match finish {
        Some(f) => Reply::Value(f(v.into_value(), method)),
        None => v,
    }
}

struct ReplyStream {
    pending: VecDeque<Bytes>,
    notes: Option<mpsc::Receiver<Value>>,
    result: Option<CallWork>,
    /// The hub (is the node fenced?) and the request's id: a call the fence cancelled ends
    /// its stream with a JSON-RPC error.
    fence: (Arc<Hub>, Value),
    ticker: tokio::time::Interval,
    stop: CancellationToken,
    guard: CancelOnDrop,
    finish: Option<fn(Value, &str) -> Value>,
    method: String,
    /// Stateless: what a server request of the call needs to become `input_required`.
    mrtr: Option<(
        Arc<Hub>,
        Arc<crate::registration::RegistrationState>,
        Value,
        Mrtr,
    )>,
}

async fn recv_note(rx: &mut Option<mpsc::Receiver<Value>>) -> Option<Value> {
    match rx {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

async fn next_event(mut st: ReplyStream) -> Option<(Result<Bytes, Infallible>, ReplyStream)> {
    loop {
        if let Some(b) = st.pending.pop_front() {
            return Some((Ok(b), st));
        }
        let mut result = st.result.take()?;
        tokio::select! {
            biased;
            _ = st.stop.cancelled() => return None,
            n = recv_note(&mut st.notes) => match n {
                Some(n) if st.mrtr.is_some() && is_server_request(&n) => {
                    let Some((hub, registration, id, mrtr)) = st.mrtr.clone() else { continue };
                    let hold = Hold { hub: &hub, registration: &registration, mrtr: &mrtr };
                    if hold.admit(&n) {
                        // The call is held; `input_required` is this stream's last message.
                        let Some(notes) = st.notes.take() else { continue };
                        let v = hold.hold(&id, n, notes, result, &mut st.guard);
                        st.pending.push_back(sse_json("message", &v));
                        continue;
                    }
                }
                Some(n) => st.pending.push_back(sse_json("message", &n)),
                None => st.notes = None,
            },
            r = &mut result => {
                st.guard.0 = None;
                let Some(r) = r else {
                    // Cancelled by this node's fence: the stream's last message says so (a
                    // client's cancellation just ends it).
                    if !st.fence.0.fence().is_fenced() {
                        return None;
                    }
                    let id = Some(st.fence.1.clone());
                    let e = RpcError::internal(FENCED_CALL).with_id(id);
                    st.notes = None;
                    st.pending.push_back(sse_json("message", &e.to_value()));
                    continue;
                };
                let v = finished(st.finish, &st.method, r);
                // Notifications sent in the poll in which the call ended come first.
                if let Some(notes) = st.notes.as_mut() {
                    while let Ok(n) = notes.try_recv() {
                        st.pending.push_back(sse_json("message", &n));
                    }
                }
                st.notes = None;
                st.pending.push_back(event_stream::reply_event(&v));
                continue;
            }
            _ = st.ticker.tick() => st.pending.push_back(Bytes::from_static(KEEPALIVE)),
        }
        st.result = Some(result);
    }
}

/// A legacy SSE call's notes channel: notes wait there only until `deliver` takes them.
const SSE_NOTES: usize = 64;

/// Legacy SSE: runs a request on the registration's tracker; its notifications, then its
/// reply, go to the session's stream (through `deliver`, so a stuck reader closes the
/// session instead of blocking the call on a full queue).
pub(crate) fn to_session_stream(
    ctx: RequestCtx,
    session: Arc<Session>,
    id: Value,
    method: String,
    params: Option<Value>,
    cancel: CancellationToken,
) {
    let calls = ctx.registration.calls.clone();
    let work = async move {
        // Notifications of this call (progress, logs) go through `deliver` too, so a stuck
        // reader closes the session instead of blocking the call forever on a full queue.
        // They are delivered in order, before the reply.
        let gw = ctx.hub.clone();
        let (keep, mut nrx) = gw.sessions().notes_channel(SSE_NOTES);
        let ntx = keep.clone();
        let mut ctx = ctx;
        ctx.notify = Some(ntx);
        let call_id = id.clone();
        // Boxed: the spawned future stays small, so the task's cell is not a copy of the
        // whole request's state (it is moved three times on the way into the task).
        let mut work = Box::pin(async move {
            dispatch::handle_request(&ctx, call_id, &method, params, cancel).await
            // `ctx` (and its sender) is dropped here; `keep` holds the channel open.
        });
        let reply = loop {
            tokio::select! {
                biased;
                Some(n) = nrx.recv() => {
                    gw.sessions().deliver(&session, n).await;
                }
                r = &mut work => break r,
            }
        };
        let left = drain_quietly(&mut nrx);
        if left.is_empty() {
            gw.sessions().recycle_notes(keep, nrx);
        } else {
            drop(keep);
            for n in left {
                gw.sessions().deliver(&session, n).await;
            }
        }
        // The call counts as in flight until its reply is queued, so a session's replies
        // waiting for room are bounded by `sessions.max_in_flight` too.
        if let Some(r) = reply {
            gw.sessions().deliver_reply(&session, r).await;
        }
        session.end_call(&id);
    };
    // Spawned, not polled here first: the POST is answered 202 at once, whatever the tool does
    // (even one that blocks its thread), and the reply follows on the stream. Boxed: the task
    // would otherwise hold the ~900-byte state inline, copied whole by the spawn, into the
    // task's cell and again when the task ends (one copy into the box instead).
    calls.spawn(Box::pin(work));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};

    struct Count(AtomicUsize);
    impl futures::task::ArcWake for Count {
        fn wake_by_ref(me: &Arc<Self>) {
            me.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A drained channel whose only sender is `keep` is kept and handed to the next call of
    /// its capacity; one another sender can still reach, or with a note queued, is not; at
    /// most `SPARE_NOTES_MAX` are kept.
    #[test]
    fn unused_notes_channels_are_reused_and_reachable_ones_are_not() {
        use crate::session::{SessionTable, SPARE_NOTES_MAX};
        let table = SessionTable::new(crate::config::SessionConfig::default());
        let (keep, mut rx) = table.notes_channel(1234);
        assert!(drain_quietly(&mut rx).is_empty());
        table.recycle_notes(keep, rx);
        assert_eq!(table.spare_notes(), 1);
        // Another capacity: a new channel, the spare stays.
        let (keep7, rx7) = table.notes_channel(7);
        assert_eq!((keep7.max_capacity(), table.spare_notes()), (7, 1));
        let (keep, mut rx) = table.notes_channel(1234);
        assert_eq!(table.spare_notes(), 0, "the spare was handed out");
        // A tool context or an upstream route still holds a sender: not kept.
        let held = keep.clone();
        drain_quietly(&mut rx);
        table.recycle_notes(keep, rx);
        assert_eq!(table.spare_notes(), 0);
        assert!(held.is_closed(), "its receiver went");
        // A note queued: not kept.
        let (keep, rx) = table.notes_channel(1234);
        keep.try_send(serde_json::json!({})).unwrap(); // bounded: 1,234 slots, empty here
        table.recycle_notes(keep, rx);
        assert_eq!(table.spare_notes(), 0);
        // At most SPARE_NOTES_MAX.
        let all: Vec<_> = (0..SPARE_NOTES_MAX + 2)
            .map(|_| table.notes_channel(1234))
            .collect();
        for (keep, rx) in all {
            table.recycle_notes(keep, rx);
        }
        assert_eq!(table.spare_notes(), SPARE_NOTES_MAX);
        drop((keep7, rx7));
    }

    /// The reading task's waker, registered on the notes, is not woken when the work's
    /// senders drop (it holds `keep`) nor when the channel is closed; a note still queued is
    /// returned, not lost.
    #[test]
    fn notes_close_without_waking_their_reader() {
        for queued in [false, true] {
            let (ntx, mut nrx) = mpsc::channel::<Value>(4);
            let keep = ntx.clone();
            let count = Arc::new(Count(AtomicUsize::new(0)));
            let waker = futures::task::waker(count.clone());
            let mut cx = Context::from_waker(&waker);
            // The reader waits on its notes, as `answer` does while the work runs.
            assert!(nrx.poll_recv(&mut cx).is_pending());
            // The work sends (or not) and ends: its sender goes with its `RequestCtx`.
            if queued {
                let note = serde_json::json!({"method": "notifications/progress"});
                ntx.try_send(note).unwrap(); // bounded: a test's channel of 4, one note
            }
            let woken_by_note = count.0.load(Ordering::SeqCst);
            drop(ntx);
            assert_eq!(
                count.0.load(Ordering::SeqCst),
                woken_by_note,
                "the work's end woke the reader"
            );
            let found = drain_quietly(&mut nrx);
            drop(keep);
            assert_eq!(
                count.0.load(Ordering::SeqCst),
                woken_by_note,
                "the close woke the reader"
            );
            assert_eq!(!found.is_empty(), queued, "the queued note is returned");
            // Closed: nothing more comes.
            assert!(matches!(nrx.poll_recv(&mut cx), Poll::Ready(None)));
        }
    }
}
