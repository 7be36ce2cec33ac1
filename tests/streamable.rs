//! Streamable HTTP on /gw/<id>/mcp: the core assertions over every downstream transport
//! (legacy SSE, Streamable HTTP handshake era, stateless 2026-07-28) through one function,
//! then each transport's own rules. Real sockets on 127.0.0.1:0.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use gatehouse::{Registration, RegistrationSpec};
use serde_json::{json, Value};

const ACCEPT_BOTH: &str = "application/json, text/event-stream";

/// Splits an SSE body into (event, data, id) triples.
fn parse_sse(text: &str) -> Vec<(String, String, Option<String>)> {
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        let mut event = "message".to_string();
        let mut data = Vec::new();
        let mut id = None;
        let mut any = false;
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                event = v.trim().into();
                any = true;
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
                any = true;
            } else if let Some(v) = line.strip_prefix("id:") {
                id = Some(v.trim().to_string());
                any = true;
            }
        }
        if any {
            out.push((event, data.join("\n"), id));
        }
    }
    out
}

/// A raw Streamable HTTP client (either era) that shows status codes and headers.
pub struct HttpMcp {
    pub url: String,
    pub token: String,
    pub session: Option<String>,
    pub version: Option<String>,
    pub stateless: bool,
    next_id: i64,
    http: reqwest::Client,
}

impl HttpMcp {
    pub fn new(url: &str, token: &str) -> Self {
        HttpMcp {
            url: url.into(),
            token: token.into(),
            session: None,
            version: None,
            stateless: false,
            next_id: 0,
            http: http(),
        }
    }

    pub fn stateless(url: &str, token: &str) -> Self {
        let mut c = Self::new(url, token);
        c.stateless = true;
        c.version = Some("2026-07-28".into());
        c
    }

    pub async fn initialize(url: &str, token: &str, version: &str) -> Self {
        let mut c = Self::new(url, token);
        let (status, headers, body) = c
            .post(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{
                "protocolVersion": version, "capabilities": {}, "clientInfo": {"name":"t","version":"0"}}}))
            .await;
        assert_eq!(status, 200, "{body}");
        c.session = Some(headers["mcp-session-id"].to_str().unwrap().to_string());
        c.version = Some(version.into());
        let (status, _, body) = c
            .post(json!({"jsonrpc":"2.0","method":"notifications/initialized"}))
            .await;
        assert_eq!(status, 202);
        assert!(body.is_empty(), "202 has an empty body");
        c
    }

    pub fn builder(&self, method: reqwest::Method) -> reqwest::RequestBuilder {
        let mut b = self
            .http
            .request(method, &self.url)
            .bearer_auth(&self.token)
            .header("accept", ACCEPT_BOTH)
            .header("content-type", "application/json");
        if let Some(s) = &self.session {
            b = b.header("mcp-session-id", s);
        }
        if let Some(v) = &self.version {
            b = b.header("mcp-protocol-version", v);
        }
        b
    }

    /// A GET for the server-to-client stream.
    pub fn get_stream(&self) -> reqwest::RequestBuilder {
        let mut b = self
            .http
            .get(&self.url)
            .bearer_auth(&self.token)
            .header("accept", "text/event-stream");
        if let Some(s) = &self.session {
            b = b.header("mcp-session-id", s);
        }
        if let Some(v) = &self.version {
            b = b.header("mcp-protocol-version", v);
        }
        b
    }

    pub async fn post(&self, body: Value) -> (u16, reqwest::header::HeaderMap, String) {
        let mut b = self.builder(reqwest::Method::POST);
        if self.stateless {
            if let Some(m) = body.get("method").and_then(Value::as_str) {
                if body.get("id").is_some() {
                    b = b.header("mcp-method", m);
                }
            }
            if let Some(n) = body["params"]["name"].as_str() {
                b = b.header("mcp-name", n);
            }
        }
        let resp = b.json(&body).send().await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        (status, headers, resp.text().await.unwrap())
    }

    /// Adds the stateless `_meta` to params.
    pub fn with_meta(&self, mut params: Value) -> Value {
        if self.stateless {
            let meta = params
                .as_object_mut()
                .unwrap()
                .entry("_meta")
                .or_insert(json!({}));
            meta["io.modelcontextprotocol/protocolVersion"] = json!("2026-07-28");
            meta["io.modelcontextprotocol/clientCapabilities"] = json!({});
        }
        params
    }

    /// A request; returns the response and the notifications streamed before it.
    pub async fn request_with_notes(&mut self, method: &str, params: Value) -> (Value, Vec<Value>) {
        self.next_id += 1;
        let params = self.with_meta(params);
        let (status, headers, body) = self
            .post(json!({"jsonrpc":"2.0","id":self.next_id,"method":method,"params":params}))
            .await;
        let ct = headers
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        if ct.starts_with("text/event-stream") {
            assert_eq!(status, 200);
            let mut msgs: Vec<Value> = parse_sse(&body)
                .into_iter()
                .filter(|(_, d, _)| !d.is_empty())
                .map(|(_, d, _)| serde_json::from_str(&d).unwrap())
                .collect();
            let last = msgs.pop().expect("a response ends the stream");
            (last, msgs)
        } else {
            (
                serde_json::from_str(&body).unwrap_or(json!({"status": status})),
                vec![],
            )
        }
    }
}

