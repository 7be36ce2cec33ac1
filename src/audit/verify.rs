//! Chain verification: walks the records of one or more files in order and reports the first
//! record that is not where the chain says it must be, then checks the chain head sidecar so a
//! cut tail is noticed too.
//!
//! Each line's `prev` is the SHA-256 of the previous line's exact bytes and `seq` counts up
//! by one. The first disagreement is classified by what the rest of the file says:
//! - the next record continues from the last good line → this line was **inserted**;
//! - `prev` names a line further down → records were **reordered**;
//! - `prev` names a line further up → the lines in between were **inserted**;
//! - `prev` names no line and `seq` jumps ahead → records were **deleted** (a gap);
//! - `prev` names no line and `seq` is the next one → the previous record was **edited**
//!   (its hash changed), or this record's `prev` was; `prev` right but `seq` wrong → edited.
//!
//! A line that is not a record at the very end is a torn write (a crash): a warning. One in the
//! middle is a warning too when the chain continues over it (the writer terminates a torn line
//! before appending after a crash), otherwise an error.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::chain::{head_path, line_hash, read_head, Head, GENESIS};
use super::record::Record;

/// What is wrong with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    Edited,
    Deleted,
    Reordered,
    Inserted,
    /// A line in the middle that is not a record, and the chain does not continue over it.
    Malformed,
    /// The files end before the record the head sidecar names.
    CutTail,
    /// The last line is incomplete (a crash during a write): a warning.
    TornLastLine,
    /// An incomplete line the chain continues over (a crash, then a restart): a warning.
    TornLine,
    /// No (readable) head sidecar: a cut tail cannot be detected. A warning.
    NoHead,
    /// The chain starts after seq 1 and partial starts were allowed: a warning.
    PartialStart,
}

impl Problem {
    pub fn as_str(self) -> &'static str {
        match self {
            Problem::Edited => "edited",
            Problem::Deleted => "deleted",
            Problem::Reordered => "reordered",
            Problem::Inserted => "inserted",
            Problem::Malformed => "malformed",
            Problem::CutTail => "cut tail",
            Problem::TornLastLine => "torn last line",
            Problem::TornLine => "torn line",
            Problem::NoHead => "no head",
            Problem::PartialStart => "partial start",
        }
    }
}

/// One finding, located by file and 1-based line.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub problem: Problem,
    pub file: PathBuf,
    pub line: usize,
    /// The seq the record claims (when it parses).
    pub seq: Option<u64>,
    pub detail: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: ", self.file.display(), self.line)?;
        if let Some(seq) = self.seq {
            write!(f, "seq {seq}: ")?;
        }
        write!(f, "{}: {}", self.problem.as_str(), self.detail)
    }
}

/// The result of verifying a chain.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Records on the chain up to the first error (or all of them).
    pub records: u64,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    /// The head sidecar that was checked, if any.
    pub head: Option<Head>,
    /// The first error; `None` means the chain verifies.
    pub error: Option<Finding>,
    pub warnings: Vec<Finding>,
}

impl Report {
    pub fn is_ok(&self) -> bool {
        self.error.is_none()
    }
}

/// Options for [`verify_files`].
#[derive(Debug, Clone, Default)]
pub struct VerifyOptions {
    /// Accept a chain whose first record is not seq 1 (older segments removed on purpose).
    pub allow_partial_start: bool,
    /// The head sidecar to check; default: `<last file without .NNNNNN>.head`.
    pub head: Option<PathBuf>,
}

struct Line {
    file: usize,
    lineno: usize,
    hash: String,
    record: Option<Record<'static>>,
}

/// The file a segment belongs to: `audit.jsonl.000003` → `audit.jsonl`.
pub fn base_of(path: &Path) -> PathBuf {
    let s = path.to_string_lossy();
    if let Some((base, n)) = s.rsplit_once('.') {
        if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
            return PathBuf::from(base);
        }
    }
    path.to_path_buf()
}

