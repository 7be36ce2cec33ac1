//! Stateless 2026-07-28 requests on `/gw/<id>/mcp`: no session, the protocol version in
//! `_meta`, mirrored headers validated against the body, `server/discover`, `resultType` on
//! every result, cache fields on list results, and cancellation by closing the response.

use std::borrow::Cow;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{json, Map, Value};

use super::reply::{reply, resume, Mrtr, ReplyOpts};
use super::{header_str, json_response, Rejection, SESSION_NAME, VERSION_NAME};
use crate::hub::Hub;
use crate::methods::request::RequestCtx;
use crate::protocol::jsonrpc::{self, Message, RpcError};
use crate::protocol::{ALL_VERSIONS, LEGACY_VERSIONS, MODERN_VERSION};
use crate::registration::RegistrationState;
use crate::session::Transport;

pub use crate::protocol::meta::CLIENT_CAPABILITIES as META_CAPABILITIES;
pub use crate::protocol::meta::PROTOCOL_VERSION as META_VERSION;
pub use crate::protocol::meta::SERVER_INFO as META_SERVER_INFO;
/// How long a client may cache `server/discover` (its content is fixed per build).
const DISCOVER_TTL_MS: u64 = 60_000;
/// Lists change when an upstream's do, which a `subscriptions/listen` stream hears at once;
/// without one a client may reuse a list this long.
const LIST_TTL_MS: u64 = 60_000;
/// `resources/read`: a resource's content changes without a list change (only subscribed URIs
/// hear `resources/updated`), so it is not to be reused.
const READ_TTL_MS: u64 = 0;

/// Methods whose server requests travel as MRTR rounds (the spec allows no others).
const MRTR_METHODS: &[&str] = &["tools/call", "prompts/get", "resources/read"];

/// Methods served statelessly; anything else is 404 + -32601.
const METHODS: &[&str] = &[
    "server/discover",
    "subscriptions/listen",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    // The tasks extension's (`mcp::tasks`; `tasks/result` and `tasks/list` are gone in
    // 2026-07-28: -32601 here).
    "tasks/get",
    "tasks/update",
    "tasks/cancel",
];

/// A message's `_meta`, from its params.
fn meta(params: Option<&Value>) -> Option<&Map<String, Value>> {
    // Runs on every POST: `jsonrpc::member` (no hashing of the key).
    jsonrpc::member(params?.as_object()?, crate::protocol::meta::META)?.as_object()
}

/// Is this POST a stateless (2026-07-28) one? Its `_meta` names a protocol version, or it has
/// no session and its `MCP-Protocol-Version` header is not a handshake-era one. Takes the
/// message's method and params (as read, valid or not).
pub fn is_stateless(method: Option<&str>, params: Option<&Value>, headers: &HeaderMap) -> bool {
    is_stateless_with(
        method,
        params,
        headers.get(&SESSION_NAME),
        headers.get(&VERSION_NAME),
    )
}

/// [`is_stateless`] on the request's first `Mcp-Session-Id` and `MCP-Protocol-Version`
/// values, already found.
pub(crate) fn is_stateless_with(
    method: Option<&str>,
    params: Option<&Value>,
    session: Option<&HeaderValue>,
    version: Option<&HeaderValue>,
) -> bool {
    if meta(params).is_some_and(|m| m.contains_key(META_VERSION)) {
        return true;
    }
    let is_initialize = method == Some("initialize");
    session.is_none()
        && !is_initialize
        && version
            .and_then(|v| v.to_str().ok())
            .is_some_and(|h| !LEGACY_VERSIONS.contains(&h))
}

/// Decodes a mirrored header value (`=?base64?…?=` form included; a plain value is borrowed).
pub fn decode_header_value(raw: &str) -> Option<Cow<'_, str>> {
    if let Some(b64) = raw
        .strip_prefix("=?base64?")
        .and_then(|r| r.strip_suffix("?="))
    {
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
        return String::from_utf8(bytes).ok().map(Cow::Owned);
    }
    Some(Cow::Borrowed(raw))
}

/// The mirrored request headers (besides `MCP-Protocol-Version`).
static METHOD_NAME: HeaderName = HeaderName::from_static("mcp-method");
static NAME_NAME: HeaderName = HeaderName::from_static("mcp-name");

