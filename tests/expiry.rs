//! Lease expiry with paused tokio time: a registration with `ttl_s` that is not renewed
//! expires through the release path (404, audit `registration_expired`); renewing moves it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use gatehouse::RegistrationSpec;

/// Waits (in real time: the audit writer is an OS thread) for an audit event.
fn wait_for_event(tg: &TestGateway, event: &str, id: &str) -> bool {
    for _ in 0..500 {
        if tg
            .audit()
            .iter()
            .any(|r| r.event == event && r.registration_id.as_deref() == Some(id))
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Runs `f` while keeping the runtime busy, so paused time does not auto-advance while `f`
/// waits for the audit writer (an OS thread, invisible to tokio's idle detection).
async fn without_advance<F: std::future::Future>(f: F) -> F::Output {
    let spin = tokio::spawn(async {
        loop {
            tokio::task::yield_now().await;
        }
    });
    let out = f.await;
    spin.abort();
    out
}

#[tokio::test(start_paused = true)]
async fn unrenewed_lease_expires_and_renewal_moves_it() {
    let tg = TestGateway::start();
    let gw = &tg.gateway;
    let reg = without_advance(
        gw.register(
            RegistrationSpec::new("leaser")
                .with_tool(echo_tool("t", "x"))
                .ttl_s(10),
        ),
    )
    .await
    .unwrap();
    assert!(reg.expires_at().is_some());
    let (id, _token) = reg.detach();
    let short = without_advance(
        gw.register(
            RegistrationSpec::new("short")
                .with_tool(echo_tool("t", "y"))
                .ttl_s(3),
        ),
    )
    .await
    .unwrap();
    let (short_id, _) = short.detach();
    let forever = without_advance(
        gw.register(RegistrationSpec::new("forever").with_tool(echo_tool("t", "z"))),
    )
    .await
    .unwrap();
    assert_eq!(gatehouse::testing::deadlines(gw).len(), 2);

    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        gatehouse::testing::registry(gw).get(&short_id).is_none(),
        "3 s lease expired at 5 s"
    );
    assert!(wait_for_event(&tg, "registration_expired", &short_id));
    // Renew at t=5 for another 10 s: alive at 12 s, gone by 16 s.
    let renewed = without_advance(gw.renew(&id, None)).await;
    assert!(matches!(renewed, Some(Some(_))), "{renewed:?}");
    assert!(wait_for_event(&tg, "registration_renewed", &id));
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(
        gatehouse::testing::registry(gw).get(&id).is_some(),
        "renewed lease still alive at 12 s"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        gatehouse::testing::registry(gw).get(&id).is_none(),
        "renewed lease expired by 16 s"
    );
    assert!(wait_for_event(&tg, "registration_expired", &id));
    // Renewing a gone registration is None (the admin API answers 404).
    assert!(without_advance(gw.renew(&id, Some(30))).await.is_none());
    // No TTL: never expires, and renewing without a ttl keeps it lease-less.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(gatehouse::testing::registry(gw).get(forever.id()).is_some());
    assert_eq!(
        without_advance(gw.renew(forever.id(), None)).await,
        Some(None)
    );
    assert_eq!(
        gatehouse::testing::deadlines(gw).len(),
        0,
        "lease table does not keep expired entries"
    );
    forever.release().await;
}

#[tokio::test]
async fn expired_registration_answers_404_on_its_paths() {
    let tg = TestGateway::start();
    // Keeps the server up after the expiry, so the expired paths answer (404).
    let _other = tg
        .gateway
        .register(RegistrationSpec::new("b").with_tool(echo_tool("t", "b")))
        .await
        .unwrap();
    let reg = tg
        .gateway
        .register(
            RegistrationSpec::new("a")
                .with_tool(echo_tool("t", "a"))
                .ttl_s(1),
        )
        .await
        .unwrap();
    let url = reg.sse_url();
    let token = reg.token().to_string();
    let id = reg.id().to_string();
    let mut c = SseClient::connect(&url, &token).await;
    c.initialize().await;
    drop(reg.detach());
    // The open stream ends when the lease expires.
    let ended = c.next_message(5).await;
    assert!(ended.is_none(), "stream ended on expiry: {ended:?}");
    let resp = http().get(&url).bearer_auth(&token).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    assert!(wait_for_event(&tg, "registration_expired", &id));
}

/// Issue 50 item 3: a renewal and the expiry are one decision. 240 registrations (6 rounds
/// of 40 made at once, so their deadlines fall together and the sweep has a batch to work
/// through) each get one renewal aimed at its own deadline, from 20 ms before to 20 ms after.
/// A 200 means it lives on (served 500 ms past the old deadline, inside the new one); a 404
/// means it expired (404 on its path then). Never a 200 and then a 404.
async fn renewals_racing_the_deadline_are_one_decision(store: &str) {
    let d = common::daemon::Daemon::start(
        &format!("[store]\nbackend = \"{store}\"\n"),
        "",
        "warn",
        &[],
    );
    // Keeps the data listener up while the others expire.
    let _keeper = d
        .register(serde_json::json!({"agent_id": "keeper", "tools": ["demo.*"]}))
        .await;
    let (mut won, mut lost) = (0, 0);
    for round in 0..6 {
        let made = futures::future::join_all((0..40).map(|i| {
            d.register(serde_json::json!({
                "agent_id": format!("racer-{round}-{i}"),
                "tools": ["demo.*"],
                "ttl_s": 1,
            }))
        }))
        .await;
        let tries = made.iter().enumerate().map(|(i, reg)| {
            let id = reg["id"].as_str().unwrap().to_string();
            let deadline =
                chrono::DateTime::parse_from_rfc3339(reg["expires_at"].as_str().unwrap())
                    .unwrap()
                    .timestamp_millis();
            let aim = deadline - 20 + i as i64;
            let d = &d;
            async move {
                let wait = aim - chrono::Utc::now().timestamp_millis();
                tokio::time::sleep(Duration::from_millis(wait.max(0) as u64)).await;
                let (status, body) = d
                    .admin_call(
                        reqwest::Method::POST,
                        &format!("/v1/registrations/{id}/renew"),
                        None,
                    )
                    .await;
                assert!(status == 200 || status == 404, "{status} {body}");
                (deadline, status)
            }
        });
        let answers = futures::future::join_all(tries).await;
        // Each checked 500 ms after its old deadline (within a renewal's new one).
        let mut order: Vec<_> = made.iter().zip(&answers).collect();
        order.sort_by_key(|(_, (at, _))| *at);
        for (reg, (deadline, renewed)) in order {
            let wait = deadline + 500 - chrono::Utc::now().timestamp_millis();
            tokio::time::sleep(Duration::from_millis(wait.max(0) as u64)).await;
            let resp = http()
                .post(reg["mcp_url"].as_str().unwrap())
                .bearer_auth(reg["token"].as_str().unwrap())
                .header("accept", "application/json, text/event-stream")
                .json(
                    &serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "racer", "version": "1"}}}),
                )
                .send()
                .await
                .unwrap();
            let served = resp.status() != 404;
            match renewed {
                200 => {
                    won += 1;
                    assert!(
                        served,
                        "{store}: renewed (200) and then expired: {}",
                        reg["id"]
                    );
                }
                _ => {
                    lost += 1;
                    assert!(!served, "{store}: renewal refused (404) yet still served");
                }
            }
        }
    }
    eprintln!("{store}: {won} renewals won, {lost} lost");
    assert!(
        won > 0 && lost > 0,
        "the renewals straddle the deadlines: {won} won, {lost} lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renew_racing_expiry_is_one_decision_on_the_memory_store() {
    renewals_racing_the_deadline_are_one_decision("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renew_racing_expiry_is_one_decision_on_the_sqlite_store() {
    renewals_racing_the_deadline_are_one_decision("sqlite").await;
}
