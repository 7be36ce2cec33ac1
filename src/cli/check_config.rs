//! `gatehouse check-config [FILE]`: validate before anything binds; on error, name the line
//! and key at fault and exit non-zero.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::config_load;

#[derive(Debug, Args)]
pub struct CheckConfigArgs {
    /// The config file: TOML or an `mcpServers` JSON file.
    /// Default: $GATEHOUSE_CONFIG, else config/gatehouse.toml.
    pub file: Option<PathBuf>,
}

pub fn run(a: CheckConfigArgs) -> ExitCode {
    let path = config_load::resolve_path(a.file);
    match config_load::load(&path) {
        Ok(c) => {
            println!(
                "{}: ok ({} upstream{}; listen {}, admin {}{})",
                path.display(),
                c.upstreams.len(),
                if c.upstreams.len() == 1 { "" } else { "s" },
                c.listen,
                c.admin_listen,
                match &c.node_id {
                    Some(n) => format!(", node {n}: ids {n}.<random>"),
                    None => String::new(),
                },
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
    config_load::resolve_path(None)
}
