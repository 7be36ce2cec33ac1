//! OpenTelemetry traces (issue 38), after the OpenTelemetry MCP semantic conventions: a SERVER
//! span per downstream JSON-RPC request (`tools/call` by `call::run`, every other method by
//! `mcp::dispatch`; parent: a valid `_meta.traceparent`, else the HTTP `traceparent` header,
//! else a new root; the header's context is a link when both exist and differ) and a CLIENT
//! span per upstream request, its child, whose context replaces the client's
//! `traceparent`/`tracestate`/`baggage` in the upstream request's `_meta` (and headers, for
//! HTTP upstreams). Pool work (spawn and `initialize`, catalog fetch and refresh) is a root of
//! its own, linked from the requests that waited on it. Spans go out with OTLP over
//! HTTP/protobuf through a bounded queue of our own (`export`). Off (`Hub::telemetry` is
//! `None`) unless `[telemetry]` or the `OTEL_*` variables name an endpoint: then a request
//! does nothing here. Never recorded: tokens, `Authorization`, argv and env of stdio upstreams,
//! URL queries and userinfo, tool arguments and results (unless `capture_tool_io`, cut at
//! [`IO_BOUND`]).

mod context;
mod export;

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{Sampler, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use serde_json::Value;

pub use context::{
    bounded_baggage, bounded_tracestate, format_traceparent, parse_traceparent, TraceParent,
};
pub use export::ExportCounters;

use crate::config::TelemetryConfig;

/// The `_meta` keys MCP reserves for W3C Trace Context and Baggage (SEP-414).
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";
pub const BAGGAGE: &str = "baggage";

/// A gateway's tracer and its export queue.
pub struct Telemetry {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    counters: Arc<ExportCounters>,
    propagate_baggage: bool,
    /// `[telemetry] capture_tool_io`: a tool call's arguments and result on its SERVER span
    /// (cut at [`IO_BOUND`] bytes).
    capture_tool_io: bool,
}

/// How much of a tool call's arguments or result `capture_tool_io` records (bytes of JSON).
pub const IO_BOUND: usize = 4096;

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

fn sampler_of(cfg: &TelemetryConfig) -> Sampler {
    let ratio = cfg.sampler_arg.unwrap_or(1.0);
    match cfg.sampler.as_str() {
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "traceidratio" => Sampler::TraceIdRatioBased(ratio),
        "parentbased_always_off" => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        "parentbased_traceidratio" => {
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio)))
        }
        _ => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
    }
}

impl Telemetry {
    /// The tracer `cfg` asks for, or `None` when tracing is off (no endpoint, or
    /// `OTEL_SDK_DISABLED`). `node_id` becomes `service.instance.id`.
    pub fn start(
        cfg: &TelemetryConfig,
        node_id: Option<&str>,
    ) -> Result<Option<Arc<Telemetry>>, String> {
        let Some(url) = cfg.traces_url() else {
            return Ok(None);
        };
        let timeout = Duration::from_millis(cfg.export_timeout_ms);
        let mut http = reqwest::Client::builder().timeout(timeout);
        if url.starts_with("https://") {
            // The same rustls as the upstreams' (src/tls.rs): the platform's roots, which
            // honour SSL_CERT_FILE / SSL_CERT_DIR (issue 46).
            http = http.use_preconfigured_tls(crate::tls::platform_client_config()?);
        }
        let http = http
            .build()
            .map_err(|e| format!("telemetry: the HTTP client cannot be built: {e}"))?;
        let mut resource = Resource::builder_empty().with_service_name(cfg.service_name.clone());
        for (k, v) in &cfg.resource_attributes {
            if k != "service.name" {
                resource = resource.with_attribute(KeyValue::new(k.clone(), v.clone()));
            }
        }
        if let Some(n) = node_id {
            resource = resource.with_attribute(KeyValue::new("service.instance.id", n.to_string()));
        }
        let resource = resource.build();
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(export::Client(http))
            .with_endpoint(url.clone())
            .with_timeout(timeout)
            .with_headers(cfg.headers.clone().into_iter().collect())
            .build()
            // The error names the URL at most (headers are never in it).
            .map_err(|e| format!("telemetry: the OTLP exporter for {url} cannot be built: {e}"))?;
        opentelemetry_sdk::trace::SpanExporter::set_resource(&mut exporter, &resource);
        let counters = Arc::new(ExportCounters::default());
        let processor = export::QueueProcessor::start(
            exporter,
            export::Bounds {
                max_queue: cfg.max_queue,
                max_batch: cfg.max_batch,
                delay: Duration::from_millis(cfg.delay_ms),
                export_timeout: timeout,
            },
            counters.clone(),
        )
        .map_err(|e| format!("telemetry: the export thread cannot start: {e}"))?;
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(sampler_of(cfg))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("gatehouse");
        tracing::info!(endpoint = %url, sampler = %cfg.sampler, "OpenTelemetry traces exported over OTLP/HTTP");
        Ok(Some(Arc::new(Telemetry {
            provider,
            tracer,
            counters,
            propagate_baggage: cfg.propagate_baggage,
            capture_tool_io: cfg.capture_tool_io,
        })))
    }

