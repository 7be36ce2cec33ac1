//! Where a configuration comes from: the file named by `--config` or `GATEHOUSE_CONFIG` (TOML,
//! or an `mcpServers` JSON file as desktop MCP clients write it), then `GATEHOUSE_*`
//! environment overrides, then validation — all before anything binds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::config::{Config, ConfigError, LogFormat, UpstreamConfig, UpstreamTransport};

/// The shipped config, used when neither `--config` nor `GATEHOUSE_CONFIG` names one.
pub const DEFAULT_CONFIG_PATH: &str = "config/gatehouse.toml";

/// The daemon's data listener when a JSON `mcpServers` file gives none.
pub const DAEMON_LISTEN: &str = "127.0.0.1:8787";

/// `path`, else `$GATEHOUSE_CONFIG`, else `config/gatehouse.toml`.
pub fn resolve_path(path: Option<PathBuf>) -> PathBuf {
    path.or_else(|| std::env::var_os("GATEHOUSE_CONFIG").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH))
}

/// Reads and validates a config file, applying the process environment's overrides.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    load_with_env(path, |k| std::env::var(k).ok())
}

/// Like `load`, with the environment given as a function (tests).
pub fn load_with_env(
    path: &Path,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let shown = path.display().to_string();
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
        || text.trim_start().starts_with('{');
    let mut config = if is_json {
        from_mcp_servers_json(&text).map_err(|message| ConfigError::Parse {
            path: shown.clone(),
            message,
        })?
    } else {
        toml::from_str::<Config>(&text).map_err(|e| ConfigError::Parse {
            path: shown.clone(),
            message: e.to_string(),
        })?
    };
    apply_env(&mut config, env).map_err(|message| ConfigError::Parse {
        path: shown.clone(),
        message,
    })?;
    config.validate().map_err(|e| match e {
        ConfigError::Invalid(msg) => ConfigError::Parse {
            message: match line_of_key(&text, &msg) {
                Some((line, key)) => format!("line {line}, key `{key}`: {msg}"),
                None => msg,
            },
            path: shown.clone(),
        },
        other => other,
    })?;
    // The tls_* files (issue 46): read and parsed now, so `check-config` and `serve` name a
    // missing or wrong file (and the key) before anything binds.
    for u in &config.upstreams {
        let tls = u.tls();
        if tls.is_set() {
            crate::tls::build(&tls).map_err(|e| {
                let msg = format!("upstream {:?}: {e}", u.id);
                ConfigError::Parse {
                    message: match line_of_key(&text, &msg) {
                        Some((line, key)) => format!("line {line}, key `{key}`: {msg}"),
                        None => msg,
                    },
                    path: shown.clone(),
                }
            })?;
        }
    }
    Ok(config)
}

/// Applies `GATEHOUSE_LISTEN`, `GATEHOUSE_ADMIN_LISTEN`, `GATEHOUSE_AUDIT_PATH`,
/// `GATEHOUSE_NODE_ID`, `GATEHOUSE_LOG_FORMAT` (an unknown format is an error naming it),
/// `GATEHOUSE_STORE` (`memory`, `sqlite`, `sqlite:PATH` or `etcd://host:port,host:port`).
/// (`GATEHOUSE_ADMIN_TOKEN` is read by the admin API itself and never stored in the config.)
pub fn apply_env(config: &mut Config, env: impl Fn(&str) -> Option<String>) -> Result<(), String> {
    let get = |k: &str| env(k).filter(|v| !v.trim().is_empty());
    if let Some(v) = get("GATEHOUSE_LISTEN") {
        config.listen = v;
    }
    if let Some(v) = get("GATEHOUSE_ADMIN_LISTEN") {
        config.admin_listen = v;
    }
    if let Some(v) = get("GATEHOUSE_AUDIT_PATH") {
        config.audit.path = PathBuf::from(v);
    }
    if let Some(v) = get("GATEHOUSE_NODE_ID") {
        config.node_id = Some(v);
    }
    if let Some(v) = get("GATEHOUSE_STORE") {
        let v = v.trim();
        if v == "memory" {
            config.store.backend = Some(crate::config::StoreBackend::Memory);
        } else if v == "sqlite" {
            config.store.backend = Some(crate::config::StoreBackend::Sqlite);
        } else if let Some(list) = v.strip_prefix("etcd://").filter(|p| !p.is_empty()) {
            config.store.backend = Some(crate::config::StoreBackend::Etcd);
            config.store.endpoints = list
                .split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(|e| format!("http://{e}"))
                .collect();
        } else if let Some(path) = v.strip_prefix("sqlite:").filter(|p| !p.is_empty()) {
            config.store.backend = Some(crate::config::StoreBackend::Sqlite);
            config.store.path = Some(PathBuf::from(path));
        } else {
            return Err(format!(
                "GATEHOUSE_STORE = {v:?}: expected \"memory\", \"sqlite\", \"sqlite:PATH\" or \"etcd://host:port,host:port\""
            ));
        }
    }
    if let Some(v) = get("GATEHOUSE_LOG_FORMAT") {
        config.log_format = LogFormat::parse(&v).ok_or_else(|| {
            format!("GATEHOUSE_LOG_FORMAT = {v:?}: expected \"text\" or \"json\"")
        })?;
    }
    apply_otel_env(&mut config.telemetry, &get)
}

