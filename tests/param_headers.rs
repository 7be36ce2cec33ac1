//! Issue 52 item 2 (`Mcp-Param-{Name}`, 2026-07-28 / SEP-2243) and item 3's third line
//! (`Mcp-Method` on notifications), end to end: a 2026-07-28 HTTP upstream — a small real
//! HTTP server in this test on 127.0.0.1:0, which records every POST's headers (the fastmcp
//! tasks peer cannot be made to show the headers it received) — whose tools carry
//! `x-mcp-header` annotations, some breaking the rules; a 2026 client whose headers are right
//! or wrong.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use common::*;
use gatehouse::RegistrationSpec;
use serde_json::{json, Value};

/// What the upstream received: each POST's JSON-RPC method (or `-` for none) and headers.
type Seen = Arc<Mutex<Vec<(String, HeaderMap)>>>;

/// The upstream's state: what it saw, and whether its tools changed (announced on its
/// `subscriptions/listen` streams when set).
#[derive(Clone)]
struct Peer {
    seen: Seen,
    changed: Arc<tokio::sync::watch::Sender<bool>>,
}

fn tools(changed: bool) -> Value {
    // A change: `plain` is removed (it leaves the registrations' lists).
    let plain = if changed { "gone" } else { "plain" };
    json!([
        {"name": "region", "inputSchema": {"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "n": {"type": "integer", "x-mcp-header": "N"},
            "opts": {"type": "object", "properties": {
                "on": {"type": "boolean", "x-mcp-header": "On"}}},
            "greeting": {"type": "string", "x-mcp-header": "Greeting"},
            "q": {"type": "string"}}}},
        {"name": plain, "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}}},
        {"name": "slow", "inputSchema": {"type": "object", "properties": {}}},
        {"name": "bad_number", "inputSchema": {"type": "object", "properties": {
            "x": {"type": "number", "x-mcp-header": "X"}}}},
        {"name": "bad_items", "inputSchema": {"type": "object", "properties": {
            "xs": {"type": "array", "items": {"type": "string", "x-mcp-header": "X"}}}}},
        {"name": "bad_dup", "inputSchema": {"type": "object", "properties": {
            "a": {"type": "string", "x-mcp-header": "Same"},
            "b": {"type": "string", "x-mcp-header": "same"}}}},
        {"name": "bad_ref", "inputSchema": {"type": "object",
            "properties": {"a": {"$ref": "#/$defs/a"}},
            "$defs": {"a": {"type": "string", "x-mcp-header": "A"}}}},
        {"name": "bad_object", "inputSchema": {"type": "object", "properties": {
            "o": {"type": "object", "x-mcp-header": "O"}}}}
    ])
}

async fn upstream_post(
    axum::extract::State(peer): axum::extract::State<Peer>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> axum::response::Response {
    let method = body["method"].as_str().unwrap_or("-").to_string();
    peer.seen.lock().unwrap().push((method.clone(), headers));
    let Some(id) = body.get("id").cloned() else {
        return StatusCode::ACCEPTED.into_response();
    };
    let result = match method.as_str() {
        "server/discover" => json!({
            "resultType": "complete",
            "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {"listChanged": true}},
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "param-peer", "version": "1"}}
        }),
        "tools/list" => {
            let changed = *peer.changed.borrow();
            json!({"resultType": "complete", "tools": tools(changed), "ttlMs": 0, "cacheScope": "private"})
        }
        "subscriptions/listen" => return listen_stream(&peer, &body),
        "tools/call" => {
            if body["params"]["name"] == "slow" {
                tokio::time::sleep(Duration::from_secs(4)).await;
            }
            json!({"resultType": "complete", "content": [{"type": "text", "text": "ok"}]})
        }
        _ => {
            return axum::Json(json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32601, "message": "method not found"}}))
            .into_response()
        }
    };
    axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response()
}

