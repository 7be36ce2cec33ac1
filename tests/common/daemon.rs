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
    /// `GATEHOUSE_TEST_MARKER`, in the environment of the daemon and every process it starts.
    marker: String,
    wrap: Option<String>,
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
        Daemon::start_wrapped(extra, audit_extra, log, env, None)
    }

    /// As [`Daemon::start`], the daemon exec'ed by `sh -c "WRAP && exec gatehouse …"` when
    /// `wrap` is given (a shell snippet such as a `ulimit`; the child's pid stays the
    /// daemon's).
    pub fn start_wrapped(
        extra: &str,
        audit_extra: &str,
        log: &str,
        env: &[(&str, &str)],
        wrap: Option<&str>,
    ) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("gatehouse.toml");
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        std::fs::write(&config, config_text(dir.path(), extra, audit_extra)).unwrap();
        let marker = gatehouse::testing::registry::new_registration_id();
        let wrap = wrap.map(str::to_string);
        let (child, output, data, admin) = spawn(dir.path(), log, &env, &marker, wrap.as_deref());
        let token = admin_token(dir.path(), &env);
        Daemon {
            child,
            dir,
            log: log.to_string(),
            env,
            data,
            admin,
            token,
            output,
            marker,
            wrap,
        }
    }

    /// Kills the daemon with SIGKILL and starts it again on the same directory, config and
    /// store (its listeners on new ports).
    pub fn kill9_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let (child, output, data, admin) = spawn(
            self.dir.path(),
            &self.log,
            &self.env,
            &self.marker,
            self.wrap.as_deref(),
        );
        (self.child, self.output, self.data, self.admin) = (child, output, data, admin);
        self.token = admin_token(self.dir.path(), &self.env);
    }
}

/// The daemon's admin token: `GATEHOUSE_ADMIN_TOKEN` when the test gave it (several nodes
/// sharing one), else the file the daemon wrote.
fn admin_token(dir: &Path, env: &[(String, String)]) -> String {
    match env.iter().find(|(k, _)| k == "GATEHOUSE_ADMIN_TOKEN") {
        Some((_, v)) => v.clone(),
        None => std::fs::read_to_string(dir.join("admin.token"))
            .unwrap()
            .trim()
            .to_string(),
    }
}

/// A `gatehouse serve --test-tools --config <config>` command with the `GATEHOUSE_*`
/// variables the tests set for themselves removed, `RUST_LOG=log`, stdin and stdout closed.
pub fn serve_command(config: &Path, log: &str) -> Command {
    with_serve_args(Command::new(env!("CARGO_BIN_EXE_gatehouse")), config, log)
}

/// The defaults every test daemon's config starts from: both listeners on 127.0.0.1:0, the
/// admin token file, audit log in `dir` (no fsync), `extra` at the top level and
/// `audit_extra` in the `[audit]` table. The one place they are written.
pub fn config_text(dir: &Path, extra: &str, audit_extra: &str) -> String {
    format!(
        "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nadmin_token_file = {:?}\n{extra}\n[audit]\npath = {:?}\nfsync = \"never\"\n{audit_extra}\n",
        dir.join("admin.token").display().to_string(),
        dir.join("audit.jsonl").display().to_string(),
    )
}

fn with_serve_args(mut cmd: Command, config: &Path, log: &str) -> Command {
    cmd.args(["serve", "--test-tools", "--config"])
        .arg(config)
        .env_remove("GATEHOUSE_ADMIN_TOKEN")
        .env_remove("GATEHOUSE_LISTEN")
        .env_remove("GATEHOUSE_ADMIN_LISTEN")
        .env_remove("GATEHOUSE_AUDIT_PATH")
        .env_remove("GATEHOUSE_LOG_FORMAT")
        .env_remove("GATEHOUSE_STORE")
        .env_remove("GATEHOUSE_NODE_ID")
        .env_remove("NO_COLOR")
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

fn spawn(
    dir: &Path,
    log: &str,
    env: &[(String, String)],
    marker: &str,
    wrap: Option<&str>,
) -> Spawned {
    let mut cmd = match wrap {
        None => serve_command(&dir.join("gatehouse.toml"), log),
        Some(snippet) => {
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg(format!("{snippet} && exec \"$0\" \"$@\""))
                .arg(env!("CARGO_BIN_EXE_gatehouse"));
            with_serve_args(c, &dir.join("gatehouse.toml"), log)
        }
    };
    cmd.current_dir(dir).env("GATEHOUSE_TEST_MARKER", marker);
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
        let text = r.text().await.unwrap();
        if text.is_empty() {
            return (s, Value::Null);
        }
        (
            s,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
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

impl Daemon {
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("gatehouse.toml")
    }

    /// The stderr so far, one string.
    pub fn stderr(&self) -> String {
        self.log_lines().join("\n")
    }

    /// Runs a CLI verb against this daemon (admin URL from the environment, the token from
    /// the config's token file).
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_gatehouse"))
            .args(args)
            .arg("--config")
            .arg(self.config_path())
            .env("GATEHOUSE_ADMIN_URL", &self.admin)
            .env_remove("GATEHOUSE_ADMIN_TOKEN")
            .output()
            .unwrap()
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, sig).unwrap();
    }

    /// Waits for the exit (`limit` at most): (exit code, seconds taken).
    pub fn wait_exit(&mut self, limit: Duration) -> (Option<i32>, f64) {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return (st.code(), t0.elapsed().as_secs_f64());
            }
            assert!(t0.elapsed() < limit, "daemon still running after {limit:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Processes (other than the test) whose environment carries this daemon's
    /// `GATEHOUSE_TEST_MARKER`: the daemon and everything it started.
    pub fn marked_processes(&self) -> Vec<u32> {
        let needle = format!("GATEHOUSE_TEST_MARKER={}", self.marker);
        let mut found = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if let Ok(env) = std::fs::read(e.path().join("environ")) {
                if env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
                    found.push(pid);
                }
            }
        }
        found
    }

    /// Waits (5 s at most) until the registration reports `n` calls in flight.
    pub async fn wait_in_flight(&self, id: &str, n: u64) {
        for _ in 0..200 {
            let (_, v) = self
                .admin_call(
                    reqwest::Method::GET,
                    &format!("/v1/registrations/{id}"),
                    None,
                )
                .await;
            if v["calls_in_flight"] == serde_json::json!(n) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("registration {id} never had {n} calls in flight");
    }
}
