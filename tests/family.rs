//! Child registrations for sub-agents (issue 39, first half), on the embedded gateway with
//! real sockets: a child's tools are a subset of its parent's (else 400 naming each grant),
//! its limits at most the parent's and its TTL ends no later; depth and fan-out are capped;
//! the family shares the parent's budget under concurrent calls; tokens do not cross between
//! parent and child; releasing the parent ends the child's streams and in-flight calls first
//! (its records come before the parent's release record) and every URL of both answers 404;
//! a child is released alone without touching its parent; the child's records carry
//! `parent_registration_id` and `agent_path`, which `gatehouse audit --descendants` follows.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use gatehouse::{GatewayError, Limits, RegistrationSpec};
use serde_json::json;

fn tools3() -> RegistrationSpec {
    RegistrationSpec::new("planner")
        .grant("demo.echo")
        .grant("demo.slow")
        .grant("demo.other")
}

fn gateway() -> TestGateway {
    let tg = TestGateway::with(|c| {
        c.children.max_depth = 2;
        c.children.max_per_registration = 3;
    });
    tg.gateway.add_tool(echo_tool("demo.echo", "e"));
    tg.gateway.add_tool(echo_tool("demo.other", "o"));
    tg.gateway.add_tool(slow_tool("demo.slow"));
    tg
}