/// Checks one mirrored header against the body value (-32020 when absent or different).
fn mirror(headers: &HeaderMap, name: &HeaderName, expected: &str) -> Result<(), String> {
    let Some(v) = headers.get(name) else {
        return Err(format!("header mismatch: {name} is required"));
    };
    let decoded = std::str::from_utf8(v.as_bytes())
        .ok()
        .and_then(decode_header_value);
    if decoded.as_deref() == Some(expected) {
        Ok(())
    } else {
        Err(format!(
            "header mismatch: {name} does not match the request body"
        ))
    }
}

/// Handles one stateless message (or why it is not a valid one).
pub async fn handle(
    gw: Arc<Hub>,
    reg: Arc<RegistrationState>,
    headers: HeaderMap,
    msg: Result<Message, RpcError>,
) -> Result<Response, Rejection> {
    let plan = plan(&gw, &reg, &headers, msg)?;
    drop(headers);
    start(gw, reg, plan).await
}

/// The future of a [`Plan`]. The checks ([`plan`]) and this are plain functions, so that
/// `handle`'s future holds only the step it awaits (it is moved into the connection's boxed
/// request future: smaller is cheaper); the rare steps are boxed.
fn start(
    gw: Arc<Hub>,
    reg: Arc<RegistrationState>,
    plan: Plan,
) -> impl std::future::Future<Output = Result<Response, Rejection>> + Send + 'static {
    use futures::future::{Either, FutureExt};
    match plan {
        Plan::Reply(ctx, id, method, params, opts) => {
            let cancel = reg.cancel.child_token();
            Either::Left(reply(ctx, id, method, params, cancel, opts))
        }
        Plan::Answered(response) => Either::Right(std::future::ready(Ok(response)).boxed()),
        Plan::Listen(ctx, id, params) => Either::Right(listen(ctx, id, params).boxed()),
        Plan::Discover(ctx, id, method, params) => Either::Right(
            async move {
                // Observed as dispatched methods are (the metric; a SERVER span, tracing on).
                let began = crate::methods::dispatch::begin(&ctx, &id, &method, params.as_ref());
                drop(params);
                let reply = finish(jsonrpc::success(id, discover(&ctx).await), &method);
                began.end(&ctx, Some(&reply));
                Ok(json_response(StatusCode::OK, &reply))
            }
            .boxed(),
        ),
        Plan::Resume(id, held, opts) => Either::Right(resume(gw, reg, id, held, opts).boxed()),
    }
}

/// What a valid stateless message leads to (see [`plan`]).
enum Plan {
    Answered(Response),
    Listen(RequestCtx, Value, Option<Value>),
    Discover(RequestCtx, Value, String, Option<Value>),
    Resume(Value, crate::mrtr::Held, ReplyOpts),
    Reply(RequestCtx, Value, String, Option<Value>, ReplyOpts),
}

/// The checks of a stateless message, and what it leads to.
fn plan(
    gw: &Arc<Hub>,
    reg: &Arc<RegistrationState>,
    headers: &HeaderMap,
    msg: Result<Message, RpcError>,
) -> Result<Plan, Rejection> {
    let msg = msg.map_err(Rejection::malformed)?;
    let (id, method, params) = match msg {
        Message::Request { id, method, params } => (Some(id), method, params),
        Message::Notification { method, params } => (None, method, params),
        Message::Response { .. } => {
            return Err(Rejection::malformed(RpcError::invalid_request(
                "invalid request: 2026-07-28 clients do not send responses",
            )))
        }
    };
    let version = check_version(headers, &id, params.as_ref())?;
    check_mirrors(headers, &id, &method, params.as_ref(), &version)?;
    if id.is_some() && method == "tools/call" {
        check_params(headers, &id, &reg.tools, params.as_ref())?;
    }
    let Some(id) = id else {
        // Notifications carry nothing the gateway acts on statelessly (cancellation is
        // closing the response stream).
        return Ok(Plan::Answered(StatusCode::ACCEPTED.into_response()));
    };
    if !METHODS.contains(&method.as_str()) {
        return Err(Rejection::new(
            crate::refusals::Reason::BadRequest,
            StatusCode::NOT_FOUND,
            RpcError::method_not_found(format!("method not found: {method}")).to(id),
        ));
    }
    let ctx = super::door::request_ctx(gw, reg, None, Transport::Stateless, headers);
    if method == "subscriptions/listen" {
        return Ok(Plan::Listen(ctx, id, params));
    }
    if method == "server/discover" {
        return Ok(Plan::Discover(ctx, id, method, params));
    }
    let opts = ReplyOpts {
        priming: false,
        cancel_on_drop: true,
        method: method.clone(),
        finish: Some(finish as fn(Value, &str) -> Value),
        mrtr: MRTR_METHODS.contains(&method.as_str()).then(|| Mrtr {
            declared: crate::protocol::ClientCapability::bits_of(
                meta(params.as_ref()).and_then(|m| m.get(META_CAPABILITIES)),
            ),
        }),
    };
    let retry = opts
        .mrtr
        .is_some()
        .then(|| params.as_ref().and_then(|p| p.get("requestState")))
        .flatten();
    if let Some(state) = retry {
        // An MRTR retry: it continues the held call; it is not forwarded again.
        return resume_retry(gw, reg, id, state, params.as_ref(), opts);
    }
    Ok(Plan::Reply(ctx, id, method, params, opts))
}

