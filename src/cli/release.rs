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
        if r.status != 204 {
            return Err(format!("release {}: {}", a.id, r.message()));
        }
        println!("{} released", a.id);
        Ok(())
    })
}
