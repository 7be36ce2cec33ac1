//! `gatehouse audit`: print the records of an audit trail, filtered, as a table or JSON lines
//! (`--follow` keeps printing new ones); `audit verify FILE…` checks the hash chain;
//! `audit summary` prints calls, errors and latency per agent and per tool.

use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};

use crate::audit::summary::summarize;
use crate::audit::verify::{verify_files, VerifyOptions};
use crate::audit::{chain_files, read_chain, Filter, Record};

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AuditArgs {
    #[command(subcommand)]
    pub command: Option<AuditCommand>,
    #[command(flatten)]
    pub query: QueryArgs,
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Check the hash chain of audit files (in order; a file includes its rotated
    /// segments, a directory its audit files). Exit 1 on the first bad record.
    Verify(VerifyArgs),
    /// Calls, errors by outcome, and p50/p95 duration per agent and per tool.
    Summary(SummaryArgs),
}

#[derive(Debug, Args)]
pub struct QueryArgs {
    /// The audit file (default: $GATEHOUSE_AUDIT_PATH or gatehouse-audit.jsonl); its rotated
    /// segments (`FILE.000001`, …) are read first.
    #[arg(long)]
    pub file: Option<PathBuf>,
    #[arg(long, visible_alias = "agent")]
    pub agent_id: Option<String>,
    /// With --agent-id: also the records of its sub-agents (child registrations, at any
    /// depth, whose agent_path holds it).
    #[arg(long, requires = "agent_id")]
    pub descendants: bool,
    #[arg(long, allow_hyphen_values = true)]
    pub registration: Option<String>,
    #[arg(long)]
    pub tool: Option<String>,
    /// ok, tool_error, protocol_error, denied, cancelled, timeout, upstream_failed.
    #[arg(long)]
    pub outcome: Option<String>,
    #[arg(long)]
    pub label: Option<String>,
    /// Only records of this event (e.g. governed_mcp_call).
    #[arg(long)]
    pub event: Option<String>,
    /// Only the records of calls in this OpenTelemetry trace (32 hex digits).
    #[arg(long)]
    pub trace_id: Option<String>,
    /// Records at or after this time (RFC 3339, e.g. 2026-01-31T12:00:00Z).
    #[arg(long, value_parser = parse_time)]
    pub since: Option<DateTime<Utc>>,
    /// Records before this time (RFC 3339).
    #[arg(long, value_parser = parse_time)]
    pub until: Option<DateTime<Utc>>,
    /// JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Keep printing records as they are written (polls the file; follows rotation).
    #[arg(long, short = 'f')]
    pub follow: bool,
}

#[derive(Debug, Args)]
pub struct SummaryArgs {
    #[command(flatten)]
    pub query: QueryArgs,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Audit files in chain order, or one file (with its rotated segments), or a directory.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Accept a chain that starts after seq 1 (older segments deleted on purpose).
    #[arg(long)]
    pub allow_partial_start: bool,
    /// The chain head sidecar to check (default: `<file>.head` of the last file).
    #[arg(long)]
    pub head: Option<PathBuf>,
}

fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{s:?} is not an RFC 3339 time: {e}"))
}

pub fn run(a: AuditArgs) -> ExitCode {
    match a.command {
        Some(AuditCommand::Verify(v)) => verify(v),
        Some(AuditCommand::Summary(s)) => summary(s.query),
        None => query(a.query),
    }
}

impl QueryArgs {
    fn path(&self) -> PathBuf {
        self.file
            .clone()
            .or_else(|| std::env::var_os("GATEHOUSE_AUDIT_PATH").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("gatehouse-audit.jsonl"))
    }

    fn filter(&self) -> Filter {
        Filter {
            agent_id: self.agent_id.clone(),
            descendants: self.descendants,
            registration_id: self.registration.clone(),
            tool: self.tool.clone(),
            outcome: self.outcome.clone(),
            label: self.label.clone(),
            event: self.event.clone(),
            trace_id: self.trace_id.clone(),
            since: self.since,
            until: self.until,
        }
    }
}

