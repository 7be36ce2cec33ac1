//! Step 1 of a call: its params read in one pass, what the record says of its arguments,
//! and its SERVER span (tracing on).

use serde_json::{Map, Value};

use super::finish::redact;
use super::types::{Ended, Refused, ToolCall};
use crate::audit::{args_digest, HexDigest, Outcome, MAX_TOOL_NAME_BYTES};
use crate::methods::request::RequestCtx;
use crate::telemetry::{CallTrace, Telemetry};

/// Step 1: the params of a `tools/call`, or why they are refused (malformed: a
/// `protocol_error`, -32602; a name longer than the audit keeps: `denied`, -32602).
pub(crate) fn parse(params: Option<Value>) -> Result<ToolCall, Refused> {
    let malformed = |tool, reason: &'static str, message: &str| Refused {
        tool,
        reason: reason.into(),
        ended: Ended::Error(
            crate::protocol::error::INVALID_PARAMS,
            message.to_string(),
            Outcome::ProtocolError,
        ),
        rule: None,
    };
    let mut params = match params {
        Some(Value::Object(m)) => m,
        _ => {
            return Err(malformed(
                None,
                "params must be an object with a name",
                "tools/call needs params {\"name\": string, \"arguments\"?: object}",
            ))
        }
    };
    let mut name = None;
    let mut arguments = None;
    let mut progress_token = None;
    let mut task = false;
    for (k, v) in params.iter_mut() {
        match k.as_str() {
            "name" => name = Some(&*v),
            "arguments" => arguments = Some(std::mem::take(v)),
            "_meta" => progress_token = v.get("progressToken").cloned(),
            "task" => task = true,
            _ => {}
        }
    }
    let name = match name {
        Some(Value::String(s)) => s.clone(),
        _ => {
            return Err(malformed(
                None,
                "missing tool name",
                "tools/call: \"name\" must be a string",
            ))
        }
    };
    let arguments = match arguments {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v,
        Some(_) => {
            return Err(malformed(
                Some(name),
                "arguments must be an object",
                "tools/call: \"arguments\" must be an object",
            ))
        }
    };
    if name.len() > MAX_TOOL_NAME_BYTES {
        // Not echoed: the reply names the rule, the record a cut, digested copy.
        let n = name.len();
        return Err(Refused {
            tool: Some(name),
            reason: format!("tool name too long ({n} bytes; at most {MAX_TOOL_NAME_BYTES})")
                .into(),
            ended: Ended::Error(
                crate::protocol::error::INVALID_PARAMS,
                format!(
                    "Unknown tool: the name is too long ({n} bytes; tool names are at most {MAX_TOOL_NAME_BYTES} bytes)"
                ),
                Outcome::Denied,
            ),
            rule: None,
        });
    }
    Ok(ToolCall {
        name,
        arguments,
        params,
        progress_token,
        task,
    })
}

/// What the record says of the arguments: their digest (redacted keys left out: a digest of a
/// low-entropy secret could be brute-forced offline) and, if configured, the redacted copy.
pub(super) fn asked(ctx: &RequestCtx, args: &Value) -> (HexDigest, Option<Value>) {
    let audit = &ctx.hub.config().audit;
    let redacted = (!audit.redact_keys.is_empty()).then(|| redact(args, &audit.redact_keys));
    let digest = args_digest(redacted.as_ref().unwrap_or(args));
    let arguments = audit
        .record_arguments
        .then(|| redacted.unwrap_or_else(|| args.clone()));
    (digest, arguments)
}

/// The SERVER span of a call (tracing on): its parent from `_meta`, else the HTTP header.
/// Out of line and cold: the call's own future does not carry its state.
#[cold]
pub(super) fn server_span(
    t: &Telemetry,
    ctx: &RequestCtx,
    id: &Value,
    call: &ToolCall,
) -> Box<CallTrace> {
    let reg = &ctx.registration;
    let inbound = crate::telemetry::Inbound::default()
        .with_meta(&call.params)
        .with_headers(ctx.trace_headers.as_deref())
        .without(|s| reg.token_in(&Value::from(s)));
    // `capture_tool_io`: the arguments as the audit would keep them (`redact_keys`), never
    // when they carry the token.
    let keys = &ctx.hub.config().audit.redact_keys;
    let redacted;
    let arguments = match t.captures_tool_io() && !reg.token_in(&call.arguments) {
        false => None,
        true if keys.is_empty() => Some(&call.arguments),
        true => {
            redacted = redact(&call.arguments, keys);
            Some(&redacted)
        }
    };
    t.server_span(
        inbound,
        &crate::telemetry::CallAbout {
            tool: &call.name,
            common: ctx.span_common(id),
            arguments,
        },
    )
}
