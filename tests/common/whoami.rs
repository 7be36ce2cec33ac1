//! The HTTPS MCP upstream that echoes its caller's Authorization (issue 47,
//! tests/fixtures/whoami_https_server.py), shared by tests/credentials.rs and tests/cluster.rs.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use super::repo_root;

/// The HTTPS upstream; killed on drop.
pub struct Whoami {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub url: String,
    pub ca: PathBuf,
}

impl Drop for Whoami {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Whoami {
    pub fn start() -> Whoami {
        Whoami::start_with(&[])
    }

    pub fn start_with(args: &[&str]) -> Whoami {
        let py = repo_root().join("tests/peers/.venv/bin/python");
        assert!(
            py.exists(),
            "tests/peers/.venv is missing: run `bash tests/peers/setup.sh`"
        );
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(py)
            .arg(repo_root().join("tests/fixtures/whoami_https_server.py"))
            .arg(dir.path())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let v: Value = serde_json::from_str(&line).expect("the whoami upstream did not start");
        Whoami {
            url: format!("https://127.0.0.1:{}/mcp", v["listening"]),
            ca: PathBuf::from(v["ca"].as_str().unwrap()),
            child,
            dir,
        }
    }

    /// Every request the upstream received, as it logged them.
    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("requests.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The daemon config: `who` over HTTPS (shared: one connection for every registration
    /// without credentials of its own; a configured header, so `upstream_auth` is `static`
    /// without one), and the stdio demo upstream `desk`.
    pub fn config(&self) -> String {
        format!(
            "[[upstreams]]\nid = \"who\"\nurl = {:?}\ntls_ca_file = {:?}\nsharing = \"shared\"\nheaders = {{ \"X-Static-Key\" = \"static-value\" }}\n\n[[upstreams]]\nid = \"desk\"\ncommand = {:?}\nargs = [\"demo-upstream\"]\n",
            self.url,
            self.ca.display().to_string(),
            env!("CARGO_BIN_EXE_gatehouse"),
        )
    }
}
