//! Streamable HTTP upstream transport (legacy-handshake revisions, 2025-06-18): POSTs, JSON and SSE response parsing, the `Mcp-Session-Id` session and its DELETE.
//!
//! Every client message is one POST with `Accept: application/json, text/event-stream`. A
//! request's answer is either one JSON body or an SSE stream that may carry progress,
//! notifications and server → client requests before the final response; all of them are
//! dispatched to the connection core as they arrive, tagged with the request that opened the
//! stream. After `initialize` the `Mcp-Session-Id` (if the server assigned one) and
//! `MCP-Protocol-Version` headers go on every request. Configured headers go on every request;
//! the downstream client's bearer token never reaches this layer.
//!
//! Not implemented (caveats): the optional GET stream for unsolicited server messages, and SSE
//! resumption (`Last-Event-ID`) — a stream that ends without a response fails that request.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};
use reqwest::{StatusCode, Url};
use serde_json::Value;
use tokio::task::JoinSet;

use super::core::Core;
use super::UpstreamError;
use crate::sync::lock;

const SESSION_HEADER: &str = "mcp-session-id";
const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";
const ACCEPT_BOTH: &str = "application/json, text/event-stream";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const DELETE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest SSE line accepted; longer lines are dropped.
const MAX_SSE_LINE_BYTES: usize = 16 * 1024 * 1024;

pub(crate) struct HttpTransport {
    shared: Arc<Shared>,
    /// Fire-and-forget POSTs issued from `Drop` paths; aborted when the transport drops.
    tasks: Mutex<JoinSet<()>>,
}

struct Shared {
    upstream_id: String,
    client: reqwest::Client,
    /// The name an HTTPS upstream's certificate is checked against (`tls_server_name` or the
    /// URL's host), for the TLS failure's message.
    tls_name: String,
    /// HTTPS: whether the server asked for a client certificate (see `answered`).
    cert_asked: Option<crate::tls::ClientCertAsked>,
    has_client_cert: bool,
    /// A response came: a later transport failure is not the handshake's.
    answered: AtomicBool,
    url: Url,
    headers: HeaderMap,
    /// A registration's own credential (issue 47), read on every request: set over the
    /// configured headers, never logged (its values are marked sensitive).
    auth: Option<Arc<crate::registration::AuthCell>>,
    /// OAuth (issue 47): the access tokens every request carries, fetched and cached by
    /// `upstream::tokens`; a 401 gets one fresh token, then fails the request.
    tokens: Option<Arc<super::tokens::Tokens>>,
    session: Mutex<Option<HeaderValue>>,
    protocol_version: OnceLock<HeaderValue>,
}