fn invalid(r: Result<gatehouse::Registration, GatewayError>) -> String {
    match r {
        Err(GatewayError::InvalidSpec(m)) => m,
        other => panic!("expected an invalid spec, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_sees_a_subset_within_its_parents_bounds_and_caps_hold() {
    let tg = gateway();
    let gw = &tg.gateway;
    let parent = gw
        .register(tools3().ttl_s(60).limits(Limits {
            max_calls: Some(100),
            max_concurrent: Some(4),
            call_timeout_s: None,
            ..Default::default()
        }))
        .await
        .unwrap();
    assert_eq!(parent.tools().len(), 3);
    // A subset: one of the parent's tools; a glob matches among the parent's tools only.
    let child = gw
        .register(
            RegistrationSpec::new("researcher")
                .grant("demo.echo")
                .ttl_s(3600)
                .parent(parent.id()),
        )
        .await
        .unwrap();
    assert_eq!(child.tools(), vec!["demo.echo"]);
    // Its TTL ends no later than the parent's (asked 1 h, the parent has 60 s).
    let (p_end, c_end) = (
        chrono::DateTime::parse_from_rfc3339(&parent.expires_at().unwrap()).unwrap(),
        chrono::DateTime::parse_from_rfc3339(&child.expires_at().unwrap()).unwrap(),
    );
    assert!(c_end <= p_end, "{c_end} > {p_end}");
    // A tool the parent lacks: 400 naming it (and not the one it has).
    let m = invalid(
        gw.register(
            RegistrationSpec::new("x")
                .grant("demo.echo")
                .grant("helpdesk.open_case")
                .grant("nope.*")
                .parent(parent.id()),
        )
        .await,
    );
    assert!(
        m.starts_with("not among the parent's tools: helpdesk.open_case, nope.* ("),
        "{m}"
    );
    // Limits above the parent's: 400 naming the limit.
    let m = invalid(
        gw.register(
            RegistrationSpec::new("x")
                .grant("demo.echo")
                .limits(Limits {
                    max_calls: Some(1000),
                    ..Default::default()
                })
                .parent(parent.id()),
        )
        .await,
    );
    assert!(m.contains("max_calls") && m.contains("1000"), "{m}");
    // An unknown or released parent.
    let m = invalid(
        gw.register(RegistrationSpec::new("x").grant("demo.echo").parent("nope"))
            .await,
    );
    assert!(m.contains("not a live registration"), "{m}");
    // Depth: max_depth = 2 allows a grandchild, not a great-grandchild.
    let grandchild = gw
        .register(
            RegistrationSpec::new("g")
                .grant("demo.*")
                .parent(child.id()),
        )
        .await
        .unwrap();
    assert_eq!(grandchild.tools(), vec!["demo.echo"]);
    let m = invalid(
        gw.register(
            RegistrationSpec::new("gg")
                .grant("demo.echo")
                .parent(grandchild.id()),
        )
        .await,
    );
    assert!(m.contains("max_depth"), "{m}");
    // Fan-out: 3 children per registration.
    let mut kids = Vec::new();
    for i in 0..2 {
        kids.push(
            gw.register(
                RegistrationSpec::new(format!("k{i}"))
                    .grant("demo.other")
                    .parent(parent.id()),
            )
            .await
            .unwrap(),
        );
    }
    let m = invalid(
        gw.register(
            RegistrationSpec::new("k9")
                .grant("demo.other")
                .parent(parent.id()),
        )
        .await,
    );
    assert!(m.contains("max_per_registration"), "{m}");
    // A child released alone frees its place and leaves its parent serving.
    kids.pop().unwrap().release().await;
    kids.push(
        gw.register(
            RegistrationSpec::new("k9")
                .grant("demo.other")
                .parent(parent.id()),
        )
        .await
        .unwrap(),
    );
    let mut cp = SseClient::connect(&parent.sse_url(), parent.token()).await;
    cp.initialize().await;
    assert_eq!(cp.tool_names().await.len(), 3);

    // Tokens do not cross: the parent's token on the child's path, and the reverse.
    for (url, token) in [
        (child.sse_url(), parent.token()),
        (parent.sse_url(), child.token()),
    ] {
        let r = http().get(url).bearer_auth(token).send().await.unwrap();
        assert_eq!(r.status(), 401);
    }
    // The child lists and calls its one tool only.
    let mut cc = SseClient::connect(&child.sse_url(), child.token()).await;
    cc.initialize().await;
    assert_eq!(cc.tool_names().await, vec!["demo.echo"]);
    let r = cc.call("demo.echo", json!({"text": "hi"})).await;
    assert_eq!(text_of(&r), "e:hi", "{r}");
    let r = cc.call("demo.other", json!({})).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_family_shares_the_parents_budget_under_concurrent_calls() {
    let tg = gateway();
    let gw = &tg.gateway;
    let parent = gw
        .register(tools3().limits(Limits {
            max_calls: Some(30),
            ..Default::default()
        }))
        .await
        .unwrap();
    let child = gw
        .register(
            RegistrationSpec::new("researcher")
                .grant("demo.echo")
                .parent(parent.id()),
        )
        .await
        .unwrap();
    // 25 calls each, all at once, from both: 30 succeed in all.
    let calls = |url: String, token: String, tag: &'static str| async move {
        let mut ok = 0;
        let mut c = SseClient::connect(&url, &token).await;
        c.initialize().await;
        for i in 0..25 {
            let r = c
                .call("demo.echo", json!({"text": format!("{tag}{i}")}))
                .await;
            if r["result"]["isError"] != true && r.get("result").is_some() {
                ok += 1;
            }
        }
        ok
    };
    let (a, b) = tokio::join!(
        tokio::spawn(calls(parent.sse_url(), parent.token().to_string(), "p")),
        tokio::spawn(calls(child.sse_url(), child.token().to_string(), "c")),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a + b, 30, "parent {a} + child {b}");
    assert!(b > 0);
    let denied: Vec<_> = tg
        .calls()
        .into_iter()
        .filter(|r| r.outcome.as_deref() == Some("denied"))
        .collect();
    assert_eq!(denied.len(), 20);
    assert!(denied
        .iter()
        .filter(|r| r.agent_id.as_deref() == Some("researcher"))
        .all(|r| r.reason.as_deref().unwrap().contains("ancestor")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_the_parent_ends_the_child_first_and_records_say_so() {
    let tg = gateway();
    let gw = &tg.gateway;
    // Keeps the data server up once the family is gone (linger 0), so its URLs can be asked.
    let _bystander = gw
        .register(RegistrationSpec::new("bystander").grant("demo.echo"))
        .await
        .unwrap();
    let parent = gw.register(tools3().label("run-1")).await.unwrap();
    let child = gw
        .register(
            RegistrationSpec::new("researcher")
                .grant("demo.slow")
                .grant("demo.echo")
                .parent(parent.id()),
        )
        .await
        .unwrap();
    let mut cc = SseClient::connect(&child.sse_url(), child.token()).await;
    cc.initialize().await;
    let r = cc.call("demo.echo", json!({"text": "x"})).await;
    assert_eq!(text_of(&r), "e:x");
    // A slow call in flight on the child when the parent is released.
    cc.post(json!({"jsonrpc":"2.0","id":77,"method":"tools/call","params":{"name":"demo.slow","arguments":{"ms":30000}}}))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (child_id, parent_id) = (child.id().to_string(), parent.id().to_string());
    let (child_urls, parent_urls) = (
        [child.sse_url(), child.mcp_url()],
        [parent.sse_url(), parent.mcp_url()],
    );
    let child_token = child.token().to_string();
    parent.release().await;
    // The child's stream ended; both URL sets answer 404.
    assert!(
        cc.next_message(5).await.is_none(),
        "the child's stream did not end"
    );
    for u in child_urls.iter().chain(parent_urls.iter()) {
        let r = http()
            .get(u)
            .bearer_auth(&child_token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{u}");
    }
    drop(child);
    let recs = tg.audit();
    let pos =
        |f: &dyn Fn(&gatehouse::testing::audit::Record) -> bool| recs.iter().position(f).unwrap();
    let child_call =
        pos(&|r| r.event == "governed_mcp_call" && r.tool.as_deref() == Some("demo.slow"));
    let child_released = pos(&|r| {
        r.event == "registration_released" && r.registration_id.as_deref() == Some(&child_id)
    });
    let parent_released = pos(&|r| {
        r.event == "registration_released" && r.registration_id.as_deref() == Some(&parent_id)
    });
    assert_eq!(recs[child_call].outcome.as_deref(), Some("cancelled"));
    assert!(
        child_call < child_released && child_released < parent_released,
        "{child_call} {child_released} {parent_released}"
    );
    assert!(recs[child_released]
        .reason
        .as_deref()
        .unwrap()
        .contains(&parent_id));
    // Attribution: every child record names its parent and the agent path.
    for r in recs
        .iter()
        .filter(|r| r.registration_id.as_deref() == Some(&child_id))
    {
        assert_eq!(
            r.rare().parent_registration_id.as_deref(),
            Some(parent_id.as_str())
        );
        assert_eq!(
            r.rare().agent_path.as_deref(),
            Some(&["planner".to_string(), "researcher".to_string()][..]),
            "{r:?}"
        );
    }
    // `gatehouse audit --agent-id planner --descendants` shows the family; without the flag,
    // the planner's own records only.
    let run = |extra: &[&str]| {
        let mut args = vec!["audit", "--json", "--agent-id", "planner", "--file"];
        let path = tg.audit_path();
        let path = path.to_str().unwrap().to_string();
        args.push(&path);
        args.extend_from_slice(extra);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gatehouse"))
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let family = run(&["--descendants"]);
    let own = run(&[]);
    assert!(
        family.contains("researcher") && family.contains("planner"),
        "{family}"
    );
    assert!(!own.contains("\"researcher\""), "{own}");
}

/// With the daemon's store (sqlite, issue 35): a parent and its child survive a kill -9 as a
/// family (the child restored under its parent, with its one tool), and releasing the parent
/// afterwards still releases the child first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_family_outlives_a_kill_9_and_still_ends_together() {
    use common::daemon::Daemon;
    use reqwest::Method as M;
    let mut d = Daemon::start("", "", "info", &[]);
    let parent = d
        .register(json!({"agent_id": "planner", "tools": ["demo.echo", "demo.slow"], "ttl_s": 600}))
        .await;
    let (pid, ptoken) = (
        parent["id"].as_str().unwrap(),
        parent["token"].as_str().unwrap(),
    );
    let child = d
        .register(json!({"agent_id": "researcher", "tools": ["demo.echo"], "parent": pid}))
        .await;
    let (cid, ctoken) = (
        child["id"].as_str().unwrap(),
        child["token"].as_str().unwrap(),
    );
    d.kill9_and_restart();
    let (s, shown) = d
        .admin_call(M::GET, &format!("/v1/registrations/{cid}"), None)
        .await;
    assert_eq!(s, 200, "{shown}");
    assert_eq!(shown["parent"], pid);
    assert_eq!(shown["agent_path"], json!(["planner", "researcher"]));
    assert_eq!(shown["tools"], json!(["demo.echo"]));
    let (_, p) = d
        .admin_call(M::GET, &format!("/v1/registrations/{pid}"), None)
        .await;
    assert_eq!(p["children"], json!([cid]));
    // The same token serves the child after the restart (stateless: nothing to redo).
    let url = format!("{}/gw/{cid}/mcp", d.data);
    let r = stateless(
        &url,
        ctoken,
        1,
        "tools/call",
        json!({"name":"demo.echo","arguments":{"text":"back"}}),
    )
    .await;
    assert_eq!(text_of(&r), "researcher:back", "{r}");
    // Releasing the parent ends the child first, also after the restart.
    let (s, _) = d
        .admin_call(M::DELETE, &format!("/v1/registrations/{pid}"), None)
        .await;
    assert_eq!(s, 204);
    for (id, token) in [(cid, ctoken), (pid, ptoken)] {
        let r = http()
            .post(format!("{}/gw/{id}/mcp", d.data))
            .bearer_auth(token)
            .json(&json!({"jsonrpc":"2.0","id":1,"method":"ping"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{id}");
    }
    let recs = d.audit();
    let at = |id: &str| {
        recs.iter()
            .rposition(|r| {
                r.event == "registration_released" && r.registration_id.as_deref() == Some(id)
            })
            .unwrap()
    };
    assert!(at(cid) < at(pid));
}
