//! Resources and prompts proxied to upstreams: a registration sees those of the upstreams it
//! holds a grant on, and none of the others (docs/conformance.md, src/mcp/proxy.rs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use gatehouse::config::UpstreamConfig;
use gatehouse::RegistrationSpec;
use serde_json::json;

fn conformance_upstream(id: &str) -> Option<UpstreamConfig> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let py = root.join("tests/peers/.venv/bin/python");
    if !py.exists() {
        return None;
    }
    let server = root.join("tests/peers/conformance_server.py");
    serde_json::from_value(json!({
        "id": id,
        "command": py,
        "args": [server, "stdio"],
        "sharing": "shared",
    }))
    .ok()
}

#[tokio::test]
async fn prompts_and_resources_follow_upstream_grants() {
    let (Some(a), Some(b)) = (conformance_upstream("a"), conformance_upstream("b")) else {
        panic!("tests/peers/.venv is missing: run `bash tests/peers/setup.sh` (or `bash tests/run.sh`)");
    };
    let tg = TestGateway::with(|c| c.upstreams = vec![a, b]);
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("x").grant("a.test_simple_text"))
        .await
        .unwrap();
    let (url, tok) = (reg.mcp_url(), reg.token().to_string());
    let d = common::stateless(&url, &tok, 1, "server/discover", json!({})).await;
    assert!(d["result"]["capabilities"]["prompts"].is_object(), "{d}");
    assert!(d["result"]["capabilities"]["resources"].is_object(), "{d}");
    let p = common::stateless(&url, &tok, 2, "prompts/list", json!({})).await;
    let names: Vec<&str> = p["result"]["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert!(names.contains(&"a.test_simple_prompt"), "{p}");
    assert!(names.iter().all(|n| n.starts_with("a.")), "{p}");
    // A list may be reused for a while (changes are heard on subscriptions/listen).
    assert_eq!(p["result"]["ttlMs"], 60_000);
    let g = common::stateless(
        &url,
        &tok,
        3,
        "prompts/get",
        json!({"name":"a.test_simple_prompt"}),
    )
    .await;
    assert!(g["result"]["messages"].is_array(), "{g}");
    let g = common::stateless(
        &url,
        &tok,
        4,
        "prompts/get",
        json!({"name":"b.test_simple_prompt"}),
    )
    .await;
    assert_eq!(g["error"]["code"], -32602, "{g}");
    let r = common::stateless(
        &url,
        &tok,
        5,
        "resources/read",
        json!({"uri":"test://static-text"}),
    )
    .await;
    assert!(r["result"]["contents"].is_array(), "{r}");
    // A registration without upstream grants has no resources or prompts at all.
    let none = tg
        .gateway
        .register(RegistrationSpec::new("y").with_tool(echo_tool("e", "E")))
        .await
        .unwrap();
    let p = common::stateless(&none.mcp_url(), none.token(), 6, "prompts/list", json!({})).await;
    assert_eq!(p["error"]["code"], -32601, "{p}");
}
