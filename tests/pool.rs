//! The upstream pool end to end: registrations behind the gateway call the helpdesk demo
//! upstream (stdio child, `command = "@self"`) and `@modelcontextprotocol/server-everything`.
//! Each test shows one failure of pooling that the gateway prevents.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{text_of, SseClient, TestGateway};
use gatehouse::config::{Sharing, UpstreamConfig};
use gatehouse::RegistrationSpec;
use nix::errno::Errno;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use tokio::time::Instant;

/// The helpdesk demo upstream (`demo-upstream <extra>` of the built binary).
fn helpdesk(id: &str, sharing: &str, extra: &[&str], more_toml: &str) -> UpstreamConfig {
    common::helpdesk(
        id,
        sharing,
        extra,
        &format!("call_timeout_s = 10\n{more_toml}"),
    )
}

fn gateway(upstreams: Vec<UpstreamConfig>) -> TestGateway {
    TestGateway::with(|c| {
        c.upstreams = upstreams;
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
    })
}

async fn client(reg: &gatehouse::Registration) -> SseClient {
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    c.initialize().await;
    c
}

fn structured(reply: &Value) -> &Value {
    &reply["result"]["structuredContent"]
}

fn alive(pid: u32) -> bool {
    kill(Pid::from_raw(pid as i32), None) != Err(Errno::ESRCH)
}

async fn wait_until(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    f()
}

fn spawned_pids(gw: &TestGateway) -> Vec<u32> {
    gw.audit()
        .into_iter()
        .filter(|r| r.event == "upstream_spawned")
        .filter_map(|r| r.pid)
        .collect()
}

#[tokio::test]
async fn leased_registrations_share_one_connection_and_keep_their_own_cases() {
    let gw = gateway(vec![helpdesk("helpdesk", "leased", &[], "")]);
    let a = gw
        .gateway
        .register(RegistrationSpec::new("agent-a").grant("helpdesk.*"))
        .await
        .unwrap();
    let b = gw
        .gateway
        .register(RegistrationSpec::new("agent-b").grant("helpdesk.*"))
        .await
        .unwrap();
    assert_eq!(
        gatehouse::testing::pool(&gw.gateway).effective_sharing("helpdesk"),
        Some(Sharing::Leased)
    );
    let (mut ca, mut cb) = (client(&a).await, client(&b).await);

    // Descriptors pass through unchanged apart from the name.
    let list = ca.request("tools/list", json!({})).await;
    let tools = list["result"]["tools"].as_array().unwrap();
    let slow = tools
        .iter()
        .find(|t| t["name"] == "helpdesk.add_note_slow")
        .unwrap();
    assert_eq!(slow["title"], "Add note (slowly)");
    assert_eq!(slow["annotations"]["idempotentHint"], false);
    assert_eq!(slow["inputSchema"]["required"], json!(["text"]));
    assert_eq!(tools.len(), 4);

    let case_a = ca
        .call("helpdesk.open_case", json!({"title": "printer"}))
        .await;
    let case_b = cb.call("helpdesk.open_case", json!({"title": "vpn"})).await;
    let (case_a, case_b) = (
        structured(&case_a)["case_id"].clone(),
        structured(&case_b)["case_id"].clone(),
    );
    assert_ne!(case_a, case_b);
    // Interleaved notes: each lands on its own registration's case.
    for i in 0..3 {
        ca.call("helpdesk.add_note", json!({"text": format!("a{i}")}))
            .await;
        cb.call("helpdesk.add_note", json!({"text": format!("b{i}")}))
            .await;
    }
    let la = ca.call("helpdesk.list_notes", json!({})).await;
    let lb = cb.call("helpdesk.list_notes", json!({})).await;
    assert_eq!(structured(&la)["case_id"], case_a);
    assert_eq!(structured(&la)["notes"], json!(["a0", "a1", "a2"]));
    assert_eq!(structured(&lb)["case_id"], case_b);
    assert_eq!(structured(&lb)["notes"], json!(["b0", "b1", "b2"]));
    assert_ne!(structured(&la)["lease"], structured(&lb)["lease"]);

    // One process, one epoch; request ids on it are distinct across registrations.
    assert_eq!(gatehouse::testing::pool(&gw.gateway).pids().len(), 1);
    let calls = gw.calls();
    assert_eq!(calls.len(), 10);
    let ids: BTreeSet<u64> = calls
        .iter()
        .map(|r| r.upstream_request_id.unwrap())
        .collect();
    assert_eq!(ids.len(), calls.len(), "upstream ids reused: {ids:?}");
    assert!(calls.iter().all(|r| r.epoch == Some(1)));
    assert!(calls
        .iter()
        .all(|r| r.upstream.as_deref() == Some("helpdesk")));
    a.release().await;
    b.release().await;
    gw.gateway.shutdown().await;
}

