//! The `gatehouse` binary: parses the command line and hands off to `gatehouse::cli`.
#![forbid(unsafe_code)]

use clap::Parser;

// mimalloc: per-thread free lists, no lock or arena hand-off on the request path, and freed
// memory returned to the OS (glibc malloc was ~7% of the server's CPU under load and kept
// freed pages; see BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = gatehouse::cli::Cli::parse();
    gatehouse::cli::run(cli)
}
