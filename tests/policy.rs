//! Governed calls decided per call (issue 49): CEL policy rules over the tool and its
//! arguments, a family's rules (a child only narrows), a bad expression's 400, rate limits
//! under concurrency, and a reload's new config rules, on a real `gatehouse serve` through
//! real sockets (the official Python SDK client; plain 2026-07-28 HTTP calls for the load).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::daemon::{config_text, Daemon};
use serde_json::{json, Value};

/// One stateless (2026-07-28) `tools/call` on the daemon's data listener: the JSON-RPC answer.
async fn call(http: &reqwest::Client, d: &Daemon, reg: &Value, tool: &str, args: Value) -> Value {
    let id = reg["id"].as_str().unwrap();
    let params = json!({
        "name": tool,
        "arguments": args,
        "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                  "io.modelcontextprotocol/clientCapabilities": {}},
    });
    let r = http
        .post(format!("{}/gw/{id}/mcp", d.data))
        .bearer_auth(reg["token"].as_str().unwrap())
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    r.json().await.unwrap()
}

/// The text of a call's result, and whether it is a tool error.
fn text(v: &Value) -> (String, bool) {
    let r = &v["result"];
    (
        r["content"][0]["text"].as_str().unwrap_or("").to_string(),
        r["isError"].as_bool().unwrap_or(false),
    )
}

fn daemon(extra: &str) -> Daemon {
    Daemon::start(extra, "", "warn", &[])
}

