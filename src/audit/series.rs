//! Live series for the operator console: calls and errors per second over the last 15
//! minutes, per agent and per upstream, latency histograms per tool, and each upstream's last
//! error — fed from the audit records as they are handed to the writer.
//!
//! Bounded: one ring of [`WINDOW_S`] one-second slots per key, at most [`MAX_AGENTS`] agents,
//! [`MAX_UPSTREAMS`] upstreams and [`MAX_TOOLS`] tools (later keys fold into [`OTHER`]), keys
//! cut to [`MAX_KEY_BYTES`]; tool latency in [`BUCKETS`] √2-spaced buckets per minute, over
//! [`LATENCY_MINUTES`] minutes. The daemon turns it on with its admin router
//! (`Audit::enable_series`); an embedded gateway never pays for it.

use std::collections::BTreeMap;

use super::record::{prefix as cut, Record};
use crate::sync::HashMap;

/// The window the rings cover, in seconds (15 minutes).
pub const WINDOW_S: usize = 900;
/// Distinct agents tracked; the rest are summed under [`OTHER`].
pub const MAX_AGENTS: usize = 32;
/// Distinct upstreams tracked (in-process tools count as [`LOCAL`]).
pub const MAX_UPSTREAMS: usize = 32;
/// Distinct tools tracked.
pub const MAX_TOOLS: usize = 64;
/// The key that overflowing keys are folded into.
pub const OTHER: &str = "_other";
/// The upstream key of in-process tools (and calls refused before an upstream was known).
pub const LOCAL: &str = "_local";
/// The tool key of calls whose name the client chose and no grant matched (or whose params
/// were malformed): they fail with JSON-RPC invalid params (-32602), and counting them under
/// their own names would let a client fill the tool keys (as the metrics' `_unknown` label).
pub const UNKNOWN: &str = "_unknown";
use crate::protocol::error::INVALID_PARAMS;
/// The longest key kept (bytes); a longer one is cut at a character boundary.
pub const MAX_KEY_BYTES: usize = 128;
/// Latency buckets: bucket `i` holds durations up to `10 µs · √2^i` (the last: everything
/// above, ~ 4 min).
pub const BUCKETS: usize = 48;
/// Minutes of latency histograms kept (the current one included).
pub const LATENCY_MINUTES: usize = 16;
/// The longest last-error text kept per upstream (bytes).
pub const MAX_ERROR_BYTES: usize = 256;

/// Outcomes that do not count as errors: a successful call, and one the client cancelled.
fn is_error(outcome: Option<&str>) -> bool {
    !matches!(outcome, Some("ok") | Some("cancelled"))
}

/// The upper bound of bucket `i`, in milliseconds.
pub fn bucket_upper_ms(i: usize) -> f64 {
    0.01 * std::f64::consts::SQRT_2.powi(i as i32)
}

/// The bucket of a duration in milliseconds.
fn bucket_of(ms: f64) -> usize {
    if ms.is_nan() || ms <= 0.01 {
        return 0;
    }
    // log_√2(ms / 0.01) = 2·log2(ms / 0.01), rounded up.
    let i = (2.0 * (ms / 0.01).log2()).ceil();
    if i >= (BUCKETS - 1) as f64 {
        BUCKETS - 1
    } else {
        i.max(0.0) as usize
    }
}

/// Calls and errors per second over the window. Slot `s % WINDOW_S` holds second `s` for
/// `last - WINDOW_S < s <= last`: advancing `last` zeroes the slots it passes.
struct Ring {
    calls: Box<[u32]>,
    errors: Box<[u32]>,
    last: u64,
}

impl Ring {
    fn new(now: u64) -> Ring {
        Ring {
            calls: vec![0; WINDOW_S].into_boxed_slice(),
            errors: vec![0; WINDOW_S].into_boxed_slice(),
            last: now,
        }
    }

    fn advance(&mut self, now: u64) {
        if now <= self.last {
            return;
        }
        let steps = (now - self.last).min(WINDOW_S as u64);
        for k in 1..=steps {
            let i = ((self.last + k) % WINDOW_S as u64) as usize;
            self.calls[i] = 0;
            self.errors[i] = 0;
        }
        self.last = now;
    }

    /// Counts one call at `now` (a clock that went back counts into the latest second).
    fn add(&mut self, now: u64, error: bool) {
        self.advance(now);
        let i = (self.last % WINDOW_S as u64) as usize;
        self.calls[i] = self.calls[i].saturating_add(1);
        if error {
            self.errors[i] = self.errors[i].saturating_add(1);
        }
    }

