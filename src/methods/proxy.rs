//! Resources, prompts and completions, proxied to upstreams.
//!
//! Design:
//! - A registration may use the resources and prompts of every upstream it holds at least one
//!   grant on (`<upstream>.*` or `<upstream>.<tool>`); never those of any other upstream.
//! - Prompts are namespaced like tools: `<upstream>.<prompt>`, or bare with the upstream's
//!   `bare_names`. Resources keep their URIs.
//! - An app's view (a `ui://` resource, MCP Apps) is listed and read only through a granted
//!   tool whose `_meta.ui.resourceUri` names it, from that tool's upstream; any other `ui://`
//!   URI answers -32602 (`protocol::apps`).
//! - `resources/read` (and `subscribe`/`unsubscribe`) go to the upstream that lists the URI (as
//!   a resource, or a template equal to it), else, with one resource upstream, to that one.
//!   `completion/complete` routes by its `ref`: a prompt name to its upstream (the name
//!   rewritten to the upstream's), a resource URI as above.
//! - Results and upstream errors pass through unchanged. These are not tool calls: they are not
//!   governed (no limits) nor written to the audit log; each is logged (`tracing`, info).
//! - Lists are concatenated over upstreams in grant order, in one page.
//! - Without a granted upstream that advertised the feature, the methods answer -32601.

use serde_json::{json, Map, Value};
use tokio_util::sync::CancellationToken;

use crate::methods::request::{RequestCtx, Served};
use crate::protocol::apps;
use crate::protocol::jsonrpc::{self, RpcError};
use crate::telemetry::{CallTrace, Target};

/// The request's SERVER span (tracing on): each upstream request gets a CLIENT span, its child.
type Trace<'a> = Option<&'a CallTrace>;

/// Upper bound of pages fetched from one upstream for one list.
const MAX_PAGES: usize = 100;

/// The upstreams this registration holds a grant on, in grant order.
pub fn granted_upstreams(ctx: &RequestCtx) -> Vec<String> {
    let pool = ctx.hub.pool();
    crate::registration::Grant::upstreams_of(&ctx.registration.grants, |up| pool.has_upstream(up))
        .into_iter()
        .map(str::to_string)
        .collect()
}

/// Granted upstreams whose server advertised capability `cap`, with that capability.
async fn upstreams_with(ctx: &RequestCtx, cap: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for id in granted_upstreams(ctx) {
        match ctx.hub.pool().catalog(&id).await {
            Ok(c) => {
                if let Some(v) = c.capabilities.get(cap).filter(|v| !v.is_null()) {
                    out.push((id, v.clone()));
                }
            }
            Err(e) => tracing::warn!(upstream = %id, error = %e, "upstream unavailable"),
        }
    }
    out
}

/// Whether a granted upstream accepts `resources/subscribe` (2026-07-28: through
/// `subscriptions/listen`).
pub async fn resources_subscribable(ctx: &RequestCtx) -> bool {
    upstreams_with(ctx, "resources")
        .await
        .iter()
        .any(|(_, c)| c.get("subscribe") == Some(&Value::Bool(true)))
}

/// The `capabilities` of each granted upstream's server (one catalog look-up each; an
/// unavailable upstream is logged and left out).
async fn granted_capabilities(ctx: &RequestCtx) -> Vec<Value> {
    let mut out = Vec::new();
    for id in granted_upstreams(ctx) {
        match ctx.hub.pool().catalog(&id).await {
            Ok(c) => out.push(c.capabilities.clone()),
            Err(e) => tracing::warn!(upstream = %id, error = %e, "upstream unavailable"),
        }
    }
    out
}

