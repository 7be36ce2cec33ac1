//! Issue 18 item 4: client capabilities declared upstream. Connections a registration owns
//! (`per_registration`, a lease) declare `sampling`, `elicitation` and `roots`; `shared` ones
//! none. A server → client request goes to the call's session, or outside a call to a session
//! of the owning registration (or lease holder) whose client declared the capability; never
//! to another registration's session. `roots/list` is answered from the registration's roots
//! when the harness set them. Real sockets; the stdlib fixture `tests/fixtures/asker_server.py`
//! asks outside any call, and the real server-everything is driven by the official Python SDK
//! (`tests/peers/py_client.py`, tests/peers/.venv) over legacy SSE and Streamable HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use gatehouse::config::UpstreamConfig;
use gatehouse::{Registration, RegistrationSpec, Root};
use serde_json::{json, Value};

const ALL_CAPS: &str = r#"{"sampling":{},"elicitation":{},"roots":{}}"#;

fn all_caps() -> Value {
    serde_json::from_str(ALL_CAPS).unwrap()
}

fn asker(id: &str, sharing: &str, lease: bool, extra: &str) -> UpstreamConfig {
    let script = repo_root().join("tests/fixtures/asker_server.py");
    let args = if lease {
        format!("[{:?}, \"--lease\"]", script.display().to_string())
    } else {
        format!("[{:?}]", script.display().to_string())
    };
    toml::from_str(&format!(
        "id = \"{id}\"\ncommand = \"python3\"\nargs = {args}\nsharing = \"{sharing}\"\ncall_timeout_s = 10\n{extra}"
    ))
    .unwrap()
}

fn gateway(upstreams: Vec<UpstreamConfig>) -> TestGateway {
    TestGateway::with(|c| {
        c.audit.fsync = gatehouse::config::FsyncPolicy::Never;
        c.upstreams = upstreams;
    })
}

async fn register(tg: &TestGateway, spec: RegistrationSpec) -> Registration {
    tg.gateway.register(spec).await.unwrap()
}

async fn session(reg: &Registration, caps: Value) -> SseClient {
    let mut c = SseClient::connect(&reg.sse_url(), reg.token()).await;
    c.initialize_with(caps).await;
    c
}

fn structured(reply: &Value) -> &Value {
    &reply["result"]["structuredContent"]
}

/// Messages on a stream within `secs`.
async fn drain(c: &mut SseClient, secs: u64) -> Vec<Value> {
    let mut out = Vec::new();
    while let Some(m) = c.next_message(secs).await {
        out.push(m);
    }
    out
}

fn is_request(m: &Value) -> bool {
    m.get("method").is_some() && m.get("id").is_some()
}

/// `ask {method}` on `upstream`: the call answers at once, then the server asks, outside it.
/// The request may reach this stream before the call's reply (which waits for its audit
/// write): then it is returned.
async fn ask(c: &mut SseClient, upstream: &str, method: &str) -> Option<Value> {
    let (r, notes) = c
        .request_with_notes(
            "tools/call",
            json!({"name": format!("{upstream}.ask"), "arguments": {"method": method}}),
        )
        .await;
    assert_eq!(structured(&r)["asked"], method, "{r}");
    notes.into_iter().find(is_request)
}

/// `ask`, then the request on this stream (within 5 s).
async fn ask_here(c: &mut SseClient, upstream: &str, method: &str) -> Option<Value> {
    match ask(c, upstream, method).await {
        Some(req) => Some(req),
        None => next_request(c, 5).await,
    }
}

/// The next server → client request on a stream (none within `secs`: None).
async fn next_request(c: &mut SseClient, secs: u64) -> Option<Value> {
    while let Some(m) = c.next_message(secs).await {
        if is_request(&m) {
            return Some(m);
        }
    }
    None
}

