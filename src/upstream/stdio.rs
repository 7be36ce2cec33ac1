//! stdio upstream transport: the child process in its own process group, its stdin writer, stdout reader, stderr forwarder, exit watcher, and group teardown.
//!
//! Framing is newline-delimited JSON. Lines that are not JSON are logged and skipped; the
//! connection survives garbage. Outbound messages go through one bounded channel to one writer
//! task, so lines never interleave.
//!
//! Invariants:
//! - The child is the leader of its own process group (`process_group(0)`), so signals to the
//!   group reach grandchildren that launchers like `npx`/`sh` leave behind.
//! - Every task but the exit watcher is owned by the transport's `JoinSet` (aborted on drop).
//!   The watcher is never aborted: it reaps the leader, so no zombie is left behind, and its
//!   life is bounded by the child's, which teardown ends with SIGKILL at the latest. Dropping the transport
//!   before [`StdioTransport::shutdown`] has finished — never called, or cut short by a
//!   caller's timeout (a release is bounded by `pool::RELEASE_TIMEOUT`) — SIGKILLs the group,
//!   and the child is `kill_on_drop`.
//! - Every group not yet known to be empty is in a process-wide set, so a daemon that must
//!   exit before its teardown finished SIGKILLs them all first ([`kill_all_groups`]).
//! - The connection is declared closed when the child exits, even if a grandchild keeps stdout
//!   open, so pending requests never wait for an EOF that may not come.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, Command};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::core::Core;
use super::events::{Limiter, Refusal, SUMMARY_EVERY};
use super::UpstreamError;
use crate::sync::lock;

/// Capacity of the outbound line queue (backpressure for writers).
const OUTBOUND_QUEUE: usize = 64;
/// Longest stdout line accepted (larger lines are skipped, the connection survives).
const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;
/// Longest stderr line forwarded to the log (longer lines are skipped).
const MAX_STDERR_LINE_BYTES: usize = 64 * 1024;
/// How long the reader waits for room in the outbound queue for its own replies.
const REPLY_WAIT: Duration = Duration::from_secs(2);
/// Stderr lines logged per second per child, sustained, and in a burst.
const STDERR_LINES_PER_S: u32 = 100;
const STDERR_BURST: u32 = 500;
/// After SIGKILL, how long to wait for the leader to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(2);
/// Polling interval while waiting for a process group to empty.
const GROUP_POLL: Duration = Duration::from_millis(20);

/// Process groups of stdio children not yet known to be empty (the leader's pid, which is
/// the group id). Process-wide, like the pids themselves: `kill_all_groups` is for a process
/// about to exit without running destructors.
static LIVE_GROUPS: Mutex<std::collections::BTreeSet<i32>> =
    Mutex::new(std::collections::BTreeSet::new());

/// SIGKILLs every process group a stdio transport of this process spawned and has not seen
/// empty yet; returns how many were signalled. For the daemon's forced exit
/// (`std::process::exit` runs no destructor, so no transport's `Drop` would).
pub fn kill_all_groups() -> usize {
    let groups: Vec<i32> = lock(&LIVE_GROUPS).iter().copied().collect();
    for pgid in &groups {
        signal_group("*", Pid::from_raw(*pgid), Signal::SIGKILL);
    }
    groups.len()
}

pub(crate) struct StdioTransport {
    upstream_id: String,
    pid: u32,
    out: mpsc::Sender<Vec<u8>>,
    close_stdin: CancellationToken,
    exited: watch::Receiver<bool>,
    tasks: Mutex<JoinSet<()>>,
    /// The exit watcher (see the module's invariants: it outlives the transport until the
    /// leader is reaped; dropping the handle detaches it).
    _watcher: tokio::task::JoinHandle<()>,
    torn_down: AtomicBool,
    grace: Duration,
}

