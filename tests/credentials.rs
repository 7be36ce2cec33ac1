//! Per-registration upstream credentials (issue 47), through a real `gatehouse serve` and a
//! real HTTPS upstream (tests/fixtures/whoami_https_server.py: the official Python SDK over
//! uvicorn and TLS, a CA made per run, that echoes the Authorization header each call came
//! with and logs every request's headers): each registration's requests carry only its own
//! credential, on a connection of its own; a rotation reaches the next request while a call
//! in flight finishes; the agent's token never goes upstream; no secret appears in a log, an
//! audit record, `/metrics`, an admin reply or the store file; sealed credentials survive a
//! kill -9, and without their key they are refused with the reason until rotated.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::daemon::Daemon;
use common::whoami::Whoami;
use common::*;
use reqwest::Method;
use serde_json::{json, Value};

async fn client(reg: &Value) -> SseClient {
    let mut c = SseClient::connect(
        reg["sse_url"].as_str().unwrap(),
        reg["token"].as_str().unwrap(),
    )
    .await;
    c.initialize().await;
    c
}

async fn whoami(c: &mut SseClient) -> String {
    let r = c.call("who.whoami", json!({})).await;
    assert!(r["result"]["isError"] != json!(true), "{r}");
    text_of(&r)
}

/// Every file under `dir` (the store and its WAL, the key, the audit log, …) as bytes.
fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_file() {
            out.push((p.clone(), std::fs::read(&p).unwrap_or_default()));
        }
    }
    out
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// No secret in the daemon's stderr, its audit log, `/metrics`, the admin list, or any file
/// of its directory but the key (the store is sealed).
async fn assert_nowhere(d: &Daemon, secrets: &[&str]) {
    let metrics = d.metrics().await;
    let (_, list) = d.admin_call(Method::GET, "/v1/registrations", None).await;
    let (_, tail) = d
        .admin_call(Method::GET, "/v1/audit?limit=1000", None)
        .await;
    let stderr = d.stderr();
    for s in secrets {
        assert!(!stderr.contains(s), "{s} in the daemon's log");
        assert!(!metrics.contains(s), "{s} in /metrics");
        assert!(
            !list.to_string().contains(s),
            "{s} in GET /v1/registrations"
        );
        assert!(!tail.to_string().contains(s), "{s} in GET /v1/audit");
        for (path, bytes) in files_under(d.dir()) {
            assert!(!contains(&bytes, s), "{s} in {}", path.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_registration_sends_only_its_own_credential_and_rotation_reaches_the_next_request() {
    let up = Whoami::start();
    let d = Daemon::start(&up.config(), "", "debug", &[]);
    let (alice, bob, alice2) = (
        "alice-tok-7Hq2Lr9",
        "bob-tok-Xv81Kp3",
        "alice-rotated-Zt40Mw6",
    );
    let a = d
        .register(json!({"agent_id": "run-alice", "tools": ["who.*"],
            "upstream_credentials": {"who": {"bearer": alice}}}))
        .await;
    let b = d
        .register(json!({"agent_id": "run-bob", "tools": ["who.*"],
            "upstream_credentials": {"who": {"headers": {"Authorization": format!("Bearer {bob}"), "X-Tenant": "bob-co"}}}}))
        .await;
    let none = d
        .register(json!({"agent_id": "run-none", "tools": ["who.*"]}))
        .await;
    // A child uses its parent's credential.
    let child = d
        .register(json!({"agent_id": "sub", "tools": ["who.whoami"], "parent": a["id"]}))
        .await;
    assert_eq!(a["upstream_credentials"], json!({"who": "set"}), "{a}");
    assert_eq!(none["upstream_credentials"], json!({}));

    let (mut ca, mut cb, mut cn, mut cc) = (
        client(&a).await,
        client(&b).await,
        client(&none).await,
        client(&child).await,
    );
    for _ in 0..3 {
        assert_eq!(
            whoami(&mut ca).await,
            format!("auth=Bearer {alice} tenant=-")
        );
        assert_eq!(
            whoami(&mut cb).await,
            format!("auth=Bearer {bob} tenant=bob-co")
        );
        assert_eq!(whoami(&mut cn).await, "auth=- tenant=-");
        assert_eq!(
            whoami(&mut cc).await,
            format!("auth=Bearer {alice} tenant=-")
        );
    }

    // Rotation mid-run: a slow call in flight finishes; the next request has the new one.
    let slow = tokio::spawn(async move {
        let r = ca.call("who.slow", json!({"seconds": 1.5})).await;
        (ca, r)
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (s, v) = d
        .admin_call(
            Method::PUT,
            &format!(
                "/v1/registrations/{}/credentials",
                a["id"].as_str().unwrap()
            ),
            Some(json!({"who": {"bearer": alice2}})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["upstream_credentials"], json!({"who": "set"}));
    let (mut ca, r) = slow.await.unwrap();
    assert_eq!(text_of(&r), format!("auth=Bearer {alice} tenant=-"), "{r}");
    assert_eq!(
        whoami(&mut ca).await,
        format!("auth=Bearer {alice2} tenant=-")
    );
    assert_eq!(
        whoami(&mut cc).await,
        format!("auth=Bearer {alice2} tenant=-")
    );
    assert_eq!(
        whoami(&mut cb).await,
        format!("auth=Bearer {bob} tenant=bob-co")
    );
    let (s, shown) = d
        .admin_call(
            Method::GET,
            &format!("/v1/registrations/{}", a["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(shown["upstream_credentials"], json!({"who": "set"}));

    // Refused with the upstream and the reason: a stdio upstream, an ungranted one, a bad
    // value, an unknown registration.
    for (body, want) in [
        (
            json!({"agent_id": "x", "tools": ["desk.*"], "upstream_credentials": {"desk": {"bearer": "t"}}}),
            "stdio",
        ),
        (
            json!({"agent_id": "x", "tools": ["desk.*"], "upstream_credentials": {"who": {"bearer": "t"}}}),
            "grant names no tool of upstream \"who\"",
        ),
        (
            json!({"agent_id": "x", "tools": ["who.*"], "upstream_credentials": {"who": {"bearer": "two words"}}}),
            "upstream_credentials.who",
        ),
    ] {
        let (s, v) = d
            .admin_call(Method::POST, "/v1/registrations", Some(body))
            .await;
        assert_eq!(s, 400, "{v}");
        assert!(v["error"].as_str().unwrap().contains(want), "{v}");
    }
    let (s, _) = d
        .admin_call(
            Method::PUT,
            "/v1/registrations/nosuch/credentials",
            Some(json!({"who": {"bearer": "t"}})),
        )
        .await;
    assert_eq!(s, 404);

    // Attribution: each call record says which kind went upstream, never the value.
    d.wait_audit(10, |recs| {
        recs.iter()
            .filter(|r| r.event == "governed_mcp_call")
            .count()
            >= 16
    })
    .await;
    let recs = d.audit();
    let auth_of = |agent: &str| -> Vec<String> {
        recs.iter()
            .filter(|r| r.event == "governed_mcp_call" && r.agent_id.as_deref() == Some(agent))
            .map(|r| r.upstream_auth.as_deref().unwrap_or("absent").to_string())
            .collect()
    };
    assert!(auth_of("run-alice").iter().all(|k| k == "registration"));
    assert!(auth_of("run-bob").iter().all(|k| k == "registration"));
    assert!(auth_of("sub").iter().all(|k| k == "registration"));
    assert!(auth_of("run-none").iter().all(|k| k == "static"));
    assert!(!auth_of("run-none").is_empty());

    // Upstream: no agent token ever; each upstream session saw one registration's
    // credential only (alice's two values on hers), and never another's.
    let tokens: Vec<&str> = [&a, &b, &none, &child]
        .iter()
        .map(|r| r["token"].as_str().unwrap())
        .collect();
    let seen = up.requests();
    assert!(seen.len() > 10);
    let mut sessions: std::collections::HashMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for r in &seen {
        let text = r.to_string();
        for t in &tokens {
            assert!(
                !text.contains(t),
                "an agent's token reached the upstream: {text}"
            );
        }
        if let Some(s) = r["mcp_session"].as_str() {
            let who = r["authorization"].as_str().unwrap_or("-");
            let who = if who.contains("alice") {
                "alice"
            } else if who.contains("bob") {
                "bob"
            } else {
                "none"
            };
            sessions
                .entry(s.to_string())
                .or_default()
                .insert(who.into());
        }
    }
    assert!(sessions.len() >= 3, "{sessions:?}");
    for (s, who) in &sessions {
        assert_eq!(who.len(), 1, "upstream session {s} carried {who:?}");
    }
    // A rotation that leaves an upstream out: no credential of its own from then on.
    let (s, v) = d
        .admin_call(
            Method::PUT,
            &format!(
                "/v1/registrations/{}/credentials",
                b["id"].as_str().unwrap()
            ),
            Some(json!({})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["upstream_credentials"], json!({}));
    assert_eq!(whoami(&mut cb).await, "auth=- tenant=-");
    d.wait_audit(10, |recs| {
        recs.iter().any(|r| {
            r.agent_id.as_deref() == Some("run-bob") && r.upstream_auth.as_deref() == Some("static")
        })
    })
    .await;
    assert_nowhere(&d, &[alice, bob, alice2]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_credentials_survive_kill9_and_without_their_key_are_refused_until_rotated() {
    let up = Whoami::start();
    let mut d = Daemon::start(&up.config(), "", "info", &[]);
    let secret = "sealed-tok-Qm83Vd1";
    let a = d
        .register(json!({"agent_id": "run-s", "tools": ["who.*"],
            "upstream_credentials": {"who": {"bearer": secret}}}))
        .await;
    let mut c = client(&a).await;
    assert_eq!(
        whoami(&mut c).await,
        format!("auth=Bearer {secret} tenant=-")
    );
    let key = d.dir().join("store.key");
    assert!(key.exists(), "no key file beside the store");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&key).unwrap().mode() & 0o777, 0o600);
    let store = d.dir().join("store.sqlite");
    assert!(store.exists());

    // kill -9 and restart: same URL and token, the credential opened again.
    d.kill9_and_restart();
    for (path, bytes) in files_under(d.dir()) {
        assert!(!contains(&bytes, secret), "{secret} in {}", path.display());
    }
    let moved = |url: &str, data: &str| url.replace(&url[..url.find("/gw/").unwrap()], data);
    let again =
        json!({"sse_url": moved(a["sse_url"].as_str().unwrap(), &d.data), "token": a["token"]});
    let mut c = client(&again).await;
    assert_eq!(
        whoami(&mut c).await,
        format!("auth=Bearer {secret} tenant=-")
    );

    // Without its key: restored, its credential refused with the reason (log, audit, the
    // agent's tool error, the admin view), until the harness sets it again.
    let _ = d.child.kill();
    let _ = d.child.wait();
    std::fs::remove_file(&key).unwrap();
    d.kill9_and_restart();
    let again =
        json!({"sse_url": moved(a["sse_url"].as_str().unwrap(), &d.data), "token": a["token"]});
    let mut c = client(&again).await;
    let r = c.call("who.whoami", json!({})).await;
    assert_eq!(r["result"]["isError"], json!(true), "{r}");
    let text = text_of(&r);
    assert!(
        text.contains("credentials") && text.contains("another key") && text.contains("who"),
        "{text}"
    );
    assert!(
        d.stderr().contains("cannot be opened and are refused"),
        "{}",
        d.stderr()
    );
    let recs = d.audit();
    let refused = recs
        .iter()
        .find(|r| r.event == "credentials_refused")
        .expect("no credentials_refused record");
    assert_eq!(refused.upstream.as_deref(), Some("who"));
    assert!(refused.reason.as_deref().unwrap().contains("another key"));
    let id = a["id"].as_str().unwrap();
    let (_, shown) = d
        .admin_call(Method::GET, &format!("/v1/registrations/{id}"), None)
        .await;
    assert_eq!(shown["upstream_credentials"], json!({"who": "refused"}));
    let (s, v) = d
        .admin_call(
            Method::PUT,
            &format!("/v1/registrations/{id}/credentials"),
            Some(json!({"who": {"bearer": "fresh-tok-Lp09Aa2"}})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        whoami(&mut c).await,
        "auth=Bearer fresh-tok-Lp09Aa2 tenant=-"
    );
    assert_nowhere(&d, &[secret, "fresh-tok-Lp09Aa2"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_reads_credentials_from_a_file_or_a_variable_and_never_from_argv() {
    let up = Whoami::start();
    let d = Daemon::start(&up.config(), "", "info", &[]);
    let secrets = tempfile::tempdir().unwrap();
    let file = secrets.path().join("who.cred");
    std::fs::write(&file, "{\"bearer\": \"file-tok-Ur55Kc0\"}\n").unwrap();
    let arg = format!("who=@{}", file.display());
    let out = d.cli(&[
        "register",
        "--agent-id",
        "cli-a",
        "--tool",
        "who.*",
        "--credential",
        &arg,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reg: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reg["upstream_credentials"], json!({"who": "set"}));
    let mut c = client(&reg).await;
    assert_eq!(
        whoami(&mut c).await,
        "auth=Bearer file-tok-Ur55Kc0 tenant=-"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_gatehouse"))
        .args(["register", "--agent-id", "cli-b", "--tool", "who.*"])
        .args(["--credential", "who=env:WHO_TOKEN", "--json", "--config"])
        .arg(d.config_path())
        .env("GATEHOUSE_ADMIN_URL", &d.admin)
        .env("WHO_TOKEN", "env-tok-Pd19Xe4")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reg: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut c = client(&reg).await;
    assert_eq!(whoami(&mut c).await, "auth=Bearer env-tok-Pd19Xe4 tenant=-");

    // A value on the command line is refused, and not echoed.
    let out = d.cli(&[
        "register",
        "--agent-id",
        "cli-c",
        "--tool",
        "who.*",
        "--credential",
        "who=argv-tok-Wq72",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("never taken from the command line"), "{err}");
    assert!(!err.contains("argv-tok-Wq72"), "{err}");
    assert_nowhere(&d, &["file-tok-Ur55Kc0", "env-tok-Pd19Xe4"]).await;
}

/// bindings/python's pure-Python `AdminClient` (loaded from the source tree, as
/// tests/shipped does) run by the peers' Python: `script` gets `admin` and prints JSON.
fn python_admin(d: &Daemon, script: &str) -> Value {
    let prelude = format!(
        "import importlib, json, sys, types\npkg = types.ModuleType('gh_admin')\npkg.__path__ = [{:?}]\nsys.modules['gh_admin'] = pkg\nm = importlib.import_module('gh_admin._admin')\nadmin = m.AdminClient({:?}, {:?})\n",
        repo_root()
            .join("bindings/python/python/gatehouse")
            .display()
            .to_string(),
        d.admin,
        d.token
    );
    let out = Command::new(repo_root().join("tests/peers/.venv/bin/python"))
        .arg("-c")
        .arg(format!("{prelude}{script}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_admin_client_registers_and_rotates_credentials() {
    let up = Whoami::start();
    let d = Daemon::start(&up.config(), "", "info", &[]);
    let reg = python_admin(
        &d,
        "r = admin.register('py-run', ['who.*'], upstream_credentials={'who': {'bearer': 'py-tok-Hb61Qs8'}}, renew=False)\nprint(json.dumps(r.info))",
    );
    assert_eq!(reg["upstream_credentials"], json!({"who": "set"}), "{reg}");
    let mut c = client(&reg).await;
    assert_eq!(whoami(&mut c).await, "auth=Bearer py-tok-Hb61Qs8 tenant=-");
    let id = reg["id"].as_str().unwrap();
    let rotated = python_admin(
        &d,
        &format!("print(json.dumps(admin.rotate_credentials({id:?}, {{'who': {{'headers': {{'X-Tenant': 'py-co', 'Authorization': 'Bearer py-tok-2'}}}}}})))"),
    );
    assert_eq!(rotated["upstream_credentials"], json!({"who": "set"}));
    assert_eq!(whoami(&mut c).await, "auth=Bearer py-tok-2 tenant=py-co");
    let refused = python_admin(
        &d,
        "try:\n    admin.register('py-bad', ['desk.*'], upstream_credentials={'desk': {'bearer': 'x'}}, renew=False)\n    print(json.dumps('accepted'))\nexcept m.RegistrationError as e:\n    print(json.dumps(str(e)))",
    );
    assert!(refused.as_str().unwrap().contains("stdio"), "{refused}");
    assert_nowhere(&d, &["py-tok-Hb61Qs8"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_answers_nothing_without_a_credential_is_listed_with_the_registrations_own(
) {
    let up = Whoami::start_with(&["--require-auth"]);
    let d = Daemon::start(&up.config(), "", "info", &[]);
    // Without a credential of its own the upstream cannot even be listed.
    let (s, v) = d
        .admin_call(
            Method::POST,
            "/v1/registrations",
            Some(json!({"agent_id": "anon", "tools": ["who.*"]})),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("\"who\" is unavailable"),
        "{v}"
    );
    let a = d
        .register(json!({"agent_id": "run-a", "tools": ["who.*"],
            "upstream_credentials": {"who": {"bearer": "lock-tok-Aa11"}}}))
        .await;
    let b = d
        .register(json!({"agent_id": "run-b", "tools": ["who.whoami"],
            "upstream_credentials": {"who": {"bearer": "lock-tok-Bb22"}}}))
        .await;
    let (mut ca, mut cb) = (client(&a).await, client(&b).await);
    assert_eq!(whoami(&mut ca).await, "auth=Bearer lock-tok-Aa11 tenant=-");
    assert_eq!(whoami(&mut cb).await, "auth=Bearer lock-tok-Bb22 tenant=-");
    // The listing connection made with run-a's credential was not kept for anyone else.
    let (_, ups) = d.admin_call(Method::GET, "/v1/upstreams", None).await;
    let who = ups
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["id"] == "who")
        .unwrap();
    assert_eq!(who["connections"].as_array().unwrap().len(), 2, "{who}");
    assert_nowhere(&d, &["lock-tok-Aa11", "lock-tok-Bb22"]).await;
}

/// tests/peers/otel_receiver.py (OTLP/HTTP, the official protobuf classes) on a loopback port:
/// every line it printed.
struct Receiver {
    child: Child,
    port: u16,
    lines: std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    fn start() -> Receiver {
        let mut child = Command::new(repo_root().join("tests/peers/.venv/bin/python"))
            .arg(repo_root().join("tests/peers/otel_receiver.py"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let kept = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let v: Value = serde_json::from_str(&line).unwrap();
                if let Some(p) = v.get("listening") {
                    let _ = tx.send(p.as_u64().unwrap() as u16);
                }
                kept.lock().unwrap().push(v);
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("otel_receiver.py did not start");
        Receiver { child, port, lines }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_calls_span_says_which_kind_of_credential_went_upstream_never_the_value() {
    let rx = Receiver::start();
    let up = Whoami::start();
    let endpoint = format!("http://127.0.0.1:{}", rx.port);
    let d = Daemon::start(
        &up.config(),
        "",
        "info",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_SERVICE_NAME", "gatehouse-creds"),
        ],
    );
    let a = d
        .register(json!({"agent_id": "span-a", "tools": ["who.*"],
            "upstream_credentials": {"who": {"bearer": "span-tok-Ee44Rt5"}}}))
        .await;
    let b = d
        .register(json!({"agent_id": "span-b", "tools": ["who.*"]}))
        .await;
    let (mut ca, mut cb) = (client(&a).await, client(&b).await);
    assert_eq!(
        whoami(&mut ca).await,
        "auth=Bearer span-tok-Ee44Rt5 tenant=-"
    );
    assert_eq!(whoami(&mut cb).await, "auth=- tenant=-");
    let kind_of = |agent: &str| -> Option<String> {
        rx.lines
            .lock()
            .unwrap()
            .iter()
            .filter_map(|v| v.get("span"))
            .find(|s| {
                s["attributes"]["gen_ai.agent.id"] == agent
                    && s["attributes"]["mcp.method.name"] == "tools/call"
                    && s["attributes"].get("gatehouse.upstream_auth").is_some()
            })
            .map(|s| {
                s["attributes"]["gatehouse.upstream_auth"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while kind_of("span-a").is_none() || kind_of("span-b").is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "no tools/call spans with upstream_auth"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(kind_of("span-a").as_deref(), Some("registration"));
    assert_eq!(kind_of("span-b").as_deref(), Some("static"));
    let everything = serde_json::to_string(&*rx.lines.lock().unwrap()).unwrap();
    assert!(
        !everything.contains("span-tok-Ee44Rt5"),
        "a credential in an exported span"
    );
    assert_nowhere(&d, &["span-tok-Ee44Rt5"]).await;
}
