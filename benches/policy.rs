//! Policy evaluation cost per call (issue 49): a five-rule policy decided, beside the
//! baseline of no policy (what every call pays then: one atomic load). Prints ns per call.
//!
//! `cargo bench --bench policy`
//!
//! `POLICY_BENCH_CALLS=N` times N calls per case instead of 200,000 (bench/callgrind_policy.sh
//! counts instructions per decision with two values of N).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::Instant;

use gatehouse::policy::{
    compile, decide, CallFacts, Decision, Effect, Layers, Live, PolicyConfig, RuleSpec,
};
use serde_json::json;

fn rule(id: &str, when: &str, effect: Effect) -> RuleSpec {
    RuleSpec {
        id: id.into(),
        when: when.into(),
        effect,
        reason: Some(id.to_string()),
        approver: None,
        timeout_s: None,
        upstream: None,
    }
}

fn per_call(name: &str, n: u32, mut f: impl FnMut()) -> f64 {
    for _ in 0..n / 10 {
        f();
    }
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    let ns = t.elapsed().as_nanos() as f64 / f64::from(n);
    println!("{name:<64} {:>9.0} ns/call", ns);
    ns
}

fn main() {
    let n = std::env::var("POLICY_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    // Baseline: no policy configured (the call path's check).
    let off = Live::new(&PolicyConfig::default()).unwrap();
    per_call("no policy: Live::current() (None)", n, || {
        black_box(black_box(&off).current());
    });

    // Five rules over the tool, its annotations, the agent and the arguments; none matches
    // (every rule evaluated: the worst case for an allowed call).
    let five = compile(
        &[
            rule(
                "workspace_only",
                "tool.name == 'fs.write' && !args.path.startsWith('/workspace/')",
                Effect::Deny,
            ),
            rule(
                "no_destructive",
                "tool.annotations.destructiveHint == true && upstream == 'prod'",
                Effect::Deny,
            ),
            rule("agent_block", "agent.id == 'blocked-agent'", Effect::Deny),
            rule(
                "big_amount",
                "has(args.amount) && args.amount > 1000",
                Effect::Deny,
            ),
            rule("label", "'quarantine' in registration.labels", Effect::Deny),
        ],
        "policy",
        false,
    )
    .unwrap();
    let descriptor = json!({"name": "fs.write", "annotations": {"destructiveHint": false, "readOnlyHint": false}});
    let args = json!({"path": "/workspace/notes/today.md", "content": "hello world, a short note"});
    let facts = CallFacts {
        registration_id: "r0123456789abcdef",
        agent_id: "agent-7",
        agent_path: None,
        label: Some("nightly"),
        tool: "fs.write",
        upstream_name: "write",
        descriptor: &descriptor,
        args: &args,
        upstream: Some("fs"),
    };
    let layers = Layers {
        root: Some(&five),
        narrowing: vec![],
    };
    assert_eq!(decide(None, &layers, &facts), Decision::Allow);
    let allowed = per_call(
        "five rules, none matches (all evaluated; allowed)",
        n,
        || {
            black_box(decide(None, black_box(&layers), black_box(&facts)));
        },
    );
    let outside = json!({"path": "/etc/passwd", "content": "x"});
    let denied_facts = CallFacts {
        args: &outside,
        ..facts
    };
    assert!(matches!(
        decide(None, &layers, &denied_facts),
        Decision::Deny { .. }
    ));
    per_call("five rules, the first denies", n, || {
        black_box(decide(None, black_box(&layers), black_box(&denied_facts)));
    });
    println!(
        "goal: five-rule evaluation <= 3000 ns/call: {}",
        if allowed <= 3000.0 { "met" } else { "NOT met" }
    );
}