impl HttpTransport {
    /// Validates the URL and headers and builds the HTTP client. Opens no connection yet.
    pub(crate) fn new(
        upstream_id: &str,
        url: &str,
        headers: &BTreeMap<String, String>,
        tls: &crate::config::UpstreamTls,
        auth: Option<Arc<crate::registration::AuthCell>>,
        tokens: Option<Arc<super::tokens::Tokens>>,
    ) -> Result<Self, UpstreamError> {
        let url = Url::parse(url)
            .map_err(|err| UpstreamError::Config(format!("invalid upstream url {url:?}: {err}")))?;
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| UpstreamError::Config(format!("invalid header name {name:?}")))?;
            // The value may be a secret: never echo it.
            let value = HeaderValue::from_str(value)
                .map_err(|_| UpstreamError::Config(format!("invalid value for header {name}")))?;
            map.insert(name, value);
        }
        let mut builder = reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT);
        let mut cert_asked = None;
        if url.scheme() == "https" {
            // Our rustls config (src/tls.rs): the platform's roots or `tls_ca_file`, the
            // client certificate, `tls_server_name`. An `http://` URL needs none.
            let (config, asked) = crate::tls::build_observed(tls)
                .map_err(|e| UpstreamError::Config(format!("upstream {upstream_id:?}: {e}")))?;
            builder = builder.use_preconfigured_tls(config);
            cert_asked = Some(asked);
        }
        let client = builder.build()?;
        // The name a certificate failure is reported against.
        let tls_name = tls
            .server_name
            .clone()
            .or_else(|| url.host_str().map(str::to_owned))
            .unwrap_or_default();
        Ok(Self {
            shared: Arc::new(Shared {
                upstream_id: upstream_id.to_owned(),
                client,
                tls_name,
                cert_asked,
                has_client_cert: tls.client_cert_file.is_some(),
                answered: AtomicBool::new(false),
                url,
                headers: map,
                auth,
                tokens,
                session: Mutex::new(None),
                protocol_version: OnceLock::new(),
            }),
            tasks: Mutex::new(JoinSet::new()),
        })
    }

    /// Records the negotiated version, sent as `MCP-Protocol-Version` from now on.
    pub(crate) fn set_protocol_version(&self, version: &str) {
        if let Ok(value) = HeaderValue::from_str(version) {
            let _ = self.shared.protocol_version.set(value);
        }
    }

    /// POSTs request `id` (its encoded `line`) and dispatches everything in the answer (JSON or
    /// SSE) to `core`.
    /// Returns once the response for `id` was dispatched or the answer ended.
    pub(crate) async fn exchange(
        &self,
        core: &Arc<Core>,
        id: u64,
        line: Vec<u8>,
        trace: Option<Box<crate::telemetry::TraceMeta>>,
        mirror: Option<Box<Mirror>>,
    ) -> Result<(), UpstreamError> {
        // The request as encoded for stdio; its newline is dropped (whitespace either way).
        let mut body = line;
        if body.last() == Some(&b'\n') {
            body.pop();
        }
        let response = self
            .shared
            .post(core, body, trace.as_deref(), mirror.as_deref())
            .await?;
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        if content_type.starts_with("text/event-stream") {
            let mut body = response.bytes_stream();
            let mut parser = SseParser::default();
            while let Some(chunk) = body.next().await {
                let chunk = chunk?;
                for data in parser.push(&chunk) {
                    if self.shared.handle_payload(core, id, data.as_bytes()).await {
                        // Our response arrived; the server should end the stream now anyway.
                        return Ok(());
                    }
                }
            }
            Ok(())
        } else if content_type.starts_with("application/json") {
            let body = response.bytes().await?;
            self.shared.handle_payload(core, id, &body).await;
            Ok(())
        } else if response.status() == StatusCode::ACCEPTED {
            Ok(())
        } else {
            Err(UpstreamError::Protocol(format!(
                "unexpected content-type {content_type:?} in response to a request"
            )))
        }
    }

    /// POSTs a notification or response; expects a 2xx (normally 202 without body).
    pub(crate) async fn post_accepted(
        &self,
        core: &Arc<Core>,
        msg: &Value,
    ) -> Result<(), UpstreamError> {
        self.shared.post_accepted(core, msg).await
    }

    /// Posts `msg` in the background (for `Drop` paths, which cannot await).
    pub(crate) fn spawn_post(&self, core: &Arc<Core>, msg: Value) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = self.shared.clone();
        let core = core.clone();
        let mut tasks = lock(&self.tasks);
        while tasks.try_join_next().is_some() {}
        tasks.spawn_on(
            async move {
                if let Err(err) = shared.post_accepted(&core, &msg).await {
                    tracing::debug!(upstream = %shared.upstream_id, error = %err, "background POST failed");
                }
            },
            &runtime,
        );
    }

    /// Ends the session with DELETE (when the server assigned one) and aborts background posts.
    pub(crate) async fn shutdown(&self) {
        let session = lock(&self.shared.session).take();
        if let Some(session) = session {
            let mut headers = self.shared.headers.clone();
            self.shared.authorize(&mut headers);
            // The token cached now, if any: a closing DELETE fetches none.
            if let Some(t) = self.shared.tokens.as_ref().and_then(|t| t.cached()) {
                headers.insert(reqwest::header::AUTHORIZATION, t.header.clone());
            }
            headers.insert(SESSION_HEADER, session);
            if let Some(version) = self.shared.protocol_version.get() {
                headers.insert(PROTOCOL_VERSION_HEADER, version.clone());
            }
            let deleted = self
                .shared
                .client
                .delete(self.shared.url.clone())
                .headers(headers)
                .timeout(DELETE_TIMEOUT)
                .send()
                .await;
            match deleted {
                Ok(response) => {
                    tracing::debug!(upstream = %self.shared.upstream_id, status = %response.status(), "deleted upstream session")
                }
                Err(err) => {
                    tracing::debug!(upstream = %self.shared.upstream_id, error = %err, "could not delete upstream session")
                }
            }
        }
        lock(&self.tasks).abort_all();
    }
}