/// The protocol version in `_meta` (the header's when `_meta` has none and it is not this
/// one: -32022), and for a request the declared capabilities (-32602 without them).
fn check_version(
    headers: &HeaderMap,
    id: &Option<Value>,
    params: Option<&Value>,
) -> Result<String, Rejection> {
    let meta_version = meta(params)
        .and_then(|m| m.get(META_VERSION))
        .and_then(Value::as_str)
        .map(str::to_string);
    let has_caps = meta(params)
        .and_then(|m| m.get(META_CAPABILITIES))
        .is_some_and(Value::is_object);
    let unsupported = |requested: &str| {
        Rejection::malformed(
            RpcError::unsupported_version(format!("unsupported protocol version: {requested}"))
                .with_id(id.clone())
                .with_data(json!({"supported": ALL_VERSIONS, "requested": requested})),
        )
    };
    let Some(version) = meta_version else {
        if let Some(h) = header_str(headers, &VERSION_NAME) {
            if h != MODERN_VERSION {
                return Err(unsupported(h));
            }
        }
        return Err(Rejection::malformed(
            RpcError::invalid_params(format!(
                "invalid params: _meta[\"{META_VERSION}\"] is required"
            ))
            .with_id(id.clone()),
        ));
    };
    if version != MODERN_VERSION {
        return Err(unsupported(&version));
    }
    if id.is_some() && !has_caps {
        return Err(Rejection::malformed(
            RpcError::invalid_params(format!(
                "invalid params: _meta[\"{META_CAPABILITIES}\"] is required"
            ))
            .with_id(id.clone()),
        ));
    }
    Ok(version)
}

/// The mirrored headers, in order (-32020 on the first that is absent or differs): the
/// version always; for requests the method, and the name (or URI) for the methods that have
/// one.
fn check_mirrors(
    headers: &HeaderMap,
    id: &Option<Value>,
    method: &str,
    params: Option<&Value>,
    version: &str,
) -> Result<(), Rejection> {
    let name_field = match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        // `Mcp-Name` carries the task id (SEP-2663): a mismatch is -32020; absent, it is
        // not required (SEP-2243 requires it of `tools/call`, `resources/read` and
        // `prompts/get` only, and fastmcp-tasks 4.1's client sends none on `tasks/*`).
        "tasks/get" | "tasks/update" | "tasks/cancel" if headers.contains_key(&NAME_NAME) => {
            Some("taskId")
        }
        _ => None,
    };
    let name = name_field.map(|field| {
        params
            .and_then(|p| p.get(field))
            .and_then(Value::as_str)
            .unwrap_or_default()
    });
    let is_request = id.is_some();
    let checks = [
        (&VERSION_NAME, Some(version)),
        (&METHOD_NAME, is_request.then_some(method)),
        (&NAME_NAME, name.filter(|_| is_request)),
    ];
    for (h, expected) in checks.iter().filter_map(|(h, e)| e.map(|e| (*h, e))) {
        if let Err(m) = mirror(headers, h, expected) {
            return Err(Rejection::malformed(
                RpcError::header_mismatch(m).with_id(id.clone()),
            ));
        }
    }
    Ok(())
}

