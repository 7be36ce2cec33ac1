//! A 2026-07-28 upstream answers a plain `tools/call` (or `prompts/get`, `resources/read`:
//! `methods::proxy`) `input_required` (MRTR: `inputRequests`,
//! `requestState`) and the client is a 2025-era session, which knows nothing of it: each input
//! request is sent to the session as the request it is (`elicitation/create`,
//! `sampling/createMessage`, `roots/list`), the answers are collected, and the call is retried
//! upstream with the original params plus `inputResponses` and the exact `requestState`. A
//! stateless 2026-07-28 client gets the answer as it is (it retries itself).
//!
//! Bounds: each answer is waited for at most [`ANSWER_WITHIN`]; at most [`MAX_ROUNDS`]
//! retries. An elicitation the client cannot or did not answer is sent back `decline`; any
//! other unanswered request ends the translation (the client gets the upstream's answer).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use crate::methods::request::RequestCtx;
use crate::protocol::ClientCapability;
use crate::session::Session;
use crate::upstream::RawResult;

/// How long one input request waits for the client's answer.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(60);
/// Retries of one call, each after a round of answers.
pub const MAX_ROUNDS: usize = 8;

/// The upstream's `input_required` answer, read (None: any other answer).
pub(super) fn input_required(raw: &RawResult) -> Option<Map<String, Value>> {
    if !raw.get().contains("input_required") {
        return None;
    }
    let v: Map<String, Value> = serde_json::from_str(raw.get()).ok()?;
    (v.get("resultType").and_then(Value::as_str) == Some("input_required")).then_some(v)
}

/// The same, of an answer already parsed.
pub(crate) fn input_required_value(v: &Value) -> Option<&Map<String, Value>> {
    let m = v.as_object()?;
    (m.get("resultType").and_then(Value::as_str) == Some("input_required")).then_some(m)
}

/// The answers of `session`'s client to `asked`'s `inputRequests`, with its `requestState`,
/// as the retry's params carry them (None: one could not be answered).
pub(crate) async fn answers(
    ctx: &RequestCtx,
    session: &Arc<Session>,
    asked: &Map<String, Value>,
    cancel: &CancellationToken,
) -> Option<Map<String, Value>> {
    let mut responses = Map::new();
    let requests = asked.get("inputRequests").and_then(Value::as_object);
    for (key, request) in requests.into_iter().flatten() {
        let method = request
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let params = request
            .get("params")
            .cloned()
            .filter(Value::is_object)
            .unwrap_or_else(|| Value::Object(Map::new()));
        let answer = match ClientCapability::for_method(method) {
            Some(cap) if session.declares(cap) => ask(ctx, session, method, params, cancel).await?,
            _ => None,
        };
        let response = match answer {
            Some(r) => r,
            None if method == "elicitation/create" => serde_json::json!({"action": "decline"}),
            None => {
                tracing::info!(
                    method,
                    "a 2026 upstream's input request could not be asked of its 2025 client"
                );
                return None;
            }
        };
        responses.insert(key.clone(), response);
    }
    let mut retry = Map::new();
    retry.insert("inputResponses".into(), Value::Object(responses));
    if let Some(state) = asked.get("requestState") {
        retry.insert("requestState".into(), state.clone());
    }
    Some(retry)
}

/// One request to the session's client: Some(its result, None when refused or unanswered in
/// time), or None when the call was cancelled.
async fn ask(
    ctx: &RequestCtx,
    session: &Arc<Session>,
    method: &str,
    params: Value,
    cancel: &CancellationToken,
) -> Option<Option<Value>> {
    let Some(rx) = ctx
        .hub
        .pool()
        .ask_session(session, method, params, &*ctx.hub)
        .await
    else {
        return Some(None);
    };
    tokio::select! {
        r = tokio::time::timeout(ANSWER_WITHIN, rx) => Some(match r {
            Ok(Ok(Ok(result))) => Some(result),
            _ => None,
        }),
        () = cancel.cancelled() => None,
    }
}