/// The server capabilities for this registration: tools and logging always; `resources`,
/// `prompts`, `completions` when a granted upstream advertised them; tasks and MCP Apps as
/// below. The granted upstreams' capabilities are read once.
pub async fn capabilities(ctx: &RequestCtx) -> Value {
    let mut caps = crate::protocol::server_capabilities();
    let granted = granted_capabilities(ctx).await;
    let with = |cap: &str| -> Vec<&Value> {
        granted
            .iter()
            .filter_map(|c| c.get(cap).filter(|v| !v.is_null()))
            .collect()
    };
    let resources = with("resources");
    if !resources.is_empty() {
        let subscribe = resources
            .iter()
            .any(|c| c.get("subscribe") == Some(&Value::Bool(true)));
        let mut r = Map::new();
        if subscribe && ctx.session.is_some() {
            r.insert("subscribe".into(), Value::Bool(true));
        }
        caps["resources"] = Value::Object(r);
    }
    // Tasks, when a granted upstream runs tool calls as tasks: the gateway owns them
    // (`mcp::tasks`). Sessions (the handshake era): the 2025-11-25 capability; stateless
    // 2026-07-28: the `io.modelcontextprotocol/tasks` extension.
    if with("tasks")
        .into_iter()
        .any(crate::tasks::wire::upstream_runs_tasks)
    {
        if ctx.session.is_some() {
            caps["tasks"] = crate::tasks::wire::capability();
        } else {
            let mut ext = Map::new();
            ext.insert(crate::tasks::wire::EXTENSION.into(), json!({}));
            caps["extensions"] = Value::Object(ext);
        }
    }
    // MCP Apps: the settings of the first granted upstream that declared the extension, else
    // the gateway's own when a granted tool carries a view (the SDK's example servers declare
    // nothing and put `_meta.ui` on their tools); not offered when no granted tool can show one.
    let apps = granted
        .iter()
        .find_map(apps::declared)
        .cloned()
        .or_else(|| {
            ctx.registration
                .tools
                .iter()
                .any(|t| apps::resource_uri(&t.descriptor).is_some())
                .then(apps::settings)
        });
    if let Some(settings) = apps {
        apps::declare(&mut caps, settings);
    }
    if !with("prompts").is_empty() {
        caps["prompts"] = json!({});
    }
    if !with("completions").is_empty() {
        caps["completions"] = json!({});
    }
    caps
}

/// The upstream whose granted tool has `uri` as its view (`ui://`), if one does: an app's view
/// is served only to registrations granted one of its tools.
fn granted_view(ctx: &RequestCtx, uri: &str) -> Option<String> {
    ctx.registration.tools.iter().find_map(|t| {
        let up = t.upstream()?;
        (apps::resource_uri(&t.descriptor) == Some(uri)).then(|| up.to_string())
    })
}

/// Whether a listed resource of `upstream` may be shown: anything but a `ui://` view, which
/// only when a granted tool of that upstream has it as its view.
fn listable(ctx: &RequestCtx, upstream: &str, item: &Value) -> bool {
    let key = if item.get("uriTemplate").is_some() {
        "uriTemplate"
    } else {
        "uri"
    };
    match item.get(key).and_then(Value::as_str) {
        Some(uri) if apps::is_ui(uri) => granted_view(ctx, uri).as_deref() == Some(upstream),
        _ => true,
    }
}

fn exposed_prompt(ctx: &RequestCtx, upstream: &str, prompt: &str) -> String {
    match ctx.hub.pool().upstream_config(upstream) {
        Some(c) if c.bare_names => prompt.to_string(),
        _ => format!("{upstream}.{prompt}"),
    }
}

