//! `gatehouse probe ID`: is this registration healthy, as its agent would see it? The MCP
//! round trip with the registration's own token (from `--token-file` or `GATEHOUSE_TOKEN`, as
//! `eval "$(gatehouse register … --export)"` sets it; never from the command line, where `ps`
//! would show it), then the daemon's half through the admin API (`POST
//! /v1/registrations/<id>/probe`: the grant, each upstream pinged). Exit 0 when it is healthy,
//! 1 with the reason (refused, released, fenced, upstream_down naming it, timeout) otherwise.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use reqwest::Method;
use serde_json::json;

use super::admin_client::{block_on, AdminConn};
use crate::gateway::probe::{self, Failure, Probe, Reason, UpstreamsSeen};

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// The registration id (base64url, which may begin with `-`).
    #[arg(allow_hyphen_values = true)]
    pub id: String,
    /// A file holding the registration's token. Default: $GATEHOUSE_TOKEN.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// The registration's Streamable HTTP URL. Default: $GATEHOUSE_MCP_URL when it is this
    /// registration's, else the URL the daemon serves it at.
    #[arg(long)]
    pub mcp_url: Option<String>,
    /// The deadline of the whole probe, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub timeout: f64,
    /// Print the probe's JSON (the same shape as every API's probe).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub conn: AdminConn,
}

fn token(a: &ProbeArgs) -> Result<String, String> {
    let t = match &a.token_file {
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| format!("cannot read the token file {}: {e}", p.display()))?,
        None => std::env::var("GATEHOUSE_TOKEN").map_err(|_| {
            "no registration token: pass --token-file, or set GATEHOUSE_TOKEN (gatehouse register --export does)".to_string()
        })?,
    };
    let t = t.trim().to_string();
    if t.is_empty() {
        return Err("the registration token is empty".into());
    }
    Ok(t)
}

pub fn run(a: ProbeArgs) -> ExitCode {
    let mut failed = false;
    let code = block_on(async {
        let token = token(&a)?;
        if !(a.timeout.is_finite() && a.timeout > 0.0 && a.timeout <= 600.0) {
            return Err("--timeout: seconds, more than 0 and at most 600".into());
        }
        let timeout = Duration::from_secs_f64(a.timeout);
        let admin = a.conn.client()?;
        let path = format!("/v1/registrations/{}/probe", a.id);
        let daemon_half = |left: Duration| {
            let (admin, path) = (&admin, path.clone());
            async move {
                let pings = probe::pings_within(left);
                let body = json!({"timeout_ms": pings.as_millis().max(1) as u64});
                let r = admin
                    .call(Method::POST, &path, Some(&body))
                    .await
                    .map_err(|message| Failure {
                        reason: Reason::Unreachable,
                        status: None,
                        message,
                    })?;
                match r.status {
                    200 => serde_json::from_value::<UpstreamsSeen>(r.body)
                        .map(Some)
                        .map_err(|e| Failure {
                            reason: Reason::Protocol,
                            status: None,
                            message: format!("the admin API's probe answer: {e}"),
                        }),
                    404 => Ok(None),
                    s => Err(probe::failure_of_status(
                        s,
                        format!("admin API: {}", r.message()),
                    )),
                }
            }
        };
        let env_url = std::env::var("GATEHOUSE_MCP_URL")
            .ok()
            .filter(|u| u.contains(&format!("/gw/{}/", a.id)));
        let url = match a.mcp_url.clone().or(env_url) {
            Some(u) => u,
            // Unknown here: the daemon says where it serves the registration.
            None => match daemon_half(timeout).await {
                Ok(Some(UpstreamsSeen {
                    mcp_url: Some(u), ..
                })) => u,
                Ok(_) => {
                    let f = probe::failure_of_status(404, "no such registration".into());
                    return report(&a, probe::failed(&a.id, f), &mut failed);
                }
                Err(f) => return report(&a, probe::failed(&a.id, f), &mut failed),
            },
        };
        let http = probe::client(&url, timeout)?;
        let p = probe::run(&http, &a.id, &url, &token, timeout, daemon_half).await;
        report(&a, p, &mut failed)
    });
    if failed {
        ExitCode::FAILURE
    } else {
        code
    }
}

fn report(a: &ProbeArgs, p: Probe, failed: &mut bool) -> Result<(), String> {
    *failed = !p.ok;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&p).map_err(|e| e.to_string())?
        );
        if let Some(f) = &p.failure {
            eprintln!(
                "gatehouse: probe of {}: {}: {}",
                p.id,
                f.reason.as_str(),
                f.message
            );
        }
        return Ok(());
    }
    if let Some(f) = &p.failure {
        let status = f.status.map(|s| format!(" (HTTP {s})")).unwrap_or_default();
        eprintln!(
            "gatehouse: probe of {}: {}{status}: {}",
            p.id,
            f.reason.as_str(),
            f.message
        );
    }
    if p.reachable {
        println!(
            "{}: {} in {:.1} ms (MCP round trip {:.1} ms, protocol {})",
            p.id,
            if p.ok { "healthy" } else { "unhealthy" },
            p.elapsed_ms,
            p.latency_ms.unwrap_or_default(),
            p.protocol_version.as_deref().unwrap_or("?")
        );
        let t = &p.tools;
        if t.equal {
            println!("tools:     {} listed, as granted", t.listed.len());
        } else {
            println!(
                "tools:     {} listed, {} granted; missing [{}], not granted [{}]",
                t.listed.len(),
                t.granted.len(),
                t.missing.join(", "),
                t.unexpected.join(", ")
            );
        }
        for u in &p.upstreams {
            match &u.error {
                None => println!("upstream:  {} answered in {:.1} ms", u.id, u.latency_ms),
                Some(e) => println!("upstream:  {} did not answer: {e}", u.id),
            }
        }
    }
    Ok(())
}
