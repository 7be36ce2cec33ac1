//! The audit files: the mode they are created with, the rotated segments of a chain, and
//! the reader behind `gatehouse audit` (records of a file or a whole chain, filters).

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use super::record::Record;

/// The mode the audit file and its head sidecar are created with: records name agents,
/// tools and argument digests, so only the daemon's user reads them. Rotated segments are the
/// file renamed, so they keep it. An existing file keeps the mode it has (an operator may
/// have opened it to a log collector's group on purpose).
pub(super) const OWNER_ONLY: u32 = 0o600;

/// Rotated files of `path`: `<path>.000001`, `<path>.000002`, … in chain order.
pub fn segments(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(Vec::new());
    };
    let dir = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(d) => d.to_path_buf(),
        None => PathBuf::from("."),
    };
    let rd = match std::fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let prefix = format!("{name}.");
    let mut found: Vec<(u64, PathBuf)> = Vec::new();
    for entry in rd {
        let entry = entry?;
        let fname = entry.file_name();
        let Some(fname) = fname.to_str() else {
            continue;
        };
        if let Some(n) = fname.strip_prefix(&prefix) {
            if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                if let Ok(k) = n.parse::<u64>() {
                    found.push((k, dir.join(fname)));
                }
            }
        }
    }
    found.sort();
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

/// The rotated segments of `path` followed by `path` itself (if it exists): the whole chain.
pub fn chain_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = segments(path)?;
    if path.exists() {
        files.push(path.to_path_buf());
    }
    Ok(files)
}

pub(super) fn ends_with_newline(path: &Path, len: u64) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = File::open(path) else {
        return true;
    };
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(len - 1))
        .and_then(|_| f.read_exact(&mut b))
        .map(|_| b[0] == b'\n')
        .unwrap_or(true)
}

/// Reads every record of an audit file (lines that do not parse are skipped).
pub fn read_records(path: &Path) -> std::io::Result<Vec<Record<'static>>> {
    let f = File::open(path)?;
    let mut out = Vec::new();
    for line in BufReader::new(f).lines() {
        let line = line?;
        if let Ok(r) = serde_json::from_str::<Record>(&line) {
            out.push(r);
        }
    }
    Ok(out)
}

/// Reads every record of a chain: the rotated segments of `path`, then `path`.
pub fn read_chain(path: &Path) -> std::io::Result<Vec<Record<'static>>> {
    let mut out = Vec::new();
    for f in chain_files(path)? {
        out.extend(read_records(&f)?);
    }
    Ok(out)
}

/// Filters for `gatehouse audit`.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub agent_id: Option<String>,
    /// With `agent_id`: also the records of its descendants (child registrations whose
    /// `agent_path` holds it).
    pub descendants: bool,
    pub registration_id: Option<String>,
    pub tool: Option<String>,
    pub outcome: Option<String>,
    pub label: Option<String>,
    pub event: Option<String>,
    /// The OpenTelemetry trace id of a traced call (32 hex digits, any case).
    pub trace_id: Option<String>,
    /// Records at or after this time.
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    /// Records strictly before this time.
    pub until: Option<chrono::DateTime<chrono::Utc>>,
}

impl Filter {
    pub fn matches(&self, r: &Record) -> bool {
        fn eq(want: &Option<String>, have: &Option<Cow<'_, str>>) -> bool {
            want.as_deref().is_none_or(|w| have.as_deref() == Some(w))
        }
        let ts = || {
            chrono::DateTime::parse_from_rfc3339(&r.ts)
                .ok()
                .map(|t| t.with_timezone(&chrono::Utc))
        };
        let agent = match (&self.agent_id, self.descendants) {
            (Some(a), true) => {
                r.agent_id.as_deref() == Some(a.as_str())
                    || r.rare()
                        .agent_path
                        .as_ref()
                        .is_some_and(|p| p.iter().any(|x| x == a))
            }
            _ => eq(&self.agent_id, &r.agent_id),
        };
        agent
            && eq(&self.registration_id, &r.registration_id)
            && eq(&self.tool, &r.tool)
            && eq(&self.outcome, &r.outcome)
            && eq(&self.label, &r.label)
            && self.trace_id.as_ref().is_none_or(|t| {
                r.rare()
                    .trace_id
                    .as_deref()
                    .is_some_and(|h| h.eq_ignore_ascii_case(t.trim()))
            })
            && self.event.as_ref().is_none_or(|e| r.event == **e)
            && self.since.is_none_or(|s| ts().is_some_and(|t| t >= s))
            && self.until.is_none_or(|u| ts().is_some_and(|t| t < u))
    }
}