    pub fn counters(&self) -> &ExportCounters {
        &self.counters
    }

    /// Posts what is queued and stops the export thread, within `within` (blocking: called
    /// from a blocking task at shutdown).
    pub fn shutdown(&self, within: Duration) {
        if let Err(e) = self.provider.shutdown_with_timeout(within) {
            tracing::warn!(error = %e, "span export at shutdown incomplete");
        }
    }

    /// Whether tool arguments and results are recorded (`capture_tool_io`).
    pub fn captures_tool_io(&self) -> bool {
        self.capture_tool_io
    }

    /// Starts the SERVER span of a downstream `tools/call`.
    pub fn server_span(&self, inbound: Inbound<'_>, about: &CallAbout<'_>) -> Box<CallTrace> {
        let mut attrs = vec![
            KeyValue::new("mcp.method.name", "tools/call"),
            KeyValue::new("gen_ai.tool.name", about.tool.to_string()),
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
        ];
        if let Some(args) = about.arguments.filter(|_| self.capture_tool_io) {
            attrs.push(KeyValue::new(
                "gen_ai.tool.call.arguments",
                bounded_json(args),
            ));
        }
        self.start_server(
            inbound,
            format!("tools/call {}", about.tool),
            attrs,
            &about.common,
        )
    }

    /// Starts the SERVER span of a downstream request other than `tools/call`, named
    /// `{mcp.method.name} {target}` where the conventions name a target (a prompt), else
    /// `{mcp.method.name}`; a resource URI is an attribute (its query and userinfo cut), never
    /// in the name.
    pub fn request_span(&self, inbound: Inbound<'_>, about: &RequestAbout<'_>) -> Box<CallTrace> {
        let mut attrs = vec![KeyValue::new("mcp.method.name", about.method)];
        let name = match about.target {
            Target::Tool(t) => {
                attrs.push(KeyValue::new("gen_ai.tool.name", t.to_string()));
                format!("{} {t}", about.method)
            }
            Target::Prompt(p) => {
                attrs.push(KeyValue::new("gen_ai.prompt.name", p.to_string()));
                format!("{} {p}", about.method)
            }
            Target::Resource(uri) => {
                attrs.push(KeyValue::new("mcp.resource.uri", uri.to_string()));
                about.method.to_string()
            }
            Target::None => about.method.to_string(),
        };
        self.start_server(inbound, name, attrs, &about.common)
    }

