//! Tool names as agents see them (docs/upstreams.md "Tool names"; issue 18 item 7): the
//! gateway-wide and per-upstream separator (`.`, `_`, `__`), the opt-in model-safe rule
//! (`^[a-zA-Z0-9_-]{1,64}$`, a digest suffix on overflow), collisions refused at registration
//! naming both tools, and grants that name `<upstream>.<tool>` whatever the separator — all
//! through a real upstream (the helpdesk demo, a stdio child) and a real SSE client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{text_of, SseClient, TestGateway};
use gatehouse::config::UpstreamConfig;
use gatehouse::{Config, RegistrationSpec};
use serde_json::json;

fn helpdesk(id: &str, more_toml: &str) -> UpstreamConfig {
    common::helpdesk(
        id,
        "shared",
        &[],
        &format!("call_timeout_s = 10\n{more_toml}"),
    )
}

fn gateway(f: impl FnOnce(&mut Config)) -> TestGateway {
    TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        f(c);
    })
}

fn model_safe(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separators_gateway_wide_and_per_upstream_and_grants_keep_working() {
    let tg = gateway(|c| {
        c.tool_name_separator = "__".into();
        c.upstreams = vec![
            helpdesk("hd", ""),
            helpdesk("legacy", "name_separator = \".\""),
            helpdesk("flat", "name_separator = \"_\""),
        ];
    });
    // Globs and exact grants name `<upstream>.<tool>`, whatever the separator.
    let reg = tg
        .gateway
        .register(
            RegistrationSpec::new("a")
                .grant("hd.*")
                .grant("legacy.open_case")
                .grant("flat.list_notes"),
        )
        .await
        .unwrap();
    assert_eq!(
        reg.tools(),
        vec![
            "flat_list_notes",
            "hd__add_note",
            "hd__add_note_slow",
            "hd__list_notes",
            "hd__open_case",
            "legacy.open_case",
        ]
    );
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    c.initialize().await;
    assert_eq!(c.tool_names().await, reg.tools());
    let r = c.call("hd__open_case", json!({"title": "t"})).await;
    assert!(text_of(&r).contains("\"case_id\":\"case-"), "{r}");
    let r = c.call("legacy.open_case", json!({"title": "t"})).await;
    assert!(text_of(&r).contains("\"case_id\":\"case-"), "{r}");
    // The dotted name is not a second way in once the separator is `__`.
    let r = c.call("hd.open_case", json!({"title": "t"})).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    // An exposed name is not a grant: grants mean the same under every naming config.
    let err = tg
        .gateway
        .register(RegistrationSpec::new("a").grant("hd__open_case"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("matches no tool"), "{err}");
    // The audit names the tool as the agent called it.
    let calls = tg.calls();
    assert_eq!(calls[0].tool.as_deref(), Some("hd__open_case"));
    tg.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_safe_names_fit_the_rule_with_a_digest_on_overflow() {
    let long = format!("create.{}", "very_long_case_opening_tool_name_".repeat(3));
    let tg = gateway(|c| {
        c.tool_name_separator = "_".into();
        c.model_safe_tool_names = true;
        c.upstreams = vec![helpdesk(
            "helpdesk",
            &format!("rename = {{ open_case = \"{long}\", list_notes = \"notes.list\" }}"),
        )];
    });
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("a").grant("helpdesk.*"))
        .await
        .unwrap();
    let names = reg.tools();
    assert!(names.iter().all(|n| model_safe(n)), "{names:?}");
    assert!(
        names.contains(&"helpdesk_notes_list".to_string()),
        "{names:?}"
    );
    let opener = names
        .iter()
        .find(|n| n.starts_with("helpdesk_create_very"))
        .unwrap()
        .clone();
    assert_eq!(opener.len(), 64);
    // Deterministic: the same name in another registration, and across gateways.
    let again = tg
        .gateway
        .register(RegistrationSpec::new("b").grant(format!("helpdesk.{long}")))
        .await
        .unwrap();
    assert_eq!(again.tools(), vec![opener.clone()]);
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    c.initialize().await;
    let r = c.call(&opener, json!({"title": "t"})).await;
    assert!(text_of(&r).contains("\"case_id\":\"case-"), "{r}");
    tg.gateway.shutdown().await;

    let tg2 = gateway(|c| {
        c.tool_name_separator = "_".into();
        c.model_safe_tool_names = true;
        c.upstreams = vec![helpdesk(
            "helpdesk",
            &format!("rename = {{ open_case = \"{long}\" }}"),
        )];
    });
    let reg2 = tg2
        .gateway
        .register(RegistrationSpec::new("a").grant("helpdesk.*"))
        .await
        .unwrap();
    assert!(reg2.tools().contains(&opener));
    tg2.gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collisions_are_refused_at_registration_naming_both_tools() {
    let tg = gateway(|c| {
        c.upstreams = vec![helpdesk(
            "helpdesk",
            "name_separator = \"__\"\nmodel_safe_names = true\nrename = { open_case = \"x.y\", list_notes = \"x_y\" }",
        )];
    });
    let err = tg
        .gateway
        .register(RegistrationSpec::new("a").grant("helpdesk.*"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("collision"), "{err}");
    assert!(err.contains("\"helpdesk.x.y\""), "{err}");
    assert!(err.contains("\"helpdesk.x_y\""), "{err}");
    assert!(err.contains("\"helpdesk__x_y\""), "{err}");
    // Granting only one of them is fine.
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("a").grant("helpdesk.x.y"))
        .await
        .unwrap();
    assert_eq!(reg.tools(), vec!["helpdesk__x_y"]);
    tg.gateway.shutdown().await;

    // An in-process tool against a bare upstream name, the same.
    let tg = gateway(|c| {
        c.upstreams = vec![helpdesk("helpdesk", "bare_names = true")];
    });
    let err = tg
        .gateway
        .register(
            RegistrationSpec::new("a")
                .grant("helpdesk.open_case")
                .with_tool(common::echo_tool("open_case", "E")),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("in-process tool \"open_case\"") && err.contains("\"helpdesk.open_case\""),
        "{err}"
    );
    tg.gateway.shutdown().await;
}

#[test]
fn config_keys_are_validated() {
    let ok = |t: &str| {
        Config::from_toml_str(t)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let up = "[[upstreams]]\nid = \"hd\"\ncommand = \"x\"\n";
    assert!(ok(&format!("tool_name_separator = \"__\"\n{up}")).is_ok());
    let e = ok(&format!("tool_name_separator = \"-\"\n{up}")).unwrap_err();
    assert!(e.contains("tool_name_separator"), "{e}");
    let e = ok(&format!("{up}name_separator = \"::\"\n")).unwrap_err();
    assert!(e.contains("name_separator"), "{e}");
    // Model-safe names cannot keep the `.` separator.
    let e = ok(&format!("model_safe_tool_names = true\n{up}")).unwrap_err();
    assert!(e.contains("model-safe") && e.contains("\"hd\""), "{e}");
    assert!(ok(&format!(
        "model_safe_tool_names = true\n{up}name_separator = \"_\"\n"
    ))
    .is_ok());
    assert!(ok(&format!(
        "model_safe_tool_names = true\n{up}bare_names = true\n"
    ))
    .is_ok());
    assert!(ok(&format!(
        "{up}model_safe_names = true\nname_separator = \"__\"\n"
    ))
    .is_ok());
    // The shipped config stays valid.
    Config::from_file(&common::repo_root().join("config/gatehouse.toml")).unwrap();
}

/// The same rules with real clients and a real upstream written by others: server-everything's
/// tools (hyphenated names such as `trigger-long-running-operation`) under `__` and the
/// model-safe rule, listed and called by the Python SDK 2.x (legacy SSE, Streamable HTTP, the
/// stateless 2026-07-28 Client) and fastmcp (stateless): every name fits
/// `^[a-zA-Z0-9_-]{1,64}$`, and the call by that name reaches the tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_list_and_call_model_safe_names_of_server_everything() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let py2 = root.join("tests/peers/.venv/bin/python");
    let pyf = root.join("tests/peers/.venv-fastmcp/bin/python");
    for p in [&py2, &pyf] {
        assert!(
            p.exists(),
            "run tests/peers/setup.sh first ({} missing)",
            p.display()
        );
    }
    let up = common::everything(
        "everything",
        "shared",
        30,
        "name_separator = \"__\"\nmodel_safe_names = true",
    );
    let tg = gateway(|c| c.upstreams = vec![up]);
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("a").grant("everything.*"))
        .await
        .unwrap();
    let call_args = r#"{"message":"hi"}"#;
    let runs: Vec<(&str, &std::path::Path, Vec<String>)> = vec![
        (
            "SDK 2.x legacy SSE",
            &py2,
            vec![
                "tests/peers/py_client.py".into(),
                "--transport".into(),
                "sse".into(),
                "--url".into(),
                reg.sse_url(),
            ],
        ),
        (
            "SDK 2.x Streamable HTTP",
            &py2,
            vec![
                "tests/peers/py_client.py".into(),
                "--transport".into(),
                "streamable".into(),
                "--url".into(),
                reg.mcp_url(),
            ],
        ),
        (
            "SDK 2.x stateless",
            &py2,
            vec![
                "tests/peers/py_client.py".into(),
                "--transport".into(),
                "client".into(),
                "--mode".into(),
                "2026-07-28".into(),
                "--url".into(),
                reg.mcp_url(),
            ],
        ),
        (
            "fastmcp stateless",
            &pyf,
            vec![
                "tests/peers/fastmcp_client.py".into(),
                "--url".into(),
                reg.mcp_url(),
            ],
        ),
    ];
    for (what, py, mut a) in runs {
        a[0] = root.join(&a[0]).display().to_string();
        a.extend([
            format!("--token={}", reg.token()),
            "--call".into(),
            "everything__echo".into(),
            "--args".into(),
            call_args.into(),
        ]);
        let out = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            tokio::process::Command::new(py)
                .args(&a)
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(
            out.status.success(),
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let names: Vec<&str> = v["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t.as_str())
            .collect();
        assert!(names.len() >= 5, "{what}: {names:?}");
        assert!(names.iter().all(|n| model_safe(n)), "{what}: {names:?}");
        assert!(
            names.contains(&"everything__trigger-long-running-operation"),
            "{what}: {names:?}"
        );
        let text = v["call"]["content"][0]["text"].as_str().unwrap_or_default();
        assert!(text.contains("hi"), "{what}: {v}");
    }
}

/// The same through the Python SDK 1.x (legacy SSE, Streamable HTTP) and mcp-remote
/// (`sse-only`, `http-only`, `http-only --protocol auto` = stateless): server-everything under
/// `__` and the model-safe rule, one of its tools renamed past 64 characters so that its
/// exposed name ends in the digest suffix. Every listed name fits `^[a-zA-Z0-9_-]{1,64}$`,
/// the list is the registration's own, and calls by the hyphenated and the digest-suffixed
/// names reach the tools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk1_and_mcp_remote_list_and_call_model_safe_and_digest_names() {
    use common::mcp_remote::McpRemote;
    use common::peers::{batch, ok, step_text};
    let long = "echo-back-whatever-message-it-is-given-under-a-name-far-too-long-for-model-apis";
    let up = common::everything(
        "everything",
        "shared",
        30,
        &format!(
            "name_separator = \"__\"\nmodel_safe_names = true\nrename = {{ echo = \"{long}\" }}"
        ),
    );
    let tg = gateway(|c| c.upstreams = vec![up]);
    let reg = tg
        .gateway
        .register(RegistrationSpec::new("a").grant("everything.*"))
        .await
        .unwrap();
    let mut want = reg.tools();
    want.sort();
    let digest = want
        .iter()
        .find(|n| n.starts_with("everything__echo-back"))
        .unwrap_or_else(|| panic!("{want:?}"))
        .clone();
    assert_eq!(digest.len(), 64, "{digest}");
    assert!(!digest.contains("model-apis"), "not shortened: {digest}");
    let sum = "everything__get-sum";
    let check = |what: &str, mut names: Vec<String>| {
        assert!(names.iter().all(|n| model_safe(n)), "{what}: {names:?}");
        names.sort();
        assert_eq!(names, want, "{what}");
    };

    let steps = json!([
        {"name": "echo", "tool": digest, "args": {"message": "hi"}},
        {"name": "sum", "tool": sum, "args": {"a": 2, "b": 3}},
    ]);
    let cells = json!([
        {"transport": "sse", "url": reg.sse_url(), "token": reg.token(), "steps": steps},
        {"transport": "streamable", "url": reg.mcp_url(), "token": reg.token(), "steps": steps},
    ]);
    for (res, t) in batch(".venv-mcp1", "mcp1_client.py", &cells)
        .await
        .iter()
        .zip(["sse", "streamable"])
    {
        let what = format!("SDK 1.x over {t}");
        let out = ok(&what, res);
        let names = out["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap().to_string())
            .collect();
        check(&what, names);
        assert_eq!(step_text(&out["steps"]["echo"]), "Echo: hi", "{what}");
        assert!(
            step_text(&out["steps"]["sum"]).contains('5'),
            "{what}: {out}"
        );
    }

    for (what, url, extra) in [
        (
            "mcp-remote sse-only",
            reg.sse_url(),
            &["--transport", "sse-only"][..],
        ),
        (
            "mcp-remote http-only",
            reg.mcp_url(),
            &["--transport", "http-only"][..],
        ),
        (
            "mcp-remote --protocol auto",
            reg.mcp_url(),
            &["--transport", "http-only", "--protocol", "auto"][..],
        ),
    ] {
        let mut remote = McpRemote::start(&url, reg.token(), extra);
        remote.initialize(json!({}), 30).await;
        let listed = remote.request("tools/list", json!({}), 30).await;
        let names = listed["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{what}: {listed}"))
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect();
        check(what, names);
        let r = remote
            .request(
                "tools/call",
                json!({"name": digest, "arguments": {"message": "hi"}}),
                30,
            )
            .await;
        assert_eq!(r["result"]["content"][0]["text"], "Echo: hi", "{what}: {r}");
        let r = remote
            .request(
                "tools/call",
                json!({"name": sum, "arguments": {"a": 2, "b": 3}}),
                30,
            )
            .await;
        assert!(
            r["result"]["content"][0]["text"]
                .as_str()
                .is_some_and(|t| t.contains('5')),
            "{what}: {r}"
        );
        remote.stop().await;
    }
    let transports: Vec<String> = tg
        .calls()
        .iter()
        .map(|r| r.transport.clone().unwrap().into())
        .collect();
    assert_eq!(
        transports,
        [
            "sse",
            "sse",
            "streamable_http",
            "streamable_http",
            "sse",
            "sse",
            "streamable_http",
            "streamable_http",
            "stateless",
            "stateless"
        ]
    );
    tg.gateway.shutdown().await;
}
