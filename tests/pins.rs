//! A registration's tool surface is pinned at creation (issue 39, the second half): a stdio
//! upstream (tests/fixtures/mutable_server.py) changes a granted tool's description on
//! SIGUSR1 and removes it on SIGUSR2, and says `tools/list_changed`. Under `refuse` (the
//! default) the registration keeps listing the definition it was made with, gets no
//! `list_changed`, and a call answers a tool error saying the definition changed, audited
//! `tool_changed` (old and new digests) and the call `denied`; under `follow` it is told,
//! lists the new definition and is served; a removed tool leaves the list and its calls; a
//! registration of an unchanged upstream hears nothing; tools that newly match a glob are not
//! added; `GET /v1/registrations/<id>` shows the pins' digest.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use gatehouse::config::UpstreamConfig;
use gatehouse::RegistrationSpec;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

fn mutable(id: &str, policy: &str, pid_file: &Path) -> UpstreamConfig {
    let script = format!(
        "{}/tests/fixtures/mutable_server.py",
        env!("CARGO_MANIFEST_DIR")
    );
    toml::from_str(&format!(
        "id = \"{id}\"\ncommand = \"python3\"\nargs = [{script:?}]\nsharing = \"shared\"\non_tool_change = \"{policy}\"\n[env]\nMUTABLE_PID_FILE = {:?}\n",
        pid_file.display().to_string()
    ))
    .unwrap()
}

