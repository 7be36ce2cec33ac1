//! `gatehouse register`: create a registration through the admin API and print its URLs and
//! token (the point of this verb), as text, JSON, or `export` lines for a shell.

use std::process::ExitCode;

use clap::Args;
use reqwest::Method;
use serde_json::{json, Value};

use super::admin_client::{block_on, parse_ttl, AdminConn};

#[derive(Debug, Args)]
pub struct RegisterArgs {
    /// Who acts; copied into every audit record.
    #[arg(long)]
    pub agent_id: String,
    /// A grant: `upstream.tool`, `upstream.*`, or an in-process tool name. Repeatable.
    #[arg(long = "tool", required = true)]
    pub tools: Vec<String>,
    /// Lease length (600, 90s, 10m, 2h): the registration expires unless renewed.
    #[arg(long, value_parser = parse_ttl)]
    pub ttl: Option<u64>,
    /// Free text copied into audit records (e.g. the harness run id).
    #[arg(long)]
    pub label: Option<String>,
    /// Make a child registration (a sub-agent) of this live registration: its tools are a
    /// subset of the parent's, it is released with the parent.
    #[arg(long)]
    pub parent: Option<String>,
    /// Print the admin API's JSON reply.
    #[arg(long, conflicts_with = "export")]
    pub json: bool,
    /// Print `export GATEHOUSE_...=` lines for `eval "$(gatehouse register ... --export)"`.
    #[arg(long)]
    pub export: bool,
    #[command(flatten)]
    pub conn: AdminConn,
}

/// Quotes a value for a POSIX shell.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

pub fn run(a: RegisterArgs) -> ExitCode {
    block_on(async move {
        let client = a.conn.client()?;
        let mut body = json!({"agent_id": a.agent_id, "tools": a.tools});
        if let Some(t) = a.ttl {
            body["ttl_s"] = json!(t);
        }
        if let Some(l) = &a.label {
            body["label"] = json!(l);
        }
        if let Some(p) = &a.parent {
            body["parent"] = json!(p);
        }
        let r = client
            .call(Method::POST, "/v1/registrations", Some(&body))
            .await?;
        if r.status != 201 {
            return Err(format!("register failed: {}", r.message()));
        }
        let s = |k: &str| {
            r.body
                .get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        if a.json {
            println!("{}", r.body);
        } else if a.export {
            for (var, key) in [
                ("GATEHOUSE_REGISTRATION_ID", "id"),
                ("GATEHOUSE_TOKEN", "token"),
                ("GATEHOUSE_SSE_URL", "sse_url"),
                ("GATEHOUSE_MCP_URL", "mcp_url"),
            ] {
                println!("export {var}={}", sh_quote(&s(key)));
            }
        } else {
            let tools: Vec<&str> = r.body["tools"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            println!("id:         {}", s("id"));
            println!("agent_id:   {}", s("agent_id"));
            println!("tools:      {}", tools.join(", "));
            println!("sse_url:    {}", s("sse_url"));
            println!("mcp_url:    {}", s("mcp_url"));
            println!(
                "expires_at: {}",
                r.body["expires_at"].as_str().unwrap_or("never")
            );
            println!("token:      {}", s("token"));
        }
        Ok(())
    })
}
