//! A real 3-member etcd cluster (Debian `etcd-server`; missing, the test fails) and what
//! tests/cluster.rs and the cluster bench (benches/cluster.rs) share: stateless calls, waits
//! for a node's answer, and the release-propagation measurement under load.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::daemon::Daemon;

pub fn free_port() -> u16 {
    free_ports::<1>()[0]
}

/// `N` distinct free ports: every listener is held until all are bound, so the kernel cannot
/// hand the same port out twice (a CI run saw two etcd members given one port, and one exit
/// with "address already in use").
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<std::net::TcpListener> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    std::array::from_fn(|i| held[i].local_addr().unwrap().port())
}

/// One etcd member (killed on drop; its log's last lines printed if the test failed).
pub struct Member {
    pub name: String,
    pub client: u16,
    pub args: Vec<String>,
    pub child: Option<Child>,
    /// Where its stderr goes (appended to across restarts); `None`: discarded.
    pub log: Option<std::path::PathBuf>,
}

impl Member {
    pub fn spawn(&mut self) {
        let stderr = self
            .log
            .as_ref()
            .and_then(|p| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .ok()
            })
            .map_or_else(Stdio::null, Stdio::from);
        let child = Command::new("etcd")
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("etcd (Debian etcd-server) must be installed: apt-get install etcd-server");
        self.child = Some(child);
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(log) = self
                .log
                .as_ref()
                .and_then(|p| std::fs::read_to_string(p).ok())
            {
                let lines: Vec<&str> = log.lines().collect();
                eprintln!(
                    "--- etcd member {} (client port {}, {}): last lines of its log ---\n{}",
                    self.name,
                    self.client,
                    match self.child.as_mut().map(|c| c.try_wait()) {
                        Some(Ok(None)) => "running".to_string(),
                        Some(Ok(Some(st))) => format!("exited: {st}"),
                        _ => "not running".to_string(),
                    },
                    lines[lines.len().saturating_sub(15)..].join("\n")
                );
            }
        }
        self.kill9();
    }
}

/// A 3-member etcd cluster on 127.0.0.1, data dirs in a temporary directory.
pub struct Etcd {
    pub members: Vec<Member>,
    _dir: tempfile::TempDir,
}

