//! `gatehouse audit`: print the records of an audit file, filtered, as a table or JSON lines.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::audit::{read_records, Filter, Record};

#[derive(Debug, Args)]
pub struct AuditArgs {
    /// The audit file (default: $GATEHOUSE_AUDIT_PATH or gatehouse-audit.jsonl).
    #[arg(long)]
    pub file: Option<PathBuf>,
    #[arg(long)]
    pub agent_id: Option<String>,
    #[arg(long)]
    pub registration: Option<String>,
    #[arg(long)]
    pub tool: Option<String>,
    #[arg(long)]
    pub outcome: Option<String>,
    #[arg(long)]
    pub label: Option<String>,
    /// Only records of this event (e.g. governed_mcp_call).
    #[arg(long)]
    pub event: Option<String>,
    /// JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: AuditArgs) -> ExitCode {
    let path = a
        .file
        .or_else(|| std::env::var_os("GATEHOUSE_AUDIT_PATH").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("gatehouse-audit.jsonl"));
    let records = match read_records(&path) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cannot read {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    let filter = Filter {
        agent_id: a.agent_id,
        registration_id: a.registration,
        tool: a.tool,
        outcome: a.outcome,
        label: a.label,
        event: a.event,
    };
    let rows: Vec<&Record> = records.iter().filter(|r| filter.matches(r)).collect();
    if a.json {
        for r in rows {
            match serde_json::to_string(r) {
                Ok(line) => println!("{line}"),
                Err(e) => eprintln!("encode: {e}"),
            }
        }
    } else {
        print!("{}", table(&rows));
    }
    ExitCode::SUCCESS
}

/// A fixed-width table of records.
pub fn table(rows: &[&Record]) -> String {
    let mut out = format!(
        "{:<27} {:<22} {:<16} {:<24} {:<24} {:<15} {:>10}\n",
        "TIME", "EVENT", "AGENT", "REGISTRATION", "TOOL", "OUTCOME", "MS"
    );
    for r in rows {
        let dash = || "-".to_string();
        out.push_str(&format!(
            "{:<27} {:<22} {:<16} {:<24} {:<24} {:<15} {:>10}\n",
            r.ts,
            r.event,
            r.agent_id.clone().unwrap_or_else(dash),
            r.registration_id.clone().unwrap_or_else(dash),
            r.tool.clone().unwrap_or_else(dash),
            r.outcome.clone().unwrap_or_else(dash),
            r.duration_ms
                .map(|d| format!("{d:.2}"))
                .unwrap_or_else(dash),
        ));
    }
    out
}
