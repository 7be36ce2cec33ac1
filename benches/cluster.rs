//! Release propagation on a cluster under load (issue 36, item 3): 3 real etcd members
//! (Debian `etcd-server`) and 3 release-built `gatehouse serve` nodes on loopback; ≥ 200
//! releases, each made on one node while two clients per node call a long-lived registration
//! on every node; after each DELETE every node is probed until it answers 404. Printed beside
//! a baseline measured in the same run: the same releases under the same load on one node
//! with its own sqlite store (no propagation: the DELETE's own commit and the first 404).
//!
//!     cargo bench --features cluster --bench cluster [-- --releases N --callers C]
//!
//! Then read-your-writes (issue 50): as many creates, each followed at once by one call on
//! another node (`creates_then_another_node`), all to be served; the create's latency beside
//! the single node's.
//!
//! The measurement is tests/common/cluster.rs's `releases_under_load`, which the acceptance
//! test (`cluster::any_node_serves_any_registration_and_a_release_holds_on_all_within_the_bound`)
//! runs on debug builds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::cluster::{
    creates_then_another_node, etcd_node, pct, releases_under_load, Etcd, Propagation,
    ReadYourWrites,
};
use common::daemon::Daemon;

/// B (the default `release_bound_ms`).
const BOUND: Duration = Duration::from_millis(1000);

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn row(what: &str, p: &Propagation) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "| {what} | {} | {:.1} | {:.1} | {:.1} | {} |",
        p.samples.len(),
        ms(p.p50()),
        ms(p.p99()),
        ms(p.max()),
        p.served
    )
}

fn ryw_row(what: &str, r: &ReadYourWrites) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "| {what} | {} | {:.1} | {:.1} | {:.1} | {} |",
        r.creates.len(),
        ms(pct(&r.creates, 0.5)),
        ms(pct(&r.creates, 0.99)),
        ms(r.creates[r.creates.len() - 1]),
        r.served
    )
}

fn main() {
    // `cargo test --all-targets` runs this harness-less bench as a test binary without
    // `--bench` (as it does benches/gateway): the cluster run belongs to `cargo bench`.
    if !std::env::args().any(|a| a == "--bench") {
        println!("cluster bench: not run under cargo test; use `cargo bench --features cluster --bench cluster`");
        return;
    }
    let releases = arg("--releases", 200).max(1);
    let callers = arg("--callers", 2).max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        eprintln!("baseline: one node, sqlite store, {releases} releases, {callers} callers");
        let single = Daemon::start("", "", "gatehouse=warn", &[]);
        let base = releases_under_load(&[&single], releases, callers, BOUND).await;
        let base_ryw = creates_then_another_node(&[&single], releases).await;
        drop(single);

        eprintln!(
            "cluster: 3 etcd members, 3 nodes, {releases} releases, {callers} callers per node"
        );
        let etcd = Etcd::start().await;
        let eps = etcd.endpoints();
        let nodes = [
            etcd_node("a", &eps, BOUND),
            etcd_node("b", &eps, BOUND),
            etcd_node("c", &eps, BOUND),
        ];
        let cluster =
            releases_under_load(&[&nodes[0], &nodes[1], &nodes[2]], releases, callers, BOUND).await;
        let ryw = creates_then_another_node(&[&nodes[0], &nodes[1], &nodes[2]], releases).await;
        drop(nodes);
        drop(etcd);

        println!(
            "release: DELETE sent → the last node's first 404 (bound B = {} ms)",
            BOUND.as_millis()
        );
        println!();
        println!("| setup | releases | p50 ms | p99 ms | max ms | load calls served |");
        println!("|---|---:|---:|---:|---:|---:|");
        println!("{}", row("one node, sqlite (baseline)", &base));
        println!("{}", row("3 nodes on 3 etcd members", &cluster));
        println!();
        println!(
            "cluster: every node acknowledged {} of {} releases; max {} B",
            cluster.acked_all,
            cluster.samples.len(),
            if cluster.max() < BOUND {
                "<"
            } else {
                "≥ (goal missed)"
            }
        );
        println!();
        println!("read-your-writes (issue 50): POST /v1/registrations → 201, then at once one call on the next node");
        println!();
        println!("| setup | creates | create p50 ms | create p99 ms | create max ms | first calls served |");
        println!("|---|---:|---:|---:|---:|---:|");
        println!("{}", ryw_row("one node, sqlite (baseline; same node)", &base_ryw));
        println!("{}", ryw_row("3 nodes on 3 etcd members (next node)", &ryw));
        println!();
        println!(
            "cluster: {} of {} first calls on another node served{}",
            ryw.served,
            ryw.creates.len(),
            if ryw.served == ryw.creates.len() {
                ""
            } else {
                " (goal missed)"
            }
        );
    });
}
