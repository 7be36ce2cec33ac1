//! The probe (issue 48): is this registration healthy, as its agent would see it? One MCP round
//! trip over the real socket with the registration's own token (`initialize`,
//! `notifications/initialized`, `tools/list` on Streamable HTTP, then the session closed), and a
//! `ping` to each upstream its tools come from, all within one deadline.
//!
//! One result shape, [`Probe`] (its JSON), for every API: the library's
//! `Registration::probe`, the CLI's `gatehouse probe`, the Python and TypeScript clients. The
//! daemon keeps only a digest of a registration's token, so the round trip is made by whoever
//! holds the token; the daemon's half (the grant and the upstreams' pings) is
//! [`Gateway::probe_upstreams`], served to admin clients as `POST /v1/registrations/<id>/probe`.
//!
//! It fails fast with the reason ([`Reason`]): the round trip's refusal (401 refused, 404
//! released, 503 fenced) ends the probe at once; an upstream that does not answer its ping is
//! `upstream_down`, naming it. The tools listed against the grant are a finding, not a failure.
//! Tokens never appear in a result or an error.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::Gateway;

/// Why a probe failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// 401: the token is not this registration's.
    Refused,
    /// 404: the registration is not live (released, expired, or never made).
    Released,
    /// 503: a cluster node that cannot prove it is current (or a gateway shutting down).
    Fenced,
    /// An upstream the registration's tools come from did not answer (named in the result).
    UpstreamDown,
    /// No answer within the deadline.
    Timeout,
    /// The gateway cannot be reached (connection refused, DNS, TLS).
    Unreachable,
    /// The gateway answered something that is not the MCP it should be.
    Protocol,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Refused => "refused",
            Reason::Released => "released",
            Reason::Fenced => "fenced",
            Reason::UpstreamDown => "upstream_down",
            Reason::Timeout => "timeout",
            Reason::Unreachable => "unreachable",
            Reason::Protocol => "protocol",
        }
    }
}

/// Why a probe failed, with the HTTP status when there was one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub reason: Reason,
    pub status: Option<u16>,
    pub message: String,
}

/// The tools the registration listed, against its grant (the tools it was given at creation).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ToolsSeen {
    /// `listed` and `granted` are the same set.
    pub equal: bool,
    pub granted: Vec<String>,
    pub listed: Vec<String>,
    /// Granted but not listed.
    pub missing: Vec<String>,
    /// Listed but not granted.
    pub unexpected: Vec<String>,
}

impl ToolsSeen {
    pub fn compare(granted: Vec<String>, listed: Vec<String>) -> ToolsSeen {
        let missing: Vec<String> = granted
            .iter()
            .filter(|g| !listed.contains(g))
            .cloned()
            .collect();
        let unexpected: Vec<String> = listed
            .iter()
            .filter(|l| !granted.contains(l))
            .cloned()
            .collect();
        ToolsSeen {
            equal: missing.is_empty() && unexpected.is_empty(),
            granted,
            listed,
            missing,
            unexpected,
        }
    }
}

/// One upstream's answer to the probe's `ping`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpstreamSeen {
    pub id: String,
    pub answered: bool,
    pub latency_ms: f64,
    /// Why it did not answer (its kind only: never a command or a URL).
    pub error: Option<String>,
}

/// What a probe saw. Serialized as is by every API (the JSON shape of the probe).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    pub id: String,
    /// Reachable, tools listed, every upstream answered (the tools may still differ from the
    /// grant: see `tools.equal`).
    pub ok: bool,
    /// The MCP round trip completed (initialize and tools/list answered).
    pub reachable: bool,
    /// The round trip's time (initialize → tools/list answered), in milliseconds.
    pub latency_ms: Option<f64>,
    /// The protocol version the gateway answered `initialize` with.
    pub protocol_version: Option<String>,
    pub tools: ToolsSeen,
    pub upstreams: Vec<UpstreamSeen>,
    /// The ids of the upstreams that did not answer.
    pub upstreams_down: Vec<String>,
    /// Why the probe failed (`null` when `ok`).
    pub failure: Option<Failure>,
    /// The whole probe's time, in milliseconds.
    pub elapsed_ms: f64,
}

/// A probe that failed: the reason, and everything it saw until then.
#[derive(Debug, Clone, thiserror::Error)]
#[error("probe of {}: {}", .0.id, describe(.0))]
pub struct ProbeError(pub Box<Probe>);

fn describe(p: &Probe) -> String {
    match &p.failure {
        Some(f) => match f.status {
            Some(s) => format!("{} (HTTP {s}): {}", f.reason.as_str(), f.message),
            None => format!("{}: {}", f.reason.as_str(), f.message),
        },
        None => "failed".into(),
    }
}

