//! Prometheus metrics of one gateway: counters the call path increments, gauges read at
//! scrape time. One `prometheus_client` registry per `Gateway`, so many gateways in one
//! process (tests, embedders) never collide.
//!
//! Invariant: label values are bounded — a tool label is a granted tool name or `_unknown`
//! (a client cannot mint label values by calling made-up tools).

use crate::sync::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::RwLock;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Content type of the text exposition produced by [`Metrics::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub tool: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ToolLabel {
    pub tool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// A refused request's labels: a closed set each (`refusals::Reason`), never an id.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    pub listener: &'static str,
    pub status: u16,
    pub reason: &'static str,
}

/// A token request's labels (issue 47): configured upstream ids and closed sets.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    pub upstream: String,
    pub grant: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabel {
    pub upstream: String,
}

/// A classic histogram observed without a lock: a bucket and the sum are two atomic updates
/// (`prometheus_client`'s takes a mutex per observation, and every proxied call observes
/// three). Exposed exactly as `prometheus_client::metrics::histogram::Histogram` is (the same
/// buckets, `+Inf` implicit); the count is the buckets' total, so `_count` always equals the
/// `+Inf` bucket (a scrape racing an observation may see the sum without it, or the reverse).
#[derive(Clone, Debug)]
pub struct Histogram(Arc<HistogramInner>);

#[derive(Debug)]
struct HistogramInner {
    /// Finite upper bounds, ascending; the last bucket (`+Inf`) is implicit.
    bounds: Box<[f64]>,
    /// One more than `bounds`: the overflow bucket last.
    buckets: Box<[AtomicU64]>,
    /// The sum's `f64` bits.
    sum: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        let bounds: Box<[f64]> = bounds.into_iter().filter(|b| b.is_finite()).collect();
        let buckets = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Self(Arc::new(HistogramInner {
            bounds,
            buckets,
            sum: AtomicU64::new(0f64.to_bits()),
        }))
    }

    pub fn observe(&self, v: f64) {
        let h = &*self.0;
        // The first bucket whose bound is ≥ v (NaN: none, the overflow bucket).
        let i = h
            .bounds
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(h.bounds.len());
        if let Some(b) = h.buckets.get(i) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        let mut cur = h.sum.load(Ordering::Relaxed);
        loop {
            let new = (f64::from_bits(cur) + v).to_bits();
            match h
                .sum
                .compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(seen) => cur = seen,
            }
        }
    }

    #[cfg(test)]
    fn count(&self) -> u64 {
        self.0
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .sum()
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let h = &*self.0;
        let buckets: Vec<(f64, u64)> = h
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(h.buckets.iter().map(|b| b.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        encoder.encode_histogram::<NoLabelSet>(
            f64::from_bits(h.sum.load(Ordering::Relaxed)),
            count,
            &buckets,
            None::<&std::collections::HashMap<usize, Exemplar<NoLabelSet, f64>>>,
        )
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

type HistogramFamily = Family<ToolLabel, Histogram, fn() -> Histogram>;

/// The labels of `mcp_{server,client}_operation_duration_seconds` (the OpenTelemetry MCP
/// conventions' attributes, Prometheus-spelled): each a closed set or a granted tool name,
/// never an agent or registration id.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub mcp_method_name: &'static str,
    pub gen_ai_tool_name: String,
    /// Empty for success.
    pub error_type: &'static str,
    pub network_transport: &'static str,
}

type OperationFamily = Family<OperationLabels, Histogram, fn() -> Histogram>;

/// The MCP conventions' buckets (seconds).
fn operation_histogram() -> Histogram {
    Histogram::new([
        0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    ])
}

/// Operation histograms of one tool, by (error type, transport).
type OperationHandles = Vec<(Option<&'static str>, &'static str, Histogram)>;

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// What the gauges show; filled at scrape time by the admin API.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub registrations: usize,
    pub sessions: usize,
    pub leases: usize,
    pub audit_queue_depth: usize,
    pub audit_healthy: bool,
    /// Per upstream: (id, live connections, in-flight calls, restarts).
    pub upstreams: Vec<(String, usize, usize, u64)>,
    /// Per upstream: call notifications not delivered (`NotificationsRefused`).
    pub notifications_refused: Vec<(String, u64)>,
    /// OAuth (issue 47): token requests, (upstream, grant, outcome, count so far).
    pub token_requests: Vec<(String, &'static str, &'static str, u64)>,
    /// The span exporter's counts, when tracing is on.
    pub otel: Option<OtelCounts>,
}

/// What the span exporter did so far.
#[derive(Debug, Default, Clone, Copy)]
pub struct OtelCounts {
    pub sent: u64,
    pub dropped: u64,
    pub failed: u64,
    pub queued: u64,
}

/// One tool's call metrics, taken from the families once: a call updates them without
/// building label sets (owned `String`s) to look itself up.
struct ToolHandles {
    latency: Histogram,
    /// By outcome (a handful per tool).
    calls: Vec<(String, Counter)>,
    /// `mcp_server_operation_duration_seconds`, by error type.
    server_ops: OperationHandles,
    /// `mcp_client_operation_duration_seconds`, by error type and transport.
    client_ops: OperationHandles,
    /// The same handles for a successful call (nearly every call), found without a search.
    ok: OkHandles,
}

/// A tool's handles for outcome `ok` (no error type), once created.
#[derive(Default)]
struct OkHandles {
    calls: Option<Counter>,
    server: Option<Histogram>,
    /// By the upstream's transport: `tcp`, `pipe`.
    client: [Option<Histogram>; 2],
}

/// Where a transport's handle is kept in [`OkHandles::client`].
fn transport_slot(transport: &str) -> usize {
    usize::from(transport == "pipe")
}

/// The metrics of one gateway.
pub struct Metrics {
    registry: Registry,
    calls: Family<CallLabels, Counter>,
    latency: HistogramFamily,
    /// Handles into `calls` and `latency`, by tool label (bounded like the labels).
    call_handles: RwLock<HashMap<String, ToolHandles>>,
    registrations_created: Counter,
    /// Tool calls refused by a rate limit (issue 49).
    rate_limited: Counter,
    registrations_closed: Family<ReasonLabel, Counter>,
    registrations: Gauge,
    sessions: Gauge,
    leases: Gauge,
    audit_queue_depth: Gauge,
    audit_healthy: Gauge,
    upstream_connections: Family<UpstreamLabel, Gauge>,
    upstream_in_flight: Family<UpstreamLabel, Gauge>,
    upstream_restarts: Family<UpstreamLabel, Counter<u64, AtomicU64>>,
    notifications_refused: Family<UpstreamLabel, Counter<u64, AtomicU64>>,
    refused: Family<RefusedLabels, Counter<u64, AtomicU64>>,
    token_requests: Family<TokenLabels, Counter<u64, AtomicU64>>,
    /// Cluster (issue 36): from a release's commit to the last live node's acknowledgment.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    release_propagation: Histogram,
    /// Cluster: 1 while this node is fenced (503 on MCP paths).
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    fenced: Gauge,
    server_ops: OperationFamily,
    client_ops: OperationFamily,
    otel_sent: Counter<u64, AtomicU64>,
    otel_dropped: Counter<u64, AtomicU64>,
    otel_failed: Counter<u64, AtomicU64>,
    otel_queued: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Cluster: one release's propagation time.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub fn release_propagated(&self, secs: f64) {
        self.release_propagation.observe(secs);
    }

    /// Cluster: this node fenced (true) or serving (false).
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub fn set_fenced(&self, fenced: bool) {
        self.fenced.set(i64::from(fenced));
    }

    pub fn new() -> Self {
        // The conventions' metrics go unprefixed at the root; the gateway's own under
        // `gatehouse_`.
        let mut root = Registry::default();
        let [server_ops, client_ops] = [
            ("server", "served"),
            ("client", "sent upstream"),
        ]
        .map(|(side, what)| {
            let ops: OperationFamily = Family::new_with_constructor(operation_histogram);
            root.register_with_unit(
                format!("mcp_{side}_operation_duration"),
                format!("Duration of MCP requests {what} (OpenTelemetry MCP conventions: mcp.{side}.operation.duration)"),
                prometheus_client::registry::Unit::Seconds,
                ops.clone(),
            );
            ops
        });
        let r = root.sub_registry_with_prefix("gatehouse");
        Metrics {
            release_propagation: add(r, "release_propagation_seconds", "Cluster: from a release's commit in the store to the last live node's acknowledgment (a node that fenced instead counts at the bound)", Histogram::new(exponential_buckets(0.001, 2.0, 16))),
            fenced: add(r, "fenced", "Cluster: 1 while this node cannot prove it has seen the store's recent writes (it answers 503 on MCP paths)", Gauge::default()),
            refused: add(r, "refused_requests", "Requests refused, by listener (data, admin), HTTP status and reason (a closed set: see docs/daemon.md)", Family::<RefusedLabels, Counter<u64, AtomicU64>>::default()),
            server_ops,
            client_ops,
            otel_sent: add(r, "otel_spans_sent", "Spans the OTLP collector accepted", Counter::<u64, AtomicU64>::default()),
            otel_dropped: add(r, "otel_spans_dropped", "Spans dropped because the export queue was full (the collector slow or down)", Counter::<u64, AtomicU64>::default()),
            otel_failed: add(r, "otel_spans_failed", "Spans in export requests that failed (refused, timed out, unreachable)", Counter::<u64, AtomicU64>::default()),
            otel_queued: add(r, "otel_queue_depth", "Spans waiting for export", Gauge::default()),
            calls: add(r, "tool_calls", "Tool calls by tool and outcome", Family::<CallLabels, Counter>::default()),
            latency: add(r, "tool_call_duration_seconds", "Tool call latency, from request to audited reply", Family::new_with_constructor(latency_histogram)),
            call_handles: RwLock::new(HashMap::default()),
            registrations_created: add(r, "registrations_created", "Registrations created", Counter::default()),
            rate_limited: add(r, "tool_calls_rate_limited", "Tool calls refused by a rate limit (limits.calls_per_minute, tool_calls_per_minute)", Counter::default()),
            registrations_closed: add(r, "registrations_closed", "Registrations ended, by reason (released, expired, shutdown)", Family::<ReasonLabel, Counter>::default()),
            registrations: add(r, "registrations", "Live registrations", Gauge::default()),
            sessions: add(r, "sessions", "Open MCP sessions", Gauge::default()),
            leases: add(r, "leases", "Registrations with a TTL lease", Gauge::default()),
            audit_queue_depth: add(r, "audit_queue_depth", "Audit records queued and not yet written", Gauge::default()),
            audit_healthy: add(r, "audit_healthy", "1 if the last audit write succeeded (tool calls are refused otherwise)", Gauge::default()),
            upstream_connections: add(r, "upstream_connections", "Live upstream connections", Family::<UpstreamLabel, Gauge>::default()),
            upstream_in_flight: add(r, "upstream_in_flight", "Requests in flight to an upstream", Family::<UpstreamLabel, Gauge>::default()),
            upstream_restarts: add(r, "upstream_restarts", "Upstream connection (re)spawns after the first", Family::<UpstreamLabel, Counter<u64, AtomicU64>>::default()),
            notifications_refused: add(r, "notifications_refused", "Call notifications (progress, logs) from an upstream that were not delivered: the call ended first, or its caller took none for the grace", Family::<UpstreamLabel, Counter<u64, AtomicU64>>::default()),
            token_requests: add(r, "upstream_token_requests", "OAuth token requests to an upstream's authorization server, by upstream, grant (client_credentials, token_exchange) and outcome (ok, refused, unreachable, invalid)", Family::<TokenLabels, Counter<u64, AtomicU64>>::default()),
            registry: root,
        }
    }

    /// Counts a finished tool call, with its `mcp_server_operation_duration_seconds` by
    /// `error_type` and, when an upstream answered it (`client`: transport, duration), its
    /// `mcp_client_operation_duration_seconds`: one lookup for all. `tool` must already be
    /// bounded (see the module invariant).
    pub fn observe_call(
        &self,
        tool: &str,
        outcome: &str,
        error_type: Option<&'static str>,
        elapsed: Duration,
        client: Option<(&'static str, Duration)>,
    ) {
        let secs = elapsed.as_secs_f64();
        let find_client = |h: &ToolHandles, transport: &str| {
            h.client_ops
                .iter()
                .position(|(e, t, _)| *e == error_type && *t == transport)
        };
        let ok = error_type.is_none() && outcome == "ok";
        {
            let handles = crate::sync::read(&self.call_handles);
            if let Some(h) = handles.get(tool) {
                if ok {
                    // A successful call: its handles kept apart, no search.
                    if let (Some(c), Some(op)) = (&h.ok.calls, &h.ok.server) {
                        let upstream = match client {
                            None => Some(None),
                            Some((t, d)) => h.ok.client[transport_slot(t)]
                                .as_ref()
                                .map(|op| Some((op, d))),
                        };
                        if let Some(upstream) = upstream {
                            c.inc();
                            h.latency.observe(secs);
                            op.observe(secs);
                            if let Some((op, d)) = upstream {
                                op.observe(d.as_secs_f64());
                            }
                            return;
                        }
                    }
                } else if let (Some((_, c)), Some((_, _, op))) = (
                    h.calls.iter().find(|(o, _)| o == outcome),
                    h.server_ops.iter().find(|(e, _, _)| *e == error_type),
                ) {
                    let client_at = client.map(|(t, d)| (find_client(h, t), d));
                    if !matches!(client_at, Some((None, _))) {
                        c.inc();
                        h.latency.observe(secs);
                        op.observe(secs);
                        if let Some((Some(i), d)) = client_at {
                            h.client_ops[i].2.observe(d.as_secs_f64());
                        }
                        return;
                    }
                }
            }
        }
        // First call with this tool and outcome: the series are created here, as they were
        // when every call looked them up.
        let mut handles = crate::sync::write(&self.call_handles);
        let h = handles
            .entry(tool.to_string())
            .or_insert_with(|| ToolHandles {
                latency: self.latency.get_or_create_owned(&ToolLabel {
                    tool: tool.to_string(),
                }),
                calls: Vec::new(),
                server_ops: Vec::new(),
                client_ops: Vec::new(),
                ok: OkHandles::default(),
            });
        if let Some((transport, d)) = client {
            let i = match find_client(h, transport) {
                Some(i) => i,
                None => {
                    let op = self.client_ops.get_or_create_owned(&OperationLabels {
                        mcp_method_name: "tools/call",
                        gen_ai_tool_name: tool.to_string(),
                        error_type: error_type.unwrap_or(""),
                        network_transport: transport,
                    });
                    h.client_ops.push((error_type, transport, op));
                    h.client_ops.len() - 1
                }
            };
            let op = h.client_ops[i].2.clone();
            op.observe(d.as_secs_f64());
            if ok {
                h.ok.client[transport_slot(transport)] = Some(op);
            }
        }
        if !h.server_ops.iter().any(|(e, _, _)| *e == error_type) {
            let op = self.server_ops.get_or_create_owned(&OperationLabels {
                mcp_method_name: "tools/call",
                gen_ai_tool_name: tool.to_string(),
                error_type: error_type.unwrap_or(""),
                network_transport: "tcp",
            });
            h.server_ops.push((error_type, "tcp", op));
        }
        if let Some((_, _, op)) = h.server_ops.iter().find(|(e, _, _)| *e == error_type) {
            op.observe(secs);
            if ok {
                h.ok.server = Some(op.clone());
            }
        }
        let counter = match h.calls.iter().find(|(o, _)| o == outcome) {
            Some((_, c)) => c.clone(),
            None => {
                let c = self.calls.get_or_create_owned(&CallLabels {
                    tool: tool.to_string(),
                    outcome: outcome.to_string(),
                });
                h.calls.push((outcome.to_string(), c.clone()));
                c
            }
        };
        counter.inc();
        if ok {
            h.ok.calls = Some(counter);
        }
        h.latency.observe(secs);
    }

    /// Observes a request other than `tools/call` in `mcp_server_operation_duration_seconds`
    /// (`client`: false) or `mcp_client_operation_duration_seconds` (an upstream request):
    /// labelled by method (a closed set: `telemetry::method_name`), error type and transport,
    /// with an empty tool name; never by agent, registration, prompt or URI.
    pub fn observe_operation(
        &self,
        client: bool,
        method: &'static str,
        error_type: Option<&'static str>,
        transport: &'static str,
        elapsed: Duration,
    ) {
        let family = if client {
            &self.client_ops
        } else {
            &self.server_ops
        };
        family
            .get_or_create(&OperationLabels {
                mcp_method_name: method,
                gen_ai_tool_name: String::new(),
                error_type: error_type.unwrap_or(""),
                network_transport: transport,
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Counts a refused request.
    pub fn refused(&self, listener: &'static str, status: u16, reason: &'static str) {
        self.refused
            .get_or_create(&RefusedLabels {
                listener,
                status,
                reason,
            })
            .inc();
    }

    pub fn rate_limited(&self) {
        self.rate_limited.inc();
    }

    pub fn registration_created(&self) {
        self.registrations_created.inc();
    }

    pub fn registration_closed(&self, reason: &str) {
        self.registrations_closed
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Sets the gauges from `snap` and encodes everything as OpenMetrics text.
    pub fn render(&self, snap: &Snapshot) -> String {
        let g = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.registrations.set(g(snap.registrations));
        self.sessions.set(g(snap.sessions));
        self.leases.set(g(snap.leases));
        self.audit_queue_depth.set(g(snap.audit_queue_depth));
        self.audit_healthy.set(i64::from(snap.audit_healthy));
        for (id, conns, in_flight, restarts) in &snap.upstreams {
            let l = UpstreamLabel {
                upstream: id.clone(),
            };
            self.upstream_connections.get_or_create(&l).set(g(*conns));
            self.upstream_in_flight.get_or_create(&l).set(g(*in_flight));
            let c = self.upstream_restarts.get_or_create(&l);
            let seen = c.get();
            if *restarts > seen {
                c.inc_by(restarts - seen);
            }
        }
        for (id, refused) in &snap.notifications_refused {
            let c = self.notifications_refused.get_or_create(&UpstreamLabel {
                upstream: id.clone(),
            });
            let seen = c.get();
            if *refused > seen {
                c.inc_by(refused - seen);
            }
        }
        for (id, grant, outcome, n) in &snap.token_requests {
            let c = self.token_requests.get_or_create(&TokenLabels {
                upstream: id.clone(),
                grant,
                outcome,
            });
            let seen = c.get();
            if *n > seen {
                c.inc_by(n - seen);
            }
        }
        if let Some(o) = &snap.otel {
            for (c, now) in [
                (&self.otel_sent, o.sent),
                (&self.otel_dropped, o.dropped),
                (&self.otel_failed, o.failed),
            ] {
                let seen = c.get();
                if now > seen {
                    c.inc_by(now - seen);
                }
            }
            self.otel_queued
                .set(i64::try_from(o.queued).unwrap_or(i64::MAX));
        }
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "metrics encoding failed");
        }
        out
    }
}

/// Registers `metric` under `name` with its help text, and gives it back to be kept.
fn add<M: prometheus_client::registry::Metric + Clone>(
    r: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    r.register(name, help, metric.clone());
    metric
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_calls_latency_and_gauges() {
        let m = Metrics::new();
        m.observe_call("demo.echo", "ok", None, Duration::from_millis(3), None);
        m.observe_call(
            "demo.echo",
            "tool_error",
            Some("tool_error"),
            Duration::from_millis(30),
            Some(("pipe", Duration::from_millis(2))),
        );
        m.registration_created();
        m.registration_closed("expired");
        m.refused("data", 401, "bad_token");
        m.refused("data", 401, "bad_token");
        let text = m.render(&Snapshot {
            registrations: 2,
            audit_queue_depth: 5,
            upstreams: vec![("helpdesk".into(), 1, 0, 3)],
            notifications_refused: vec![("helpdesk".into(), 2)],
            token_requests: vec![("gh".into(), "client_credentials", "ok", 3)],
            ..Default::default()
        });
        assert!(
            text.contains(r#"gatehouse_tool_calls_total{tool="demo.echo",outcome="ok"} 1"#),
            "{text}"
        );
        // The MCP conventions' histograms, unprefixed, by error type and transport.
        assert!(
            text.contains(r#"mcp_server_operation_duration_seconds_count{mcp_method_name="tools/call",gen_ai_tool_name="demo.echo",error_type="tool_error",network_transport="tcp"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"mcp_client_operation_duration_seconds_bucket{le="0.01",mcp_method_name="tools/call",gen_ai_tool_name="demo.echo",error_type="tool_error",network_transport="pipe"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"gatehouse_tool_call_duration_seconds_count{tool="demo.echo"} 2"#),
            "{text}"
        );
        assert!(text.contains("gatehouse_registrations 2"), "{text}");
        assert!(
            text.contains(r#"gatehouse_refused_requests_total{listener="data",status="401",reason="bad_token"} 2"#),
            "{text}"
        );
        assert!(text.contains("gatehouse_audit_queue_depth 5"), "{text}");
        assert!(
            text.contains(r#"gatehouse_upstream_token_requests_total{upstream="gh",grant="client_credentials",outcome="ok"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"gatehouse_registrations_closed_total{reason="expired"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"gatehouse_notifications_refused_total{upstream="helpdesk"} 2"#)
                && text.contains(r#"gatehouse_upstream_restarts_total{upstream="helpdesk"} 3"#),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn cached_handles_count_into_the_same_series() {
        let m = Metrics::new();
        for outcome in ["ok", "denied", "ok", "ok"] {
            m.observe_call("demo.echo", outcome, None, Duration::from_millis(2), None);
        }
        m.observe_call("_unknown", "denied", None, Duration::from_millis(1), None);
        let text = m.render(&Snapshot::default());
        for want in [
            r#"gatehouse_tool_calls_total{tool="demo.echo",outcome="ok"} 3"#,
            r#"gatehouse_tool_calls_total{tool="demo.echo",outcome="denied"} 1"#,
            r#"gatehouse_tool_calls_total{tool="_unknown",outcome="denied"} 1"#,
            r#"gatehouse_tool_call_duration_seconds_count{tool="demo.echo"} 4"#,
            r#"gatehouse_tool_call_duration_seconds_count{tool="_unknown"} 1"#,
        ] {
            assert!(text.contains(want), "{want} missing from {text}");
        }
    }

    #[test]
    fn the_lock_free_histogram_renders_as_prometheus_clients_does() {
        // The same observations into both: the text must be the same.
        let ours = Histogram::new([0.01, 0.1, 1.0, f64::INFINITY]);
        let theirs =
            prometheus_client::metrics::histogram::Histogram::new([0.01, 0.1, 1.0, f64::INFINITY]);
        for v in [0.005, 0.01, 0.05, 0.5, 2.0, 1e9, f64::NAN, 0.0] {
            ours.observe(v);
            theirs.observe(v);
        }
        assert_eq!(ours.count(), 8);
        let render = |h: &dyn Fn(&mut Registry)| {
            let mut r = Registry::default();
            h(&mut r);
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, &r).map(|_| text)
        };
        let a = render(&|r| r.register("d", "h", ours.clone()));
        let b = render(&|r| r.register("d", "h", theirs.clone()));
        // NaN makes both sums NaN: compare everything else, then the buckets by name.
        let strip = |t: String| {
            t.lines()
                .filter(|l| !l.starts_with("d_sum"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        assert_eq!(strip(a.expect("encodes")), strip(b.expect("encodes")));
        // With a finite sum, the sums agree too.
        let (x, y) = (
            Histogram::new([1.0]),
            prometheus_client::metrics::histogram::Histogram::new([1.0]),
        );
        for v in [0.25, 0.5, 3.0] {
            x.observe(v);
            y.observe(v);
        }
        let a = render(&|r| r.register("d", "h", x.clone()));
        let b = render(&|r| r.register("d", "h", y.clone()));
        assert_eq!(a.expect("encodes"), b.expect("encodes"));
        assert_eq!(x.count(), 3);
    }
}
