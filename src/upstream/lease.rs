//! Upstream leases (the `io.gatehouse/lease` extension) and what a forwarded request's `_meta`
//! becomes. A lease id is minted by the gateway per (slot, registration) and is the only value
//! of `_meta["io.gatehouse/lease"]` an upstream ever sees from that registration; release sends
//! `notifications/io.gatehouse/lease_released`, bounded by [`RELEASE_TIMEOUT`].

use crate::sync::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{json, Map, Value};

use super::Connection;
use crate::registration::{random_b64, RegistrationState};
use crate::sync::lock;

/// `_meta` key carrying the lease id on every forwarded request.
pub use crate::protocol::meta::LEASE as LEASE_META_KEY;
/// Notification releasing a lease: `{"lease": id}`.
pub const LEASE_RELEASED_METHOD: &str = "notifications/io.gatehouse/lease_released";
/// Upper bound for releasing one registration's resources on one upstream.
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(3);

/// The leases open on one slot: registration id → lease id.
#[derive(Default)]
pub(super) struct Leases(Mutex<HashMap<String, String>>);

impl Leases {
    /// The registration holding `lease` on this slot, if any.
    pub fn registration_of(&self, lease: &str) -> Option<String> {
        lock(&self.0)
            .iter()
            .find(|(_, l)| l.as_str() == lease)
            .map(|(r, _)| r.clone())
    }

    /// The registration's lease on this slot, minted on first use.
    pub fn lease_for(&self, registration_id: &str) -> String {
        lock(&self.0)
            .entry(registration_id.to_string())
            .or_insert_with(|| format!("lease-{}", random_b64(16)))
            .clone()
    }

    /// The registration's lease on this slot, if it has one (never mints).
    pub fn get(&self, registration_id: &str) -> Option<String> {
        lock(&self.0).get(registration_id).cloned()
    }

    pub fn remove(&self, registration_id: &str) -> Option<String> {
        lock(&self.0).remove(registration_id)
    }

    pub fn len(&self) -> usize {
        lock(&self.0).len()
    }

    pub fn is_empty(&self) -> bool {
        lock(&self.0).is_empty()
    }
}

/// Tells the upstream a lease ended (bounded by [`RELEASE_TIMEOUT`]). `Err(why)` when it
/// could not be told: the connection must then leave the pool.
pub(super) async fn release(conn: &Connection, lease: &str) -> Result<(), &'static str> {
    let sent = tokio::time::timeout(
        RELEASE_TIMEOUT,
        conn.notify(LEASE_RELEASED_METHOD, json!({ "lease": lease })),
    )
    .await;
    match sent {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            tracing::warn!(upstream = %conn.upstream_id(), error = %e, "lease release failed: connection leaves the pool");
            Err("lease release failed")
        }
        Err(_) => {
            tracing::warn!(upstream = %conn.upstream_id(), "lease release timed out: connection leaves the pool");
            Err("lease release timed out")
        }
    }
}

/// Rewrites a request's `_meta` for the upstream, the same for tool calls and for proxied
/// resources/prompts requests: nothing that carries the caller's bearer token, however it is
/// wrapped ("Bearer <token>", nested objects, keys); no 2026-07-28 envelope; the registration's
/// `lease` (never the caller's) when the slot is leased; with tracing on, the gateway's own
/// CLIENT span context as `traceparent` (and `tracestate`, `baggage` only if configured) in
/// place of the caller's (host-owned, like the lease). With tracing off the caller's trace
/// keys pass as they came.
pub(super) fn upstream_meta(
    params: &mut Map<String, Value>,
    registration: &RegistrationState,
    lease: Option<String>,
    trace: Option<&crate::telemetry::TraceMeta>,
) {
    // Most requests have no `_meta` (looked for without hashing the key), and then, without a
    // lease, there is nothing to do.
    let present = crate::protocol::jsonrpc::member(params, crate::protocol::meta::META).is_some();
    if !present && lease.is_none() && trace.is_none() {
        return;
    }
    let mut meta = match params.remove(crate::protocol::meta::META) {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    meta.retain(|k, v| {
        !registration.token_in(v) && !registration.token_in(&Value::from(k.as_str()))
    });
    meta.remove(LEASE_META_KEY);
    strip_envelope(&mut meta);
    if let Some(lease) = lease {
        meta.insert(LEASE_META_KEY.into(), Value::String(lease));
    }
    if let Some(t) = trace {
        use crate::telemetry::{BAGGAGE, TRACEPARENT, TRACESTATE};
        meta.remove(TRACEPARENT);
        meta.remove(TRACESTATE);
        meta.remove(BAGGAGE);
        meta.insert(TRACEPARENT.into(), Value::String(t.traceparent.clone()));
        if let Some(s) = &t.tracestate {
            meta.insert(TRACESTATE.into(), Value::String(s.clone()));
        }
        if let Some(b) = &t.baggage {
            meta.insert(BAGGAGE.into(), Value::String(b.clone()));
        }
    }
    if !meta.is_empty() {
        params.insert(crate::protocol::meta::META.into(), Value::Object(meta));
    }
}

/// Drops the 2026-07-28 per-request envelope (`io.modelcontextprotocol/protocolVersion`,
/// `clientCapabilities`, …) from a forwarded `_meta`: it describes the client's request to the
/// gateway, not the gateway's connection to the upstream, and a handshake-era upstream rejects
/// requests that carry it.
pub fn strip_envelope(meta: &mut Map<String, Value>) {
    meta.retain(|k, _| !k.starts_with(crate::protocol::meta::RESERVED_PREFIX));
}