    fn start_server(
        &self,
        inbound: Inbound<'_>,
        name: String,
        mut attrs: Vec<KeyValue>,
        about: &Common<'_>,
    ) -> Box<CallTrace> {
        let from_meta = inbound.meta.parent.and_then(parse_traceparent);
        let from_header = inbound.header.parent.and_then(parse_traceparent);
        let remote = |tp: &TraceParent, state: Option<&str>| {
            SpanContext::new(
                TraceId::from_bytes(tp.trace_id),
                SpanId::from_bytes(tp.span_id),
                TraceFlags::new(tp.flags & 1),
                true,
                state
                    .and_then(bounded_tracestate)
                    .and_then(|s| TraceState::from_str(s).ok())
                    .unwrap_or_default(),
            )
        };
        let (parent, link, baggage) = match (from_meta, from_header) {
            (Some(m), h) => {
                let link = h
                    .filter(|h| h != &m)
                    .map(|h| remote(&h, inbound.header.state));
                (
                    Some(remote(&m, inbound.meta.state)),
                    link,
                    inbound.meta.baggage,
                )
            }
            (None, Some(h)) => (
                Some(remote(&h, inbound.header.state)),
                None,
                inbound.header.baggage,
            ),
            (None, None) => (None, None, None),
        };
        let cx = match parent {
            Some(p) => Context::new().with_remote_span_context(p),
            None => Context::new(),
        };
        attrs.extend([
            KeyValue::new("jsonrpc.request.id", id_text(about.request_id)),
            KeyValue::new("network.transport", "tcp"),
            KeyValue::new("network.protocol.name", "http"),
            KeyValue::new("gen_ai.agent.id", about.agent_id.to_string()),
            KeyValue::new(
                "gatehouse.registration.id",
                about.registration_id.to_string(),
            ),
            KeyValue::new("gatehouse.transport", about.transport),
        ]);
        if let Some(v) = about.protocol_version {
            attrs.push(KeyValue::new("mcp.protocol.version", v));
            // Not for 2026-07-28 peers (stateless: no session).
            if let Some(s) = about.session_id {
                attrs.push(KeyValue::new("mcp.session.id", s.to_string()));
            }
        }
        let mut builder = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_attributes(attrs);
        if let Some(l) = link {
            builder = builder.with_links(vec![Link::with_context(l)]);
        }
        let span = self.tracer.build_with_context(builder, &cx);
        let context = span.span_context().clone();
        Box::new(CallTrace {
            trace_id: hex::encode(context.trace_id().to_bytes()),
            span,
            context,
            baggage: baggage
                .filter(|_| self.propagate_baggage)
                .and_then(bounded_baggage)
                .map(str::to_string),
            tracer: self.tracer.clone(),
            started: std::time::Instant::now(),
            waited: std::sync::Mutex::new(Vec::new()),
            capture_tool_io: self.capture_tool_io,
        })
    }

    /// Starts the root span of pool work (an upstream's spawn and `initialize`, its catalog
    /// fetched or refreshed): a trace of its own, which the calls that waited on it link to
    /// (`PoolWork::waited_by`), so no agent's trace holds another's pool work.
    pub fn pool_span(&self, work: &'static str, upstream: &str, peer: Peer<'_>) -> PoolSpan {
        let mut attrs = vec![
            KeyValue::new("gatehouse.pool.work", work),
            KeyValue::new("gatehouse.upstream.name", upstream.to_string()),
        ];
        peer.attributes(&mut attrs);
        let builder = self
            .tracer
            .span_builder(format!("{work} {upstream}"))
            .with_kind(SpanKind::Internal)
            .with_attributes(attrs);
        let span = self.tracer.build_with_context(builder, &Context::new());
        let sc = span.span_context();
        let meta = TraceMeta {
            traceparent: format_traceparent(
                sc.trace_id().to_bytes(),
                sc.span_id().to_bytes(),
                sc.is_sampled(),
            ),
            tracestate: None,
            baggage: None,
        };
        PoolSpan { span, meta }
    }
}

/// `value` as JSON text, cut at [`IO_BOUND`] bytes (on a character boundary, marked `…`).
pub fn bounded_json(value: &Value) -> String {
    bounded_text(value.to_string())
}

/// `text` cut at [`IO_BOUND`] bytes (on a character boundary, marked `…`).
pub fn bounded_text(mut text: String) -> String {
    if text.len() > IO_BOUND {
        let mut cut = IO_BOUND;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// A resource URI as spans may carry it: no userinfo, query or fragment (they may hold
/// credentials), at most 512 bytes.
pub fn redacted_uri(uri: &str) -> String {
    let end = uri.find(['?', '#']).unwrap_or(uri.len());
    let mut out = &uri[..end];
    let owned;
    if let Some(scheme_end) = out.find("://") {
        let rest = &out[scheme_end + 3..];
        let authority_end = rest.find('/').unwrap_or(rest.len());
        if let Some(at) = rest[..authority_end].rfind('@') {
            owned = format!("{}{}", &out[..scheme_end + 3], &rest[at + 1..]);
            out = &owned;
        }
    }
    let mut cut = out.len().min(512);
    while !out.is_char_boundary(cut) {
        cut -= 1;
    }
    out[..cut].to_string()
}

/// Where an upstream request goes: a stdio child (`pipe`) or an HTTP server (`tcp`, with
/// `server.address`/`server.port`; never the URL's path or query).
#[derive(Debug, Clone, Copy)]
pub enum Peer<'a> {
    Pipe,
    Tcp { address: &'a str, port: u16 },
}

impl Peer<'_> {
    fn attributes(self, attrs: &mut Vec<KeyValue>) {
        match self {
            Peer::Pipe => attrs.push(KeyValue::new("network.transport", "pipe")),
            Peer::Tcp { address, port } => attrs.extend([
                KeyValue::new("network.transport", "tcp"),
                KeyValue::new("network.protocol.name", "http"),
                KeyValue::new("server.address", address.to_string()),
                KeyValue::new("server.port", i64::from(port)),
            ]),
        }
    }

    /// `network.transport`.
    pub fn transport(self) -> &'static str {
        match self {
            Peer::Pipe => "pipe",
            Peer::Tcp { .. } => "tcp",
        }
    }
}

