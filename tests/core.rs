//! The core gateway over legacy HTTP+SSE: registrations, isolation, release, audit, malformed
//! input. Real sockets on 127.0.0.1:0.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use gatehouse::{Limits, RegistrationSpec};
use serde_json::{json, Value};

#[tokio::test]
async fn no_registration_means_no_server() {
    let tg = TestGateway::start();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(tg.gateway.local_addr(), None);
    assert_eq!(tg.gateway.server_starts(), 0);
}

#[tokio::test]
async fn seven_sequential_registrations_are_all_served() {
    let tg = TestGateway::with(|c| c.linger_ms = 200);
    for i in 1..=7 {
        let reg = tg
            .gateway
            .register(
                RegistrationSpec::new(format!("agent-{i}"))
                    .with_tool(echo_tool(&format!("tool_{i}"), &format!("r{i}"))),
            )
            .await
            .unwrap();
        let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
        let init = c.initialize().await;
        assert_eq!(init["result"]["protocolVersion"], "2024-11-05");
        assert_eq!(c.tool_names().await, vec![format!("tool_{i}")]);
        let r = c.call(&format!("tool_{i}"), json!({"text":"hi"})).await;
        assert_eq!(text_of(&r), format!("r{i}:hi"));
        let url = reg.sse_url();
        let token = reg.token().to_string();
        reg.release().await;
        let resp = http().get(&url).bearer_auth(&token).send().await.unwrap();
        assert_eq!(resp.status(), 404, "registration {i} after release");
        if i % 2 == 0 {
            // Let the server stop; the next registration starts it again.
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert_eq!(tg.gateway.local_addr(), None);
        }
    }
    assert_eq!(tg.gateway.server_starts(), 4);
}

#[tokio::test]
async fn server_lingers_and_a_new_registration_is_served_while_it_stops() {
    let tg = TestGateway::with(|c| c.linger_ms = 200);
    let a = tg
        .gateway
        .register(RegistrationSpec::new("a").with_tool(echo_tool("t", "a")))
        .await
        .unwrap();
    a.release().await;
    assert!(tg.gateway.local_addr().is_some(), "still lingering");
    // Arrives during the linger: reuses the running server and is served.
    let b = tg
        .gateway
        .register(RegistrationSpec::new("b").with_tool(echo_tool("t", "b")))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut c = SseClient::connect(&b.sse_url(), b.token()).await;
    c.initialize().await;
    assert_eq!(text_of(&c.call("t", json!({"text":"x"})).await), "b:x");
    assert_eq!(tg.gateway.server_starts(), 1);
    drop(c);
    b.release().await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(tg.gateway.local_addr(), None, "stopped after the linger");
}

#[tokio::test]
async fn registrations_see_only_their_own_tools_and_tokens_do_not_cross() {
    let tg = TestGateway::start();
    let a = tg
        .gateway
        .register(RegistrationSpec::new("alice").with_tool(echo_tool("alpha", "A")))
        .await
        .unwrap();
    let b = tg
        .gateway
        .register(RegistrationSpec::new("bob").with_tool(echo_tool("beta", "B")))
        .await
        .unwrap();
    let mut ca = SseClient::connect(&a.sse_url(), a.token()).await;
    let mut cb = SseClient::connect(&b.sse_url(), b.token()).await;
    ca.initialize().await;
    cb.initialize().await;
    assert_eq!(ca.tool_names().await, vec!["alpha"]);
    assert_eq!(cb.tool_names().await, vec!["beta"]);
    // A's tool is unknown to B.
    let r = cb.call("alpha", json!({})).await;
    assert_eq!(r["error"]["code"], -32602);

    // A's token on B's paths: 401 on the stream and on the POST endpoint.
    let resp = http()
        .get(b.sse_url())
        .bearer_auth(a.token())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert!(resp.headers()["www-authenticate"]
        .to_str()
        .unwrap()
        .starts_with("Bearer"));
    let body = resp.text().await.unwrap();
    assert!(!body.contains(a.token()) && !body.contains(b.token()));
    let resp = http()
        .post(cb.post_url())
        .bearer_auth(a.token())
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    // No token at all.
    let resp = http().get(a.sse_url()).send().await.unwrap();
    assert_eq!(resp.status(), 401);
    // A's session id under B's registration path (with B's valid token) does not resolve.
    let a_sid = ca.endpoint.split("session_id=").nth(1).unwrap().to_string();
    let url = format!("{}/gw/{}/messages/?session_id={}", cb.base, b.id(), a_sid);
    let resp = http()
        .post(url)
        .bearer_auth(b.token())
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
}

