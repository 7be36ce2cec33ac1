//! `gatehouse list`: the live registrations (never their tokens).

use std::process::ExitCode;

use clap::Args;
use reqwest::Method;
use serde_json::Value;

use super::admin_client::AdminConn;

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print the admin API's JSON reply.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: AdminConn,
}

pub fn run(a: ListArgs) -> ExitCode {
    a.conn
        .run_ok("list", (Method::GET, "/v1/registrations", None), |r| {
            if a.json {
                println!("{}", r.body);
                return Ok(());
            }
            println!(
                "{:<24} {:<16} {:<16} {:<26} {:>8} {:>8}  TOOLS",
                "ID", "AGENT", "LABEL", "EXPIRES", "SESSIONS", "IN-FLIGHT"
            );
            for row in r.body.as_array().into_iter().flatten() {
                let s = |k: &str| row[k].as_str().unwrap_or("-").to_string();
                let tools: Vec<&str> = row["tools"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                println!(
                    "{:<24} {:<16} {:<16} {:<26} {:>8} {:>8}  {}",
                    s("id"),
                    s("agent_id"),
                    s("label"),
                    s("expires_at"),
                    row["sessions"],
                    row["calls_in_flight"],
                    tools.join(",")
                );
            }
            Ok(())
        })
}