/// The span of one piece of pool work, ended by [`PoolSpan::end`].
pub struct PoolSpan {
    span: opentelemetry_sdk::trace::Span,
    /// Its context, sent with the upstream requests the work makes (`initialize`, `tools/list`).
    meta: TraceMeta,
}

impl std::fmt::Debug for PoolSpan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolSpan").finish_non_exhaustive()
    }
}

impl PoolSpan {
    pub fn meta(&self) -> &TraceMeta {
        &self.meta
    }

    /// Adds an attribute (a bounded value: never a token).
    pub fn set_attribute(&mut self, key: &'static str, value: &'static str) {
        self.span.set_attribute(KeyValue::new(key, value));
    }

    /// Ends the span (`error` sets `error.type=_OTHER` and ERROR with it as the description)
    /// and gives what later calls link to, if it was sampled.
    pub fn end(mut self, epoch: Option<u64>, error: Option<&str>) -> Option<PoolWork> {
        if self.span.is_recording() {
            if let Some(e) = epoch {
                self.span.set_attribute(KeyValue::new(
                    "gatehouse.upstream.epoch",
                    i64::try_from(e).unwrap_or(i64::MAX),
                ));
            }
            if let Some(e) = error {
                self.span
                    .set_attribute(KeyValue::new("error.type", "_OTHER"));
                self.span.set_status(Status::error(e.to_string()));
            }
        }
        let context = self.span.span_context().clone();
        self.span.end();
        context.is_sampled().then(|| PoolWork {
            context,
            ended: std::time::Instant::now(),
        })
    }
}

/// Finished pool work, as the calls that waited on it link to it.
#[derive(Debug, Clone)]
pub struct PoolWork {
    context: SpanContext,
    ended: std::time::Instant,
}

impl PoolWork {
    /// A link to this work, if it ended while `trace`'s request was under way (it waited for
    /// it: the request needed what the work made).
    fn link_if_waited(&self, trace: &CallTrace) -> Option<Link> {
        (self.ended >= trace.started).then(|| Link::with_context(self.context.clone()))
    }
}

/// The JSON-RPC id as the conventions write it (a string).
fn id_text(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A request's W3C trace headers (read only when tracing is on).
#[derive(Debug, Clone)]
pub struct TraceHeaders {
    pub traceparent: String,
    pub tracestate: Option<String>,
    pub baggage: Option<String>,
}

/// One carrier's W3C trace values: a request's `params._meta`, or its HTTP headers.
#[derive(Default, Clone, Copy)]
pub struct Carried<'a> {
    pub parent: Option<&'a str>,
    pub state: Option<&'a str>,
    pub baggage: Option<&'a str>,
}

/// Where a request's parent context may come from.
#[derive(Default, Clone, Copy)]
pub struct Inbound<'a> {
    pub meta: Carried<'a>,
    pub header: Carried<'a>,
}

impl<'a> Inbound<'a> {
    /// The request's HTTP trace headers, if any.
    pub fn with_headers(mut self, h: Option<&'a TraceHeaders>) -> Self {
        if let Some(h) = h {
            self.header = Carried {
                parent: Some(&h.traceparent),
                state: h.tracestate.as_deref(),
                baggage: h.baggage.as_deref(),
            };
        }
        self
    }

    /// Drops the free-text values (`tracestate`, `baggage`: exported, and sent upstream) that
    /// `holds_token` flags, like any `_meta` entry holding the caller's token.
    pub fn without(mut self, holds_token: impl Fn(&str) -> bool) -> Self {
        for v in [
            &mut self.meta.state,
            &mut self.meta.baggage,
            &mut self.header.state,
            &mut self.header.baggage,
        ] {
            if v.is_some_and(&holds_token) {
                *v = None;
            }
        }
        self
    }