/// A `subscriptions/listen` answer: the acknowledgement, then `tools/list_changed` once the
/// tools changed; open until the client closes it.
fn listen_stream(peer: &Peer, body: &Value) -> axum::response::Response {
    let event = |v: Value| -> Result<bytes::Bytes, std::convert::Infallible> {
        Ok(bytes::Bytes::from(format!("event: message\ndata: {v}\n\n")))
    };
    let ack = event(
        json!({"jsonrpc": "2.0", "method": "notifications/subscriptions/acknowledged",
        "params": {"notifications": body["params"]["notifications"].clone()}}),
    );
    let mut changed = peer.changed.subscribe();
    let announced = async move {
        let _ = changed.wait_for(|c| *c).await;
        event(json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}))
    };
    use futures::StreamExt;
    let stream = futures::stream::iter([ack])
        .chain(futures::stream::once(announced))
        .chain(futures::stream::pending());
    axum::response::Response::builder()
        .header("content-type", "text/event-stream")
        .body(axum::body::Body::from_stream(stream))
        .unwrap()
}

/// The upstream: its URL and state. Served until the test's runtime ends.
async fn upstream() -> (String, Peer) {
    let peer = Peer {
        seen: Arc::default(),
        changed: Arc::new(tokio::sync::watch::channel(false).0),
    };
    let app = axum::Router::new()
        .route("/mcp", axum::routing::post(upstream_post))
        .with_state(peer.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://127.0.0.1:{port}/mcp"), peer)
}

async fn gateway() -> (TestGateway, Seen) {
    let (tg, peer) = gateway_peer().await;
    (tg, peer.seen)
}

async fn gateway_peer() -> (TestGateway, Peer) {
    let (url, peer) = upstream().await;
    let up: gatehouse::config::UpstreamConfig = toml::from_str(&format!(
        "id = \"p\"\nurl = \"{url}\"\nsharing = \"shared\"\ncall_timeout_s = 1\nprotocol = \"2026-07-28\"\n"
    ))
    .unwrap();
    let tg = TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.upstreams = vec![up];
    });
    (tg, peer)
}

/// One stateless 2026-07-28 `tools/call` with the standard headers and `extra` ones.
async fn call(
    reg: &gatehouse::Registration,
    tool: &str,
    arguments: Value,
    extra: &[(&str, &str)],
) -> (u16, Value) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": tool, "arguments": arguments,
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {}}}});
    let mut b = http()
        .post(reg.mcp_url())
        .bearer_auth(reg.token())
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool);
    for (h, v) in extra {
        b = b.header(*h, *v);
    }
    let r = b.json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    // A JSON body, or the final message of an SSE one.
    let v = serde_json::from_str(&text).unwrap_or_else(|_| {
        text.lines()
            .rev()
            .filter_map(|l| l.strip_prefix("data:"))
            .find_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .unwrap_or(Value::Null)
    });
    (status, v)
}

fn last_call(seen: &Seen, method: &str) -> HeaderMap {
    seen.lock()
        .unwrap()
        .iter()
        .rev()
        .find(|(m, _)| m == method)
        .map(|(_, h)| h.clone())
        .unwrap_or_else(|| panic!("the upstream saw no {method}"))
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name).map(|v| v.to_str().unwrap().to_string())
}

async fn registered() -> (TestGateway, Seen, gatehouse::Registration) {
    let (tg, seen) = gateway().await;
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("agent-p").grant("p.*"))
        .await
        .unwrap();
    (tg, seen, reg)
}

const ARGS: &str =
    r#"{"region": "us-west1", "n": 42, "opts": {"on": true}, "greeting": "Hello, 世界", "q": "x"}"#;