impl ProbeError {
    pub fn reason(&self) -> Option<Reason> {
        self.0.failure.as_ref().map(|f| f.reason)
    }

    /// What the probe saw.
    pub fn probe(&self) -> &Probe {
        &self.0
    }
}

impl Probe {
    /// `Ok` when the probe succeeded, else the error carrying it.
    pub fn into_result(self) -> Result<Probe, ProbeError> {
        if self.ok {
            Ok(self)
        } else {
            Err(ProbeError(Box::new(self)))
        }
    }
}

/// The daemon's half of a probe: the tools the registration was granted, and each upstream
/// its tools come from pinged on the registration's connection (`POST
/// /v1/registrations/<id>/probe`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpstreamsSeen {
    pub id: String,
    /// The registration's Streamable HTTP URL (where the round trip goes).
    pub mcp_url: Option<String>,
    pub tools: Vec<String>,
    pub upstreams: Vec<UpstreamSeen>,
}

/// The default deadline of a probe (the OpenAI Agents SDK's MCP connect timeout).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest deadline the admin API accepts.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);

impl super::handle::Registration {
    /// Probes this registration as its agent would reach it: the MCP round trip over the real
    /// socket with its own token, its tools against its grant, a `ping` to each upstream its
    /// tools come from; all within `timeout` ([`DEFAULT_TIMEOUT`] is 5 s). `Err` carries the
    /// reason (refused, released, fenced, upstream down naming it, timeout) and what was seen.
    pub async fn probe(&self, timeout: Duration) -> Result<Probe, ProbeError> {
        self.gateway
            .probe(self.id(), &self.mcp_url(), &self.token, timeout)
            .await
    }
}

impl Gateway {
    /// [`Registration::probe`](super::Registration::probe) of registration `id` served at
    /// `mcp_url`, with `token` (the caller's: the gateway keeps only its digest).
    pub async fn probe(
        &self,
        id: &str,
        mcp_url: &str,
        token: &str,
        timeout: Duration,
    ) -> Result<Probe, ProbeError> {
        let http = match client(mcp_url, timeout) {
            Ok(c) => c,
            Err(e) => return failed(id, protocol(e)).into_result(),
        };
        let key = id.to_string();
        let mut p = run(&http, id, mcp_url, token, timeout, |left| async move {
            Ok(self.probe_upstreams(&key, pings_within(left)).await)
        })
        .await;
        // The server stops with the last registration: nothing listens, because it is released.
        if let Some(f) = p.failure.as_mut() {
            if f.reason == Reason::Unreachable && self.inner.hub.registry().get(id).is_none() {
                f.reason = Reason::Released;
                f.message = format!("released (nothing serves it any more: {})", f.message);
            }
        }
        p.into_result()
    }
}

impl Gateway {
    /// The daemon's half of a probe of `id` (`None`: not a live registration): its granted
    /// tools, and a `ping` to every upstream its tools come from, concurrently, each within
    /// `timeout`. A `per_registration` upstream's connection is spawned as its first call would.
    pub async fn probe_upstreams(&self, id: &str, timeout: Duration) -> Option<UpstreamsSeen> {
        let state = self.inner.hub.registry().get(id)?;
        let mut ups: Vec<String> = Vec::new();
        for t in state.tools.iter() {
            if let crate::tools::Backend::Upstream { upstream, .. } = &t.backend {
                if !ups.contains(upstream) {
                    ups.push(upstream.clone());
                }
            }
        }
        let pool = self.inner.hub.pool();
        let state = &state;
        let pings = ups.into_iter().map(|up| async move {
            let began = Instant::now();
            let answer = pool.ping(&up, state, timeout).await;
            UpstreamSeen {
                id: up,
                answered: answer.is_ok(),
                latency_ms: ms(began.elapsed()),
                error: answer.err().map(str::to_string),
            }
        });
        let upstreams = futures::future::join_all(pings).await;
        let mcp_url = crate::sync::lock(&self.inner.lifecycle)
            .server
            .as_ref()
            .map(|s| format!("{}/gw/{id}/mcp", s.base_url));
        Some(UpstreamsSeen {
            id: id.to_string(),
            mcp_url,
            tools: state.tools.names(),
            upstreams,
        })
    }
}

