//! Refused requests are visible to operators (issue 41), on a real `gatehouse serve`: each
//! kind of refusal moves its own counter on `/metrics` (listener, status, reason) and nothing
//! else; a wrong or missing token shown to a live registration, and a bad admin token, are
//! audited `auth_failed` with the client's address, folded per interval; released and unknown
//! ids are counted, not audited; a flood of 10,000 wrong tokens writes a bounded number of
//! records and log lines while another registration's calls are served; no token appears in
//! any log line, metric or record.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Instant;

use common::daemon::Daemon;
use common::*;
use futures::StreamExt;
use reqwest::Method as M;
use serde_json::{json, Value};

/// The refusal and call counters of `/metrics`: series name with labels → value.
fn counters(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter(|l| {
            l.starts_with("gatehouse_refused_requests_total{")
                || l.starts_with("gatehouse_tool_calls_total{")
        })
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// What moved between two snapshots.
fn moved(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let was = before.get(k).copied().unwrap_or(0);
            (*v != was).then(|| (k.clone(), v - was))
        })
        .collect()
}

fn series(listener: &str, status: u16, reason: &str) -> String {
    format!(
        "gatehouse_refused_requests_total{{listener=\"{listener}\",status=\"{status}\",reason=\"{reason}\"}}"
    )
}

const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

/// A Streamable HTTP initialize on `url` with `token` (None: no Authorization) and extra
/// headers: the status.
async fn post_init(url: &str, token: Option<&str>, headers: &[(&str, &str)]) -> u16 {
    let mut b = http()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(INIT);
    if let Some(t) = token {
        b = b.bearer_auth(t);
    }
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.send().await.unwrap().status().as_u16()
}