/// The headers a right client sends for [`ARGS`].
const RIGHT: [(&str, &str); 4] = [
    ("mcp-param-region", "us-west1"),
    ("Mcp-Param-N", "42"),
    ("MCP-PARAM-ON", "true"),
    ("mcp-param-greeting", "=?base64?SGVsbG8sIOS4lueVjA==?="),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_whose_annotations_break_the_rules_are_left_out() {
    let (_tg, _seen, reg) = registered().await;
    // Tools whose annotations break the rules are left out; the others are served, their
    // annotations intact.
    let listed = stateless(&reg.mcp_url(), reg.token(), 1, "tools/list", json!({})).await;
    let mut names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    names.sort();
    assert_eq!(names, ["p.plain", "p.region", "p.slow"], "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotated_arguments_are_mirrored_to_a_2026_upstream() {
    let (_tg, seen, reg) = registered().await;
    let args: Value = serde_json::from_str(ARGS).unwrap();
    // A 2026 client with the right headers: the call passes, and the upstream gets the
    // arguments mirrored (base64 where not plain; none for an absent argument).
    let (status, v) = call(&reg, "p.region", args, &RIGHT).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["result"]["content"][0]["text"], "ok", "{v}");
    let h = last_call(&seen, "tools/call");
    assert_eq!(header(&h, "mcp-method").as_deref(), Some("tools/call"));
    assert_eq!(header(&h, "mcp-name").as_deref(), Some("region"));
    assert_eq!(header(&h, "mcp-param-region").as_deref(), Some("us-west1"));
    assert_eq!(header(&h, "mcp-param-n").as_deref(), Some("42"));
    assert_eq!(header(&h, "mcp-param-on").as_deref(), Some("true"));
    assert_eq!(
        header(&h, "mcp-param-greeting").as_deref(),
        Some("=?base64?SGVsbG8sIOS4lueVjA==?=")
    );

    // Absent and null arguments: no header either way.
    let (status, v) = call(
        &reg,
        "p.region",
        json!({"region": "eu", "n": null}),
        &[("mcp-param-region", "eu")],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let h = last_call(&seen, "tools/call");
    assert_eq!(header(&h, "mcp-param-region").as_deref(), Some("eu"));
    assert!(h.get("mcp-param-n").is_none() && h.get("mcp-param-on").is_none());

    // A tool without annotations needs none.
    let (status, v) = call(&reg, "p.plain", json!({"q": "x"}), &[]).await;
    assert_eq!(status, 200, "{v}");
    assert!(last_call(&seen, "tools/call")
        .keys()
        .all(|k| !k.as_str().starts_with("mcp-param-")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_client_whose_param_headers_are_wrong_gets_400_and_32020() {
    let (_tg, seen, reg) = registered().await;
    let args: Value = serde_json::from_str(ARGS).unwrap();
    let right = RIGHT;
    // Right headers pass.
    let (status, v) = call(&reg, "p.region", args.clone(), &right).await;
    assert_eq!(status, 200, "{v}");

    // Wrong headers: 400 and -32020, and the upstream is not called.
    let calls_before = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(m, _)| m == "tools/call")
        .count();
    let wrong: [(&str, Vec<(&str, &str)>); 5] = [
        ("missing", right[1..].to_vec()),
        ("mismatched", {
            let mut w = right.to_vec();
            w[0] = ("mcp-param-region", "us-east1");
            w
        }),
        ("integer mismatched", {
            let mut w = right.to_vec();
            w[1] = ("mcp-param-n", "43");
            w
        }),
        ("badly encoded", {
            let mut w = right.to_vec();
            w[3] = ("mcp-param-greeting", "=?base64?***?=");
            w
        }),
        ("decoded but different", {
            let mut w = right.to_vec();
            w[3] = ("mcp-param-greeting", "=?base64?SGVsbG8=?=");
            w
        }),
    ];
    for (what, headers) in &wrong {
        let (status, v) = call(&reg, "p.region", args.clone(), headers).await;
        assert_eq!(status, 400, "{what}: {v}");
        assert_eq!(v["error"]["code"], -32020, "{what}: {v}");
        assert_eq!(v["id"], 1, "{what}: {v}");
    }
    // A header sent for an argument that has no value.
    let (status, v) = call(&reg, "p.region", json!({}), &[("mcp-param-region", "x")]).await;
    assert_eq!((status, &v["error"]["code"]), (400, &json!(-32020)), "{v}");
    let calls_after = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(m, _)| m == "tools/call")
        .count();
    assert_eq!(
        calls_before, calls_after,
        "a refused call reached the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_to_a_2026_http_upstream_carries_mcp_method() {
    let (tg, seen) = gateway().await;
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("agent-p").grant("p.*"))
        .await
        .unwrap();
    // The call outlives `call_timeout_s = 1`: the gateway gives up on it and tells the
    // upstream with `notifications/cancelled`.
    let (_, v) = call(&reg, "p.slow", json!({}), &[]).await;
    assert!(
        v.get("error").is_some() || v["result"]["isError"] == true,
        "{v}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let h = loop {
        let found = seen
            .lock()
            .unwrap()
            .iter()
            .find(|(m, _)| m == "notifications/cancelled")
            .map(|(_, h)| h.clone());
        if let Some(h) = found {
            break h;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no notifications/cancelled reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        header(&h, "mcp-method").as_deref(),
        Some("notifications/cancelled")
    );
    assert_eq!(
        header(&h, "mcp-protocol-version").as_deref(),
        Some("2026-07-28")
    );
    assert!(h.get("mcp-name").is_none());
}

/// The `data:` messages of an SSE response, as they come.
fn messages(resp: reqwest::Response) -> tokio::sync::mpsc::Receiver<Value> {
    use futures::StreamExt;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let mut body = resp.bytes_stream();
        let mut buf = String::new();
        while let Some(Ok(chunk)) = body.next().await {
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let event: String = buf.drain(..end + 2).collect();
                for l in event.lines() {
                    if let Some(v) = l
                        .strip_prefix("data:")
                        .and_then(|d| serde_json::from_str::<Value>(d.trim()).ok())
                    {
                        if tx.send(v).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    });
    rx
}

/// Issue 52 item 3, second line: a 2026-07-28 HTTP upstream announces list changes only on a
/// `subscriptions/listen` stream; the gateway keeps one open, and a change it carries reaches
/// the registrations granted the upstream (here a 2026 client's own listen stream).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_upstreams_list_change_reaches_registrations_through_subscriptions_listen() {
    let (tg, peer) = gateway_peer().await;
    let seen = peer.seen.clone();
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("agent-p").grant("p.*"))
        .await
        .unwrap();
    let listed = stateless(&reg.mcp_url(), reg.token(), 1, "tools/list", json!({})).await;
    assert!(listed["result"]["tools"].is_array(), "{listed}");

    // The gateway opened `subscriptions/listen` upstream, with its mirrored method.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let h = loop {
        let found = seen
            .lock()
            .unwrap()
            .iter()
            .find(|(m, _)| m == "subscriptions/listen")
            .map(|(_, h)| h.clone());
        if let Some(h) = found {
            break h;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gateway opened no subscriptions/listen toward the 2026 upstream"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        header(&h, "mcp-method").as_deref(),
        Some("subscriptions/listen")
    );

    // A 2026 client listens to the gateway.
    let r = http()
        .post(reg.mcp_url())
        .bearer_auth(reg.token())
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "subscriptions/listen")
        .json(
            &json!({"jsonrpc": "2.0", "id": 9, "method": "subscriptions/listen", "params": {
            "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}},
            "notifications": {"toolsListChanged": true}}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut rx = messages(r);
    let ack = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        ack["method"], "notifications/subscriptions/acknowledged",
        "{ack}"
    );

    // The upstream's tools change, announced on its listen stream only.
    peer.changed.send_replace(true);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let m = tokio::time::timeout(left, rx.recv())
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| {
                let methods: Vec<String> = seen
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(m, _)| m.clone())
                    .collect();
                panic!("the client heard no tools/list_changed; the upstream saw {methods:?}")
            });
        if m["method"] == "notifications/tools/list_changed" {
            break;
        }
    }
    let lists = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|(m, _)| m == "tools/list")
        .count();
    assert!(
        lists >= 2,
        "the catalog was not fetched again ({lists} tools/list)"
    );
}

