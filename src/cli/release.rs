//! `gatehouse release ID`: cancel a registration's calls, then release it.

use std::process::ExitCode;

use clap::Args;
use reqwest::Method;

use super::admin_client::{block_on, AdminConn};

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// The registration id (base64url, which may begin with `-`; `<node>.<base64url>` on a
    /// node with `node_id`).
    #[arg(allow_hyphen_values = true)]
    pub id: String,
    #[command(flatten)]
    pub conn: AdminConn,
}

pub fn run(a: ReleaseArgs) -> ExitCode {
    block_on(async move {
        let client = a.conn.client()?;
        let path = format!("/v1/registrations/{}", a.id);
        let r = client.call(Method::DELETE, &path, None).await?;
        match r.status {
            204 => println!("{} released", a.id),
            // A cluster node (issue 36): which nodes applied the release within the bound.
            200 => {
                let names = |k: &str| {
                    r.body[k]
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(|v| v.as_str())
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .unwrap_or_default()
                };
                println!(
                    "{} released at revision {}; acknowledged by [{}], fenced [{}]",
                    a.id,
                    r.body["revision"],
                    names("acked"),
                    names("fenced")
                );
            }
            _ => return Err(format!("release {}: {}", a.id, r.message())),
        }
        Ok(())
    })
}
