//! `gatehouse demo-upstream` / `echo-upstream`: the built-in stdio MCP servers.

use std::process::ExitCode;

use clap::Args;

use crate::demo_upstream::{run_echo_stdio, run_stdio, HelpdeskOptions};

#[derive(Debug, Args)]
pub struct DemoUpstreamArgs {
    /// Do not advertise the io.gatehouse/lease extension.
    #[arg(long)]
    pub no_lease: bool,
    /// Duration of add_note_slow, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub slow_ms: u64,
}

fn finish(r: anyhow::Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo upstream: {e:#}");
            ExitCode::FAILURE
        }
    }
}

pub fn run(a: DemoUpstreamArgs) -> ExitCode {
    let opts = HelpdeskOptions {
        lease_extension: !a.no_lease,
        slow_ms: a.slow_ms,
    };
    let code = match super::runtime::runtime() {
        Ok(rt) => finish(rt.block_on(run_stdio(opts))),
        Err(e) => finish(Err(e.into())),
    };
    // stdin reads may block runtime shutdown until EOF; the server is done, so leave now.
    std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 })
}

pub fn run_echo() -> ExitCode {
    let code = match super::runtime::runtime() {
        Ok(rt) => finish(rt.block_on(run_echo_stdio())),
        Err(e) => finish(Err(e.into())),
    };
    std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 })
}