/// The OpenTelemetry variables users already know, over `[telemetry]`:
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (as is), `OTEL_EXPORTER_OTLP_ENDPOINT` (`/v1/traces`
/// appended), `OTEL_EXPORTER_OTLP_HEADERS` / `_TRACES_HEADERS` (`k=v,…`, values
/// percent-decoded), `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`,
/// `OTEL_TRACES_SAMPLER_ARG`, `OTEL_SDK_DISABLED` (`true`), `OTEL_BSP_MAX_QUEUE_SIZE`,
/// `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, `OTEL_BSP_EXPORT_TIMEOUT`. A
/// protocol other than `http/protobuf` is an error (the build has no gRPC).
pub fn apply_otel_env(
    t: &mut crate::config::TelemetryConfig,
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<(), String> {
    for k in [
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    ] {
        if let Some(v) = get(k).filter(|v| v.trim() != "http/protobuf") {
            return Err(format!(
                "{k} = {v:?}: gatehouse exports OTLP over HTTP/protobuf only (\"http/protobuf\")"
            ));
        }
    }
    if let Some(v) = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        t.traces_endpoint = Some(v.trim().to_string());
    } else if let Some(v) = get("OTEL_EXPORTER_OTLP_ENDPOINT") {
        t.endpoint = Some(v.trim().to_string());
        t.traces_endpoint = None;
    }
    for k in [
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    ] {
        if let Some(v) = get(k) {
            // Values are secrets: the error names the variable, never the value.
            let pairs = key_values(&v).ok_or_else(|| format!("{k}: expected key=value,…"))?;
            t.headers.extend(pairs);
        }
    }
    if let Some(v) = get("OTEL_SERVICE_NAME") {
        t.service_name = v.trim().to_string();
    }
    if let Some(v) = get("OTEL_RESOURCE_ATTRIBUTES") {
        let pairs = key_values(&v)
            .ok_or_else(|| format!("OTEL_RESOURCE_ATTRIBUTES = {v:?}: expected key=value,…"))?;
        t.resource_attributes.extend(pairs);
    }
    if let Some(v) = get("OTEL_TRACES_SAMPLER") {
        t.sampler = v.trim().to_string();
    }
    if let Some(v) = get("OTEL_TRACES_SAMPLER_ARG") {
        t.sampler_arg = Some(
            v.trim()
                .parse()
                .map_err(|_| format!("OTEL_TRACES_SAMPLER_ARG = {v:?}: expected a number 0-1"))?,
        );
    }
    if let Some(v) = get("OTEL_SDK_DISABLED") {
        t.disabled = v.trim().eq_ignore_ascii_case("true");
    }
    let number = |k: &str| -> Result<Option<u64>, String> {
        get(k)
            .map(|v| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("{k} = {v:?}: expected a whole number"))
            })
            .transpose()
    };
    if let Some(n) = number("OTEL_BSP_MAX_QUEUE_SIZE")? {
        t.max_queue = n as usize;
    }
    if let Some(n) = number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE")? {
        t.max_batch = n as usize;
    }
    if let Some(n) = number("OTEL_BSP_SCHEDULE_DELAY")? {
        t.delay_ms = n;
    }
    if let Some(n) = number("OTEL_BSP_EXPORT_TIMEOUT")? {
        t.export_timeout_ms = n;
    }
    Ok(())
}

