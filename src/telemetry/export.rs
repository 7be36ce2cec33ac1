//! The export queue: a `SpanProcessor` of our own in front of the OTLP/HTTP exporter. A
//! finished span is offered to a bounded queue (`max_queue`) without waiting; when it is full
//! the span is dropped and counted, so a slow or dead collector never slows a call or grows
//! memory. One thread (`gatehouse-otel`, owned: joined at shutdown) takes batches of up to
//! `max_batch` and posts them, each within `export_timeout_ms`; sent, dropped and failed spans
//! are counted for `/metrics`. Shutdown posts what is queued, within a deadline.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};

use crate::sync::lock;

/// What the exporter did, for `/metrics` (`gatehouse_otel_spans_{sent,dropped,failed}_total`).
#[derive(Debug, Default)]
pub struct ExportCounters {
    /// Spans the collector accepted.
    pub sent: AtomicU64,
    /// Spans dropped because the queue was full (or the exporter stopped).
    pub dropped: AtomicU64,
    /// Spans in export requests that failed (refused, timed out, unreachable).
    pub failed: AtomicU64,
    /// Spans queued now.
    pub queued: AtomicU64,
}

enum Msg {
    Span(Box<SpanData>),
    /// Post what is queued, then answer.
    Flush(SyncSender<()>),
    /// Post what is queued, answer and end.
    Shutdown(SyncSender<()>),
}

/// The queue's bounds (from `[telemetry]`).
pub(crate) struct Bounds {
    pub max_queue: usize,
    pub max_batch: usize,
    pub delay: Duration,
    pub export_timeout: Duration,
}

