//! Command-line verbs, one file each. The library owns all behaviour; these parse and print.

pub mod admin_client;
pub mod approvals;
pub mod audit;
pub mod check_config;
pub mod demo_upstream;
pub mod list;
pub mod probe;
pub mod register;
pub mod release;
pub mod reload;
pub mod renew;
pub mod runtime;
pub mod serve;
pub mod test_tools;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// gatehouse: a shared MCP gateway with per-execution registrations.
#[derive(Debug, Parser)]
#[command(name = "gatehouse", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gateway daemon (data listener + admin API).
    Serve(serve::ServeArgs),
    /// Create a registration through the admin API; prints its URLs and token.
    Register(register::RegisterArgs),
    /// Extend a registration's lease.
    Renew(renew::RenewArgs),
    /// Release a registration (cancel its calls, then release).
    Release(release::ReleaseArgs),
    /// Ask the daemon to read its config file again (as SIGHUP does); a bad file is refused
    /// with the reason and the running config stays.
    Reload(reload::ReloadArgs),
    /// List live registrations (never their tokens).
    List(list::ListArgs),
    /// Probe a registration as its agent would reach it (MCP round trip with its token, tools
    /// against the grant, upstreams pinged); exit 1 with the reason when it is not healthy.
    Probe(probe::ProbeArgs),
    /// List the calls waiting for approval (issue 49); `--wait N` waits for one.
    Approvals(approvals::ApprovalsArgs),
    /// Approve one held call by its approval id.
    Approve(approvals::DecideArgs),
    /// Deny one held call by its approval id (`--reason` is told to the agent).
    Deny(approvals::DecideArgs),
    /// Read, filter and summarise an audit file.
    Audit(Box<audit::AuditArgs>),
    /// Validate a config file and exit (non-zero on error), before anything binds.
    CheckConfig(check_config::CheckConfigArgs),
    /// The built-in "helpdesk" demo MCP server on stdio (used as an upstream).
    #[command(hide = true)]
    DemoUpstream(demo_upstream::DemoUpstreamArgs),
    /// A minimal echo MCP server on stdio (benchmarks).
    #[command(hide = true)]
    EchoUpstream,
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve(a) => serve::run(a),
        Command::Register(a) => register::run(a),
        Command::Renew(a) => renew::run(a),
        Command::Release(a) => release::run(a),
        Command::Reload(a) => reload::run(a),
        Command::List(a) => list::run(a),
        Command::Probe(a) => probe::run(a),
        Command::Approvals(a) => approvals::list(a),
        Command::Approve(a) => approvals::decide(a, true),
        Command::Deny(a) => approvals::decide(a, false),
        Command::Audit(a) => audit::run(*a),
        Command::CheckConfig(a) => check_config::run(a),
        Command::DemoUpstream(a) => demo_upstream::run(a),
        Command::EchoUpstream => demo_upstream::run_echo(),
    }
}

/// Parses `args` (the program name first) and runs the verb: the entry of a host that is not
/// the `gatehouse` binary (the Python wheel's `gatehouse` command, `gatehouse._native.main`).
/// A usage error, `--help` and `--version` print as the binary's do and give clap's exit
/// code instead of ending the host process.
pub fn run_args<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    match Cli::try_parse_from(args) {
        Ok(cli) => run(cli),
        Err(e) => {
            let _ = e.print();
            ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
        }
    }
}

// Unit tests only (never built into the daemon): a panic here is the test failing.
#[cfg(test)]
mod tests {
    use super::*;

    /// Registration ids are base64url, so one in 64 begins with `-`; the verbs that take
    /// one must not read it as an option (the README's `gatehouse release "$ID"`).
    #[test]
    fn ids_that_begin_with_a_dash_are_values() {
        let id = "-Xb9_kQ2";
        match Cli::try_parse_from(["gatehouse", "release", id]).map(|c| c.command) {
            Ok(Command::Release(a)) => assert_eq!(a.id, id),
            other => panic!("release: {other:?}"),
        }
        match Cli::try_parse_from(["gatehouse", "renew", id, "--ttl", "10m"]).map(|c| c.command) {
            Ok(Command::Renew(a)) => {
                assert_eq!(a.id, id);
                assert_eq!(a.ttl, Some(600));
            }
            other => panic!("renew: {other:?}"),
        }
        let parsed = Cli::try_parse_from(["gatehouse", "audit", "--registration", id]);
        let Ok(Cli {
            command: Command::Audit(a),
        }) = parsed
        else {
            panic!("audit: {parsed:?}");
        };
        assert!(format!("{a:?}").contains(id), "{a:?}");
    }
}
