//! OAuth toward an upstream (issue 47 item 3), with real parts: a real `gatehouse serve`, a
//! real authorization server (panva's `oidc-provider`, tests/peers/oauth_as.mjs: client
//! credentials, RFC 8707 resource indicators with JWT access tokens, RFC 7009 revocation, and
//! an RFC 8693 grant registered with `registerGrantType`), in front of a real MCP upstream
//! that verifies every request's JWT against the server's JWKS and answers the claims it saw
//! (tests/fixtures/jwt_upstream.py: the official Python SDK and PyJWT).
//!
//! Checked: client credentials and token exchange both work, each with its `upstream_auth`;
//! a child's token carries the `act` chain of its agent path; 32 concurrent calls across a
//! token's expiry make exactly one token request; a 401 refreshes once, then fails with the
//! clear error, audited, with no further token request; the authorization server down fails
//! calls with a clear error and is counted; a release revokes; no secret, subject token or
//! access token appears in the daemon's log, `/metrics`, the audit, or an admin reply. A
//! missing peer fails the test: run tests/peers/setup.sh.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::daemon::Daemon;
use common::peers::{peer, python};
use common::*;
use reqwest::Method;
use serde_json::{json, Value};

const CLIENT_SECRET: &str = "gw-client-secret-Qm71Xc";
const ALICE: &str = "subject-alice-Vb38Tn";
const BOB: &str = "subject-bob-Kd52Rw";
const MALLORY: &str = "subject-mallory-Hs90Pe";
const CAROL: &str = "subject-carol-Lz27Fy";

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// tests/peers/otel_receiver.py (an OTLP/HTTP receiver) on a loopback port: the spans the
/// daemon exported.
struct Receiver {
    _child: Proc,
    port: u16,
    lines: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    fn start() -> Receiver {
        let mut child = Command::new(python())
            .arg(peer("otel_receiver.py"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
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
        Receiver {
            _child: Proc(child),
            port,
            lines,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The spans, once `f` holds of them (20 s at most).
    async fn wait_spans(&self, f: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        for _ in 0..400 {
            let spans: Vec<Value> = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .filter_map(|v| v.get("span").cloned())
                .collect();
            if f(&spans) {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("spans not as expected in 20 s");
    }
}

/// The first stdout line of `child`, as JSON.
fn announced(child: &mut Child) -> Value {
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    serde_json::from_str(&line).unwrap_or_else(|_| panic!("a peer did not start: {line:?}"))
}

/// The authorization server, the upstream, and the daemon's config for both.
struct World {
    auth_server: Option<Proc>,
    _upstream: Proc,
    issuer: String,
    upstream_url: String,
    dir: tempfile::TempDir,
}

impl World {
    /// `ttl`: the access tokens' lifetime, seconds.
    fn start(ttl: u64) -> World {
        let dir = tempfile::tempdir().unwrap();
        let subjects = json!({ALICE: "alice", BOB: "bob", MALLORY: "mallory", CAROL: "carol"});
        let mut auth = Command::new("node")
            .arg(peer("oauth_as.mjs"))
            .current_dir(peer(""))
            .env("OAUTH_CLIENT_ID", "gatehouse")
            .env("OAUTH_CLIENT_SECRET", CLIENT_SECRET)
            .env("OAUTH_SUBJECTS", subjects.to_string())
            .env("ACCESS_TTL", ttl.to_string())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("auth_server.log")).unwrap())
            .spawn()
            .unwrap();
        let issuer = announced(&mut auth)["issuer"].as_str().unwrap().to_string();
        let auth = Proc(auth);
        let mut up = Command::new(python())
            .arg(repo_root().join("tests/fixtures/jwt_upstream.py"))
            .arg(dir.path())
            .arg(&issuer)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let port = announced(&mut up)["listening"].as_u64().unwrap();
        std::fs::write(dir.path().join("client_secret"), CLIENT_SECRET).unwrap();
        World {
            auth_server: Some(auth),
            _upstream: Proc(up),
            issuer,
            upstream_url: format!("http://127.0.0.1:{port}/mcp"),
            dir,
        }
    }

    /// Two upstreams on the one server: `cc` with the gateway's own token, `tx` with each
    /// registration's exchanged one.
    fn config(&self) -> String {
        let secret = self.dir.path().join("client_secret");
        let mut out = String::new();
        for (id, grant) in [("cc", "client_credentials"), ("tx", "token_exchange")] {
            out += &format!(
                "[[upstreams]]\nid = \"{id}\"\nurl = {url:?}\n\n[upstreams.oauth]\nissuer = {iss:?}\nclient_id = \"gatehouse\"\nclient_secret_file = {secret:?}\nscope = \"tools\"\nresource = {url:?}\ngrant = \"{grant}\"\n\n",
                url = self.upstream_url,
                iss = self.issuer,
                secret = secret.display().to_string(),
            );
        }
        out
    }

    /// The authorization server's own counts: token requests by grant type, revocations.
    async fn stats(&self) -> Value {
        http()
            .get(format!("{}/_stats", self.issuer))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn token_requests(&self, grant: &str) -> u64 {
        let g = match grant {
            "tx" => "urn:ietf:params:oauth:grant-type:token-exchange",
            _ => "client_credentials",
        };
        self.stats().await["token"][g].as_u64().unwrap_or(0)
    }

    fn stop_auth_server(&mut self) {
        self.auth_server.take();
    }
}

async fn call(reg: &Value, tool: &str, id: u64) -> Value {
    stateless(
        reg["mcp_url"].as_str().unwrap(),
        reg["token"].as_str().unwrap(),
        id,
        "tools/call",
        json!({"name": tool, "arguments": {}}),
    )
    .await
}

/// The claims the upstream verified for a `whoami` call (the call must succeed).
async fn claims(reg: &Value, tool: &str) -> Value {
    let r = call(reg, tool, 1).await;
    assert!(r["result"]["isError"] != json!(true), "{tool}: {r}");
    serde_json::from_str(&text_of(&r)).unwrap_or_else(|_| panic!("{r}"))
}

/// The text of a failed call's tool error.
async fn failure(reg: &Value, tool: &str) -> String {
    let r = call(reg, tool, 2).await;
    assert_eq!(
        r["result"]["isError"],
        json!(true),
        "{tool} should fail: {r}"
    );
    text_of(&r)
}

/// No secret, subject token or access token (a JWT starts `eyJ`) in the daemon's log, its
/// `/metrics`, its audit (file and admin tail), its registrations list or upstreams.
async fn assert_nowhere(d: &Daemon) {
    let metrics = d.metrics().await;
    let (_, regs) = d.admin_call(Method::GET, "/v1/registrations", None).await;
    let (_, ups) = d.admin_call(Method::GET, "/v1/upstreams", None).await;
    let (_, tail) = d
        .admin_call(Method::GET, "/v1/audit?limit=1000", None)
        .await;
    let audit = std::fs::read_to_string(d.audit_path()).unwrap();
    let stderr = d.stderr();
    assert!(
        stderr.contains("got an upstream access token"),
        "debug log expected"
    );
    let places = [
        ("the daemon's log", stderr),
        ("/metrics", metrics),
        ("GET /v1/registrations", regs.to_string()),
        ("GET /v1/upstreams", ups.to_string()),
        ("GET /v1/audit", tail.to_string()),
        ("the audit file", audit),
    ];
    for s in [CLIENT_SECRET, ALICE, BOB, MALLORY, CAROL, "eyJ"] {
        for (place, text) in &places {
            assert!(!text.contains(s), "{s} in {place}");
        }
    }
}

fn calls_of<'a>(
    records: &'a [gatehouse::testing::audit::Record<'static>],
    tool: &'a str,
) -> impl Iterator<Item = &'a gatehouse::testing::audit::Record<'static>> + 'a {
    records
        .iter()
        .filter(move |r| r.event == "governed_mcp_call" && r.tool.as_deref() == Some(tool))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_credentials_and_token_exchange_with_the_act_chain_and_revocation() {
    let w = World::start(300);
    let rx = Receiver::start();
    let endpoint = rx.endpoint();
    let d = Daemon::start(
        &w.config(),
        "",
        "gatehouse=debug",
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())],
    );
    let a = d
        .register(json!({"agent_id": "run-alice", "tools": ["cc.*", "tx.*"],
            "upstream_credentials": {"tx": {"subject_token": ALICE}}}))
        .await;
    assert_eq!(a["upstream_credentials"], json!({"tx": "set"}), "{a}");
    let b = d
        .register(
            json!({"agent_id": "run-bob", "tools": ["cc.whoami", "tx.whoami"],
            "upstream_credentials": {"tx": {"subject_token": BOB}}}),
        )
        .await;

    // Client credentials: the gateway's own identity, for this resource; one token for all.
    for reg in [&a, &b, &a] {
        let c = claims(reg, "cc.whoami").await;
        assert_eq!(c["sub"], "gatehouse", "{c}");
        assert_eq!(c["client_id"], "gatehouse");
        assert_eq!(c["aud"], w.upstream_url.as_str());
        assert_eq!(c["scope"], "tools");
        assert_eq!(c["iss"], w.issuer.as_str());
    }
    assert_eq!(w.token_requests("cc").await, 1);

    // Token exchange: each registration acts for its own user.
    let ca = claims(&a, "tx.whoami").await;
    assert_eq!(
        (&ca["sub"], &ca["act"]),
        (&json!("alice"), &Value::Null),
        "{ca}"
    );
    assert_eq!(ca["aud"], w.upstream_url.as_str());
    assert_eq!(claims(&b, "tx.whoami").await["sub"], "bob");
    assert_eq!(claims(&a, "tx.whoami").await["jti"], ca["jti"], "cached");

    // A child and a grandchild: the token carries the delegation chain (current actor
    // outermost), for the same user.
    let child = d
        .register(json!({"agent_id": "researcher", "tools": ["tx.whoami"], "parent": a["id"]}))
        .await;
    let grandchild = d
        .register(json!({"agent_id": "fetch/er 2", "tools": ["tx.whoami"], "parent": child["id"]}))
        .await;
    let cc = claims(&child, "tx.whoami").await;
    assert_eq!(cc["sub"], "alice", "{cc}");
    assert_eq!(
        cc["act"],
        json!({"sub": "researcher", "act": {"sub": "run-alice"}})
    );
    let cg = claims(&grandchild, "tx.whoami").await;
    assert_eq!(
        cg["act"],
        json!({"sub": "fetch/er 2", "act": {"sub": "researcher", "act": {"sub": "run-alice"}}}),
        "{cg}"
    );

    // The subject token rotates like a credential: the next call acts for the new user.
    let (s, v) = d
        .admin_call(
            Method::PUT,
            &format!(
                "/v1/registrations/{}/credentials",
                b["id"].as_str().unwrap()
            ),
            Some(json!({"tx": {"subject_token": CAROL}})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(claims(&b, "tx.whoami").await["sub"], "carol");

    // Wrong kinds are refused at registration, naming the upstream and the reason.
    for (creds, want) in [
        (
            json!({"cc": {"subject_token": ALICE}}),
            "client_credentials",
        ),
        (json!({"tx": {"bearer": "x"}}), "subject_token"),
    ] {
        let (s, v) = d
            .admin_call(
                Method::POST,
                "/v1/registrations",
                Some(json!({"agent_id": "x",
                "tools": ["cc.*", "tx.*"], "upstream_credentials": creds})),
            )
            .await;
        assert_eq!(s, 400, "{v}");
        assert!(v.to_string().contains(want), "{v}");
    }
    // Without a subject token a token_exchange upstream's calls fail, saying what is missing.
    let none = d
        .register(json!({"agent_id": "run-none", "tools": ["tx.whoami", "cc.whoami"]}))
        .await;
    let e = failure(&none, "tx.whoami").await;
    assert!(e.contains("set upstream_credentials.tx"), "{e}");
    assert!(calls_of(&d.audit(), "tx.whoami")
        .any(|r| r.reason.as_deref() == Some("no_subject_token")
            && r.outcome.as_deref() == Some("upstream_failed")));
    assert_eq!(claims(&none, "cc.whoami").await["sub"], "gatehouse");

    // Audit and spans say which kind of credential each call carried.
    let records = d.audit();
    assert!(calls_of(&records, "cc.whoami")
        .all(|r| r.upstream_auth.as_deref() == Some("client_credentials")));
    assert!(calls_of(&records, "tx.whoami")
        .filter(|r| r.outcome.as_deref() == Some("ok"))
        .all(|r| r.upstream_auth.as_deref() == Some("token_exchange")));
    assert!(calls_of(&records, "tx.whoami").count() >= 7);

    // Counted on /metrics by upstream, grant and outcome.
    let m = d.metrics().await;
    assert!(
        m.contains(r#"gatehouse_upstream_token_requests_total{upstream="cc",grant="client_credentials",outcome="ok"} 1"#),
        "{m}"
    );
    assert!(
        // alice's (and the catalog's, fetched with hers when she registered), bob's, the
        // child's, the grandchild's, carol's.
        m.contains(r#"gatehouse_upstream_token_requests_total{upstream="tx",grant="token_exchange",outcome="ok"} 6"#),
        "{m}"
    );

    // A release drops the registration's exchanged tokens and revokes them (RFC 7009):
    // the family's three (alice's, the child's and the grandchild's).
    let before = w.stats().await["revocation"].as_u64().unwrap();
    let (s, _) = d
        .admin_call(
            Method::DELETE,
            &format!("/v1/registrations/{}", a["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert!(s == 200 || s == 204, "{s}");
    let mut revoked = 0;
    for _ in 0..100 {
        revoked = w.stats().await["revocation"].as_u64().unwrap() - before;
        if revoked >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(revoked, 3);
    assert_nowhere(&d).await;

    // Traced: a span per token request, by grant and outcome; calls' spans say the kind.
    let spans = rx
        .wait_spans(|s| {
            s.iter()
                .filter(|s| s["attributes"]["gatehouse.pool.work"] == "token")
                .count()
                >= 7
        })
        .await;
    let token_spans: Vec<_> = spans
        .iter()
        .filter(|s| s["attributes"]["gatehouse.pool.work"] == "token")
        .collect();
    assert!(token_spans.iter().any(|s| s["name"] == "token cc"
        && s["attributes"]["gatehouse.oauth.grant"] == "client_credentials"
        && s["attributes"]["gatehouse.oauth.outcome"] == "ok"));
    assert_eq!(
        token_spans
            .iter()
            .filter(|s| s["attributes"]["gatehouse.oauth.grant"] == "token_exchange")
            .count(),
        6
    );
    assert!(spans
        .iter()
        .any(|s| s["attributes"]["gatehouse.upstream_auth"] == "token_exchange"));
    let text = serde_json::to_string(&spans).unwrap();
    for s in [CLIENT_SECRET, ALICE, BOB, CAROL, "eyJ"] {
        assert!(!text.contains(s), "{s} in a span");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_two_calls_across_a_tokens_expiry_make_one_token_request() {
    // 5 s tokens: refreshed a fifth of their lifetime early, 4 s after they were issued.
    let w = World::start(5);
    let d = Daemon::start(&w.config(), "", "gatehouse=debug", &[]);
    let r = d
        .register(
            json!({"agent_id": "many", "tools": ["cc.whoami", "tx.whoami"],
            "upstream_credentials": {"tx": {"subject_token": ALICE}}}),
        )
        .await;
    let first = claims(&r, "cc.whoami").await["jti"].clone();
    let first_tx = claims(&r, "tx.whoami").await["jti"].clone();
    // (tx: the catalog's exchange at registration, then the registration's own.)
    let base = [w.token_requests("cc").await, w.token_requests("tx").await];
    assert_eq!(base, [1, 2]);
    tokio::time::sleep(Duration::from_millis(4300)).await;
    for (tool, grant, old, base) in [
        ("cc.whoami", "cc", first, base[0]),
        ("tx.whoami", "tx", first_tx, base[1]),
    ] {
        let calls: Vec<_> = (0..32)
            .map(|i| {
                let r = r.clone();
                tokio::spawn(async move { call(&r, tool, 100 + i).await })
            })
            .collect();
        let mut jtis = std::collections::BTreeSet::new();
        for c in calls {
            let v = c.await.unwrap();
            assert!(v["result"]["isError"] != json!(true), "{v}");
            let claims: Value = serde_json::from_str(&text_of(&v)).unwrap();
            jtis.insert(claims["jti"].as_str().unwrap().to_string());
        }
        assert_eq!(
            w.token_requests(grant).await,
            base + 1,
            "{tool}: exactly one more"
        );
        assert_eq!(jtis.len(), 1, "{tool}: one new token for all 32: {jtis:?}");
        assert!(!jtis.contains(old.as_str().unwrap()), "{tool}: refreshed");
        // The next refresh is 4 s away: the tx round starts as fresh as the cc one did.
        if grant == "cc" {
            tokio::time::sleep(Duration::from_millis(4300)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_refreshes_once_then_fails_and_an_authorization_server_down_fails_calls() {
    let mut w = World::start(300);
    let d = Daemon::start(&w.config(), "", "gatehouse=debug", &[]);
    let r = d
        .register(json!({"agent_id": "run-r", "tools": ["cc.*"]}))
        .await;
    let m = d
        .register(json!({"agent_id": "run-m", "tools": ["tx.*"],
            "upstream_credentials": {"tx": {"subject_token": MALLORY}}}))
        .await;

    // The upstream stops accepting a token: one fresh token, and the call succeeds.
    let first = claims(&r, "cc.whoami").await["jti"].clone();
    assert_eq!(text_of(&call(&r, "cc.reject_my_token", 3).await), "ok");
    let second = claims(&r, "cc.whoami").await["jti"].clone();
    assert_ne!(first, second);
    assert_eq!(w.token_requests("cc").await, 2);

    // The upstream refuses the subject whatever its token: one fresh token, then the clear
    // error, audited; further calls make no token request (no retry storm).
    assert_eq!(claims(&m, "tx.whoami").await["sub"], "mallory");
    assert_eq!(text_of(&call(&m, "tx.reject_me", 4).await), "ok");
    let before = w.token_requests("tx").await;
    for _ in 0..5 {
        let e = failure(&m, "tx.whoami").await;
        assert!(
            e.contains("upstream tx rejected this registration's credentials"),
            "{e}"
        );
    }
    assert_eq!(
        w.token_requests("tx").await,
        before + 1,
        "one refresh, then none"
    );
    let records = d.audit();
    let failed: Vec<_> = calls_of(&records, "tx.whoami")
        .filter(|r| r.reason.as_deref() == Some("upstream_auth_failed"))
        .collect();
    assert_eq!(failed.len(), 5);
    assert!(failed
        .iter()
        .all(|r| r.outcome.as_deref() == Some("upstream_failed")
            && r.upstream_auth.as_deref() == Some("token_exchange")));
    let events: Vec<_> = records
        .iter()
        .filter(|r| r.event == "upstream_auth_failed")
        .collect();
    assert_eq!(
        events.len(),
        5,
        "one upstream_auth_failed event per failed call"
    );
    assert!(events.iter().all(|r| r.upstream.as_deref() == Some("tx")
        && r.registration_id.as_deref() == m["id"].as_str()
        && r.agent_id.as_deref() == Some("run-m")
        && r.upstream_auth.as_deref() == Some("token_exchange")));

    // The authorization server down: a call that needs a new token fails, saying so, and
    // the failed request is counted; one with a cached token still works.
    w.stop_auth_server();
    let n = d
        .register(json!({"agent_id": "run-n", "tools": ["tx.whoami"],
            "upstream_credentials": {"tx": {"subject_token": BOB}}}))
        .await;
    let e = failure(&n, "tx.whoami").await;
    assert!(
        e.contains("the authorization server of upstream \"tx\" is unreachable"),
        "{e}"
    );
    let records = d.audit();
    assert!(calls_of(&records, "tx.whoami")
        .any(|r| r.reason.as_deref() == Some("authorization_server_failed")));
    let metrics = d.metrics().await;
    assert!(
        metrics.contains(r#"gatehouse_upstream_token_requests_total{upstream="tx",grant="token_exchange",outcome="unreachable"} 1"#),
        "{metrics}"
    );
    assert_eq!(claims(&r, "cc.whoami").await["jti"], second);
    assert_nowhere(&d).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_rotations_leave_the_store_and_the_registration_on_the_same_one() {
    let w = World::start(300);
    let mut d = Daemon::start(&w.config(), "", "info", &[]);
    let mut r = d
        .register(json!({"agent_id": "run-rot", "tools": ["tx.whoami"],
            "upstream_credentials": {"tx": {"subject_token": ALICE}}}))
        .await;
    let users = [
        (ALICE, "alice"),
        (BOB, "bob"),
        (CAROL, "carol"),
        (MALLORY, "mallory"),
    ];
    let path = format!(
        "/v1/registrations/{}/credentials",
        r["id"].as_str().unwrap()
    );
    for round in 0..3 {
        // Eight PUTs at once, each naming another subject token.
        let puts = (0..8).map(|i| {
            let (subject, _) = users[(i + round) % users.len()];
            d.admin_call(
                Method::PUT,
                &path,
                Some(json!({"tx": {"subject_token": subject}})),
            )
        });
        for (s, v) in futures::future::join_all(puts).await {
            assert_eq!(s, 200, "{v}");
        }
        // The one served now is the one stored: a kill -9 and restart opens it again.
        let served = claims(&r, "tx.whoami").await["sub"].clone();
        d.kill9_and_restart();
        let url = r["mcp_url"].as_str().unwrap();
        r["mcp_url"] = json!(url.replace(&url[..url.find("/gw/").unwrap()], &d.data));
        let stored = claims(&r, "tx.whoami").await["sub"].clone();
        assert_eq!(served, stored, "round {round}");
        assert!(users.iter().any(|(_, u)| served == *u));
    }
}