#[derive(Debug)]
pub(crate) struct QueueProcessor {
    tx: SyncSender<Msg>,
    /// A flush or shutdown request, apart from the spans so it is never refused for room.
    control: SyncSender<Msg>,
    counters: Arc<ExportCounters>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl QueueProcessor {
    pub(crate) fn start<E: SpanExporter + 'static>(
        exporter: E,
        bounds: Bounds,
        counters: Arc<ExportCounters>,
    ) -> std::io::Result<QueueProcessor> {
        let (tx, rx) = sync_channel(bounds.max_queue);
        let (control, control_rx) = sync_channel(4);
        let c = counters.clone();
        let thread = std::thread::Builder::new()
            .name("gatehouse-otel".into())
            .spawn(move || run(exporter, bounds, rx, control_rx, c))?;
        Ok(QueueProcessor {
            tx,
            control,
            counters,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Asks the thread to post what is queued (and to end, on `shutdown`) and waits for it,
    /// at most `within`.
    fn ask(&self, within: Duration, shutdown: bool) -> OTelSdkResult {
        let (ack, done) = sync_channel(1);
        let msg = if shutdown {
            Msg::Shutdown(ack)
        } else {
            Msg::Flush(ack)
        };
        self.control
            .try_send(msg) // bounded: 4 control messages; full means one is under way
            .map_err(|_| OTelSdkError::InternalFailure("the exporter is busy or gone".into()))?;
        done.recv_timeout(within)
            .map_err(|_| OTelSdkError::Timeout(within))
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        // Never waits: a full queue drops the span and counts it.
        let offered = self.tx.try_send(Msg::Span(Box::new(span))); // bounded: max_queue
        match offered {
            Ok(()) => {
                self.counters.queued.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.ask(Duration::from_secs(5), false)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let done = self.ask(timeout, true);
        // Joined only once it has ended (it answered, then returns): never waits on a stalled
        // export past `timeout`.
        let thread = lock(&self.thread).take();
        if let Some(t) = thread {
            let deadline = Instant::now() + Duration::from_millis(500);
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
        done
    }
}

/// The export thread: batches by size and by `delay`, a flush on request; ends when the
/// processor is dropped, or on a flush whose asker is gone (shutdown), posting what is queued
/// first.
fn run<E: SpanExporter>(
    exporter: E,
    bounds: Bounds,
    rx: Receiver<Msg>,
    control: Receiver<Msg>,
    counters: Arc<ExportCounters>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "the span exporter cannot start: spans are dropped");
            return;
        }
    };
    let mut batch: Vec<SpanData> = Vec::with_capacity(bounds.max_batch.min(1024));
    let post = |batch: &mut Vec<SpanData>| {
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        counters.queued.fetch_sub(n, Ordering::Relaxed);
        let spans = std::mem::take(batch);
        // The timer is made inside the runtime (it needs its reactor).
        let res = rt.block_on(async {
            tokio::time::timeout(bounds.export_timeout, exporter.export(spans)).await
        });
        match res {
            Ok(Ok(())) => {
                counters.sent.fetch_add(n, Ordering::Relaxed);
            }
            Ok(Err(e)) => {
                counters.failed.fetch_add(n, Ordering::Relaxed);
                tracing::debug!(error = %e, spans = n, "span export failed");
            }
            Err(_) => {
                counters.failed.fetch_add(n, Ordering::Relaxed);
                tracing::debug!(spans = n, "span export timed out");
            }
        }
    };
    let mut deadline = Instant::now() + bounds.delay;
    let tick = Duration::from_millis(50).min(bounds.delay);
    loop {
        let wait = deadline.saturating_duration_since(Instant::now()).min(tick);
        match rx.recv_timeout(wait) {
            Ok(Msg::Span(s)) => {
                batch.push(*s);
                if batch.len() >= bounds.max_batch {
                    post(&mut batch);
                    deadline = Instant::now() + bounds.delay;
                }
            }
            Ok(_) => {}
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                post(&mut batch);
                return;
            }
        }
        if Instant::now() >= deadline {
            post(&mut batch);
            deadline = Instant::now() + bounds.delay;
        }
        let (ack, end) = match control.try_recv() {
            Ok(Msg::Flush(ack)) => (ack, false),
            Ok(Msg::Shutdown(ack)) => (ack, true),
            _ => continue,
        };
        // Everything queued now, in batches.
        while let Ok(m) = rx.try_recv() {
            if let Msg::Span(s) = m {
                batch.push(*s);
                if batch.len() >= bounds.max_batch {
                    post(&mut batch);
                }
            }
        }
        post(&mut batch);
        let _ = ack.send(());
        if end {
            let _ = exporter.shutdown();
            return;
        }
    }
}

/// The exporter's HTTP client: the gateway's own `reqwest` (no second HTTP stack), driven on
/// the export thread's runtime.
#[derive(Debug)]
pub(crate) struct Client(pub reqwest::Client);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Client {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let mut req = self
            .0
            .request(parts.method, parts.uri.to_string())
            .body(body);
        for (k, v) in parts.headers.iter() {
            req = req.header(k, v);
        }
        let resp = match req.send().await {
            Ok(resp) => resp,
            Err(err) => {
                let Some(tls) = crate::tls::describe_failure(&err, parts.uri.host().unwrap_or(""))
                else {
                    return Err(err.into());
                };
                // A TLS failure is a configuration to fix: said once at warn, then at debug.
                static WARNED: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                let reason = format!("OTLP endpoint: TLS failure: {tls}");
                if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(error = %reason, "span export failed");
                }
                return Err(reason.into());
            }
        };
        let status = resp.status();
        let headers = resp.headers().clone();
        // The collector's answer is small; a large one is cut (never read whole).
        let mut body = Vec::new();
        let mut resp = resp;
        while let Some(chunk) = resp.chunk().await? {
            if body.len() + chunk.len() > 4 * 1024 * 1024 {
                break;
            }
            body.extend_from_slice(&chunk);
        }
        let mut out = http::Response::builder().status(status);
        if let Some(h) = out.headers_mut() {
            *h = headers;
        }
        Ok(out.body(Bytes::from(body))?)
    }
}
