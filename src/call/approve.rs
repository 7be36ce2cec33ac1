//! Step 2b of a call an `approve` rule matched (issue 49 item 3): the call is held
//! (`approval::Approvals`, bounded) until its approver decides, its rule's `timeout_s` passes
//! (a denial), or it is cancelled (its client, its registration's release). `approver =
//! "harness"`: announced on the admin API; `"client"`: the MCP client's user is asked with an
//! `elicitation/create` on the call's own stream (a 2026-07-28 stateless call: the reply
//! engine turns it into an `input_required`, and the retry answers it). Audited
//! `approval_requested`, then `approval_decided`; the call's own record carries the
//! `approval_id`. An approved call runs only if it is still the call that was approved
//! (`approval::Binding`: the tool's definition may have changed during the wait).

use std::borrow::Cow;
use std::time::Duration;

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::admit::Hold;
use super::finish::redact;
use super::types::Ended;
use crate::approval::{Binding, By, Pending, Verdict, Waited};
use crate::audit::Outcome;
use crate::methods::request::RequestCtx;
use crate::policy::Approver;
use crate::registration::pins::Drift;
use crate::registration::RegistrationState;
use crate::tools::{GrantedTool, ToolResult};

/// A held call that does not run: how it ended and the record's reason.
pub(super) struct NotApproved {
    pub approval_id: Option<String>,
    pub ended: Ended,
    pub reason: Cow<'static, str>,
}

/// A held call that did not run, as its record says it: its name, tool, arguments' digest,
/// recorded arguments, and the rule that held it.
pub(super) type HeldCall<'a> = (
    &'a str,
    &'a GrantedTool,
    &'a str,
    Option<Value>,
    Option<String>,
);

/// The end of a held call that does not run, through `finish`.
pub(super) fn refused<'c>(
    ctx: &'c RequestCtx,
    started: tokio::time::Instant,
    id: Value,
    call: HeldCall<'_>,
    n: NotApproved,
    trace: Option<Box<crate::telemetry::CallTrace>>,
    revision: Option<u64>,
) -> impl std::future::Future<Output = Option<crate::protocol::jsonrpc::Reply>> + Send + 'c {
    let (name, tool, digest, recorded, rule) = call;
    let summary = super::Summary {
        tool: Some(name),
        granted: true,
        upstream: tool.upstream(),
        digest: Some(digest),
        arguments: recorded,
        reason: Some(n.reason),
        ids: None,
        ended: n.ended,
        trace,
        revision,
        rule,
        approval_id: n.approval_id,
    };
    super::finish(ctx, started, id, summary)
}

/// `reply`, the admission's slot given back once it is written (as `max_concurrent` counts).
pub(super) async fn with_slot<F: std::future::Future>(
    reply: F,
    admission: super::admit::Admission<'_>,
) -> F::Output {
    let r = reply.await;
    drop(admission);
    r
}

/// The digest of `name`'s definition as the registration serves it now (`None`: removed).
pub(crate) fn definition_now(reg: &RegistrationState, name: &str) -> Option<String> {
    match reg.pins.drift_of(name) {
        None => reg.pins.pinned(name).map(str::to_owned),
        Some(Drift::Followed { digest, .. } | Drift::Refused { digest }) => Some(digest),
        Some(Drift::Removed) => None,
    }
}

fn denied(approval_id: Option<String>, text: String) -> NotApproved {
    NotApproved {
        approval_id,
        ended: Ended::Result(ToolResult::error(text.clone()).0, Outcome::Denied),
        reason: text.into(),
    }
}

