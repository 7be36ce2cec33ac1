//! `gatehouse reload`: asks the daemon to read its config file again (as SIGHUP does).

use std::process::ExitCode;

use clap::Args;
use reqwest::Method;

use super::admin_client::AdminConn;

#[derive(Debug, Args)]
pub struct ReloadArgs {
    #[command(flatten)]
    pub conn: AdminConn,
}

pub fn run(a: ReloadArgs) -> ExitCode {
    a.conn
        .run_ok("reload", (Method::POST, "/v1/reload", None), |r| {
            println!("{}", r.body);
            Ok(())
        })
}