/// One client over any of the three transports.
enum AnyClient {
    Sse(SseClient),
    Http(HttpMcp),
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Sse,
    Streamable,
    Stateless,
}

impl AnyClient {
    async fn connect(kind: Kind, reg: &Registration) -> AnyClient {
        match kind {
            Kind::Sse => {
                let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
                c.initialize().await;
                AnyClient::Sse(c)
            }
            Kind::Streamable => AnyClient::Http(
                HttpMcp::initialize(&reg.mcp_url(), reg.token(), "2025-06-18").await,
            ),
            Kind::Stateless => AnyClient::Http(HttpMcp::stateless(&reg.mcp_url(), reg.token())),
        }
    }

    async fn request_with_notes(&mut self, method: &str, params: Value) -> (Value, Vec<Value>) {
        match self {
            AnyClient::Sse(c) => c.request_with_notes(method, params).await,
            AnyClient::Http(c) => c.request_with_notes(method, params).await,
        }
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.request_with_notes(method, params).await.0
    }

    async fn tool_names(&mut self) -> Vec<String> {
        let r = self.request("tools/list", json!({})).await;
        r["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{r}"))
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    }
}

/// The core issue's assertions, for one downstream transport.
async fn standard_assertions(kind: Kind) {
    let tg = TestGateway::start();
    let a = tg
        .gateway
        .register(
            RegistrationSpec::new("alice")
                .with_tool(echo_tool("alpha", "A"))
                .with_tool(slow_tool("slow")),
        )
        .await
        .unwrap();
    let b = tg
        .gateway
        .register(RegistrationSpec::new("bob").with_tool(echo_tool("beta", "B")))
        .await
        .unwrap();
    let mut ca = AnyClient::connect(kind, &a).await;
    let mut cb = AnyClient::connect(kind, &b).await;

    // Each registration sees only its own tools, in a deterministic order.
    assert_eq!(ca.tool_names().await, vec!["alpha", "slow"], "{kind:?}");
    assert_eq!(cb.tool_names().await, vec!["beta"], "{kind:?}");
    // Calls are served and attributed; another registration's tool is unknown.
    let r = ca
        .request(
            "tools/call",
            json!({"name":"alpha","arguments":{"text":"hi"}}),
        )
        .await;
    assert_eq!(text_of(&r), "A:hi", "{kind:?} {r}");
    let r = cb.request("tools/call", json!({"name":"alpha"})).await;
    assert_eq!(r["error"]["code"], -32602, "{kind:?} {r}");
    // Progress is routed to the caller, before the result.
    let (r, notes) = ca
        .request_with_notes(
            "tools/call",
            json!({"name":"slow","arguments":{"ms":200},"_meta":{"progressToken":"p1"}}),
        )
        .await;
    assert_eq!(text_of(&r), "done", "{kind:?} {r}");
    assert!(
        notes
            .iter()
            .filter(|n| n["method"] == "notifications/progress")
            .all(|n| n["params"]["progressToken"] == "p1"),
        "{kind:?}"
    );
    assert_eq!(notes.len(), 10, "{kind:?}: ten progress notifications");
    // Unknown method.
    let r = ca.request("no/such/method", json!({})).await;
    assert_eq!(r["error"]["code"], -32601, "{kind:?} {r}");

    // A's token on B's endpoints: 401; no token: 401.
    for url in [b.sse_url(), b.mcp_url()] {
        let resp = http()
            .get(&url)
            .bearer_auth(a.token())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401, "{kind:?} {url}");
        let resp = http().get(&url).send().await.unwrap();
        assert_eq!(resp.status(), 401, "{kind:?} {url}");
    }

    // Audit: agent from the registration, transport recorded.
    let calls = tg.calls();
    let transport = match kind {
        Kind::Sse => "sse",
        Kind::Streamable => "streamable_http",
        Kind::Stateless => "stateless",
    };
    assert!(calls.len() >= 3, "{kind:?}");
    for c in &calls {
        assert_eq!(c.transport.as_deref(), Some(transport), "{kind:?}");
        let want = if c.registration_id.as_deref() == Some(a.id()) {
            "alice"
        } else {
            "bob"
        };
        assert_eq!(c.agent_id.as_deref(), Some(want), "{kind:?}");
    }
    if matches!(kind, Kind::Stateless) {
        assert_eq!(
            gatehouse::testing::sessions(&tg.gateway).len(),
            0,
            "stateless requests create no session"
        );
    } else {
        assert_eq!(
            gatehouse::testing::sessions(&tg.gateway).len(),
            2,
            "{kind:?}"
        );
    }

    // Release is immediate and total: every path answers 404, sessions are gone.
    let (a_mcp, a_token, a_id) = (a.mcp_url(), a.token().to_string(), a.id().to_string());
    a.release().await;
    let resp = http()
        .post(&a_mcp)
        .bearer_auth(&a_token)
        .header("accept", ACCEPT_BOTH)
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404, "{kind:?}");
    assert_eq!(
        gatehouse::testing::sessions(&tg.gateway).count_for(&a_id),
        0,
        "{kind:?}: no session of a released registration"
    );
    drop(cb);
    drop(ca);
    b.release().await;
}

