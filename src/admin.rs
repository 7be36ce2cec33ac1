//! The admin API of the daemon (DESIGN.md §4): its own axum router on the admin listener,
//! behind a bearer admin token compared in constant time. Grants are plain strings handed
//! to `Gateway::register`; every release goes through `Gateway::release_id`.
//!
//! Invariant: no response of this API ever carries a registration token except the 201 of
//! the create call that minted it; the admin token is never logged.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, RawQuery, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::gateway::{Gateway, GatewayError, ReleaseReason};
use crate::hub::Hub;
use crate::metrics::Snapshot;
use crate::refusals::{AuthFailure, Listener, Reason, Refused};
use crate::registration::RegistrationSpec;

mod approvals;

/// Where the admin token came from (printed at start; the token itself never is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `GATEHOUSE_ADMIN_TOKEN`.
    Env,
    /// Generated and written, owner-only, to this file.
    File(PathBuf),
}

/// Why the admin API could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("cannot write the admin token file {path}: {source}")]
    TokenFile {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot bind the admin listener {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
}

/// The admin token: `GATEHOUSE_ADMIN_TOKEN` if set, else a fresh 256-bit token written to
/// `config.admin_token_file` with mode 0600 (replacing any previous file).
pub fn admin_token(config: &Config) -> Result<(String, TokenSource), AdminError> {
    if let Some(t) = std::env::var("GATEHOUSE_ADMIN_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty())
    {
        return Ok((t.trim().to_string(), TokenSource::Env));
    }
    let token = crate::registration::new_token();
    write_owner_only(&config.admin_token_file, &token).map_err(|source| AdminError::TokenFile {
        path: config.admin_token_file.display().to_string(),
        source,
    })?;
    Ok((token, TokenSource::File(config.admin_token_file.clone())))
}

/// Writes `text` to `path` readable by its owner only: a new file created 0600 beside it,
/// then renamed over the old one, so the token is never readable by others, even briefly.
fn write_owner_only(path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(text.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[derive(Clone)]
struct AdminState {
    gw: Gateway,
    token_digest: Arc<[u8; 32]>,
}

/// The admin router. Every route needs `Authorization: Bearer <admin token>`, except the
/// operator console's page and its static files (`/ui`, a login shell holding no data). Building
/// it turns on the console's live series (`Audit::enable_series`): only the daemon pays for them.
pub fn router(gw: Gateway, admin_token: &str) -> AdminApp {
    gw.audit().enable_series();
    let hub = gw.hub().clone();
    let state = AdminState {
        gw,
        token_digest: Arc::new(Sha256::digest(admin_token.as_bytes()).into()),
    };
    let router = Router::new()
        .route("/v1/registrations", post(create).get(list))
        .route(
            "/v1/registrations/{id}",
            axum::routing::delete(delete).get(show),
        )
        .route("/v1/registrations/{id}/renew", post(renew))
        .route(
            "/v1/registrations/{id}/credentials",
            axum::routing::put(credentials),
        )
        .route("/v1/registrations/{id}/probe", post(probe))
        .route("/v1/upstreams", get(upstreams))
        .route("/v1/reload", post(reload))
        .route("/metrics", get(metrics))
        .route("/v1/console/stats", get(console_stats))
        .route("/v1/audit", get(audit_tail))
        .route("/v1/approvals", get(approvals_list))
        .route("/v1/approvals/stream", get(approvals_stream))
        .route("/v1/approvals/{id}", post(approvals_decide))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "not found") })
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth))
        .merge(crate::console::routes().layer(axum::middleware::from_fn(strict)))
        .with_state(state);
    AdminApp { router, hub }
}

/// The admin API's router and the gateway whose refusal counters and audit see its refusals.
pub struct AdminApp {
    router: Router,
    hub: Arc<Hub>,
}

/// Binds the admin listener (before anything is served, so a bad address fails early).
pub async fn bind(addr: &str) -> Result<TcpListener, AdminError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError::Bind {
            addr: addr.to_string(),
            source,
        })
}

/// Serves the admin API until `stop` fires, with the default connection bounds.
pub async fn serve(listener: TcpListener, router: AdminApp, stop: CancellationToken) {
    let limits = crate::connections::Limits::admin(&Default::default());
    serve_with(listener, router, stop, limits).await;
}

