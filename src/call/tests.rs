//! Unit tests of the call pipeline (`#[cfg(test)] mod tests` in `call/mod.rs`): compiled only
//! for `cargo test`, never on a request path, so their `unwrap`s and `panic!`s fail a test.

use std::sync::Arc;

use serde_json::json;

use super::execute::{is_error, may_say_is_error};
use super::finish::conclude;
use super::types::{Ended, Refused};
use super::*;
use crate::audit::{Outcome, MAX_TOOL_NAME_BYTES};
use crate::registration::RegistrationState;
use crate::tools::{Backend, ToolResult};

fn registration(limits: crate::registration::Limits) -> RegistrationState {
    let tool = crate::tools::InProcessTool::new("echo", "echo", json!({}), |_, _| async {
        Ok(ToolResult::text("hi"))
    });
    let tools = crate::tools::ToolSet::new(vec![GrantedTool {
        name: "echo".into(),
        descriptor: Arc::new(json!({"name": "echo"})),
        backend: Backend::InProcess(tool),
    }]);
    let spec = crate::registration::RegistrationSpec::new("a").limits(limits);
    RegistrationState::new("r".into(), "t", &spec, tools)
}

fn code_and_outcome(r: &Refused) -> (i64, Outcome) {
    match &r.ended {
        Ended::Error(code, _, o) => (*code, *o),
        other => panic!("{other:?}"),
    }
}

#[test]
fn parse_reads_the_params_once_and_refuses_what_is_malformed() {
    let c = parse(Some(json!({"name": "echo", "arguments": {"a": 1},
        "_meta": {"progressToken": 7}, "x": true})))
    .unwrap();
    assert_eq!(c.name, "echo");
    assert_eq!(c.arguments, json!({"a": 1}));
    assert_eq!(c.progress_token, Some(json!(7)));
    assert_eq!(
        c.params["arguments"],
        Value::Null,
        "taken out, its place kept"
    );
    assert_eq!(c.params["x"], true);
    let c = parse(Some(json!({"name": "echo", "arguments": null}))).unwrap();
    assert_eq!(c.arguments, json!({}));
    let long = "x".repeat(MAX_TOOL_NAME_BYTES + 1);
    for (params, tool, reason, outcome) in [
        (
            None,
            None,
            "params must be an object with a name",
            Outcome::ProtocolError,
        ),
        (
            Some(json!([1])),
            None,
            "params must be an object with a name",
            Outcome::ProtocolError,
        ),
        (
            Some(json!({"name": 3})),
            None,
            "missing tool name",
            Outcome::ProtocolError,
        ),
        (
            Some(json!({"name": "echo", "arguments": [1]})),
            Some("echo"),
            "arguments must be an object",
            Outcome::ProtocolError,
        ),
        (
            Some(json!({"name": long})),
            Some(long.as_str()),
            "tool name too long",
            Outcome::Denied,
        ),
    ] {
        let r = parse(params).unwrap_err();
        assert_eq!(r.tool.as_deref(), tool);
        assert!(r.reason.starts_with(reason), "{}", r.reason);
        assert_eq!(
            code_and_outcome(&r),
            (crate::protocol::error::INVALID_PARAMS, outcome)
        );
    }
}

#[tokio::test]
async fn admission_refuses_in_order_and_gives_back_its_slot_when_dropped() {
    let store = crate::store::memory::MemoryStore::default();
    let budget = Budget {
        store: &store,
        block: 64,
    };
    let args = serde_json::Value::Null;
    let govern = super::Govern {
        config: None,
        args: &args,
    };
    let admit = |reg, name, healthy| admit(budget, reg, name, healthy, govern);
    let reg = registration(crate::registration::Limits {
        max_calls: Some(2),
        max_concurrent: Some(1),
        call_timeout_s: None,
        ..Default::default()
    });
    let (_, r) = admit(&reg, "nope", true).await.unwrap_err();
    assert_eq!(
        code_and_outcome(&r),
        (crate::protocol::error::INVALID_PARAMS, Outcome::Denied)
    );
    let (tool, r) = admit(&reg, "echo", false).await.unwrap_err();
    assert!(tool.is_some() && matches!(r.ended, Ended::AuditDown));
    assert_eq!(reg.budget().started(), 0, "refused before the limits");
    let (_, held, _) = admit(&reg, "echo", true).await.unwrap();
    assert_eq!(reg.budget().in_flight(), 1);
    let (_, r) = admit(&reg, "echo", true).await.unwrap_err();
    assert!(
        matches!(&r.ended, Ended::Limited(w) if w.contains("max_concurrent")),
        "{r:?}"
    );
    drop(held);
    assert_eq!(reg.budget().in_flight(), 0, "given back");
    let (_, r) = admit(&reg, "echo", true).await.unwrap_err();
    assert!(
        matches!(&r.ended, Ended::Limited(w) if w.contains("max_calls (2)")),
        "{r:?}"
    );
    assert_eq!(reg.budget().started(), 2);
    assert_eq!(reg.budget().in_flight(), 0);
}

