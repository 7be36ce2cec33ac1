//! The audit tail the operator console shows: the newest records of a chain, read backwards
//! from the live file (then the rotated segments before it) within a byte budget, the chain
//! verified over the window read, and the head sidecar checked against it.
//!
//! Nothing here returns a tool's arguments: [`Tail::records`] have `arguments` removed.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use super::chain::{line_hash, read_head, GENESIS};
use super::files::{chain_files, Filter};
use super::record::Record;

/// What the chain says about the window read.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WindowCheck {
    /// `ok`, `broken` (a link or the head disagrees), or `empty` (no record read).
    pub state: &'static str,
    /// Records in the window (all of them, before filtering).
    pub records: usize,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// Whether the window reaches the start of the chain (so its first `prev` is checked
    /// against the genesis value too).
    pub from_start: bool,
    /// The head sidecar's seq, if there is one.
    pub head_seq: Option<u64>,
    /// `true`: the record the head names is in the window and matches; `false`: it does not
    /// (or the files end before it); `None`: the head names a record older than the window.
    pub head_matches: Option<bool>,
    /// The first disagreement, e.g. `seq 12: prev does not match the hash of seq 11`.
    pub problem: Option<String>,
    /// Bytes read.
    pub bytes: u64,
}

/// The newest records that pass a filter, and the check of the window they came from.
#[derive(Debug, Clone)]
pub struct Tail {
    /// Newest first, at most the limit asked for; `arguments` removed.
    pub records: Vec<Record<'static>>,
    pub check: WindowCheck,
}

/// One complete line of the window, in chain order.
struct Line {
    hash: String,
    record: Option<Record<'static>>,
}

/// Reads the last `budget` bytes of `path` (whole lines only). Returns the lines, oldest
/// first, the bytes read, and whether the file was read from its start.
fn read_back(path: &Path, budget: u64) -> std::io::Result<(Vec<String>, u64, bool)> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0, true)),
        Err(e) => return Err(e),
    };
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Ok((Vec::new(), 0, true));
    }
    let len = meta.len();
    let start = len.saturating_sub(budget);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::with_capacity((len - start) as usize);
    (&mut f).take(len - start).read_to_end(&mut buf)?;
    let read = buf.len() as u64;
    let mut text = String::from_utf8_lossy(&buf).into_owned();
    // An incomplete last line is a record being written (or torn by a crash): not yet there.
    match text.rfind('\n') {
        Some(i) => text.truncate(i + 1),
        None => text.clear(),
    }
    let mut lines: Vec<String> = text.split_terminator('\n').map(str::to_string).collect();
    let from_start = start == 0;
    if !from_start && !lines.is_empty() {
        // The read began inside a line, unless the byte before it ends one.
        let mut b = [0u8; 1];
        f.seek(SeekFrom::Start(start - 1))?;
        f.read_exact(&mut b)?;
        if b[0] != b'\n' {
            lines.remove(0);
        }
    }
    Ok((lines, read, from_start))
}

/// The tail of the chain at `path`: at most `max_bytes` read, newest records first, at most
/// `limit` of those `filter` passes.
pub fn tail(path: &Path, filter: &Filter, limit: usize, max_bytes: u64) -> std::io::Result<Tail> {
    // The head first: it names a record already written, so a record the files hold.
    let head = read_head(path).ok().flatten();
    let files = chain_files(path)?;
    let mut budget = max_bytes;
    let mut chunks: Vec<Vec<String>> = Vec::new();
    let mut from_start = files.is_empty();
    let mut bytes = 0;
    for (i, file) in files.iter().enumerate().rev() {
        if budget == 0 {
            break;
        }
        let (lines, read, whole) = read_back(file, budget)?;
        budget = budget.saturating_sub(read);
        bytes += read;
        chunks.push(lines);
        if !whole {
            break;
        }
        if i == 0 {
            from_start = true;
        }
    }
    let lines: Vec<Line> = chunks
        .into_iter()
        .rev()
        .flatten()
        .map(|l| Line {
            hash: line_hash(&l),
            record: serde_json::from_str::<Record>(&l).ok(),
        })
        .collect();
    let check = check(&lines, from_start, head.as_ref(), bytes);
    let records = lines
        .into_iter()
        .rev()
        .filter_map(|l| l.record)
        .filter(|r| filter.matches(r))
        .take(limit)
        .map(|mut r| {
            r.arguments = None;
            r
        })
        .collect();
    Ok(Tail { records, check })
}

