//! The registration store's cost (issue 35): register + release cycles/s through the Gateway
//! API at 1 and 64 concurrent clients, `memory` and `sqlite` side by side in one run, with
//! the store's commits per cycle (each commit is one fsync of the WAL under
//! `synchronous=FULL`; a checkpoint adds the database file's) and the create latency.

use super::*;
use gatehouse::config::StoreBackend;

struct Point {
    cycles: u64,
    secs: f64,
    commits: u64,
    create_ms: Vec<f64>,
    errors: u64,
}

fn run_point(srv: &Runtime, backend: StoreBackend, clients: usize, dur: Duration) -> Result<Point> {
    let dir = tempfile::tempdir()?;
    let mut c = gateway_config(dir.path());
    c.store.backend = Some(backend);
    c.store.path = Some(dir.path().join("store.sqlite"));
    let gw = srv.block_on(async { Gateway::new(c) })?;
    let before = gw.store_stats().commits;
    let t0 = Instant::now();
    let (cycles, errors, create_ms) = srv.block_on(async {
        let _ = gw.pin_server();
        let deadline = Instant::now() + dur;
        let mut hs = Vec::new();
        for _ in 0..clients {
            let gw = gw.clone();
            hs.push(tokio::spawn(async move {
                let (mut n, mut e, mut lat) = (0u64, 0u64, Vec::new());
                while Instant::now() < deadline {
                    let t = Instant::now();
                    match gw
                        .register(RegistrationSpec::new("bench").with_tool(echo_tool()))
                        .await
                    {
                        Ok(reg) => {
                            lat.push(t.elapsed().as_secs_f64() * 1000.0);
                            reg.release().await;
                            n += 1;
                        }
                        Err(_) => e += 1,
                    }
                }
                (n, e, lat)
            }));
        }
        let (mut n, mut e, mut lat) = (0, 0, Vec::new());
        for h in hs {
            if let Ok((a, b, l)) = h.await {
                n += a;
                e += b;
                lat.extend(l);
            }
        }
        (n, e, lat)
    });
    let secs = t0.elapsed().as_secs_f64();
    let commits = gw.store_stats().commits - before;
    srv.block_on(gw.shutdown());
    Ok(Point {
        cycles,
        secs,
        commits,
        create_ms,
        errors,
    })
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

pub fn store(r: &mut Report, o: &Opts, srv: &Runtime) -> Result<()> {
    r.line("\n### Registration store (issue 35): register + release cycles, Gateway API\n");
    r.line("Each cycle: `register` (grants resolved, store create committed, audit record) then `release` (store release committed, audit record); no HTTP. `sqlite`: WAL, `synchronous=FULL`, on this machine's disk; commits are the store's transactions (one WAL fsync each; concurrent writes share one).\n");
    r.line("| store | clients | cycles/s | store commits per cycle | create p50 | create p99 | errors |");
    r.line("|---|---|---|---|---|---|---|");
    let dur = o.duration.max(Duration::from_secs(2));
    for clients in [1usize, 64] {
        for backend in [StoreBackend::Memory, StoreBackend::Sqlite] {
            let mut p = run_point(srv, backend, clients, dur)?;
            p.create_ms.sort_by(f64::total_cmp);
            let rate = p.cycles as f64 / p.secs;
            let name = match backend {
                StoreBackend::Memory => "memory",
                StoreBackend::Sqlite => "sqlite",
                StoreBackend::Etcd => "etcd",
            };
            let per = p.commits as f64 / p.cycles.max(1) as f64;
            let p99 = pct(&p.create_ms, 0.99);
            r.line(&format!(
                "| {name} | {clients} | {rate:.0} | {per:.3} | {:.2} ms | {p99:.2} ms | {} |",
                pct(&p.create_ms, 0.5),
                p.errors
            ));
            if backend == StoreBackend::Sqlite && clients == 64 {
                r.verdict(
                    "sqlite store: register+release ≥ 5,000 cycles/s at 64 clients",
                    rate >= 5000.0,
                    format!("{rate:.0}/s, {per:.3} commits per cycle"),
                );
                r.verdict(
                    "sqlite store: create p99 ≤ 10 ms at 64 clients",
                    p99 <= 10.0,
                    format!("{p99:.2} ms"),
                );
            }
        }
    }
    Ok(())
}
