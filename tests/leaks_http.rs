//! The client's bearer token never reaches an HTTP upstream: a Python SDK server over
//! Streamable HTTP (tests/peers/conformance_server.py) reports the headers each call arrived
//! with; the configured upstream header does arrive, the agent's token never does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use gatehouse::config::UpstreamConfig;
use gatehouse::RegistrationSpec;
use serde_json::{json, Value};

#[tokio::test]
async fn the_agent_token_never_reaches_an_http_upstream() {
    let upstream = python_http_upstream().await;
    let up: UpstreamConfig = toml::from_str(&format!(
        "id = \"py\"\nurl = {:?}\nheaders = {{ \"X-Upstream-Key\" = \"configured-upstream-credential\" }}\n",
        upstream.url
    ))
    .unwrap();
    let tg = TestGateway::with(|c| c.upstreams = vec![up]);
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("agent-h").grant("py.test_request_headers"))
        .await
        .unwrap();
    let token = reg.token().to_string();
    let mut c = SseClient::connect(&reg.sse_url(), &token).await;
    c.initialize().await;
    // The caller tries to smuggle its token upstream in _meta, in several forms.
    let r = c
        .request(
            "tools/call",
            json!({"name": "py.test_request_headers", "arguments": {},
                   "_meta": {"authorization": format!("Bearer {token}"), "token": token,
                             "nested": {"x": [format!("Bearer {token}")]}}}),
        )
        .await;
    let result = &r["result"];
    assert!(result.is_object(), "{r}");
    let headers: Value = result
        .get("structuredContent")
        .cloned()
        .filter(|v| v.get("headers").is_some())
        .unwrap_or_else(|| {
            serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap()
        });
    let headers = &headers["headers"];
    assert!(headers.is_object(), "{r}");
    assert_eq!(
        headers["x-upstream-key"], "configured-upstream-credential",
        "configured upstream headers are sent: {headers}"
    );
    let all = headers.to_string();
    assert!(
        !all.contains(&token),
        "the agent's token reached the upstream: {all}"
    );
    assert!(
        headers.get("authorization").is_none(),
        "no Authorization header goes upstream: {headers}"
    );
    assert!(!r.to_string().contains(&token));
}
