//! The operator console's cost (issue 29): proxied calls/s at 64 clients with 1,000 live
//! registrations, with the console's polling on (a page's two calls every 2 s: `GET
//! /v1/console/stats` and `GET /v1/audit?limit=50&max_bytes=262144`) and off, in alternating
//! rounds; then the server CPU one poll costs, measured over back-to-back polls.

use super::*;

/// The page's polling period (src/console/ui/console.js `POLL_MS`).
const POLL: Duration = Duration::from_secs(2);
const REGISTRATIONS: usize = 1000;
const CLIENTS: usize = 64;
const AUDIT_PATH: &str = "/v1/audit?limit=50&max_bytes=262144";

/// One poll of the page: both calls, on a fresh connection. Returns the bytes answered.
async fn poll_once(addr: SocketAddr, token: &str) -> Result<usize> {
    let mut s = connect(addr).await?;
    let mut bytes = 0;
    for path in ["/v1/console/stats", AUDIT_PATH] {
        let req = Request::builder()
            .method("GET")
            .uri(path)
            .header("host", addr.to_string())
            .header("authorization", format!("Bearer {token}"))
            .body(Full::new(Bytes::new()))?;
        let (st, _, body) = roundtrip(&mut s, req).await?;
        if !st.is_success() {
            bail!("GET {path}: {st}");
        }
        bytes += body.len();
    }
    Ok(bytes)
}

/// 100 pages at once, in effect: a poll every 20 ms, so that a cost too small to see at the
/// page's rate shows above the noise (and is divided back by 100).
const FAST: Duration = Duration::from_millis(20);

/// A page polling every `period` on its own thread until the returned flag is set.
fn poller(
    addr: SocketAddr,
    token: String,
    period: Duration,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let h = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut polls = 0;
            while !flag.load(Ordering::Relaxed) {
                match poll_once(addr, &token).await {
                    Ok(_) => polls += 1,
                    Err(e) => eprintln!("  console poll failed: {e:#}"),
                }
                let until = Instant::now() + period;
                while Instant::now() < until && !flag.load(Ordering::Relaxed) {
                    tokio::time::sleep((until - Instant::now()).min(Duration::from_millis(50)))
                        .await;
                }
            }
            polls
        })
    });
    (stop, h)
}