/// `k1=v1,k2=v2` (W3C Baggage-like, as the OTel variables are written): keys trimmed, values
/// trimmed and percent-decoded. `None` if a member has no `=` or an empty key.
fn key_values(text: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    for member in text.split(',').filter(|m| !m.trim().is_empty()) {
        let (k, v) = member.split_once('=')?;
        let k = k.trim();
        if k.is_empty() {
            return None;
        }
        out.push((k.to_string(), percent_decode(v.trim())));
    }
    Some(out)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' {
            if let (Some(h), Some(l)) = (
                b.get(i + 1).and_then(|c| hex(*c)),
                b.get(i + 2).and_then(|c| hex(*c)),
            ) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Finds the line that sets the key a validation message is about (messages start with the
/// key or quote an upstream id). Returns (1-based line, key).
fn line_of_key(text: &str, msg: &str) -> Option<(usize, String)> {
    let first = msg.split([' ', '=']).next()?.trim();
    let quoted = msg.split('"').nth(1);
    for (i, line) in text.lines().enumerate() {
        let l = line.trim_start();
        if l.starts_with('#') {
            continue;
        }
        if !first.is_empty()
            && l.starts_with(first)
            && l[first.len()..].trim_start().starts_with('=')
        {
            return Some((i + 1, first.to_string()));
        }
    }
    if let Some(id) = quoted {
        for (i, line) in text.lines().enumerate() {
            let l = line.trim_start();
            if l.starts_with("id") && l.contains(&format!("\"{id}\"")) {
                return Some((i + 1, "upstreams.id".to_string()));
            }
        }
    }
    None
}

/// One server of an `mcpServers` file. Keys that desktop clients add for their own UI are
/// accepted and ignored; anything else is an error, as in the TOML config.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct McpServer {
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<PathBuf>,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(rename = "type", alias = "transport")]
    kind: Option<String>,
    #[serde(default)]
    disabled: bool,
    #[serde(default, rename = "autoApprove", alias = "alwaysAllow")]
    _auto_approve: Option<Value>,
    #[serde(default, rename = "timeout")]
    _timeout: Option<Value>,
    #[serde(default, rename = "description")]
    _description: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct McpServersFile {
    #[serde(rename = "mcpServers")]
    mcp_servers: BTreeMap<String, Value>,
}

/// Builds a config from an `mcpServers` JSON file: each server becomes an upstream with
/// default settings; everything else is the daemon default.
pub fn from_mcp_servers_json(text: &str) -> Result<Config, String> {
    let file: McpServersFile = serde_json::from_str(text).map_err(|e| {
        format!("not an mcpServers file ({e}); expected {{\"mcpServers\": {{\"name\": {{\"command\": ...}}}}}}")
    })?;
    let mut config = Config {
        listen: DAEMON_LISTEN.to_string(),
        ..Config::default()
    };
    for (name, raw) in file.mcp_servers {
        let s: McpServer =
            serde_json::from_value(raw).map_err(|e| format!("mcpServers.{name}: {e}"))?;
        if s.disabled {
            continue;
        }
        match s.kind.as_deref() {
            None | Some("stdio") | Some("http") | Some("streamable-http") | Some("streamableHttp") => {}
            Some(other) => {
                return Err(format!(
                    "mcpServers.{name}.type: {other:?} is not supported (use stdio or http; legacy SSE upstreams are not)"
                ))
            }
        }
        // Through serde, so the upstream defaults are the TOML ones.
        let mut u = serde_json::json!({
            "id": name, "args": s.args, "env": s.env, "headers": s.headers,
        });
        for (k, v) in [("command", s.command), ("url", s.url)] {
            if let Some(v) = v {
                u[k] = Value::String(v);
            }
        }
        if let Some(cwd) = s.cwd {
            u["cwd"] = Value::String(cwd.display().to_string());
        }
        let u: UpstreamConfig =
            serde_json::from_value(u).map_err(|e| format!("mcpServers.{name}: {e}"))?;
        config.upstreams.push(u);
    }
    Ok(config)
}

/// `command = "@self"` means the running gatehouse executable.
pub const SELF_COMMAND: &str = "@self";
/// Overrides what `@self` resolves to (tests point it at the built binary).
pub const SELF_EXE_ENV: &str = "GATEHOUSE_SELF_EXE";

/// Every configured upstream with its resolved transport.
pub fn resolve_transports(
    config: &Config,
) -> Result<Vec<(UpstreamConfig, UpstreamTransport)>, ConfigError> {
    // With the naming defaults filled in (`Config::resolved_upstreams`): what the pool runs.
    config
        .resolved_upstreams()
        .into_iter()
        .map(|u| {
            let t = resolve_transport(&u).map_err(ConfigError::Invalid)?;
            Ok((u, t))
        })
        .collect()
}

/// Resolves `${NAME}` references in a header value from the environment `env`.
fn resolve_env(
    upstream: &str,
    value: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(format!(
                "upstream {upstream:?}: unterminated ${{ in header value"
            ));
        };
        let name = &after[..end];
        let v = env(name).ok_or_else(|| {
            format!("upstream {upstream:?}: header refers to environment variable {name}, which is not set")
        })?;
        out.push_str(&v);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The transport of one configured upstream (`@self` and `${NAME}` resolved from the
/// process environment). Run by `Gateway::new`, so that a missing variable fails before
/// anything binds.
pub fn resolve_transport(config: &UpstreamConfig) -> Result<UpstreamTransport, String> {
    resolve_transport_with(config, &|k| std::env::var(k).ok())
}

/// [`resolve_transport`] with the environment given as a function.
pub fn resolve_transport_with(
    config: &UpstreamConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<UpstreamTransport, String> {
    if let Some(url) = &config.url {
        let mut headers = BTreeMap::new();
        for (k, v) in &config.headers {
            headers.insert(k.clone(), resolve_env(&config.id, v, env)?);
        }
        let tls = config.tls();
        if tls.is_set() {
            // The files are read now, so that a wrong path fails before anything binds.
            crate::tls::build(&tls).map_err(|e| format!("upstream {:?}: {e}", config.id))?;
        }
        return Ok(UpstreamTransport::Http {
            url: url.clone(),
            headers,
            tls,
        });
    }
    let command = config
        .command
        .clone()
        .ok_or_else(|| format!("upstream {:?} has neither command nor url", config.id))?;
    let command = if command == SELF_COMMAND {
        match env(SELF_EXE_ENV) {
            Some(p) => PathBuf::from(p),
            None => std::env::current_exe()
                .map_err(|e| format!("upstream {:?}: cannot resolve @self: {e}", config.id))?,
        }
        .to_string_lossy()
        .into_owned()
    } else {
        command
    };
    Ok(UpstreamTransport::Stdio {
        command,
        args: config.args.clone(),
        env: config.env.clone(),
        cwd: config.cwd.clone(),
    })
}

#[cfg(test)]
mod transport_tests {
    use super::*;

    /// The environment is an argument: no test sets the process's.
    fn env(k: &str) -> Option<String> {
        match k {
            "GATEHOUSE_TEST_HEADER_TOKEN" => Some("s3cret".into()),
            SELF_EXE_ENV => Some("/opt/gatehouse".into()),
            _ => None,
        }
    }

    #[test]
    fn header_values_come_from_the_environment() {
        assert_eq!(
            resolve_env("u", "Bearer ${GATEHOUSE_TEST_HEADER_TOKEN}", &env).ok(),
            Some("Bearer s3cret".to_string())
        );
        assert!(resolve_env("u", "${GATEHOUSE_TEST_SURELY_UNSET_VAR}", &env).is_err());
        assert!(resolve_env("u", "${UNTERMINATED", &env).is_err());
        assert_eq!(
            resolve_env("u", "plain", &env).ok(),
            Some("plain".to_string())
        );
    }

    #[test]
    fn self_is_the_executable_the_environment_names() {
        let config: UpstreamConfig =
            toml::from_str("id = \"hd\"\ncommand = \"@self\"\nargs = [\"demo-upstream\"]\n")
                .unwrap(); // a test's literal config
        match resolve_transport_with(&config, &env) {
            Ok(UpstreamTransport::Stdio { command, args, .. }) => {
                assert_eq!(
                    (command.as_str(), args),
                    ("/opt/gatehouse", vec!["demo-upstream".to_string()])
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
