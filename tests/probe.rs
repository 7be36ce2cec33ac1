//! The probe (issue 48): `Registration::probe` and `gatehouse probe ID`, over real sockets. A
//! healthy registration is reachable with its tools as granted and its upstreams answering; a
//! released one fails fast as `released` (404), a wrong token as `refused` (401), a 503 as
//! `fenced`, an upstream that cannot answer as `upstream_down` naming it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::daemon::Daemon;
use common::{echo_tool, helpdesk, TestGateway};
use gatehouse::{ProbeReason, RegistrationSpec};
use serde_json::{json, Value};

const DEADLINE: Duration = Duration::from_secs(20);

fn spec(tools: &[&str]) -> RegistrationSpec {
    RegistrationSpec {
        agent_id: "prober".into(),
        tools: tools.iter().map(|t| t.to_string()).collect(),
        ..Default::default()
    }
}

/// A stdio upstream (the helpdesk) that cannot start again once `down` exists: `sh` exits
/// at once instead of exec'ing it.
fn flaky(id: &str, down: &std::path::Path) -> gatehouse::config::UpstreamConfig {
    let exe = env!("CARGO_BIN_EXE_gatehouse");
    let script = format!(
        "if [ -e {:?} ]; then exit 1; fi; exec {exe:?} demo-upstream",
        down.display().to_string()
    );
    toml::from_str(&format!(
        "id = {id:?}\ncommand = \"sh\"\nargs = [\"-c\", {script:?}]\nsharing = \"shared\"\ncall_timeout_s = 5\n"
    ))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_registration_lists_its_grant_and_its_upstreams_answer() {
    let tg = TestGateway::with(|c| c.upstreams = vec![helpdesk("helpdesk", "shared", &[], "")]);
    tg.gateway.add_tool(echo_tool("echo", "e"));
    let reg = tg
        .gateway
        .register(spec(&["helpdesk.*", "echo"]))
        .await
        .unwrap();
    let p = reg.probe(DEADLINE).await.unwrap();
    assert!(p.ok && p.reachable, "{p:?}");
    assert!(p.failure.is_none());
    assert!(p.tools.equal, "{:?}", p.tools);
    assert_eq!(p.tools.granted, reg.tools());
    assert!(p.tools.listed.contains(&"echo".to_string()));
    assert!(p.tools.listed.len() > 1, "{:?}", p.tools.listed);
    assert_eq!(p.upstreams.len(), 1, "{:?}", p.upstreams);
    assert_eq!(p.upstreams[0].id, "helpdesk");
    assert!(p.upstreams[0].answered && p.upstreams[0].error.is_none());
    assert!(p.upstreams_down.is_empty());
    assert!(p.latency_ms.is_some_and(|l| l > 0.0));
    assert!(p.protocol_version.is_some());
    // The JSON shape every API shares; never the token.
    let v = serde_json::to_value(&p).unwrap();
    for k in [
        "id",
        "ok",
        "reachable",
        "latency_ms",
        "protocol_version",
        "tools",
        "upstreams",
        "upstreams_down",
        "failure",
        "elapsed_ms",
    ] {
        assert!(v.get(k).is_some(), "{k} missing in {v}");
    }
    assert!(!v.to_string().contains(reg.token()));
    // The probe's session was closed: none is left for the registration.
    let sessions = gatehouse::testing::sessions(&tg.gateway).count_for(reg.id());
    assert_eq!(sessions, 0);
    reg.release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_registration_fails_fast_as_released() {
    let tg = TestGateway::start();
    tg.gateway.add_tool(echo_tool("echo", "e"));
    // Another registration keeps the server up, so the 404 comes from a listening gateway.
    let _other = tg.gateway.register(spec(&["echo"])).await.unwrap();
    let reg = tg.gateway.register(spec(&["echo"])).await.unwrap();
    assert!(
        tg.gateway
            .release_id(reg.id(), gatehouse::ReleaseReason::Released)
            .await
    );
    let e = reg.probe(DEADLINE).await.unwrap_err();
    assert_eq!(e.reason(), Some(ProbeReason::Released), "{e}");
    let f = e.probe().failure.clone().unwrap();
    assert_eq!(f.status, Some(404));
    assert!(!e.probe().reachable);
    assert!(e.to_string().contains("released"), "{e}");
    assert!(!e.to_string().contains(reg.token()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_cannot_answer_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let down = dir.path().join("down");
    let tg = TestGateway::with(|c| c.upstreams = vec![flaky("flaky", &down)]);
    tg.gateway.add_tool(echo_tool("echo", "e"));
    let reg = tg
        .gateway
        .register(spec(&["flaky.*", "echo"]))
        .await
        .unwrap();
    let p = reg.probe(DEADLINE).await.unwrap();
    assert_eq!(p.upstreams[0].id, "flaky");
    assert!(p.upstreams[0].answered);
    // The upstream dies and cannot come back.
    std::fs::write(&down, "").unwrap();
    let pids = gatehouse::testing::pool(&tg.gateway).pids();
    assert_eq!(pids.len(), 1, "{pids:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pids[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let e = reg.probe(DEADLINE).await.unwrap_err();
    assert_eq!(e.reason(), Some(ProbeReason::UpstreamDown), "{e}");
    let p = e.probe();
    assert!(p.reachable, "the gateway itself answered: {p:?}");
    assert!(p.tools.equal, "{:?}", p.tools);
    assert_eq!(p.upstreams_down, vec!["flaky".to_string()]);
    assert!(!p.upstreams[0].answered);
    assert!(p.upstreams[0].error.is_some());
    assert!(e.to_string().contains("flaky"), "{e}");
    reg.release().await;
}

/// An upstream that hangs (stopped: it reads nothing, answers nothing) is named as down within
/// the probe's deadline, not reported as the probe's own timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_upstream_is_named_within_the_deadline() {
    let tg = TestGateway::with(|c| c.upstreams = vec![helpdesk("helpdesk", "shared", &[], "")]);
    let reg = tg.gateway.register(spec(&["helpdesk.*"])).await.unwrap();
    let pids = gatehouse::testing::pool(&tg.gateway).pids();
    assert_eq!(pids.len(), 1, "{pids:?}");
    let pid = nix::unistd::Pid::from_raw(pids[0] as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let e = reg.probe(Duration::from_secs(2)).await.unwrap_err();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert_eq!(e.reason(), Some(ProbeReason::UpstreamDown), "{e}");
    assert_eq!(e.probe().upstreams_down, vec!["helpdesk".to_string()]);
    assert!(e.to_string().contains("helpdesk"), "{e}");
    reg.release().await;
}

// ---- the CLI: `gatehouse probe ID`, the token from --token-file or GATEHOUSE_TOKEN ----

fn daemon() -> Daemon {
    Daemon::start("", "", "warn", &[])
}

async fn register(d: &Daemon) -> Value {
    d.register(json!({"agent_id": "prober", "tools": ["demo.echo"]}))
        .await
}

fn probe_cli(d: &Daemon, args: &[&str], token: Option<&str>) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_gatehouse"));
    cmd.arg("probe")
        .args(args)
        .arg("--config")
        .arg(d.config_path())
        .env("GATEHOUSE_ADMIN_URL", &d.admin)
        .env_remove("GATEHOUSE_ADMIN_TOKEN")
        .env_remove("GATEHOUSE_TOKEN")
        .env_remove("GATEHOUSE_MCP_URL");
    if let Some(t) = token {
        cmd.env("GATEHOUSE_TOKEN", t);
    }
    cmd.output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_probes_with_the_token_from_the_environment_or_a_file() {
    let d = daemon();
    let r = register(&d).await;
    let (id, token) = (r["id"].as_str().unwrap(), r["token"].as_str().unwrap());
    // GATEHOUSE_TOKEN (as `register --export` sets it); JSON as every API's probe.
    let out = probe_cli(&d, &[id, "--json"], Some(token));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(p["ok"], true, "{p}");
    assert_eq!(p["reachable"], true);
    assert_eq!(p["tools"]["equal"], true);
    assert_eq!(p["tools"]["listed"], json!(["demo.echo"]));
    assert_eq!(p["failure"], Value::Null);
    // A token file; text output.
    let file = d.dir().join("reg.token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let out = probe_cli(&d, &[id, "--token-file", file.to_str().unwrap()], None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("healthy"), "{stdout}");
    assert!(stdout.contains("as granted"), "{stdout}");
    assert!(!stdout.contains(token));
    // No token: told where to put it; never taken from argv.
    let out = probe_cli(&d, &[id], None);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("GATEHOUSE_TOKEN"));
    let out = probe_cli(&d, &[id, "--token", token], None);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("--token"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_says_refused_for_a_wrong_token_and_released_after_release() {
    let d = daemon();
    let r = register(&d).await;
    let _keep = register(&d).await;
    let (id, token) = (r["id"].as_str().unwrap(), r["token"].as_str().unwrap());
    let wrong = gatehouse::testing::registry::new_token();
    let out = probe_cli(&d, &[id, "--json"], Some(&wrong));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(p["ok"], false);
    assert_eq!(p["failure"]["reason"], "refused", "{p}");
    assert_eq!(p["failure"]["status"], 401);
    assert!(text(&out.stderr).contains("refused"));
    assert!(!text(&out.stderr).contains(&wrong));

    let (s, _) = d
        .admin_call(
            reqwest::Method::DELETE,
            &format!("/v1/registrations/{id}"),
            None,
        )
        .await;
    assert_eq!(s, 204);
    // The data plane's own 404 (the URL given), and the daemon's (the URL asked).
    let url = r["mcp_url"].as_str().unwrap();
    let out = probe_cli(&d, &[id, "--mcp-url", url], Some(token));
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("released") && err.contains("404"), "{err}");
    let out = probe_cli(&d, &[id], Some(token));
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("released") && err.contains("404"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_half_pings_the_upstreams_and_404s_for_an_unknown_id() {
    let d = Daemon::start(
        &format!(
            "[[upstreams]]\nid = \"helpdesk\"\ncommand = {:?}\nargs = [\"demo-upstream\"]\nsharing = \"shared\"\n",
            env!("CARGO_BIN_EXE_gatehouse")
        ),
        "",
        "warn",
        &[],
    );
    let r = d
        .register(json!({"agent_id": "prober", "tools": ["helpdesk.*"]}))
        .await;
    let id = r["id"].as_str().unwrap();
    let (s, v) = d
        .admin_call(
            reqwest::Method::POST,
            &format!("/v1/registrations/{id}/probe"),
            Some(json!({"timeout_ms": 10000})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["tools"], r["tools"]);
    assert_eq!(v["mcp_url"], r["mcp_url"]);
    assert_eq!(v["upstreams"][0]["id"], "helpdesk");
    assert_eq!(v["upstreams"][0]["answered"], true, "{v}");
    assert!(!v.to_string().contains(r["token"].as_str().unwrap()));
    let (s, _) = d
        .admin_call(
            reqwest::Method::POST,
            "/v1/registrations/nosuchid/probe",
            None,
        )
        .await;
    assert_eq!(s, 404);
    let (s, v) = d
        .admin_call(
            reqwest::Method::POST,
            &format!("/v1/registrations/{id}/probe"),
            Some(json!({"timeout_ms": "soon"})),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    // The CLI finds the URL through the daemon when GATEHOUSE_MCP_URL is not this one's.
    let out = probe_cli(&d, &[id, "--json"], r["token"].as_str());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(p["upstreams"][0]["answered"], true, "{p}");
}

/// Through the admin API too, a hanging upstream is named before the probe's deadline: the
/// daemon's pings get a fifth less time than is left, so their answer comes back in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_names_a_hanging_upstream_within_the_deadline() {
    let d = Daemon::start(
        &format!(
            "[[upstreams]]\nid = \"helpdesk\"\ncommand = {:?}\nargs = [\"demo-upstream\"]\nsharing = \"shared\"\n",
            env!("CARGO_BIN_EXE_gatehouse")
        ),
        "",
        "warn",
        &[],
    );
    let r = d
        .register(json!({"agent_id": "prober", "tools": ["helpdesk.*"]}))
        .await;
    let (_, ups) = d
        .admin_call(reqwest::Method::GET, "/v1/upstreams", None)
        .await;
    let pid = ups[0]["connections"][0]["pid"].as_i64().unwrap();
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let out = probe_cli(
        &d,
        &[r["id"].as_str().unwrap(), "--timeout", "2", "--json"],
        r["token"].as_str(),
    );
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(p["failure"]["reason"], "upstream_down", "{p}");
    assert_eq!(p["upstreams_down"], json!(["helpdesk"]));
}

/// A gateway node that answers every MCP request 503 (as a fenced cluster node does).
fn fenced_node() -> (String, std::thread::JoinHandle<()>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let h = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf);
        let body = r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"this gateway node cannot prove it is current with the registration store (fenced); retry, or use another node"}}"#;
        let _ = write!(
            s,
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
    });
    (format!("http://{addr}"), h)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_says_fenced_for_a_503() {
    let d = daemon();
    let r = register(&d).await;
    let id = r["id"].as_str().unwrap();
    let (base, node) = fenced_node();
    let url = format!("{base}/gw/{id}/mcp");
    let out = probe_cli(&d, &[id, "--mcp-url", &url, "--json"], r["token"].as_str());
    node.join().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let p: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(p["failure"]["reason"], "fenced", "{p}");
    assert_eq!(p["failure"]["status"], 503);
    assert!(p["failure"]["message"].as_str().unwrap().contains("fenced"));
}
