//! OAuth toward an upstream (issue 47): one upstream's client of its authorization server —
//! discovery (RFC 8414, then OpenID Connect's), token requests (`client_credentials`, or an
//! RFC 8693 exchange of a registration's subject token, with the agent path of a child as its
//! actor token), revocation (RFC 7009), and the counts and spans of its token requests.
//! [`super::tokens`] caches what it gets.
//!
//! Invariant: no secret, subject token or access token is ever logged, counted, traced or put
//! in an error: errors carry the authorization server's `error` code and HTTP status only.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use reqwest::Url;
use serde_json::Value;

use crate::config::{OAuthConfig, OAuthGrant};
use crate::registration::Secret;
use crate::sync::lock;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A token (or discovery, or revocation) request's whole time.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest answer read from the authorization server.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// The lifetime assumed when a token response has no `expires_in`.
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);
/// RFC 8693 token types.
pub const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";
pub const TOKEN_EXCHANGE_GRANT: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
/// The actor token a child registration's exchange carries: its agent path, agent ids from
/// the root registration down joined by `/`, asserted by the gateway (an authenticated
/// client of the authorization server), which maps it to the token's `act` chain.
pub const AGENT_PATH_TOKEN_TYPE: &str = "urn:io.gatehouse:params:oauth:token-type:agent-path";

/// Why a token could not be had. Never holds a token, a secret or an answer's body.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OAuthError {
    #[error("the authorization server of upstream {upstream:?} is unreachable ({why}); calls fail until it answers")]
    Unreachable { upstream: String, why: String },
    #[error("the authorization server of upstream {upstream:?} refused the token request (HTTP {status}{code})")]
    Refused {
        upstream: String,
        status: u16,
        /// `, error=<code>` when the answer named one (RFC 6749 §5.2; a bounded token).
        code: String,
    },
    #[error("the authorization server of upstream {upstream:?} answered a token response that cannot be used: {why}")]
    Invalid { upstream: String, why: &'static str },
    #[error("upstream {upstream:?} exchanges each registration's subject token for its tokens (token_exchange) and this registration has none: set upstream_credentials.{upstream} = {{\"subject_token\": \"…\"}}")]
    NoSubject { upstream: String },
    #[error("the client secret of upstream {upstream:?} cannot be read: {why}")]
    Secret { upstream: String, why: String },
}

impl OAuthError {
    /// The `outcome` label of the token request that ended so.
    fn outcome(&self) -> &'static str {
        match self {
            OAuthError::Unreachable { .. } => "unreachable",
            OAuthError::Refused { .. } => "refused",
            OAuthError::Invalid { .. } => "invalid",
            OAuthError::NoSubject { .. } | OAuthError::Secret { .. } => "not_sent",
        }
    }
}

/// An access token and when to get the next one.
pub struct Token {
    /// `Bearer <token>`, marked sensitive.
    pub header: HeaderValue,
    value: Secret,
    /// Refresh from then on: shortly before it expires.
    pub refresh_at: tokio::time::Instant,
    /// Fetched because the one before it was refused (a 401): a 401 for this one is final.
    pub after_401: bool,
}

impl Token {
    pub fn value(&self) -> &Secret {
        &self.value
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(\"set\")")
    }
}

/// What a token request asks for.
pub enum Ask<'a> {
    ClientCredentials,
    /// RFC 8693: `subject` (an access token), `actor` (a child's agent path).
    Exchange {
        subject: &'a str,
        actor: Option<&'a str>,
    },
}

struct Endpoints {
    token: Url,
    revocation: Option<Url>,
}

/// One upstream's OAuth client; shared by its slots (a reload makes a new one).
pub struct OAuthClient {
    upstream: String,
    config: OAuthConfig,
    http: reqwest::Client,
    endpoints: tokio::sync::OnceCell<Arc<Endpoints>>,
    /// Token requests by outcome (`gatehouse_upstream_token_requests_total`).
    counts: Mutex<BTreeMap<&'static str, u64>>,
    telemetry: OnceLock<Arc<crate::telemetry::Telemetry>>,
    /// The authorization server's host and port (spans).
    server: Option<(String, u16)>,
    /// Revocations under way (each bounded by [`REQUEST_TIMEOUT`], at most
    /// [`MAX_REVOCATIONS`] at once): a release or rotation does not wait for them.
    revocations: tokio_util::task::TaskTracker,
}

/// Most revocations under way at once per upstream; past it a token is dropped unrevoked
/// (logged): it expires by itself.
const MAX_REVOCATIONS: usize = 256;

impl std::fmt::Debug for OAuthClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthClient")
            .field("upstream", &self.upstream)
            .field("grant", &self.config.grant)
            .finish_non_exhaustive()
    }
}