/// The headers a 2026-07-28 request mirrors from its body (SEP-2243): `Mcp-Method`, and
/// `Mcp-Name` for the methods that name something (`tools/call`, `prompts/get`: `name`;
/// `resources/read`: `uri`; `tasks/*`: `taskId`). A value outside visible ASCII, or with
/// whitespace at either end, is sent in the `=?base64?…?=` form.
#[derive(Debug)]
pub(crate) struct Mirror {
    method: HeaderValue,
    name: Option<HeaderValue>,
    /// `Mcp-Param-{Name}` of a `tools/call`: its tool's `x-mcp-header` arguments that have
    /// a value (`protocol::param_header`).
    params: Vec<(HeaderName, HeaderValue)>,
}

impl Mirror {
    /// `annotated`: the called tool's `x-mcp-header` arguments (`tools/call` only).
    pub(crate) fn of(
        method: &str,
        params: &serde_json::Value,
        annotated: Option<&[crate::protocol::param_header::ParamHeader]>,
    ) -> Option<Mirror> {
        let field = match method {
            "tools/call" | "prompts/get" => Some("name"),
            "resources/read" => Some("uri"),
            m if m.starts_with("tasks/") => Some("taskId"),
            _ => None,
        };
        let name = field
            .and_then(|f| params.get(f))
            .and_then(serde_json::Value::as_str)
            .and_then(header_value);
        let params = match annotated {
            Some(a) if method == "tools/call" => {
                crate::protocol::param_header::headers_for(a, params.get("arguments"))
                    .filter_map(|(h, text)| {
                        Some((
                            HeaderName::from_bytes(h.as_bytes()).ok()?,
                            HeaderValue::from_str(&text).ok()?,
                        ))
                    })
                    .collect()
            }
            _ => Vec::new(),
        };
        Some(Mirror {
            method: header_value(method)?,
            name,
            params,
        })
    }

    /// A notification's: `Mcp-Method` only.
    fn notification(method: &str) -> Option<Mirror> {
        Some(Mirror {
            method: header_value(method)?,
            name: None,
            params: Vec::new(),
        })
    }
}

/// A mirrored value as a header: as is when it is visible ASCII (spaces inside allowed),
/// else base64 in the `=?base64?…?=` form.
fn header_value(v: &str) -> Option<HeaderValue> {
    let sentinel = v.starts_with("=?base64?") && v.ends_with("?=");
    let plain = !v.is_empty()
        && v.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !v.starts_with(' ')
        && !v.ends_with(' ')
        && !sentinel;
    if plain {
        return HeaderValue::from_str(v).ok();
    }
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(v.as_bytes());
    HeaderValue::from_str(&format!("=?base64?{b64}?=")).ok()
}

impl Shared {
    /// Sets the registration's credential (its value now) over the configured headers.
    fn authorize(&self, headers: &mut HeaderMap) {
        if let Some(cell) = &self.auth {
            if let Some(creds) = cell.headers() {
                for name in creds.keys() {
                    headers.remove(name);
                }
                for (name, value) in creds.iter() {
                    headers.append(name.clone(), value.clone());
                }
            }
        }
    }

    fn headers_for_post(&self) -> HeaderMap {
        let mut headers = self.headers.clone();
        self.authorize(&mut headers);
        headers.insert(ACCEPT, HeaderValue::from_static(ACCEPT_BOTH));
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(session) = lock(&self.session).clone() {
            headers.insert(SESSION_HEADER, session);
        }
        if let Some(version) = self.protocol_version.get() {
            headers.insert(PROTOCOL_VERSION_HEADER, version.clone());
        }
        headers
    }

