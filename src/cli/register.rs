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
    /// An upstream credential (issue 47): `UPSTREAM=@FILE` or `UPSTREAM=env:VAR`, never the
    /// value itself (argv is visible to `ps`). The file or variable holds a bearer token, or
    /// JSON: `{"bearer": "…"}` or `{"headers": {"<name>": "<value>"}}`. Repeatable.
    #[arg(long = "credential", value_name = "UPSTREAM=@FILE|UPSTREAM=env:VAR")]
    pub credentials: Vec<String>,
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

/// The `upstream_credentials` object of `--credential` arguments, each value read from its
/// file or environment variable; the error names the argument, never a value.
pub fn credentials_of(args: &[String]) -> Result<serde_json::Map<String, Value>, String> {
    let mut out = serde_json::Map::new();
    for arg in args {
        let Some((up, source)) = arg.split_once('=') else {
            return Err(format!(
                "--credential {arg:?}: expected UPSTREAM=@FILE or UPSTREAM=env:VAR"
            ));
        };
        let text = if let Some(path) = source.strip_prefix('@') {
            std::fs::read_to_string(path)
                .map_err(|e| format!("--credential {up}=@{path}: cannot read it: {e}"))?
        } else if let Some(var) = source.strip_prefix("env:") {
            std::env::var(var)
                .map_err(|_| format!("--credential {up}=env:{var}: the variable is not set"))?
        } else {
            return Err(format!(
                "--credential {up}=…: give @FILE or env:VAR; a credential is never taken from the command line, which `ps` shows"
            ));
        };
        let text = text.trim();
        let value = if text.starts_with('{') {
            serde_json::from_str::<Value>(text)
                .map_err(|e| format!("--credential {up}: not JSON ({e})"))?
        } else {
            json!({ "bearer": text })
        };
        crate::registration::Credential::from_json(&format!("--credential {up}"), &value)?;
        out.insert(up.to_string(), value);
    }
    Ok(out)
}

pub fn run(a: RegisterArgs) -> ExitCode {
    block_on(async move {
        let client = a.conn.client()?;
        let mut body = json!({"agent_id": a.agent_id, "tools": a.tools});
        if !a.credentials.is_empty() {
            body["upstream_credentials"] = Value::Object(credentials_of(&a.credentials)?);
        }
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