impl OAuthClient {
    /// The client of `upstream`'s `config` (the platform's roots, or `SSL_CERT_FILE`, for
    /// an https server; without any, its requests fail as unreachable, logged here).
    pub fn new(upstream: &str, config: OAuthConfig) -> OAuthClient {
        let builder = || {
            reqwest::Client::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .timeout(REQUEST_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .pool_max_idle_per_host(0)
        };
        let built = crate::tls::build(&crate::config::UpstreamTls::default()).and_then(|tls| {
            builder()
                .use_preconfigured_tls(tls)
                .build()
                .map_err(|e| e.to_string())
        });
        let http = built.unwrap_or_else(|e| {
            tracing::error!(upstream, error = %e, "oauth: no TLS roots for the authorization server");
            builder().build().unwrap_or_default()
        });
        let server = config
            .token_url
            .as_deref()
            .or(config.issuer.as_deref())
            .and_then(|u| Url::parse(u).ok())
            .and_then(|u| Some((u.host_str()?.to_string(), u.port_or_known_default()?)));
        OAuthClient {
            server,
            upstream: upstream.to_string(),
            config,
            http,
            endpoints: tokio::sync::OnceCell::new(),
            counts: Mutex::new(BTreeMap::new()),
            telemetry: OnceLock::new(),
            revocations: tokio_util::task::TaskTracker::new(),
        }
    }

    /// Revokes `token` in the background ([`OAuthClient::revoke`]); owned by this client's
    /// tracker, bounded in time and number.
    pub fn revoke_later(self: &Arc<Self>, token: Arc<Token>) {
        if self.revocations.len() >= MAX_REVOCATIONS {
            tracing::info!(upstream = %self.upstream, "too many token revocations under way: a token is left to expire");
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.clone();
        self.revocations
            .spawn_on(async move { client.revoke(&token).await }, &rt);
    }

    /// The authorization server's host and port, as spans say it.
    fn peer(&self) -> crate::telemetry::Peer<'_> {
        match &self.server {
            Some((address, port)) => crate::telemetry::Peer::Tcp {
                address,
                port: *port,
            },
            None => crate::telemetry::Peer::Pipe,
        }
    }

    pub fn grant(&self) -> OAuthGrant {
        self.config.grant
    }

    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// Spans of token requests go to `t` from now on (set once by the pool).
    pub fn trace_with(&self, t: Option<&Arc<crate::telemetry::Telemetry>>) {
        if let Some(t) = t {
            let _ = self.telemetry.set(t.clone());
        }
    }

    /// Token requests so far: (grant, outcome, count); outcomes `ok`, `refused`,
    /// `unreachable`, `invalid`.
    pub fn counts(&self) -> Vec<(&'static str, &'static str, u64)> {
        let grant = self.config.grant.as_str();
        lock(&self.counts)
            .iter()
            .map(|(k, v)| (grant, *k, *v))
            .collect()
    }

    /// One token request (counted, in a span of its own); `after_401`: it replaces a token
    /// the upstream refused.
    pub async fn request(&self, ask: Ask<'_>, after_401: bool) -> Result<Token, OAuthError> {
        let grant = self.config.grant.as_str();
        let span = self
            .telemetry
            .get()
            .map(|t| t.pool_span("token", &self.upstream, self.peer()));
        let got = {
            use tracing::Instrument;
            let log = tracing::debug_span!("oauth_token_request", upstream = %self.upstream, grant);
            self.request_once(&ask, after_401).instrument(log).await
        };
        let outcome = match &got {
            Ok(_) => "ok",
            Err(e) => e.outcome(),
        };
        if outcome != "not_sent" {
            *lock(&self.counts).entry(outcome).or_insert(0) += 1;
        }
        if let Some(mut span) = span {
            span.set_attribute("gatehouse.oauth.grant", grant);
            span.set_attribute("gatehouse.oauth.outcome", outcome);
            let error = got.as_ref().err().map(|_| "token request failed");
            let _ = span.end(None, error);
        }
        match &got {
            Ok(_) => {
                tracing::debug!(upstream = %self.upstream, grant, "got an upstream access token")
            }
            Err(e) => {
                tracing::warn!(upstream = %self.upstream, grant, error = %e, "upstream token request failed")
            }
        }
        got
    }

    async fn request_once(&self, ask: &Ask<'_>, after_401: bool) -> Result<Token, OAuthError> {
        let endpoints = self.endpoints().await?;
        let form = {
            let mut form = form_urlencoded::Serializer::new(String::new());
            match ask {
                Ask::ClientCredentials => {
                    form.append_pair("grant_type", "client_credentials");
                }
                Ask::Exchange { subject, actor } => {
                    form.append_pair("grant_type", TOKEN_EXCHANGE_GRANT);
                    form.append_pair("subject_token", subject);
                    form.append_pair("subject_token_type", ACCESS_TOKEN_TYPE);
                    form.append_pair("requested_token_type", ACCESS_TOKEN_TYPE);
                    if let Some(a) = actor {
                        form.append_pair("actor_token", a);
                        form.append_pair("actor_token_type", AGENT_PATH_TOKEN_TYPE);
                    }
                }
            }
            if let Some(s) = &self.config.scope {
                form.append_pair("scope", s);
            }
            if let Some(r) = &self.config.resource {
                form.append_pair("resource", r);
            }
            self.authenticated(form)?
        };
        let answer = self.post_form(&endpoints.token, form).await?;
        let (status, body) = answer;
        if !(200..300).contains(&status) {
            return Err(self.refused(status, &body));
        }
        let invalid = |why| OAuthError::Invalid {
            upstream: self.upstream.clone(),
            why,
        };
        let v: Value = serde_json::from_slice(&body).map_err(|_| invalid("not JSON"))?;
        let token = v
            .get("access_token")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| invalid("no access_token"))?;
        let kind = v.get("token_type").and_then(Value::as_str).unwrap_or("");
        if !kind.eq_ignore_ascii_case("bearer") {
            return Err(invalid("token_type is not Bearer"));
        }
        let lifetime = v
            .get("expires_in")
            .and_then(Value::as_u64)
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_LIFETIME);
        let mut header = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| invalid("access_token is not a valid header value"))?;
        header.set_sensitive(true);
        // Refreshed a fifth of its lifetime (at most a minute) before it expires.
        let margin = (lifetime / 5).min(Duration::from_secs(60));
        Ok(Token {
            header,
            value: Secret::new(token),
            refresh_at: tokio::time::Instant::now() + lifetime.saturating_sub(margin),
            after_401,
        })
    }

    /// Revokes `token` (RFC 7009) where the server offers revocation; best effort, bounded.
    async fn revoke(&self, token: &Token) {
        let Ok(endpoints) = self.endpoints().await else {
            return;
        };
        let Some(url) = &endpoints.revocation else {
            return;
        };
        let form = {
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair("token", token.value.expose());
            form.append_pair("token_type_hint", "access_token");
            match self.authenticated(form) {
                Ok(f) => f,
                Err(_) => return,
            }
        };
        match self.post_form(url, form).await {
            Ok((s, _)) if (200..300).contains(&s) => {
                tracing::debug!(upstream = %self.upstream, "revoked an upstream access token")
            }
            Ok((s, _)) => {
                tracing::info!(upstream = %self.upstream, status = s, "token revocation refused")
            }
            Err(e) => {
                tracing::info!(upstream = %self.upstream, error = %e, "token revocation failed")
            }
        }
    }

    /// `form` finished with the client's authentication: a `client_id` field (a public
    /// client), or HTTP Basic (RFC 6749 §2.3.1) with the secret.
    fn authenticated(
        &self,
        mut form: form_urlencoded::Serializer<'_, String>,
    ) -> Result<(String, Option<HeaderValue>), OAuthError> {
        match self.secret()? {
            Some(secret) => {
                // RFC 6749 §2.3.1: both form-encoded, then Basic.
                use base64::Engine;
                let enc =
                    |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
                let pair = format!("{}:{}", enc(&self.config.client_id), enc(secret.expose()));
                let b64 = base64::engine::general_purpose::STANDARD.encode(pair);
                let mut v = HeaderValue::from_str(&format!("Basic {b64}")).map_err(|_| {
                    OAuthError::Secret {
                        upstream: self.upstream.clone(),
                        why: "not a valid header value".into(),
                    }
                })?;
                v.set_sensitive(true);
                Ok((form.finish(), Some(v)))
            }
            None => {
                form.append_pair("client_id", &self.config.client_id);
                Ok((form.finish(), None))
            }
        }
    }

    /// POSTs an [`OAuthClient::authenticated`] form; the status and (bounded) body.
    async fn post_form(
        &self,
        url: &Url,
        (form, auth): (String, Option<HeaderValue>),
    ) -> Result<(u16, Vec<u8>), OAuthError> {
        let mut req = self
            .http
            .post(url.clone())
            .header(ACCEPT, "application/json")
            .header(CONTENT_TYPE, "application/x-www-form-urlencoded");
        if let Some(v) = auth {
            req = req.header(AUTHORIZATION, v);
        }
        let sent = req.body(form).send().await;
        let unreachable = |why: String| OAuthError::Unreachable {
            upstream: self.upstream.clone(),
            why,
        };
        let response = sent.map_err(|e| unreachable(transport_failure(&e)))?;
        let status = response.status().as_u16();
        if status >= 500 {
            return Err(unreachable(format!("HTTP {status}")));
        }
        let body = bounded_body(response)
            .await
            .map_err(|e| unreachable(transport_failure(&e)))?;
        Ok((status, body))
    }

    fn refused(&self, status: u16, body: &[u8]) -> OAuthError {
        // Only the `error` code, and only when it is a plain token (RFC 6749 §5.2 charset):
        // never the description, which a server may fill with what it was sent.
        let code = serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
            .filter(|c| c.len() <= 64 && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
            .map(|c| format!(", error={c}"))
            .unwrap_or_default();
        OAuthError::Refused {
            upstream: self.upstream.clone(),
            status,
            code,
        }
    }

    /// The client secret, read from its file at each request (a rotated file is picked up).
    fn secret(&self) -> Result<Option<Secret>, OAuthError> {
        let Some(path) = &self.config.client_secret_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path).map_err(|e| OAuthError::Secret {
            upstream: self.upstream.clone(),
            why: format!("{}: {}", path.display(), e.kind()),
        })?;
        Ok(Some(Secret::new(text.trim())))
    }

    /// The token and revocation endpoints: `token_url`, or discovered from `issuer` once
    /// (a failed discovery is tried again by the next request).
    async fn endpoints(&self) -> Result<Arc<Endpoints>, OAuthError> {
        self.endpoints
            .get_or_try_init(|| async {
                match (&self.config.token_url, &self.config.issuer) {
                    (Some(t), _) => Ok(Arc::new(Endpoints {
                        token: self.parse_url(t)?,
                        revocation: None,
                    })),
                    (None, Some(issuer)) => self.discover(issuer).await.map(Arc::new),
                    (None, None) => Err(OAuthError::Invalid {
                        upstream: self.upstream.clone(),
                        why: "no issuer or token_url",
                    }),
                }
            })
            .await
            .cloned()
    }

    fn parse_url(&self, u: &str) -> Result<Url, OAuthError> {
        Url::parse(u).map_err(|_| OAuthError::Invalid {
            upstream: self.upstream.clone(),
            why: "an endpoint is not a URL",
        })
    }

    /// RFC 8414 §3 (the well-known path inserted before the issuer's path), then OpenID
    /// Connect Discovery (appended).
    async fn discover(&self, issuer: &str) -> Result<Endpoints, OAuthError> {
        let base = self.parse_url(issuer)?;
        let path = base.path().trim_end_matches('/').to_string();
        let mut tries = Vec::new();
        for (wk, insert) in [
            ("/.well-known/oauth-authorization-server", true),
            ("/.well-known/openid-configuration", false),
        ] {
            let mut u = base.clone();
            u.set_path(&if insert {
                format!("{wk}{path}")
            } else {
                format!("{path}{wk}")
            });
            tries.push(u);
        }
        let mut last = None;
        for u in tries {
            let got = self
                .http
                .get(u)
                .header(ACCEPT, "application/json")
                .send()
                .await;
            let response = match got {
                Ok(r) => r,
                Err(e) => {
                    last = Some(OAuthError::Unreachable {
                        upstream: self.upstream.clone(),
                        why: format!("discovery: {}", transport_failure(&e)),
                    });
                    continue;
                }
            };
            let status = response.status().as_u16();
            if status >= 500 {
                last = Some(OAuthError::Unreachable {
                    upstream: self.upstream.clone(),
                    why: format!("discovery: HTTP {status}"),
                });
                continue;
            }
            if status != 200 {
                continue;
            }
            let Ok(body) = bounded_body(response).await else {
                continue;
            };
            let Ok(meta) = serde_json::from_slice::<Value>(&body) else {
                continue;
            };
            let url_of = |k: &str| {
                meta.get(k)
                    .and_then(Value::as_str)
                    .and_then(|s| Url::parse(s).ok())
            };
            if let Some(token) = url_of("token_endpoint") {
                return Ok(Endpoints {
                    token,
                    revocation: url_of("revocation_endpoint"),
                });
            }
        }
        Err(last.unwrap_or(OAuthError::Invalid {
            upstream: self.upstream.clone(),
            why: "discovery found no token_endpoint",
        }))
    }
}

/// A transport failure in words (no URL's query, no body).
fn transport_failure(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "cannot connect".into()
    } else {
        format!("transport failure: {}", crate::tls::chain(e))
    }
}

async fn bounded_body(response: reqwest::Response) -> Result<Vec<u8>, reqwest::Error> {
    use futures::StreamExt;
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        let room = MAX_ANSWER_BYTES.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if room <= chunk.len() {
            break;
        }
    }
    Ok(body)
}
