//! `gatehouse serve`: the daemon — the library, a permanent reference on the data server
//! (`pin_server`), the admin API, and signal handling with a bounded graceful shutdown.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;

use crate::admin::{self, TokenSource};
use crate::audit::Record;
use crate::config::{Config, StoreBackend};
use crate::config_load;
use crate::gateway::Gateway;
use crate::sd_notify::{self, Notifier};

use super::runtime::{say, say_at};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Config file: TOML, or an `mcpServers` JSON file.
    /// Default: $GATEHOUSE_CONFIG, else config/gatehouse.toml.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Add the in-process test tools demo.echo, demo.slow, demo.block to the catalog.
    #[arg(long, hide = true)]
    pub test_tools: bool,
    /// Release every registration on a clean stop (SIGTERM, SIGINT), as before the store;
    /// by default a clean stop keeps them for the next start. Also `[store] release_on_exit`.
    #[arg(long)]
    pub release_on_exit: bool,
}

pub fn run(a: ServeArgs) -> ExitCode {
    let path = config_load::resolve_path(a.config);
    // Validated before anything binds (an error is written in the format the environment
    // asks for; the config's own `log_format` applies from here on).
    let config = match config_load::load(&path) {
        Ok(c) => c,
        Err(e) => {
            say_at("ERROR", format_args!("{e}"));
            return ExitCode::FAILURE;
        }
    };
    super::runtime::init_logging("info", config.log_format);
    // At least two workers: a tool that blocks its thread must not also block the signal
    // handling that would force the exit.
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .max(2);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say_at("ERROR", format_args!("cannot start runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let mut config = config;
    config.store.release_on_exit |= a.release_on_exit;
    let code = rt.block_on(daemon(config, path, a.test_tools));
    rt.shutdown_timeout(Duration::from_secs(1));
    code
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    say_at("ERROR", format_args!("{e}"));
    ExitCode::FAILURE
}

async fn daemon(config: Config, path: PathBuf, test_tools: bool) -> ExitCode {
    // Installed first, so a signal during start-up is not the default (abrupt) death; SIGHUP
    // (`systemctl reload`, a closed terminal) reloads the config, never kills.
    let (mut term, mut int, mut hup) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(t), Ok(i), Ok(h)) => (t, i, h),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            return fail(format!("cannot handle signals: {e}"))
        }
    };
    // systemd's `Type=notify` (deploy/gatehouse.service): READY once the listeners answer,
    // RELOADING/READY around a SIGHUP, STOPPING on the way out, WATCHDOG if asked.
    let notifier = match Notifier::from_env() {
        Ok(n) => n.map(Arc::new),
        Err(e) => {
            say_at("WARN", format_args!("NOTIFY_SOCKET unusable: {e}"));
            None
        }
    };
    open_files(&config);
    let grace = Duration::from_secs(config.shutdown_grace_s);
    let admin_listen = config.admin_listen.clone();
    let release_on_exit = config.store.release_on_exit;
    let gw = match Gateway::with_store_default(config, StoreBackend::Sqlite) {
        Ok(g) => g,
        Err(e) => return fail(e),
    };
    if test_tools {
        for t in super::test_tools::all() {
            gw.add_tool(t);
        }
    }
    gw.set_config_path(path);
    let data_addr = match gw.pin_server() {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let restored = match restore(&gw).await {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let listener = match admin::bind(&admin_listen).await {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let admin_addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => return fail(e),
    };
    let (token, source) = match admin::admin_token(gw.config()) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let stop_admin = CancellationToken::new();
    let admin_task = tokio::spawn(admin::serve_with(
        listener,
        admin::router(gw.clone(), &token),
        stop_admin.clone(),
        crate::connections::Limits::admin(&gw.config().connections),
    ));
    drop(token);
    say(format_args!("data listener on http://{data_addr}"));
    say(format_args!("admin listener on http://{admin_addr}"));
    match source {
        TokenSource::Env => say(format_args!("admin token from GATEHOUSE_ADMIN_TOKEN")),
        TokenSource::File(p) => say(format_args!("admin token file {}", p.display())),
    }
    say(format_args!("audit log {}", gw.audit().path().display()));
    say(format_args!("{restored}"));
    say(format_args!("ready"));
    // Both listeners are bound and their accept loops run: a connection made now is answered.
    notify(notifier.as_deref(), sd_notify::READY);
    let watchdog = notifier.as_ref().and_then(watchdog);

    let which = until_stopped(&gw, notifier.as_deref(), &mut term, &mut int, &mut hup).await;
    say(format_args!(
        "{which}: shutting down (grace {} s; a second signal forces)",
        grace.as_secs()
    ));
    notify(notifier.as_deref(), sd_notify::STOPPING);
    // Stop accepting registrations first, then: cancel calls, end streams, release every
    // registration (audited), stop the data listener, flush the audit.
    stop_admin.cancel();
    let graceful = async {
        if release_on_exit || !gw.store_durable() {
            gw.shutdown().await;
        } else {
            let kept = gw.shutdown_keeping().await;
            say(format_args!(
                "{kept} registration(s) kept in the store for the next start"
            ));
        }
        let _ = admin_task.await;
        // Records are written in order: once this one is, every earlier one is too.
        let _ = gw.audit().record(Record::event("daemon_stopped")).await;
    };
    let code = tokio::select! {
        _ = graceful => {
            // Every upstream group was torn down by now; any left (a teardown cut short
            // whose transport is still referenced) is killed rather than left behind.
            kill_upstream_groups();
            say(format_args!("stopped"));
            ExitCode::SUCCESS
        }
        _ = tokio::time::sleep(grace) => forced("grace period over"),
        _ = term.recv() => forced("second signal"),
        _ = int.recv() => forced("second signal"),
    };
    if let Some(w) = watchdog {
        w.abort();
    }
    code
}

/// Raises the open-files limit before anything is sized from it (the data listener's auto
/// connection cap), and says what the cap leaves.
fn open_files(config: &Config) {
    match crate::connections::raise_nofile_limit() {
        Ok((before, now)) if before != now => say(format_args!(
            "open-files limit raised from {before} to {now}"
        )),
        Ok(_) => {}
        Err(e) => say_at(
            "WARN",
            format_args!("cannot raise the open-files limit: {e}"),
        ),
    }
    let data_limits = crate::connections::Limits::data(&config.connections);
    let nofile = crate::connections::nofile_soft_limit();
    say(format_args!(
        "open-files limit {nofile}; data connections at most {}",
        data_limits.max
    ));
    if data_limits.max as u64 > nofile.saturating_sub(64) {
        say_at(
            "WARN",
            format_args!("warning: connections.max = {} leaves too few of the {nofile} file descriptors for the rest (accepts will fail before the cap)",
            data_limits.max
        ));
    }
}

/// Loads the registrations: restored from a local store, or (a cluster node) from the
/// replica; the line that says how many.
async fn restore(gw: &Gateway) -> Result<String, String> {
    let (kind, store_path) = gw.store_location();
    #[cfg(feature = "cluster")]
    let cluster = if kind == "etcd" {
        // A cluster node: the replica (range read + watch, started with the gateway) loads
        // the registrations.
        let (live, fresh) = gw.cluster_ready(Duration::from_secs(10)).await;
        Some(format!(
            "registration store etcd: node {} serving {live} registration(s){}",
            gw.config().node_id.as_deref().unwrap_or(""),
            if fresh {
                ""
            } else {
                "; fenced until the store answers"
            }
        ))
    } else {
        None
    };
    #[cfg(not(feature = "cluster"))]
    let cluster: Option<String> = None;
    Ok(match cluster {
        Some(summary) => summary,
        None => match gw.restore().await {
            Ok(r) => format!(
            "registration store {kind}{}: {} registration(s) restored, {} expired while stopped",
            store_path
                .map(|p| format!(" {}", p.display()))
                .unwrap_or_default(),
            r.live,
            r.expired
        ),
            Err(e) => return Err(e.to_string()),
        },
    })
}

/// Serves until SIGTERM or SIGINT (which is returned); a SIGHUP reloads the config and serves
/// on, with the old config if the new one is refused.
async fn until_stopped(
    gw: &Gateway,
    notifier: Option<&Notifier>,
    term: &mut Signal,
    int: &mut Signal,
    hup: &mut Signal,
) -> &'static str {
    loop {
        tokio::select! {
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
            _ = hup.recv() => {
                let reloading = sd_notify::reloading().unwrap_or_else(|_| "RELOADING=1".into());
                notify(notifier, &reloading);
                let outcome = gw.reload_config().await;
                match &outcome {
                    Ok(r) => say(format_args!("SIGHUP: {}", r.summary())),
                    Err(e) => say_at("WARN", format_args!("SIGHUP: config not reloaded: {e}")),
                }
                // Applied or refused, the daemon serves (the old config, if refused).
                notify(notifier, sd_notify::READY);
            }
        }
    }
}