const WORKSPACE_RULE: &str =
    "tool.name == 'demo.echo' && has(args.path) && !args.path.startsWith('/workspace/')";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_outside_workspace_is_denied_and_one_inside_is_allowed() {
    let d = daemon("");
    let reg = d
        .register(json!({
            "agent_id": "writer",
            "tools": ["demo.*"],
            "policy": [
                {"id": "workspace_only", "when": WORKSPACE_RULE, "effect": "deny",
                 "reason": "writes go under /workspace only"},
                {"id": "read_only_hint", "when": "tool.annotations.readOnlyHint == true && false",
                 "effect": "deny", "reason": "never"},
            ],
        }))
        .await;
    // The official Python SDK client, on a Streamable HTTP session.
    let steps = json!([
        {"name": "inside", "tool": "demo.echo",
         "args": {"text": "in", "path": "/workspace/notes.txt"}},
        {"name": "outside", "tool": "demo.echo",
         "args": {"text": "out", "path": "/etc/passwd"}},
        {"name": "dotdot", "tool": "demo.echo",
         "args": {"text": "up", "path": "/workspace2/x"}},
    ]);
    let cells = common::peers::batch(
        ".venv",
        "py_client.py",
        &json!([{"transport": "streamable", "url": reg["mcp_url"], "token": reg["token"],
                 "steps": steps}]),
    )
    .await;
    let out = common::peers::ok("py_client.py", &cells[0]);
    let s = &out["steps"];
    let inside = &s["inside"]["ok"]["call"];
    assert_eq!(inside["isError"], json!(false), "{s}");
    assert_eq!(common::peers::step_text(&s["inside"]), "writer:in", "{s}");
    for name in ["outside", "dotdot"] {
        let c = &s[name]["ok"]["call"];
        assert_eq!(c["isError"], json!(true), "{name}: {s}");
        let t = common::peers::step_text(&s[name]);
        assert!(
            t.contains("workspace_only") && t.contains("writes go under /workspace only"),
            "{name}: {t}"
        );
    }
    // Audited `denied` with the rule's id; the allowed call `ok`.
    d.wait_audit(10, |recs| {
        recs.iter()
            .filter(|r| r.event == "governed_mcp_call")
            .count()
            >= 3
    })
    .await;
    let recs: Vec<_> = d
        .audit()
        .into_iter()
        .filter(|r| r.event == "governed_mcp_call")
        .collect();
    let denied: Vec<_> = recs
        .iter()
        .filter(|r| r.outcome.as_deref() == Some("denied"))
        .collect();
    assert_eq!(denied.len(), 2, "{recs:?}");
    for r in &denied {
        let reason = r.reason.as_deref().unwrap_or("");
        assert!(
            reason.starts_with("policy rule workspace_only:"),
            "{reason}"
        );
        // The rule's id in a field of its own (`rule`), besides the reason.
        assert_eq!(r.rare().rule.as_deref(), Some("workspace_only"), "{r:?}");
    }
    let ok = recs.iter().find(|r| r.outcome.as_deref() == Some("ok"));
    assert!(ok.is_some_and(|r| r.rare().rule.is_none()), "{recs:?}");
    assert_eq!(
        recs.iter()
            .filter(|r| r.outcome.as_deref() == Some("ok"))
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_cannot_widen_its_parents_rules_and_can_narrow_them() {
    let d = daemon("");
    let http = common::http();
    let parent = d
        .register(json!({
            "agent_id": "parent",
            "tools": ["demo.*"],
            "policy": [{"id": "workspace_only", "when": WORKSPACE_RULE, "effect": "deny",
                        "reason": "writes go under /workspace only"}],
        }))
        .await;
    // The child tries to allow everything first, and denies one more thing.
    let child = d
        .register(json!({
            "agent_id": "child",
            "tools": ["demo.echo"],
            "parent": parent["id"],
            "policy": [
                {"id": "no_secrets", "when": "args.text == 'secret'", "effect": "deny",
                 "reason": "no secrets here"},
                {"id": "anything_goes", "when": "true", "effect": "allow"},
            ],
        }))
        .await;
    let outside = json!({"text": "t", "path": "/etc/passwd"});
    let (t, err) = text(&call(&http, &d, &child, "demo.echo", outside.clone()).await);
    assert!(
        err && t.contains("workspace_only"),
        "the child widened: {t}"
    );
    let (t, err) = text(&call(&http, &d, &parent, "demo.echo", outside).await);
    assert!(err && t.contains("workspace_only"), "{t}");
    // The child's own rule narrows it, not its parent.
    let secret = json!({"text": "secret", "path": "/workspace/a"});
    let (t, err) = text(&call(&http, &d, &child, "demo.echo", secret.clone()).await);
    assert!(err && t.contains("no_secrets"), "{t}");
    let (t, err) = text(&call(&http, &d, &parent, "demo.echo", secret).await);
    assert!(!err && t == "parent:secret", "{t}");
    let (t, err) = text(&call(&http, &d, &child, "demo.echo", json!({"text": "fine"})).await);
    assert!(!err && t == "child:fine", "{t}");
    // Under `[policy] default = "deny"` a child's allow adds nothing its parent lacks.
    let d2 = daemon("[policy]\ndefault = \"deny\"\n[[policy.rules]]\nid = \"echo_a\"\nwhen = \"args.text == 'a'\"\neffect = \"allow\"\n");
    let p2 = d2
        .register(json!({"agent_id": "p2", "tools": ["demo.*"]}))
        .await;
    let c2 = d2
        .register(
            json!({"agent_id": "c2", "tools": ["demo.echo"], "parent": p2["id"],
                         "policy": [{"id": "widen", "when": "true", "effect": "allow"}]}),
        )
        .await;
    let (t, err) = text(&call(&http, &d2, &c2, "demo.echo", json!({"text": "b"})).await);
    assert!(err && t.contains("default"), "{t}");
    let (t, err) = text(&call(&http, &d2, &c2, "demo.echo", json!({"text": "a"})).await);
    assert!(!err && t == "c2:a", "{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_expression_answers_400_naming_the_rule_the_position_and_the_cause() {
    let d = daemon("");
    let (s, v) = d
        .admin_call(
            reqwest::Method::POST,
            "/v1/registrations",
            Some(json!({
                "agent_id": "a",
                "tools": ["demo.*"],
                "policy": [
                    {"id": "fine", "when": "true", "effect": "allow"},
                    {"id": "broken", "when": "args.path.startsWith('/w') &&", "effect": "deny"},
                ],
            })),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    let e = v["error"].as_str().unwrap_or_default();
    assert!(
        e.contains("policy[1] (rule \"broken\")") && e.contains("line 1, column"),
        "{e}"
    );
    // Too deep: refused before any parser runs, with the column.
    let deep = format!("{}true{}", "(".repeat(40), ")".repeat(40));
    let (s, v) = d
        .admin_call(
            reqwest::Method::POST,
            "/v1/registrations",
            Some(json!({"agent_id": "a", "tools": ["demo.*"],
                        "policy": [{"id": "deep", "when": deep, "effect": "deny"}]})),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("column 13"), "{v}");
    // In config: the file is refused, naming the rule.
    let bad = "[[policy.rules]]\nid = \"cfg_bad\"\nwhen = \"tool.name = 'x'\"\neffect = \"deny\"\n";
    let e = gatehouse::Config::from_toml_str(bad)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("policy.rules[0] (rule \"cfg_bad\")") && e.contains("column"),
        "{e}"
    );
    // `approve` is accepted (an approver is required): the call is held, and with nobody to
    // decide within its timeout it is denied (tests/approvals.rs has the rest).
    let reg = d
        .register(json!({"agent_id": "a", "tools": ["demo.*"],
                         "policy": [{"id": "pay", "when": "true", "effect": "approve",
                                     "approver": "harness", "timeout_s": 1}]}))
        .await;
    let (t, err) = text(&call(&common::http(), &d, &reg, "demo.echo", json!({"text": "x"})).await);
    assert!(err && t.contains("pay") && t.contains("timed out"), "{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_are_exact_under_64_concurrent_calls() {
    let d = daemon("");
    let http = common::http();
    // 10 a minute for the registration: a token every 6 s, far longer than the burst takes.
    let whole = d
        .register(json!({"agent_id": "a", "tools": ["demo.*"],
                         "limits": {"calls_per_minute": 10}}))
        .await;
    // 7 a minute for one tool, none for the other.
    let per_tool = d
        .register(json!({"agent_id": "b", "tools": ["demo.*"],
                         "limits": {"tool_calls_per_minute": {"demo.echo": 7}}}))
        .await;
    for (reg, limit) in [(&whole, 10usize), (&per_tool, 7)] {
        let answers =
            futures::future::join_all(
                (0..64).map(|i| {
                    let http = http.clone();
                    let d = &d;
                    async move {
                        call(&http, d, reg, "demo.echo", json!({"text": format!("{i}")})).await
                    }
                }),
            )
            .await;
        let ok = answers.iter().filter(|a| a.get("result").is_some()).count();
        let limited: Vec<&Value> = answers
            .iter()
            .filter(|a| a["error"]["code"] == json!(-32030))
            .collect();
        assert_eq!(ok, limit, "{answers:?}");
        assert_eq!(limited.len(), 64 - limit, "{answers:?}");
        for a in &limited {
            let ms = a["error"]["data"]["retry_after_ms"].as_u64().unwrap();
            assert!(ms > 0 && ms <= 60_000 / limit as u64 + 1, "{a}");
        }
    }
    // The other tool is not limited for `b`.
    let slow = call(&http, &d, &per_tool, "demo.slow", json!({"ms": 1})).await;
    assert!(slow.get("result").is_some(), "{slow}");
    // Audited `denied` with reason `rate_limited`, and counted.
    let want = (64 - 10) + (64 - 7);
    d.wait_audit(10, |recs| {
        recs.iter()
            .filter(|r| r.reason.as_deref() == Some("rate_limited"))
            .count()
            >= want
    })
    .await;
    let recs = d.audit();
    let limited: Vec<_> = recs
        .iter()
        .filter(|r| r.reason.as_deref() == Some("rate_limited"))
        .collect();
    assert_eq!(limited.len(), want);
    assert!(limited
        .iter()
        .all(|r| r.outcome.as_deref() == Some("denied") && r.error_code == Some(-32030)));
    let m = d.metrics().await;
    assert!(
        m.lines()
            .any(|l| l == format!("gatehouse_tool_calls_rate_limited_total {want}")),
        "{m}"
    );
    // A child's limit is at most its parent's, and its calls take from the parent's too.
    let (s, v) = d
        .admin_call(
            reqwest::Method::POST,
            "/v1/registrations",
            Some(
                json!({"agent_id": "c", "tools": ["demo.echo"], "parent": whole["id"],
                        "limits": {"calls_per_minute": 11}}),
            ),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("calls_per_minute"),
        "{v}"
    );
    let child = d
        .register(json!({"agent_id": "c", "tools": ["demo.echo"], "parent": whole["id"]}))
        .await;
    let a = call(&http, &d, &child, "demo.echo", json!({"text": "c"})).await;
    assert_eq!(
        a["error"]["code"],
        json!(-32030),
        "the parent's bucket is empty: {a}"
    );
    assert!(
        a["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ancestor registration"),
        "{a}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_changed_config_rules_to_new_calls() {
    let rules = |word: &str| {
        format!(
            "[[upstreams]]\nid = \"helpdesk\"\ncommand = \"@self\"\nargs = [\"demo-upstream\"]\n\
             [[policy.rules]]\nid = \"no_{word}\"\nwhen = \"args.text == '{word}'\"\neffect = \"deny\"\nreason = \"not {word}\"\n\
             [[policy.rules]]\nid = \"helpdesk_only\"\nupstream = \"helpdesk\"\nwhen = \"true\"\neffect = \"deny\"\nreason = \"scoped\"\n"
        )
    };
    let d = daemon(&rules("x"));
    let http = common::http();
    let reg = d
        .register(json!({"agent_id": "a", "tools": ["demo.*", "helpdesk.list_notes"]}))
        .await;
    let (t, err) = text(&call(&http, &d, &reg, "demo.echo", json!({"text": "x"})).await);
    assert!(err && t.contains("no_x") && t.contains("not x"), "{t}");
    // A rule scoped to an upstream applies to its tools (args carry `text`: the first rule
    // reads it, and a rule that cannot be evaluated denies).
    let (t, err) = text(&call(&http, &d, &reg, "helpdesk.list_notes", json!({"text": "z"})).await);
    assert!(
        err && t.contains("helpdesk_only") && t.contains("scoped"),
        "{t}"
    );
    // A rule scoped to another upstream does not touch in-process tools.
    let (t, err) = text(&call(&http, &d, &reg, "demo.echo", json!({"text": "y"})).await);
    assert!(!err && t == "a:y", "{t}");
    std::fs::write(d.config_path(), config_text(d.dir(), &rules("y"), "")).unwrap();
    let (s, v) = d
        .admin_call(reqwest::Method::POST, "/v1/reload", None)
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["applied"], json!(["policy (changed)"]), "{v}");
    assert_eq!(v["needs_restart"], json!([]), "{v}");
    let (t, err) = text(&call(&http, &d, &reg, "demo.echo", json!({"text": "x"})).await);
    assert!(!err && t == "a:x", "{t}");
    let (t, err) = text(&call(&http, &d, &reg, "demo.echo", json!({"text": "y"})).await);
    assert!(err && t.contains("no_y"), "{t}");
    // A rule scoped to an upstream that is not configured is a config error.
    let e = gatehouse::Config::from_toml_str(
        "[[policy.rules]]\nid = \"s\"\nupstream = \"nope\"\nwhen = \"true\"\neffect = \"deny\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("\"nope\" is not a configured upstream"), "{e}");
    // A file with a bad rule is refused and changes nothing.
    let bad = "[[policy.rules]]\nid = \"b\"\nwhen = \"((\"\neffect = \"deny\"\n";
    std::fs::write(d.config_path(), config_text(d.dir(), bad, "")).unwrap();
    let (s, v) = d
        .admin_call(reqwest::Method::POST, "/v1/reload", None)
        .await;
    assert_eq!(s, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("(rule \"b\")"), "{v}");
    let (t, err) = text(&call(&http, &d, &reg, "demo.echo", json!({"text": "y"})).await);
    assert!(err && t.contains("no_y"), "{t}");
}
