//! rmcp 0.10's legacy SSE client (written by others) against the gateway's /gw/<id>/sse.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use gatehouse::RegistrationSpec;
use rmcp_legacy_sse::model::{CallToolRequestParam, ClientInfo};
use rmcp_legacy_sse::transport::{sse_client::SseClientConfig, SseClientTransport};
use rmcp_legacy_sse::ServiceExt;
use serde_json::json;

fn authed_client(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {token}").parse().unwrap(),
    );
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .unwrap()
}

#[tokio::test]
async fn rmcp_legacy_sse_client_lists_and_calls() {
    let tg = TestGateway::start();
    let reg = tg
        .gateway
        .register(
            RegistrationSpec::new("rmcp-agent")
                .with_tool(echo_tool("echo", "R"))
                .with_tool(slow_tool("slow")),
        )
        .await
        .unwrap();
    let transport = SseClientTransport::start_with_client(
        authed_client(reg.token()),
        SseClientConfig {
            sse_endpoint: reg.sse_url().into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let client = ClientInfo::default().serve(transport).await.unwrap();
    let info = client.peer_info().unwrap();
    assert_eq!(info.server_info.name, "gatehouse");
    let tools = client.list_tools(Default::default()).await.unwrap();
    let names: Vec<_> = tools.tools.iter().map(|t| t.name.to_string()).collect();
    assert_eq!(names, vec!["echo", "slow"]);
    let r = client
        .call_tool(CallToolRequestParam {
            name: "echo".into(),
            arguments: json!({"text": "hi"}).as_object().cloned(),
        })
        .await
        .unwrap();
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["content"][0]["text"], "R:hi");
    // Several calls in flight on one session are answered to the right requests.
    let mut set = tokio::task::JoinSet::new();
    for i in 0..10 {
        let peer = client.peer().clone();
        set.spawn(async move {
            let r = peer
                .call_tool(CallToolRequestParam {
                    name: "echo".into(),
                    arguments: json!({"text": i.to_string()}).as_object().cloned(),
                })
                .await
                .unwrap();
            (
                i,
                serde_json::to_value(&r).unwrap()["content"][0]["text"].clone(),
            )
        });
    }
    while let Some(res) = set.join_next().await {
        let (i, text) = res.unwrap();
        assert_eq!(text, format!("R:{i}"));
    }
    // A token for another registration is refused by the same client code.
    let other = tg
        .gateway
        .register(RegistrationSpec::new("other").with_tool(echo_tool("echo", "O")))
        .await
        .unwrap();
    let refused = SseClientTransport::start_with_client(
        authed_client(other.token()),
        SseClientConfig {
            sse_endpoint: reg.sse_url().into(),
            ..Default::default()
        },
    )
    .await;
    assert!(refused.is_err(), "a foreign token must not open the stream");
    client.cancel().await.unwrap();
    let calls = tg.calls();
    assert_eq!(calls.len(), 11);
    assert!(calls
        .iter()
        .all(|c| c.agent_id.as_deref() == Some("rmcp-agent")));
}