/// Verifies the links inside the window and the head against it.
fn check(
    lines: &[Line],
    from_start: bool,
    head: Option<&super::chain::Head>,
    bytes: u64,
) -> WindowCheck {
    let mut problem = None;
    let mut prev: Option<(&str, u64)> = None;
    let mut first_seq = None;
    let mut last_seq = None;
    let mut records = 0;
    for (i, l) in lines.iter().enumerate() {
        let Some(r) = &l.record else {
            problem.get_or_insert_with(|| {
                format!(
                    "line {} of the window is not a record (after seq {})",
                    i + 1,
                    last_seq.map_or("none".into(), |s: u64| s.to_string())
                )
            });
            prev = None;
            continue;
        };
        records += 1;
        first_seq.get_or_insert(r.seq);
        match prev {
            Some((hash, seq)) => {
                if r.prev != hash {
                    problem.get_or_insert_with(|| {
                        format!(
                            "seq {}: prev does not match the hash of the line before (seq {seq})",
                            r.seq
                        )
                    });
                } else if r.seq != seq + 1 {
                    problem.get_or_insert_with(|| {
                        format!("seq {}: follows seq {seq} (a gap or an edit)", r.seq)
                    });
                }
            }
            None if from_start && i == 0 && (r.prev != GENESIS || r.seq != 1) => {
                problem.get_or_insert_with(|| {
                    format!("seq {}: the chain's first record does not start it", r.seq)
                });
            }
            None => {}
        }
        prev = Some((&l.hash, r.seq));
        last_seq = Some(r.seq);
    }
    let head_matches = head.and_then(|h| {
        if last_seq.is_none_or(|last| h.seq > last) {
            if h.seq == 0 {
                return None;
            }
            problem.get_or_insert_with(|| {
                format!(
                    "the files end at seq {} but the chain head says seq {} (the tail was cut)",
                    last_seq.map_or("none".into(), |s| s.to_string()),
                    h.seq
                )
            });
            return Some(false);
        }
        let at = lines
            .iter()
            .find(|l| l.record.as_ref().is_some_and(|r| r.seq == h.seq))?;
        let ok = at.hash == h.hash;
        if !ok {
            problem.get_or_insert_with(|| format!("seq {}: does not match the chain head", h.seq));
        }
        Some(ok)
    });
    WindowCheck {
        state: if problem.is_some() {
            "broken"
        } else if records == 0 {
            "empty"
        } else {
            "ok"
        },
        records,
        first_seq,
        last_seq,
        from_start,
        head_seq: head.map(|h| h.seq),
        head_matches,
        problem,
        bytes,
    }
}