    /// POSTs one message. A transport failure (no HTTP response at all) or a 404 for our
    /// session closes the connection; another non-2xx status fails only this message.
    async fn post(
        &self,
        core: &Arc<Core>,
        body: Vec<u8>,
        trace: Option<&crate::telemetry::TraceMeta>,
        mirror: Option<&Mirror>,
    ) -> Result<reqwest::Response, UpstreamError> {
        let mut headers = self.headers_for_post();
        if let Some(m) = mirror {
            headers.insert("mcp-method", m.method.clone());
            if let Some(name) = &m.name {
                headers.insert("mcp-name", name.clone());
            }
            for (h, v) in &m.params {
                headers.insert(h.clone(), v.clone());
            }
        }
        if let Some(t) = trace {
            // The same context as the request's `_meta`, replacing any configured value.
            let mut set = |name: &'static str, v: Option<&str>| {
                if let Some(v) = v.and_then(|v| reqwest::header::HeaderValue::from_str(v).ok()) {
                    headers.insert(name, v);
                }
            };
            set("traceparent", Some(&t.traceparent));
            set("tracestate", t.tracestate.as_deref());
            set("baggage", t.baggage.as_deref());
        }
        let sent = match &self.tokens {
            None => {
                self.client
                    .post(self.url.clone())
                    .headers(headers)
                    .body(body)
                    .send()
                    .await
            }
            Some(tokens) => self.send_with_token(tokens, headers, body).await?,
        };
        let response = match sent {
            Ok(response) => response,
            Err(err) => {
                let tls = crate::tls::describe_failure(&err, &self.tls_name).or_else(|| {
                    // Asked for a client certificate, then closed before any answer: the
                    // upstream refused ours (or our having none) without an alert.
                    let asked = self.cert_asked.as_ref().is_some_and(|a| a.get());
                    (asked && !self.answered.load(Ordering::Relaxed))
                        .then(|| crate::tls::client_cert_refused(self.has_client_cert, &err))
                });
                let reason = match tls {
                    // Named: unknown issuer, name mismatch, expired, client certificate
                    // refused, with what to fix (issue 46).
                    Some(tls) => {
                        let reason = format!("TLS failure: {tls}");
                        tracing::warn!(upstream = %self.upstream_id, error = %reason, "upstream TLS handshake failed");
                        reason
                    }
                    None => format!("http transport failure: {}", crate::tls::chain(&err)),
                };
                core.mark_closed(reason.clone());
                return Err(UpstreamError::Closed(reason));
            }
        };
        if !self.answered.load(Ordering::Relaxed) {
            self.answered.store(true, Ordering::Relaxed);
        }
        let had_session = {
            let mut session = lock(&self.session);
            if session.is_none() {
                *session = response.headers().get(SESSION_HEADER).cloned();
                false
            } else {
                true
            }
        };
        let status = response.status();
        if status == StatusCode::UNAUTHORIZED && (self.tokens.is_some() || self.auth.is_some()) {
            tracing::warn!(upstream = %self.upstream_id, "upstream rejected the credentials (401)");
            return Err(UpstreamError::AuthRejected {
                upstream: self.upstream_id.clone(),
            });
        }
        if status == StatusCode::NOT_FOUND && had_session {
            let reason = "upstream session expired (404)".to_owned();
            core.mark_closed(reason.clone());
            return Err(UpstreamError::Closed(reason));
        }
        let json_error = status.is_client_error()
            && mirror.is_some()
            && response
                .headers()
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|c| c.to_ascii_lowercase().starts_with("application/json"));
        if json_error {
            // A 2026-07-28 server answers a refused request (-32020, -32021, …) with a 4xx
            // and its JSON-RPC error: the error is the answer.
            return Ok(response);
        }
        if !status.is_success() {
            tracing::warn!(upstream = %self.upstream_id, %status, "upstream answered POST with an error status");
            return Err(UpstreamError::HttpStatus {
                status: status.as_u16(),
            });
        }
        Ok(response)
    }

    /// Sends with the current access token; on a 401, once more with a fresh one, unless
    /// the token was itself a 401's replacement (`Tokens::rejected`). A token that cannot be
    /// had fails the request ([`UpstreamError::Auth`]).
    async fn send_with_token(
        &self,
        tokens: &Arc<super::tokens::Tokens>,
        mut headers: HeaderMap,
        body: Vec<u8>,
    ) -> Result<Result<reqwest::Response, reqwest::Error>, UpstreamError> {
        let body = bytes::Bytes::from(body);
        let token = tokens.get().await.map_err(UpstreamError::Auth)?;
        headers.insert(reqwest::header::AUTHORIZATION, token.header.clone());
        let sent = self
            .client
            .post(self.url.clone())
            .headers(headers.clone())
            .body(body.clone())
            .send()
            .await;
        let refused = matches!(&sent, Ok(r) if r.status() == StatusCode::UNAUTHORIZED);
        if !refused || !tokens.rejected(&token) {
            return Ok(sent);
        }
        if let Ok(r) = sent {
            let _ = r.bytes().await;
        }
        tracing::info!(upstream = %self.upstream_id, "upstream refused its access token (401): fetching a fresh one, once");
        let fresh = tokens.get().await.map_err(UpstreamError::Auth)?;
        headers.insert(reqwest::header::AUTHORIZATION, fresh.header.clone());
        Ok(self
            .client
            .post(self.url.clone())
            .headers(headers)
            .body(body)
            .send()
            .await)
    }

    async fn post_accepted(&self, core: &Arc<Core>, msg: &Value) -> Result<(), UpstreamError> {
        // A notification to a 2026-07-28 upstream carries `Mcp-Method` as requests do.
        let modern = self
            .protocol_version
            .get()
            .is_some_and(|v| v.as_bytes() == crate::protocol::MODERN_VERSION.as_bytes());
        let mirror = match (modern, msg.get("id"), msg.get("method")) {
            (true, None, Some(Value::String(m))) => Mirror::notification(m),
            _ => None,
        };
        let response = self
            .post(core, serde_json::to_vec(msg)?, None, mirror.as_ref())
            .await?;
        // Drain any body so the connection can be reused.
        let _ = response.bytes().await;
        Ok(())
    }

    /// Dispatches one JSON payload (a message or a batch). Returns whether it contained the
    /// response to request `id`. Replies the core asks for (pings) are posted back.
    async fn handle_payload(&self, core: &Arc<Core>, id: u64, payload: &[u8]) -> bool {
        if payload.trim_ascii().is_empty() {
            return false; // e.g. an SSE priming event
        }
        let messages = match serde_json::from_slice::<Value>(payload) {
            Ok(Value::Array(batch)) => batch,
            Ok(msg) => vec![msg],
            Err(err) => {
                tracing::warn!(upstream = %self.upstream_id, error = %err, "skipping non-JSON payload from upstream");
                return false;
            }
        };
        let mut answered = false;
        for msg in messages {
            let is_ours =
                msg.get("method").is_none() && msg.get("id").and_then(Value::as_u64) == Some(id);
            answered |= is_ours;
            if let Some(reply) = core.dispatch(msg, Some(id)).await {
                if let Err(err) = self.post_accepted(core, &reply).await {
                    tracing::debug!(upstream = %self.upstream_id, error = %err, "could not answer upstream ping");
                }
            }
        }
        answered
    }
}