/// `Mcp-Param-*` (SEP-2243): a granted tool's `x-mcp-header` arguments against their headers
/// (-32020 when one is missing, differs or is badly encoded). A tool without annotations
/// costs one `is_empty` (`ToolSet::param_headers`).
fn check_params(
    headers: &HeaderMap,
    id: &Option<Value>,
    tools: &crate::tools::ToolSet,
    params: Option<&Value>,
) -> Result<(), Rejection> {
    use crate::protocol::param_header::{check, Received};
    let Some(name) = params.and_then(|p| p.get("name")).and_then(Value::as_str) else {
        return Ok(());
    };
    let Some(annotated) = tools.param_headers(name) else {
        return Ok(());
    };
    let arguments = params.and_then(|p| p.get("arguments"));
    check(annotated, arguments, |h| {
        let mut all = headers.get_all(h).iter();
        match (all.next(), all.next()) {
            (None, _) => Received::None,
            (Some(v), None) => Received::One(v.as_bytes()),
            _ => Received::Many,
        }
    })
    .map_err(|m| Rejection::malformed(RpcError::header_mismatch(m).with_id(id.clone())))
}

/// An MRTR retry (`requestState`): the held call it continues, its server requests answered
/// from the retry's `inputResponses` (a missing one refused on the gateway's behalf).
fn resume_retry(
    gw: &Arc<Hub>,
    reg: &Arc<RegistrationState>,
    id: Value,
    state: &Value,
    params: Option<&Value>,
    opts: ReplyOpts,
) -> Result<Plan, Rejection> {
    let Some(state) = state.as_str() else {
        return Err(Rejection::malformed(
            RpcError::invalid_params(
                "invalid params: requestState must be the string this gateway issued",
            )
            .to(id),
        ));
    };
    let mut held = match gw.held().resume(&reg.id, state) {
        Ok(h) => h,
        Err(e) => {
            return Err(Rejection::malformed(
                RpcError::invalid_params(format!("invalid params: {e}")).to(id),
            ))
        }
    };
    // A retry answering an approval must be the very call approved (issue 49).
    for asked in &held.asked {
        if let Err(why) = crate::call::check_retry(gw, reg, asked, params) {
            drop(held);
            return Err(Rejection::malformed(
                RpcError::invalid_params(format!("invalid params: {why}")).to(id),
            ));
        }
    }
    let responses = params
        .and_then(|p| p.get("inputResponses"))
        .and_then(Value::as_object);
    for asked in std::mem::take(&mut held.asked) {
        let body = match responses.and_then(|r| r.get(&asked)) {
            Some(r) => json!({ "result": r }),
            None => crate::hub::refusal_body(&format!(
                "the client's retry carried no inputResponses[{asked:?}]"
            )),
        };
        gw.pool().client_response(
            &reg.id,
            crate::upstream::STATELESS_SESSION,
            &Value::String(asked),
            &body,
        );
    }
    Ok(Plan::Resume(id, held, opts))
}

/// A `subscriptions/listen` list of strings (`key`; absent or null: none), at most
/// `listen::MAX_URIS` of them; what is wrong with it otherwise.
fn string_list(wanted: &Map<String, Value>, key: &str, what: &str) -> Result<Vec<String>, String> {
    match wanted.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) if a.len() <= crate::listen::MAX_URIS => a
            .iter()
            .map(|u| u.as_str().map(str::to_owned))
            .collect::<Option<Vec<String>>>()
            .ok_or_else(|| format!("{key} must be strings")),
        Some(Value::Array(_)) => Err(format!(
            "at most {} {key} per stream",
            crate::listen::MAX_URIS
        )),
        Some(_) => Err(format!("{key} must be an array of {what}")),
    }
}

