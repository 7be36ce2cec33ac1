//! The operator console (issue 29): a page on the admin listener (`/ui`, static files
//! embedded in the binary) and the two admin calls it polls, `GET /v1/console/stats` and
//! `GET /v1/audit`. The page is public (a login shell); every data call needs the admin token,
//! which `admin` checks before these handlers run.
//!
//! Invariant: nothing here returns a token or a tool argument: registrations are described
//! field by field, audit records lose `arguments` in `audit::tail`.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::audit::tail::tail;
use crate::gateway::Gateway;

mod assets;
mod query;

pub use assets::routes;
use query::AuditQuery;

/// At most this many registrations are described per poll (newest first); the total is
/// given beside them, so a page over 1,000 registrations stays one small answer.
pub const MAX_REGISTRATION_ROWS: usize = 200;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The body of `GET /v1/console/stats`. `upstreams` is the admin API's `GET /v1/upstreams`
/// answer, to which each upstream's last error (from the series) is added.
pub fn stats(gw: &Gateway, upstreams: Value) -> Value {
    let now_ms = unix_ms();
    let all = gw.registry().all();
    let total = all.len();
    let registrations: Vec<Value> = all
        .iter()
        .rev()
        .take(MAX_REGISTRATION_ROWS)
        .map(|r| {
            let expires = r.expires_at_ms();
            json!({
                "id": r.id,
                "agent_id": &*r.agent_id,
                "label": r.label,
                "created_at": r.created_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                "ttl_s": r.ttl_s,
                "ttl_left_s": (expires != 0).then(|| expires.saturating_sub(now_ms) / 1000),
                "sessions": gw.sessions().count_for(&r.id),
                "calls_started": r.budget().started(),
                "calls_in_flight": r.budget().in_flight(),
                "parent": r.family.parent.as_ref().map(|p| p.id.as_str()),
            })
        })
        .collect();
    let series = gw.audit().series().map(|s| s.snapshot());
    let mut upstreams = upstreams;
    if let (Value::Array(rows), Some(snap)) = (&mut upstreams, &series) {
        for row in rows.iter_mut() {
            let id = row.get("id").and_then(Value::as_str).unwrap_or_default();
            let last = snap.last_errors.get(id).cloned();
            if let Value::Object(m) = row {
                m.insert("last_error".into(), json!(last));
            }
        }
    }
    json!({
        "now_ms": now_ms,
        "registrations_total": total,
        "registrations": registrations,
        "series": series,
        "refusals": gw.hub().refusals().series(),
        "upstreams": upstreams,
        "audit": {
            "healthy": gw.audit().is_healthy(),
            "queue_depth": gw.audit().queue_depth(),
        },
    })
}

fn bad_request(message: String) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "error": message }))).into_response()
}

/// `GET /v1/audit?…`: the newest records of the audit chain (filtered, bounded) and the check
/// of the window read. The file is read on a blocking thread.
pub async fn audit(gw: &Gateway, raw_query: Option<&str>) -> Response {
    let q = match AuditQuery::parse(raw_query.unwrap_or("")) {
        Ok(q) => q,
        Err(msg) => return bad_request(msg),
    };
    let path = gw.audit().path().to_path_buf();
    let read = tokio::task::spawn_blocking(move || {
        tail(&path, &q.filter, q.limit, q.max_bytes).map(|t| (t, q))
    })
    .await;
    match read {
        Ok(Ok((t, q))) => {
            return Json(json!({
                "records": t.records,
                "verify": t.check,
                "limit": q.limit,
                "max_bytes": q.max_bytes,
            }))
            .into_response()
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "audit tail not read"),
        Err(e) => tracing::error!(error = %e, "audit tail task failed"),
    }
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(json!({"error": "the audit log could not be read"})),
    )
        .into_response()
}
