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