/// Serves the admin API until `stop` fires, with these connection bounds (the daemon's:
/// `connections::Limits::admin` of its config).
pub async fn serve_with(
    listener: TcpListener,
    app: AdminApp,
    stop: CancellationToken,
    limits: crate::connections::Limits,
) {
    let AdminApp { router, hub } = app;
    let service = hyper_util::service::TowerToHyperService::new(router);
    crate::server::serve_http1(listener, service, stop, (hub, Listener::Admin), limits).await;
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

/// 404 for an id that is not a live registration, marked (for the refusal counters) as
/// released lately or unknown.
fn no_such_registration(gw: &Gateway, id: &str) -> Response {
    let mut r = error(StatusCode::NOT_FOUND, "no such registration");
    let reason = Reason::missing_registration(gw.registry(), id);
    r.extensions_mut().insert(Refused::new(reason).about(id));
    r
}

/// `POST /v1/reload`: the config file read and validated again (400 with the reason if it
/// is refused; the running config stays either way for what cannot change live).
async fn reload(State(st): State<AdminState>) -> Response {
    match st.gw.reload_config().await {
        Ok(r) => Json(json!({
            "reloaded": true,
            "digest": r.digest,
            "applied": r.applied,
            "needs_restart": r.needs_restart,
        }))
        .into_response(),
        Err(why) => bad_request(format!("config not reloaded: {why}")),
    }
}

/// A store write that failed: nothing was committed, so nothing is answered as done.
fn store_failed(e: GatewayError) -> Response {
    tracing::error!(error = %e, "registration store write failed");
    if let GatewayError::Store(crate::store::StoreError::Unknown(_)) = e {
        // A cluster's release whose answer was lost and could not be read back.
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{e}: retry the request"),
        );
    }
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("not stored, nothing changed: {e}"),
    )
}

/// A registration change the gateway refused or failed (`what`: the 500's message): a bad
/// spec 400, a shutdown or a store write 503.
fn change_failed(e: GatewayError, what: &'static str) -> Response {
    match e {
        GatewayError::InvalidSpec(msg) => bad_request(msg),
        GatewayError::ShuttingDown => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is shutting down",
        ),
        e @ GatewayError::Store(_) => store_failed(e),
        e => {
            tracing::error!(error = %e, "{what}");
            error(StatusCode::INTERNAL_SERVER_ERROR, what)
        }
    }
}

fn bad_request(message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, message)
}

/// The HTTP pre-check every admin request passes first (`server::strict_http`): its refusal.
fn refused_by_strict_http(req: &Request) -> Option<Response> {
    let refused = crate::server::strict_http(req.version(), req.headers()).err()?;
    let mut r = error(refused.status, refused.message);
    refused.close(&mut r);
    Some(r)
}

async fn auth(State(st): State<AdminState>, req: Request, next: Next) -> Response {
    if let Some(r) = refused_by_strict_http(&req) {
        return r;
    }
    let presented = bearer(req.headers()).unwrap_or_default();
    let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
    if presented.is_empty() || !bool::from(digest.ct_eq(st.token_digest.as_ref())) {
        let mut r = error(StatusCode::UNAUTHORIZED, "admin token required");
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer realm=\"gatehouse-admin\""),
        );
        // Audited `auth_failed` (folded per interval, with the client's address).
        let mut mark = Refused::new(Reason::AdminAuth);
        mark.auth = Some(AuthFailure {
            registration: None,
            transport: "admin",
            missing: presented.is_empty(),
        });
        r.extensions_mut().insert(mark);
        return r;
    }
    next.run(req).await
}