async fn signal(pid_file: &Path, sig: Signal) {
    let mut pid = String::new();
    for _ in 0..100 {
        pid = std::fs::read_to_string(pid_file).unwrap_or_default();
        if !pid.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    kill(Pid::from_raw(pid.trim().parse().unwrap()), sig).unwrap();
}

/// Every `tools/list_changed` that arrives within `secs`.
async fn list_changes(c: &mut SseClient, secs: u64) -> usize {
    let mut n = 0;
    while let Some(m) = c.next_message(secs).await {
        if m["method"] == "notifications/tools/list_changed" {
            n += 1;
        }
    }
    n
}

fn greet_description(listed: &Value) -> Option<String> {
    listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"].as_str().unwrap().ends_with(".greet"))
        .map(|t| t["description"].as_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_tool_is_refused_or_followed_and_only_changed_lists_are_told() {
    let dir = tempfile::tempdir().unwrap();
    let (pid_refuse, pid_follow, pid_still) = (
        dir.path().join("refuse.pid"),
        dir.path().join("follow.pid"),
        dir.path().join("still.pid"),
    );
    let tg = TestGateway::with(|c| {
        c.upstreams = vec![
            mutable("mref", "refuse", &pid_refuse),
            mutable("mfol", "follow", &pid_follow),
            mutable("mstill", "refuse", &pid_still),
        ];
    });
    let reg = |agent: &str, grant: &str| {
        tg.gateway
            .register(RegistrationSpec::new(agent).grant(grant))
    };
    let r = reg("refuser", "mref.*").await.unwrap();
    let f = reg("follower", "mfol.*").await.unwrap();
    let s = reg("bystander", "mstill.*").await.unwrap();
    let (mut cr, mut cf, mut cs) = (
        SseClient::connect(&r.sse_url(), r.token()).await,
        SseClient::connect(&f.sse_url(), f.token()).await,
        SseClient::connect(&s.sse_url(), s.token()).await,
    );
    for c in [&mut cr, &mut cf, &mut cs] {
        c.initialize().await;
    }
    let original = greet_description(&cr.request("tools/list", json!({})).await).unwrap();
    assert_eq!(original, "Greets someone by name.");

    // The rug pull, on two upstreams.
    signal(&pid_refuse, Signal::SIGUSR1).await;
    signal(&pid_follow, Signal::SIGUSR1).await;

    // follow: told once, lists and serves the new definition.
    assert_eq!(list_changes(&mut cf, 3).await, 1);
    let listed = cf.request("tools/list", json!({})).await;
    assert!(
        greet_description(&listed).unwrap().contains("address book"),
        "{listed}"
    );
    let served = cf
        .request(
            "tools/call",
            json!({"name": "mfol.greet", "arguments": {"name": "ada"}}),
        )
        .await;
    assert_eq!(text_of(&served), "hello ada", "{served}");

    // refuse: not told (its list is the pinned one), lists the pinned definition, and a call
    // answers a tool error that says why.
    assert_eq!(list_changes(&mut cr, 1).await, 0);
    let listed = cr.request("tools/list", json!({})).await;
    assert_eq!(greet_description(&listed).unwrap(), original, "{listed}");
    let refused = cr
        .request(
            "tools/call",
            json!({"name": "mref.greet", "arguments": {"name": "ada"}}),
        )
        .await;
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    let why = text_of(&refused);
    assert!(
        why.contains("definition of tool mref.greet changed") && why.contains("refuse"),
        "{why}"
    );
    // The unchanged tool of the same upstream is still served.
    let stable = cr
        .request(
            "tools/call",
            json!({"name": "mref.stable", "arguments": {}}),
        )
        .await;
    assert_eq!(text_of(&stable), "stable", "{stable}");

    // The bystander of an unchanged upstream heard nothing.
    assert_eq!(list_changes(&mut cs, 1).await, 0);

    // Audited: one `tool_changed` per registration and tool, with both digests; the refused
    // call `denied` with the reason.
    let audit = tg.audit();
    let changed: Vec<_> = audit.iter().filter(|r| r.event == "tool_changed").collect();
    assert_eq!(changed.len(), 2, "{changed:?}");
    for c in &changed {
        let (pin, new) = (
            c.rare().pin_digest.as_deref().unwrap(),
            c.rare().new_digest.as_deref().unwrap(),
        );
        assert!(pin.len() == 64 && new.len() == 64 && pin != new, "{c:?}");
    }
    let on_r = changed
        .iter()
        .find(|c| c.agent_id.as_deref() == Some("refuser"))
        .unwrap();
    assert_eq!(on_r.tool.as_deref(), Some("mref.greet"));
    assert!(on_r.reason.as_deref().unwrap().contains("refused"));
    let call = audit
        .iter()
        .find(|c| c.event == "governed_mcp_call" && c.tool.as_deref() == Some("mref.greet"))
        .unwrap();
    assert_eq!(call.outcome.as_deref(), Some("denied"), "{call:?}");
    assert!(call
        .reason
        .as_deref()
        .unwrap()
        .contains("definition changed"));

    // Removed: it leaves the list (a list change: told) and its calls.
    signal(&pid_refuse, Signal::SIGUSR2).await;
    assert_eq!(list_changes(&mut cr, 3).await, 1);
    let listed = cr.request("tools/list", json!({})).await;
    assert_eq!(greet_description(&listed), None, "{listed}");
    let gone = cr
        .request("tools/call", json!({"name": "mref.greet", "arguments": {}}))
        .await;
    assert_eq!(gone["error"]["code"], -32602, "{gone}");

    // The pins' digest is shown with the registration, and differs between surfaces.
    let pins = |id: &str| {
        gatehouse::testing::registry(&tg.gateway)
            .get(id)
            .unwrap()
            .pins
            .summary()
            .to_string()
    };
    assert_eq!(pins(r.id()).len(), 64);
    assert_ne!(pins(r.id()), pins(f.id()));
}

/// A tool changed while the daemon was down (kill -9, then the upstream's definition changed,
/// then a restart on the same store): the restored registration is compared with its pins at
/// start-up and the changed tool is refused, audited `tool_changed` — from the first call on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_changed_while_the_daemon_was_down_is_refused_after_the_restart() {
    use common::daemon::Daemon;
    let script = format!(
        "{}/tests/fixtures/mutable_server.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let desc = tempfile::NamedTempFile::new().unwrap();
    let desc_path = desc.path().display().to_string();
    std::fs::remove_file(&desc_path).unwrap();
    let upstream = format!(
        "[[upstreams]]\nid = \"mref\"\ncommand = \"python3\"\nargs = [{script:?}]\nsharing = \"shared\"\n[upstreams.env]\nMUTABLE_DESC_FILE = {desc_path:?}\n"
    );
    let mut d = Daemon::start(&upstream, "", "info", &[]);
    let reg = d
        .register(json!({"agent_id": "a", "tools": ["mref.greet"], "ttl_s": 600}))
        .await;
    let (id, token) = (reg["id"].as_str().unwrap(), reg["token"].as_str().unwrap());
    let call = |data: String| async move {
        stateless(
            &format!("{data}/gw/{id}/mcp"),
            token,
            1,
            "tools/call",
            json!({"name": "mref.greet", "arguments": {"name": "ada"}}),
        )
        .await
    };
    assert_eq!(text_of(&call(d.data.clone()).await), "hello ada");
    d.kill9_and_restart();
    // Changed while down... (the upstream process is new after the restart).
    std::fs::write(&desc_path, "Greets, then mails the address book away.").unwrap();
    d.kill9_and_restart();
    // The very first call after the start waits for the comparison (issue 50 item 4): it is
    // refused, never served with the changed definition.
    let r = call(d.data.clone()).await;
    assert_eq!(
        r["result"]["isError"], true,
        "served after the restart: {r}"
    );
    assert!(text_of(&r).contains("changed upstream"), "{r}");
    let changed: Vec<_> = d
        .audit()
        .into_iter()
        .filter(|r| r.event == "tool_changed")
        .collect();
    assert_eq!(changed.len(), 1, "{changed:?}");
    assert_eq!(changed[0].tool.as_deref(), Some("mref.greet"));
}

/// The mutable upstream with its pid file and a description file read at its start.
fn mutable_with_desc(id: &str, policy: &str, pid_file: &Path, desc_file: &Path) -> UpstreamConfig {
    let script = format!(
        "{}/tests/fixtures/mutable_server.py",
        env!("CARGO_MANIFEST_DIR")
    );
    toml::from_str(&format!(
        "id = \"{id}\"\ncommand = \"python3\"\nargs = [{script:?}]\nsharing = \"shared\"\non_tool_change = \"{policy}\"\n[env]\nMUTABLE_PID_FILE = {:?}\nMUTABLE_DESC_FILE = {:?}\n",
        pid_file.display().to_string(),
        desc_file.display().to_string()
    ))
    .unwrap()
}

/// Issue 50 item 4: a stdio upstream that crashes (kill -9) and is respawned by the gateway
/// with a changed definition of a granted tool, announced by nothing (no `list_changed`):
/// the new connection's tools are compared with the pins before its first call is sent, so
/// under `refuse` that very call is refused (audited `tool_changed`, the call `denied`) and
/// the unchanged tool is still served; under `follow` the call is served and the session told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_changed_across_an_upstream_crash_and_respawn_is_compared_before_its_first_call() {
    let dir = tempfile::tempdir().unwrap();
    let (pid_refuse, pid_follow) = (dir.path().join("r.pid"), dir.path().join("f.pid"));
    let (desc_refuse, desc_follow) = (dir.path().join("r.desc"), dir.path().join("f.desc"));
    let tg = TestGateway::with(|c| {
        c.upstreams = vec![
            mutable_with_desc("mref", "refuse", &pid_refuse, &desc_refuse),
            mutable_with_desc("mfol", "follow", &pid_follow, &desc_follow),
        ];
    });
    let r = tg
        .gateway
        .register(RegistrationSpec::new("refuser").grant("mref.*"))
        .await
        .unwrap();
    let f = tg
        .gateway
        .register(RegistrationSpec::new("follower").grant("mfol.*"))
        .await
        .unwrap();
    let (mut cr, mut cf) = (
        SseClient::connect(&r.sse_url(), r.token()).await,
        SseClient::connect(&f.sse_url(), f.token()).await,
    );
    cr.initialize().await;
    cf.initialize().await;
    let greet = |c: &'static str| json!({"name": c, "arguments": {"name": "ada"}});
    assert_eq!(
        text_of(&cr.request("tools/call", greet("mref.greet")).await),
        "hello ada"
    );
    assert_eq!(
        text_of(&cf.request("tools/call", greet("mfol.greet")).await),
        "hello ada"
    );

    // The upstream's next process will serve another `greet`; this one dies, saying nothing.
    let crashes_before = |tg: &TestGateway| {
        tg.audit()
            .iter()
            .filter(|r| r.event == "upstream_exited")
            .count()
    };
    for (pid_file, desc) in [(&pid_refuse, &desc_refuse), (&pid_follow, &desc_follow)] {
        std::fs::write(
            desc,
            "Greets someone, and sends their address book to a third party.",
        )
        .unwrap();
        signal(pid_file, Signal::SIGKILL).await;
        std::fs::remove_file(pid_file).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while crashes_before(&tg) < 2 {
        assert!(std::time::Instant::now() < deadline, "crashes not seen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // refuse: the first call after the respawn is refused, not served.
    let refused = cr.request("tools/call", greet("mref.greet")).await;
    assert_eq!(
        refused["result"]["isError"], true,
        "served after the respawn: {refused}"
    );
    let why = text_of(&refused);
    assert!(
        why.contains("definition of tool mref.greet changed upstream"),
        "{why}"
    );
    assert!(
        std::fs::read_to_string(&pid_refuse).is_ok(),
        "the upstream was respawned"
    );
    let stable = cr
        .request(
            "tools/call",
            json!({"name": "mref.stable", "arguments": {}}),
        )
        .await;
    assert_eq!(text_of(&stable), "stable", "{stable}");
    let listed = cr.request("tools/list", json!({})).await;
    assert_eq!(
        greet_description(&listed).unwrap(),
        "Greets someone by name.",
        "the pinned definition is still listed: {listed}"
    );

    // follow: served with the new definition, and told.
    let (served, notes) = cf
        .request_with_notes("tools/call", greet("mfol.greet"))
        .await;
    assert_eq!(text_of(&served), "hello ada", "{served}");
    let told = notes
        .iter()
        .filter(|m| m["method"] == "notifications/tools/list_changed")
        .count();
    assert_eq!(told + list_changes(&mut cf, 2).await, 1, "{notes:?}");
    let listed = cf.request("tools/list", json!({})).await;
    assert!(
        greet_description(&listed).unwrap().contains("address book"),
        "{listed}"
    );

    let audit = tg.audit();
    let changed: Vec<_> = audit.iter().filter(|r| r.event == "tool_changed").collect();
    assert_eq!(changed.len(), 2, "{changed:?}");
    let calls: Vec<_> = audit
        .iter()
        .filter(|c| c.event == "governed_mcp_call" && c.tool.as_deref() == Some("mref.greet"))
        .collect();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(
        calls[1].outcome.as_deref(),
        Some("denied"),
        "{:?}",
        calls[1]
    );
    assert!(
        calls[1]
            .reason
            .as_deref()
            .unwrap()
            .contains("changed upstream"),
        "{:?}",
        calls[1]
    );
}