/// The pings' bound when `left` remains of the probe: a fifth is kept for the answer, so an
/// upstream that hangs is named (`upstream_down`) before the probe's own deadline passes.
pub fn pings_within(left: Duration) -> Duration {
    left.mul_f64(0.8).max(Duration::from_millis(1))
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// What the round trip saw.
struct Seen {
    listed: Vec<String>,
    protocol_version: Option<String>,
    latency: Duration,
}

/// A probe: the MCP round trip at `mcp_url` with `token`, then (if it succeeded) `daemon`, the
/// daemon's half, given the time left; all within `timeout`. `daemon` answers `Ok(None)` for a
/// registration that is not live, `Err` when it cannot be asked.
pub async fn run<F, Fut>(
    http: &reqwest::Client,
    id: &str,
    mcp_url: &str,
    token: &str,
    timeout: Duration,
    daemon: F,
) -> Probe
where
    F: FnOnce(Duration) -> Fut,
    Fut: std::future::Future<Output = Result<Option<UpstreamsSeen>, Failure>>,
{
    let began = Instant::now();
    let mut probe = Probe::nothing_seen(id);
    let timed_out = || Failure {
        reason: Reason::Timeout,
        status: None,
        message: format!("no answer within {} ms", timeout.as_millis()),
    };
    let seen = match tokio::time::timeout(timeout, round_trip(http, mcp_url, token)).await {
        Ok(Ok(seen)) => seen,
        Ok(Err(f)) => return finish(probe, Some(f), began),
        Err(_) => return finish(probe, Some(timed_out()), began),
    };
    probe.reachable = true;
    probe.latency_ms = Some(ms(seen.latency));
    probe.protocol_version = seen.protocol_version;
    let left = timeout.saturating_sub(began.elapsed());
    let daemon_seen = match tokio::time::timeout(left, daemon(left)).await {
        Ok(Ok(Some(d))) => d,
        Ok(Ok(None)) => {
            probe.tools = ToolsSeen::compare(Vec::new(), seen.listed);
            let f = Failure {
                reason: Reason::Released,
                status: Some(404),
                message: "released while it was probed".into(),
            };
            return finish(probe, Some(f), began);
        }
        Ok(Err(f)) => {
            probe.tools = ToolsSeen::compare(Vec::new(), seen.listed);
            return finish(probe, Some(f), began);
        }
        Err(_) => {
            probe.tools = ToolsSeen::compare(Vec::new(), seen.listed);
            return finish(probe, Some(timed_out()), began);
        }
    };
    probe.tools = ToolsSeen::compare(daemon_seen.tools, seen.listed);
    probe.upstreams_down = daemon_seen
        .upstreams
        .iter()
        .filter(|u| !u.answered)
        .map(|u| u.id.clone())
        .collect();
    probe.upstreams = daemon_seen.upstreams;
    let failure = (!probe.upstreams_down.is_empty()).then(|| Failure {
        reason: Reason::UpstreamDown,
        status: None,
        message: format!(
            "did not answer: {}",
            probe
                .upstreams
                .iter()
                .filter(|u| !u.answered)
                .map(|u| format!("{} ({})", u.id, u.error.as_deref().unwrap_or("no answer")))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    });
    finish(probe, failure, began)
}

impl Probe {
    /// A probe of `id` that has seen nothing yet.
    fn nothing_seen(id: &str) -> Probe {
        Probe {
            id: id.to_string(),
            ok: false,
            reachable: false,
            latency_ms: None,
            protocol_version: None,
            tools: ToolsSeen::default(),
            upstreams: Vec::new(),
            upstreams_down: Vec::new(),
            failure: None,
            elapsed_ms: 0.0,
        }
    }
}

/// A probe that could not start (`failure` says why).
pub fn failed(id: &str, failure: Failure) -> Probe {
    finish(Probe::nothing_seen(id), Some(failure), Instant::now())
}

fn finish(mut probe: Probe, failure: Option<Failure>, began: Instant) -> Probe {
    probe.ok = failure.is_none();
    probe.failure = failure;
    probe.elapsed_ms = ms(began.elapsed());
    probe
}

/// The failure of an HTTP answer that is not a success, by its status.
pub fn failure_of_status(status: u16, message: String) -> Failure {
    let reason = match status {
        401 | 403 => Reason::Refused,
        404 => Reason::Released,
        503 => Reason::Fenced,
        _ => Reason::Protocol,
    };
    Failure {
        reason,
        status: Some(status),
        message,
    }
}

fn protocol(message: impl Into<String>) -> Failure {
    Failure {
        reason: Reason::Protocol,
        status: None,
        message: message.into(),
    }
}

/// `initialize`, `notifications/initialized`, `tools/list`, then the session closed (best
/// effort). The token goes in the `Authorization` header only.
async fn round_trip(http: &reqwest::Client, url: &str, token: &str) -> Result<Seen, Failure> {
    let began = Instant::now();
    let init = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": crate::protocol::LATEST_LEGACY,
            "capabilities": {},
            "clientInfo": {"name": "gatehouse-probe", "version": env!("CARGO_PKG_VERSION")},
        },
    });
    let (headers, answer) = post(http, url, token, None, None, &init).await?;
    let result = result_of(answer, "initialize")?;
    let version = result
        .get("protocolVersion")
        .and_then(Value::as_str)
        .map(str::to_string);
    let session = headers
        .get(crate::endpoint::SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let v = version.as_deref();
    let s = session.as_deref();
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    post(http, url, token, s, v, &note).await?;
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
    let (_, answer) = post(http, url, token, s, v, &list).await?;
    let result = result_of(answer, "tools/list")?;
    let latency = began.elapsed();
    let listed = result
        .get("tools")
        .and_then(Value::as_array)
        .ok_or_else(|| protocol("tools/list answered without a tools array"))?
        .iter()
        .filter_map(|t| t.get("name").and_then(Value::as_str).map(str::to_string))
        .collect();
    if let Some(s) = s {
        // Best effort: an unclosed session ends with the registration or its idle timeout.
        let _ = http
            .delete(url)
            .bearer_auth(token)
            .header(crate::endpoint::SESSION_HEADER, s)
            .send()
            .await;
    }
    Ok(Seen {
        listed,
        protocol_version: version,
        latency,
    })
}