/// Incremental `text/event-stream` parser yielding the `data` of each complete event.
#[derive(Default)]
struct SseParser {
    line: Vec<u8>,
    line_too_long: bool,
    data: String,
    has_data: bool,
}

impl SseParser {
    fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        let mut events = Vec::new();
        for &byte in chunk {
            if byte == b'\n' {
                self.end_line(&mut events);
            } else if self.line.len() < MAX_SSE_LINE_BYTES {
                self.line.push(byte);
            } else {
                self.line_too_long = true;
            }
        }
        events
    }

    fn end_line(&mut self, events: &mut Vec<String>) {
        let mut line = std::mem::take(&mut self.line);
        if std::mem::take(&mut self.line_too_long) {
            return;
        }
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if line.is_empty() {
            if std::mem::take(&mut self.has_data) {
                events.push(std::mem::take(&mut self.data));
            }
            return;
        }
        let line = String::from_utf8_lossy(&line);
        if line.starts_with(':') {
            return; // comment / keep-alive
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        if field == "data" {
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(value);
            self.has_data = true;
        }
        // `event`, `id` and `retry` are not needed without resumption.
    }
}

#[cfg(test)]
mod tests {
    use super::{header_value, Mirror, SseParser};

    #[test]
    fn mirrored_headers_name_what_the_body_names_in_base64_where_not_plain() {
        let m = Mirror::of("tools/call", &serde_json::json!({"name": "m.slow"}), None).unwrap();
        assert_eq!(m.method, "tools/call");
        assert_eq!(m.name.unwrap(), "m.slow");
        let m = Mirror::of("tasks/get", &serde_json::json!({"taskId": "abc"}), None).unwrap();
        assert_eq!(m.name.unwrap(), "abc");
        let m = Mirror::of(
            "resources/read",
            &serde_json::json!({"uri": "mémo://x"}),
            None,
        )
        .unwrap();
        assert_eq!(m.name.unwrap(), "=?base64?bcOpbW86Ly94?=");
        let m = Mirror::of("tools/list", &serde_json::json!({}), None).unwrap();
        assert!(m.name.is_none());
        assert_eq!(header_value(" x").unwrap(), "=?base64?IHg=?=");
    }

    #[test]
    fn sse_events_split_across_chunks() {
        let mut parser = SseParser::default();
        let mut events = parser.push(b"id: 1\ndata:\n\n: keep\r\nevent: message\r\ndata: {\"a\"");
        events.extend(parser.push(b":1}\r\n\r\ndata: x\ndata: y\n\n"));
        assert_eq!(events, ["", "{\"a\":1}", "x\ny"]);
    }
}
