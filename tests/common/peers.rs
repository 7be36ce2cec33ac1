//! The Python peers' `--batch` mode (tests/peers/py_client.py, mcp1_client.py,
//! fastmcp_client.py): several client cells in one interpreter, one result per cell.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

/// A file under tests/peers; a missing one fails the test (run tests/peers/setup.sh).
pub fn peer(rel: &str) -> PathBuf {
    let p = super::repo_root().join("tests/peers").join(rel);
    assert!(
        p.exists(),
        "{} is missing: run tests/peers/setup.sh",
        p.display()
    );
    p
}

/// The Python of the peers' main environment (tests/peers/.venv: the official SDK, fastmcp's
/// client); a missing one fails the test.
pub fn python() -> PathBuf {
    peer(".venv/bin/python")
}

/// `VENV/bin/python SCRIPT --batch CELLS`: each cell's `{"ok": …}` or `{"error": …}` (with
/// `"requests"`, the [method, path] of every HTTP request the client made in it).
pub async fn batch(venv: &str, script: &str, cells: &Value) -> Vec<Value> {
    let out = tokio::time::timeout(
        Duration::from_secs(180),
        tokio::process::Command::new(peer(&format!("{venv}/bin/python")))
            .arg(peer(script))
            .args(["--batch", &cells.to_string()])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{script} --batch finishes"))
    .unwrap();
    assert!(
        out.status.success(),
        "{script} --batch failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{script}: {e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    v.as_array().unwrap().clone()
}

/// The `ok` of a cell, or a panic naming the cell and its error.
pub fn ok<'a>(what: &str, cell: &'a Value) -> &'a Value {
    cell.get("ok")
        .unwrap_or_else(|| panic!("{what}: the cell failed: {cell}"))
}

/// The text blocks of a batch step's call result, joined.
pub fn step_text(step: &Value) -> String {
    step["ok"]["call"]["content"]
        .as_array()
        .map(|blocks| {
            blocks
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_else(|| panic!("no call result: {step}"))
}
