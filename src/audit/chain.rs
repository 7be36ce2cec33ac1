//! The hash chain: argument digests, the line hash each record's `prev` names, the chain's
//! head sidecar (`<path>.head`, rewritten in place), and the tail a writer continues from.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::files::{segments, OWNER_ONLY};
use super::record::Record;

/// SHA-256 (hex) of a JSON value's compact serialization: the argument digest.
pub fn digest_value(v: &Value) -> String {
    args_digest(v).as_str().to_owned()
}

/// [`digest_value`] without allocating: the hex held in place (a call's record borrows it).
pub fn args_digest(v: &Value) -> HexDigest {
    // The same compact bytes as `to_string`, fed to the hash as they are written (no
    // intermediate buffer). Serializing a `Value` cannot fail (map keys are strings).
    let mut h = HashWriter(Sha256::new());
    let _ = serde_json::to_writer(&mut h, v);
    HexDigest(hex_digest(&h.0.finalize()))
}

/// The lowercase hex of a SHA-256 digest (64 ASCII bytes).
pub struct HexDigest([u8; 64]);

impl HexDigest {
    pub fn as_str(&self) -> &str {
        // `hex_digest` writes ASCII only (`hex::encode` builds its `String` char by char).
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// An `io::Write` that feeds a SHA-256.
struct HashWriter(Sha256);

impl Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The hash that links a line to the next record's `prev`.
pub fn line_hash(line: &str) -> String {
    hex::encode(Sha256::digest(line.as_bytes()))
}

/// Lowercase hex of a SHA-256 digest, without allocating.
pub(super) fn hex_digest(d: &[u8]) -> [u8; 64] {
    let mut out = [0u8; 64];
    // A SHA-256 digest is 32 bytes, exactly half the buffer: this cannot fail.
    let _ = hex::encode_to_slice(d, &mut out);
    out
}

/// The genesis `prev` value of a new chain.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The chain head sidecar of an audit file: `<path>.head`.
pub fn head_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".head");
    PathBuf::from(s)
}

/// The `(seq, hash)` of the last record written, as kept in the head sidecar.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    pub seq: u64,
    pub hash: String,
}

/// Reads the head sidecar of `path` (`Ok(None)` when there is none).
pub fn read_head(path: &Path) -> std::io::Result<Option<Head>> {
    match std::fs::read_to_string(head_path(path)) {
        // Created by a writer that has not written a record yet.
        Ok(s) if s.trim().is_empty() => Ok(None),
        Ok(s) => serde_json::from_str(s.trim())
            .map(Some)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Width of the head sidecar: its JSON padded with spaces, then a newline. Written in place
/// at offset 0 (one `pwrite` of one sector) so that updating it after every batch costs no
/// file creation, rename or writeback; `seq` only grows, so the JSON never outgrows it.
const HEAD_WIDTH: usize = 128;

/// The head sidecar's bytes: `{"seq":…,"hash":"…"}`, space-padded to `HEAD_WIDTH`.
fn head_bytes(head: &Head) -> std::io::Result<Vec<u8>> {
    let mut body = serde_json::to_vec(head)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    if body.len() >= HEAD_WIDTH {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "head record too long",
        ));
    }
    body.resize(HEAD_WIDTH - 1, b' ');
    body.push(b'\n');
    Ok(body)
}

/// Opens the head sidecar for in-place updates (created if absent, never truncated: until
/// the first update it keeps the head that was there).
/// A longer leftover (an older format) is cut to the width.
pub(super) fn open_head(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(OWNER_ONLY)
        .open(head_path(path))?;
    if f.metadata()?.len() > HEAD_WIDTH as u64 {
        f.set_len(HEAD_WIDTH as u64)?;
    }
    Ok(f)
}

/// Writes the head in place.
pub(super) fn write_head_at(f: &File, head: &Head) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    f.write_all_at(&head_bytes(head)?, 0)
}

/// The (seq, hash) of the last complete record of a chain (the file, or if it holds no
/// record yet, its newest rotated segment), to continue it.
pub fn chain_tail(path: &Path) -> std::io::Result<(u64, String)> {
    if let Some(t) = file_tail(path)? {
        return Ok(t);
    }
    for seg in segments(path)?.iter().rev() {
        if let Some(t) = file_tail(seg)? {
            return Ok(t);
        }
    }
    Ok((0, GENESIS.into()))
}

fn file_tail(path: &Path) -> std::io::Result<Option<(u64, String)>> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if !f.metadata()?.is_file() {
        // A device or pipe (e.g. /dev/full in tests): nothing to continue.
        return Ok(None);
    }
    let mut last: Option<(u64, String)> = None;
    for line in BufReader::new(f).lines() {
        let line = line?;
        if let Ok(r) = serde_json::from_str::<Record>(&line) {
            last = Some((r.seq, line_hash(&line)));
        }
    }
    Ok(last)
}

// Unit tests only (never built into the daemon): an unwrap that fails is the test failing.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn head_is_rewritten_in_place_and_a_longer_old_head_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.jsonl");
        // An older, longer sidecar (e.g. written by a previous version with extra spacing).
        std::fs::write(head_path(&path), format!("{}\n", " ".repeat(300))).unwrap();
        let f = open_head(&path).unwrap();
        for seq in [1u64, 10, 1_000_000_000_000] {
            let head = Head {
                seq,
                hash: line_hash(&seq.to_string()),
            };
            write_head_at(&f, &head).unwrap();
            assert_eq!(read_head(&path).unwrap(), Some(head));
            assert_eq!(
                std::fs::metadata(head_path(&path)).unwrap().len(),
                HEAD_WIDTH as u64
            );
        }
        // The largest possible head still fits.
        let max = Head {
            seq: u64::MAX,
            hash: "f".repeat(64),
        };
        assert!(head_bytes(&max).is_ok());
    }
}
