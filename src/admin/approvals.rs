//! The approvals of the admin API (issue 49 item 3): `GET /v1/approvals` (a long poll with
//! `?wait=N`, at most [`MAX_WAIT`]), `GET /v1/approvals/stream` (SSE: the pending list on every
//! change), `POST /v1/approvals/<id>` `{"decision": "approve"|"deny", "reason"?, "by"?}`.
//!
//! A wait holds a `watch` receiver and its connection, nothing else, and ends by [`MAX_WAIT`];
//! a stream ends after [`MAX_STREAM`] (the client reconnects) or when its client goes. Both end
//! when the gateway begins to stop, so neither holds up the daemon's shutdown.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::approval::{By, DecideError, Verdict};
use crate::gateway::Gateway;

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

fn bad_request(message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, message)
}

/// The longest a long poll waits.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// The longest one SSE stream lasts.
pub const MAX_STREAM: Duration = Duration::from_secs(3600);
/// An SSE comment this often keeps intermediaries from closing an idle stream.
const KEEPALIVE: Duration = Duration::from_secs(15);

fn listing(gw: &Gateway, version: u64) -> Value {
    json!({
        "version": version,
        "approvals": gw.hub().approvals().pending(),
    })
}

/// `GET /v1/approvals[?wait=N][&since=V]`: the pending approvals. With `wait`, waits up to N
/// seconds (at most 60) until there is one (or, with `since`, until the list's version is no
/// longer V), then answers.
pub(super) async fn list(gw: Gateway, q: Option<String>) -> Response {
    let mut wait = None;
    let mut since = None;
    let uri: Option<axum::http::Uri> = format!("/?{}", q.as_deref().unwrap_or("")).parse().ok();
    let pairs = uri
        .and_then(|u| axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&u).ok())
        .map(|q| q.0);
    let Some(pairs) = pairs else {
        return bad_request("the query is not a valid URL query");
    };
    for (k, v) in pairs {
        match k.as_str() {
            "wait" => match v.parse::<f64>() {
                Ok(s) if s >= 0.0 && s.is_finite() => {
                    wait = Some(Duration::from_secs_f64(s).min(MAX_WAIT))
                }
                _ => return bad_request("wait: must be a number of seconds (at most 60)"),
            },
            "since" => match v.parse::<u64>() {
                Ok(n) => since = Some(n),
                Err(_) => return bad_request("since: must be the version a listing gave"),
            },
            other => return bad_request(format!("{other}: unknown parameter (wait, since)")),
        }
    }
    let approvals = gw.hub().approvals();
    let mut rx = approvals.changed();
    let stopping = gw.stopping();
    if let Some(wait) = wait {
        let deadline = tokio::time::Instant::now() + wait;
        while !stopping.is_cancelled() {
            let v = *rx.borrow_and_update();
            let ready = match since {
                Some(s) => v != s,
                None => !approvals.is_empty(),
            };
            if ready {
                break;
            }
            tokio::select! {
                r = tokio::time::timeout_at(deadline, rx.changed()) => match r {
                    Ok(Ok(())) => {}
                    _ => break,
                },
                () = stopping.cancelled() => break,
            }
        }
    }
    let v = *rx.borrow();
    Json(listing(&gw, v)).into_response()
}

/// `GET /v1/approvals/stream`: an `approvals` event with the pending list at once and on every
/// change; keep-alive comments in between.
pub(super) fn stream(gw: Gateway) -> Response {
    let rx = gw.hub().approvals().changed();
    let end = tokio::time::Instant::now() + MAX_STREAM;
    let stop = gw.stopping();
    let events = futures::stream::unfold((gw, rx, true, stop), move |st| async move {
        let (gw, mut rx, first, stop) = st;
        if stop.is_cancelled() {
            return None;
        }
        if !first {
            tokio::select! {
                r = rx.changed() => r.ok()?,
                () = tokio::time::sleep(KEEPALIVE) => {
                    let frame = Bytes::from_static(b": keep-alive\n\n");
                    return Some((Ok::<_, std::convert::Infallible>(frame), (gw, rx, false, stop)));
                }
                () = tokio::time::sleep_until(end) => return None,
                () = stop.cancelled() => return None,
            }
        }
        let v = *rx.borrow_and_update();
        let data = listing(&gw, v).to_string();
        let frame = Bytes::from(format!("event: approvals\nid: {v}\ndata: {data}\n\n"));
        Some((Ok(frame), (gw, rx, false, stop)))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-store")
        .body(Body::from_stream(events))
        .unwrap_or_else(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "stream not started"))
}

/// `POST /v1/approvals/<id>`: the harness's (or an operator's) decision. 200 once the waiting
/// call has it; 400 for a bad body; 404 for an unknown id; 409 for one decided or ended
/// already, or one the MCP client's user is asked.
pub(super) fn decide(gw: &Gateway, id: &str, body: &[u8]) -> Response {
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return bad_request(format!("body is not JSON: {e}")),
    };
    let Value::Object(mut m) = v else {
        return bad_request("body must be a JSON object, e.g. {\"decision\": \"approve\"}");
    };
    let approve = match m.remove("decision").as_ref().and_then(Value::as_str) {
        Some("approve") => true,
        Some("deny") => false,
        _ => return bad_request("decision: must be \"approve\" or \"deny\""),
    };
    let reason = match m.remove("reason") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.len() <= 1024 => Some(s),
        Some(_) => return bad_request("reason: must be a string of at most 1024 bytes"),
    };
    let by = match m.remove("by").as_ref().map(Value::as_str) {
        None | Some(Some("harness")) => By::Harness,
        Some(Some("admin")) => By::Admin,
        Some(_) => return bad_request("by: must be \"harness\" or \"admin\""),
    };
    if let Some(k) = m.keys().next() {
        return bad_request(format!("{k}: unknown field (decision, reason, by)"));
    }
    let verdict = Verdict {
        approve,
        by,
        reason,
    };
    match gw.hub().approvals().decide(id, verdict) {
        Ok(()) => Json(json!({
            "id": id,
            "decision": if approve { "approve" } else { "deny" },
            "by": by.as_str(),
        }))
        .into_response(),
        Err(e @ DecideError::Unknown) => error(StatusCode::NOT_FOUND, e.to_string()),
        Err(e) => error(StatusCode::CONFLICT, e.to_string()),
    }
}