    /// The window ending at `now`, oldest second first: (calls, errors).
    fn window(&self, now: u64) -> (Vec<u32>, Vec<u32>) {
        let mut calls = vec![0; WINDOW_S];
        let mut errors = vec![0; WINDOW_S];
        for (j, (c, e)) in calls.iter_mut().zip(errors.iter_mut()).enumerate() {
            // Second `now - WINDOW_S + 1 + j`.
            let Some(s) = (now + 1 + j as u64).checked_sub(WINDOW_S as u64) else {
                continue;
            };
            if s > self.last || s + (WINDOW_S as u64) <= self.last {
                continue;
            }
            let i = (s % WINDOW_S as u64) as usize;
            *c = self.calls[i];
            *e = self.errors[i];
        }
        (calls, errors)
    }
}

/// One tool's latency histograms, one per minute, kept like [`Ring`]'s slots.
struct Latency {
    minutes: Box<[[u32; BUCKETS]]>,
    last: u64,
}

impl Latency {
    fn new(minute: u64) -> Latency {
        Latency {
            minutes: vec![[0; BUCKETS]; LATENCY_MINUTES].into_boxed_slice(),
            last: minute,
        }
    }

    fn add(&mut self, minute: u64, ms: f64) {
        if minute > self.last {
            let steps = (minute - self.last).min(LATENCY_MINUTES as u64);
            for k in 1..=steps {
                self.minutes[((self.last + k) % LATENCY_MINUTES as u64) as usize] = [0; BUCKETS];
            }
            self.last = minute;
        }
        let b = &mut self.minutes[(self.last % LATENCY_MINUTES as u64) as usize][bucket_of(ms)];
        *b = b.saturating_add(1);
    }

    /// The histogram of the minutes still in the window at `minute`.
    fn merged(&self, minute: u64) -> [u64; BUCKETS] {
        let mut out = [0u64; BUCKETS];
        for k in 0..LATENCY_MINUTES as u64 {
            let Some(m) = self.last.checked_sub(k) else {
                break;
            };
            if m + (LATENCY_MINUTES as u64) <= minute {
                break;
            }
            let h = &self.minutes[(m % LATENCY_MINUTES as u64) as usize];
            for (o, v) in out.iter_mut().zip(h.iter()) {
                *o += u64::from(*v);
            }
        }
        out
    }
}

/// The upper bound (ms) of the bucket holding quantile `q` of `h`; `None` when empty.
fn quantile(h: &[u64; BUCKETS], q: f64) -> Option<f64> {
    let total: u64 = h.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, n) in h.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(bucket_upper_ms(i));
        }
    }
    Some(bucket_upper_ms(BUCKETS - 1))
}

/// Keys with a cap: a new key past it is folded into [`OTHER`].
struct Keyed<T> {
    map: HashMap<String, T>,
    cap: usize,
}

impl<T> Keyed<T> {
    fn new(cap: usize) -> Self {
        Keyed {
            map: HashMap::default(),
            cap,
        }
    }

    /// The entry of `key` (made if it is new and the cap allows, else [`OTHER`]'s). No
    /// allocation for a key already held.
    fn entry(&mut self, key: &str, make: impl FnOnce() -> T) -> Option<&mut T> {
        let key = cut(key, MAX_KEY_BYTES);
        if self.map.contains_key(key) {
            return self.map.get_mut(key);
        }
        let key = if self.map.len() < self.cap {
            key
        } else {
            OTHER
        };
        if !self.map.contains_key(key) {
            self.map.insert(key.to_string(), make());
        }
        self.map.get_mut(key)
    }
}

/// An upstream's last error as the console shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LastError {
    /// When it was seen (RFC 3339).
    pub at: String,
    /// The event and outcome, e.g. `governed_mcp_call: upstream_failed` or `upstream_exited`.
    pub what: String,
    /// The record's reason, cut to [`MAX_ERROR_BYTES`].
    pub reason: Option<String>,
}

#[derive(Default)]
struct Inner {
    agents: Option<Keyed<Ring>>,
    upstreams: Option<Keyed<Ring>>,
    tools: Option<Keyed<Latency>>,
    errors: Option<Keyed<LastError>>,
}

/// The console's series (see the module's documentation). One short `std` lock per record.
#[derive(Default)]
pub struct Series {
    inner: std::sync::Mutex<Inner>,
}