#[tokio::test]
async fn caller_supplied_lease_and_token_never_reach_the_upstream() {
    let gw = gateway(vec![helpdesk("helpdesk", "leased", &[], "")]);
    let a = gw
        .gateway
        .register(RegistrationSpec::new("agent-a").grant("helpdesk.open_case"))
        .await
        .unwrap();
    let b = gw
        .gateway
        .register(RegistrationSpec::new("agent-b").grant("helpdesk.list_notes"))
        .await
        .unwrap();
    assert_eq!(a.tools(), vec!["helpdesk.open_case"]);
    let (mut ca, mut cb) = (client(&a).await, client(&b).await);
    let own = cb.call("helpdesk.list_notes", json!({})).await;
    let b_lease = own["result"]["_meta"]["lease"].clone();
    assert!(b_lease.as_str().unwrap().starts_with("lease-"));

    // A tries to act under B's lease and smuggles its token in _meta.
    let reply = ca
        .request(
            "tools/call",
            json!({"name": "helpdesk.open_case", "arguments": {"title": "x"},
                   "_meta": {"io.gatehouse/lease": b_lease, "io.gatehouse.test/echo_meta": true,
                             "progressToken": "p1", "leak": a.token()}}),
        )
        .await;
    let seen = &reply["result"]["_meta"]["io.gatehouse.test/seen_meta"];
    let a_lease = &seen["io.gatehouse/lease"];
    assert!(a_lease.as_str().unwrap().starts_with("lease-"));
    assert_ne!(a_lease, &b_lease, "caller-supplied lease was forwarded");
    assert!(
        seen.get("leak").is_none(),
        "the client's token went upstream"
    );
    assert!(!seen.to_string().contains(a.token()));
    // B's lease still has no case: A's open_case did not land on it.
    let own = cb.call("helpdesk.list_notes", json!({})).await;
    assert_eq!(own["result"]["isError"], true);
    gw.gateway.shutdown().await;
}

#[tokio::test]
async fn leased_without_the_extension_falls_back_to_per_registration() {
    let gw = gateway(vec![helpdesk("helpdesk", "leased", &["--no-lease"], "")]);
    let a = gw
        .gateway
        .register(RegistrationSpec::new("agent-a").grant("helpdesk.*"))
        .await
        .unwrap();
    let b = gw
        .gateway
        .register(RegistrationSpec::new("agent-b").grant("helpdesk.*"))
        .await
        .unwrap();
    assert_eq!(
        gatehouse::testing::pool(&gw.gateway).effective_sharing("helpdesk"),
        Some(Sharing::PerRegistration)
    );
    let (mut ca, mut cb) = (client(&a).await, client(&b).await);
    ca.call("helpdesk.open_case", json!({"title": "a"})).await;
    cb.call("helpdesk.open_case", json!({"title": "b"})).await;
    ca.call("helpdesk.add_note", json!({"text": "from a"}))
        .await;
    let lb = cb.call("helpdesk.list_notes", json!({})).await;
    assert_eq!(structured(&lb)["notes"], json!([]), "a's note leaked to b");
    let la = ca.call("helpdesk.list_notes", json!({})).await;
    assert_eq!(structured(&la)["notes"], json!(["from a"]));
    assert_eq!(gatehouse::testing::pool(&gw.gateway).pids().len(), 2);

    // Per-registration children die with their registration.
    let pids = gatehouse::testing::pool(&gw.gateway).pids();
    a.release().await;
    b.release().await;
    assert!(wait_until(5, || pids.iter().all(|p| !alive(*p))).await);
    gw.gateway.shutdown().await;
}

