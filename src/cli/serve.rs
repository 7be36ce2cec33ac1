//! `gatehouse serve`: the daemon. Keeps the data server up with no registration.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::config::Config;
use crate::gateway::Gateway;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Config file (TOML). Default: $GATEHOUSE_CONFIG or config/gatehouse.toml.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

pub fn run(a: ServeArgs) -> ExitCode {
    super::init_logging("info");
    let path = a
        .config
        .unwrap_or_else(super::check_config::default_config_path);
    let config = match Config::from_file(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let gw = match Gateway::new(config) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        };
        match gw.pin_server() {
            Ok(addr) => eprintln!("gatehouse: data listener on http://{addr}"),
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        }
        let _ = tokio::signal::ctrl_c().await;
        gw.shutdown().await;
        ExitCode::SUCCESS
    })
}