/// One key's window.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KeySeries {
    pub key: String,
    /// Calls per second, oldest first ([`WINDOW_S`] values).
    pub calls: Vec<u32>,
    /// Errors per second, oldest first.
    pub errors: Vec<u32>,
    pub calls_total: u64,
    pub errors_total: u64,
}

/// One tool's latency over the last [`LATENCY_MINUTES`] minutes.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ToolLatency {
    pub tool: String,
    pub calls: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// What the console reads, all at `now`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Snapshot {
    /// Unix seconds of the window's last second.
    pub now: u64,
    pub window_s: usize,
    /// Keys with a call in the window, most calls first.
    pub agents: Vec<KeySeries>,
    pub upstreams: Vec<KeySeries>,
    pub tools: Vec<ToolLatency>,
    pub last_errors: BTreeMap<String, LastError>,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Series {
    pub fn new() -> Series {
        Series::default()
    }

    /// Counts what `r` says: a call, or an upstream's exit or kill.
    pub fn observe(&self, r: &Record<'_>) {
        self.observe_at(unix_now(), r);
    }

    /// [`Series::observe`] at unix second `now` (tests drive the clock).
    pub fn observe_at(&self, now: u64, r: &Record<'_>) {
        let call = r.event == "governed_mcp_call";
        let upstream_event = matches!(&*r.event, "upstream_exited" | "upstream_killed");
        if !call && !upstream_event {
            return;
        }
        let mut inner = crate::sync::lock(&self.inner);
        let outcome = r.outcome.as_deref();
        if call {
            let error = is_error(outcome);
            let agent = r.agent_id.as_deref().unwrap_or("_none");
            let upstream = r.upstream.as_deref().unwrap_or(LOCAL);
            let agents = inner.agents.get_or_insert_with(|| Keyed::new(MAX_AGENTS));
            if let Some(ring) = agents.entry(agent, || Ring::new(now)) {
                ring.add(now, error);
            }
            let upstreams = inner
                .upstreams
                .get_or_insert_with(|| Keyed::new(MAX_UPSTREAMS));
            if let Some(ring) = upstreams.entry(upstream, || Ring::new(now)) {
                ring.add(now, error);
            }
            if let Some(ms) = r.duration_ms {
                let tool = if r.error_code == Some(INVALID_PARAMS) {
                    UNKNOWN
                } else {
                    r.tool.as_deref().unwrap_or("_none")
                };
                let tools = inner.tools.get_or_insert_with(|| Keyed::new(MAX_TOOLS));
                if let Some(lat) = tools.entry(tool, || Latency::new(now / 60)) {
                    lat.add(now / 60, ms);
                }
            }
        }
        let failed_upstream = match (&r.upstream, call) {
            (Some(u), true) if matches!(outcome, Some("upstream_failed") | Some("timeout")) => {
                Some(u)
            }
            (Some(u), false) => Some(u),
            _ => None,
        };
        if let Some(u) = failed_upstream {
            let what = match outcome {
                Some(o) if call => format!("{}: {o}", r.event),
                _ => r.event.to_string(),
            };
            let last = LastError {
                at: if r.ts.is_empty() {
                    chrono::DateTime::from_timestamp(now as i64, 0)
                        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                        .unwrap_or_default()
                } else {
                    r.ts.clone()
                },
                what,
                reason: r
                    .reason
                    .as_deref()
                    .map(|s| cut(s, MAX_ERROR_BYTES).to_string()),
            };
            if let Some(slot) = inner
                .errors
                .get_or_insert_with(|| Keyed::new(MAX_UPSTREAMS))
                .entry(u, || last.clone())
            {
                *slot = last;
            }
        }
    }

    /// The window ending now.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_at(unix_now())
    }

    /// The window ending at unix second `now`.
    pub fn snapshot_at(&self, now: u64) -> Snapshot {
        let inner = crate::sync::lock(&self.inner);
        let rings = |k: &Option<Keyed<Ring>>| -> Vec<KeySeries> {
            let mut out: Vec<KeySeries> = k
                .iter()
                .flat_map(|k| k.map.iter())
                .filter_map(|(key, ring)| {
                    let (calls, errors) = ring.window(now);
                    let calls_total: u64 = calls.iter().map(|&c| u64::from(c)).sum();
                    let errors_total: u64 = errors.iter().map(|&c| u64::from(c)).sum();
                    (calls_total > 0).then(|| KeySeries {
                        key: key.clone(),
                        calls,
                        errors,
                        calls_total,
                        errors_total,
                    })
                })
                .collect();
            out.sort_by(|a, b| b.calls_total.cmp(&a.calls_total).then(a.key.cmp(&b.key)));
            out
        };
        let agents = rings(&inner.agents);
        let upstreams = rings(&inner.upstreams);
        let mut tools: Vec<ToolLatency> = inner
            .tools
            .iter()
            .flat_map(|k| k.map.iter())
            .filter_map(|(tool, lat)| {
                let h = lat.merged(now / 60);
                let calls: u64 = h.iter().sum();
                (calls > 0).then(|| ToolLatency {
                    tool: tool.clone(),
                    calls,
                    p50_ms: quantile(&h, 0.50),
                    p99_ms: quantile(&h, 0.99),
                })
            })
            .collect();
        tools.sort_by(|a, b| a.tool.cmp(&b.tool));
        let last_errors = inner
            .errors
            .iter()
            .flat_map(|k| k.map.iter())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Snapshot {
            now,
            window_s: WINDOW_S,
            agents,
            upstreams,
            tools,
            last_errors,
        }
    }

    /// Keys held: (agents, upstreams, tools, upstream errors).
    pub fn keys(&self) -> (usize, usize, usize, usize) {
        let inner = crate::sync::lock(&self.inner);
        let n = |m: Option<usize>| m.unwrap_or(0);
        (
            n(inner.agents.as_ref().map(|k| k.map.len())),
            n(inner.upstreams.as_ref().map(|k| k.map.len())),
            n(inner.tools.as_ref().map(|k| k.map.len())),
            n(inner.errors.as_ref().map(|k| k.map.len())),
        )
    }

    /// The most memory the series can hold (the slots of every key at its cap, plus keys).
    pub const fn max_bytes() -> usize {
        let ring = WINDOW_S * 2 * 4;
        let latency = LATENCY_MINUTES * BUCKETS * 4;
        let key = MAX_KEY_BYTES + 64;
        (MAX_AGENTS + 1 + MAX_UPSTREAMS + 1) * (ring + key)
            + (MAX_TOOLS + 1) * (latency + key)
            + (MAX_UPSTREAMS + 1) * (MAX_ERROR_BYTES * 2 + key)
    }
}