/// One request to one upstream: the result, or the JSON-RPC reply to send instead; observed
/// in `mcp_client_operation_duration_seconds` (and a CLIENT span, with `trace`). A 2026-07-28
/// upstream's `input_required` answer (MRTR) to `prompts/get` or `resources/read` is asked of a
/// 2025-era session's client and the request retried with its answers, as a `tools/call`'s is
/// (`call::input`, the same bounds); a stateless 2026-07-28 client gets it as it is.
async fn call(
    asked: Asked<'_>,
    upstream: &str,
    method: &str,
    mut params: Map<String, Value>,
    target: Target<'_>,
) -> Result<Value, Value> {
    use crate::call::input;
    let Asked {
        ctx,
        id,
        cancel,
        trace,
        ..
    } = asked;
    let asks = matches!(method, "prompts/get" | "resources/read");
    let session = ctx.session.as_ref().filter(|_| asks);
    let session = session.filter(|_| ctx.hub.pool().is_modern(upstream));
    let mut rounds = 0;
    loop {
        let kept = session.map(|_| params.clone());
        let r = {
            let started = std::time::Instant::now();
            tracing::info!(
                registration = %ctx.registration.id,
                agent = %ctx.registration.agent_id,
                upstream,
                method,
                "proxied request"
            );
            use crate::upstream::{ForwardError, On, Request, TaskOwner, UpstreamError};
            let request = Request {
                owner: TaskOwner {
                    session: ctx.session.clone(),
                    notify: ctx.notify.clone(),
                },
                trace: trace.map(|t| (t, target)),
                ..Request::new(
                    &ctx.registration,
                    upstream,
                    method,
                    params,
                    cancel.clone(),
                    On::Current,
                )
            };
            let answered = match ctx.hub.pool().send(request).await {
                Ok(Some((_, answer))) => Ok(answer),
                // Never for `On::Current` (the live connection is the one asked).
                Ok(None) => Err(ForwardError::Upstream(UpstreamError::Closed(
                    "connection replaced".into(),
                ))),
                Err(e) => Err(e),
            };
            let error_type = match &answered {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => Some(RpcError::type_of(RpcError::code_of(e))),
                Err(crate::upstream::ForwardError::Cancelled) => Some("cancelled"),
                Err(crate::upstream::ForwardError::Upstream(
                    crate::upstream::UpstreamError::Timeout(_),
                )) => Some("timeout"),
                Err(_) => Some("_OTHER"),
            };
            if let Some(transport) = ctx.hub.pool().network_transport(upstream) {
                ctx.hub.metrics().observe_operation(
                    true,
                    crate::protocol::method_name(method),
                    error_type,
                    transport,
                    started.elapsed(),
                );
            }
            match answered {
                Ok(Ok(v)) => Ok(v),
                // The upstream's error as it came, but for members besides code, message and data.
                Ok(Err(e)) => Err(RpcError::from_peer(&e).bare().answer(id)),
                Err(why) => Err(RpcError::internal(format!(
                    "upstream {upstream:?} is unavailable: {why}"
                ))
                .answer(id)),
            }
        };
        let (Some(s), Some(mut retry)) = (session, kept) else {
            return r;
        };
        let Some(ask) = r.as_ref().ok().and_then(input::input_required_value) else {
            return r;
        };
        rounds += 1;
        if rounds > input::MAX_ROUNDS {
            return r;
        }
        let Some(answers) = Box::pin(input::answers(ctx, s, ask, cancel)).await else {
            return r;
        };
        retry.extend(answers);
        params = retry;
    }
}

/// Every item of `key` an upstream lists, following `nextCursor`.
async fn list_all(
    asked: Asked<'_>,
    upstream: &str,
    method: &str,
    key: &str,
) -> Result<Vec<Value>, Value> {
    let mut items = Vec::new();
    let mut cursor: Option<Value> = None;
    for _ in 0..MAX_PAGES {
        let mut params = Map::new();
        if let Some(c) = cursor.take() {
            params.insert("cursor".into(), c);
        }
        let mut r = call(asked, upstream, method, params, Target::None).await?;
        if let Some(Value::Array(page)) = r.get_mut(key).map(Value::take) {
            items.extend(page);
        }
        match r.get_mut("nextCursor").map(Value::take) {
            Some(c) if !c.is_null() => cursor = Some(c),
            _ => return Ok(items),
        }
    }
    Ok(items)
}

/// The upstream (and its own prompt name) behind an exposed prompt name.
async fn find_prompt(asked: Asked<'_>, name: &str) -> Result<Option<(String, String)>, Value> {
    for (up, _) in upstreams_with(asked.ctx, "prompts").await {
        for p in list_all(asked, &up, "prompts/list", "prompts").await? {
            if let Some(own) = p.get("name").and_then(Value::as_str) {
                if exposed_prompt(asked.ctx, &up, own) == name {
                    return Ok(Some((up, own.to_string())));
                }
            }
        }
    }
    Ok(None)
}