fn auth_failed(d: &Daemon) -> Vec<gatehouse::testing::audit::Record<'static>> {
    d.audit()
        .into_iter()
        .filter(|r| r.event == "auth_failed")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refusals_are_counted_logged_and_audited_boundedly_and_never_show_a_token() {
    let interval_s = 1;
    let d = Daemon::start(
        "",
        &format!("auth_failed_interval_s = {interval_s}"),
        "info,gatehouse::refusals=debug",
        &[],
    );
    let reg = |agent: &str| json!({"agent_id": agent, "tools": ["demo.echo"], "label": "issue-41"});
    let a = d.register(reg("agent-a")).await;
    let b = d.register(reg("agent-b")).await;
    let c = d.register(reg("agent-c")).await;
    let (a_id, a_url, a_token) = (
        a["id"].as_str().unwrap(),
        a["mcp_url"].as_str().unwrap(),
        a["token"].as_str().unwrap(),
    );
    let (b_url, b_token) = (b["mcp_url"].as_str().unwrap(), b["token"].as_str().unwrap());
    let c_url = c["mcp_url"].as_str().unwrap().to_string();
    let (s, _) = d
        .admin_call(
            M::DELETE,
            &format!("/v1/registrations/{}", c["id"].as_str().unwrap()),
            None,
        )
        .await;
    assert_eq!(s, 204);
    let unknown_url = a_url.replace(a_id, &gatehouse::testing::registry::new_registration_id());
    // A wrong token that looks like a real one (a mistyped secret must not be logged either).
    let wrong = gatehouse::testing::registry::new_registration_id() + "wrongWRONGwrong";

    // 1. Each refusal moves its own counter, and nothing else (no call counted, no other
    //    reason). `/metrics` itself is an admin request with the right token: no refusal.
    type Case<'a> = (
        &'a str,
        String,
        Option<&'a str>,
        Vec<(&'a str, &'a str)>,
        String,
    );
    let cases: Vec<Case> = vec![
        (
            "wrong token",
            a_url.to_string(),
            Some(&wrong),
            vec![],
            series("data", 401, "bad_token"),
        ),
        (
            "missing token",
            a_url.to_string(),
            None,
            vec![],
            series("data", 401, "missing_token"),
        ),
        (
            "released id",
            c_url.clone(),
            Some(a_token),
            vec![],
            series("data", 404, "released"),
        ),
        (
            "unknown id",
            unknown_url.clone(),
            Some(a_token),
            vec![],
            series("data", 404, "unknown_registration"),
        ),
        (
            "bad Origin",
            a_url.to_string(),
            Some(a_token),
            vec![("origin", "http://evil.example")],
            series("data", 403, "origin"),
        ),
    ];
    for (what, url, token, headers, want) in &cases {
        let before = counters(&d.metrics().await);
        let status = post_init(url, *token, headers).await;
        assert!(status >= 400, "{what}: {status}");
        let after = counters(&d.metrics().await);
        let m = moved(&before, &after);
        assert_eq!(m, BTreeMap::from([(want.clone(), 1)]), "{what}");
    }
    // The admin API with a wrong token.
    let before = counters(&d.metrics().await);
    let r = http()
        .get(format!("{}/v1/registrations", d.admin))
        .bearer_auth(&wrong)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let m = moved(&before, &counters(&d.metrics().await));
    assert_eq!(m, BTreeMap::from([(series("admin", 401, "admin_auth"), 1)]));

    // 2. Audit: the wrong token on A (written at once, count 1), the missing one folded into
    //    A's next record; the admin failure its own; released and unknown ids none.
    d.wait_audit(10, |recs| {
        let f: Vec<_> = recs.iter().filter(|r| r.event == "auth_failed").collect();
        f.iter().map(|r| r.rare().count.unwrap_or(0)).sum::<u64>() == 3
    })
    .await;
    let recs = auth_failed(&d);
    let on_a: Vec<_> = recs
        .iter()
        .filter(|r| r.registration_id.as_deref() == Some(a_id))
        .collect();
    assert_eq!(on_a.len(), 2, "{recs:?}");
    assert_eq!(on_a[0].rare().count, Some(1));
    assert_eq!(on_a[0].reason.as_deref(), Some("bad_token"));
    assert_eq!(on_a[1].rare().count, Some(1));
    assert_eq!(on_a[1].reason.as_deref(), Some("missing_token"));
    for r in &on_a {
        assert_eq!(r.agent_id.as_deref(), Some("agent-a"));
        assert_eq!(r.transport.as_deref(), Some("streamable_http"));
        assert!(
            r.rare()
                .client_addr
                .as_deref()
                .is_some_and(|a| a.starts_with("127.0.0.1:")),
            "{r:?}"
        );
    }
    let admin: Vec<_> = recs
        .iter()
        .filter(|r| r.transport.as_deref() == Some("admin"))
        .collect();
    assert_eq!(admin.len(), 1, "{recs:?}");
    assert!(admin[0].registration_id.is_none() && admin[0].rare().count == Some(1));
    assert_eq!(
        recs.len(),
        3,
        "released and unknown ids are not audited: {recs:?}"
    );

    // 3. A flood of 10,000 wrong tokens on A while B's calls go on.
    const FLOOD: usize = 10_000;
    let flood_started = Instant::now();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let calls = {
        let (url, token, stop) = (b_url.to_string(), b_token.to_string(), stop.clone());
        tokio::spawn(async move {
            let (mut ok, mut id) = (0u64, 0u64);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                id += 1;
                let r = stateless(
                    &url,
                    &token,
                    id,
                    "tools/call",
                    json!({"name":"demo.echo","arguments":{"text":"hi"}}),
                )
                .await;
                assert_eq!(text_of(&r), "agent-b:hi", "{r}");
                ok += 1;
            }
            ok
        })
    };
    let statuses: Vec<u16> = futures::stream::iter(0..FLOOD)
        .map(|_| post_init(a_url, Some(&wrong), &[]))
        .buffer_unordered(32)
        .collect()
        .await;
    let flood_s = flood_started.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let served = calls.await.unwrap();
    assert!(statuses.iter().all(|s| *s == 401));
    assert!(served > 0, "B's calls were not served during the flood");
    let m = counters(&d.metrics().await);
    assert_eq!(
        m.get(&series("data", 401, "bad_token")),
        Some(&(FLOOD as u64 + 1))
    );
    // Every failure is counted in A's records, folded: at most one record per interval.
    d.wait_audit(15, |recs| {
        recs.iter()
            .filter(|r| r.event == "auth_failed" && r.registration_id.as_deref() == Some(a_id))
            .map(|r| r.rare().count.unwrap_or(0))
            .sum::<u64>()
            == FLOOD as u64 + 2
    })
    .await;
    let flood_records = auth_failed(&d)
        .iter()
        .filter(|r| r.registration_id.as_deref() == Some(a_id))
        .count()
        - 2;
    let bound = (flood_started.elapsed().as_secs_f64() / interval_s as f64).ceil() as usize + 2;
    assert!(
        flood_records <= bound,
        "{flood_records} records for {FLOOD} failures over {flood_s:.1} s (bound {bound})"
    );
    // The `warn` summaries account for every bad token, the flood's tail included (written
    // by the folder once the reason's 10 s have passed, with no refusal after it).
    let summed = |lines: &[String]| -> u64 {
        lines
            .iter()
            .filter(|l| l.contains("requests refused (") && l.contains("reason=\"bad_token\""))
            .filter_map(|l| {
                l.split("count=")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    };
    let deadline = Instant::now() + std::time::Duration::from_secs(15);
    while summed(&d.log_lines()) < FLOOD as u64 + 1 {
        assert!(
            Instant::now() < deadline,
            "the warn summaries do not add up: {}",
            summed(&d.log_lines())
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(summed(&d.log_lines()), FLOOD as u64 + 1);
    let lines = d.log_lines();
    let debug = lines
        .iter()
        .filter(|l| l.contains("request refused"))
        .count();
    let warn = lines
        .iter()
        .filter(|l| l.contains("requests refused ("))
        .count();
    // One debug line per refusal; `warn` summaries at most one per reason per 10 s.
    assert!(debug > FLOOD, "{debug} debug lines");
    let reasons = 6;
    let warn_bound = reasons * ((flood_started.elapsed().as_secs() / 10) as usize + 2);
    assert!(warn <= warn_bound, "{warn} warn lines (bound {warn_bound})");
    println!(
        "flood: {FLOOD} wrong-token requests in {flood_s:.1} s; {flood_records} auth_failed records; \
         {warn} warn summaries and {debug} debug lines in the log; {served} calls of another registration served meanwhile"
    );

    // 4. No token anywhere: log lines, metrics, audit records.
    let audit_text = std::fs::read_to_string(d.audit_path()).unwrap();
    let metrics = d.metrics().await;
    let log = lines.join("\n");
    for t in [
        a_token,
        b_token,
        c["token"].as_str().unwrap(),
        &d.token,
        &wrong,
    ] {
        assert!(!audit_text.contains(t), "a token in the audit log");
        assert!(!metrics.contains(t), "a token in the metrics");
        assert!(!log.contains(t), "a token in the log");
    }
    // Nor a full registration id in a log line about a refusal (shortened to 6 characters).
    assert!(!lines
        .iter()
        .filter(|l| l.contains("request refused"))
        .any(|l| l.contains(a_id)));
}

#[tokio::test]
async fn the_console_stats_carry_the_refusal_series() {
    let d = Daemon::start("", "", "info", &[]);
    let a = d
        .register(json!({"agent_id": "x", "tools": ["demo.echo"]}))
        .await;
    for _ in 0..3 {
        assert_eq!(
            post_init(a["mcp_url"].as_str().unwrap(), Some("nope"), &[]).await,
            401
        );
    }
    let (s, stats) = d.admin_call(M::GET, "/v1/console/stats", None).await;
    assert_eq!(s, 200);
    let rows = stats["refusals"].as_array().unwrap();
    let bad = rows.iter().find(|r| r["key"] == "bad_token").unwrap();
    assert_eq!(bad["calls_total"], 3);
    assert_eq!(bad["calls"].as_array().unwrap().len(), 900);
    assert_eq!(
        bad["calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .sum::<u64>(),
        3
    );
    assert!(rows.iter().all(|r| r["key"] != Value::Null));
}

/// A fenced node's 503 (issue 50, item 5) is counted with its own reason, `fenced`, not as a
/// cap reached (`overloaded`): through a real data listener whose fence is closed (as a
/// cluster node's is when it loses its proof of freshness), on both transports, read back
/// from a real admin listener's `/metrics`; once the fence opens, the same request is served
/// and nothing more is counted.
#[tokio::test]
async fn a_fenced_nodes_503_is_counted_fenced_not_overloaded() {
    use gatehouse::RegistrationSpec;
    use tokio_util::sync::CancellationToken;
    let tg = TestGateway::start();
    let gw = tg.gateway.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let server = tokio::spawn(gatehouse::testing::admin::serve(
        listener,
        gatehouse::testing::admin::router(gw.clone(), "admin-secret"),
        stop.clone(),
    ));
    let metrics = || async {
        let r = http()
            .get(format!("{admin}/metrics"))
            .bearer_auth("admin-secret")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        counters(&r.text().await.unwrap())
    };
    let reg = gw
        .register(RegistrationSpec::new("agent-f").with_tool(echo_tool("t", "f")))
        .await
        .unwrap();
    gatehouse::testing::close_fence(&gw, "n1");
    let before = metrics().await;
    // Streamable HTTP.
    let status = post_init(&reg.mcp_url(), Some(reg.token()), &[]).await;
    assert_eq!(status, 503);
    // Legacy SSE: the stream itself.
    let r = http()
        .get(reg.sse_url())
        .bearer_auth(reg.token())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(
        r.headers().get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let m = moved(&before, &metrics().await);
    assert_eq!(
        m,
        BTreeMap::from([(series("data", 503, "fenced"), 2)]),
        "a fenced node's 503 is `fenced`, and nothing else moved"
    );
    // Open again: served, nothing counted.
    gatehouse::testing::open_fence(&gw);
    let before = metrics().await;
    assert_eq!(post_init(&reg.mcp_url(), Some(reg.token()), &[]).await, 200);
    assert_eq!(moved(&before, &metrics().await), BTreeMap::new());
    reg.release().await;
    stop.cancel();
    server.await.unwrap();
}

/// The reasons operators read about (docs/daemon.md, "Refusals") are exactly the ones the
/// gateway counts: a reason added to `refusals::Reason` without its line there, or a line
/// for a reason that is gone, fails.
#[test]
fn the_documented_reasons_are_exactly_the_counted_ones() {
    let doc = std::fs::read_to_string(repo_root().join("docs/daemon.md")).unwrap();
    let table = doc
        .split("### Refusals")
        .nth(1)
        .and_then(|s| s.split("\n\n").find(|p| p.starts_with("| reason")))
        .expect("docs/daemon.md has the refusals table");
    let mut documented: Vec<String> = table
        .lines()
        .skip(2)
        .flat_map(|l| {
            let first = l.split('|').nth(1).unwrap_or("");
            first
                .split('/')
                .map(|c| c.trim().trim_matches('`').to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    documented.sort();
    let mut counted: Vec<String> = gatehouse::testing::refusal_reasons()
        .into_iter()
        .map(String::from)
        .collect();
    counted.sort();
    assert_eq!(documented, counted);
}
