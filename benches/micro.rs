//! Micro-benchmarks (Criterion): JSON-RPC parse and classify, the token check, audit encoding.
//!
//! `cargo bench --bench micro`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use gatehouse::testing::audit::{digest_value, Record};
use gatehouse::testing::jsonrpc;
use serde_json::{json, Value};
use sha2::Digest;

const CALL: &str = r#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"echo","arguments":{"message":"hello","text":"hello"},"_meta":{"progressToken":7,"io.example/unknown":{"a":[1,2,3]}}}}"#;

fn parse(c: &mut Criterion) {
    c.bench_function("jsonrpc: parse_body + classify (tools/call)", |b| {
        b.iter(|| {
            let body = jsonrpc::parse_body(black_box(CALL.as_bytes())).unwrap();
            match body {
                jsonrpc::Body::Single(v) => black_box(jsonrpc::classify(v).unwrap()),
                jsonrpc::Body::Batch(_) => unreachable!(),
            };
        })
    });
    c.bench_function(
        "jsonrpc: parse_request, the direct path (tools/call)",
        |b| b.iter(|| black_box(jsonrpc::parse_request(black_box(CALL.as_bytes())).unwrap())),
    );
    c.bench_function("serde_json: from_slice::<Value> (tools/call)", |b| {
        b.iter(|| black_box(serde_json::from_slice::<Value>(black_box(CALL.as_bytes())).unwrap()))
    });
    let v: Value = serde_json::from_str(CALL).unwrap();
    c.bench_function("serde_json: Value to_string (tools/call)", |b| {
        b.iter(|| black_box(black_box(&v).to_string()))
    });
}

fn token(c: &mut Criterion) {
    let token = gatehouse::testing::registry::new_token();
    let gw_state = {
        // A registration's state is built by the gateway; the check is a digest + ct_eq.
        use sha2::Digest;
        let d: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        d
    };
    c.bench_function("token check: sha256 + constant-time compare", |b| {
        use sha2::Digest;
        use subtle::ConstantTimeEq;
        b.iter(|| {
            let d: [u8; 32] = sha2::Sha256::digest(black_box(token.as_bytes())).into();
            black_box(bool::from(d.ct_eq(&gw_state)))
        })
    });
}

fn audit(c: &mut Criterion) {
    let args = json!({"message":"hello","text":"hello"});
    let rec = Record {
        ts: "2026-11-29T12:00:00.000000Z".into(),
        seq: 123_456,
        event: "governed_mcp_call".into(),
        registration_id: Some("q0b6zN3Lq6m1o0m9v5d0Yw".into()),
        agent_id: Some("agent-7".into()),
        label: Some("run-1".into()),
        session_id: Some("s3ss10n".into()),
        transport: Some("streamable_http".into()),
        tool: Some("echo".into()),
        args_digest: Some(digest_value(&args).into()),
        outcome: Some("ok".into()),
        duration_ms: Some(0.042),
        prev: "0".repeat(64),
        ..Default::default()
    };
    c.bench_function("audit: argument digest", |b| {
        b.iter(|| black_box(digest_value(black_box(&args))))
    });
    c.bench_function("audit: encode record + chain hash", |b| {
        let mut buf = Vec::new();
        b.iter(|| {
            buf.clear();
            black_box(&rec).encode_line(&rec.ts, rec.seq, &rec.prev, &mut buf);
            black_box(sha2::Sha256::digest(&buf))
        })
    });
}

criterion_group!(benches, parse, token, audit);
criterion_main!(benches);