/// Verifies the chain formed by `files` in order (rotated segments first, the live file last).
pub fn verify_files(files: &[PathBuf], opts: &VerifyOptions) -> std::io::Result<Report> {
    let mut lines: Vec<Line> = Vec::new();
    let mut torn_end = false;
    for (fi, path) in files.iter().enumerate() {
        let bytes = std::fs::read(path)?;
        let text = String::from_utf8_lossy(&bytes);
        let complete = text.ends_with('\n');
        let parts: Vec<&str> = text.split_terminator('\n').collect();
        for (i, l) in parts.iter().enumerate() {
            lines.push(Line {
                file: fi,
                lineno: i + 1,
                hash: line_hash(l),
                record: serde_json::from_str::<Record>(l).ok(),
            });
        }
        if fi + 1 == files.len() && !complete && !parts.is_empty() {
            torn_end = true;
        }
    }
    let mut by_hash: HashMap<&str, usize> = HashMap::new();
    for (i, l) in lines.iter().enumerate() {
        if l.record.is_some() {
            by_hash.entry(l.hash.as_str()).or_insert(i);
        }
    }
    let at = |i: usize, problem: Problem, seq: Option<u64>, detail: String| Finding {
        problem,
        file: files[lines[i].file].clone(),
        line: lines[i].lineno,
        seq,
        detail,
    };
    let mut report = Report::default();
    // (index, seq, hash) of the last good record.
    let mut last: Option<(usize, u64, String)> = None;
    let n = lines.len();
    let mut i = 0;
    while i < n {
        let line = &lines[i];
        let (exp_prev, exp_seq) = match &last {
            Some((_, s, h)) => (h.clone(), s + 1),
            None => (GENESIS.to_string(), 1),
        };
        let Some(r) = &line.record else {
            if i + 1 == n {
                let detail = if torn_end {
                    "the last line is incomplete (a crash during a write); the records before it verify"
                } else {
                    "the last line is not a record"
                };
                report
                    .warnings
                    .push(at(i, Problem::TornLastLine, None, detail.into()));
                break;
            }
            let continues = lines[i + 1]
                .record
                .as_ref()
                .is_some_and(|nr| nr.prev == exp_prev && nr.seq == exp_seq);
            if continues {
                report.warnings.push(at(
                    i,
                    Problem::TornLine,
                    None,
                    "an incomplete line (a write interrupted by a crash); the chain continues after it"
                        .into(),
                ));
                i += 1;
                continue;
            }
            report.error = Some(at(
                i,
                Problem::Malformed,
                None,
                "this line is not a record and the chain does not continue over it".into(),
            ));
            break;
        };
        if last.is_none() && r.prev != GENESIS && opts.allow_partial_start {
            report.warnings.push(at(
                i,
                Problem::PartialStart,
                Some(r.seq),
                format!(
                    "the chain starts at seq {} (earlier records not given)",
                    r.seq
                ),
            ));
        } else if r.prev != exp_prev || r.seq != exp_seq {
            report.error = Some(classify(
                i, r, &exp_prev, exp_seq, &lines, &by_hash, &last, &at,
            ));
            break;
        }
        report.records += 1;
        report.first_seq.get_or_insert(r.seq);
        report.last_seq = Some(r.seq);
        last = Some((i, r.seq, line.hash.clone()));
        i += 1;
    }
    if report.error.is_none() {
        check_head(files, opts, &lines, &mut report, &at)?;
    }
    Ok(report)
}