impl StdioTransport {
    /// Spawns the child and its reader, writer, stderr and exit-watcher tasks.
    pub(crate) fn spawn(
        core: &Arc<Core>,
        command: &str,
        args: &[String],
        env: &BTreeMap<String, String>,
        cwd: Option<&Path>,
        grace: Duration,
    ) -> Result<Self, UpstreamError> {
        let mut cmd = Command::new(command);
        cmd.args(args)
            .envs(env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(cwd) = cwd {
            cmd.current_dir(cwd);
        }
        let mut child = cmd.spawn().map_err(UpstreamError::Spawn)?;
        let pid = child
            .id()
            .ok_or_else(|| UpstreamError::Closed("upstream process exited at spawn".to_owned()))?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            // Unreachable with piped stdio; the child is killed on drop.
            return Err(UpstreamError::Closed(
                "upstream process pipes unavailable".to_owned(),
            ));
        };
        if let Some(pgid) = pgid_of(pid) {
            lock(&LIVE_GROUPS).insert(pgid.as_raw());
        }
        let upstream_id = core.upstream_id.clone();
        tracing::info!(upstream = %upstream_id, epoch = core.epoch, pid, command, "spawned upstream process");

        let (out_tx, out_rx) = mpsc::channel::<Vec<u8>>(OUTBOUND_QUEUE);
        let (exited_tx, exited_rx) = watch::channel(false);
        let close_stdin = CancellationToken::new();
        let mut tasks = JoinSet::new();
        tasks.spawn(write_stdin(
            core.clone(),
            stdin,
            out_rx,
            close_stdin.clone(),
        ));
        tasks.spawn(read_stdout(
            core.clone(),
            BufReader::new(stdout),
            out_tx.clone(),
        ));
        tasks.spawn(forward_stderr(upstream_id.clone(), BufReader::new(stderr)));
        let watcher_core = core.clone();
        let watcher = tokio::spawn(async move {
            let reason = match child.wait().await {
                Ok(status) => format!("upstream process exited ({status})"),
                Err(err) => format!("upstream process wait failed: {err}"),
            };
            let _ = exited_tx.send(true);
            watcher_core.mark_closed(reason);
        });
        Ok(Self {
            upstream_id,
            pid,
            out: out_tx,
            close_stdin,
            exited: exited_rx,
            tasks: Mutex::new(tasks),
            _watcher: watcher,
            torn_down: AtomicBool::new(false),
            grace,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Queues one message as one line (waits if the queue is full).
    pub(crate) async fn send(&self, msg: &Value) -> Result<(), UpstreamError> {
        self.send_line(encode_line(msg)?).await
    }

    /// Queues one encoded line (it ends with `\n`; waits if the queue is full).
    pub(crate) async fn send_line(&self, line: Vec<u8>) -> Result<(), UpstreamError> {
        self.out
            .send(line)
            .await
            .map_err(|_| UpstreamError::Closed("upstream stdin is closed".to_owned()))
    }

    /// Queues one message without waiting; drops it (with a log line) if the queue is full.
    // why: only for what a `Drop` sends (a request abandoned → `notifications/cancelled`), where
    // nothing can wait; the queue is the bounded stdin queue, and a full one means the upstream is
    // not reading, so the cancel would not be read either.
    pub(crate) fn send_or_drop(&self, msg: &Value) {
        // why: from Drop only; bounded stdin queue, a drop is logged
        match encode_line(msg) {
            Ok(line) => {
                let sent = self.out.try_send(line); // bounded: OUTBOUND_QUEUE; full = upstream not reading, logged
                if sent.is_err() {
                    // bounded: OUTBOUND_QUEUE; full = upstream not reading, logged
                    tracing::debug!(upstream = %self.upstream_id, "outbound queue full or closed; dropping message");
                }
            }
            Err(err) => {
                tracing::warn!(upstream = %self.upstream_id, error = %err, "could not encode message")
            }
        }
    }

    /// Graceful teardown: close stdin → wait `grace` → SIGTERM the group → wait `grace` →
    /// SIGKILL the group → wait for the group to empty. Then abort the remaining tasks. If
    /// this future is dropped before its end, the transport's `Drop` SIGKILLs the group.
    pub(crate) async fn shutdown(&self) {
        let Some(pgid) = pgid_of(self.pid) else {
            self.torn_down.store(true, Ordering::SeqCst);
            return;
        };
        let mut exited = self.exited.clone();
        self.close_stdin.cancel();
        let leader_done = wait_exited(&mut exited, self.grace).await;
        if !leader_done || group_alive(pgid) {
            tracing::debug!(upstream = %self.upstream_id, pgid = self.pid, "sending SIGTERM to upstream process group");
            signal_group(&self.upstream_id, pgid, Signal::SIGTERM);
            let deadline = Instant::now() + self.grace;
            let mut clean = false;
            while Instant::now() < deadline {
                if *exited.borrow() && !group_alive(pgid) {
                    clean = true;
                    break;
                }
                tokio::time::sleep(GROUP_POLL).await;
            }
            if !clean {
                tracing::warn!(upstream = %self.upstream_id, pgid = self.pid, "upstream process group survived SIGTERM; sending SIGKILL");
                signal_group(&self.upstream_id, pgid, Signal::SIGKILL);
                if !wait_exited(&mut exited, KILL_WAIT).await {
                    tracing::warn!(upstream = %self.upstream_id, pid = self.pid, "upstream process not reaped after SIGKILL");
                }
                // SIGKILL cannot be caught, but the members die one by one.
                let deadline = Instant::now() + KILL_WAIT;
                while group_alive(pgid) && Instant::now() < deadline {
                    tokio::time::sleep(GROUP_POLL).await;
                }
            }
        }
        self.torn_down.store(true, Ordering::SeqCst);
        if !group_alive(pgid) {
            lock(&LIVE_GROUPS).remove(&pgid.as_raw());
        }
        lock(&self.tasks).abort_all();
        tracing::info!(upstream = %self.upstream_id, pid = self.pid, "upstream process torn down");
    }
}

impl Drop for StdioTransport {
    fn drop(&mut self) {
        let Some(pgid) = pgid_of(self.pid) else {
            return;
        };
        if !self.torn_down.load(Ordering::SeqCst) {
            // No time to be graceful (never shut down, or the shutdown was cut short): kill the
            // whole group. The JoinSet aborts the pipe tasks when it drops; the watcher reaps
            // the leader.
            if group_alive(pgid) {
                tracing::warn!(upstream = %self.upstream_id, pgid = self.pid, "upstream teardown cut short; sending SIGKILL to the process group");
            }
            signal_group(&self.upstream_id, pgid, Signal::SIGKILL);
        }
        // SIGKILLed or seen empty: nothing of the group can outlive it (but a member that
        // called setsid(), which left the group; docs/upstreams.md).
        lock(&LIVE_GROUPS).remove(&pgid.as_raw());
    }
}

fn encode_line(msg: &Value) -> Result<Vec<u8>, UpstreamError> {
    let mut line = serde_json::to_vec(msg)?;
    line.push(b'\n');
    Ok(line)
}

fn pgid_of(pid: u32) -> Option<Pid> {
    i32::try_from(pid)
        .ok()
        .filter(|pid| *pid > 1)
        .map(Pid::from_raw)
}

fn signal_group(upstream_id: &str, pgid: Pid, signal: Signal) {
    match killpg(pgid, signal) {
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(err) => {
            tracing::warn!(upstream = %upstream_id, %pgid, ?signal, error = %err, "failed to signal upstream process group")
        }
    }
}

/// Waits until the leader has exited (and been reaped by the watcher task), up to `limit`.
async fn wait_exited(exited: &mut watch::Receiver<bool>, limit: Duration) -> bool {
    matches!(
        tokio::time::timeout(limit, exited.wait_for(|exited| *exited)).await,
        Ok(Ok(_))
    )
}

/// Whether any *live* process remains in the group. Zombies (dead, waiting for init to reap
/// them) do not count: they hold no resources and ignore signals. On systems without `/proc`
/// any group member counts as alive.
fn group_alive(pgid: Pid) -> bool {
    match killpg(pgid, None) {
        Err(Errno::ESRCH) => false,
        Err(_) => true,
        Ok(()) => live_member_in_proc(pgid).unwrap_or(true),
    }
}

fn live_member_in_proc(pgid: Pid) -> Option<bool> {
    let entries = std::fs::read_dir("/proc").ok()?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid pgrp …`; comm may contain spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let pgrp = fields.nth(1).and_then(|p| p.parse::<i32>().ok());
        if pgrp == Some(pgid.as_raw()) && !matches!(state, Some("Z") | Some("X")) {
            return Some(true);
        }
    }
    Some(false)
}

/// At most this many bytes of queued lines are joined into one write to a child's stdin
/// (a longer line goes alone; the queue itself is bounded by `OUTBOUND_QUEUE` lines).
const WRITE_BATCH: usize = 64 * 1024;

async fn write_stdin(
    core: Arc<Core>,
    mut stdin: ChildStdin,
    mut lines: mpsc::Receiver<Vec<u8>>,
    close: CancellationToken,
) {
    loop {
        let line = tokio::select! {
            biased;
            () = close.cancelled() => break,
            line = lines.recv() => match line {
                Some(line) => line,
                None => break,
            },
        };
        // Lines queued meanwhile go out in the same write (one syscall, one wake-up of the
        // child, for a burst of calls), up to `WRITE_BATCH` bytes.
        let mut batch = line;
        while batch.len() < WRITE_BATCH {
            match lines.try_recv() {
                Ok(next) => batch.extend_from_slice(&next),
                Err(_) => break,
            }
        }
        let written = async {
            stdin.write_all(&batch).await?;
            stdin.flush().await
        };
        if let Err(err) = written.await {
            core.mark_closed(format!("writing to upstream stdin failed: {err}"));
            break;
        }
    }
    // Dropping stdin closes the pipe: the polite "please exit" of the stdio transport.
    drop(stdin);
}

/// A line read as a response with a result, the result left as the upstream wrote it. Any
/// other message (a method, an error, a non-numeric id: not one of ours) is told apart by the
/// `Option`s and read the general way.
#[derive(serde::Deserialize)]
struct ResultLine<'a> {
    id: Option<u64>,
    #[serde(borrow)]
    result: Option<&'a serde_json::value::RawValue>,
    method: Option<serde::de::IgnoredAny>,
    error: Option<serde::de::IgnoredAny>,
}

async fn read_stdout<R: AsyncBufRead + Unpin>(
    core: Arc<Core>,
    mut stdout: R,
    out: mpsc::Sender<Vec<u8>>,
) {
    let mut buf = Vec::new();
    // Warnings about what the upstream writes are rate-limited like its stderr lines.
    let mut warnings = Limiter::new(STDERR_LINES_PER_S, STDERR_BURST);
    let reason = loop {
        shrink(&mut buf);
        match read_line_bounded(&mut stdout, &mut buf, MAX_LINE_BYTES).await {
            Ok(None) => break "upstream closed stdout".to_owned(),
            Err(err) => break format!("reading upstream stdout failed: {err}"),
            Ok(Some(LineStatus::TooLong)) => {
                // `buf` holds the line's first bytes: a response's id is there, and its
                // waiter is failed now instead of waiting out its timeout.
                let answered =
                    response_id(&buf).is_some_and(|id| core.on_oversized(id, MAX_LINE_BYTES));
                if may_warn(&mut warnings, &core.upstream_id) {
                    tracing::warn!(upstream = %core.upstream_id, max = MAX_LINE_BYTES, failed_request = answered, "skipping over-long line from upstream stdout");
                }
            }
            Ok(Some(LineStatus::Complete)) => {
                let line = buf.trim_ascii();
                if line.is_empty() {
                    continue;
                }
                // The common line, a response with a result, is read without parsing the
                // result, which then goes on as written; everything else (and anything odd
                // about it) takes the general path. A line with a CR in it (JSON whitespace,
                // but a line break to an event stream) is re-encoded: a result passed through
                // holds no line break. Objects only: a derived struct would also read an
                // array by position.
                if line.first() == Some(&b'{') && !line.contains(&b'\r') {
                    if let Ok(ResultLine {
                        id: Some(id),
                        result: Some(result),
                        method: None,
                        error: None,
                    }) = serde_json::from_slice::<ResultLine>(line)
                    {
                        core.on_result(id, result);
                        continue;
                    }
                }
                match serde_json::from_slice::<Value>(line) {
                    Ok(msg) => {
                        if let Some(reply) = core.dispatch(msg, None).await {
                            match encode_line(&reply) {
                                Ok(reply) => {
                                    // The reader waits for room (backpressure on what the upstream
                                    // writes), but at most REPLY_WAIT: an upstream that writes without
                                    // ever reading its stdin would deadlock it. Then the reply (a
                                    // ping's, a refused request's) is dropped, logged.
                                    let sent =
                                        tokio::time::timeout(REPLY_WAIT, out.send(reply)).await;
                                    if !matches!(sent, Ok(Ok(())))
                                        && may_warn(&mut warnings, &core.upstream_id)
                                    {
                                        tracing::warn!(upstream = %core.upstream_id, wait_s = REPLY_WAIT.as_secs(), "the upstream does not read its stdin: a reply to its ping or request is dropped");
                                    }
                                }
                                Err(err) => {
                                    tracing::warn!(upstream = %core.upstream_id, error = %err, "could not encode reply")
                                }
                            }
                        }
                    }
                    Err(err) => {
                        if may_warn(&mut warnings, &core.upstream_id) {
                            let shown = String::from_utf8_lossy(&line[..line.len().min(200)]);
                            tracing::warn!(upstream = %core.upstream_id, error = %err, line = %shown, "skipping non-JSON line from upstream stdout");
                        }
                    }
                }
            }
        }
    };
    if let Some(n) = warnings.summary(tokio::time::Instant::now(), true) {
        tracing::warn!(upstream = %core.upstream_id, skipped = n, "warnings about this upstream's stdout not logged since the last summary; stdout closed");
    }
    core.mark_closed(reason);
}

/// A line buffer that grew past this (a large result) is not kept for the next line: one
/// 16 MiB answer would otherwise hold 16 MiB for the connection's life.
const KEEP_LINE_BUF: usize = 64 * 1024;

fn shrink(buf: &mut Vec<u8>) {
    if buf.capacity() > KEEP_LINE_BUF {
        *buf = Vec::new();
    }
}

/// How much of an over-long line is kept to read its id from.
const LINE_PREFIX_BYTES: usize = 256;

/// The numeric `id` of a JSON-RPC response from the first bytes of its line: the value of a
/// top-level `"id"` key, if it comes before any top-level `"method"` (a request or a
/// notification is not a response) and before the prefix ends. Strings are skipped whole,
/// escapes included, so an `"id"` inside a value is not taken for the key.
fn response_id(prefix: &[u8]) -> Option<u64> {
    let mut depth = 0usize;
    let mut i = 0usize;
    // The last top-level string read, if it may be a key (at depth 1, not after a colon).
    let mut key: Option<&[u8]> = None;
    let mut expect_key = false;
    while i < prefix.len() {
        match prefix[i] {
            b'{' | b'[' => {
                depth += 1;
                expect_key = depth == 1 && prefix[i] == b'{';
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b',' => expect_key = depth == 1,
            b'"' => {
                let start = i + 1;
                i += 1;
                while i < prefix.len() && prefix[i] != b'"' {
                    i += if prefix[i] == b'\\' { 2 } else { 1 };
                }
                if i >= prefix.len() {
                    return None;
                }
                if depth == 1 && expect_key {
                    key = Some(&prefix[start..i]);
                }
                expect_key = false;
            }
            b':' if depth == 1 => match key.take() {
                Some(b"method") => return None,
                Some(b"id") => {
                    let rest = &prefix[i + 1..];
                    let rest = &rest[rest.iter().position(|b| !b.is_ascii_whitespace())?..];
                    let end = rest.iter().position(|b| !b.is_ascii_digit())?;
                    return std::str::from_utf8(&rest[..end]).ok()?.parse().ok();
                }
                _ => {}
            },
            _ => {}
        }
        i += 1;
    }
    None
}

/// Whether one more warning about an upstream's stdout may be logged now (see [`Limiter`]).
fn may_warn(limiter: &mut Limiter, upstream_id: &str) -> bool {
    let now = tokio::time::Instant::now();
    if let Some(n) = limiter.summary(now, false) {
        tracing::warn!(upstream = %upstream_id, skipped = n, "warnings about this upstream's stdout not logged since the last summary");
    }
    if limiter.admit(now) {
        return true;
    }
    if let Refusal::Started = limiter.refuse(now) {
        tracing::warn!(upstream = %upstream_id, "too many warnings about this upstream's stdout: further ones are counted, not logged (a summary every {} s)", SUMMARY_EVERY.as_secs());
    }
    false
}

/// Forwards the child's stderr to the log, a line per line within [`STDERR_LINES_PER_S`] (burst
/// [`STDERR_BURST`]); over it lines are still read (the child never blocks on a full pipe) but
/// not logged: one line says so, and a summary per [`SUMMARY_EVERY`] (or at EOF) counts them.
async fn forward_stderr<R: AsyncBufRead + Unpin>(upstream_id: String, mut stderr: R) {
    let mut buf = Vec::new();
    let mut limiter = Limiter::new(STDERR_LINES_PER_S, STDERR_BURST);
    loop {
        let status = read_line_bounded(&mut stderr, &mut buf, MAX_STDERR_LINE_BYTES).await;
        let now = tokio::time::Instant::now();
        if let Some(n) = limiter.summary(now, false) {
            tracing::warn!(upstream = %upstream_id, skipped = n, "stderr lines not logged since the last summary (over {STDERR_LINES_PER_S}/s)");
        }
        let line = match status {
            Ok(Some(LineStatus::Complete)) => None,
            Ok(Some(LineStatus::TooLong)) => Some(format!(
                "<line longer than {MAX_STDERR_LINE_BYTES} bytes skipped>"
            )),
            Ok(None) | Err(_) => break,
        };
        if !limiter.admit(now) {
            if let Refusal::Started = limiter.refuse(now) {
                tracing::warn!(upstream = %upstream_id, "stderr: over {STDERR_LINES_PER_S} lines/s: further lines are counted, not logged (a summary every {} s)", SUMMARY_EVERY.as_secs());
            }
            continue;
        }
        match line {
            None => {
                let line = String::from_utf8_lossy(&buf);
                tracing::info!(upstream = %upstream_id, "stderr: {}", line.trim_end());
            }
            Some(note) => tracing::info!(upstream = %upstream_id, "stderr: {note}"),
        }
    }
    if let Some(n) = limiter.summary(tokio::time::Instant::now(), true) {
        tracing::warn!(upstream = %upstream_id, skipped = n, "stderr lines not logged since the last summary (over {STDERR_LINES_PER_S}/s); stderr closed");
    }
}

enum LineStatus {
    Complete,
    TooLong,
}

/// Reads one `\n`-terminated line into `buf` (without growing past `max`). Returns `None` at
/// EOF; a final unterminated line is returned as a line.
async fn read_line_bounded<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<LineStatus>> {
    buf.clear();
    let mut too_long = false;
    let mut read_any = false;
    loop {
        let chunk = reader.fill_buf().await?;
        if chunk.is_empty() {
            return Ok(match (read_any, too_long) {
                (false, _) => None,
                (true, true) => Some(LineStatus::TooLong),
                (true, false) => Some(LineStatus::Complete),
            });
        }
        read_any = true;
        let (take, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(newline) => (newline + 1, true),
            None => (chunk.len(), false),
        };
        if !too_long {
            if buf.len() + take > max {
                // Only the line's start is kept (to read a response's id from).
                too_long = true;
                let keep = LINE_PREFIX_BYTES.saturating_sub(buf.len()).min(take);
                buf.extend_from_slice(&chunk[..keep]);
                buf.truncate(LINE_PREFIX_BYTES);
            } else {
                buf.extend_from_slice(&chunk[..take]);
            }
        }
        reader.consume(take);
        if done {
            return Ok(Some(if too_long {
                LineStatus::TooLong
            } else {
                LineStatus::Complete
            }));
        }
    }
}

// Unit tests only (never built into the daemon): an unwrap that fails is the test failing.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bounded_lines() {
        let data: &[u8] = b"short\nthis-is-long\n\nlast";
        let mut reader = BufReader::with_capacity(4, data);
        let mut buf = Vec::new();
        let mut seen = Vec::new();
        while let Some(status) = read_line_bounded(&mut reader, &mut buf, 8).await.unwrap() {
            seen.push(match status {
                LineStatus::Complete => String::from_utf8(buf.clone()).unwrap(),
                LineStatus::TooLong => "<long>".to_owned(),
            });
        }
        assert_eq!(seen, ["short\n", "<long>", "\n", "last"]);
    }

    #[tokio::test]
    async fn an_over_long_line_keeps_its_start_only() {
        let mut line = br#"{"jsonrpc":"2.0","id":42,"result":{"text":""#.to_vec();
        line.extend(std::iter::repeat_n(b'x', 100_000));
        line.extend_from_slice(b"\"}}\nnext\n");
        let mut reader = BufReader::with_capacity(1024, &line[..]);
        let mut buf = Vec::new();
        let status = read_line_bounded(&mut reader, &mut buf, 4096)
            .await
            .unwrap();
        assert!(matches!(status, Some(LineStatus::TooLong)));
        assert_eq!(buf.len(), LINE_PREFIX_BYTES);
        assert_eq!(response_id(&buf), Some(42));
        let status = read_line_bounded(&mut reader, &mut buf, 4096)
            .await
            .unwrap();
        assert!(matches!(status, Some(LineStatus::Complete)));
        assert_eq!(buf, b"next\n");
    }

    #[test]
    fn response_ids_are_read_from_the_top_level_key_only() {
        assert_eq!(
            response_id(br#"{"jsonrpc":"2.0","id":7,"result":{"#),
            Some(7)
        );
        assert_eq!(response_id(br#"{ "id" : 12345 , "result""#), Some(12345));
        assert_eq!(response_id(br#"{"result":{"id":3,"x":1},"id":9,"#), Some(9));
        // A request or a notification is not a response, wherever its id is.
        assert_eq!(response_id(br#"{"method":"x","id":4,"params""#), None);
        // An "id" inside a string, an escaped quote, a string id, a cut prefix.
        assert_eq!(response_id(br#"{"a":"\"id\":5","id":6,"#), Some(6));
        assert_eq!(response_id(br#"{"id":"s-1","result""#), None);
        assert_eq!(response_id(br#"{"jsonrpc":"2.0","id":12"#), None);
        assert_eq!(
            response_id(br#"{"jsonrpc":"2.0","result":{"text":"aaaa"#),
            None
        );
    }
}
