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

fn tools() -> Value {
    json!([
        {"name": "region", "inputSchema": {"type": "object", "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "n": {"type": "integer", "x-mcp-header": "N"},
            "opts": {"type": "object", "properties": {
                "on": {"type": "boolean", "x-mcp-header": "On"}}},
            "greeting": {"type": "string", "x-mcp-header": "Greeting"},
            "q": {"type": "string"}}}},
        {"name": "plain", "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}}},
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
    axum::extract::State(seen): axum::extract::State<Seen>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> axum::response::Response {
    let method = body["method"].as_str().unwrap_or("-").to_string();
    seen.lock().unwrap().push((method.clone(), headers));
    let Some(id) = body.get("id").cloned() else {
        return StatusCode::ACCEPTED.into_response();
    };
    let result = match method.as_str() {
        "server/discover" => json!({
            "resultType": "complete",
            "supportedVersions": ["2026-07-28"],
            "capabilities": {"tools": {}},
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "param-peer", "version": "1"}}
        }),
        "tools/list" => {
            json!({"resultType": "complete", "tools": tools(), "ttlMs": 0, "cacheScope": "private"})
        }
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

/// The upstream: its URL and what it saw. Served until the test's runtime ends.
async fn upstream() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = axum::Router::new()
        .route("/mcp", axum::routing::post(upstream_post))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://127.0.0.1:{port}/mcp"), seen)
}

async fn gateway() -> (TestGateway, Seen) {
    let (url, seen) = upstream().await;
    let up: gatehouse::config::UpstreamConfig = toml::from_str(&format!(
        "id = \"p\"\nurl = \"{url}\"\nsharing = \"shared\"\ncall_timeout_s = 1\nprotocol = \"2026-07-28\"\n"
    ))
    .unwrap();
    let tg = TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.upstreams = vec![up];
    });
    (tg, seen)
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
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .last()
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