/// The watchdog pings systemd asked for (`WatchdogSec=`), on a task the daemon aborts on exit.
fn watchdog(n: &Arc<Notifier>) -> Option<tokio::task::JoinHandle<()>> {
    let every = n.watchdog_every()?;
    let n = n.clone();
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            notify(Some(&n), sd_notify::WATCHDOG);
        }
    }))
}

/// One notification to systemd, when started by a notify unit; a failed send is a warning
/// (the daemon serves the same either way).
fn notify(notifier: Option<&Notifier>, state: &str) {
    if let Some(n) = notifier {
        if let Err(e) = n.notify(state) {
            let what = state.lines().next().unwrap_or(state);
            say_at("WARN", format_args!("sd_notify {what}: {e}"));
        }
    }
}

fn forced(why: &str) -> ExitCode {
    say_at("WARN", format_args!("{why}: forced exit"));
    // `exit` runs no destructor: the upstream process groups still being torn down politely
    // are SIGKILLed here, or they would outlive the daemon.
    kill_upstream_groups();
    // Leaves at once: a blocked worker thread would otherwise hold the runtime's shutdown.
    std::process::exit(2)
}

fn kill_upstream_groups() {
    let n = crate::upstream::kill_all_groups();
    if n > 0 {
        say(format_args!(
            "SIGKILL sent to {n} upstream process group(s)"
        ));
    }
}