/// `subscriptions/listen`: acknowledges the honored subset, then streams the registration's
/// list changes and updates of the subscribed resources until the client closes the stream
/// (or the registration ends: then a final `complete` result).
async fn listen(ctx: RequestCtx, id: Value, params: Option<Value>) -> Result<Response, Rejection> {
    let bad = |msg: &str| {
        Rejection::malformed(
            RpcError::invalid_params(format!("invalid params: {msg}")).to(id.clone()),
        )
    };
    let Some(wanted) = params
        .as_ref()
        .and_then(|p| p.get("notifications"))
        .and_then(Value::as_object)
    else {
        return Err(bad("params.notifications (an object) is required"));
    };
    let flag = |k: &str| wanted.get(k).and_then(Value::as_bool).unwrap_or(false);
    let uris = string_list(wanted, "resourceSubscriptions", "URIs").map_err(|m| bad(&m))?;
    // A URI is honored once the upstream that lists it accepted `resources/subscribe`.
    let cancel = ctx.registration.cancel.child_token();
    let mut honored_uris = Vec::new();
    for uri in uris {
        let req = crate::methods::request::Served {
            id: id.clone(),
            method: "resources/subscribe",
            params: Some(json!({ "uri": uri })),
            cancel: cancel.clone(),
            trace: None,
        };
        let r = crate::methods::proxy::handle(&ctx, req).await;
        if r.get("result").is_some() {
            honored_uris.push(uri);
        } else {
            tracing::debug!(registration = %ctx.registration.id, uri, "listen: resource subscription not accepted upstream");
        }
    }
    // Task ids: honored when the request declared the tasks extension, and only the
    // registration's own (another's id and an unknown one alike are left out).
    let task_ids = string_list(wanted, "taskIds", "task ids").map_err(|m| bad(&m))?;
    let declared = crate::tasks::wire::declares_tasks(params.as_ref());
    let honored_tasks: Vec<String> = task_ids
        .into_iter()
        .filter(|t| {
            declared
                && ctx
                    .hub
                    .tasks()
                    .get(&ctx.registration.id, t)
                    .is_some_and(|task| !task.spec.internal)
        })
        .collect();
    let filter = crate::listen::Filter {
        tools: flag("toolsListChanged"),
        prompts: flag("promptsListChanged"),
        resources: flag("resourcesListChanged"),
        uris: honored_uris.iter().cloned().collect(),
        task_ids: honored_tasks.iter().cloned().collect(),
    };
    let mut honored = Map::new();
    for (k, on) in [
        ("toolsListChanged", filter.tools),
        ("promptsListChanged", filter.prompts),
        ("resourcesListChanged", filter.resources),
    ] {
        if on {
            honored.insert(k.into(), Value::Bool(true));
        }
    }
    if wanted.contains_key("resourceSubscriptions") {
        honored.insert("resourceSubscriptions".into(), json!(honored_uris));
    }
    if wanted.contains_key("taskIds") {
        honored.insert("taskIds".into(), json!(honored_tasks));
    }
    let hub = ctx.hub.clone();
    let registration = ctx.registration.clone();
    drop(ctx);
    let Some((key, rx)) = hub.listeners().add(&registration.id, id.clone(), filter) else {
        return Err(Rejection::new(crate::refusals::Reason::RateLimited, StatusCode::TOO_MANY_REQUESTS, RpcError::busy(format!(
                "too many subscriptions/listen streams for this registration (at most {}): close one first",
                crate::listen::MAX_LISTENERS_PER_REGISTRATION
            )).to(id)));
    };
    let ack = jsonrpc::notification(
        "notifications/subscriptions/acknowledged",
        Some(json!({"notifications": honored, "_meta": {crate::listen::SUBSCRIPTION_ID: id}})),
    );
    let period = std::time::Duration::from_secs(hub.config().keepalive_s.max(1));
    let st = ListenStream {
        first: Some(super::event_stream::sse_json("message", &ack)),
        rx: Some(rx),
        ticker: tokio::time::interval_at(tokio::time::Instant::now() + period, period),
        stop: registration.cancel.token(),
        id,
        _guard: ListenGuard {
            hub,
            registration_id: registration.id.clone(),
            key,
        },
    };
    Ok(super::event_stream::response(
        axum::body::Body::from_stream(futures::stream::unfold(st, next_listen_event)),
    ))
}

/// Removes the stream from the hub's table when the response goes away.
struct ListenGuard {
    hub: Arc<Hub>,
    registration_id: String,
    key: u64,
}

impl Drop for ListenGuard {
    fn drop(&mut self) {
        self.hub.listeners().remove(&self.registration_id, self.key);
    }
}