#[test]
fn every_ending_concludes_into_one_outcome_reason_and_reply() {
    let id = json!(1);
    let c = conclude(
        &id,
        Ended::AuditDown,
        Some("audit log unavailable".into()),
        false,
    );
    assert_eq!(
        (c.outcome, c.error_code, c.unconditional),
        (Outcome::Denied, None, true)
    );
    assert_eq!(c.reason.as_deref(), Some("audit log unavailable"));
    let reply = c.reply.unwrap().into_value();
    assert_eq!(
        reply["error"]["code"],
        crate::protocol::error::INTERNAL_ERROR
    );
    for (released, why) in [
        (false, "cancelled by client or session end"),
        (true, "registration released"),
    ] {
        let c = conclude(&id, Ended::Cancelled, None, released);
        assert_eq!(
            (c.outcome, c.reason.as_deref(), c.reply.is_none()),
            (Outcome::Cancelled, Some(why), true)
        );
    }
    let c = conclude(&id, Ended::Limited("limit x".into()), None, false);
    assert_eq!(
        (c.outcome, c.reason.as_deref()),
        (Outcome::Denied, Some("limit x"))
    );
    assert_eq!(c.reply.unwrap().into_value()["result"]["isError"], true);
    let c = conclude(&id, Ended::TimedOut(0.5), None, false);
    assert_eq!(
        (c.outcome, c.reason.as_deref()),
        (Outcome::Timeout, Some("call_timeout_s (0.5) elapsed"))
    );
    let c = conclude(
        &id,
        Ended::Error(-32030, "busy".into(), Outcome::Denied),
        None,
        false,
    );
    assert_eq!(
        (c.error_code, c.reason.as_deref()),
        (Some(-32030), Some("busy"))
    );
    let c = conclude(
        &id,
        Ended::Error(-32602, "Unknown tool: x".into(), Outcome::Denied),
        Some("unknown tool".into()),
        false,
    );
    assert_eq!(
        c.reason.as_deref(),
        Some("unknown tool"),
        "the step's reason first"
    );
    let c = conclude(
        &id,
        Ended::Result(json!({"content": []}), Outcome::Ok),
        None,
        false,
    );
    assert_eq!(
        (c.outcome, c.reason, c.error_code, c.unconditional),
        (Outcome::Ok, None, None, false)
    );
}

#[test]
fn is_error_is_read_from_the_text() {
    let raw = |t: &str| serde_json::value::RawValue::from_string(t.to_string()).unwrap();
    assert!(is_error(&raw(r#"{"content":[],"isError":true}"#)));
    assert!(is_error(&raw(
        r#"{"isError" :  true , "x": {"isError": false}}"#
    )));
    assert!(!is_error(&raw(r#"{"content":[],"isError":false}"#)));
    assert!(!is_error(&raw(r#"{"content":[{"isError":true}]}"#)));
    assert!(!is_error(&raw(r#"{"isError":"true"}"#)));
    assert!(!is_error(&raw(r#"[true]"#)));
    assert!(!is_error(&raw(r#"{"content":[],"isError" : false}"#)));
    assert!(is_error(&raw(r#"{"a":{"isError":false},"isError":
 true}"#)));
    assert!(!is_error(&raw(
        r#"{"content":[{"type":"text","text":"isError\": true"}]}"#
    )));
    // The key spelled with escapes is the same key.
    assert!(is_error(&raw(r#"{"\u0069sError":true}"#)));
    assert!(!is_error(&raw(
        r#"{"content":[{"type":"text","text":"a\nb"}]}"#
    )));
    // An escaped backslash before a `u` is no `\u` escape; one after it is.
    assert!(!is_error(&raw(r#"{"text":"a\\u","isError":false}"#)));
    assert!(is_error(&raw(r#"{"text":"a\\\u0041","isError":true}"#)));
    assert!(is_error(&raw(r#"{"E":1,"isError":true}"#)));
    assert!(!is_error(&raw(r#"{"text":"Error","isError" : false}"#)));
}

/// The pre-check: true wherever the flag could be `true` (the parse then decides).
#[test]
fn may_say_is_error_reads_bytes() {
    for (t, maybe) in [
        (r#"{"content":[],"isError":true}"#, true),
        (r#"{"isError" :  true}"#, true),
        (r#"{"isError":false}"#, false),
        (r#"isError"#, false),
        (r#"E"#, false),
        (r#"sE"#, false),
        (r#"{"isError":"#, false),
        (r#"{"a\\":1,"isError":	true}"#, true),
        (r#"{"a\\u":1}"#, false),
        (r#"{"a\\\u0069":1}"#, true),
        (r#"\\"#, false),
        (r#"\"#, false),
        (r#"{"é\é":1}"#, false),
        (r#"{"EisError":true}"#, true),
        (r#"{"isErrorisError":true}"#, true),
        (r#"{"isErrorX":true}"#, false),
    ] {
        assert_eq!(may_say_is_error(t), maybe, "{t}");
    }
}
