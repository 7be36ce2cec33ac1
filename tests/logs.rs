//! The daemon's log as a collector reads it: `gatehouse serve` with stderr sent to a file
//! (not a terminal) writes plain text with no ANSI colour; `log_format = "json"` or
//! `GATEHOUSE_LOG_FORMAT=json` gives one JSON object per line, its own start-up and
//! shutdown lines included; on a terminal (a pty, through `script`) text is coloured unless
//! `NO_COLOR` is set; an unknown format is refused, naming the variable.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

/// A daemon whose stderr goes to `log` (a plain file).
struct LogDaemon {
    child: Child,
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl Drop for LogDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The common test config (tests/common/daemon.rs) with `extra`, written into `dir`.
fn write_config(dir: &Path, extra: &str) -> PathBuf {
    let config = dir.join("gatehouse.toml");
    std::fs::write(&config, common::daemon::config_text(dir, extra, "")).unwrap();
    config
}

/// The common `gatehouse serve` command (tests/common/daemon.rs), stderr to `stderr`.
fn serve(dir: &Path, config: &Path, env: &[(&str, &str)], stderr: Stdio) -> Child {
    let mut cmd = common::daemon::serve_command(config, "info");
    cmd.current_dir(dir).stderr(stderr);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

impl LogDaemon {
    fn start(extra: &str, env: &[(&str, &str)]) -> LogDaemon {
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(dir.path(), extra);
        let log = dir.path().join("gatehouse.log");
        let file = std::fs::File::create(&log).unwrap();
        let child = serve(dir.path(), &config, env, Stdio::from(file));
        LogDaemon { child, dir, log }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap()).into_owned()
    }

    /// Waits (30 s at most) until the log holds a line for which `f` says yes.
    fn wait_for(&self, what: &str, f: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(l) = self.text().lines().find(|l| f(l)) {
                return l.to_string();
            }
            assert!(
                Instant::now() < deadline,
                "no {what} in the log:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn token(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("admin.token"))
            .unwrap()
            .trim()
            .to_string()
    }

    /// SIGTERM, then the exit (bounded).
    fn stop(&mut self) {
        kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the daemon did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Registers, calls nothing, releases: the `registered` and `released` lines appear.
async fn traffic(admin: &str, token: &str) -> String {
    let resp = http()
        .post(format!("{admin}/v1/registrations"))
        .bearer_auth(token)
        .json(&json!({"agent_id": "log-bot", "tools": ["demo.*"], "label": "run-7"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let v: Value = resp.json().await.unwrap();
    let id = v["id"].as_str().unwrap().to_string();
    let reg_token = v["token"].as_str().unwrap().to_string();
    let resp = http()
        .delete(format!("{admin}/v1/registrations/{id}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    reg_token
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_file_gets_plain_text_without_colour_codes() {
    let mut d = LogDaemon::start("", &[]);
    let admin = d.wait_for("admin listener line", |l| {
        l.starts_with("gatehouse: admin listener on ")
    });
    let admin = admin
        .trim_start_matches("gatehouse: admin listener on ")
        .to_string();
    d.wait_for("ready line", |l| l == "gatehouse: ready");
    let reg_token = traffic(&admin, &d.token()).await;
    d.wait_for("released line", |l| l.contains("released"));
    d.stop();
    let text = d.text();
    assert!(text.contains("registered"), "{text}");
    assert!(text.contains("log-bot"), "{text}");
    assert!(text.contains("gatehouse: stopped"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "a log file must carry no ANSI escape:\n{text:?}"
    );
    assert!(!text.contains(&reg_token), "a token reached the log");
    assert!(
        !text.contains(&d.token()),
        "the admin token reached the log"
    );
}

/// Every line of a JSON log: an object with a timestamp, a level, a message and a target.
fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {l:?}"));
            assert!(v.is_object(), "{l}");
            assert!(v["timestamp"].is_string(), "no timestamp: {l}");
            assert!(v["level"].is_string(), "no level: {l}");
            assert!(v["fields"]["message"].is_string(), "no message: {l}");
            assert!(v["target"].is_string(), "no target: {l}");
            v
        })
        .collect()
}

async fn json_log_holds_every_line(d: &mut LogDaemon) {
    let admin = d.wait_for("admin listener line", |l| {
        l.contains("\"admin listener on ")
    });
    let admin: Value = serde_json::from_str(&admin).unwrap();
    let admin = admin["fields"]["message"]
        .as_str()
        .unwrap()
        .trim_start_matches("admin listener on ")
        .to_string();
    d.wait_for("ready line", |l| l.contains("\"message\":\"ready\""));
    let reg_token = traffic(&admin, &d.token()).await;
    d.wait_for("released line", |l| l.contains("released"));
    d.stop();
    let text = d.text();
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert!(!text.contains(&reg_token), "a token reached the log");
    let lines = json_lines(&text);
    let message = |m: &str| {
        lines
            .iter()
            .find(|v| v["fields"]["message"] == json!(m))
            .unwrap_or_else(|| panic!("no {m:?} line in {text}"))
            .clone()
    };
    assert_eq!(message("ready")["level"], "INFO");
    assert_eq!(message("stopped")["target"], "gatehouse");
    // An event's fields are JSON fields, not text to parse.
    let registered = message("registered");
    assert_eq!(registered["fields"]["agent_id"], "log-bot", "{registered}");
    assert_eq!(registered["fields"]["tools"], 3, "{registered}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_format_json_in_the_config_gives_one_object_per_line() {
    let mut d = LogDaemon::start("log_format = \"json\"", &[]);
    json_log_holds_every_line(&mut d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gatehouse_log_format_overrides_the_config() {
    let mut d = LogDaemon::start("log_format = \"text\"", &[("GATEHOUSE_LOG_FORMAT", "json")]);
    json_log_holds_every_line(&mut d).await;
}

#[test]
fn an_unknown_log_format_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let out = Command::new(env!("CARGO_BIN_EXE_gatehouse"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("GATEHOUSE_LOG_FORMAT", "xml")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("GATEHOUSE_LOG_FORMAT") && err.contains("\"text\" or \"json\""),
        "{err}"
    );
    let bad = write_config(dir.path(), "log_format = \"xml\"");
    let out = Command::new(env!("CARGO_BIN_EXE_gatehouse"))
        .args(["serve", "--config"])
        .arg(&bad)
        .env_remove("GATEHOUSE_LOG_FORMAT")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("log_format") || err.contains("xml"), "{err}");
}

/// On a terminal the text log is coloured, unless `NO_COLOR` is set. `script` (util-linux)
/// gives the daemon a pty for stderr; its typescript file is what the terminal showed.
#[test]
fn a_terminal_gets_colour_unless_no_color_is_set() {
    for (no_color, want_colour) in [(None, true), (Some("1"), false)] {
        let dir = tempfile::tempdir().unwrap();
        let config = write_config(dir.path(), "");
        let shown = dir.path().join("typescript");
        let bin = env!("CARGO_BIN_EXE_gatehouse");
        // The daemon stops itself: `timeout` sends SIGTERM after 3 s.
        let inner = format!(
            "timeout -s TERM 3 {bin} serve --test-tools --config {}",
            config.display()
        );
        let mut cmd = Command::new("script");
        cmd.args(["-q", "-e", "-c", &inner])
            .arg(&shown)
            .current_dir(dir.path())
            .env("RUST_LOG", "info")
            .env_remove("GATEHOUSE_LOG_FORMAT")
            .env_remove("GATEHOUSE_ADMIN_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        match no_color {
            Some(v) => cmd.env("NO_COLOR", v),
            None => cmd.env_remove("NO_COLOR"),
        };
        let status = cmd.status().expect("script (util-linux) must be installed");
        let _ = status;
        let text = String::from_utf8_lossy(&std::fs::read(&shown).unwrap()).into_owned();
        assert!(text.contains("data server started"), "{text}");
        assert_eq!(
            text.contains("\u{1b}["),
            want_colour,
            "NO_COLOR={no_color:?}: {text:?}"
        );
    }
}