    /// The trace keys of a request's `params._meta`.
    pub fn with_meta(mut self, params: &'a serde_json::Map<String, Value>) -> Self {
        if let Some(Value::Object(meta)) = params.get(crate::protocol::meta::META) {
            let s = |k| meta.get(k).and_then(Value::as_str);
            self.meta = Carried {
                parent: s(TRACEPARENT),
                state: s(TRACESTATE),
                baggage: s(BAGGAGE),
            };
        }
        self
    }
}

/// What a call's SERVER span says of it.
pub struct CallAbout<'a> {
    pub tool: &'a str,
    pub common: Common<'a>,
    /// The call's arguments, recorded only with `capture_tool_io` (and never when they carry
    /// the caller's token: the caller leaves them out then).
    pub arguments: Option<&'a Value>,
}

/// What every SERVER span says of its request.
pub struct Common<'a> {
    pub request_id: &'a Value,
    pub protocol_version: Option<&'static str>,
    pub session_id: Option<&'a str>,
    pub agent_id: &'a str,
    pub registration_id: &'a str,
    pub transport: &'static str,
}

/// What a SERVER span of a request other than `tools/call` says of it.
pub struct RequestAbout<'a> {
    /// One of the methods the gateway serves, else `_OTHER` (a bounded span name).
    pub method: &'static str,
    pub target: Target<'a>,
    pub common: Common<'a>,
}