#[allow(clippy::too_many_arguments)]
fn classify(
    i: usize,
    r: &Record,
    exp_prev: &str,
    exp_seq: u64,
    lines: &[Line],
    by_hash: &HashMap<&str, usize>,
    last: &Option<(usize, u64, String)>,
    at: &dyn Fn(usize, Problem, Option<u64>, String) -> Finding,
) -> Finding {
    let seq = Some(r.seq);
    if r.prev == exp_prev {
        return at(
            i,
            Problem::Edited,
            seq,
            format!(
                "the record continues the chain but says seq {}, expected {exp_seq}",
                r.seq
            ),
        );
    }
    if let Some(&j) = by_hash.get(r.prev.as_str()) {
        if j > i {
            return at(
                i,
                Problem::Reordered,
                seq,
                format!(
                    "the record continues from a record further down (line {} of its file, seq {}): records were reordered",
                    lines[j].lineno,
                    lines[j].record.as_ref().map(|x| x.seq).unwrap_or_default()
                ),
            );
        }
    }
    // The next record continues from the last good line: this one does not belong.
    let next_continues = lines
        .get(i + 1)
        .and_then(|l| l.record.as_ref())
        .is_some_and(|nr| nr.prev == exp_prev);
    if next_continues {
        return at(
            i,
            Problem::Inserted,
            seq,
            "this record is not on the chain: the next record continues from the one before it"
                .into(),
        );
    }
    if let Some(&j) = by_hash.get(r.prev.as_str()) {
        let first_inserted = j + 1;
        return at(
            first_inserted,
            Problem::Inserted,
            lines[first_inserted].record.as_ref().map(|x| x.seq),
            format!(
                "{} line(s) here are not on the chain: the record with seq {} continues from the line before them",
                i - first_inserted,
                r.seq
            ),
        );
    }
    if last.is_none() {
        return if r.seq > 1 {
            at(
                i,
                Problem::Deleted,
                seq,
                format!(
                    "the chain starts at seq {}: records 1..{} are missing",
                    r.seq,
                    r.seq - 1
                ),
            )
        } else {
            at(
                i,
                Problem::Edited,
                seq,
                "the first record's prev is not the genesis value".into(),
            )
        };
    }
    if r.seq > exp_seq {
        let gap = if r.seq - exp_seq == 1 {
            format!("record {exp_seq} is missing")
        } else {
            format!("records {exp_seq}..{} are missing", r.seq - 1)
        };
        return at(i, Problem::Deleted, seq, format!("{gap} before this line"));
    }
    if r.seq == exp_seq {
        if let Some((j, s, _)) = last {
            return at(
                *j,
                Problem::Edited,
                Some(*s),
                format!(
                    "the record was changed after it was written: its hash does not match the prev of the next record (seq {})",
                    r.seq
                ),
            );
        }
    }
    at(
        i,
        Problem::Reordered,
        seq,
        format!("seq {} appears after seq {}", r.seq, exp_seq - 1),
    )
}

fn check_head(
    files: &[PathBuf],
    opts: &VerifyOptions,
    lines: &[Line],
    report: &mut Report,
    at: &dyn Fn(usize, Problem, Option<u64>, String) -> Finding,
) -> std::io::Result<()> {
    let Some(last_file) = files.last() else {
        return Ok(());
    };
    let base = opts.head.clone().map(|h| {
        // `--head` names the sidecar itself.
        let s = h.to_string_lossy().to_string();
        PathBuf::from(s.strip_suffix(".head").unwrap_or(&s))
    });
    let base = base.unwrap_or_else(|| base_of(last_file));
    let head = match read_head(&base) {
        Ok(Some(h)) => h,
        Ok(None) | Err(_) => {
            report.warnings.push(Finding {
                problem: Problem::NoHead,
                file: head_path(&base),
                line: 0,
                seq: None,
                detail: "no readable chain head: a cut tail cannot be detected".into(),
            });
            return Ok(());
        }
    };
    report.head = Some(head.clone());
    let last_seq = report.last_seq.unwrap_or(0);
    if head.seq > last_seq {
        let missing = if head.seq == last_seq + 1 {
            format!("record {} is missing", head.seq)
        } else {
            format!("records {}..{} are missing", last_seq + 1, head.seq)
        };
        report.error = Some(Finding {
            problem: Problem::CutTail,
            file: last_file.clone(),
            line: lines.iter().filter(|l| l.file + 1 == files.len()).count(),
            seq: report.last_seq,
            detail: format!(
                "the chain ends at seq {last_seq} but its head says seq {}: {missing} (the tail was cut)",
                head.seq
            ),
        });
        return Ok(());
    }
    if let Some(i) = lines
        .iter()
        .position(|l| l.record.as_ref().is_some_and(|r| r.seq == head.seq))
    {
        if lines[i].hash != head.hash {
            report.error = Some(at(
                i,
                Problem::Edited,
                Some(head.seq),
                "the record does not match the chain head (changed after it was written)".into(),
            ));
        }
    } else if head.seq > 0 && report.first_seq.is_some_and(|f| f <= head.seq) {
        report.error = Some(Finding {
            problem: Problem::Deleted,
            file: last_file.clone(),
            line: 0,
            seq: Some(head.seq),
            detail: "the record named by the chain head is not in the files".into(),
        });
    }
    Ok(())
}