/// What the server got back so far (waits for `n` answers, 5 s at most).
async fn answers(c: &mut SseClient, upstream: &str, n: usize) -> Vec<Value> {
    let r = c
        .call(&format!("{upstream}.answers"), json!({"n": n}))
        .await;
    structured(&r)["answers"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_connections_declare_client_capabilities_shared_ones_only_the_apps_extension() {
    let tg = gateway(vec![
        asker("own", "per_registration", false, ""),
        asker("lease", "leased", true, ""),
        asker("pub", "shared", false, ""),
        asker(
            "narrow",
            "per_registration",
            false,
            "client_capabilities = [\"roots\"]\n",
        ),
    ]);
    let a = register(
        &tg,
        RegistrationSpec::new("a")
            .grant("own.*")
            .grant("lease.*")
            .grant("pub.*")
            .grant("narrow.*"),
    )
    .await;
    let mut c = session(&a, all_caps()).await;
    // Every connection also declares MCP Apps (the gateway passes views through: docs/apps.md).
    let ui = json!({"io.modelcontextprotocol/ui": {"mimeTypes": ["text/html;profile=mcp-app"]}});
    let declared = json!({"sampling": {}, "elicitation": {}, "roots": {"listChanged": true},
        "extensions": ui});
    for (up, want) in [
        ("own", declared.clone()),
        ("lease", declared),
        ("pub", json!({ "extensions": ui })),
        (
            "narrow",
            json!({"roots": {"listChanged": true}, "extensions": ui}),
        ),
    ] {
        let r = c.call(&format!("{up}.caps"), json!({})).await;
        assert_eq!(structured(&r)["capabilities"], want, "{up}: {r}");
    }
    // And the configuration refuses what a shared connection could not route.
    let config = gatehouse::Config {
        upstreams: vec![asker(
            "pub",
            "shared",
            false,
            "client_capabilities = [\"sampling\"]\n",
        )],
        ..Default::default()
    };
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("shared"), "{err}");
    tg.gateway.shutdown().await;
}

/// Outside a call, on a `per_registration` connection: the owner's session that declared the
/// capability gets the request (the most recently active of them), another registration's
/// session never; no such session: refused at once with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_outside_a_call_reach_only_the_owners_session_that_declared_the_capability() {
    let tg = gateway(vec![asker("own", "per_registration", false, "")]);
    let a = register(&tg, RegistrationSpec::new("a").grant("own.*")).await;
    let b = register(&tg, RegistrationSpec::new("b").grant("own.*")).await;
    let mut a_roots = session(&a, json!({"roots": {}})).await; // declares roots only
    let mut a_all = session(&a, all_caps()).await;
    let mut b_all = session(&b, all_caps()).await;
    // B's connection exists too (its own process), and B's session listens throughout.
    let req = ask_here(&mut b_all, "own", "roots/list")
        .await
        .expect("B's own roots/list");
    let b_id = req["id"].clone();
    b_all
        .post(json!({"jsonrpc":"2.0","id":b_id,"result":{"roots":[{"uri":"file:///b"}]}}))
        .await;
    assert_eq!(
        answers(&mut b_all, "own", 1).await[0]["result"]["roots"][0]["uri"],
        "file:///b"
    );

    // A's sampling: only A's session that declared sampling is asked.
    let early = ask(&mut a_roots, "own", "sampling/createMessage").await;
    assert!(
        early.is_none(),
        "sampling reached the session that did not declare it: {early:?}"
    );
    let req = next_request(&mut a_all, 5)
        .await
        .expect("sampling reaches A's session that declared it");
    assert_eq!(req["method"], "sampling/createMessage", "{req}");
    assert!(
        req["id"].as_str().unwrap().starts_with("gatehouse-"),
        "{req}"
    );
    a_all
        .post(json!({"jsonrpc":"2.0","id":req["id"],
                     "result":{"role":"assistant","content":{"type":"text","text":"from A"},"model":"m"}}))
        .await;
    let got = answers(&mut a_all, "own", 1).await;
    assert_eq!(got[0]["result"]["content"]["text"], "from A", "{got:?}");
    assert_eq!(
        got[0]["id"], "ask-1",
        "the server got its own id back: {got:?}"
    );

    // A's roots/list: the most recently active session that declared roots (a_roots now).
    let req = ask_here(&mut a_roots, "own", "roots/list")
        .await
        .expect("roots/list to A");
    assert_eq!(req["method"], "roots/list", "{req}");
    a_roots
        .post(json!({"jsonrpc":"2.0","id":req["id"],"result":{"roots":[{"uri":"file:///a"}]}}))
        .await;
    let got = answers(&mut a_roots, "own", 2).await;
    assert_eq!(got[1]["result"]["roots"][0]["uri"], "file:///a", "{got:?}");

    // A's elicitation while A's only elicitation-capable session is gone: refused at once.
    drop(a_all);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let early = ask(&mut a_roots, "own", "elicitation/create").await;
    assert!(early.is_none(), "{early:?}");
    let got = answers(&mut a_roots, "own", 3).await;
    let err = &got[2]["error"];
    assert_eq!(err["code"], -32603, "{got:?}");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("elicitation capability"),
        "{err}"
    );
    // Nothing of A's ever reached B's session; nothing more reached A's roots-only one.
    let on_b = drain(&mut b_all, 1).await;
    assert!(
        on_b.iter()
            .all(|m| m.get("method").is_none() || m.get("id").is_none()),
        "B saw a request: {on_b:?}"
    );
    let on_a = drain(&mut a_roots, 1).await;
    assert!(
        !on_a.iter().any(|m| m["method"] == "sampling/createMessage" || m["method"] == "elicitation/create"),
        "{on_a:?}"
    );
    tg.gateway.shutdown().await;
}

