//! The `sqlite` store: one file (bundled SQLite, WAL, `synchronous=FULL`, mode 0600), a
//! versioned schema (`PRAGMA user_version`), and one writer thread that owns the only
//! connection. Writes that arrive together share one transaction and one fsync (group
//! commit): the thread takes every operation queued while the previous commit ran.
//!
//! The connection holds the file's lock for the life of the process (`locking_mode =
//! EXCLUSIVE`), so a second daemon on the same file refuses to start instead of serving the
//! same registrations twice.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, FutureExt};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, TransactionBehavior};
use tokio::sync::{mpsc, oneshot};

use super::types::{Store, StoreError, StoreStats};
use crate::registration::Limits;
use crate::registration::Record;
use crate::registration::Root;
use crate::registration::StoredTool;
use crate::sync::lock;

/// The schema this build writes and reads. A file of a higher version is refused.
pub const SCHEMA_VERSION: i64 = 1;

/// Operations taken into one transaction at most.
const MAX_BATCH: usize = 1024;

const SCHEMA_V1: &str = "
CREATE TABLE registrations (
    id TEXT PRIMARY KEY NOT NULL,
    agent_id TEXT NOT NULL,
    label TEXT,
    token_sha256 BLOB NOT NULL,
    grants TEXT NOT NULL,
    tools TEXT NOT NULL,
    limits TEXT NOT NULL,
    max_calls INTEGER,
    roots TEXT,
    ttl_s INTEGER,
    created_at_ms INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL,
    node TEXT,
    calls_reserved INTEGER NOT NULL DEFAULT 0,
    parent TEXT
) WITHOUT ROWID;
";

enum Op {
    LoadAll(oneshot::Sender<Result<Vec<Record>, StoreError>>),
    Write(Write, oneshot::Sender<Result<u64, StoreError>>),
}

enum Write {
    Create(Box<Record>),
    Renew(String, u64),
    Release(String),
    Reserve(String, u64),
    GiveBack(String, u64),
}

#[derive(Default)]
struct Counters {
    ops: AtomicU64,
    commits: AtomicU64,
}

/// The store; its writer thread ends when the store is closed or dropped.
pub struct SqliteStore {
    path: PathBuf,
    tx: Mutex<Option<mpsc::Sender<Op>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    done: Mutex<Option<oneshot::Receiver<()>>>,
    counters: Arc<Counters>,
}

fn open_err(path: &Path, message: impl std::fmt::Display) -> StoreError {
    StoreError::Open {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

impl SqliteStore {
    /// Opens (or creates, mode 0600) the file, checks it (schema version, `quick_check`) and
    /// starts the writer. A file this build cannot read is refused and left as it is.
    pub fn open(path: &Path, queue: usize) -> Result<SqliteStore, StoreError> {
        let conn = open_connection(path)?;
        let (tx, rx) = mpsc::channel(queue.max(1));
        let (done_tx, done_rx) = oneshot::channel();
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        let thread = std::thread::Builder::new()
            .name("gatehouse-store".into())
            .spawn(move || {
                run(conn, rx, &c);
                let _ = done_tx.send(());
            })
            .map_err(|e| open_err(path, format!("cannot start the writer: {e}")))?;
        Ok(SqliteStore {
            path: path.to_path_buf(),
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            done: Mutex::new(Some(done_rx)),
            counters,
        })
    }

    fn sender(&self) -> Option<mpsc::Sender<Op>> {
        lock(&self.tx).clone()
    }

    fn write(&self, w: Write) -> BoxFuture<'static, Result<u64, StoreError>> {
        let tx = self.sender();
        async move {
            let tx = tx.ok_or(StoreError::Closed)?;
            let (reply, rx) = oneshot::channel();
            tx.send(Op::Write(w, reply))
                .await
                .map_err(|_| StoreError::Closed)?;
            rx.await.map_err(|_| StoreError::Closed)?
        }
        .boxed()
    }
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        lock(&self.tx).take();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

/// Opens and checks the file; no write happens before the checks pass.
fn open_connection(path: &Path) -> Result<Connection, StoreError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.is_file() => return Err(open_err(path, "not a regular file")),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| open_err(path, e))?;
            }
            // Created owner-only before SQLite sees it; its WAL takes the same mode.
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| open_err(path, format!("cannot create: {e}")))?;
        }
        Err(e) => return Err(open_err(path, e)),
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| open_err(path, e))?;
    let bad = |e: rusqlite::Error| {
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) {
            open_err(
                path,
                "in use by another process (another gatehouse on the same store?)",
            )
        } else {
            open_err(
                path,
                format!("not a readable gatehouse store ({e}); it was left as it is"),
            )
        }
    };
    // Held until the process ends: no other process serves these registrations.
    conn.pragma_update(None, "locking_mode", "EXCLUSIVE")
        .map_err(bad)?;
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(bad)?;
    if version > SCHEMA_VERSION {
        return Err(open_err(
            path,
            format!("schema version {version} is newer than this gatehouse reads ({SCHEMA_VERSION}); it was left as it is (run the newer gatehouse, or move the file away)"),
        ));
    }
    let check: String = conn
        .pragma_query_value(None, "quick_check", |r| r.get(0))
        .map_err(bad)?;
    if check != "ok" {
        return Err(open_err(
            path,
            format!("corrupted ({check}); it was left as it is"),
        ));
    }
    if version == 0 {
        let tables: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .map_err(bad)?;
        if tables != 0 {
            return Err(open_err(
                path,
                "has tables but no gatehouse schema version; it was left as it is",
            ));
        }
    }
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
        .map_err(|e| open_err(path, e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(open_err(
            path,
            format!("cannot use WAL (journal_mode {mode})"),
        ));
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|e| open_err(path, e))?;
    // Checkpoints run in the writer thread, inside a commit: fewer of them (every ~16 MB of
    // WAL instead of SQLite's 4 MB) stall fewer commits. The WAL file is reused from its
    // start after each, and cut back to 16 MB.
    conn.pragma_update(None, "wal_autocheckpoint", 4000)
        .map_err(|e| open_err(path, e))?;
    conn.pragma_update(None, "journal_size_limit", 16 * 1024 * 1024)
        .map_err(|e| open_err(path, e))?;
    if version == 0 {
        // Migrations: one step per version, each in its own transaction with its number.
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {SCHEMA_V1} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
        ))
        .map_err(bad)?;
    } else {
        // Takes the exclusive lock now (a second process fails here, not at its first write).
        conn.execute_batch("BEGIN IMMEDIATE; COMMIT;")
            .map_err(bad)?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| open_err(path, e))?;
    Ok(conn)
}