/// Holds the call until it is decided: `Ok(approval id)` when approved (and still the call
/// that was approved), else how it ends.
pub(super) async fn hold(
    ctx: &RequestCtx,
    tool: &GrantedTool,
    arguments: &Value,
    digest: &str,
    hold: Box<Hold>,
    cancel: &CancellationToken,
) -> Result<String, NotApproved> {
    let reg = &ctx.registration;
    let client = hold.approver == Approver::Client;
    if client {
        if let Some(s) = &ctx.session {
            if !s.declares(crate::protocol::ClientCapability::Elicitation) {
                return Err(denied(
                    None,
                    format!(
                        "approval by the client refused (policy rule {}): the client declared neither elicitation nor 2026-07-28 input requests",
                        hold.rule
                    ),
                ));
            }
        }
    }
    let keys = &ctx.hub.config().audit.redact_keys;
    let shown = if keys.is_empty() {
        arguments.clone()
    } else {
        redact(arguments, keys)
    };
    let definition = definition_now(reg, &tool.name).unwrap_or_default();
    let pending = pending_of(ctx, tool, &shown, digest, &definition, &hold.rule, client);
    let timeout = hold
        .timeout_s
        .map_or(crate::approval::DEFAULT_TIMEOUT, Duration::from_secs);
    let binding_of = |expires_at_ms| Binding {
        registration_id: reg.id.clone(),
        tool: tool.name.clone(),
        definition_digest: definition.clone(),
        args_digest: digest.to_string(),
        expires_at_ms,
    };
    let mut ticket = match ctx.hub.approvals().hold(pending, binding_of, timeout) {
        Ok(t) => t,
        Err(full) => {
            return Err(denied(
                None,
                format!("not held for approval (policy rule {}): {full}", hold.rule),
            ))
        }
    };
    let id = ticket.id.clone();
    let mut rec = record(ctx, "approval_requested", tool, digest, &hold.rule, &id);
    rec.rare_mut().approver = Some(Cow::Borrowed(if client { "client" } else { "harness" }));
    if ctx.hub.audit().record(rec).await.is_err() {
        return Err(NotApproved {
            approval_id: Some(id),
            ended: Ended::AuditDown,
            reason: "audit log unavailable".into(),
        });
    }
    if !client {
        if let Some((w, p)) = ctx.hub.webhook().zip(ctx.hub.approvals().get(&id)) {
            w.announce(&p);
        }
    }
    let waited = if client {
        let ask = ask_client(ctx, &id, tool, &shown, &hold.rule);
        tokio::select! {
            biased;
            w = ticket.wait(cancel) => w,
            () = ask => Waited::Cancelled,
        }
    } else {
        ticket.wait(cancel).await
    };
    let wait_ms = u64::try_from(ticket.waited().as_millis()).unwrap_or(u64::MAX);
    let (decision, by, reason) = described(&waited, reg.is_released());
    // An approved call runs only as the call that was approved.
    let mismatch = match &waited {
        Waited::Decided(v) if v.approve => {
            let now = Binding {
                definition_digest: definition_now(reg, &tool.name).unwrap_or_default(),
                ..ticket.binding.clone()
            };
            ticket.binding.admits(&now, crate::approval::now_ms()).err()
        }
        _ => None,
    };
    let mut rec = record(ctx, "approval_decided", tool, digest, &hold.rule, &id);
    rec.reason = reason.clone().map(Cow::Owned);
    {
        let r = rec.rare_mut();
        r.decided_by = Some(Cow::Borrowed(by.as_str()));
        r.decision = Some(Cow::Borrowed(decision));
        r.wait_ms = Some(wait_ms);
    }
    let written = ctx.hub.audit().record(rec).await;
    drop(ticket);
    if written.is_err() {
        return Err(NotApproved {
            approval_id: Some(id),
            ended: Ended::AuditDown,
            reason: "audit log unavailable".into(),
        });
    }
    ending(waited, mismatch, id, &hold.rule, reason)
}

/// What the admin API and the client are shown of a held call.
fn pending_of(
    ctx: &RequestCtx,
    tool: &GrantedTool,
    shown: &Value,
    digest: &str,
    definition: &str,
    rule: &str,
    client: bool,
) -> Pending {
    let reg = &ctx.registration;
    Pending {
        id: String::new(),
        registration_id: reg.id.clone(),
        agent_id: reg.agent_id.to_string(),
        agent_path: reg.family.agent_path.clone(),
        label: reg.label.clone(),
        tool: tool.name.clone(),
        upstream: tool.upstream().map(str::to_owned),
        rule: rule.to_string(),
        approver: if client { "client" } else { "harness" },
        arguments: shown.clone(),
        args_digest: digest.to_string(),
        definition_digest: definition.to_string(),
        requested_at: String::new(),
        expires_at: String::new(),
    }
}