/// tests/fixtures/updates2026_server.py (the official Python SDK's `MCPServer`, 2026-07-28)
/// over HTTP on a free port, as upstream `u`; killed on drop.
async fn sdk_2026_upstream() -> (tokio::process::Child, gatehouse::config::UpstreamConfig) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = tokio::process::Command::new(peers::peer(".venv-fastmcp-tasks/bin/python"))
        .arg(repo_root().join("tests/fixtures/updates2026_server.py"))
        .arg(port.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut up = false;
    for _ in 0..300 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "updates2026_server.py {port} did not listen");
    let config = toml::from_str(&format!(
        "id = \"u\"\nurl = \"http://127.0.0.1:{port}/mcp\"\nsharing = \"shared\"\ncall_timeout_s = 30\nprotocol = \"2026-07-28\"\n"
    ))
    .unwrap();
    (server, config)
}

/// The `notifications/resources/updated` for `uri` among `notes`.
fn updated(notes: &[Value], uri: &str) -> bool {
    notes
        .iter()
        .any(|n| n["method"] == "notifications/resources/updated" && n["params"]["uri"] == uri)
}

/// Issue 52 item 3 (second line, resource updates): a 2025-era session subscribes to a
/// resource of a 2026-07-28 upstream (which has no `resources/subscribe`); the gateway asks
/// for it in `resourceSubscriptions` on its `subscriptions/listen` stream, and the upstream's
/// update reaches that session only (not a session that did not subscribe, nor for another URI).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_upstreams_resource_updates_reach_the_subscribed_sessions() {
    let (_server, up) = sdk_2026_upstream().await;
    let tg = TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.upstreams = vec![up];
    });
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("agent-u").grant("u.*"))
        .await
        .unwrap();
    let mut a = SseClient::connect(&reg.sse_url(), reg.token()).await;
    let init = a.initialize().await;
    assert_eq!(
        init["result"]["capabilities"]["resources"]["subscribe"], true,
        "{init}"
    );
    let mut b = SseClient::connect(&reg.sse_url(), reg.token()).await;
    b.initialize().await;

    let r = a
        .request("resources/subscribe", json!({"uri": "note://a"}))
        .await;
    assert_eq!(r["result"], json!({}), "{r}");

    // The listen stream reopens with the URI shortly after: touched until heard (bounded).
    let mut heard = Vec::new();
    for _ in 0..20 {
        let (r, mut notes) = a
            .request_with_notes(
                "tools/call",
                json!({"name": "u.touch", "arguments": {"uri": "note://a"}}),
            )
            .await;
        assert_eq!(r["result"]["content"][0]["text"], "touched:note://a", "{r}");
        while let Some(n) = a.next_message(1).await {
            notes.push(n);
        }
        if updated(&notes, "note://a") {
            heard = notes;
            break;
        }
    }
    assert!(
        updated(&heard, "note://a"),
        "the subscribed session never heard note://a's update"
    );
    // Another URI (not subscribed) is not delivered to it.
    let (_, mut notes) = a
        .request_with_notes(
            "tools/call",
            json!({"name": "u.touch", "arguments": {"uri": "note://b"}}),
        )
        .await;
    while let Some(n) = a.next_message(1).await {
        notes.push(n);
    }
    assert!(!updated(&notes, "note://b"), "{notes:?}");
    // The session that did not subscribe heard nothing of it.
    let mut other = Vec::new();
    while let Some(n) = b.next_message(1).await {
        other.push(n);
    }
    assert!(!updated(&other, "note://a"), "{other:?}");
}