/// The writer: takes what is queued, applies it in one transaction, commits, answers.
fn run(mut conn: Connection, mut rx: mpsc::Receiver<Op>, counters: &Counters) {
    let mut batch: Vec<Op> = Vec::new();
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        counters
            .ops
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        apply_batch(&mut conn, &mut batch, counters);
    }
}

fn failed(e: impl std::fmt::Display) -> StoreError {
    StoreError::Failed(e.to_string())
}

fn apply_batch(conn: &mut Connection, batch: &mut Vec<Op>, counters: &Counters) {
    let tx = match conn.transaction_with_behavior(TransactionBehavior::Immediate) {
        Ok(tx) => tx,
        Err(e) => {
            let e = failed(e);
            for op in batch.drain(..) {
                answer_err(op, e.clone());
            }
            return;
        }
    };
    let mut done: Vec<(Op, Result<u64, StoreError>)> = Vec::with_capacity(batch.len());
    let mut loads = Vec::new();
    for op in batch.drain(..) {
        match op {
            Op::LoadAll(reply) => loads.push((reply, load_all(&tx))),
            Op::Write(w, reply) => {
                let r = apply(&tx, &w).map_err(failed);
                done.push((Op::Write(w, reply), r));
            }
        }
    }
    let committed = tx.commit().map_err(failed);
    if committed.is_ok() {
        counters.commits.fetch_add(1, Ordering::Relaxed);
    }
    for (reply, r) in loads {
        let _ = reply.send(r.map_err(failed));
    }
    for (op, r) in done {
        if let Op::Write(_, reply) = op {
            let _ = reply.send(match &committed {
                Ok(()) => r,
                Err(e) => Err(e.clone()),
            });
        }
    }
}

fn answer_err(op: Op, e: StoreError) {
    match op {
        Op::LoadAll(r) => {
            let _ = r.send(Err(e));
        }
        Op::Write(_, r) => {
            let _ = r.send(Err(e));
        }
    }
}