/// The pre-check of the console's public files (the rest of the API runs it in `auth`).
async fn strict(req: Request, next: Next) -> Response {
    match refused_by_strict_http(&req) {
        Some(r) => r,
        None => next.run(req).await,
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, rest) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// Parses the body of `POST /v1/registrations`; errors name the field at fault.
pub fn parse_spec(body: &[u8]) -> Result<RegistrationSpec, String> {
    RegistrationSpec::from_json(body)
}

/// `PUT /v1/registrations/<id>/credentials` (issue 47): the body `{"<upstream>": {"bearer":
/// "…"} | {"headers": {…}}, …}` replaces the registration's upstream credentials; 200 with
/// them shown as `"set"`. Calls in flight finish; the next upstream request uses the new ones.
async fn credentials(
    State(st): State<AdminState>,
    UrlPath(id): UrlPath<String>,
    body: Bytes,
) -> Response {
    let set = serde_json::from_slice::<Value>(&body)
        .map_err(|e| format!("body is not JSON: {e}"))
        .and_then(|v| crate::registration::Credential::set_from_json("upstream_credentials", &v));
    let set = match set {
        Ok(s) => s,
        Err(msg) => return bad_request(msg),
    };
    match st.gw.rotate_credentials(&id, set).await {
        Ok(Some(state)) => Json(json!({
            "id": id,
            "upstream_credentials": state.credentials.summary(),
        }))
        .into_response(),
        Ok(None) => no_such_registration(&st.gw, &id),
        Err(e) => change_failed(e, "credentials not rotated"),
    }
}

async fn create(State(st): State<AdminState>, body: Bytes) -> Response {
    let spec = match parse_spec(&body) {
        Ok(s) => s,
        Err(msg) => return bad_request(msg),
    };
    match st.gw.register(spec).await {
        Ok(reg) => {
            let body = json!({
                "id": reg.id(),
                "token": reg.token(),
                "agent_id": reg.agent_id(),
                "label": reg.label(),
                "tools": reg.tools(),
                "sse_url": reg.sse_url(),
                "mcp_url": reg.mcp_url(),
                "expires_at": reg.expires_at(),
                // Never a value: `"set"` per upstream (issue 47).
                "upstream_credentials": reg.credentials(),
            });
            // The daemon keeps it until DELETE, expiry or shutdown.
            let _ = reg.detach();
            (StatusCode::CREATED, Json(body)).into_response()
        }
        Err(e) => change_failed(e, "registration failed"),
    }
}

async fn renew(
    State(st): State<AdminState>,
    UrlPath(id): UrlPath<String>,
    body: Bytes,
) -> Response {
    let ttl = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        let v: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return bad_request(format!("body is not JSON: {e}")),
        };
        let Value::Object(mut m) = v else {
            return bad_request("body must be a JSON object, e.g. {\"ttl_s\": 600}");
        };
        let ttl = match m.remove("ttl_s") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Some(n),
                _ => return bad_request("ttl_s: must be a positive integer (seconds)"),
            },
        };
        if let Some(k) = m.keys().next() {
            return bad_request(format!("{k}: unknown field (expected ttl_s)"));
        }
        ttl
    };
    match st.gw.renew_committed(&id, ttl).await {
        Ok(Some(expires_at)) => Json(json!({"id": id, "expires_at": expires_at})).into_response(),
        Ok(None) => no_such_registration(&st.gw, &id),
        Err(e) => store_failed(e),
    }
}

/// `POST /v1/registrations/<id>/probe`: the daemon's half of a probe (`gateway::probe`): the
/// granted tools, and each upstream its tools come from pinged, within `timeout_ms` (default
/// 5000, at most 60000). The MCP round trip is the caller's, who holds the token.
async fn probe(
    State(st): State<AdminState>,
    UrlPath(id): UrlPath<String>,
    body: Bytes,
) -> Response {
    use crate::gateway::probe::{DEFAULT_TIMEOUT, MAX_TIMEOUT};
    let mut timeout = DEFAULT_TIMEOUT;
    if !body.iter().all(u8::is_ascii_whitespace) {
        let v: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return bad_request(format!("body is not JSON: {e}")),
        };
        let Value::Object(mut m) = v else {
            return bad_request("body must be a JSON object, e.g. {\"timeout_ms\": 5000}");
        };
        match m.remove("timeout_ms") {
            None | Some(Value::Null) => {}
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => {
                    timeout = std::time::Duration::from_millis(n).min(MAX_TIMEOUT);
                }
                _ => return bad_request("timeout_ms: must be a positive integer (milliseconds)"),
            },
        }
        if let Some(k) = m.keys().next() {
            return bad_request(format!("{k}: unknown field (expected timeout_ms)"));
        }
    }
    match st.gw.probe_upstreams(&id, timeout).await {
        Some(seen) => Json(seen).into_response(),
        None => no_such_registration(&st.gw, &id),
    }
}