fn query(a: QueryArgs) -> ExitCode {
    let path = a.path();
    let filter = a.filter();
    let records = match read_chain(&path) {
        Ok(r) => r,
        Err(e) if a.follow && e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            eprintln!("cannot read {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    if !a.follow && records.is_empty() && !path.exists() {
        eprintln!("cannot read {}: no such file", path.display());
        return ExitCode::FAILURE;
    }
    let rows: Vec<&Record> = records.iter().filter(|r| filter.matches(r)).collect();
    if !a.json {
        print!("{}", header());
    }
    for r in &rows {
        print_record(r, a.json);
    }
    if a.follow {
        let last_seq = records.last().map(|r| r.seq).unwrap_or(0);
        follow(&path, &filter, a.json, last_seq);
    }
    ExitCode::SUCCESS
}

fn print_record(r: &Record, json: bool) {
    if json {
        match serde_json::to_string(r) {
            Ok(line) => println!("{line}"),
            Err(e) => eprintln!("encode: {e}"),
        }
    } else {
        print!("{}", row(r));
    }
}

/// Polls the live file for new complete lines, forever (until the process is stopped), like
/// `tail -F`: the open file is read to its end before switching to a new file at the path
/// (rotation), so no line written just before a rotation is missed. Records at or below
/// `after_seq` are skipped, so none is printed twice.
fn follow(path: &Path, filter: &Filter, json: bool, mut after_seq: u64) {
    use std::os::unix::fs::MetadataExt;
    let mut open: Option<(std::fs::File, u64)> = None;
    let mut partial = String::new();
    let mut emit = |buf: &[u8], partial: &mut String| {
        partial.push_str(&String::from_utf8_lossy(buf));
        while let Some(pos) = partial.find('\n') {
            let line: String = partial.drain(..=pos).collect();
            if let Ok(r) = serde_json::from_str::<Record>(line.trim_end()) {
                if r.seq > after_seq {
                    after_seq = r.seq;
                    if filter.matches(&r) {
                        print_record(&r, json);
                    }
                }
            }
        }
    };
    loop {
        if let Some((f, _)) = open.as_mut() {
            let mut buf = Vec::new();
            if f.read_to_end(&mut buf).is_ok() && !buf.is_empty() {
                emit(&buf, &mut partial);
            }
        }
        let now = std::fs::metadata(path).ok().map(|m| (m.ino(), m.len()));
        let switch = match (&mut open, now) {
            (None, Some(_)) => true,
            (Some((f, ino)), Some((new_ino, len))) => {
                let pos = f.stream_position().unwrap_or(0);
                *ino != new_ino || len < pos
            }
            _ => false,
        };
        if switch {
            if let Some((mut f, _)) = open.take() {
                let mut buf = Vec::new();
                if f.read_to_end(&mut buf).is_ok() && !buf.is_empty() {
                    emit(&buf, &mut partial);
                }
            }
            partial.clear();
            if let Ok(f) = std::fs::File::open(path) {
                if let Ok(m) = f.metadata() {
                    open = Some((f, m.ino()));
                    // Several rotations may have happened since the last poll: the files in
                    // between are segments now. Emit what they hold beyond `after_seq`.
                    for seg in crate::audit::segments(path).unwrap_or_default() {
                        if let Ok(bytes) = std::fs::read(&seg) {
                            let mut p = String::new();
                            emit(&bytes, &mut p);
                        }
                    }
                    continue;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn summary(a: QueryArgs) -> ExitCode {
    let path = a.path();
    let records = match read_chain(&path) {
        Ok(r) if !r.is_empty() || path.exists() => r,
        Ok(_) => {
            eprintln!("cannot read {}: no such file", path.display());
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("cannot read {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    let filter = a.filter();
    let s = summarize(records.iter().filter(|r| filter.matches(r)));
    if a.json {
        match serde_json::to_string(&s) {
            Ok(line) => println!("{line}"),
            Err(e) => {
                eprintln!("encode: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", s.table());
    }
    ExitCode::SUCCESS
}

/// The chains to verify: several arguments are one chain in the order given; one live file
/// brings its rotated segments before it; a directory holds one chain per live file in it.
fn expand(args: &[PathBuf]) -> std::io::Result<Vec<Vec<PathBuf>>> {
    use crate::audit::verify::base_of;
    if args.len() != 1 {
        return Ok(vec![args.to_vec()]);
    }
    let one = &args[0];
    if one.is_dir() {
        let mut live: Vec<PathBuf> = std::fs::read_dir(one)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let s = p.to_string_lossy();
                p.is_file() && !s.ends_with(".head") && !s.ends_with(".tmp") && base_of(p) == *p
            })
            .collect();
        live.sort();
        return live.iter().map(|l| chain_files(l)).collect();
    }
    if base_of(one) == *one {
        let files = chain_files(one)?;
        if !files.is_empty() {
            return Ok(vec![files]);
        }
    }
    Ok(vec![vec![one.clone()]])
}

fn verify(v: VerifyArgs) -> ExitCode {
    let chains = match expand(&v.files) {
        Ok(c) if !c.is_empty() => c,
        Ok(_) => {
            eprintln!("no audit files found");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("cannot list audit files: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = VerifyOptions {
        allow_partial_start: v.allow_partial_start,
        head: v.head,
    };
    let mut failed = false;
    for files in chains {
        let report = match verify_files(&files, &opts) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("cannot read audit files: {e}");
                return ExitCode::from(2);
            }
        };
        for w in &report.warnings {
            eprintln!("warning: {w}");
        }
        let range = match (report.first_seq, report.last_seq) {
            (Some(a), Some(b)) => format!("seq {a}..{b}"),
            _ => "no records".into(),
        };
        match &report.error {
            Some(e) => {
                failed = true;
                println!("FAILED: {e}");
                println!(
                    "({} record(s) verified before it, {range}, in {} file(s))",
                    report.records,
                    files.len()
                );
            }
            None => {
                let head = match &report.head {
                    Some(h) => format!("; head at seq {} matches", h.seq),
                    None => "; no head checked".into(),
                };
                let name = files
                    .last()
                    .map(|f| f.display().to_string())
                    .unwrap_or_default();
                println!(
                    "OK: {} record(s), {range}, {} file(s), chain intact{head} ({name})",
                    report.records,
                    files.len()
                );
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn header() -> String {
    format!(
        "{:<27} {:>6} {:<22} {:<16} {:<24} {:<24} {:<15} {:>10}\n",
        "TIME", "SEQ", "EVENT", "AGENT", "REGISTRATION", "TOOL", "OUTCOME", "MS"
    )
}

fn row(r: &Record) -> String {
    format!(
        "{:<27} {:>6} {:<22} {:<16} {:<24} {:<24} {:<15} {:>10}\n",
        r.ts,
        r.seq,
        r.event,
        r.agent_id.as_deref().unwrap_or("-"),
        r.registration_id.as_deref().unwrap_or("-"),
        r.tool.as_deref().unwrap_or("-"),
        r.outcome.as_deref().unwrap_or("-"),
        r.duration_ms
            .map(|d| format!("{d:.2}"))
            .unwrap_or_else(|| "-".to_string()),
    )
}

/// A fixed-width table of records.
pub fn table(rows: &[&Record]) -> String {
    let mut out = header();
    for r in rows {
        out.push_str(&row(r));
    }
    out
}
