//! A forwarded tool result passes through as its upstream wrote it (src/mcp/jsonrpc.rs
//! `Reply::Raw`, src/upstream/stdio.rs `ResultLine`): byte for byte on Streamable HTTP and
//! legacy SSE, `isError` still read for the audit, a result with a CR in it re-encoded (it
//! would break an event stream's `data:` line), the stateless era still given its fields.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{SseClient, TestGateway};
use gatehouse::config::UpstreamConfig;
use gatehouse::RegistrationSpec;
use serde_json::{json, Value};

/// What tests/fixtures/raw_result_server.py writes for `spaced`.
const SPACED: &str = r#"{"zeta": 1, "content": [ {"type": "text", "text": "sp\u00e9cial \"q\""} ], "isError": false, "alpha": [1, 2.50, 1e3]}"#;

fn raw_upstream() -> UpstreamConfig {
    let script = format!(
        "{}/tests/fixtures/raw_result_server.py",
        env!("CARGO_MANIFEST_DIR")
    );
    serde_json::from_value(json!({"id": "raw", "command": "python3", "args": [script]})).unwrap()
}

fn call(id: u64, tool: &str) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call",
           "params":{"name":tool,"arguments":{"k":"v"}}})
}

/// The data of the next `message` event, as it was written.
async fn next_data(c: &mut SseClient) -> String {
    loop {
        let (event, data) = tokio::time::timeout(Duration::from_secs(10), c.events.recv())
            .await
            .expect("no event within 10 s")
            .expect("stream ended");
        match event.as_str() {
            "message" => return data,
            "closed" => panic!("stream closed"),
            _ => {}
        }
    }
}

/// A Streamable HTTP (2025-06-18) POST on `session`; the body as text.
async fn post(url: &str, token: &str, session: Option<&str>, body: Value) -> (String, String) {
    let mut b = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18");
    if let Some(s) = session {
        b = b.header("mcp-session-id", s);
    }
    let r = b.json(&body).send().await.unwrap();
    let sid = r
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (sid, r.text().await.unwrap())
}

#[tokio::test]
async fn a_tool_result_passes_through_as_the_upstream_wrote_it() {
    let tg = TestGateway::with(|c| c.upstreams = vec![raw_upstream()]);
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("pass").grant("raw.*"))
        .await
        .unwrap();
    let (url, tok) = (reg.mcp_url(), reg.token().to_string());

    // Streamable HTTP: the JSON body is the envelope around the upstream's very text.
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{
        "protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}});
    let (sid, _) = post(&url, &tok, None, init).await;
    assert!(!sid.is_empty());
    let note = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
    post(&url, &tok, Some(&sid), note).await;
    let (_, body) = post(&url, &tok, Some(&sid), call(3, "raw.spaced")).await;
    assert_eq!(
        body,
        format!(r#"{{"jsonrpc":"2.0","id":3,"result":{SPACED}}}"#)
    );
    // A string id is written back as the client sent it.
    let mut c = call(0, "raw.spaced");
    c["id"] = json!("req \"7\"");
    let (_, body) = post(&url, &tok, Some(&sid), c).await;
    assert_eq!(
        body,
        format!(r#"{{"jsonrpc":"2.0","id":"req \"7\"","result":{SPACED}}}"#)
    );

    // Legacy SSE: the event's data is the same bytes.
    let mut sse = SseClient::connect(&reg.sse_url(), reg.token()).await;
    sse.initialize().await;
    assert_eq!(sse.post(call(4, "raw.spaced")).await.status(), 202);
    assert_eq!(
        next_data(&mut sse).await,
        format!(r#"{{"jsonrpc":"2.0","id":4,"result":{SPACED}}}"#)
    );

    // `isError` is read from the text (spaced as the upstream wrote it): audited tool_error.
    sse.post(call(5, "raw.fails")).await;
    let failed: Value = serde_json::from_str(&next_data(&mut sse).await).unwrap();
    assert_eq!(failed["id"], 5);
    assert_eq!(failed["result"]["isError"], true);

    // CRs are JSON whitespace but line breaks to an event stream: that result is re-encoded.
    sse.post(call(6, "raw.cr")).await;
    let data = next_data(&mut sse).await;
    assert!(!data.contains('\r'), "{data:?}");
    let cr: Value = serde_json::from_str(&data).unwrap();
    assert_eq!(cr["id"], 6);
    assert_eq!(cr["result"]["content"][0]["text"], "cr");

    // A line that is a JSON array is not a response, even shaped like `[id, result]`.
    sse.post(call(7, "raw.array")).await;
    let arr: Value = serde_json::from_str(&next_data(&mut sse).await).unwrap();
    assert_eq!(arr["id"], 7);
    assert_eq!(arr["result"]["content"][0]["text"], "right", "{arr}");

    // Stateless (2026-07-28): the result still gets the revision's fields.
    let r = common::stateless(
        &url,
        &tok,
        8,
        "tools/call",
        json!({"name":"raw.spaced","arguments":{}}),
    )
    .await;
    assert_eq!(r["id"], 8, "{r}");
    assert_eq!(r["result"]["zeta"], 1, "{r}");
    assert_eq!(r["result"]["alpha"], json!([1, 2.5, 1000.0]), "{r}");
    assert_eq!(r["result"]["resultType"], "complete", "{r}");

    let outcomes: Vec<(String, String)> = tg
        .calls()
        .iter()
        .map(|r| {
            (
                r.tool.clone().unwrap_or_default().into(),
                r.outcome.clone().unwrap_or_default().into(),
            )
        })
        .collect();
    let of = |tool: &str| {
        outcomes
            .iter()
            .filter(|(t, _)| t == tool)
            .map(|(_, o)| o.as_str())
            .collect::<Vec<_>>()
    };
    assert_eq!(of("raw.spaced"), ["ok", "ok", "ok", "ok"], "{outcomes:?}");
    assert_eq!(of("raw.fails"), ["tool_error"], "{outcomes:?}");
    assert_eq!(of("raw.cr"), ["ok"], "{outcomes:?}");
    assert_eq!(of("raw.array"), ["ok"], "{outcomes:?}");
    tg.gateway.shutdown().await;
}
