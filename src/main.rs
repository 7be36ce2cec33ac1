//! The `gatehouse` binary: parses the command line and hands off to `gatehouse::cli`.
#![forbid(unsafe_code)]

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = gatehouse::cli::Cli::parse();
    gatehouse::cli::run(cli)
}