/// The `approval_decided` record's decision, decider and reason.
fn described(waited: &Waited, released: bool) -> (&'static str, By, Option<String>) {
    match waited {
        Waited::Decided(v) => (
            if v.approve { "approve" } else { "deny" },
            v.by,
            v.reason.clone(),
        ),
        Waited::TimedOut(t) => (
            "timeout",
            By::Gatehouse,
            Some(format!("no decision within {} s", t.as_secs())),
        ),
        Waited::Cancelled => (
            "cancelled",
            By::Gatehouse,
            Some(if released {
                "registration released".into()
            } else {
                "cancelled by client or session end".into()
            }),
        ),
    }
}

/// How the held call goes on: approved (and still the call approved) it runs; else it ends.
fn ending(
    waited: Waited,
    mismatch: Option<crate::approval::Mismatch>,
    id: String,
    rule: &str,
    reason: Option<String>,
) -> Result<String, NotApproved> {
    let why = reason.map(|r| format!(": {r}")).unwrap_or_default();
    match waited {
        Waited::Decided(v) if v.approve => match mismatch {
            None => Ok(id),
            Some(m) => Err(denied(
                Some(id),
                format!("approval void (policy rule {rule}): {m}"),
            )),
        },
        Waited::Decided(v) => Err(denied(
            Some(id),
            format!(
                "denied by {} (approval for policy rule {rule}){why}",
                v.by.as_str()
            ),
        )),
        Waited::TimedOut(t) => Err(denied(
            Some(id),
            format!(
                "approval timed out after {} s (policy rule {rule}): denied",
                t.as_secs()
            ),
        )),
        Waited::Cancelled => Err(NotApproved {
            approval_id: Some(id),
            ended: Ended::Cancelled,
            reason: format!("approval wait ended{why}").into(),
        }),
    }
}

/// An approval record about the call (`approval_requested`, `approval_decided`).
fn record<'a>(
    ctx: &'a RequestCtx,
    event: &'a str,
    tool: &'a GrantedTool,
    digest: &'a str,
    rule: &'a str,
    id: &'a str,
) -> crate::audit::Record<'a> {
    let mut rec = ctx.registration.audit_record(event);
    rec.session_id = ctx.session_id().map(Cow::Borrowed);
    rec.transport = Some(Cow::Borrowed(ctx.transport.as_str()));
    rec.tool = Some(Cow::Borrowed(&tool.name));
    rec.upstream = tool.upstream().map(Cow::Borrowed);
    rec.args_digest = Some(Cow::Borrowed(digest));
    let r = rec.rare_mut();
    r.rule = Some(Cow::Borrowed(rule));
    r.approval_id = Some(Cow::Borrowed(id));
    rec
}

/// Asks the call's client (its user) to approve, on the call's own stream, and decides the
/// approval `id` with the answer; then waits forever (the caller's wait ends first).
async fn ask_client(ctx: &RequestCtx, id: &str, tool: &GrantedTool, shown: &Value, rule: &str) {
    let verdict = ask(ctx, id, tool, shown, rule).await;
    let _ = ctx.hub.approvals().decide(id, verdict);
    std::future::pending::<()>().await;
}