/// One POST; its JSON-RPC answer (`None` for a notification's 202), from a JSON body or the
/// first message of an event stream.
async fn post(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    session: Option<&str>,
    version: Option<&str>,
    body: &Value,
) -> Result<(reqwest::header::HeaderMap, Option<Value>), Failure> {
    let mut req = http
        .post(url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .json(body);
    if let Some(s) = session {
        req = req.header(crate::endpoint::SESSION_HEADER, s);
    }
    if let Some(v) = version {
        req = req.header("mcp-protocol-version", v);
    }
    let resp = req.send().await.map_err(|e| Failure {
        reason: if e.is_timeout() {
            Reason::Timeout
        } else {
            Reason::Unreachable
        },
        status: None,
        // Without the URL (`without_url`): it is the caller's own, and may carry secrets.
        message: format!("cannot reach the gateway: {}", e.without_url()),
    })?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let is_sse = headers
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| c.starts_with("text/event-stream"));
    // Bounded: a probe reads at most 4 MiB of an answer.
    let bytes = read_bounded(resp, 4 << 20).await?;
    if !(200..300).contains(&status) {
        let message = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| {
                v.pointer("/error/message")
                    .or_else(|| v.get("error"))
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .unwrap_or_else(|| format!("HTTP {status}"));
        return Err(failure_of_status(status, message));
    }
    if body.get("id").is_none() {
        return Ok((headers, None));
    }
    let answer = if is_sse {
        let text = String::from_utf8_lossy(&bytes);
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|m| m.get("id") == body.get("id"))
    } else {
        serde_json::from_slice(&bytes).ok()
    };
    match answer {
        Some(a) => Ok((headers, Some(a))),
        None => Err(protocol("the gateway's answer is not JSON-RPC")),
    }
}

async fn read_bounded(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, Failure> {
    let mut out = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                if out.len() + c.len() > max {
                    return Err(protocol("the gateway's answer is too large"));
                }
                out.extend_from_slice(&c);
            }
            Ok(None) => return Ok(out),
            Err(e) => return Err(protocol(format!("the answer was cut: {}", e.without_url()))),
        }
    }
}

fn result_of(answer: Option<Value>, method: &str) -> Result<Value, Failure> {
    let a = answer.ok_or_else(|| protocol(format!("{method}: no answer")))?;
    if let Some(e) = a.get("error") {
        let m = e.get("message").and_then(Value::as_str).unwrap_or("");
        return Err(protocol(format!("{method} answered an error: {m}")));
    }
    a.get("result")
        .cloned()
        .ok_or_else(|| protocol(format!("{method}: an answer without a result")))
}

/// The HTTP client of a probe: no proxy for a loopback gateway (an `HTTP_PROXY` in the
/// environment would otherwise see the token), and the deadline as its timeout.
pub fn client(url: &str, timeout: Duration) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder().timeout(timeout);
    let loopback = reqwest::Url::parse(url).ok().is_some_and(|u| {
        let host = u.host_str().unwrap_or("");
        host == "localhost"
            || host
                .trim_matches(|c| c == '[' || c == ']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|a| a.is_loopback())
    });
    if loopback {
        b = b.no_proxy();
    }
    b.build().map_err(|e| e.to_string())
}