impl Etcd {
    pub async fn start() -> Etcd {
        let dir = tempfile::tempdir().unwrap();
        let p = free_ports::<6>();
        let ports: Vec<(u16, u16)> = (0..3).map(|i| (p[2 * i], p[2 * i + 1])).collect();
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, p))| format!("e{i}=http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::new();
        for (i, (c, p)) in ports.iter().enumerate() {
            let name = format!("e{i}");
            let args = vec![
                "--name".into(),
                name.clone(),
                "--data-dir".into(),
                dir.path().join(&name).display().to_string(),
                "--listen-client-urls".into(),
                format!("http://127.0.0.1:{c}"),
                "--advertise-client-urls".into(),
                format!("http://127.0.0.1:{c}"),
                "--listen-peer-urls".into(),
                format!("http://127.0.0.1:{p}"),
                "--initial-advertise-peer-urls".into(),
                format!("http://127.0.0.1:{p}"),
                "--initial-cluster".into(),
                initial.clone(),
                "--initial-cluster-state".into(),
                "new".into(),
                "--initial-cluster-token".into(),
                "gatehouse-test".into(),
                "--heartbeat-interval".into(),
                "100".into(),
                "--election-timeout".into(),
                "1000".into(),
            ];
            let mut m = Member {
                log: Some(dir.path().join(format!("{name}.log"))),
                name,
                client: *c,
                args,
                child: None,
            };
            m.spawn();
            members.push(m);
        }
        let mut etcd = Etcd { members, _dir: dir };
        etcd.wait_writable(Duration::from_secs(30)).await;
        etcd.wait_all_up(Duration::from_secs(30)).await;
        etcd
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client))
            .collect()
    }

    pub async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect(
            self.endpoints(),
            Some(etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(2))),
        )
        .await
        .unwrap()
    }

    /// The index of the member that leads now (asked of each member; `None`: none knows).
    pub async fn leader(&self) -> Option<usize> {
        for m in &self.members {
            let Ok(mut c) = etcd_client::Client::connect(
                [format!("http://127.0.0.1:{}", m.client)],
                Some(etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(1))),
            )
            .await
            else {
                continue;
            };
            let Ok(st) = c.status().await else { continue };
            let Ok(list) = c.member_list().await else {
                continue;
            };
            let leader = list.members().iter().find(|x| x.id() == st.leader())?;
            return self.members.iter().position(|x| {
                leader
                    .client_urls()
                    .iter()
                    .any(|u| u.ends_with(&format!(":{}", x.client)))
            });
        }
        None
    }

    /// Waits until every member answers its own status (a quorum is not enough: a test that
    /// kills members counts on the others). A member that exited fails the test, its log
    /// printed (a port taken between `free_port` and etcd's bind, say).
    pub async fn wait_all_up(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        for m in &mut self.members {
            loop {
                if let Some(Ok(Some(st))) = m.child.as_mut().map(|c| c.try_wait()) {
                    panic!("etcd member {} exited at start: {st}", m.name);
                }
                let up = match etcd_client::Client::connect(
                    [format!("http://127.0.0.1:{}", m.client)],
                    Some(etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(1))),
                )
                .await
                {
                    Ok(mut c) => c.status().await.is_ok(),
                    Err(_) => false,
                };
                if up {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "etcd member {} not up in {within:?}",
                    m.name
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// Waits until a write commits (the cluster has a leader and quorum).
    pub async fn wait_writable(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(mut c) = etcd_client::Client::connect(
                self.endpoints(),
                Some(etcd_client::ConnectOptions::new().with_timeout(Duration::from_secs(1))),
            )
            .await
            {
                if c.put("/test/alive", "1", None).await.is_ok() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "etcd cluster not writable in {within:?}: {:?}",
                self.members.iter().map(|m| &m.name).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One stateless (2026-07-28) `tools/call` on `node`: (status, body).
pub async fn call(
    http: &reqwest::Client,
    node: &Daemon,
    id: &str,
    token: &str,
    tool: &str,
    args: Value,
) -> (u16, Value) {
    call_url(http, &node.data, id, token, tool, args).await
}

pub fn echo_ok(v: &Value) -> bool {
    v["result"]["content"][0]["text"]
        .as_str()
        .is_some_and(|t| t.ends_with(":x"))
}

/// Waits until `id` answers 200 on `node` (replicated), `within` at most.
pub async fn wait_served(
    http: &reqwest::Client,
    node: &Daemon,
    id: &str,
    token: &str,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let (s, v) = call(http, node, id, token, "demo.echo", json!({"text":"x"})).await;
        if s == 200 && echo_ok(&v) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{id} not served by {} in {within:?}: {s} {v}",
            node.data
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until `node` answers `status` to a call of a live registration; returns how long.
pub async fn wait_status(
    http: &reqwest::Client,
    node: &Daemon,
    id: &str,
    token: &str,
    status: u16,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    loop {
        let (s, _) = call(http, node, id, token, "demo.echo", json!({"text":"x"})).await;
        if s == status {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "{} did not answer {status} in {within:?} (last {s})",
            node.data
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// One stateless (2026-07-28) `tools/call` on a data listener: (status, body).
pub async fn call_url(
    http: &reqwest::Client,
    data: &str,
    id: &str,
    token: &str,
    tool: &str,
    args: Value,
) -> (u16, Value) {
    let params = json!({
        "name": tool,
        "arguments": args,
        "_meta": {"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}},
    });
    let r = http
        .post(format!("{data}/gw/{id}/mcp"))
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"tools/call","params":params}))
        .send()
        .await;
    match r {
        Ok(r) => {
            let s = r.status().as_u16();
            (s, r.json().await.unwrap_or(Value::Null))
        }
        Err(e) => (0, json!(e.to_string())),
    }
}

/// What [`releases_under_load`] measured.
pub struct Propagation {
    /// Per release, sorted: from the DELETE sent to the last node's first 404.
    pub samples: Vec<Duration>,
    /// Releases every node acknowledged (a cluster's DELETE answer names them).
    pub acked_all: usize,
    /// Calls the load served meanwhile.
    pub served: u64,
}

impl Propagation {
    pub fn p50(&self) -> Duration {
        pct(&self.samples, 0.5)
    }
    pub fn p99(&self) -> Duration {
        pct(&self.samples, 0.99)
    }
    pub fn max(&self) -> Duration {
        self.samples[self.samples.len() - 1]
    }
    pub fn line(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        format!(
            "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms over {} releases ({} load calls served meanwhile)",
            ms(self.p50()),
            ms(self.p99()),
            ms(self.max()),
            self.samples.len(),
            self.served
        )
    }
}

/// `releases` registrations, each made on one node and released on the next (round robin),
/// while `callers` clients per node call a long-lived registration on every node throughout;
/// after each DELETE every node is probed in turn until it answers 404 (so the figure is an
/// upper bound for the last node). Works on one node too (the baseline: no shared store).
pub async fn releases_under_load(
    nodes: &[&Daemon],
    releases: usize,
    callers: usize,
    within: Duration,
) -> Propagation {
    let http = super::http();
    let r = nodes[0]
        .register(json!({"agent_id": "agent-load", "tools": ["demo.*"]}))
        .await;
    let (id, token) = (
        r["id"].as_str().unwrap().to_string(),
        r["token"].as_str().unwrap().to_string(),
    );
    for n in nodes {
        wait_served(&http, n, &id, &token, within).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for n in nodes {
        for _ in 0..callers {
            let (url, id, token, stop, served) = (
                n.data.clone(),
                id.clone(),
                token.clone(),
                stop.clone(),
                served.clone(),
            );
            load.push(tokio::spawn(async move {
                let http = super::http();
                while !stop.load(Ordering::Relaxed) {
                    let (s, v) =
                        call_url(&http, &url, &id, &token, "demo.echo", json!({"text":"x"})).await;
                    assert!(s == 200 && echo_ok(&v), "load call failed: {s} {v}");
                    served.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    let mut samples = Vec::with_capacity(releases);
    let mut acked_all = 0;
    let len = nodes.len();
    for i in 0..releases {
        let at = i % len;
        let r = nodes[(at + 1) % len]
            .register(json!({"agent_id": format!("agent-{i}"), "tools": ["demo.*"]}))
            .await;
        let (rid, rtok) = (
            r["id"].as_str().unwrap().to_string(),
            r["token"].as_str().unwrap().to_string(),
        );
        for n in nodes {
            wait_served(&http, n, &rid, &rtok, within).await;
        }
        let t0 = Instant::now();
        let (s, v) = nodes[at]
            .admin_call(
                reqwest::Method::DELETE,
                &format!("/v1/registrations/{rid}"),
                None,
            )
            .await;
        assert!(s == 200 || s == 204, "{s} {v}");
        if s == 200 {
            assert_eq!(
                v["fenced"],
                json!([]),
                "no node fenced on a healthy cluster: {v}"
            );
            if v["acked"].as_array().map_or(0, Vec::len) == len {
                acked_all += 1;
            }
        }
        for n in nodes {
            wait_status(&http, n, &rid, &rtok, 404, within * 2).await;
        }
        samples.push(t0.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    samples.sort();
    Propagation {
        samples,
        acked_all,
        served: served.load(Ordering::Relaxed),
    }
}

/// A `gatehouse serve --test-tools` node `name` on the etcd cluster at `endpoints`, with
/// `B = bound` and heartbeats every 100 ms.
pub fn etcd_node(name: &str, endpoints: &[String], bound: Duration) -> Daemon {
    let list = endpoints
        .iter()
        .map(|e| format!("{e:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    Daemon::start(
        &format!(
            "node_id = \"{name}\"\n[store]\nbackend = \"etcd\"\nendpoints = [{list}]\ntimeout_ms = 1000\n[cluster]\nrelease_bound_ms = {}\nheartbeat_ms = 100\n",
            bound.as_millis()
        ),
        "",
        "gatehouse=warn",
        &[],
    )
}

/// What [`creates_then_another_node`] measured.
pub struct ReadYourWrites {
    /// Per create, sorted: from the POST sent to its 201.
    pub creates: Vec<Duration>,
    /// First calls on another node, sent at once after a 201.
    pub calls: usize,
    /// Those that were served.
    pub served: usize,
    /// Those answered otherwise: (status, body) of the first few.
    pub missed: Vec<(u16, Value)>,
}

impl ReadYourWrites {
    pub fn line(&self) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        format!(
            "{} of {} first calls on another node served ({} creates); create p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            self.served,
            self.calls,
            self.creates.len(),
            ms(pct(&self.creates, 0.5)),
            ms(pct(&self.creates, 0.99)),
            ms(self.creates[self.creates.len() - 1]),
        )
    }
}

/// Issue 50 item 1, the shape that reproduces the old miss on debug builds too: `workers`
/// clients at once, each making `per_worker` registrations in a tight loop (no sleep) on
/// its own node (round robin) and, at once after each 201, calling it on every other node
/// concurrently. The creates of the others keep each node's watch busy applying, so a node
/// that answers from its replica before it applied the create is caught. Counts every
/// first call (`calls`: `workers * per_worker * (nodes - 1)`).
pub async fn concurrent_creates_then_every_other_node(
    nodes: &[&Daemon],
    workers: usize,
    per_worker: usize,
) -> ReadYourWrites {
    let len = nodes.len();
    let worker = |w: usize| async move {
        let http = super::http();
        let mine = nodes[w % len];
        let mut creates = Vec::with_capacity(per_worker);
        let (mut served, mut missed) = (0, Vec::new());
        for i in 0..per_worker {
            let t0 = Instant::now();
            let r = mine
                .register(json!({"agent_id": format!("agent-ryw-{w}-{i}"), "tools": ["demo.*"]}))
                .await;
            creates.push(t0.elapsed());
            let (id, token) = (r["id"].as_str().unwrap(), r["token"].as_str().unwrap());
            let calls = (1..len).map(|k| {
                call(
                    &http,
                    nodes[(w + k) % len],
                    id,
                    token,
                    "demo.echo",
                    json!({"text":"x"}),
                )
            });
            for (s, v) in futures::future::join_all(calls).await {
                if s == 200 && echo_ok(&v) {
                    served += 1;
                } else if missed.len() < 5 {
                    missed.push((s, v));
                }
            }
        }
        (creates, served, missed)
    };
    let mut out = ReadYourWrites {
        creates: Vec::with_capacity(workers * per_worker),
        calls: workers * per_worker * (len - 1),
        served: 0,
        missed: Vec::new(),
    };
    for (creates, served, missed) in futures::future::join_all((0..workers).map(worker)).await {
        out.creates.extend(creates);
        out.served += served;
        out.missed
            .extend(missed.into_iter().take(5 - out.missed.len().min(5)));
    }
    out.creates.sort();
    out
}

/// Issue 50 item 1: `n` registrations, each made on one node (round robin) and called once,
/// at once after its 201, on the next node (what an agent handed the URL does behind a
/// balancer). Nothing waits for replication in between.
pub async fn creates_then_another_node(nodes: &[&Daemon], n: usize) -> ReadYourWrites {
    let http = super::http();
    let len = nodes.len();
    let mut creates = Vec::with_capacity(n);
    let mut served = 0;
    let mut missed = Vec::new();
    for i in 0..n {
        let t0 = Instant::now();
        let r = nodes[i % len]
            .register(json!({"agent_id": format!("agent-ryw-{i}"), "tools": ["demo.*"]}))
            .await;
        creates.push(t0.elapsed());
        let (id, token) = (r["id"].as_str().unwrap(), r["token"].as_str().unwrap());
        let (s, v) = call(
            &http,
            nodes[(i + 1) % len],
            id,
            token,
            "demo.echo",
            json!({"text":"x"}),
        )
        .await;
        if s == 200 && echo_ok(&v) {
            served += 1;
        } else if missed.len() < 5 {
            missed.push((s, v));
        }
    }
    creates.sort();
    ReadYourWrites {
        creates,
        calls: n,
        served,
        missed,
    }
}
