//! The one nginx starter of the tests: a real nginx (Debian's nginx-light, installed by
//! tests/peers/setup.sh; missing, the test fails) in the foreground running the shipped
//! deploy/nginx.conf with only its addresses rewritten: its two listeners on loopback ports,
//! its nodes n1, n2 (, n3) on the given daemons (a node the test does not run is taken out of
//! every group and map). Unprivileged (when the test runs as root, nginx runs as `nobody`).
//! Stopped on drop, workers included.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The nodes the shipped file names (n1, n2, n3 on 10.0.0.11-13).
const SHIPPED_NODES: usize = 3;

pub struct Nginx {
    child: Child,
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:PORT` of its agent-facing and admin listeners.
    pub data: String,
    pub admin: String,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The nginx binary; the test fails without it.
pub fn nginx_bin() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("nginx"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path
        .into_iter()
        .chain(["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx"].map(PathBuf::from))
        .find(|p| p.is_file())
        .expect("nginx is not installed: run `bash tests/peers/setup.sh` (installs the Debian package nginx-light)")
}

/// A free loopback port (bound, read back, released for nginx to bind).
pub fn free_port() -> u16 {
    free_port_pair().0
}

/// Two distinct free loopback ports (both held until both are bound).
pub fn free_port_pair() -> (u16, u16) {
    let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    (
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    )
}

fn directive(l: &str) -> bool {
    !l.trim_start().starts_with('#')
}

/// Replaces every `from` in the directives of `text` (comments stay as shipped); the shipped
/// file must hold it `n` times (a change there that this starter does not follow fails here,
/// not later in a confusing way).
fn rewrite(text: &str, from: &str, to: &str, n: usize) -> String {
    let found: usize = text
        .lines()
        .filter(|l| directive(l))
        .map(|l| l.matches(from).count())
        .sum();
    assert_eq!(found, n, "deploy/nginx.conf: expected {n}× {from:?}");
    text.lines()
        .map(|l| {
            if directive(l) {
                l.replace(from, to)
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Takes node `k` (1-based, the last of `present` nodes) out: its upstream blocks, its
/// server lines in the others' groups, its lines in the maps.
fn drop_node(text: &str, k: usize, present: usize) -> String {
    let addr = format!("10.0.0.1{k}:");
    let block = format!("upstream gatehouse_n{k}_");
    let map_line = format!("n{k} ");
    let mut out = Vec::new();
    let mut skipping = false;
    let (mut blocks, mut servers, mut maps) = (0, 0, 0);
    for l in text.lines() {
        let t = l.trim_start();
        if skipping {
            if t.starts_with('}') {
                skipping = false;
            }
            continue;
        }
        if directive(l) && t.starts_with(&block) {
            skipping = true;
            blocks += 1;
            continue;
        }
        if directive(l) && l.contains(&addr) {
            servers += 1;
            continue;
        }
        if directive(l) && t.starts_with(&map_line) {
            maps += 1;
            continue;
        }
        out.push(l.to_string());
    }
    assert_eq!(
        (blocks, servers, maps),
        // Per listener: the any-node group, and a backup in each other node's group.
        (2, 2 * present, 2),
        "deploy/nginx.conf: node n{k}'s blocks, server lines and map lines"
    );
    out.join("\n")
}

impl Nginx {
    /// nginx on two free loopback ports in front of `nodes` ((data URL, admin URL) of n1, n2,
    /// …: two or three).
    pub fn start(nodes: &[(&str, &str)]) -> Nginx {
        {
            let (data, admin) = free_port_pair();
            Nginx::start_on(data, admin, nodes)
        }
    }

    /// [`Nginx::start`] on the given ports (a node's `public_url` names the proxy before it
    /// starts).
    pub fn start_on(data_port: u16, admin_port: u16, nodes: &[(&str, &str)]) -> Nginx {
        assert!(
            (2..=SHIPPED_NODES).contains(&nodes.len()),
            "deploy/nginx.conf names {SHIPPED_NODES} nodes"
        );
        let hostport = |url: &str| url.trim_start_matches("http://").to_string();
        let shipped =
            std::fs::read_to_string(super::repo_root().join("deploy/nginx.conf")).unwrap();
        let mut conf = rewrite(
            &shipped,
            "listen 80;",
            &format!("listen 127.0.0.1:{data_port};"),
            1,
        );
        conf = rewrite(
            &conf,
            "listen 10.0.0.10:8788;",
            &format!("listen 127.0.0.1:{admin_port};"),
            1,
        );
        for k in (nodes.len() + 1..=SHIPPED_NODES).rev() {
            conf = drop_node(&conf, k, k);
        }
        // Each node: its own group, a backup in each other node's group, the any-node group.
        let per_node = nodes.len() + 1;
        for (i, (data, admin)) in nodes.iter().enumerate() {
            let k = i + 1;
            conf = rewrite(
                &conf,
                &format!("10.0.0.1{k}:8787"),
                &hostport(data),
                per_node,
            );
            conf = rewrite(
                &conf,
                &format!("10.0.0.1{k}:8788"),
                &hostport(admin),
                per_node,
            );
        }
        assert!(
            !conf.lines().any(|l| directive(l) && l.contains("10.0.0.")),
            "an address is left:\n{conf}"
        );

        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        std::fs::write(dir.path().join("gatehouse.conf"), conf).unwrap();
        // The main context a distribution's nginx.conf gives; paths inside the prefix.
        std::fs::write(
            dir.path().join("nginx.conf"),
            format!(
                "pid {d}/nginx.pid;\nerror_log {d}/error.log info;\nevents {{ worker_connections 512; }}\n\
                 http {{\n  access_log {d}/access.log;\n  client_body_temp_path {d}/client_body;\n  \
                 proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  \
                 scgi_temp_path {d}/scgi;\n  include {d}/gatehouse.conf;\n}}\n"
            ),
        )
        .unwrap();
        let stderr = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
        let mut cmd = Command::new(nginx_bin());
        cmd.arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(dir.path().join("nginx.conf"))
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .args(["-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        if let Some((uid, gid)) = nobody_if_root() {
            use std::os::unix::process::CommandExt;
            for e in std::fs::read_dir(dir.path()).unwrap().flatten() {
                std::os::unix::fs::chown(e.path(), Some(uid), Some(gid)).unwrap();
            }
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
            cmd.uid(uid).gid(gid);
        }
        let mut nginx = Nginx {
            child: cmd.spawn().unwrap(),
            dir,
            data: format!("http://127.0.0.1:{data_port}"),
            admin: format!("http://127.0.0.1:{admin_port}"),
        };
        let t0 = Instant::now();
        loop {
            if let Some(st) = nginx.child.try_wait().unwrap() {
                panic!("nginx exited ({st}):\n{}", nginx.logs());
            }
            let up = |p| std::net::TcpStream::connect(("127.0.0.1", p)).is_ok();
            if up(data_port) && up(admin_port) {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "nginx did not listen within 10 s:\n{}",
                nginx.logs()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        nginx
    }

    /// SIGTERM to the master, which stops its workers and waits for them; SIGKILL alone would
    /// leave the workers running (and listening) as orphans. Bounded: after 5 s the workers
    /// and the master are killed.
    fn shutdown(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let workers = self.workers();
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for w in workers {
            let _ = kill(Pid::from_raw(w as i32), Signal::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The master's children (its workers), from /proc.
    fn workers(&self) -> Vec<u32> {
        let master = self.child.id();
        let ppid_of = |pid: &str| -> Option<u32> {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
            stat.rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        };
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().to_string();
                let pid: u32 = name.parse().ok()?;
                (ppid_of(&name)? == master).then_some(pid)
            })
            .collect()
    }

    /// Stops nginx as Drop does, and checks that it and every worker are gone.
    pub fn stop(mut self) {
        let workers = self.workers();
        assert!(!workers.is_empty(), "nginx has no worker");
        self.shutdown();
        let exited = self.child.try_wait().unwrap();
        assert!(exited.is_some(), "nginx master still running");
        for w in workers {
            let state = std::fs::read_to_string(format!("/proc/{w}/stat")).unwrap_or_default();
            let running = state
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .is_some_and(|st| st != "Z");
            assert!(!running, "nginx worker {w} outlived its master");
        }
    }

    pub fn logs(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
        format!("{}{}", read("stderr.log"), read("error.log"))
    }
}

/// (uid, gid) of `nobody` when this process is root (nginx is then run as it), else None.
fn nobody_if_root() -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self").ok()?.uid() != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let ids = passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() > 3 && f[0] == "nobody")
        .and_then(|f| Some((f[2].parse().ok()?, f[3].parse().ok()?)));
    Some(ids.unwrap_or((65534, 65534)))
}