/// Captures this thread's tracing output (the test runtime is single-threaded, so the child's
/// forwarded stderr lands here too).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn release_cancels_a_slow_note_before_the_lease_goes() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let gw = gateway(vec![helpdesk(
        "helpdesk",
        "leased",
        &["--slow-ms", "1500"],
        "env = { RUST_LOG = \"info\" }",
    )]);
    let keep = gw
        .gateway
        .register(RegistrationSpec::new("keeper").grant("helpdesk.*"))
        .await
        .unwrap();
    let a = gw
        .gateway
        .register(RegistrationSpec::new("agent-a").grant("helpdesk.*"))
        .await
        .unwrap();
    let mut ca = client(&a).await;
    ca.call("helpdesk.open_case", json!({"title": "t"})).await;
    ca.post(json!({"jsonrpc":"2.0","id":99,"method":"tools/call",
                   "params":{"name":"helpdesk.add_note_slow","arguments":{"text":"late"}}}))
        .await;
    // Wait until the slow call is in flight upstream.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let started = Instant::now();
    a.release().await;
    let release_took = started.elapsed();
    // Give the child time to log, and the slow call time to have finished had it not been cancelled.
    tokio::time::sleep(Duration::from_millis(1800)).await;

    let text = log.text();
    // The helpdesk logs each notification as its reader takes it, so the log shows the order
    // in which the upstream received them.
    let cancelled = text
        .find("cancellation received")
        .expect("no notifications/cancelled reached the upstream");
    assert!(
        text[cancelled..]
            .lines()
            .next()
            .unwrap()
            .contains("found=true"),
        "{text}"
    );
    assert!(
        text.contains("add_note_slow cancelled; no note written"),
        "the slow call was not cancelled upstream"
    );
    let released = text
        .find("lease released")
        .expect("the lease was not released");
    assert!(
        cancelled < released,
        "lease released before the call was cancelled:\n{text}"
    );
    assert!(
        !text.contains("note added"),
        "a note was written after release"
    );
    let rec = gw
        .calls()
        .into_iter()
        .find(|r| r.tool.as_deref() == Some("helpdesk.add_note_slow"))
        .unwrap();
    assert_eq!(rec.outcome.as_deref(), Some("cancelled"));
    assert!(rec.upstream_request_id.is_some());
    // The shared connection stays for the other registration.
    assert_eq!(gatehouse::testing::pool(&gw.gateway).pids().len(), 1);
    eprintln!("release took {release_took:?}");
    assert!(release_took < Duration::from_secs(3));
    keep.release().await;
    gw.gateway.shutdown().await;
}

