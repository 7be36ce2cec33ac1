//! `gatehouse renew ID`: extend a registration's lease.

use std::process::ExitCode;

use clap::Args;
use reqwest::Method;
use serde_json::json;

use super::admin_client::{parse_ttl, AdminConn};

#[derive(Debug, Args)]
pub struct RenewArgs {
    /// The registration id (base64url, which may begin with `-`; `<node>.<base64url>` on a
    /// node with `node_id`).
    #[arg(allow_hyphen_values = true)]
    pub id: String,
    /// New lease length from now (default: the registration's own ttl).
    #[arg(long, value_parser = parse_ttl)]
    pub ttl: Option<u64>,
    #[command(flatten)]
    pub conn: AdminConn,
}

pub fn run(a: RenewArgs) -> ExitCode {
    let body = a.ttl.map(|t| json!({"ttl_s": t}));
    let path = format!("/v1/registrations/{}/renew", a.id);
    let verb = format!("renew {}", a.id);
    a.conn.run_ok(&verb, (Method::POST, &path, body), |r| {
        println!(
            "{} expires at {}",
            a.id,
            r.body["expires_at"].as_str().unwrap_or("never (no ttl)")
        );
        Ok(())
    })
}
