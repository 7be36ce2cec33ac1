//! `gatehouse serve` under a systemd `Type=notify` unit (deploy/gatehouse.service), with the
//! manager played by a real `NOTIFY_SOCKET` datagram socket: READY=1 only once both listeners
//! answer, WATCHDOG=1 at half of `WATCHDOG_USEC`, RELOADING=1 (with `MONOTONIC_USEC`) then
//! READY=1 around a SIGHUP whether the new file is applied or refused, STOPPING=1 on SIGTERM.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::daemon::{config_text, serve_command};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The manager's end: every datagram the daemon sends, in order.
struct Manager {
    socket: UnixDatagram,
}

impl Manager {
    fn bind(dir: &Path) -> (Manager, std::path::PathBuf) {
        let path = dir.join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        (Manager { socket }, path)
    }

    /// The next datagram within `within`, or `None`.
    fn next(&self, within: Duration) -> Option<String> {
        self.socket.set_read_timeout(Some(within)).unwrap();
        let mut buf = [0u8; 4096];
        match self.socket.recv(&mut buf) {
            Ok(n) => Some(String::from_utf8(buf[..n].to_vec()).unwrap()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("recv: {e}"),
        }
    }

    /// The next datagram that is not a watchdog ping (30 s at most).
    fn next_state(&self) -> String {
        let end = Instant::now() + Duration::from_secs(30);
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.next(left) {
                Some(m) if m == "WATCHDOG=1" => continue,
                Some(m) => return m,
                None => break,
            }
        }
        panic!("no notification within 30 s");
    }
}

/// The daemon, killed if a test ends before it exits.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Two ports free now (both held until both are known).
fn free_ports() -> (u16, u16) {
    let a = TcpListener::bind("127.0.0.1:0").unwrap();
    let b = TcpListener::bind("127.0.0.1:0").unwrap();
    (
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    )
}

/// The status line of one `GET path` on a new connection, read within 5 s.
fn get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    text.lines().next().unwrap_or("").to_string()
}

fn config(dir: &Path, data: u16, admin: u16) -> String {
    config_text(dir, "", "")
        .replace(
            "listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"",
            &format!("listen = \"127.0.0.1:{data}\"\nadmin_listen = \"127.0.0.1:{admin}\""),
        )
        .replace("\n[audit]", "\nshutdown_grace_s = 10\n[audit]")
}

fn stderr_of(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default()
}

fn wait_exit(child: &mut Child, within: Duration) -> Option<i32> {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    panic!("the daemon did not exit within {within:?}");
}

fn monotonic_usec() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1_000
}

/// The `MONOTONIC_USEC` of a `RELOADING=1` datagram (which must carry both).
fn reloading_usec(msg: &str) -> u64 {
    let mut lines = msg.lines();
    assert_eq!(lines.next(), Some("RELOADING=1"), "{msg:?}");
    lines
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .unwrap_or_else(|| panic!("no MONOTONIC_USEC in {msg:?}"))
        .parse()
        .unwrap()
}

#[test]
fn the_daemon_speaks_sd_notify_through_start_reload_and_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, socket) = Manager::bind(dir.path());
    let (data, admin) = free_ports();
    let cfg = dir.path().join("gatehouse.toml");
    let good = config(dir.path(), data, admin);
    std::fs::write(&cfg, &good).unwrap();
    let stderr = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
    let mut child = Killed(
        serve_command(&cfg, "warn")
            .current_dir(dir.path())
            .env("NOTIFY_SOCKET", &socket)
            .env("WATCHDOG_USEC", "400000")
            .env_remove("WATCHDOG_PID")
            .stderr(Stdio::from(stderr))
            .spawn()
            .unwrap(),
    );
    let pid = Pid::from_raw(child.0.id() as i32);

    // The first notification is READY, and a connection made right after it is answered
    // by both listeners.
    let first = manager.next(Duration::from_secs(30));
    assert_eq!(
        first.as_deref(),
        Some("READY=1"),
        "stderr: {}",
        stderr_of(dir.path())
    );
    assert!(get(data, "/healthz").contains(" 200 "), "data listener");
    assert!(
        get(admin, "/v1/registrations").starts_with("HTTP/1.1 "),
        "admin listener"
    );

    // The watchdog: WatchdogSec=0.4 s asks for a ping at least every 0.4 s; pings come at half.
    let t0 = Instant::now();
    let mut pings = 0;
    while t0.elapsed() < Duration::from_millis(1100) {
        match manager.next(Duration::from_millis(1100)) {
            Some(m) => {
                assert_eq!(m, "WATCHDOG=1");
                pings += 1;
            }
            None => break,
        }
    }
    assert!((3..=8).contains(&pings), "{pings} watchdog pings in 1.1 s");

    // SIGHUP with a good file: RELOADING (stamped with the monotonic clock), then READY.
    std::fs::write(
        &cfg,
        good.replace("shutdown_grace_s = 10", "shutdown_grace_s = 11"),
    )
    .unwrap();
    let before = monotonic_usec();
    kill(pid, Signal::SIGHUP).unwrap();
    let usec = reloading_usec(&manager.next_state());
    let after = monotonic_usec();
    assert!(
        before <= usec && usec <= after,
        "{before} <= {usec} <= {after}"
    );
    assert_eq!(manager.next_state(), "READY=1");
    let log = stderr_of(dir.path());
    assert!(!log.contains("config not reloaded"), "{log}");

    // SIGHUP with a bad file: refused, the old config stays, and the manager still hears
    // RELOADING then READY (systemd would otherwise wait for the reload until its timeout).
    std::fs::write(&cfg, "listen = [\n").unwrap();
    kill(pid, Signal::SIGHUP).unwrap();
    reloading_usec(&manager.next_state());
    assert_eq!(manager.next_state(), "READY=1");
    let end = Instant::now() + Duration::from_secs(10);
    while !stderr_of(dir.path()).contains("config not reloaded") {
        assert!(Instant::now() < end, "{}", stderr_of(dir.path()));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(get(data, "/healthz").contains(" 200 "), "still serving");

    // SIGTERM: STOPPING, then a clean exit.
    kill(pid, Signal::SIGTERM).unwrap();
    assert_eq!(manager.next_state(), "STOPPING=1");
    let code = wait_exit(&mut child.0, Duration::from_secs(15));
    assert_eq!(code, Some(0), "{}", stderr_of(dir.path()));
}