/// A request whose session closes unanswered is refused upstream (at the next request routed),
/// so the server does not wait for an answer that cannot come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_left_unanswered_by_a_closed_session_is_refused_upstream() {
    let tg = gateway(vec![asker("own", "per_registration", false, "")]);
    let c = register(&tg, RegistrationSpec::new("c").grant("own.*")).await;
    let mut c1 = session(&c, json!({"roots": {}})).await;
    let req = ask_here(&mut c1, "own", "roots/list")
        .await
        .expect("c1 asked");
    assert_eq!(req["method"], "roots/list");
    drop(c1); // never answers
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut c2 = session(&c, json!({"roots": {}})).await;
    let req = ask_here(&mut c2, "own", "roots/list")
        .await
        .expect("c2 asked");
    c2.post(json!({"jsonrpc":"2.0","id":req["id"],"result":{"roots":[]}}))
        .await;
    let got = answers(&mut c2, "own", 2).await;
    assert_eq!(got[0]["id"], "ask-1", "{got:?}");
    assert!(
        got[0]["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("closed before answering"),
        "{got:?}"
    );
    assert_eq!(got[1]["result"], json!({"roots": []}), "{got:?}");
    tg.gateway.shutdown().await;
}

/// On a `leased` connection (one process for everyone) the request names the lease of the
/// registration it is for: only that registration's session is asked, and the lease key does
/// not reach the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_requests_go_to_the_lease_holder_only() {
    let tg = gateway(vec![asker("lease", "leased", true, "")]);
    let a = register(&tg, RegistrationSpec::new("a").grant("lease.*")).await;
    let b = register(&tg, RegistrationSpec::new("b").grant("lease.*")).await;
    let ca = session(&a, all_caps()).await;
    let cb = session(&b, all_caps()).await;
    let mut clients = [ca, cb];
    for (i, tag) in [(0, "a"), (1, "b")] {
        let [first, second] = &mut clients;
        let (me, other) = if i == 0 {
            (first, second)
        } else {
            (second, first)
        };
        let req = ask_here(me, "lease", "roots/list")
            .await
            .expect("the lease holder is asked");
        assert_eq!(req["method"], "roots/list", "{req}");
        assert!(
            !req.to_string().contains("io.gatehouse/lease"),
            "the lease key reached the client: {req}"
        );
        let uri = format!("file:///{tag}");
        me.post(json!({"jsonrpc":"2.0","id":req["id"],"result":{"roots":[{"uri":uri}]}}))
            .await;
        assert!(
            next_request(other, 1).await.is_none(),
            "another registration's session was asked"
        );
    }
    let [mut ca, _cb] = clients;
    let got = answers(&mut ca, "lease", 2).await;
    let uris: Vec<&Value> = got
        .iter()
        .map(|g| &g["result"]["roots"][0]["uri"])
        .collect();
    assert_eq!(uris, [&json!("file:///a"), &json!("file:///b")], "{got:?}");
    tg.gateway.shutdown().await;
}