#[tokio::test]
async fn killed_child_fails_the_call_at_once_and_the_next_call_respawns() {
    let gw = gateway(vec![helpdesk(
        "helpdesk",
        "per_registration",
        &["--slow-ms", "20000"],
        "",
    )]);
    let a = gw
        .gateway
        .register(RegistrationSpec::new("agent-a").grant("helpdesk.*"))
        .await
        .unwrap();
    let mut ca = client(&a).await;
    ca.call("helpdesk.open_case", json!({"title": "t"})).await;
    let pid = gatehouse::testing::pool(&gw.gateway).pids()[0];
    ca.post(json!({"jsonrpc":"2.0","id":77,"method":"tools/call",
                   "params":{"name":"helpdesk.add_note_slow","arguments":{"text":"x"}}}))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = Instant::now();
    killpg(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    let reply = ca.next_message(5).await.expect("the call hung");
    let failed_after = killed.elapsed();
    eprintln!("call failed {failed_after:?} after the kill");
    assert_eq!(reply["id"], 77);
    assert!(reply["error"]["message"]
        .as_str()
        .unwrap()
        .contains("upstream"));
    assert!(failed_after < Duration::from_secs(2));

    // The next call works on a new epoch of the same slot (ids continue).
    let again = ca
        .call("helpdesk.open_case", json!({"title": "again"}))
        .await;
    assert_eq!(again["result"]["isError"], false, "{again}");
    let calls = gw.calls();
    let failed = calls
        .iter()
        .find(|r| r.tool.as_deref() == Some("helpdesk.add_note_slow"))
        .unwrap();
    assert_eq!(failed.outcome.as_deref(), Some("upstream_failed"));
    assert_eq!(failed.epoch, Some(1));
    let last = calls.last().unwrap();
    assert_eq!(last.outcome.as_deref(), Some("ok"));
    assert_eq!(last.epoch, Some(2));
    assert!(last.upstream_request_id > failed.upstream_request_id);
    assert!(
        wait_until(5, || gw
            .audit()
            .iter()
            .any(|r| r.event == "upstream_exited"
                && r.pid == Some(pid)
                && r.epoch == Some(1)))
        .await
    );
    a.release().await;
    gw.gateway.shutdown().await;
}

#[tokio::test]
async fn call_timeout_fails_the_call_and_cancels_upstream() {
    let gw = gateway(vec![helpdesk(
        "helpdesk",
        "shared",
        &["--slow-ms", "5000"],
        "",
    )
    .tap_timeout()]);
    let a = gw
        .gateway
        .register(RegistrationSpec::new("agent-a").grant("helpdesk.*"))
        .await
        .unwrap();
    let mut ca = client(&a).await;
    ca.call("helpdesk.open_case", json!({"title": "t"})).await;
    let started = Instant::now();
    let reply = ca
        .call("helpdesk.add_note_slow", json!({"text": "x"}))
        .await;
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(reply["result"]["isError"], true);
    let rec = gw.calls().pop().unwrap();
    assert_eq!(rec.outcome.as_deref(), Some("timeout"));
    // The connection is still usable: the upstream was told to stop, not killed.
    let list = ca.call("helpdesk.list_notes", json!({})).await;
    assert_eq!(structured(&list)["notes"], json!([]));
    assert_eq!(gw.calls().last().unwrap().epoch, Some(1));
    gw.gateway.shutdown().await;
}

trait TapTimeout {
    fn tap_timeout(self) -> Self;
}

impl TapTimeout for UpstreamConfig {
    /// `call_timeout_s` given twice in TOML is an error, so set it here.
    fn tap_timeout(mut self) -> Self {
        self.call_timeout_s = 1;
        self
    }
}

#[tokio::test]
async fn no_child_process_remains_after_everything_is_released() {
    // "forked" is launched npx-style: a shell that leaves a grandchild behind and execs the server.
    let launcher = format!(
        "sleep 1000 & exec {} demo-upstream",
        env!("CARGO_BIN_EXE_gatehouse")
    );
    let forked: UpstreamConfig = toml::from_str(&format!(
        "id = \"forked\"\ncommand = \"sh\"\nargs = [\"-c\", \"{launcher}\"]\n"
    ))
    .unwrap();
    let gw = gateway(vec![
        helpdesk("desk", "per_registration", &[], ""),
        helpdesk("shared_desk", "leased", &[], ""),
        forked,
    ]);
    let mut regs = Vec::new();
    for i in 0..3 {
        let r = gw
            .gateway
            .register(
                RegistrationSpec::new(format!("agent-{i}"))
                    .grant("desk.*")
                    .grant("shared_desk.*")
                    .grant("forked.*"),
            )
            .await
            .unwrap();
        let mut c = client(&r).await;
        c.call("desk.open_case", json!({"title": "t"})).await;
        c.call("shared_desk.open_case", json!({"title": "t"})).await;
        c.call("forked.open_case", json!({"title": "t"})).await;
        regs.push(r);
    }
    assert_eq!(gatehouse::testing::pool(&gw.gateway).pids().len(), 7);
    for r in regs {
        r.release().await;
    }
    // Per-registration children are gone with their registrations; the leased one stays warm.
    assert_eq!(gatehouse::testing::pool(&gw.gateway).pids().len(), 1);
    gw.gateway.shutdown().await;
    // Every child led its own process group: no member of any group (grandchildren included) is left.
    let pids = spawned_pids(&gw);
    assert!(pids.len() >= 7, "{pids:?}");
    let group_alive =
        |p: &u32| killpg(Pid::from_raw(*p as i32), None::<Signal>) != Err(Errno::ESRCH);
    assert!(
        wait_until(5, || !pids.iter().any(group_alive)).await,
        "process groups left: {:?}",
        pids.iter().filter(|p| group_alive(p)).collect::<Vec<_>>()
    );
    assert!(gatehouse::testing::pool(&gw.gateway).pids().is_empty());
}

#[tokio::test]
async fn idle_connections_are_evicted_but_never_with_an_open_lease_or_a_call() {
    let gw = gateway(vec![
        helpdesk("plain", "shared", &["--slow-ms", "1000"], ""),
        helpdesk("leasing", "leased", &[], ""),
    ]);
    let pool = gatehouse::testing::pool(&gw.gateway).clone();
    let a = gw
        .gateway
        .register(
            RegistrationSpec::new("agent-a")
                .grant("plain.*")
                .grant("leasing.*"),
        )
        .await
        .unwrap();
    let mut ca = client(&a).await;
    ca.call("leasing.open_case", json!({"title": "t"})).await;
    ca.call("plain.open_case", json!({"title": "t"})).await;
    assert_eq!(pool.pids().len(), 2);
    let later = Instant::now() + Duration::from_secs(601);
    // Not yet idle for 10 minutes (the default): nothing is evicted.
    assert_eq!(pool.evict_idle(Instant::now()).await, 0);
    // A call in flight protects "plain".
    ca.post(json!({"jsonrpc":"2.0","id":5,"method":"tools/call",
                   "params":{"name":"plain.add_note_slow","arguments":{"text":"x"}}}))
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(pool.evict_idle(later).await, 0);
    let reply = ca.next_message(5).await.unwrap();
    assert_eq!(reply["id"], 5);
    // Idle now: "plain" goes; "leasing" stays because agent-a holds a lease on it.
    let later = Instant::now() + Duration::from_secs(601);
    assert_eq!(pool.evict_idle(later).await, 1);
    assert_eq!(pool.pids().len(), 1);
    assert!(
        wait_until(5, || gw.audit().iter().any(|r| r.event
            == "upstream_killed"
            && r.upstream.as_deref() == Some("plain")))
        .await
    );
    // The next call on the evicted upstream respawns it.
    let r = ca.call("plain.list_notes", json!({})).await;
    assert!(r.get("result").is_some());
    assert_eq!(gw.calls().last().unwrap().epoch, Some(2));
    // Once the lease is released, the leased connection is evictable too.
    a.release().await;
    let later = Instant::now() + Duration::from_secs(601);
    assert_eq!(pool.evict_idle(later).await, 2);
    assert!(pool.pids().is_empty());
    gw.gateway.shutdown().await;
}

#[tokio::test]
async fn idle_reaper_evicts_on_its_own() {
    let gw = gateway(vec![helpdesk("plain", "shared", &[], "idle_timeout_s = 1")]);
    let a = gw
        .gateway
        .register(RegistrationSpec::new("agent-a").grant("plain.*"))
        .await
        .unwrap();
    let pid = gatehouse::testing::pool(&gw.gateway).pids()[0];
    let started = Instant::now();
    assert!(
        wait_until(5, || !alive(pid)).await,
        "idle child not evicted"
    );
    eprintln!("idle child evicted after {:?}", started.elapsed());
    assert!(started.elapsed() >= Duration::from_millis(900));
    a.release().await;
    gw.gateway.shutdown().await;
}

#[tokio::test]
async fn unknown_upstream_or_unmatched_grant_is_a_registration_error() {
    let gw = gateway(vec![helpdesk("helpdesk", "shared", &[], "")]);
    let e = gw
        .gateway
        .register(RegistrationSpec::new("a").grant("nosuch.tool"))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"nosuch\" is not a configured upstream"), "{e}");
    let e = gw
        .gateway
        .register(RegistrationSpec::new("a").grant("helpdesk.nope*"))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("upstream \"helpdesk\" has no tool"), "{e}");
    gw.gateway.shutdown().await;
}