struct ListenStream {
    first: Option<bytes::Bytes>,
    rx: Option<tokio::sync::mpsc::Receiver<Value>>,
    ticker: tokio::time::Interval,
    stop: tokio_util::sync::CancellationToken,
    id: Value,
    _guard: ListenGuard,
}

async fn next_listen_event(
    mut st: ListenStream,
) -> Option<(Result<bytes::Bytes, std::convert::Infallible>, ListenStream)> {
    if let Some(b) = st.first.take() {
        return Some((Ok(b), st));
    }
    let rx = st.rx.as_mut()?;
    tokio::select! {
        biased;
        () = st.stop.cancelled() => {
            // The registration ended: a graceful end of the subscription.
            st.rx = None;
            let done = jsonrpc::success(
                st.id.clone(),
                json!({"resultType": "complete", "_meta": {crate::listen::SUBSCRIPTION_ID: st.id}}),
            );
            let b = super::event_stream::sse_json("message", &done);
            Some((Ok(b), st))
        }
        m = rx.recv() => {
            let m = m?;
            let b = super::event_stream::sse_json("message", &m);
            Some((Ok(b), st))
        }
        _ = st.ticker.tick() => Some((Ok(bytes::Bytes::from_static(super::event_stream::KEEPALIVE)), st)),
    }
}

/// The `server/discover` result.
async fn discover(ctx: &RequestCtx) -> Value {
    // List changes (and resource updates, where an upstream takes subscriptions) are heard on
    // `subscriptions/listen`; no `logging/setLevel` statelessly.
    let mut caps = crate::methods::proxy::capabilities(ctx).await;
    caps["tools"] = json!({"listChanged": true});
    if caps.get("prompts").is_some() {
        caps["prompts"] = json!({"listChanged": true});
    }
    if caps.get("resources").is_some() {
        let subscribe = crate::methods::proxy::resources_subscribable(ctx).await;
        caps["resources"] = json!({"listChanged": true, "subscribe": subscribe});
    }
    if let Some(m) = caps.as_object_mut() {
        m.remove("logging");
    }
    json!({
        "supportedVersions": ALL_VERSIONS,
        "capabilities": caps,
        "serverInfo": crate::protocol::server_info(),
        "instructions": format!("Tools granted to agent {}.", ctx.registration.agent_id),
    })
}

/// Completes a 2026-07-28 result: `resultType`, server info, and cache fields on lists.
fn finish(mut reply: Value, method: &str) -> Value {
    if let Some(Value::Object(r)) = reply.get_mut("result") {
        r.entry("resultType").or_insert_with(|| json!("complete"));
        let meta = r
            .entry(crate::protocol::meta::META)
            .or_insert_with(|| json!({}));
        if let Value::Object(m) = meta {
            m.entry(META_SERVER_INFO)
                .or_insert_with(crate::protocol::server_info);
        }
        let ttl = match method {
            "server/discover" => Some(DISCOVER_TTL_MS),
            m if m.ends_with("/list") => Some(LIST_TTL_MS),
            "resources/read" => Some(READ_TTL_MS),
            _ => None,
        };
        if let Some(ttl) = ttl {
            r.insert("ttlMs".into(), json!(ttl));
            r.insert("cacheScope".into(), json!("private"));
        }
    }
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_base64_header_values() {
        assert_eq!(
            decode_header_value("tools/call").as_deref(),
            Some("tools/call")
        );
        assert_eq!(
            decode_header_value("=?base64?aMOpbGxv?=").as_deref(),
            Some("héllo")
        );
        assert_eq!(decode_header_value("=?base64?!!?="), None);
    }

    #[test]
    fn results_carry_result_type_and_cache_fields() {
        let r = finish(
            jsonrpc::success(json!(1), json!({"tools": []})),
            "tools/list",
        );
        assert_eq!(r["result"]["resultType"], "complete");
        assert_eq!(r["result"]["cacheScope"], "private");
        assert!(r["result"]["ttlMs"].is_u64());
        let r = finish(
            jsonrpc::success(json!(1), json!({"content": []})),
            "tools/call",
        );
        assert_eq!(r["result"]["resultType"], "complete");
        assert!(r["result"].get("ttlMs").is_none());
    }
}