async fn delete(State(st): State<AdminState>, UrlPath(id): UrlPath<String>) -> Response {
    // Its agent, for the `release_acknowledged` record written after it is gone.
    #[cfg(feature = "cluster")]
    let state = st.gw.registry().get(&id);
    // 204 only once the store has committed the release.
    match st
        .gw
        .release_id_committed(&id, ReleaseReason::Released)
        .await
    {
        Ok(true) => {
            // A cluster node: 200 once every live node applied the release, or the bound
            // passed (the nodes behind it have fenced).
            #[cfg(feature = "cluster")]
            if let Some(a) = st.gw.release_acks(&id, state.as_deref()).await {
                return Json(json!({
                    "id": id,
                    "revision": a.revision,
                    "acked": a.acked,
                    "fenced": a.fenced,
                    "waited_ms": a.waited.as_secs_f64() * 1000.0,
                }))
                .into_response();
            }
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(false) => no_such_registration(&st.gw, &id),
        Err(e) => store_failed(e),
    }
}

/// One row of `GET /v1/registrations` (never a token).
fn describe(gw: &Gateway, r: &crate::registration::RegistrationState) -> Value {
    json!({
        "id": r.id,
        "agent_id": &*r.agent_id,
        "label": r.label,
        "tools": r.tools.names(),
        // The digest of the tool definitions pinned at creation (`pins`).
        "pins_digest": r.pins.summary(),
        "created_at": r.created_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "ttl_s": r.ttl_s,
        "roots": r.roots,
        "expires_at": r.expires_at(),
        "sessions": gw.sessions().count_for(&r.id),
        "calls_started": r.budget().started(),
        "calls_in_flight": r.budget().in_flight(),
        // Its family (issue 39): null and [] for a root registration without children.
        "parent": r.family.parent.as_ref().map(|p| p.id.as_str()),
        "children": r.family.children(),
        "agent_path": r.family.agent_path,
        // Never a value: `"set"` (or `"refused"`: restored without its key) per upstream.
        "upstream_credentials": r.credentials.summary(),
    })
}

async fn list(State(st): State<AdminState>) -> Response {
    let rows: Vec<Value> = st
        .gw
        .registry()
        .all()
        .iter()
        .map(|r| describe(&st.gw, r))
        .collect();
    Json(Value::Array(rows)).into_response()
}

async fn show(State(st): State<AdminState>, UrlPath(id): UrlPath<String>) -> Response {
    match st.gw.registry().get(&id) {
        Some(r) => Json(describe(&st.gw, &r)).into_response(),
        None => no_such_registration(&st.gw, &id),
    }
}

/// One upstream as `GET /v1/upstreams` shows it.
#[derive(Debug, Clone, Serialize, Default)]
pub struct UpstreamStatus {
    pub id: String,
    /// `stdio` or `http`.
    pub transport: String,
    pub sharing: String,
    /// Connection (re)spawns after the first.
    pub restarts: u64,
    /// Call notifications (progress, logs) that could not be delivered: the call ended
    /// first, or its caller took none for the grace. Never dropped without being counted.
    pub notifications_refused: u64,
    /// OAuth (issue 47): token requests by outcome; absent without `[upstreams.oauth]`.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub token_requests: std::collections::BTreeMap<&'static str, u64>,
    pub connections: Vec<crate::upstream::ConnectionInfo>,
    /// Why the last connection attempt failed (e.g. a TLS failure with its cause and what to
    /// fix), until a connection opens again; `null` otherwise (issue 46).
    pub last_error: Option<String>,
}

/// The configured upstreams, with their live connections (from the pool).
pub fn upstream_status(gw: &Gateway) -> Vec<UpstreamStatus> {
    let live: std::collections::HashMap<String, crate::upstream::UpstreamInfo> = gw
        .pool()
        .status()
        .into_iter()
        .map(|u| (u.id.clone(), u))
        .collect();
    // The upstreams in effect (`POST /v1/reload` may have added, changed or removed some).
    gw.pool()
        .upstream_configs()
        .iter()
        .map(|u| {
            let info = live.get(&u.id);
            let sharing = info.and_then(|i| i.effective_sharing).unwrap_or(u.sharing);
            UpstreamStatus {
                id: u.id.clone(),
                transport: if u.command.is_some() { "stdio" } else { "http" }.into(),
                sharing: sharing.as_str().into(),
                restarts: info.map(|i| i.restarts).unwrap_or(0),
                notifications_refused: info.map(|i| i.notifications_refused).unwrap_or(0),
                token_requests: info
                    .map(|i| i.token_requests.iter().map(|(_, o, n)| (*o, *n)).collect())
                    .unwrap_or_default(),
                connections: info.map(|i| i.connections.clone()).unwrap_or_default(),
                last_error: info.and_then(|i| i.last_error.clone()),
            }
        })
        .collect()
}

async fn upstreams(State(st): State<AdminState>) -> Response {
    Json(upstream_status(&st.gw)).into_response()
}

async fn console_stats(State(st): State<AdminState>) -> Response {
    let upstreams = serde_json::to_value(upstream_status(&st.gw)).unwrap_or_default();
    Json(crate::console::stats(&st.gw, upstreams)).into_response()
}

/// `GET /v1/approvals[?wait=N]` (issue 49; `admin::approvals`).
async fn approvals_list(State(st): State<AdminState>, RawQuery(q): RawQuery) -> Response {
    approvals::list(st.gw, q).await
}

/// `GET /v1/approvals/stream` (SSE).
async fn approvals_stream(State(st): State<AdminState>) -> Response {
    approvals::stream(st.gw)
}

/// `POST /v1/approvals/<id>` `{"decision", "reason"?, "by"?}`.
async fn approvals_decide(
    State(st): State<AdminState>,
    UrlPath(id): UrlPath<String>,
    body: Bytes,
) -> Response {
    approvals::decide(&st.gw, &id, &body)
}

async fn audit_tail(State(st): State<AdminState>, RawQuery(q): RawQuery) -> Response {
    crate::console::audit(&st.gw, q.as_deref()).await
}

/// The gauges of one gateway, read now.
pub fn snapshot(gw: &Gateway) -> Snapshot {
    let status = upstream_status(gw);
    let token_requests = gw
        .pool()
        .status()
        .into_iter()
        .flat_map(|u| {
            let id = u.id;
            u.token_requests
                .into_iter()
                .map(move |(g, o, n)| (id.clone(), g, o, n))
        })
        .collect();
    Snapshot {
        token_requests,
        notifications_refused: status
            .iter()
            .map(|u| (u.id.clone(), u.notifications_refused))
            .collect(),
        registrations: gw.registry().len(),
        sessions: gw.sessions().len(),
        leases: gw.deadlines().len(),
        audit_queue_depth: gw.audit().queue_depth(),
        audit_healthy: gw.audit().is_healthy(),
        otel: gw.hub().telemetry().map(|t| {
            use std::sync::atomic::Ordering::Relaxed;
            let c = t.counters();
            crate::metrics::OtelCounts {
                sent: c.sent.load(Relaxed),
                dropped: c.dropped.load(Relaxed),
                failed: c.failed.load(Relaxed),
                queued: c.queued.load(Relaxed),
            }
        }),
        upstreams: status
            .into_iter()
            .map(|u| {
                let in_flight = u.connections.iter().map(|c| c.in_flight).sum();
                (u.id, u.connections.len(), in_flight, u.restarts)
            })
            .collect(),
    }
}

async fn metrics(State(st): State<AdminState>) -> Response {
    let text = st.gw.metrics().render(&snapshot(&st.gw));
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}

#[cfg(test)]
mod tests {
    use super::parse_spec;

    #[test]
    fn roots_are_parsed_and_bad_ones_name_the_field() {
        let spec = parse_spec(
            br#"{"agent_id":"a","tools":[],"roots":[{"uri":"file:///w","name":"w"},{"uri":"file:///t"}]}"#,
        )
        .unwrap();
        let roots = spec.roots.unwrap();
        assert_eq!(roots[0].uri, "file:///w");
        assert_eq!(roots[0].name.as_deref(), Some("w"));
        assert_eq!(roots[1].name, None);
        let none = parse_spec(br#"{"agent_id":"a","tools":[]}"#).unwrap();
        assert!(none.roots.is_none());
        for bad in [
            &br#"{"agent_id":"a","tools":[],"roots":"file:///w"}"#[..],
            br#"{"agent_id":"a","tools":[],"roots":[{"uri":"file:///w","colour":1}]}"#,
            br#"{"agent_id":"a","tools":[],"roots":[{"name":"w"}]}"#,
        ] {
            let err = parse_spec(bad).unwrap_err();
            assert!(err.starts_with("roots:"), "{err}");
        }
    }
}