#[tokio::test]
async fn standard_assertions_over_sse() {
    standard_assertions(Kind::Sse).await;
}

#[tokio::test]
async fn standard_assertions_over_streamable_http() {
    standard_assertions(Kind::Streamable).await;
}

#[tokio::test]
async fn standard_assertions_over_stateless() {
    standard_assertions(Kind::Stateless).await;
}

/// Ids are routed directly only when plain; an id a client percent-encodes goes through the
/// router, which decodes it: the registration is served the same either way.
#[tokio::test]
async fn a_percent_encoded_id_reaches_the_same_registration() {
    let tg = TestGateway::start();
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("enc").with_tool(echo_tool("echo", "e")))
        .await
        .unwrap();
    let id = reg.id();
    let first = id.as_bytes()[0];
    let encoded = format!("%{first:02X}{}", &id[1..]);
    let url = reg.mcp_url().replace(id, &encoded);
    assert!(url.contains(&format!("/gw/%{first:02X}")), "{url}");
    let mut c = HttpMcp::initialize(&url, reg.token(), "2025-06-18").await;
    let (r, _) = c
        .request_with_notes(
            "tools/call",
            json!({"name": "echo", "arguments": {"text": "x"}}),
        )
        .await;
    assert_eq!(text_of(&r), "e:x", "{r}");
    let calls = tg.calls();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].registration_id.as_deref(), Some(id));
}

