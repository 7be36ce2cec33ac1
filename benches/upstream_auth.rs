//! What a call through an OAuth upstream with a cached token adds (issue 47, item 6): the
//! per-request header work of `upstream::http` before the POST, for a static configured
//! `Authorization` header (the baseline: the configured headers cloned, `Accept` and
//! `Content-Type` set) beside a cached `client_credentials` token and a cached
//! `token_exchange` token (the same, plus `Tokens::get` finding the cached token (a lock, an
//! `Instant::now()`, the registration's subject cell read for an exchange), the
//! `Authorization` header set from it, and what `send_with_token` keeps for its one retry
//! after a 401: a clone of the headers and of the body). The POST itself (reqwest, TLS, the
//! upstream) is the same for all three and left out. The one token request each holder makes
//! goes to a token endpoint on 127.0.0.1 that this bench serves; the bench checks that each
//! holder made exactly one (every measured call a cache hit).
//!
//! `cargo bench --bench upstream_auth` prints ns per call side by side;
//! `upstream_auth --calls N CASE` (CASE: static, client_credentials, token_exchange) runs only
//! N calls of CASE, for bench/callgrind_upstream_auth.sh (instructions per call).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use gatehouse::config::{OAuthConfig, OAuthGrant};
use gatehouse::testing::upstream::oauth::{exchange_tokens, OAuthClient, Tokens};
use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE};

/// A token endpoint on 127.0.0.1: answers every request with a one-hour bearer token and
/// counts them. Returns its URL and the count.
fn token_endpoint() -> (String, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/token", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            // The head, then the form its Content-Length announces.
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            let body_at = loop {
                let n = s.read(&mut chunk).unwrap_or(0);
                if n == 0 {
                    break None;
                }
                buf.extend_from_slice(&chunk[..n]);
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break Some(i + 4);
                }
            };
            let Some(body_at) = body_at else { continue };
            let head = String::from_utf8_lossy(&buf[..body_at]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < body_at + len {
                let n = s.read(&mut chunk).unwrap_or(0);
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            counted.fetch_add(1, Ordering::SeqCst);
            let body = r#"{"access_token":"eyJhbGciOiJSUzI1NiJ9.bench-access-token-0123456789abcdef","token_type":"Bearer","expires_in":3600}"#;
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, count)
}

fn client(url: &str, grant: OAuthGrant) -> Arc<OAuthClient> {
    Arc::new(OAuthClient::new(
        "up",
        OAuthConfig {
            issuer: None,
            token_url: Some(url.to_string()),
            client_id: "gatehouse".into(),
            client_secret_file: None,
            scope: Some("mcp".into()),
            resource: None,
            grant,
        },
    ))
}

/// A `tools/call` body of a typical size.
fn body() -> Vec<u8> {
    br#"{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{"name":"search","arguments":{"query":"open issues assigned to me","limit":20}}}"#.to_vec()
}

/// `headers_for_post` without a session: the configured headers, then the two it always sets.
fn base_headers(configured: &HeaderMap) -> HeaderMap {
    let mut h = configured.clone();
    h.insert(
        ACCEPT,
        HeaderValue::from_static("application/json, text/event-stream"),
    );
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h
}

/// One call's header work with a static `Authorization` among the configured headers.
fn static_call(configured: &HeaderMap) {
    let h = base_headers(configured);
    black_box((h, body()));
}

/// One call's header work with a token holder (`send_with_token` up to its first send).
async fn token_call(configured: &HeaderMap, tokens: &Tokens) {
    let mut h = base_headers(configured);
    let body = bytes::Bytes::from(body());
    let token = tokens.get().await.unwrap();
    h.insert(AUTHORIZATION, token.header.clone());
    // Kept for the one retry after a 401: the first send gets clones.
    black_box((h.clone(), body.clone()));
    black_box((h, body, token));
}

struct Setup {
    with_static: HeaderMap,
    without: HeaderMap,
    cc: Arc<Tokens>,
    tx: Arc<Tokens>,
}

async fn setup() -> Setup {
    let (url, count) = token_endpoint();
    let mut static_value =
        HeaderValue::from_static("Bearer eyJhbGciOiJSUzI1NiJ9.bench-access-token-0123456789abcdef");
    static_value.set_sensitive(true);
    let mut with_static = HeaderMap::new();
    with_static.insert(AUTHORIZATION, static_value);
    let cc = Tokens::own(client(&url, OAuthGrant::ClientCredentials));
    let tx = exchange_tokens(
        client(&url, OAuthGrant::TokenExchange),
        "subject-token-of-the-run-0123456789",
    )
    .unwrap();
    // The one token request of each; every call measured after it finds the cached token.
    cc.get().await.unwrap();
    tx.get().await.unwrap();
    assert_eq!(count.load(Ordering::SeqCst), 2);
    Setup {
        with_static,
        without: HeaderMap::new(),
        cc,
        tx,
    }
}

async fn run(s: &Setup, case: &str, n: u32) {
    match case {
        "static" => {
            for _ in 0..n {
                static_call(black_box(&s.with_static));
            }
        }
        "client_credentials" => {
            for _ in 0..n {
                token_call(black_box(&s.without), &s.cc).await;
            }
        }
        "token_exchange" => {
            for _ in 0..n {
                token_call(black_box(&s.without), &s.tx).await;
            }
        }
        other => panic!("unknown case {other}"),
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s = rt.block_on(setup());
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--calls") {
        let n: u32 = args[i + 1].parse().unwrap();
        rt.block_on(run(&s, &args[i + 2], n));
        return;
    }
    let n = 1_000_000;
    let mut figures = Vec::new();
    for case in ["static", "client_credentials", "token_exchange"] {
        rt.block_on(run(&s, case, n / 10));
        let t = Instant::now();
        rt.block_on(run(&s, case, n));
        let ns = t.elapsed().as_nanos() as f64 / f64::from(n);
        figures.push(ns);
        println!("{case:<64} {ns:>9.0} ns/call");
    }
    println!(
        "added by a cached token: client_credentials {:+.0} ns/call, token_exchange {:+.0} ns/call",
        figures[1] - figures[0],
        figures[2] - figures[0]
    );
}