/// `tools/call` u.ask on a legacy-SSE session, answering the server requests it is sent with
/// `answer` (None: left unanswered): the call's response and the methods it was asked.
async fn ask_through(c: &mut SseClient, answer: Option<Value>) -> (Value, Vec<String>) {
    let call = json!({"name": "u.ask", "arguments": {"what": "x"}});
    ask_with(c, "tools/call", call, answer).await
}

/// `method` with `params` (id "call-1") on a legacy-SSE session, answering as [`ask_through`].
async fn ask_with(
    c: &mut SseClient,
    method: &str,
    params: Value,
    answer: Option<Value>,
) -> (Value, Vec<String>) {
    let resp = c
        .post(json!({"jsonrpc": "2.0", "id": "call-1", "method": method, "params": params}))
        .await;
    assert_eq!(resp.status(), 202);
    let mut asked = Vec::new();
    loop {
        let msg = c.next_message(30).await.expect("no reply to tools/call");
        if msg["id"] == "call-1" {
            return (msg, asked);
        }
        if let Some(m) = msg["method"].as_str().filter(|_| msg.get("id").is_some()) {
            asked.push(m.to_string());
            let what = params["arguments"]["what"].as_str().unwrap_or("r");
            assert_eq!(
                msg["params"]["message"],
                format!("Proceed with {what}?"),
                "{msg}"
            );
            if let Some(a) = &answer {
                let r = c
                    .post(json!({"jsonrpc": "2.0", "id": msg["id"], "result": a}))
                    .await;
                assert_eq!(r.status(), 202);
            }
        }
    }
}