// Unit tests only (never built into the daemon): an unwrap that fails is the test failing.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::{AuditConfig, FsyncPolicy};

    /// A chain of `n` call records written by the real writer (rotating at `rotate` bytes).
    fn chain(n: usize, rotate: u64) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let config = AuditConfig {
            path: path.clone(),
            fsync: FsyncPolicy::Never,
            rotate_bytes: rotate,
            ..AuditConfig::default()
        };
        let audit = crate::audit::Audit::start(&config).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for i in 0..n {
            let agent = format!("agent-{}", i % 3);
            let mut r = Record::about("governed_mcp_call", "reg", &agent, None);
            r.tool = Some(format!("t{}", i % 2).into());
            r.outcome = Some(if i % 5 == 0 { "tool_error" } else { "ok" }.into());
            r.arguments = Some(serde_json::json!({"secret": format!("value-{i}")}));
            rt.block_on(audit.record(r)).unwrap();
        }
        drop(audit);
        (dir, path)
    }

    #[test]
    fn the_tail_is_newest_first_filtered_bounded_and_without_arguments() {
        let (_dir, path) = chain(200, 0);
        let all = tail(&path, &Filter::default(), 1000, 1 << 20).unwrap();
        assert_eq!(all.check.state, "ok", "{:?}", all.check);
        assert!(all.check.from_start);
        assert_eq!(all.check.head_matches, Some(true));
        assert_eq!(all.records.len(), 200);
        assert_eq!(all.records[0].seq, 200);
        assert!(all.records.iter().all(|r| r.arguments.is_none()));
        let f = Filter {
            agent_id: Some("agent-1".into()),
            outcome: Some("ok".into()),
            ..Filter::default()
        };
        let some = tail(&path, &f, 5, 1 << 20).unwrap();
        assert_eq!(some.records.len(), 5);
        assert!(some.records.windows(2).all(|w| w[0].seq > w[1].seq));
        assert!(some.records.iter().all(
            |r| r.agent_id.as_deref() == Some("agent-1") && r.outcome.as_deref() == Some("ok")
        ));
        // A small budget reads whole lines from the end only, and still verifies.
        let small = tail(&path, &Filter::default(), 1000, 2_000).unwrap();
        assert!(small.check.bytes <= 2_000);
        assert!(!small.check.from_start);
        assert_eq!(small.check.state, "ok");
        assert_eq!(small.records[0].seq, 200);
        assert!(small.records.len() < 200 && !small.records.is_empty());
    }

    #[test]
    fn the_window_spans_rotated_segments_and_an_edit_or_cut_is_reported() {
        let (_dir, path) = chain(300, 8_000);
        assert!(!crate::audit::segments(&path).unwrap().is_empty());
        let t = tail(&path, &Filter::default(), 1000, 1 << 20).unwrap();
        assert_eq!(t.check.state, "ok", "{:?}", t.check);
        assert_eq!(t.records.len(), 300);
        // Edit one record in the live file: the next link breaks.
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mid = lines.len() / 2;
        let edited = lines[mid]
            .replace("\"ok\"", "\"denied\"")
            .replace("tool_error", "denied");
        let mut out: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
        out[mid] = edited;
        std::fs::write(&path, out.join("\n") + "\n").unwrap();
        let t = tail(&path, &Filter::default(), 10, 1 << 20).unwrap();
        assert_eq!(t.check.state, "broken");
        assert!(t
            .check
            .problem
            .as_deref()
            .unwrap()
            .contains("prev does not match"));
        // Cut the tail: the head names a record that is gone.
        let cut: Vec<&str> = text.lines().collect();
        std::fs::write(&path, cut[..cut.len() - 2].join("\n") + "\n").unwrap();
        let t = tail(&path, &Filter::default(), 10, 1 << 20).unwrap();
        assert_eq!(t.check.state, "broken");
        assert_eq!(t.check.head_matches, Some(false));
        assert!(t.check.problem.as_deref().unwrap().contains("tail was cut"));
        // A half-written last line is not a record yet, not a problem.
        let mut whole = text.clone();
        whole.push_str("{\"ts\":\"2026");
        std::fs::write(&path, whole).unwrap();
        let t = tail(&path, &Filter::default(), 10, 1 << 20).unwrap();
        assert_eq!(t.check.state, "ok", "{:?}", t.check);
    }

    #[test]
    fn no_file_is_an_empty_window() {
        let dir = tempfile::tempdir().unwrap();
        let t = tail(
            &dir.path().join("none.jsonl"),
            &Filter::default(),
            10,
            1 << 20,
        )
        .unwrap();
        assert_eq!(t.check.state, "empty");
        assert!(t.records.is_empty());
    }
}