fn json<T: serde::Serialize>(v: &T) -> rusqlite::Result<String> {
    serde_json::to_string(v).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn apply(tx: &rusqlite::Transaction<'_>, w: &Write) -> rusqlite::Result<u64> {
    match w {
        Write::Create(r) => {
            let roots = r.roots.as_ref().map(json).transpose()?;
            tx.prepare_cached(
                "INSERT INTO registrations (id, agent_id, label, token_sha256, grants, tools, \
                 limits, max_calls, roots, ttl_s, created_at_ms, expires_at_ms, node, calls_reserved, \
                 parent) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
            )?
            .execute(params![
                r.id,
                r.agent_id,
                r.label,
                &r.token_sha256[..],
                json(&r.grants)?,
                json(&r.tools)?,
                json(&r.limits)?,
                r.limits.max_calls.map(i64_of),
                roots,
                r.ttl_s.map(i64_of),
                r.created_at_ms,
                i64_of(r.expires_at_ms),
                r.node,
                i64_of(r.calls_reserved),
                r.parent,
            ])?;
            Ok(1)
        }
        Write::Renew(id, expires) => Ok(tx
            .prepare_cached("UPDATE registrations SET expires_at_ms = ?2 WHERE id = ?1")?
            .execute(params![id, i64_of(*expires)])? as u64),
        Write::Release(id) => Ok(tx
            .prepare_cached("DELETE FROM registrations WHERE id = ?1")?
            .execute(params![id])? as u64),
        Write::Reserve(id, want) => {
            let row: Option<(i64, Option<i64>)> = tx
                .prepare_cached("SELECT calls_reserved, max_calls FROM registrations WHERE id = ?1")?
                .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            let Some((reserved, max)) = row else {
                return Ok(0);
            };
            let reserved = u64::try_from(reserved).unwrap_or(0);
            let left = max.map_or(*want, |m| u64::try_from(m).unwrap_or(0).saturating_sub(reserved));
            let got = (*want).min(left);
            if got > 0 {
                // Compare-and-set: only from the value just read.
                let n = tx
                    .prepare_cached(
                        "UPDATE registrations SET calls_reserved = ?3 WHERE id = ?1 AND calls_reserved = ?2",
                    )?
                    .execute(params![id, i64_of(reserved), i64_of(reserved + got)])?;
                if n != 1 {
                    return Ok(0);
                }
            }
            Ok(got)
        }
        Write::GiveBack(id, unused) => Ok(tx
            .prepare_cached(
                "UPDATE registrations SET calls_reserved = MAX(0, calls_reserved - ?2) WHERE id = ?1",
            )?
            .execute(params![id, i64_of(*unused)])? as u64),
    }
}

fn from_json<T: serde::de::DeserializeOwned>(col: usize, s: &str) -> rusqlite::Result<T> {
    serde_json::from_str(s).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(col, rusqlite::types::Type::Text, Box::new(e))
    })
}