/// Issue 52 item 3 (first line): a 2026-07-28 upstream (the Python SDK's `MCPServer`) answers
/// a plain `tools/call` `input_required` with an elicitation. A 2025-era session is sent the
/// `elicitation/create` itself, and its answer goes back in the retried call (the tool says
/// what it received); a session that declared no elicitation is answered `decline` for it; a
/// stateless 2026-07-28 client gets the `input_required` answer as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_upstreams_input_required_is_asked_of_2025_clients() {
    let (_server, up) = sdk_2026_upstream().await;
    let tg = TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.upstreams = vec![up];
    });
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("agent-u").grant("u.*"))
        .await
        .unwrap();

    let mut a = SseClient::connect(&reg.sse_url(), reg.token()).await;
    a.initialize_with(json!({"elicitation": {}})).await;
    let accept = json!({"action": "accept", "content": {"ok": true}});
    let (r, asked) = ask_through(&mut a, Some(accept)).await;
    assert_eq!(asked, ["elicitation/create"], "{r}");
    assert_eq!(
        r["result"]["content"][0]["text"], "ask:x:accept:{\"ok\": true}",
        "{r}"
    );

    let mut b = SseClient::connect(&reg.sse_url(), reg.token()).await;
    b.initialize().await;
    let (r, asked) = ask_through(&mut b, None).await;
    assert!(asked.is_empty(), "{asked:?}");
    assert_eq!(
        r["result"]["content"][0]["text"], "ask:x:decline:null",
        "{r}"
    );

    // The official Python SDK's client (handshake-era Streamable HTTP), its elicitation
    // callback answering.
    let cells = json!([{"transport": "streamable", "url": reg.mcp_url(), "token": reg.token(),
        "timeout": 60, "elicit": {"ok": true},
        "steps": [{"name": "ask", "tool": "u.ask", "args": {"what": "py"}, "timeout": 30}]}]);
    let out = common::peers::batch(".venv", "py_client.py", &cells).await;
    let out = common::peers::ok("py_client.py", &out[0]);
    assert_eq!(out["asked"], json!(["elicitation"]), "{out}");
    assert_eq!(
        common::peers::step_text(&out["steps"]["ask"]),
        "ask:py:accept:{\"ok\": true}",
        "{out}"
    );

    let (status, r) = call(&reg, "u.ask", json!({"what": "x"}), &[]).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
    assert!(
        r["result"]["inputRequests"]["ok"]["method"] == "elicitation/create",
        "{r}"
    );
}

/// Issue 52 item 3 (first line), beyond tools: the same upstream's prompt `confirm` and
/// resource template `ask://{what}` answer `input_required` until retried with the answers.
/// Through a 2025-era session both are asked of the client (`elicitation/create`) and retried
/// with its answer (`methods::proxy::call_answering`); without an elicitation capability the
/// gateway answers `decline` for it; a stateless 2026-07-28 client gets `input_required`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_2026_upstreams_input_required_on_prompts_and_resources_is_asked_of_2025_clients() {
    let (_server, up) = sdk_2026_upstream().await;
    let tg = TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.upstreams = vec![up];
    });
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("agent-u").grant("u.*"))
        .await
        .unwrap();
    let prompt = json!({"name": "u.confirm", "arguments": {"what": "p"}});
    let read = json!({"uri": "ask://r"});
    let accept = json!({"action": "accept", "content": {"ok": true}});

    let mut a = SseClient::connect(&reg.sse_url(), reg.token()).await;
    a.initialize_with(json!({"elicitation": {}})).await;
    let (r, asked) = ask_with(&mut a, "prompts/get", prompt.clone(), Some(accept.clone())).await;
    assert_eq!(asked, ["elicitation/create"], "{r}");
    assert_eq!(
        r["result"]["messages"][0]["content"]["text"], "prompt:p:accept",
        "{r}"
    );
    let (r, asked) = ask_with(&mut a, "resources/read", read.clone(), Some(accept)).await;
    assert_eq!(asked, ["elicitation/create"], "{r}");
    assert_eq!(r["result"]["contents"][0]["text"], "read:r:accept", "{r}");

    let mut b = SseClient::connect(&reg.sse_url(), reg.token()).await;
    b.initialize().await;
    let (r, asked) = ask_with(&mut b, "resources/read", read.clone(), None).await;
    assert!(asked.is_empty(), "{asked:?}");
    assert_eq!(r["result"]["contents"][0]["text"], "read:r:decline", "{r}");

    // A stateless 2026-07-28 client retries itself: it gets the answer as it is.
    let r = stateless(&reg.mcp_url(), reg.token(), 7, "prompts/get", prompt).await;
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
    let r = stateless(&reg.mcp_url(), reg.token(), 8, "resources/read", read).await;
    assert_eq!(r["result"]["resultType"], "input_required", "{r}");
}