/// A client's `notifications/roots/list_changed` reaches the connections its registration
/// owns (on a leased one naming its lease), never another registration's; not when the
/// harness set the roots, nor from a session that did not declare roots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roots_list_changed_reaches_only_the_registrations_own_connections() {
    let tg = gateway(vec![
        asker("own", "per_registration", false, ""),
        asker("lease", "leased", true, ""),
        asker("pub", "shared", false, ""),
    ]);
    let grants = |n: &str| {
        RegistrationSpec::new(n)
            .grant("own.*")
            .grant("lease.*")
            .grant("pub.*")
    };
    let a = register(&tg, grants("a")).await;
    let b = register(&tg, grants("b")).await;
    let fixed = register(&tg, grants("fixed").roots(vec![Root::new("file:///fixed")])).await;
    let mut ca = session(&a, all_caps()).await;
    let mut cb = session(&b, all_caps()).await;
    let mut cf = session(&fixed, all_caps()).await;
    let a_plain = session(&a, json!({})).await;
    // Each registration's connections exist (a call each), and A's lease is known.
    let mut a_lease = Value::Null;
    for (c, is_a) in [(&mut ca, true), (&mut cb, false), (&mut cf, false)] {
        for up in ["own", "lease", "pub"] {
            let r = c.call(&format!("{up}.caps"), json!({})).await;
            if is_a && up == "lease" {
                a_lease = structured(&r)["lease"].clone();
            }
        }
    }
    assert!(
        a_lease.as_str().is_some_and(|l| l.starts_with("lease-")),
        "{a_lease}"
    );
    a_plain
        .notify("notifications/roots/list_changed", json!({}))
        .await; // did not declare roots
    ca.notify("notifications/roots/list_changed", json!({}))
        .await;
    cf.notify("notifications/roots/list_changed", json!({}))
        .await; // roots set by the harness
    tokio::time::sleep(Duration::from_millis(500)).await;
    let notes = |r: Value| structured(&r)["notes"].as_array().cloned().unwrap();
    let own_a = notes(ca.call("own.notes", json!({})).await);
    assert_eq!(own_a, [json!({})], "A's own connection: {own_a:?}");
    let leased = notes(ca.call("lease.notes", json!({})).await);
    assert_eq!(
        leased,
        [json!({"_meta": {"io.gatehouse/lease": a_lease}})],
        "{leased:?}"
    );
    let own_b = notes(cb.call("own.notes", json!({})).await);
    assert!(own_b.is_empty(), "B's connection was told: {own_b:?}");
    let own_f = notes(cf.call("own.notes", json!({})).await);
    assert!(
        own_f.is_empty(),
        "a registration with fixed roots passed it on: {own_f:?}"
    );
    let shared = notes(ca.call("pub.notes", json!({})).await);
    assert!(
        shared.is_empty(),
        "a shared connection was told: {shared:?}"
    );
    tg.gateway.shutdown().await;
}

/// Roots the harness set answer `roots/list` (the client is not asked, even if it declared
/// roots); they are validated at registration and shown by the admin API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_roots_answer_roots_list() {
    let tg = gateway(vec![asker("own", "per_registration", false, "")]);
    let a = register(
        &tg,
        RegistrationSpec::new("a").grant("own.*").roots(vec![
            Root::named("file:///work/a", "workspace"),
            Root::new("file:///tmp/a"),
        ]),
    )
    .await;
    let mut c = session(&a, all_caps()).await;
    let early = ask(&mut c, "own", "roots/list").await;
    assert!(early.is_none(), "the client was asked: {early:?}");
    let got = answers(&mut c, "own", 1).await;
    assert_eq!(
        got[0]["result"],
        json!({"roots": [{"uri": "file:///work/a", "name": "workspace"}, {"uri": "file:///tmp/a"}]}),
        "{got:?}"
    );
    assert!(
        next_request(&mut c, 1).await.is_none(),
        "the client was asked"
    );
    let bad = tg
        .gateway
        .register(RegistrationSpec::new("b").roots(vec![Root::new("https://example.com/")]))
        .await
        .unwrap_err()
        .to_string();
    assert!(bad.contains("roots[0].uri"), "{bad}");
    tg.gateway.shutdown().await;
}

// ---------------------------------------------------------------------------------------------
// server-everything through the official Python SDK
// ---------------------------------------------------------------------------------------------

fn everything(id: &str, sharing: &str) -> UpstreamConfig {
    common::everything(id, sharing, 30, "")
}

/// server-everything lists these only when the client side declared the capabilities.
const CAPS_TOOLS: [&str; 3] = [
    "everything.trigger-sampling-request",
    "everything.trigger-elicitation-request",
    "everything.get-roots-list",
];

/// One py_client.py `--batch` run; each cell's `ok` (a failed cell fails the test).
async fn py_batch(cells: Value) -> Vec<Value> {
    common::peers::batch(".venv", "py_client.py", &cells)
        .await
        .iter()
        .map(|c| common::peers::ok("py_client.py", c).clone())
        .collect()
}

