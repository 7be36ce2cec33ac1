//! `gatehouse check-config [FILE]`: validate before anything binds.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::config::Config;

#[derive(Debug, Args)]
pub struct CheckConfigArgs {
    /// The config file (default: $GATEHOUSE_CONFIG or config/gatehouse.toml).
    pub file: Option<PathBuf>,
}

pub fn run(a: CheckConfigArgs) -> ExitCode {
    let path = a.file.unwrap_or_else(default_config_path);
    match Config::from_file(&path) {
        Ok(c) => {
            println!(
                "{}: ok ({} upstream{})",
                path.display(),
                c.upstreams.len(),
                if c.upstreams.len() == 1 { "" } else { "s" }
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// `$GATEHOUSE_CONFIG`, else `config/gatehouse.toml`.
pub fn default_config_path() -> PathBuf {
    std::env::var_os("GATEHOUSE_CONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("config/gatehouse.toml"))
}
