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
use super::{json_response, Rejection};
use crate::mcp::dispatch;
use crate::mcp::request::RequestCtx;
use crate::session::Session;

/// How a request's reply is framed.
pub(crate) struct ReplyOpts {
    /// Send a priming event (empty data with an id) first (clients at ≥ 2025-11-25).
    pub priming: bool,
    /// Cancel the call when the response is dropped (stateless: disconnect = cancel).
    pub cancel_on_drop: bool,
    pub method: String,
    /// Applied to the final response (stateless: `resultType`, cache fields).
    pub finish: Option<fn(Value, &str) -> Value>,
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
    Done(Option<Value>),
    Stream(Option<Value>),
}

type WorkFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Option<Value>> + Send>>;

/// A call's work (tracked by the registration's `calls` tracker), polled by the request that
/// started it: no task hop between the call and its response. If the response goes away
/// before the work ends (the client disconnected), the rest of the work is spawned, so the
/// call still ends properly — it runs on, or (stateless) sees its cancellation, tells the
/// upstream and is audited.
struct CallWork(Option<WorkFuture>);

impl std::future::Future for CallWork {
    type Output = Option<Value>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Value>> {
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
pub(crate) async fn reply(
    mut ctx: RequestCtx,
    id: Value,
    method: String,
    params: Option<Value>,
    cancel: CancellationToken,
    opts: ReplyOpts,
) -> Result<Response, Rejection> {
    let gw = ctx.hub.clone();
    let stop = ctx.registration.cancel.clone();
    let guard = CancelOnDrop(opts.cancel_on_drop.then(|| cancel.clone()));
    let (ntx, mut nrx) = mpsc::channel::<Value>(gw.sessions().config().queue.max(1));
    ctx.notify = Some(ntx);
    let session = ctx.session.clone();
    let calls = ctx.registration.calls.clone();
    let call_method = method.clone();
    let work = async move {
        let r = dispatch::handle_request(&ctx, id.clone(), &call_method, params, cancel).await;
        if let Some(s) = &session {
            s.end_call(&id);
        }
        drop(ctx);
        r
    };
    let mut work = CallWork(Some(Box::pin(calls.track_future(work))));
    let period = Duration::from_secs(gw.config().keepalive_s.max(1));
    let first = tokio::select! {
        biased;
        n = nrx.recv() => match n {
            Some(n) => First::Stream(Some(n)),
            None => First::Done((&mut work).await),
        },
        r = &mut work => First::Done(r),
        _ = tokio::time::sleep(period) => First::Stream(None),
    };
    let finish = |v: Value| match opts.finish {
        Some(f) => f(v, &opts.method),
        None => v,
    };
    // Notifications the call sent in the poll in which it ended are still queued: they go
    // out first, on a stream, before the result.
    let mut early = Vec::new();
    if matches!(first, First::Done(Some(_))) {
        while let Ok(n) = nrx.try_recv() {
            early.push(n);
        }
    }
    let streamed = |notes: Vec<Value>, ended: Option<Value>, live, guard| {
        let mut pending = VecDeque::new();
        if opts.priming {
            pending.push_back(event_stream::priming_event());
        }
        pending.extend(notes.iter().map(|n| sse_json("message", n)));
        pending.extend(ended.map(|v| sse_json("message", &finish(v))));
        let (notes, result) = match live {
            Some((notes, work)) => (Some(notes), Some(work)),
            None => (None, None),
        };
        let st = ReplyStream {
            pending,
            notes,
            result,
            ticker: tokio::time::interval_at(tokio::time::Instant::now() + period, period),
            stop: stop.clone(),
            guard,
            finish: opts.finish,
            method: opts.method.clone(),
        };
        event_stream::response(Body::from_stream(futures::stream::unfold(st, next_event)))
    };
    match first {
        First::Done(Some(v)) if early.is_empty() => {
            let mut guard = guard;
            guard.0 = None;
            Ok(json_response(StatusCode::OK, &finish(v)))
        }
        First::Done(Some(v)) => {
            let mut guard = guard;
            guard.0 = None;
            Ok(streamed(early, Some(v), None, guard))
        }
        First::Done(None) => {
            let mut guard = guard;
            guard.0 = None;
            if stop.is_cancelled() {
                return Err(Rejection::not_found("registration released"));
            }
            // Cancelled by the client: no reply follows, the stream just ends.
            Ok(event_stream::response(Body::empty()))
        }
        First::Stream(note) => Ok(streamed(
            note.into_iter().collect(),
            None,
            Some((nrx, work)),
            guard,
        )),
    }
}

struct ReplyStream {
    pending: VecDeque<Bytes>,
    notes: Option<mpsc::Receiver<Value>>,
    result: Option<CallWork>,
    ticker: tokio::time::Interval,
    stop: CancellationToken,
    guard: CancelOnDrop,
    finish: Option<fn(Value, &str) -> Value>,
    method: String,
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
                Some(n) => st.pending.push_back(sse_json("message", &n)),
                None => st.notes = None,
            },
            r = &mut result => {
                st.guard.0 = None;
                let v = r?;
                let v = match st.finish {
                    Some(f) => f(v, &st.method),
                    None => v,
                };
                // Notifications sent in the poll in which the call ended come first.
                if let Some(notes) = st.notes.as_mut() {
                    while let Ok(n) = notes.try_recv() {
                        st.pending.push_back(sse_json("message", &n));
                    }
                }
                st.notes = None;
                st.pending.push_back(sse_json("message", &v));
                continue;
            }
            _ = st.ticker.tick() => st.pending.push_back(Bytes::from_static(KEEPALIVE)),
        }
        st.result = Some(result);
    }
}

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
        let (ntx, mut nrx) = mpsc::channel::<Value>(64);
        let mut ctx = ctx;
        ctx.notify = Some(ntx);
        let gw = ctx.hub.clone();
        let call_id = id.clone();
        let work = async move {
            dispatch::handle_request(&ctx, call_id, &method, params, cancel).await
            // `ctx` (and its sender) is dropped here.
        };
        tokio::pin!(work);
        let mut notes_open = true;
        let reply = loop {
            tokio::select! {
                biased;
                n = nrx.recv(), if notes_open => match n {
                    Some(n) => {
                        gw.sessions().deliver(&session, n).await;
                    }
                    None => notes_open = false,
                },
                r = &mut work => break r,
            }
        };
        while let Ok(n) = nrx.try_recv() {
            gw.sessions().deliver(&session, n).await;
        }
        // The call counts as in flight until its reply is queued, so a session's replies
        // waiting for room are bounded by `sessions.max_in_flight` too.
        if let Some(r) = reply {
            gw.sessions().deliver(&session, r).await;
        }
        session.end_call(&id);
    };
    // Spawned, not polled here first: the POST is answered 202 at once, whatever the tool does
    // (even one that blocks its thread), and the reply follows on the stream.
    calls.spawn(work);
}