/// server-everything as a `per_registration` upstream lists its sampling, elicitation and
/// roots tools through the gateway (as a `shared` one does not: nothing is declared there),
/// and the Python SDK's callbacks answer them over legacy SSE and Streamable HTTP; the server
/// gets the client's answers — the `roots/list` it sends outside any call included (on
/// Streamable HTTP through the session's GET stream). A second registration's session,
/// listening throughout, is never asked A's questions (only its own connection's roots).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_sampling_elicitation_and_roots_through_the_python_sdk() {
    let tg = gateway(vec![
        everything("everything", "per_registration"),
        everything("pub", "shared"),
    ]);
    // One registration per transport, so each has its own connection (and its own roots sync).
    let a = register(
        &tg,
        RegistrationSpec::new("a")
            .grant("everything.*")
            .grant("pub.*"),
    )
    .await;
    let c = register(
        &tg,
        RegistrationSpec::new("c")
            .grant("everything.*")
            .grant("pub.*"),
    )
    .await;
    let b = register(&tg, RegistrationSpec::new("b").grant("everything.*")).await;
    let mut listener_b = session(&b, all_caps()).await;
    // B's own connection to everything: its roots sync is B's alone.
    let r = listener_b
        .call("everything.echo", json!({"message": "b"}))
        .await;
    assert!(text_of(&r).contains("b"), "{r}");

    // echo opens the registration's connection; 350 ms after `initialized` server-everything
    // asks for the roots outside any call (no call is pending then): the SDK's callback must
    // have answered before get-roots-list starts, 1.5 s later.
    let steps = json!([
        {"name": "echo", "tool": "everything.echo", "args": {"message": "x"}, "timeout": 20},
        {"name": "roots", "tool": "everything.get-roots-list", "args": {}, "timeout": 20,
         "sleep_before": 1.5},
        {"name": "sampling", "tool": "everything.trigger-sampling-request",
         "args": {"prompt": "hello", "maxTokens": 5}, "timeout": 20},
        {"name": "elicitation", "tool": "everything.trigger-elicitation-request", "args": {}, "timeout": 20},
    ]);
    let cell = |reg: &Registration, transport: &str, url: String| {
        json!({"transport": transport, "url": url, "token": reg.token(), "timeout": 60,
               "roots": [format!("file:///tmp/gatehouse-caps-{transport}")],
               "elicit": {"name": "Ada Lovelace"},
               "steps": steps})
    };
    let cells = py_batch(json!([
        cell(&a, "sse", a.sse_url()),
        cell(&c, "streamable", c.mcp_url())
    ]))
    .await;
    for out in &cells {
        let transport = out["transport"].as_str().unwrap();
        let tools: Vec<&str> = out["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for t in [
            "everything.trigger-sampling-request",
            "everything.trigger-elicitation-request",
            "everything.get-roots-list",
        ] {
            assert!(tools.contains(&t), "{transport}: {t} not listed: {tools:?}");
        }
        assert!(tools.contains(&"pub.echo"), "{tools:?}");
        assert!(
            !tools.iter().any(|t| t.starts_with("pub.trigger-sampling")
                || t.starts_with("pub.trigger-elicitation")
                || *t == "pub.get-roots-list"),
            "{transport}: a shared upstream declared capabilities: {tools:?}"
        );
        let s = &out["steps"];
        let roots = common::peers::step_text(&s["roots"]);
        assert!(
            roots.contains(&format!("file:///tmp/gatehouse-caps-{transport}")),
            "{transport}: {roots}"
        );
        assert_eq!(
            s["roots"]["ok"]["asked_before"],
            json!(["roots"]),
            "{transport}: the roots request outside a call did not reach the client"
        );
        let sampled = common::peers::step_text(&s["sampling"]);
        assert!(
            sampled.contains("This is a test response from the client"),
            "{transport}: {sampled}"
        );
        let elicited = common::peers::step_text(&s["elicitation"]);
        assert!(
            elicited.contains("Name: Ada Lovelace"),
            "{transport}: {elicited}"
        );
        assert_eq!(
            out["asked"],
            json!(["roots", "sampling", "elicitation"]),
            "{transport}"
        );
    }
    let on_b = drain(&mut listener_b, 1).await;
    assert!(
        !on_b.iter().any(|m| m["method"] == "sampling/createMessage"
            || m["method"] == "elicitation/create"),
        "B was asked A's questions: {on_b:?}"
    );
    // B's own connection asked B's session for its roots (outside any call), not A's client.
    assert!(
        on_b.iter().any(|m| m["method"] == "roots/list"),
        "B's roots sync did not reach B: {on_b:?}"
    );
    tg.gateway.shutdown().await;
}