/// The client's answer to the approval question, as a verdict (a client that cannot be
/// asked, or refuses the request: a denial saying so).
async fn ask(ctx: &RequestCtx, id: &str, tool: &GrantedTool, shown: &Value, rule: &str) -> Verdict {
    let reg = &ctx.registration;
    // Not the user's answer: the gateway denies.
    let deny = |reason: String| Verdict {
        approve: false,
        by: By::Gatehouse,
        reason: Some(reason),
    };
    let args = serde_json::to_string_pretty(shown).unwrap_or_default();
    let message = format!(
        "Approve this tool call?\n\nTool: {}\nAgent: {}\nArguments: {args}\n\n(policy rule {rule})",
        tool.name, reg.agent_id
    );
    let params = json!({
        "message": message,
        "requestedSchema": {
            "type": "object",
            "properties": {
                "approve": {"type": "boolean", "title": "Approve",
                            "description": format!("Run {} with these arguments", tool.name)},
                "reason": {"type": "string", "title": "Reason"},
            },
            "required": ["approve"],
        },
    });
    let pool = ctx.hub.pool();
    let Some(notify) = ctx.notify.as_ref() else {
        return deny("the client has no stream to be asked on".into());
    };
    let Some((down_id, msg, rx)) =
        pool.ask_call(&reg.id, ctx.session.as_ref(), "elicitation/create", params)
    else {
        return deny("too many requests wait for this registration's clients".into());
    };
    // Forgotten however this ends (answered, or the wait dropped).
    struct Asked<'p>(&'p crate::upstream::Pool, String);
    impl Drop for Asked<'_> {
        fn drop(&mut self) {
            self.0.forget_ask(&self.1);
        }
    }
    let asked = Asked(pool, down_id);
    ctx.hub.approvals().asked_as(id, &asked.1);
    if notify.send(msg).await.is_err() {
        return deny("the client's stream closed".into());
    }
    let answer = rx.await;
    drop(asked);
    match answer {
        Ok(Ok(result)) => {
            let action = result.get("action").and_then(Value::as_str).unwrap_or("");
            let content = result.get("content");
            let said = content
                .and_then(|c| c.get("reason"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            let yes = content.and_then(|c| c.get("approve")) == Some(&Value::Bool(true));
            match (action, yes) {
                ("accept", true) => Verdict {
                    approve: true,
                    by: By::Client,
                    reason: said,
                },
                ("accept", false) => Verdict {
                    approve: false,
                    by: By::Client,
                    reason: Some(said.unwrap_or_else(|| "not approved by the user".into())),
                },
                (other, _) => Verdict {
                    approve: false,
                    by: By::Client,
                    reason: Some(format!("the user answered {other:?}")),
                },
            }
        }
        Ok(Err(e)) => {
            let m = e.get("message").and_then(Value::as_str).unwrap_or("");
            if m.contains("did not declare") {
                deny("the client declared neither elicitation nor 2026-07-28 input requests".into())
            } else {
                deny(format!("the client could not be asked: {m}"))
            }
        }
        Err(_) => deny("the client could not be asked".into()),
    }
}

/// A 2026-07-28 client's MRTR retry that answers input request `asked`: if that request asks
/// for an approval, the retry must be the very call approved (its tool, the tool's definition,
/// its arguments); else the approval is denied and the retry refused with the reason.
pub(crate) fn check_retry(
    hub: &crate::hub::Hub,
    reg: &RegistrationState,
    asked: &str,
    params: Option<&Value>,
) -> Result<(), String> {
    let Some((id, binding)) = hub.approvals().for_input(&reg.id, asked) else {
        return Ok(());
    };
    let tool = params
        .and_then(|p| p.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let empty = Value::Object(serde_json::Map::new());
    let args = params
        .and_then(|p| p.get("arguments"))
        .filter(|a| !a.is_null())
        .unwrap_or(&empty);
    let keys = &hub.config().audit.redact_keys;
    let digest = if keys.is_empty() {
        crate::audit::args_digest(args)
    } else {
        crate::audit::args_digest(&redact(args, keys))
    };
    let presented = Binding {
        registration_id: reg.id.clone(),
        tool: tool.to_string(),
        definition_digest: definition_now(reg, tool).unwrap_or_default(),
        args_digest: digest.as_str().to_string(),
        expires_at_ms: 0,
    };
    match binding.admits(&presented, crate::approval::now_ms()) {
        Ok(()) => Ok(()),
        Err(m) => {
            let verdict = Verdict {
                approve: false,
                by: By::Gatehouse,
                reason: Some(format!("the client's retry was refused: {m}")),
            };
            let _ = hub.approvals().decide(&id, verdict);
            Err(format!("{m} (approval {id})"))
        }
    }
}