#[tokio::test]
async fn concurrent_registrations_stay_independent() {
    let tg = TestGateway::start();
    let mut handles = Vec::new();
    for i in 0..8 {
        let gw = tg.gateway.clone();
        handles.push(tokio::spawn(async move {
            let reg = gw
                .register(
                    RegistrationSpec::new(format!("agent-{i}"))
                        .with_tool(echo_tool("echo", &format!("secret-{i}"))),
                )
                .await
                .unwrap();
            let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
            c.initialize().await;
            for n in 0..10 {
                let r = c.call("echo", json!({"text": n.to_string()})).await;
                assert_eq!(text_of(&r), format!("secret-{i}:{n}"));
            }
            reg.release().await;
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let calls = tg.calls();
    assert_eq!(calls.len(), 80);
}

#[tokio::test]
async fn audit_attributes_interleaved_calls_to_the_registration_agent() {
    let tg = TestGateway::start();
    let a = tg
        .gateway
        .register(
            RegistrationSpec::new("agent-A")
                .label("run-a")
                .with_tool(echo_tool("echo", "A")),
        )
        .await
        .unwrap();
    let b = tg
        .gateway
        .register(RegistrationSpec::new("agent-B").with_tool(echo_tool("echo", "B")))
        .await
        .unwrap();
    let mut ca = SseClient::connect(&a.sse_url(), a.token()).await;
    let mut cb = SseClient::connect(&b.sse_url(), b.token()).await;
    ca.initialize().await;
    cb.initialize().await;
    for i in 0..5 {
        // The caller tries to claim another identity in _meta: ignored.
        ca.request(
            "tools/call",
            json!({"name":"echo","arguments":{"text":i.to_string()},"_meta":{"agent_id":"agent-B"}}),
        )
        .await;
        cb.call("echo", json!({"text": i.to_string()})).await;
    }
    let calls = tg.calls();
    assert_eq!(calls.len(), 10);
    for r in &calls {
        let reg = r.registration_id.as_deref().unwrap();
        let expected = if reg == a.id() { "agent-A" } else { "agent-B" };
        assert_eq!(r.agent_id.as_deref(), Some(expected));
        assert_eq!(r.outcome.as_deref(), Some("ok"));
        assert_eq!(r.transport.as_deref(), Some("sse"));
        assert!(r.args_digest.as_ref().is_some_and(|d| d.len() == 64));
        assert!(r.session_id.is_some() && r.duration_ms.is_some());
    }
    assert!(
        calls
            .iter()
            .filter(|r| r.label.as_deref() == Some("run-a"))
            .count()
            == 5
    );
    // Lifecycle records exist and the file holds no token.
    let text = std::fs::read_to_string(tg.audit_path()).unwrap();
    assert!(!text.contains(a.token()) && !text.contains(b.token()));
    assert_eq!(
        tg.audit()
            .iter()
            .filter(|r| r.event == "registration_created")
            .count(),
        2
    );
}

#[tokio::test]
async fn release_is_immediate_and_total() {
    let tg = TestGateway::with(|c| c.linger_ms = 2000);
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("a").with_tool(slow_tool("slow")))
        .await
        .unwrap();
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    c.initialize().await;
    let resp = c
        .post(json!({"jsonrpc":"2.0","id":99,"method":"tools/call","params":{"name":"slow","arguments":{"ms":5000}}}))
        .await;
    assert_eq!(resp.status(), 202);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (id, token, post_url, sse_url) = (
        reg.id().to_string(),
        reg.token().to_string(),
        c.post_url(),
        reg.sse_url(),
    );
    let base = c.base.clone();
    let started = std::time::Instant::now();
    reg.release().await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "release does not wait for the call"
    );
    // Every path 404s at once.
    for url in [sse_url.clone(), format!("{base}/gw/{id}/mcp")] {
        let resp = http().get(&url).bearer_auth(&token).send().await.unwrap();
        assert_eq!(resp.status(), 404, "{url}");
    }
    let resp = http()
        .post(&post_url)
        .bearer_auth(&token)
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    // The stream ended with no reply to the call.
    loop {
        match tokio::time::timeout(Duration::from_secs(5), c.events.recv())
            .await
            .unwrap()
        {
            Some((ev, data)) if ev == "message" => panic!("late message after release: {data}"),
            Some((ev, _)) if ev == "closed" => break,
            Some(_) => continue,
            None => break,
        }
    }
    // The audit records the cancellation, then the release.
    let recs = tg.audit();
    let call = recs
        .iter()
        .find(|r| r.event == "governed_mcp_call")
        .unwrap();
    assert_eq!(call.outcome.as_deref(), Some("cancelled"));
    let pos_call = recs
        .iter()
        .position(|r| r.event == "governed_mcp_call")
        .unwrap();
    let pos_rel = recs
        .iter()
        .position(|r| r.event == "registration_released")
        .unwrap();
    assert!(pos_call < pos_rel);
    assert_eq!(gatehouse::testing::sessions(&tg.gateway).len(), 0);
}

#[tokio::test]
async fn dropping_the_guard_releases() {
    let tg = TestGateway::start();
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("a").with_tool(echo_tool("t", "a")))
        .await
        .unwrap();
    let (url, token) = (reg.sse_url(), reg.token().to_string());
    let mut c = SseClient::connect(&url, &token).await;
    drop(reg);
    assert_eq!(gatehouse::testing::registry(&tg.gateway).len(), 0);
    assert!(c.next_message(5).await.is_none(), "stream ended");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(tg
        .audit()
        .iter()
        .any(|r| r.event == "registration_released"));
}

#[tokio::test]
async fn client_cancel_stops_the_call_and_no_reply_follows() {
    let tg = TestGateway::start();
    let reg = tg
        .gateway
        .register(
            RegistrationSpec::new("a")
                .with_tool(slow_tool("slow"))
                .with_tool(echo_tool("echo", "e")),
        )
        .await
        .unwrap();
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    c.initialize().await;
    c.post(json!({"jsonrpc":"2.0","id":"call-1","method":"tools/call","params":{"name":"slow","arguments":{"ms":3000},"_meta":{"progressToken":"p1"}}}))
        .await;
    // Progress arrives on the stream for the token the client chose.
    let note = c.next_message(5).await.unwrap();
    assert_eq!(note["method"], "notifications/progress");
    assert_eq!(note["params"]["progressToken"], "p1");
    c.notify(
        "notifications/cancelled",
        json!({"requestId":"call-1","reason":"test"}),
    )
    .await;
    // The next reply on the stream belongs to a later request, not the cancelled one.
    let (r, notes) = c
        .request_with_notes(
            "tools/call",
            json!({"name":"echo","arguments":{"text":"after"}}),
        )
        .await;
    assert_eq!(text_of(&r), "e:after");
    assert!(notes.iter().all(|n| n.get("id") != Some(&json!("call-1"))));
    tokio::time::sleep(Duration::from_millis(3500)).await;
    while let Ok(Some((ev, data))) =
        tokio::time::timeout(Duration::from_millis(100), c.events.recv()).await
    {
        assert!(
            !(ev == "message" && data.contains("\"call-1\"")),
            "cancelled call answered: {data}"
        );
    }
    let outcomes: Vec<String> = tg
        .calls()
        .into_iter()
        .map(|r| r.outcome.unwrap().into())
        .collect();
    assert!(outcomes.contains(&"cancelled".to_string()), "{outcomes:?}");
}

#[tokio::test]
async fn protocol_basics_over_sse() {
    let tg = TestGateway::start();
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("a").with_tool(echo_tool("echo", "e")))
        .await
        .unwrap();
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    // Before initialize, only ping and initialize are served.
    let r = c.request("tools/list", json!({})).await;
    assert_eq!(r["error"]["code"], -32600);
    assert_eq!(c.request("ping", json!({})).await["result"], json!({}));
    // Version negotiation: a known version is echoed, an unknown one gets the latest.
    let r = c
        .request("initialize", json!({"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}))
        .await;
    assert_eq!(r["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(r["result"]["serverInfo"]["name"], "gatehouse");
    assert!(r["result"]["capabilities"]["tools"].is_object());
    let mut c2 = SseClient::connect(&reg.sse_url(), reg.token()).await;
    let r = c2
        .request("initialize", json!({"protocolVersion":"1999-01-01","capabilities":{},"clientInfo":{"name":"t","version":"1"}}))
        .await;
    assert_eq!(r["result"]["protocolVersion"], "2025-11-25");
    // Unknown method.
    let r = c.request("resources/list", json!({})).await;
    assert_eq!(r["error"]["code"], -32601);
    // Tool errors and bad params.
    let r = c.request("tools/call", json!({"name": 5})).await;
    assert_eq!(r["error"]["code"], -32602);
    let r = c
        .request("tools/call", json!({"name": "echo", "arguments": [1]}))
        .await;
    assert_eq!(r["error"]["code"], -32602);
    // Unknown params fields pass, the list is deterministic and carries the schema.
    let r = c.request("tools/list", json!({})).await;
    assert_eq!(r["result"]["tools"][0]["inputSchema"]["type"], "object");
}

#[tokio::test]
async fn malformed_requests_are_answered_and_the_gateway_keeps_serving() {
    let tg = TestGateway::with(|c| c.max_body_bytes = 64 * 1024);
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("a").with_tool(echo_tool("echo", "e")))
        .await
        .unwrap();
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    c.initialize().await;
    let post = |body: Vec<u8>, ctype: &'static str| {
        let c = &c;
        async move {
            let resp = c
                .http
                .post(c.post_url())
                .bearer_auth(&c.token)
                .header("content-type", ctype)
                .body(body)
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            (status, body)
        }
    };
    let cases: Vec<(Vec<u8>, &str, u16, i64, Value)> = vec![
        (
            b"{not json".to_vec(),
            "application/json",
            400,
            -32700,
            Value::Null,
        ),
        (
            vec![0xff, 0xfe, 0x00],
            "application/json",
            400,
            -32700,
            Value::Null,
        ),
        (
            br#"{"jsonrpc":"1.0","id":4,"method":"ping"}"#.to_vec(),
            "application/json",
            400,
            -32600,
            json!(4),
        ),
        (
            br#"{"jsonrpc":"2.0","id":5}"#.to_vec(),
            "application/json",
            400,
            -32600,
            json!(5),
        ),
        (
            br#"{"jsonrpc":"2.0","id":6,"method":7}"#.to_vec(),
            "application/json",
            400,
            -32600,
            json!(6),
        ),
        (
            br#"{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}"#.to_vec(),
            "application/json",
            400,
            -32600,
            Value::Null,
        ),
        (
            br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#.to_vec(),
            "application/json",
            400,
            -32600,
            Value::Null,
        ),
        (
            br#""just a string""#.to_vec(),
            "application/json",
            400,
            -32600,
            Value::Null,
        ),
        (
            br#"{"jsonrpc":"2.0","id":8,"method":"ping","params":"x"}"#.to_vec(),
            "application/json",
            400,
            -32600,
            json!(8),
        ),
        (
            vec![b' '; 200 * 1024],
            "application/json",
            413,
            -32600,
            Value::Null,
        ),
    ];
    for (body, ctype, status, code, id) in cases {
        let shown = String::from_utf8_lossy(&body[..body.len().min(60)]).to_string();
        let (s, b) = post(body, ctype).await;
        assert_eq!(s, status, "{shown}");
        assert_eq!(b["error"]["code"], code, "{shown}: {b}");
        assert_eq!(b["id"], id, "{shown}");
    }
    let (s, _) = post(
        br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#.to_vec(),
        "text/plain",
    )
    .await;
    assert_eq!(s, 415);
    // Missing and unknown session ids.
    let url = format!("{}/gw/{}/messages/", c.base, reg.id());
    let resp = http()
        .post(&url)
        .bearer_auth(reg.token())
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let resp = http()
        .post(format!("{url}?session_id=nope"))
        .bearer_auth(reg.token())
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    // sessionId is accepted as well as session_id.
    let sid = c.endpoint.split("session_id=").nth(1).unwrap().to_string();
    let resp = http()
        .post(format!("{url}?sessionId={sid}"))
        .bearer_auth(reg.token())
        .json(&json!({"jsonrpc":"2.0","id":"alt","method":"ping"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    assert_eq!(c.next_message(5).await.unwrap()["id"], "alt");
    // Still serving.
    assert_eq!(text_of(&c.call("echo", json!({"text":"ok"})).await), "e:ok");
}

#[tokio::test]
async fn origin_checks_reject_foreign_origins() {
    let tg = TestGateway::start();
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("a").with_tool(echo_tool("echo", "e")))
        .await
        .unwrap();
    let resp = http()
        .get(reg.sse_url())
        .bearer_auth(reg.token())
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let ok = SseClient::connect(&reg.sse_url(), reg.token()).await;
    drop(ok);
    let resp = http()
        .get(reg.sse_url())
        .bearer_auth(reg.token())
        .header("origin", "http://localhost:5173")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn registration_errors_are_clear() {
    let tg = TestGateway::start();
    let e = tg
        .gateway
        .register(RegistrationSpec::new("  "))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("agent_id"), "{e}");
    let e = tg
        .gateway
        .register(RegistrationSpec::new("a").grant("nope.*"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("nope.*"), "{e}");
    let e = tg
        .gateway
        .register(RegistrationSpec::new("a").grant("a*b*"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("bad grant"), "{e}");
    assert_eq!(
        tg.gateway.local_addr(),
        None,
        "failed registrations start nothing"
    );
}

#[tokio::test]
async fn limits_are_bound_to_the_registration() {
    let tg = TestGateway::start();
    let reg = tg
        .gateway
        .register(
            RegistrationSpec::new("a")
                .with_tool(echo_tool("echo", "e"))
                .limits(Limits {
                    max_calls: Some(2),
                    ..Default::default()
                }),
        )
        .await
        .unwrap();
    for _ in 0..2 {
        let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
        c.initialize().await;
        assert_eq!(text_of(&c.call("echo", json!({"text":"x"})).await), "e:x");
    }
    // A new session does not reset the count.
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    c.initialize().await;
    let r = c.call("echo", json!({"text":"x"})).await;
    assert_eq!(r["result"]["isError"], true);
    assert!(text_of(&r).contains("max_calls"));
    assert_eq!(
        tg.calls().last().unwrap().outcome.as_deref(),
        Some("denied")
    );
}

#[tokio::test]
async fn audit_failure_refuses_calls() {
    // /dev/full accepts opens but every write fails with ENOSPC.
    let tg = TestGateway::with(|c| c.audit.path = "/dev/full".into());
    let e = tg
        .gateway
        .register(RegistrationSpec::new("a").with_tool(echo_tool("echo", "e")))
        .await;
    assert!(e.is_err(), "registration needs its created record written");
}

#[tokio::test]
async fn healthz_counts() {
    let tg = TestGateway::start();
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("a").with_tool(echo_tool("echo", "e")))
        .await
        .unwrap();
    let _c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    let h: Value = http()
        .get(format!("{}/healthz", reg.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(h, json!({"ok":true,"registrations":1,"sessions":1}));
}

#[tokio::test]
async fn server_restarts_immediately_with_zero_linger() {
    let tg = TestGateway::start();
    for i in 0..5 {
        let reg = tg
            .gateway
            .register(RegistrationSpec::new("a").with_tool(echo_tool("echo", "e")))
            .await
            .unwrap();
        let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
        c.initialize().await;
        assert_eq!(
            text_of(&c.call("echo", json!({"text":"x"})).await),
            "e:x",
            "round {i}"
        );
        drop(c);
        reg.release().await;
        assert_eq!(tg.gateway.local_addr(), None);
    }
    assert_eq!(tg.gateway.server_starts(), 5);
}

#[tokio::test]
async fn sse_streams_send_keepalive_comments() {
    let tg = TestGateway::with(|c| c.keepalive_s = 1);
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("a").with_tool(echo_tool("echo", "e")))
        .await
        .unwrap();
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    let ev = tokio::time::timeout(Duration::from_secs(5), c.events.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ev, ("comment".to_string(), "keepalive".to_string()));
}