// Unit tests only (never built into the daemon): an unwrap that fails is the test failing.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn call<'a>(
        agent: &'a str,
        upstream: Option<&'a str>,
        tool: &'a str,
        outcome: &'a str,
        ms: f64,
    ) -> Record<'a> {
        Record {
            agent_id: Some(agent.into()),
            upstream: upstream.map(Into::into),
            tool: Some(tool.into()),
            outcome: Some(outcome.into()),
            duration_ms: Some(ms),
            ..Record::event("governed_mcp_call")
        }
    }

    #[test]
    fn calls_and_errors_land_in_their_second_and_age_out_of_the_window() {
        let s = Series::new();
        let t0 = 1_000_000;
        for _ in 0..3 {
            s.observe_at(t0, &call("a", Some("up"), "up.x", "ok", 1.0));
        }
        s.observe_at(
            t0 + 2,
            &call("a", Some("up"), "up.x", "upstream_failed", 1.0),
        );
        s.observe_at(t0 + 2, &call("b", None, "local", "cancelled", 1.0));
        let snap = s.snapshot_at(t0 + 2);
        let a = snap.agents.iter().find(|k| k.key == "a").unwrap();
        assert_eq!(a.calls.len(), WINDOW_S);
        assert_eq!(a.calls[WINDOW_S - 3], 3);
        assert_eq!(a.calls[WINDOW_S - 1], 1);
        assert_eq!(a.errors[WINDOW_S - 1], 1);
        assert_eq!((a.calls_total, a.errors_total), (4, 1));
        // A cancelled call is not an error; an in-process tool counts under `_local`.
        let b = snap.agents.iter().find(|k| k.key == "b").unwrap();
        assert_eq!(b.errors_total, 0);
        assert!(snap.upstreams.iter().any(|k| k.key == LOCAL));
        assert_eq!(
            snap.last_errors["up"].what,
            "governed_mcp_call: upstream_failed"
        );
        // Still there 897 s later, gone at 900 s.
        assert_eq!(
            s.snapshot_at(t0 + WINDOW_S as u64 - 1).agents[0].calls_total,
            4
        );
        let late = s.snapshot_at(t0 + WINDOW_S as u64 + 1);
        assert_eq!(
            late.agents.iter().map(|k| k.calls_total).sum::<u64>(),
            1 + 1
        );
        assert!(s.snapshot_at(t0 + 10 * WINDOW_S as u64).agents.is_empty());
        // Writing after a long pause clears the old slots.
        s.observe_at(
            t0 + 5 * WINDOW_S as u64,
            &call("a", Some("up"), "up.x", "ok", 1.0),
        );
        let snap = s.snapshot_at(t0 + 5 * WINDOW_S as u64);
        assert_eq!(
            snap.agents
                .iter()
                .find(|k| k.key == "a")
                .unwrap()
                .calls_total,
            1
        );
    }

    #[test]
    fn keys_are_capped_and_the_rest_folds_into_other_so_memory_is_bounded() {
        let s = Series::new();
        let t0 = 2_000_000;
        let long = "x".repeat(10_000);
        for i in 0..1_000 {
            let agent = format!("agent-{i}-{long}");
            let up = format!("up-{i}");
            let tool = format!("tool-{i}");
            s.observe_at(t0 + i % 5, &call(&agent, Some(&up), &tool, "timeout", 1.5));
            let mut exit = Record::event("upstream_exited");
            exit.upstream = Some(format!("exit-{i}").into());
            exit.reason = Some(long.as_str().into());
            s.observe_at(t0, &exit);
        }
        let (agents, upstreams, tools, errors) = s.keys();
        assert_eq!(agents, MAX_AGENTS + 1);
        assert_eq!(upstreams, MAX_UPSTREAMS + 1);
        assert_eq!(tools, MAX_TOOLS + 1);
        assert_eq!(errors, MAX_UPSTREAMS + 1);
        let snap = s.snapshot_at(t0 + 5);
        let other = snap.agents.iter().find(|k| k.key == OTHER).unwrap();
        assert_eq!(other.calls_total, 1_000 - MAX_AGENTS as u64);
        assert!(snap.agents.iter().all(|k| k.key.len() <= MAX_KEY_BYTES));
        assert!(snap
            .last_errors
            .values()
            .all(|e| e.reason.as_ref().is_none_or(|r| r.len() <= MAX_ERROR_BYTES)));
        assert_eq!(
            snap.agents.iter().map(|k| k.calls_total).sum::<u64>(),
            1_000
        );
        // Made-up tool names (refused with -32602) take no key of their own.
        let s2 = Series::new();
        for i in 0..100 {
            let tool = format!("made-up-{i}");
            let mut r = call("a", None, &tool, "denied", 0.1);
            r.error_code = Some(INVALID_PARAMS);
            s2.observe_at(t0, &r);
        }
        s2.observe_at(t0, &call("a", None, "real", "ok", 0.1));
        let tools: Vec<String> = s2
            .snapshot_at(t0)
            .tools
            .into_iter()
            .map(|t| t.tool)
            .collect();
        assert_eq!(tools, [UNKNOWN, "real"]);
        // The bound the caps give: under 1 MiB whatever the traffic.
        const { assert!(Series::max_bytes() < 1 << 20) };
    }

    #[test]
    fn latency_quantiles_come_from_sqrt2_buckets() {
        assert_eq!(bucket_of(0.0), 0);
        assert_eq!(bucket_of(0.01), 0);
        assert_eq!(bucket_of(0.02), 2);
        assert_eq!(bucket_of(1e12), BUCKETS - 1);
        for ms in [0.05, 0.3, 1.0, 7.5, 120.0, 9_000.0] {
            let b = bucket_of(ms);
            assert!(bucket_upper_ms(b) >= ms * 0.999_999, "{ms} in {b}");
            assert!(bucket_upper_ms(b) < ms * std::f64::consts::SQRT_2 * 1.000_001);
        }
        let s = Series::new();
        let t0 = 3_000_000;
        for i in 0..100 {
            let ms = if i < 98 { 1.0 } else { 100.0 };
            s.observe_at(t0, &call("a", None, "t", "ok", ms));
        }
        let snap = s.snapshot_at(t0);
        let t = &snap.tools[0];
        assert_eq!(t.calls, 100);
        let (p50, p99) = (t.p50_ms.unwrap(), t.p99_ms.unwrap());
        assert!((1.0..1.5).contains(&p50), "{p50}");
        assert!((100.0..142.0).contains(&p99), "{p99}");
        // Older than the latency window: gone.
        assert!(s
            .snapshot_at(t0 + 60 * LATENCY_MINUTES as u64)
            .tools
            .is_empty());
    }
}
