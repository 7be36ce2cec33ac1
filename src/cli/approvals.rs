//! `gatehouse approvals` (the calls waiting for approval; `--wait N` long-polls),
//! `gatehouse approve ID [--reason R]`, `gatehouse deny ID [--reason R]` (issue 49).

use std::process::ExitCode;

use clap::Args;
use reqwest::Method;
use serde_json::{json, Value};

use super::admin_client::AdminConn;

#[derive(Debug, Args)]
pub struct ApprovalsArgs {
    /// Wait up to this many seconds (at most 25: the CLI's request timeout is 30 s) for a
    /// call to wait for approval.
    #[arg(long)]
    pub wait: Option<u64>,
    /// Print the admin API's JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: AdminConn,
}

#[derive(Debug, Args)]
pub struct DecideArgs {
    /// The approval id (base64url, which may begin with `-`).
    #[arg(allow_hyphen_values = true)]
    pub id: String,
    /// Why (recorded in the audit log and, for a denial, told to the agent).
    #[arg(long)]
    pub reason: Option<String>,
    #[command(flatten)]
    pub conn: AdminConn,
}

pub fn list(a: ApprovalsArgs) -> ExitCode {
    let path = match a.wait {
        Some(w) => format!("/v1/approvals?wait={}", w.min(25)),
        None => "/v1/approvals".to_string(),
    };
    a.conn.run_ok("approvals", (Method::GET, &path, None), |r| {
        if a.json {
            println!("{}", r.body);
            return Ok(());
        }
        let rows = r.body["approvals"].as_array().cloned().unwrap_or_default();
        if rows.is_empty() {
            println!("no call waits for approval");
        }
        for p in rows {
            let s = |k: &str| p[k].as_str().unwrap_or("-").to_string();
            println!(
                "{}  {}  agent={}  rule={}  approver={}  expires={}\n    arguments: {}",
                s("id"),
                s("tool"),
                s("agent_id"),
                s("rule"),
                s("approver"),
                s("expires_at"),
                p["arguments"]
            );
        }
        Ok(())
    })
}

/// `approve` (`true`) or `deny`.
pub fn decide(a: DecideArgs, approve: bool) -> ExitCode {
    let mut body = json!({"decision": verb(approve), "by": "admin"});
    if let Some(r) = &a.reason {
        body["reason"] = Value::String(r.clone());
    }
    let path = format!("/v1/approvals/{}", a.id);
    let verb = format!("{} {}", verb(approve), a.id);
    a.conn
        .run_ok(&verb, (Method::POST, &path, Some(body)), |_| {
            println!("{} {}", a.id, if approve { "approved" } else { "denied" });
            Ok(())
        })
}

fn verb(approve: bool) -> &'static str {
    if approve {
        "approve"
    } else {
        "deny"
    }
}