#[tokio::test]
async fn renamed_tools_are_seen_under_their_new_name() {
    let gw = gateway(vec![helpdesk(
        "helpdesk",
        "shared",
        &[],
        "rename = { open_case = \"new_ticket\" }",
    )]);
    let a = gw
        .gateway
        .register(RegistrationSpec::new("a").grant("helpdesk.new_ticket"))
        .await
        .unwrap();
    assert_eq!(a.tools(), vec!["helpdesk.new_ticket"]);
    let mut ca = client(&a).await;
    let r = ca.call("helpdesk.new_ticket", json!({"title": "t"})).await;
    assert!(
        r["result"]["structuredContent"]["case_id"]
            .as_str()
            .unwrap()
            .starts_with("case-"),
        "{r}"
    );
    gw.gateway.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// A real upstream written by others
// ---------------------------------------------------------------------------------------------

fn everything() -> UpstreamConfig {
    common::everything("everything", "shared", 30, "")
}

#[tokio::test]
async fn server_everything_echo_progress_and_cancel() {
    let gw = gateway(vec![everything()]);
    let a = gw
        .gateway
        .register(
            RegistrationSpec::new("a")
                .grant("everything.echo")
                .grant("everything.trigger-long-running-operation"),
        )
        .await
        .unwrap();
    let mut ca = client(&a).await;
    let r = ca.call("everything.echo", json!({"message": "hi"})).await;
    assert!(text_of(&r).contains("hi"), "{r}");

    // Progress reaches the caller with its own token.
    let (reply, notes) = ca
        .request_with_notes(
            "tools/call",
            json!({"name": "everything.trigger-long-running-operation",
                   "arguments": {"duration": 0.6, "steps": 3},
                   "_meta": {"progressToken": "tok-1"}}),
        )
        .await;
    assert!(text_of(&reply).contains("completed"), "{reply}");
    let progress: Vec<&Value> = notes
        .iter()
        .filter(|n| n["method"] == "notifications/progress")
        .collect();
    assert_eq!(progress.len(), 3, "{notes:?}");
    assert!(progress
        .iter()
        .all(|n| n["params"]["progressToken"] == "tok-1"));

    // A long call cancelled by the client: no reply, audited as cancelled, connection reusable.
    ca.post(json!({"jsonrpc":"2.0","id":500,"method":"tools/call",
                   "params":{"name":"everything.trigger-long-running-operation",
                             "arguments":{"duration": 30, "steps": 3}}}))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    ca.notify(
        "notifications/cancelled",
        json!({"requestId": 500, "reason": "test"}),
    )
    .await;
    assert!(
        wait_until(5, || gw
            .calls()
            .iter()
            .any(|r| r.outcome.as_deref() == Some("cancelled")))
        .await
    );
    let r = ca
        .call("everything.echo", json!({"message": "after"}))
        .await;
    assert!(text_of(&r).contains("after"), "{r}");
    assert!(
        ca.next_message(1).await.is_none(),
        "a reply to the cancelled call arrived"
    );
    gw.gateway.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// Server → client requests
// ---------------------------------------------------------------------------------------------

fn mock(id: &str) -> UpstreamConfig {
    let script = format!(
        "{}/tests/fixtures/sampling_server.py",
        env!("CARGO_MANIFEST_DIR")
    );
    toml::from_str(&format!(
        "id = \"{id}\"\ncommand = \"python3\"\nargs = [\"{script}\"]\nsharing = \"shared\"\ncall_timeout_s = 10\n"
    ))
    .unwrap()
}

#[tokio::test]
async fn server_requests_reach_the_one_session_they_belong_to_else_are_refused() {
    let gw = gateway(vec![mock("mock")]);
    let a = gw
        .gateway
        .register(RegistrationSpec::new("a").grant("mock.*"))
        .await
        .unwrap();
    // A client that did not declare `sampling` is not asked (tests/client_caps.rs).
    let mut ca = SseClient::connect(&a.sse_url(), a.token()).await;
    ca.initialize_with(json!({"sampling": {}})).await;
    ca.post(json!({"jsonrpc":"2.0","id":1,"method":"tools/call",
                   "params":{"name":"mock.sample","arguments":{}}}))
        .await;
    // The upstream's sampling request arrives on this session's stream under a gateway id.
    let req = ca.next_message(5).await.unwrap();
    assert_eq!(req["method"], "sampling/createMessage", "{req}");
    let down_id = req["id"].as_str().unwrap().to_string();
    assert!(down_id.starts_with("gatehouse-"), "{req}");
    let resp = ca
        .post(json!({"jsonrpc":"2.0","id":down_id,
                     "result":{"role":"assistant","content":{"type":"text","text":"hi"}}}))
        .await;
    assert_eq!(resp.status(), 202);
    let reply = ca.next_message(5).await.unwrap();
    assert_eq!(reply["id"], 1);
    let answer = &reply["result"]["answer"];
    assert_eq!(
        answer["id"], "srv-sample-1",
        "the upstream got its own id back"
    );
    assert!(!answer.to_string().contains("gatehouse-"), "{answer}");
    assert_eq!(answer["result"]["content"]["text"], "hi");

    // With two calls pending on the stdio connection the request cannot be attributed: refused.
    ca.post(json!({"jsonrpc":"2.0","id":2,"method":"tools/call",
                   "params":{"name":"mock.hang","arguments":{}}}))
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    ca.post(json!({"jsonrpc":"2.0","id":3,"method":"tools/call",
                   "params":{"name":"mock.sample","arguments":{}}}))
        .await;
    let reply = ca.next_message(5).await.unwrap();
    assert_eq!(reply["id"], 3, "{reply}");
    assert_eq!(
        reply["result"]["answer"]["error"]["code"], -32603,
        "{reply}"
    );
    ca.notify("notifications/cancelled", json!({"requestId": 2}))
        .await;
    gw.gateway.shutdown().await;
}

#[tokio::test]
async fn tools_list_changed_refreshes_the_catalog_and_reaches_granting_sessions_only() {
    // `follow`: the registration takes the changed definition of `mock.change`, so its list
    // changed and it is told (a registration whose list did not change is not: tests/pins.rs).
    let mut up = mock("mock");
    up.on_tool_change = gatehouse::config::OnToolChange::Follow;
    let gw = gateway(vec![up]);
    let a = gw
        .gateway
        .register(RegistrationSpec::new("a").grant("mock.*"))
        .await
        .unwrap();
    let b = gw
        .gateway
        .register(RegistrationSpec::new("b").with_tool(common::echo_tool("local", "b")))
        .await
        .unwrap();
    let (mut ca, mut cb) = (client(&a).await, client(&b).await);
    let (reply, notes) = ca
        .request_with_notes(
            "tools/call",
            json!({"name": "mock.change", "arguments": {}}),
        )
        .await;
    assert!(reply.get("result").is_some(), "{reply}");
    let is_changed = |m: &Value| m["method"] == "notifications/tools/list_changed";
    let mut seen = notes.iter().any(is_changed);
    while !seen {
        match ca.next_message(3).await {
            Some(m) => seen = is_changed(&m),
            None => break,
        }
    }
    assert!(seen, "list_changed not forwarded to the granting session");
    // Its list: the new definition, and no `extra` (its surface was fixed at creation, even
    // though `mock.*` now matches it).
    let listed = ca.request("tools/list", json!({})).await;
    let tools = listed["result"]["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["mock.change", "mock.hang", "mock.sample"],
        "{listed}"
    );
    assert_eq!(tools[0]["description"], "changed", "{listed}");
    assert!(
        cb.next_message(1).await.is_none(),
        "b does not grant mock tools"
    );
    // The refreshed catalog serves the next registration.
    let deadline = Instant::now() + Duration::from_secs(5);
    let c = loop {
        match gw
            .gateway
            .register(RegistrationSpec::new("c").grant("mock.extra"))
            .await
        {
            Ok(c) => break c,
            Err(e) if Instant::now() > deadline => panic!("catalog not refreshed: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    assert_eq!(c.tools(), vec!["mock.extra"]);
    gw.gateway.shutdown().await;
}

#[tokio::test]
async fn closing_the_sse_session_cancels_its_upstream_call() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let gw = gateway(vec![helpdesk(
        "helpdesk",
        "shared",
        &["--slow-ms", "20000"],
        "env = { RUST_LOG = \"info\" }",
    )]);
    let a = gw
        .gateway
        .register(RegistrationSpec::new("a").grant("helpdesk.*"))
        .await
        .unwrap();
    let mut ca = client(&a).await;
    ca.call("helpdesk.open_case", json!({"title": "t"})).await;
    ca.post(json!({"jsonrpc":"2.0","id":9,"method":"tools/call",
                   "params":{"name":"helpdesk.add_note_slow","arguments":{"text":"x"}}}))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(ca); // the client goes away: its SSE stream closes, and with it the session
    assert!(
        wait_until(5, || log
            .text()
            .contains("add_note_slow cancelled; no note written"))
        .await,
        "the upstream call outlived its session"
    );
    let rec = gw
        .calls()
        .into_iter()
        .find(|r| r.tool.as_deref() == Some("helpdesk.add_note_slow"))
        .unwrap();
    assert_eq!(rec.outcome.as_deref(), Some("cancelled"));
    a.release().await;
    gw.gateway.shutdown().await;
}

/// A call cut off by its registration's `call_timeout_s` (the gateway's own timeout, shorter
/// than the upstream's) still names its upstream request id and epoch in its audit record.
#[tokio::test]
async fn a_call_the_gateway_times_out_keeps_its_upstream_ids_in_the_audit() {
    let gw = gateway(vec![helpdesk("helpdesk", "per_registration", &[], "")]);
    let a = gw
        .gateway
        .register(
            RegistrationSpec::new("a")
                .grant("helpdesk.*")
                .limits(gatehouse::Limits {
                    call_timeout_s: Some(0.5),
                    ..Default::default()
                }),
        )
        .await
        .unwrap();
    let mut c = client(&a).await;
    c.call("helpdesk.open_case", json!({"title": "t"})).await;
    let r = c.call("helpdesk.add_note_slow", json!({"text": "x"})).await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(text_of(&r).contains("call_timeout_s"), "{r}");
    let rec = gw
        .calls()
        .into_iter()
        .find(|r| r.tool.as_deref() == Some("helpdesk.add_note_slow"))
        .unwrap();
    assert_eq!(rec.outcome.as_deref(), Some("timeout"), "{rec:?}");
    assert!(rec.upstream_request_id.is_some_and(|i| i > 0), "{rec:?}");
    assert_eq!(rec.epoch, Some(1), "{rec:?}");
}