/// The same server-everything cells (item 4) through the other clients: the SDK 1.x over
/// legacy SSE and Streamable HTTP, fastmcp over legacy SSE and Streamable HTTP (where it
/// settles on 2026-07-28: the requests come to it as MRTR rounds), and mcp-remote over
/// `sse-only`, `http-only` and `http-only --protocol auto` (2026-07-28: mcp-remote turns the
/// MRTR rounds into the server requests its stdio client, this test, answers — item 5's
/// MRTR through mcp-remote). Each cell has its own registration, so its own connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_everything_sampling_elicitation_and_roots_through_sdk1_fastmcp_and_mcp_remote() {
    use common::mcp_remote::{Answers, McpRemote};
    use common::peers::{batch, ok, step_text};
    let tg = gateway(vec![everything("everything", "per_registration")]);
    let mut regs = Vec::new();
    for i in 0..7 {
        regs.push(
            register(
                &tg,
                RegistrationSpec::new(format!("r{i}")).grant("everything.*"),
            )
            .await,
        );
    }
    let steps = json!([
        {"name": "echo", "tool": "everything.echo", "args": {"message": "x"}, "timeout": 20},
        {"name": "roots", "tool": "everything.get-roots-list", "args": {}, "timeout": 20,
         "sleep_before": 1.5},
        {"name": "sampling", "tool": "everything.trigger-sampling-request",
         "args": {"prompt": "hello", "maxTokens": 5}, "timeout": 20},
        {"name": "elicitation", "tool": "everything.trigger-elicitation-request", "args": {}, "timeout": 20},
    ]);
    let cell = |reg: &Registration, transport: &str, url: String, who: &str| {
        json!({"transport": transport, "url": url, "token": reg.token(), "timeout": 60,
               "roots": [format!("file:///tmp/gatehouse-caps-{who}-{transport}")],
               "sampling": format!("sampled by {who}"),
               "elicit": {"name": "Ada Lovelace"},
               "steps": steps})
    };
    let c1 = json!([
        cell(&regs[0], "sse", regs[0].sse_url(), "sdk1"),
        cell(&regs[1], "streamable", regs[1].mcp_url(), "sdk1")
    ]);
    let cf = json!([
        cell(&regs[2], "sse", regs[2].sse_url(), "fastmcp"),
        cell(&regs[3], "streamable", regs[3].mcp_url(), "fastmcp")
    ]);
    let (r1, rf) = tokio::join!(
        batch(".venv-mcp1", "mcp1_client.py", &c1),
        batch(".venv-fastmcp", "fastmcp_client.py", &cf)
    );
    for (who, results) in [("sdk1", &r1), ("fastmcp", &rf)] {
        for (res, transport) in results.iter().zip(["sse", "streamable"]) {
            let what = format!("{who} over {transport}");
            let out = ok(&what, res);
            let tools: Vec<&str> = out["tools"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Value::as_str)
                .collect();
            for t in CAPS_TOOLS {
                assert!(tools.contains(&t), "{what}: {t} not listed: {tools:?}");
            }
            let s = &out["steps"];
            let roots = step_text(&s["roots"]);
            assert!(
                roots.contains(&format!("file:///tmp/gatehouse-caps-{who}-{transport}")),
                "{what}: {roots}"
            );
            // On a session (legacy SSE; the SDK 1.x's Streamable HTTP GET stream) the
            // roots/list sent outside any call reaches the client before get-roots-list; on
            // fastmcp's stateless connection there is no stream outside a call, so the
            // server asks again during get-roots-list, as an MRTR round.
            let stateless = who == "fastmcp" && transport == "streamable";
            assert_eq!(
                s["roots"]["ok"]["asked_before"],
                if stateless {
                    json!([])
                } else {
                    json!(["roots"])
                },
                "{what}"
            );
            let sampled = step_text(&s["sampling"]);
            assert!(
                sampled.contains(&format!("sampled by {who}")),
                "{what}: {sampled}"
            );
            let elicited = step_text(&s["elicitation"]);
            assert!(
                elicited.contains("Name: Ada Lovelace"),
                "{what}: {elicited}"
            );
            assert_eq!(
                out["asked"],
                json!(["roots", "sampling", "elicitation"]),
                "{what}"
            );
        }
    }

    let caps = json!({"sampling": {}, "elicitation": {}, "roots": {"listChanged": true}});
    for (reg, who, url, extra) in [
        (
            &regs[4],
            "mcp-remote sse-only",
            regs[4].sse_url(),
            &["--transport", "sse-only"][..],
        ),
        (
            &regs[5],
            "mcp-remote http-only",
            regs[5].mcp_url(),
            &["--transport", "http-only"][..],
        ),
        (
            &regs[6],
            "mcp-remote --protocol auto",
            regs[6].mcp_url(),
            &["--transport", "http-only", "--protocol", "auto"][..],
        ),
    ] {
        let mut remote = McpRemote::start(&url, reg.token(), extra);
        remote.answers = Answers {
            sampling: Some(format!("sampled by {who}")),
            elicit: Some(json!({"name": "Ada Lovelace"})),
            roots: Some(vec![
                json!({"uri": format!("file:///tmp/{}", reg.id()), "name": "work"}),
            ]),
        };
        remote.initialize(caps.clone(), 30).await;
        let tools = remote.request("tools/list", json!({}), 30).await;
        let names: Vec<&str> = tools["result"]["tools"]
            .as_array()
            .unwrap_or_else(|| panic!("{who}: {tools}"))
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        for t in CAPS_TOOLS {
            assert!(names.contains(&t), "{who}: {t} not listed: {names:?}");
        }
        let call = |name: &str, args: Value| json!({"name": name, "arguments": args});
        let text = |r: &Value| -> String {
            r["result"]["content"]
                .as_array()
                .unwrap_or_else(|| panic!("{who}: {r}"))
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n")
        };
        let echo = remote
            .request(
                "tools/call",
                call("everything.echo", json!({"message": "x"})),
                30,
            )
            .await;
        assert_eq!(text(&echo), "Echo: x", "{who}");
        // Outside any call, server-everything asks for the roots 350 ms after `initialized`:
        // over a session it reaches mcp-remote's stdout; stateless, it cannot (no stream).
        remote.idle(1.5).await;
        let stateless = extra.contains(&"auto");
        assert_eq!(
            remote.asked(),
            if stateless {
                vec![]
            } else {
                vec!["roots/list".to_string()]
            },
            "{who}"
        );
        let roots = remote
            .request(
                "tools/call",
                call("everything.get-roots-list", json!({})),
                30,
            )
            .await;
        assert!(
            text(&roots).contains(&format!("URI: file:///tmp/{}", reg.id())),
            "{who}: {roots}"
        );
        let sampling = remote
            .request(
                "tools/call",
                call(
                    "everything.trigger-sampling-request",
                    json!({"prompt": "hello", "maxTokens": 5}),
                ),
                30,
            )
            .await;
        assert!(
            text(&sampling).contains(&format!("sampled by {who}")),
            "{who}: {sampling}"
        );
        let elicitation = remote
            .request(
                "tools/call",
                call("everything.trigger-elicitation-request", json!({})),
                30,
            )
            .await;
        assert!(
            text(&elicitation).contains("Name: Ada Lovelace"),
            "{who}: {elicitation}"
        );
        assert_eq!(
            remote.asked(),
            vec!["roots/list", "sampling/createMessage", "elicitation/create"],
            "{who}"
        );
        remote.stop().await;
    }
    // Each cell went over the transport it names: --protocol auto really was stateless, so its
    // answers came through MRTR rounds (input_required + the retry), bridged by mcp-remote.
    let by_reg = |i: usize| -> Vec<String> {
        tg.calls()
            .iter()
            .filter(|r| r.registration_id.as_deref() == Some(regs[i].id()))
            .map(|r| r.transport.clone().unwrap().into())
            .collect()
    };
    for (i, want) in [
        (0, "sse"),
        (1, "streamable_http"),
        (2, "sse"),
        (3, "stateless"),
        (4, "sse"),
        (5, "streamable_http"),
        (6, "stateless"),
    ] {
        let got = by_reg(i);
        assert!(
            got.len() == 4 && got.iter().all(|t| t == want),
            "cell {i}: {got:?}, want {want}"
        );
    }
    tg.gateway.shutdown().await;
}
