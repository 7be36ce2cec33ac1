//! What every verb starts with: logging to stderr and a tokio runtime.

use std::io::{IsTerminal, Write};
use std::sync::OnceLock;

use crate::config::LogFormat;

/// The format `init_logging` chose, for the daemon's own lines (`say`).
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// The format named by `GATEHOUSE_LOG_FORMAT`, before a config is read (text if unset or
/// unknown; the config load reports an unknown one).
pub fn env_log_format() -> LogFormat {
    std::env::var("GATEHOUSE_LOG_FORMAT")
        .ok()
        .and_then(|v| LogFormat::parse(&v))
        .unwrap_or_default()
}

/// Logs go to stderr (stdout belongs to stdio JSON-RPC and audit lines); filter from RUST_LOG.
/// `text`: ANSI colour only when stderr is a terminal and `NO_COLOR` is unset, so a file,
/// journald or a pipe gets plain lines. `json`: one JSON object per line.
pub fn init_logging(default: &str, format: LogFormat) {
    let _ = FORMAT.set(format);
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(colour()).try_init(),
        LogFormat::Json => builder
            .json()
            .with_ansi(false)
            .with_current_span(false)
            .try_init(),
    };
}

/// Whether text lines may carry ANSI colour.
fn colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// One of the daemon's own lines (`gatehouse: ready`, where it listens, shutdown): plain
/// `gatehouse: <text>` on stderr, or under `json` an object of the same shape as the log's
/// (`timestamp`, `level`, `fields.message`, `target`), so a collector reads every line.
pub fn say(text: std::fmt::Arguments<'_>) {
    say_at("INFO", text)
}

/// [`say`] for a warning or an error (`level` as tracing writes it: `WARN`, `ERROR`).
pub fn say_at(level: &str, text: std::fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    match FORMAT.get().copied().unwrap_or_else(env_log_format) {
        LogFormat::Text => {
            let _ = writeln!(err, "gatehouse: {text}");
        }
        LogFormat::Json => {
            let line = serde_json::json!({
                "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                "level": level,
                "fields": {"message": text.to_string()},
                "target": "gatehouse",
            });
            let _ = writeln!(err, "{line}");
        }
    }
}

/// A multi-threaded runtime for a verb.
pub(crate) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}