/// What a request is about, after the conventions: a tool or a prompt (in the span name too),
/// a resource URI (an attribute only), or nothing.
#[derive(Debug, Clone, Copy)]
pub enum Target<'a> {
    None,
    Tool(&'a str),
    Prompt(&'a str),
    Resource(&'a str),
}

/// A call's SERVER span, ended by `call::finish` from the call's summary.
#[derive(Debug)]
pub struct CallTrace {
    span: opentelemetry_sdk::trace::Span,
    context: SpanContext,
    /// 32 lowercase hex digits: what the audit record carries.
    trace_id: String,
    /// The client's `baggage`, kept only when `propagate_baggage` is on.
    baggage: Option<String>,
    tracer: SdkTracer,
    /// When the span began: pool work that ended after it was waited for.
    started: std::time::Instant,
    /// Pool work this request waited on: links, added when the span ends.
    waited: std::sync::Mutex<Vec<SpanContext>>,
    capture_tool_io: bool,
}

/// The trace context written into an upstream request (`_meta`, and headers for HTTP).
#[derive(Debug, Clone)]
pub struct TraceMeta {
    pub traceparent: String,
    pub tracestate: Option<String>,
    pub baggage: Option<String>,
}

impl CallTrace {
    pub fn trace_id(&self) -> &str {
        &self.trace_id
    }

    /// Takes the trace id out (for the audit record, at the end).
    pub fn take_trace_id(&mut self) -> String {
        std::mem::take(&mut self.trace_id)
    }

    pub fn is_sampled(&self) -> bool {
        self.context.is_sampled()
    }

    /// Whether the tool call's result is to be recorded (`capture_tool_io`).
    pub fn captures_tool_io(&self) -> bool {
        self.capture_tool_io && self.span.is_recording()
    }

    /// Ends the span: `error_type` (ERROR status with `description`) and what the end adds.
    pub fn end(mut self, error_type: Option<&str>, description: Option<&str>, more: Vec<KeyValue>) {
        if self.span.is_recording() {
            for cx in std::mem::take(&mut *crate::sync::lock(&self.waited)) {
                self.span
                    .add_link(cx, vec![KeyValue::new("gatehouse.link", "pool_work")]);
            }
            for kv in more {
                self.span.set_attribute(kv);
            }
            if let Some(e) = error_type {
                self.span
                    .set_attribute(KeyValue::new("error.type", e.to_string()));
                if e.starts_with('-') || e.bytes().all(|b| b.is_ascii_digit()) {
                    self.span
                        .set_attribute(KeyValue::new("rpc.response.status_code", e.to_string()));
                }
                self.span
                    .set_status(Status::error(description.unwrap_or(e).to_string()));
            }
        }
        self.span.end();
    }

    /// Starts the CLIENT span of an upstream request this request makes, its child; linked to
    /// the pool work it waited on (and so is this span, when it ends).
    pub fn client_span(&self, to: Upstreamed<'_>) -> ClientSpan {
        let cx = Context::new().with_remote_span_context(self.context.clone());
        let mut attrs = vec![KeyValue::new("mcp.method.name", to.method)];
        let name = match to.target {
            Target::Tool(tool) => {
                attrs.extend([
                    KeyValue::new("gen_ai.tool.name", tool.to_string()),
                    KeyValue::new("gen_ai.operation.name", "execute_tool"),
                ]);
                format!("{} {tool}", to.method)
            }
            Target::Prompt(p) => {
                attrs.push(KeyValue::new("gen_ai.prompt.name", p.to_string()));
                format!("{} {p}", to.method)
            }
            Target::Resource(uri) => {
                attrs.push(KeyValue::new("mcp.resource.uri", redacted_uri(uri)));
                to.method.to_string()
            }
            Target::None => to.method.to_string(),
        };
        to.peer.attributes(&mut attrs);
        attrs.push(KeyValue::new(
            "gatehouse.upstream.name",
            to.upstream.to_string(),
        ));
        let mut links = Vec::new();
        for w in to.waited.into_iter().flatten() {
            if let Some(l) = w.link_if_waited(self) {
                crate::sync::lock(&self.waited).push(w.context.clone());
                links.push(l);
            }
        }
        let mut builder = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Client)
            .with_attributes(attrs);
        if !links.is_empty() {
            builder = builder.with_links(links);
        }
        let span = self.tracer.build_with_context(builder, &cx);
        let sc = span.span_context();
        let state = sc.trace_state().header();
        let meta = TraceMeta {
            traceparent: format_traceparent(
                sc.trace_id().to_bytes(),
                sc.span_id().to_bytes(),
                sc.is_sampled(),
            ),
            tracestate: (!state.is_empty()).then_some(state),
            baggage: self.baggage.clone(),
        };
        ClientSpan { span, meta }
    }
}

/// An upstream request, as its CLIENT span says it.
pub struct Upstreamed<'a> {
    pub upstream: &'a str,
    pub method: &'static str,
    pub target: Target<'a>,
    pub peer: Peer<'a>,
    /// The pool work that made the connection (its spawn) and the upstream's catalog: linked
    /// when it ended while this request was under way.
    pub waited: [Option<&'a PoolWork>; 2],
}

/// The CLIENT span of one upstream request.
#[derive(Debug)]
pub struct ClientSpan {
    span: opentelemetry_sdk::trace::Span,
    meta: TraceMeta,
}

impl ClientSpan {
    pub fn meta(&self) -> &TraceMeta {
        &self.meta
    }

    /// Ends the span with the upstream's request id and how the request ended.
    pub fn end(
        mut self,
        request_id: Option<u64>,
        error_type: Option<&str>,
        description: Option<&str>,
    ) {
        if self.span.is_recording() {
            if let Some(id) = request_id {
                self.span
                    .set_attribute(KeyValue::new("jsonrpc.request.id", id.to_string()));
            }
            if let Some(e) = error_type {
                self.span
                    .set_attribute(KeyValue::new("error.type", e.to_string()));
                self.span
                    .set_status(Status::error(description.unwrap_or(e).to_string()));
            }
        }
        self.span.end();
    }
}

/// `error.type` of a JSON-RPC error code: the code as a string when it is one of the
/// protocol's own (bounded: a metric label), else `_OTHER`.
pub fn code_error_type(code: i64) -> &'static str {
    crate::protocol::RpcError::type_of(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_lose_userinfo_query_and_fragment() {
        assert_eq!(redacted_uri("memo://greeting"), "memo://greeting");
        assert_eq!(
            redacted_uri("https://user:pw@host:8443/a/b?sig=x#f"),
            "https://host:8443/a/b"
        );
        assert_eq!(redacted_uri("file:///tmp/a?b"), "file:///tmp/a");
        assert_eq!(redacted_uri("urn:x@y"), "urn:x@y");
        assert_eq!(redacted_uri(&"é".repeat(400)).len(), 512);
    }

    #[test]
    fn captured_text_is_cut_on_a_character_boundary() {
        assert_eq!(bounded_text("short".into()), "short");
        let cut = bounded_text("é".repeat(IO_BOUND));
        assert!(cut.ends_with('…') && cut.len() <= IO_BOUND + '…'.len_utf8());
    }
}