/// Without `NOTIFY_SOCKET` nothing is sent and nothing changes; with one nobody reads (a
/// closed manager), the daemon warns and serves.
#[test]
fn a_missing_manager_is_a_warning_not_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let (data, admin) = free_ports();
    let cfg = dir.path().join("gatehouse.toml");
    std::fs::write(&cfg, config(dir.path(), data, admin)).unwrap();
    let stderr = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
    let mut child = Killed(
        serve_command(&cfg, "warn")
            .current_dir(dir.path())
            .env("NOTIFY_SOCKET", dir.path().join("nobody.sock"))
            .stderr(Stdio::from(stderr))
            .spawn()
            .unwrap(),
    );
    let end = Instant::now() + Duration::from_secs(30);
    while !stderr_of(dir.path()).contains("gatehouse: ready") {
        assert!(Instant::now() < end, "{}", stderr_of(dir.path()));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(get(data, "/healthz").contains(" 200 "));
    kill(Pid::from_raw(child.0.id() as i32), Signal::SIGTERM).unwrap();
    let code = wait_exit(&mut child.0, Duration::from_secs(15));
    let log = stderr_of(dir.path());
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("sd_notify READY=1"), "{log}");
}

/// deploy/gatehouse.service as `systemd-analyze` reads it, with `ExecStart` pointed at the
/// built binary (verify checks that the command exists), in its own folder; `dropin`, if
/// given, goes into `gatehouse.service.d/`.
fn unit_copy(dir: &Path, dropin: Option<&str>) -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("deploy/gatehouse.service")).unwrap();
    assert!(text.contains("\nExecStart=/usr/local/bin/gatehouse serve\n"));
    let text = text.replace(
        "\nExecStart=/usr/local/bin/gatehouse serve\n",
        &format!("\nExecStart={} serve\n", env!("CARGO_BIN_EXE_gatehouse")),
    );
    let unit = dir.join("gatehouse.service");
    std::fs::write(&unit, text).unwrap();
    if let Some(name) = dropin {
        let d = dir.join("gatehouse.service.d");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(root.join("deploy").join(name), d.join(name)).unwrap();
    }
    unit
}

fn analyze(args: &[&str], unit: &Path) -> std::process::Output {
    std::process::Command::new("systemd-analyze")
        .args(args)
        .arg(unit)
        .current_dir(unit.parent().unwrap())
        .output()
        .expect("systemd-analyze (Debian package systemd; tests/peers/setup.sh installs it)")
}

fn systemd_version() -> u32 {
    let out = std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .expect("systemd-analyze (Debian package systemd; tests/peers/setup.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{text}"))
}

/// The shipped unit loads cleanly on this systemd (252 here, as on Debian 12 and RHEL 9),
/// and its sandbox scores at most 2.0 on `systemd-analyze security` (lower is better).
#[test]
fn the_unit_verifies_and_its_exposure_is_at_most_2() {
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_copy(dir.path(), None);
    let verify = analyze(&["verify"], &unit);
    let said = String::from_utf8_lossy(&verify.stderr).to_string()
        + &String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success(), "{said}");
    assert!(
        !said.contains("gatehouse.service"),
        "warnings about the unit: {said}"
    );

    let security = analyze(&["security", "--offline=true"], &unit);
    let text = String::from_utf8_lossy(&security.stdout).to_string();
    let score: f64 = text
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for gatehouse.service: ")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in: {text}"));
    println!(
        "systemd-analyze security --offline=true gatehouse.service: exposure {score} (goal <= 2.0)"
    );
    assert!(score <= 2.0, "exposure {score}: {text}");

    // LimitNOFILE lets the data listener's auto connection cap (3/4 of it) reach its top.
    let nofile: u64 = std::fs::read_to_string(&unit)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("LimitNOFILE="))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(nofile * 3 / 4 >= 16384, "LimitNOFILE={nofile}");
}

/// Why the unit says `Type=notify` and ships notify-reload as a separate drop-in: systemd 252
/// cannot parse it; from 253 the drop-in loads cleanly.
#[test]
fn the_notify_reload_drop_in_is_for_systemd_253_and_later() {
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_copy(dir.path(), Some("gatehouse-notify-reload.conf"));
    let verify = analyze(&["verify"], &unit);
    let said = String::from_utf8_lossy(&verify.stderr).to_string()
        + &String::from_utf8_lossy(&verify.stdout);
    if systemd_version() < 253 {
        assert!(said.contains("Failed to parse service type"), "{said}");
    } else {
        assert!(verify.status.success(), "{said}");
        assert!(!said.contains("gatehouse"), "{said}");
    }
}
