//! A real `gatehouse serve` on 127.0.0.1:0 (both listeners), its stderr kept line by line,
//! its config, admin token file and audit log in a temporary directory; killed on `Drop`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gatehouse::testing::audit::{read_records, Record};
use serde_json::Value;

pub struct Daemon {
    pub child: Child,
    pub dir: tempfile::TempDir,
    log: String,
    env: Vec<(String, String)>,
    pub data: String,
    pub admin: String,
    /// The admin token.
    pub token: String,
    output: Arc<Mutex<Vec<String>>>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Daemon {
    /// Starts `gatehouse serve --test-tools` with `extra` written at the top of its config
    /// (before its `[audit]` table; `audit_extra` goes into that table), `RUST_LOG` set to
    /// `log`, and `env` added. Waits for `gatehouse: ready` (30 s at most).
    pub fn start(extra: &str, audit_extra: &str, log: &str, env: &[(&str, &str)]) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("gatehouse.toml");
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nadmin_token_file = {:?}\n{extra}\n[audit]\npath = {:?}\nfsync = \"never\"\n{audit_extra}\n",
                dir.path().join("admin.token").display().to_string(),
                dir.path().join("audit.jsonl").display().to_string(),
            ),
        )
        .unwrap();
        let (child, output, data, admin) = spawn(dir.path(), log, &env);
        let token = std::fs::read_to_string(dir.path().join("admin.token"))
            .unwrap()
            .trim()
            .to_string();
        Daemon {
            child,
            dir,
            log: log.to_string(),
            env,
            data,
            admin,
            token,
            output,
        }
    }

    /// Kills the daemon with SIGKILL and starts it again on the same directory, config and
    /// store (its listeners on new ports).
    pub fn kill9_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let (child, output, data, admin) = spawn(self.dir.path(), &self.log, &self.env);
        (self.child, self.output, self.data, self.admin) = (child, output, data, admin);
        self.token = std::fs::read_to_string(self.dir.path().join("admin.token"))
            .unwrap()
            .trim()
            .to_string();
    }
}

/// A `gatehouse serve --test-tools --config <config>` command with the `GATEHOUSE_*`
/// variables the tests set for themselves removed, `RUST_LOG=log`, stdin and stdout closed.
pub fn serve_command(config: &Path, log: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gatehouse"));
    cmd.args(["serve", "--test-tools", "--config"])
        .arg(config)
        .env_remove("GATEHOUSE_ADMIN_TOKEN")
        .env_remove("GATEHOUSE_LISTEN")
        .env_remove("GATEHOUSE_ADMIN_LISTEN")
        .env_remove("GATEHOUSE_AUDIT_PATH")
        .env_remove("GATEHOUSE_LOG_FORMAT")
        .env_remove("GATEHOUSE_STORE")
        .env("RUST_LOG", log)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    cmd
}

/// A started daemon: its process, its stderr lines as they come, its data and admin URLs.
pub type Spawned = (Child, Arc<Mutex<Vec<String>>>, String, String);

/// Spawns `cmd` (a `gatehouse serve`) with stderr piped, keeps every stderr line, and waits
/// for `gatehouse: ready` (30 s at most).
pub fn spawn_ready(mut cmd: Command) -> Spawned {
    let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap();
    let output = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let out = output.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            out.lock().unwrap().push(line.clone());
            let _ = tx.send(line);
        }
    });
    let (data, admin) = super::wait_daemon_ready(&rx);
    (child, output, data, admin)
}

fn spawn(dir: &Path, log: &str, env: &[(String, String)]) -> Spawned {
    let mut cmd = serve_command(&dir.join("gatehouse.toml"), log);
    cmd.current_dir(dir);
    for (k, v) in env {
        cmd.env(k, v);
    }
    spawn_ready(cmd)
}

impl Daemon {
    pub fn audit_path(&self) -> PathBuf {
        self.dir.path().join("audit.jsonl")
    }

    /// Every audit record written so far.
    pub fn audit(&self) -> Vec<Record<'static>> {
        read_records(&self.audit_path()).unwrap_or_default()
    }

    /// The stderr lines so far.
    pub fn log_lines(&self) -> Vec<String> {
        self.output.lock().unwrap().clone()
    }

    /// An admin API call with the admin token: (status, JSON body or Null).
    pub async fn admin_call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut b = super::http()
            .request(method, format!("{}{path}", self.admin))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            b = b.json(&body);
        }
        let r = b.send().await.unwrap();
        let s = r.status().as_u16();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    /// `POST /v1/registrations` (201 asserted): the admin API's answer.
    pub async fn register(&self, body: Value) -> Value {
        let (s, v) = self
            .admin_call(reqwest::Method::POST, "/v1/registrations", Some(body))
            .await;
        assert_eq!(s, 201, "{v}");
        v
    }

    /// `GET /metrics`, as text.
    pub async fn metrics(&self) -> String {
        super::http()
            .get(format!("{}/metrics", self.admin))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Waits (`secs` at most) until `f` holds of the audit records.
    pub async fn wait_audit(&self, secs: u64, f: impl Fn(&[Record<'static>]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if f(&self.audit()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "audit condition not met in {secs} s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
