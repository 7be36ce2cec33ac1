//! The event stream (`text/event-stream`) every downstream transport writes: event framing,
//! the response headers, keep-alive comments, the priming event, and a session's long-lived
//! server-to-client stream (legacy SSE stream, Streamable HTTP GET).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::registration::random_b64;
use crate::session::Queued;

/// A keep-alive comment.
pub const KEEPALIVE: &[u8] = b": keepalive\n\n";

/// A response as a `message` event (compact JSON and a passed-through result hold no line
/// break: one `data:` line), framed as a session's queued messages are.
pub fn reply_event(reply: &crate::protocol::jsonrpc::Reply) -> Bytes {
    Bytes::from(crate::session::message_event(reply))
}

/// An event whose data is a JSON value. Compact JSON holds no line break (control
/// characters in strings are escaped), so it is one `data:` line, encoded in place.
pub fn sse_json(event: &str, value: &Value) -> Bytes {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    let head = out.len();
    // Serializing a `Value` into a `Vec` cannot fail (map keys are strings, a `Vec` write does
    // not fail); should it, the event carries `null` rather than half a value.
    if serde_json::to_writer(&mut out, value).is_err() {
        out.truncate(head);
        out.extend_from_slice(b"null");
    }
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// An event whose data is text (each line its own `data:` line).
pub fn sse_event(event: &str, data: &str) -> Bytes {
    let mut s = String::with_capacity(data.len() + event.len() + 16);
    s.push_str("event: ");
    s.push_str(event);
    s.push('\n');
    // Every line ending SSE knows (CRLF, LF, lone CR) starts a new `data:` line, so no text
    // can end the event early or inject a field.
    let mut rest = data;
    loop {
        let end = rest.find(['\r', '\n']).unwrap_or(rest.len());
        s.push_str("data: ");
        s.push_str(&rest[..end]);
        s.push('\n');
        if end == rest.len() {
            break;
        }
        let skip = if rest[end..].starts_with("\r\n") {
            2
        } else {
            1
        };
        rest = &rest[end + skip..];
    }
    s.push('\n');
    Bytes::from(s)
}

/// The priming event (2025-11-25 and later): an event id and empty data, so a client has an
/// id to resume from before the first message.
pub fn priming_event() -> Bytes {
    Bytes::from(format!("id: {}\ndata: \n\n", random_b64(9)))
}

/// A `text/event-stream` response (no caching, no proxy buffering).
pub fn response(body: Body) -> Response {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-transform"),
    );
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

struct SessionStream<G> {
    first: VecDeque<Bytes>,
    rx: mpsc::Receiver<Queued>,
    /// One waiter for the stream's life (not one per message).
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
    ticker: tokio::time::Interval,
    /// Dropped with the stream (closes the session or clears its stream).
    _guard: G,
}

impl<G: Unpin> futures::Stream for SessionStream<G> {
    type Item = Result<Bytes, Infallible>;

    /// The `first` events, then (the end once cancelled) the next queued event as it was
    /// encoded, or a keep-alive when the period passes with none.
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let st = self.get_mut();
        if let Some(b) = st.first.pop_front() {
            return Poll::Ready(Some(Ok(b)));
        }
        if st.cancelled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        match st.rx.poll_recv(cx) {
            // The message's share of the byte budget is freed here, as the stream takes it.
            Poll::Ready(Some(q)) => return Poll::Ready(Some(Ok(q.into_event()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {}
        }
        match st.ticker.poll_tick(cx) {
            Poll::Ready(_) => Poll::Ready(Some(Ok(Bytes::from_static(KEEPALIVE)))),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A session's server-to-client stream: the `first` events, then every message queued on
/// `rx`, with a keep-alive every `period`, until `cancel` fires or the queue closes. A
/// message's share of the session's byte budget is freed as the stream takes it.
pub fn session_stream<G: Send + Unpin + 'static>(
    first: VecDeque<Bytes>,
    rx: mpsc::Receiver<Queued>,
    cancel: CancellationToken,
    period: Duration,
    guard: G,
) -> Response {
    let st = SessionStream {
        first,
        rx,
        cancelled: Box::pin(cancel.cancelled_owned()),
        ticker: tokio::time::interval_at(tokio::time::Instant::now() + period, period),
        _guard: guard,
    };
    response(Body::from_stream(st))
}