#[tokio::test]
async fn handshake_era_session_rules() {
    let tg = TestGateway::start();
    let a = tg
        .gateway
        .register(RegistrationSpec::new("a").with_tool(echo_tool("e", "A")))
        .await
        .unwrap();
    let b = tg
        .gateway
        .register(RegistrationSpec::new("b").with_tool(echo_tool("e", "B")))
        .await
        .unwrap();
    let mut c = HttpMcp::initialize(&a.mcp_url(), a.token(), "2025-06-18").await;
    let sid = c.session.clone().unwrap();
    assert!(sid.len() >= 22 && sid.bytes().all(|b| (0x21..=0x7e).contains(&b)));
    let ping = json!({"jsonrpc":"2.0","id":9,"method":"ping"});
    assert_eq!(c.post(ping.clone()).await.0, 200);

    // Missing session -> 400; unknown -> 404.
    let mut no = HttpMcp::new(&a.mcp_url(), a.token());
    assert_eq!(no.post(ping.clone()).await.0, 400);
    no.session = Some("not-a-session".into());
    assert_eq!(no.post(ping.clone()).await.0, 404);
    // A's session under B (with B's valid token) -> 404.
    let mut foreign = HttpMcp::new(&b.mcp_url(), b.token());
    foreign.session = Some(sid.clone());
    assert_eq!(foreign.post(ping.clone()).await.0, 404);
    // Accept must list both; Content-Type must be JSON.
    let raw = |accept: &'static str, ct: &'static str| {
        http()
            .post(a.mcp_url())
            .bearer_auth(a.token())
            .header("mcp-session-id", &sid)
            .header("accept", accept)
            .header("content-type", ct)
            .body(ping.to_string())
            .send()
    };
    assert_eq!(
        raw("application/json", "application/json")
            .await
            .unwrap()
            .status(),
        406
    );
    assert_eq!(
        raw("text/event-stream", "application/json")
            .await
            .unwrap()
            .status(),
        406
    );
    assert_eq!(raw(ACCEPT_BOTH, "text/plain").await.unwrap().status(), 415);
    assert_eq!(
        raw(ACCEPT_BOTH, "application/json").await.unwrap().status(),
        200
    );
    // MCP-Protocol-Version: unsupported -> 400; absent -> accepted (2025-03-26 assumed).
    c.version = Some("1999-01-01".into());
    assert_eq!(c.post(ping.clone()).await.0, 400);
    c.version = None;
    assert_eq!(c.post(ping.clone()).await.0, 200);
    c.version = Some("2025-06-18".into());
    // A response from the client -> 202 empty.
    let (s, _, body) = c.post(json!({"jsonrpc":"2.0","id":"x","result":{}})).await;
    assert_eq!((s, body.as_str()), (202, ""));
    // A fast call is answered as JSON.
    let (s, h, body) = c
        .post(json!({"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"e","arguments":{"text":"j"}}}))
        .await;
    assert_eq!(s, 200);
    assert_eq!(h["content-type"], "application/json");
    assert!(body.contains("A:j"));
    // Batches: refused at 2025-06-18.
    let batch = json!([ping.clone(), {"jsonrpc":"2.0","id":10,"method":"tools/list"}]);
    assert_eq!(c.post(batch.clone()).await.0, 400);

    // GET opens the server-to-client stream; a second GET is refused (one stream).
    let get = c.get_stream().send().await.unwrap();
    assert_eq!(get.status(), 200);
    assert_eq!(get.headers()["x-accel-buffering"], "no");
    let (mut events, task) = spawn_sse_reader(get);
    let second = c.get_stream().send().await.unwrap();
    assert_eq!(second.status(), 409);
    let n = gatehouse::testing::notify_tools_list_changed(&tg.gateway, a.id()).await;
    assert_eq!(n, 1, "one session, one stream");
    let (_, data) = tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(data.contains("notifications/tools/list_changed"), "{data}");
    // DELETE ends the session; the GET stream ends; the id answers 404.
    let resp = c.builder(reqwest::Method::DELETE).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let (ev, _) = tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ev, "closed");
    task.abort();
    assert_eq!(c.post(ping.clone()).await.0, 404);
    assert_eq!(gatehouse::testing::sessions(&tg.gateway).len(), 0);

    // 2025-03-26: batches are accepted.
    let old = HttpMcp::initialize(&a.mcp_url(), a.token(), "2025-03-26").await;
    let (s, _, body) = old.post(batch).await;
    assert_eq!(s, 200, "{body}");
    let replies: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(replies.as_array().unwrap().len(), 2);
    // Priming event on a POST's SSE response only for clients at >= 2025-11-25.
    let tg2 = TestGateway::start();
    let s = tg2
        .gateway
        .register(RegistrationSpec::new("s").with_tool(slow_tool("slow")))
        .await
        .unwrap();
    for (version, primed) in [("2025-06-18", false), ("2025-11-25", true)] {
        let c = HttpMcp::initialize(&s.mcp_url(), s.token(), version).await;
        let (status, h, body) = c
            .post(
                json!({"jsonrpc":"2.0","id":4,"method":"tools/call","params":{
                "name":"slow","arguments":{"ms":100},"_meta":{"progressToken":"t"}}}),
            )
            .await;
        assert_eq!(status, 200);
        assert_eq!(
            h["content-type"], "text/event-stream",
            "progress switches to SSE"
        );
        let events = parse_sse(&body);
        let first_is_priming = events[0].2.is_some() && events[0].1.is_empty();
        assert_eq!(first_is_priming, primed, "{version}: {body}");
        assert_eq!(
            events.iter().filter(|e| e.1.is_empty()).count(),
            usize::from(primed)
        );
        assert!(
            events.last().unwrap().1.contains("\"id\":4"),
            "the response ends the stream"
        );
    }
    // Handshake era: a dropped response stream is not a cancellation (the call completes).
    let c = HttpMcp::initialize(&s.mcp_url(), s.token(), "2025-06-18").await;
    let mut resp = c
        .builder(reqwest::Method::POST)
        .json(
            &json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{
            "name":"slow","arguments":{"ms":400},"_meta":{"progressToken":"d"}}}),
        )
        .send()
        .await
        .unwrap();
    assert!(resp.chunk().await.unwrap().is_some());
    drop(resp);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let outcomes: Vec<_> = tg2
        .calls()
        .iter()
        .filter_map(|c| c.outcome.clone())
        .collect();
    assert_eq!(
        outcomes,
        vec!["ok", "ok", "ok"],
        "not cancelled by the disconnect"
    );
    // Priming event on GET only for clients at >= 2025-11-25.
    for (version, primed) in [("2025-03-26", false), ("2025-11-25", true)] {
        let c = HttpMcp::initialize(&a.mcp_url(), a.token(), version).await;
        let mut resp = c.get_stream().send().await.unwrap();
        let first = tokio::time::timeout(Duration::from_millis(300), resp.chunk())
            .await
            .ok()
            .and_then(|r| r.ok().flatten());
        let got = first.is_some_and(|b| String::from_utf8_lossy(&b).starts_with("id: "));
        assert_eq!(got, primed, "{version}");
    }
}