fn load_all(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<Vec<Record>> {
    let mut stmt = tx.prepare(
        "SELECT id, agent_id, label, token_sha256, grants, tools, limits, roots, ttl_s, \
         created_at_ms, expires_at_ms, node, calls_reserved, parent FROM registrations \
         ORDER BY created_at_ms, id",
    )?;
    let rows = stmt.query_map([], |r| {
        let digest: Vec<u8> = r.get(3)?;
        let token_sha256: [u8; 32] = digest.as_slice().try_into().map_err(|_| {
            rusqlite::Error::FromSqlConversionFailure(
                3,
                rusqlite::types::Type::Blob,
                "token digest is not 32 bytes".into(),
            )
        })?;
        let grants: String = r.get(4)?;
        let tools: String = r.get(5)?;
        let limits: String = r.get(6)?;
        let roots: Option<String> = r.get(7)?;
        let ttl: Option<i64> = r.get(8)?;
        let expires: i64 = r.get(10)?;
        let reserved: i64 = r.get(12)?;
        Ok(Record {
            id: r.get(0)?,
            agent_id: r.get(1)?,
            label: r.get(2)?,
            token_sha256,
            grants: from_json::<Vec<String>>(4, &grants)?,
            tools: from_json::<Vec<StoredTool>>(5, &tools)?,
            limits: from_json::<Limits>(6, &limits)?,
            roots: roots.map(|s| from_json::<Vec<Root>>(7, &s)).transpose()?,
            ttl_s: ttl.and_then(|t| u64::try_from(t).ok()),
            created_at_ms: r.get(9)?,
            expires_at_ms: u64::try_from(expires).unwrap_or(0),
            node: r.get(11)?,
            calls_reserved: u64::try_from(reserved).unwrap_or(0),
            parent: r.get(13)?,
        })
    })?;
    rows.collect()
}

impl Store for SqliteStore {
    fn kind(&self) -> crate::store::StoreKind {
        crate::store::StoreKind::Sqlite
    }

    fn path(&self) -> Option<&Path> {
        Some(&self.path)
    }

    fn load_all(&self) -> BoxFuture<'_, Result<Vec<Record>, StoreError>> {
        let tx = self.sender();
        async move {
            let tx = tx.ok_or(StoreError::Closed)?;
            let (reply, rx) = oneshot::channel();
            tx.send(Op::LoadAll(reply))
                .await
                .map_err(|_| StoreError::Closed)?;
            rx.await.map_err(|_| StoreError::Closed)?
        }
        .boxed()
    }

    fn create(&self, reg: Record) -> BoxFuture<'_, Result<(), StoreError>> {
        self.write(Write::Create(Box::new(reg)))
            .map(|r| r.map(|_| ()))
            .boxed()
    }

    fn renew(&self, id: &str, expires_at_ms: u64) -> BoxFuture<'_, Result<bool, StoreError>> {
        self.write(Write::Renew(id.to_string(), expires_at_ms))
            .map(|r| r.map(|n| n > 0))
            .boxed()
    }

    fn release(&self, id: &str) -> BoxFuture<'_, Result<bool, StoreError>> {
        self.write(Write::Release(id.to_string()))
            .map(|r| r.map(|n| n > 0))
            .boxed()
    }

    fn reserve(&self, id: &str, want: u64) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.write(Write::Reserve(id.to_string(), want))
    }

    fn give_back(&self, id: &str, unused: u64) -> BoxFuture<'_, Result<(), StoreError>> {
        self.write(Write::GiveBack(id.to_string(), unused))
            .map(|r| r.map(|_| ()))
            .boxed()
    }

    fn stats(&self) -> StoreStats {
        StoreStats {
            ops: self.counters.ops.load(Ordering::Relaxed),
            commits: self.counters.commits.load(Ordering::Relaxed),
        }
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        lock(&self.tx).take();
        let done = lock(&self.done).take();
        async move {
            if let Some(done) = done {
                let _ = done.await;
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(id: &str, max_calls: Option<u64>) -> Record {
        Record {
            id: id.into(),
            agent_id: "agent".into(),
            label: Some("l".into()),
            token_sha256: [7; 32],
            grants: vec!["demo.*".into()],
            tools: vec![StoredTool {
                name: "demo.echo".into(),
                upstream: None,
                tool: None,
                grant_name: None,
                descriptor: None,
            }],
            limits: Limits {
                max_calls,
                ..Default::default()
            },
            roots: Some(vec![Root::new("file:///w")]),
            ttl_s: Some(60),
            created_at_ms: 1,
            expires_at_ms: 123,
            node: None,
            calls_reserved: max_calls.map_or(0, |m| m.min(4)),
            parent: Some("p".into()),
        }
    }

    #[tokio::test]
    async fn store_round_trips_and_reserves_within_the_budget() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("s.sqlite");
        let s = SqliteStore::open(&path, 64).unwrap_or_else(|e| panic!("{e}"));
        let a = reg("a", Some(10));
        s.create(a.clone()).await.unwrap_or_else(|e| panic!("{e}"));
        s.create(reg("b", None))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.reserve("a", 4).await.ok(), Some(4));
        assert_eq!(s.reserve("a", 4).await.ok(), Some(2));
        assert_eq!(s.reserve("a", 4).await.ok(), Some(0));
        assert_eq!(s.give_back("a", 3).await.ok(), Some(()));
        assert_eq!(s.renew("a", 999).await.ok(), Some(true));
        assert_eq!(s.release("b").await.ok(), Some(true));
        assert_eq!(s.release("b").await.ok(), Some(false));
        s.close().await;
        drop(s);
        let s = SqliteStore::open(&path, 64).unwrap_or_else(|e| panic!("{e}"));
        let all = s.load_all().await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(all.len(), 1);
        assert_eq!(
            all[0],
            Record {
                expires_at_ms: 999,
                calls_reserved: 7,
                ..a
            }
        );
        assert!(s.stats().commits >= 1);
    }

    #[tokio::test]
    async fn concurrent_writes_share_commits() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let s = Arc::new(
            SqliteStore::open(&dir.path().join("s.sqlite"), 1024).unwrap_or_else(|e| panic!("{e}")),
        );
        let mut tasks = Vec::new();
        for i in 0..200 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                s.create(reg(&format!("r{i}"), None)).await
            }));
        }
        for t in tasks {
            assert!(matches!(t.await, Ok(Ok(()))));
        }
        let st = s.stats();
        assert_eq!(st.ops, 200);
        assert!(st.commits < 200, "{st:?}");
    }

    #[test]
    fn a_second_opener_and_a_newer_schema_are_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("s.sqlite");
        let s = SqliteStore::open(&path, 16).unwrap_or_else(|e| panic!("{e}"));
        let second = SqliteStore::open(&path, 16).err().map(|e| e.to_string());
        assert!(
            second.as_deref().is_some_and(|m| m.contains("s.sqlite")),
            "{second:?}"
        );
        drop(s);
        {
            let c = Connection::open(&path).unwrap_or_else(|e| panic!("{e}"));
            c.pragma_update(None, "user_version", 99)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let before = std::fs::read(&path).unwrap_or_else(|e| panic!("{e}"));
        let e = SqliteStore::open(&path, 16).err().map(|e| e.to_string());
        assert!(
            e.as_deref()
                .is_some_and(|m| m.contains("schema version 99")),
            "{e:?}"
        );
        assert_eq!(std::fs::read(&path).ok(), Some(before));
    }
}