pub(super) fn console(r: &mut Report, o: &Opts, srv: &Runtime, cli: &Runtime) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let gw = echo_gateway(srv, dir.path())?;
    // The admin router as `gatehouse serve` builds it (which turns the console's series on),
    // served on the gateway's runtime.
    let token = "bench-admin-token".to_string();
    let router = gatehouse::testing::admin::router(gw.clone(), &token);
    let listener = srv.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let admin = listener.local_addr()?;
    let stop_admin = tokio_util::sync::CancellationToken::new();
    let admin_task = srv.spawn(gatehouse::testing::admin::serve(
        listener,
        router,
        stop_admin.clone(),
    ));
    let mut regs = Vec::with_capacity(REGISTRATIONS);
    for i in 0..REGISTRATIONS {
        let spec = RegistrationSpec::new(format!("agent-{}", i % 40))
            .label(format!("run-{i}"))
            .ttl_s(3600)
            .grant("echo.echo");
        regs.push(srv.block_on(gw.register(spec))?);
    }
    let addr = gw.local_addr().context("no listener")?;
    let target = Target::Streamable {
        addr,
        path: format!("/gw/{}/mcp", regs[0].id()),
        token: Some(regs[0].token().to_string()),
        tool: "echo.echo".into(),
        version: "2025-06-18",
    };
    // Long enough rounds that each holds a few polls.
    let mut lo = Opts {
        quick: o.quick,
        out: None,
        only: Vec::new(),
        external: Vec::new(),
        duration: o.duration * 2,
        warmup: o.warmup,
        concurrency: vec![CLIENTS],
        calls: None,
        targets: Vec::new(),
        rounds: if o.quick { 2 } else { o.rounds.max(5) },
    };
    lo.duration = lo.duration.max(Duration::from_secs(2));
    // Warm the upstream connection and the series.
    cli.block_on(load(
        &target,
        CLIENTS,
        &Opts {
            duration: Duration::from_secs(1),
            ..clone_opts(&lo)
        },
    ))?;
    let (mut off, mut on, mut fast) = (Vec::new(), Vec::new(), Vec::new());
    let (mut polls, mut fast_polls) = (0u64, 0u64);
    for round in 0..lo.rounds {
        // Rotate which arm goes first, so a drift of the machine weighs on all alike.
        for k in 0..3 {
            match (round + k) % 3 {
                0 => off.push(cli.block_on(load(&target, CLIENTS, &lo))?),
                arm => {
                    let period = if arm == 1 { POLL } else { FAST };
                    let (stop, h) = poller(admin, token.clone(), period);
                    let s = cli.block_on(load(&target, CLIENTS, &lo))?;
                    stop.store(true, Ordering::Relaxed);
                    let n = h.join().unwrap_or(0);
                    if arm == 1 {
                        polls += n;
                        on.push(s);
                    } else {
                        fast_polls += n;
                        fast.push(s);
                    }
                }
            }
        }
    }
    // The cost of one poll, alone: back-to-back polls, the server threads' CPU over them.
    let n = if o.quick { 30 } else { 100 };
    let (cpu0, t0) = (server_cpu_ticks(), Instant::now());
    let mut bytes = 0;
    cli.block_on(async {
        for _ in 0..n {
            bytes = poll_once(admin, &token).await?;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let wall = t0.elapsed();
    let cpu_ms = (server_cpu_ticks() - cpu0) as f64 * 1e3 / ticks_per_sec() / n as f64;

    let (m_off, m_on) = (
        median(&off).context("no round")?,
        median(&on).context("no round")?,
    );
    let m_fast = median(&fast).context("no round")?;
    let drop = 100.0 * (1.0 - m_on.rps / m_off.rps);
    let fast_drop = 100.0 * (1.0 - m_fast.rps / m_off.rps);
    // Polls per second in the fast arm against the page's one per 2 s.
    let fast_rate = fast_polls as f64 / (lo.rounds as f64 * lo.duration.as_secs_f64()).max(1e-9);
    let scale = fast_rate * POLL.as_secs_f64();
    let pairs: Vec<f64> = on
        .iter()
        .zip(&off)
        .map(|(a, b)| 100.0 * (1.0 - a.rps / b.rps))
        .collect();
    let spread = |v: &[Stats]| {
        let lo = v.iter().map(|s| s.rps).fold(f64::INFINITY, f64::min);
        let hi = v.iter().map(|s| s.rps).fold(f64::NEG_INFINITY, f64::max);
        format!("{lo:.0}–{hi:.0}")
    };
    r.line(&format!(
        "\n### Console: its polling's cost on proxied calls ({CLIENTS} clients, {REGISTRATIONS} registrations)\n"
    ));
    r.line(&format!(
        "Gateway → stdio echo, Streamable HTTP, {CLIENTS} clients on one registration of {REGISTRATIONS} live ones (40 agents); the admin router built as the daemon builds it (series on in every arm). \"on\": a page's polling — `GET /v1/console/stats` and `GET {AUDIT_PATH}` every 2 s on the same runtime ({polls} polls in all); \"×100\": the same every 20 ms ({fast_polls} polls, {fast_rate:.0}/s), to see the cost above the noise; \"off\": none. {} rounds of {:.0} s each, rotating which arm goes first; medians, and the range over rounds.\n",
        lo.rounds,
        lo.duration.as_secs_f64()
    ));
    r.line("| polling | calls/s (median) | calls/s (rounds) | p50 µs | p99 µs | server CPU µs/call | errors |\n|---|---:|---:|---:|---:|---:|---:|");
    for (name, m, v) in [
        ("off", &m_off, &off),
        ("on (a poll every 2 s)", &m_on, &on),
        ("×100 (a poll every 20 ms)", &m_fast, &fast),
    ] {
        r.line(&format!(
            "| {name} | {:.0} | {} | {:.0} | {:.0} | {:.1} | {} |",
            m.rps,
            spread(v),
            m.p50_us,
            m.p99_us,
            m.cpu_us,
            m.errors
        ));
    }
    let plo = pairs.iter().copied().fold(f64::INFINITY, f64::min);
    let phi = pairs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    r.line(&format!(
        "\nAt ×100 ({scale:.0} times the page's rate): {fast_drop:+.1}% of the median calls/s, so one page costs about {:+.2}%.",
        fast_drop / scale.max(1.0)
    ));
    r.line(&format!(
        "\nDrop with polling on: {drop:+.1}% of the median (round pairs {plo:+.1}% to {phi:+.1}%). One poll alone ({n} back to back, no load): {cpu_ms:.2} ms of server CPU, {:.1} ms wall, {bytes} bytes answered — {:.2}% of one core at one poll every 2 s.",
        wall.as_secs_f64() * 1e3 / n as f64,
        cpu_ms / 20.0
    ));
    r.throughput_verdict(
        "console polling on: ≥ 98% of calls/s at 64 clients, 1,000 registrations",
        &m_on,
        &m_off,
        0.98,
        Some(format!(
            "round pairs {plo:+.1}% to {phi:+.1}% drop; at ×100 {fast_drop:+.1}% (≈ {:+.2}% per page); {cpu_ms:.2} ms CPU per poll",
            fast_drop / scale.max(1.0)
        )),
    );
    srv.block_on(async {
        for reg in regs {
            reg.release().await;
        }
        stop_admin.cancel();
        let _ = admin_task.await;
        gw.shutdown().await;
    });
    Ok(())
}

fn clone_opts(o: &Opts) -> Opts {
    Opts {
        quick: o.quick,
        out: None,
        only: Vec::new(),
        external: Vec::new(),
        duration: o.duration,
        warmup: o.warmup,
        concurrency: o.concurrency.clone(),
        calls: None,
        targets: Vec::new(),
        rounds: o.rounds,
    }
}