#[tokio::test]
async fn stateless_rules() {
    let tg = TestGateway::with(|c| c.keepalive_s = 1);
    let a = tg
        .gateway
        .register(
            RegistrationSpec::new("a")
                .with_tool(echo_tool("e", "A"))
                .with_tool(slow_tool("slow")),
        )
        .await
        .unwrap();
    let c = HttpMcp::stateless(&a.mcp_url(), a.token());
    let meta = json!({"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}});
    // server/discover
    let (s, _, body) = c
        .post(json!({"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":meta}}))
        .await;
    assert_eq!(s, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let r = &v["result"];
    assert!(r["supportedVersions"]
        .as_array()
        .unwrap()
        .contains(&json!("2026-07-28")));
    assert!(r["capabilities"]["tools"].is_object());
    assert_eq!(r["serverInfo"]["name"], "gatehouse");
    assert_eq!(r["resultType"], "complete");
    assert_eq!(r["cacheScope"], "private");
    // tools/list carries resultType, ttlMs and cacheScope.
    let (s, _, body) = c
        .post(json!({"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":meta}}))
        .await;
    assert_eq!(s, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["result"]["resultType"], "complete");
    assert!(v["result"]["ttlMs"].is_u64());
    assert_eq!(v["result"]["cacheScope"], "private");

    let raw = |headers: Vec<(&'static str, String)>, body: Value| {
        let mut b = http()
            .post(a.mcp_url())
            .bearer_auth(a.token())
            .header("accept", ACCEPT_BOTH);
        for (k, v) in headers {
            b = b.header(k, v);
        }
        async move {
            let r = b.json(&body).send().await.unwrap();
            let s = r.status().as_u16();
            (s, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let call = json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"e","arguments":{"text":"x"},"_meta":meta}});
    let good = || {
        vec![
            ("mcp-protocol-version", "2026-07-28".to_string()),
            ("mcp-method", "tools/call".to_string()),
            ("mcp-name", "e".to_string()),
        ]
    };
    let (s, v) = raw(good(), call.clone()).await;
    assert_eq!((s, text_of(&v)), (200, "A:x".to_string()));
    assert_eq!(v["result"]["resultType"], "complete");
    // The base64 form of a header is decoded before comparing ("e" = "ZQ==").
    let mut h = good();
    h[2].1 = "=?base64?ZQ==?=".into();
    assert_eq!(raw(h, call.clone()).await.0, 200);
    // Mismatches -> 400 -32020: method, name, base64 name, version, missing header.
    for (i, bad) in [
        (1, "tools/list"),
        (2, "f"),
        (2, "=?base64?Zg==?="),
        (0, "2025-06-18"),
    ] {
        let mut h = good();
        h[i].1 = bad.into();
        let (s, v) = raw(h, call.clone()).await;
        assert_eq!(
            (s, v["error"]["code"].clone()),
            (400, json!(-32020)),
            "{bad}"
        );
    }
    let mut h = good();
    h.remove(2);
    assert_eq!(raw(h, call.clone()).await.1["error"]["code"], -32020);
    // Unsupported version -> 400 -32022 with data.supported.
    let mut bad_version = call.clone();
    bad_version["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!("2099-01-01");
    let mut h = good();
    h[0].1 = "2099-01-01".into();
    let (s, v) = raw(h, bad_version).await;
    assert_eq!((s, v["error"]["code"].clone()), (400, json!(-32022)));
    assert!(v["error"]["data"]["supported"]
        .as_array()
        .unwrap()
        .contains(&json!("2026-07-28")));
    // Missing required _meta -> 400 -32602.
    let mut no_meta = call.clone();
    no_meta["params"].as_object_mut().unwrap().remove("_meta");
    let (s, v) = raw(good(), no_meta).await;
    assert_eq!((s, v["error"]["code"].clone()), (400, json!(-32602)));
    let mut no_caps = call.clone();
    no_caps["params"]["_meta"]
        .as_object_mut()
        .unwrap()
        .remove("io.modelcontextprotocol/clientCapabilities");
    assert_eq!(raw(good(), no_caps).await.1["error"]["code"], -32602);
    // Unknown method -> 404 -32601 (ping is gone in 2026-07-28).
    let ping = json!({"jsonrpc":"2.0","id":6,"method":"ping","params":{"_meta":meta}});
    let h = vec![
        ("mcp-protocol-version", "2026-07-28".to_string()),
        ("mcp-method", "ping".to_string()),
    ];
    let (s, v) = raw(h, ping).await;
    assert_eq!((s, v["error"]["code"].clone()), (404, json!(-32601)));
    assert_eq!(
        gatehouse::testing::sessions(&tg.gateway).len(),
        0,
        "no session was created"
    );

    // Closing the response stream cancels the call.
    let slow = json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow","arguments":{"ms":3000},"_meta":{
        "progressToken": 1, "io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}});
    let mut h = good();
    h[2].1 = "slow".into();
    let mut b = http()
        .post(a.mcp_url())
        .bearer_auth(a.token())
        .header("accept", ACCEPT_BOTH);
    for (k, v) in h {
        b = b.header(k, v);
    }
    let mut resp = b.json(&slow).send().await.unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("notifications/progress"));
    drop(resp);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let cancelled = tg.calls().iter().any(|c| {
            c.tool.as_deref() == Some("slow") && c.outcome.as_deref() == Some("cancelled")
        });
        if cancelled {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the call was not cancelled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