/// The upstream serving a resource URI.
async fn find_resource(asked: Asked<'_>, uri: &str) -> Result<Option<String>, Value> {
    let ups = upstreams_with(asked.ctx, "resources").await;
    for (up, _) in &ups {
        let listed = list_all(asked, up, "resources/list", "resources").await?;
        if listed
            .iter()
            .any(|r| r.get("uri").and_then(Value::as_str) == Some(uri))
        {
            return Ok(Some(up.clone()));
        }
        let templates =
            list_all(asked, up, "resources/templates/list", "resourceTemplates").await?;
        if templates
            .iter()
            .any(|t| t.get("uriTemplate").and_then(Value::as_str) == Some(uri))
        {
            return Ok(Some(up.clone()));
        }
    }
    Ok(match ups.as_slice() {
        [(only, _)] => Some(only.clone()),
        _ => None,
    })
}

fn params_obj(params: Option<Value>) -> Map<String, Value> {
    match params {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

/// Serves one of the proxied methods ([`crate::protocol::Method::is_proxied`]).
pub async fn handle(ctx: &RequestCtx, req: Served<'_>) -> Value {
    let params = params_obj(req.params);
    match serve(ctx, &req.id, req.method, params, &req.cancel, req.trace).await {
        Ok(v) => jsonrpc::success(req.id, v),
        Err(e) => e,
    }
}

/// One proxied request, as [`serve`] hands it to the method that serves it.
#[derive(Clone, Copy)]
struct Asked<'a> {
    ctx: &'a RequestCtx,
    id: &'a Value,
    method: &'a str,
    cancel: &'a CancellationToken,
    trace: Trace<'a>,
}

async fn serve(
    ctx: &RequestCtx,
    id: &Value,
    method: &str,
    mut params: Map<String, Value>,
    cancel: &CancellationToken,
    trace: Trace<'_>,
) -> Result<Value, Value> {
    let asked = Asked {
        ctx,
        id,
        method,
        cancel,
        trace,
    };
    // An app's view (`ui://`): only through a granted tool whose view it is, from that
    // tool's upstream; any other is unknown here (-32602, as 2026-07-28 answers a resource not
    // found), whether it exists or not.
    let view = match method {
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => params
            .get("uri")
            .and_then(Value::as_str)
            .filter(|u| apps::is_ui(u))
            .map(|u| (u.to_string(), granted_view(ctx, u))),
        _ => None,
    };
    if let Some((uri, up)) = view {
        let Some(up) = up else {
            return Err(
                RpcError::invalid_params(format!("Resource not found: {uri}"))
                    .to(id.clone())
                    .with_data(json!({ "uri": uri }))
                    .to_value(),
            );
        };
        if method == "resources/read" {
            let target = if ctx.registration.token_in(&Value::from(uri.as_str())) {
                Target::None
            } else {
                Target::Resource(&uri)
            };
            return call(asked, &up, method, params, target).await;
        }
    }
    // Without a granted upstream offering the feature, the method does not exist here.
    let needs: &[&str] = match method {
        m if m.starts_with("resources/") => &["resources"],
        m if m.starts_with("prompts/") => &["prompts"],
        _ => &["completions", "prompts", "resources"],
    };
    let mut offered = false;
    for cap in needs {
        offered = offered || !upstreams_with(ctx, cap).await.is_empty();
    }
    if !offered {
        return Err(RpcError::method_not_found(format!(
            "method not found: {method} (no granted upstream offers it)"
        ))
        .answer(id));
    }
    let (cap, key) = match method {
        "resources/list" => ("resources", "resources"),
        "resources/templates/list" => ("resources", "resourceTemplates"),
        "prompts/list" => ("prompts", "prompts"),
        _ => ("", ""),
    };
    if !cap.is_empty() {
        let mut all = Vec::new();
        for (up, _) in upstreams_with(ctx, cap).await {
            let items = list_all(asked, &up, method, key).await?;
            for mut item in items {
                if cap == "resources" && !listable(ctx, &up, &item) {
                    continue;
                }
                if method == "prompts/list" {
                    let own = item.get("name").and_then(Value::as_str).map(str::to_string);
                    if let (Some(own), Some(m)) = (own, item.as_object_mut()) {
                        m.insert("name".into(), json!(exposed_prompt(ctx, &up, &own)));
                    }
                }
                all.push(item);
            }
        }
        return Ok(json!({ key: all }));
    }
    match method {
        "prompts/get" => {
            let name = params
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let Some((up, own)) = find_prompt(asked, &name).await? else {
                return Err(RpcError::invalid_params(format!("Unknown prompt: {name}")).answer(id));
            };
            params.insert("name".into(), json!(own));
            call(asked, &up, method, params, Target::Prompt(&own)).await
        }
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => {
            serve_resource(asked, params).await
        }
        "completion/complete" => serve_completion(asked, params).await,
        _ => Err(RpcError::method_not_found(format!("method not found: {method}")).answer(id)),
    }
}

/// `resources/read`, `resources/subscribe`, `resources/unsubscribe`: to the upstream that lists
/// the URI (-32002 when none does); a session records what it subscribed to.
async fn serve_resource(asked: Asked<'_>, params: Map<String, Value>) -> Result<Value, Value> {
    let Asked {
        ctx, id, method, ..
    } = asked;
    let uri = params
        .get("uri")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let Some(up) = find_resource(asked, &uri).await? else {
        return Err(
            RpcError::resource_not_found(format!("Resource not found: {uri}"))
                .to(id.clone())
                .with_data(json!({ "uri": uri }))
                .to_value(),
        );
    };
    let target = Target::Resource(&uri);
    let target = if ctx.registration.token_in(&Value::from(uri.as_str())) {
        Target::None
    } else {
        target
    };
    // A 2026-07-28 HTTP upstream has no `resources/subscribe`: the URI is asked on its
    // `subscriptions/listen` stream (and stays asked; delivery follows the session's set).
    let watched = match method {
        "resources/subscribe" => ctx.hub.pool().watch_resource(&up, &uri),
        "resources/unsubscribe" => ctx.hub.pool().watch_resource(&up, &uri).map(|_| true),
        _ => None,
    };
    let r = match watched {
        Some(true) => Ok(json!({})),
        Some(false) => {
            Err(RpcError::internal("too many resource subscriptions on the upstream").answer(id))
        }
        None => call(asked, &up, method, params, target).await,
    };
    // The session hears `resources/updated` for what it subscribed to (and the
    // upstream accepted), and for nothing else.
    if let (Ok(_), Some(s)) = (&r, &ctx.session) {
        match method {
            "resources/subscribe" if !s.subscribe(&uri) => {
                tracing::warn!(session = %s.id, "too many resource subscriptions; not recorded");
            }
            "resources/unsubscribe" => s.unsubscribe(&uri),
            _ => {}
        }
    }
    r
}

/// `completion/complete`: to the upstream of the prompt or resource its `ref` names.
async fn serve_completion(
    asked: Asked<'_>,
    mut params: Map<String, Value>,
) -> Result<Value, Value> {
    let Asked { id, method, .. } = asked;
    let r#ref = params.get("ref").cloned().unwrap_or(Value::Null);
    let target = match r#ref.get("type").and_then(Value::as_str) {
        Some("ref/prompt") => {
            let name = r#ref
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            match find_prompt(asked, name).await? {
                Some((up, own)) => {
                    params.insert("ref".into(), json!({"type": "ref/prompt", "name": own}));
                    Some(up)
                }
                None => None,
            }
        }
        Some("ref/resource") => {
            let uri = r#ref.get("uri").and_then(Value::as_str).unwrap_or_default();
            find_resource(asked, uri).await?
        }
        _ => None,
    };
    let Some(up) = target else {
        return Err(RpcError::invalid_params(
            "completion/complete: ref names no prompt or resource of this registration",
        )
        .answer(id));
    };
    call(asked, &up, method, params, Target::None).await
}
