//! Configuration: parse, validate, then hand out as an immutable `Arc<Config>`.
//!
//! Unknown keys are errors. Every default lives here and is written out, with a comment, in
//! the shipped `config/gatehouse.toml`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

mod oauth;
mod validate;
pub use oauth::{OAuthConfig, OAuthGrant};

/// Why a configuration was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Data listener (agents). Embedded default: an ephemeral loopback port.
    pub listen: String,
    /// Admin listener (the daemon only).
    pub admin_listen: String,
    /// Where the daemon writes a generated admin token (mode 0600) when
    /// `GATEHOUSE_ADMIN_TOKEN` is not set; the CLI verbs read it from there.
    pub admin_token_file: PathBuf,
    /// Base URL written into registration URLs; default `http://<bound address>`. Behind an
    /// L7 proxy (several nodes, DESIGN.md §8), the proxy's address.
    pub public_url: Option<String>,
    /// This node's name when several gatehouse nodes sit behind one L7 proxy: registration
    /// ids become `<node_id>.<random>`, so the proxy routes each to the node that owns it;
    /// audit records carry it. 1-16 characters of `[a-z0-9]`. None: ids are plain random.
    pub node_id: Option<String>,
    /// How long the lazily started server stays up after the last registration, in ms.
    pub linger_ms: u64,
    /// Interval of SSE keep-alive comments, in seconds.
    pub keepalive_s: u64,
    /// Largest request body accepted, in bytes (413 above it).
    pub max_body_bytes: usize,
    /// Origins allowed besides loopback ones (exact `scheme://host[:port]`).
    pub allowed_origins: Vec<String>,
    /// Allow `http(s)://localhost|127.0.0.1|[::1][:port]` origins.
    pub allow_loopback_origins: bool,
    /// `Host` values allowed besides loopback ones (`localhost`, `127.0.0.1`, `[::1]`, any
    /// port) and the host of `public_url`: `host` (any port) or `host:port`. Any other Host
    /// is refused with 403 (DNS-rebinding protection).
    pub allowed_hosts: Vec<String>,
    /// Grace period of a graceful shutdown, in seconds.
    pub shutdown_grace_s: u64,
    /// Between an upstream's id and its tool names as agents see them: `"."` (default),
    /// `"_"` or `"__"`. An upstream's `name_separator` overrides it. Grants always name
    /// upstream tools `<upstream>.<tool>` (docs/upstreams.md, "Tool names").
    pub tool_name_separator: String,
    /// Keep every exposed upstream tool name within `^[a-zA-Z0-9_-]{1,64}$` (the function-name
    /// rule of some model APIs): other characters become `_`, a longer name ends in `_` + 8
    /// hex digits of its digest; two tools under one name are refused at registration.
    /// Needs a separator other than `"."`. An upstream's `model_safe_names` overrides it.
    pub model_safe_tool_names: bool,
    /// How the daemon writes its log lines on stderr: `text` (default; coloured only when
    /// stderr is a terminal and `NO_COLOR` is unset) or `json` (one JSON object per line,
    /// start-up lines included, for log collectors). `GATEHOUSE_LOG_FORMAT` overrides it.
    pub log_format: LogFormat,
    pub connections: ConnectionConfig,
    pub sessions: SessionConfig,
    pub audit: AuditConfig,
    /// Child registrations (sub-agents): how deep and how many.
    pub children: ChildrenConfig,
    /// MCP tasks the gateway owns per registration (`tasks`).
    pub tasks: TasksConfig,
    pub store: StoreConfig,
    /// Several nodes on one etcd store (`[store] backend = "etcd"`; `gateway::cluster`).
    pub cluster: ClusterConfig,
    /// OpenTelemetry traces (issue 38): off unless an OTLP endpoint is set here or by the
    /// `OTEL_*` variables (which override this section in the daemon).
    pub telemetry: TelemetryConfig,
    /// Policy rules over calls and the default for a call no rule matched (issue 49,
    /// docs/policy.md); applied by a reload.
    pub policy: crate::policy::PolicyConfig,
    pub upstreams: Vec<UpstreamConfig>,
}

/// The cluster's timing (issue 36, CLUSTER.md §5.4).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// B: a release holds on every node within this bound. A node that has not seen its own
    /// heartbeat come back through its watch within it answers 503 and cancels its calls.
    /// 100-60000.
    pub release_bound_ms: u64,
    /// How often a node writes its heartbeat (and its applied revision). 10-10000, below
    /// `release_bound_ms`.
    pub heartbeat_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            release_bound_ms: 1000,
            heartbeat_ms: 200,
        }
    }
}

/// `[telemetry]`: OpenTelemetry spans exported with OTLP over HTTP/protobuf. Off unless
/// `endpoint` or `traces_endpoint` is set (or `OTEL_EXPORTER_OTLP_ENDPOINT` /
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` in the daemon's environment, which override this
/// section, as do `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_SERVICE_NAME`,
/// `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`(+`_ARG`) and `OTEL_SDK_DISABLED`).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// The collector's base URL: `/v1/traces` is appended (as to `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub endpoint: Option<String>,
    /// The traces URL, used as it is (as `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); wins over
    /// `endpoint`.
    pub traces_endpoint: Option<String>,
    /// Headers sent with every export (an API key, say): never logged, never shown.
    pub headers: BTreeMap<String, String>,
    /// `service.name` of the resource.
    pub service_name: String,
    /// More resource attributes (`OTEL_RESOURCE_ATTRIBUTES`).
    pub resource_attributes: BTreeMap<String, String>,
    /// `always_on`, `always_off`, `traceidratio`, `parentbased_always_on` (default),
    /// `parentbased_always_off`, `parentbased_traceidratio`.
    pub sampler: String,
    /// The ratio of the `traceidratio` samplers, 0-1.
    pub sampler_arg: Option<f64>,
    /// Spans waiting for export at most; one more is dropped and counted
    /// (`gatehouse_otel_spans_dropped_total`), never waited for.
    pub max_queue: usize,
    /// Spans per export request at most.
    pub max_batch: usize,
    /// How long a span may wait for a batch to fill, ms.
    pub delay_ms: u64,
    /// An export request's time limit, ms.
    pub export_timeout_ms: u64,
    /// Forward the client's W3C `baggage` upstream (default: dropped).
    pub propagate_baggage: bool,
    /// Record a tool call's arguments and result on its SERVER span
    /// (`gen_ai.tool.call.arguments` / `.result`, each cut at 4 KiB; never when they carry the
    /// caller's token). Off by default: they may hold personal data.
    pub capture_tool_io: bool,
    /// Set by `OTEL_SDK_DISABLED=true`: no span is made, whatever else is set.
    pub disabled: bool,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            endpoint: None,
            traces_endpoint: None,
            headers: BTreeMap::new(),
            service_name: "gatehouse".into(),
            resource_attributes: BTreeMap::new(),
            sampler: "parentbased_always_on".into(),
            sampler_arg: None,
            max_queue: 2048,
            max_batch: 512,
            delay_ms: 5000,
            export_timeout_ms: 10_000,
            propagate_baggage: false,
            capture_tool_io: false,
            disabled: false,
        }
    }
}

/// Header values are secrets (an API key): shown as their names only.
impl std::fmt::Debug for TelemetryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TelemetryConfig")
            .field("endpoint", &self.endpoint)
            .field("traces_endpoint", &self.traces_endpoint)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("service_name", &self.service_name)
            .field("sampler", &self.sampler)
            .field("sampler_arg", &self.sampler_arg)
            .field("max_queue", &self.max_queue)
            .field("disabled", &self.disabled)
            .finish_non_exhaustive()
    }
}

impl TelemetryConfig {
    /// The URL spans are posted to, if tracing is on.
    pub fn traces_url(&self) -> Option<String> {
        if self.disabled {
            return None;
        }
        let nonempty = |s: &Option<String>| s.clone().filter(|s| !s.trim().is_empty());
        nonempty(&self.traces_endpoint).or_else(|| {
            nonempty(&self.endpoint).map(|e| format!("{}/v1/traces", e.trim_end_matches('/')))
        })
    }

    fn validate(&self) -> Result<(), String> {
        const SAMPLERS: [&str; 6] = [
            "always_on",
            "always_off",
            "traceidratio",
            "parentbased_always_on",
            "parentbased_always_off",
            "parentbased_traceidratio",
        ];
        if !SAMPLERS.contains(&self.sampler.as_str()) {
            return Err(format!(
                "telemetry.sampler = {:?}: expected one of {}",
                self.sampler,
                SAMPLERS.join(", ")
            ));
        }
        if let Some(r) = self.sampler_arg {
            if !(0.0..=1.0).contains(&r) {
                return Err("telemetry.sampler_arg must be within 0-1".into());
            }
        }
        if !(1..=1_048_576).contains(&self.max_queue) || !(1..=65_536).contains(&self.max_batch) {
            return Err("telemetry.max_queue must be 1-1048576 and max_batch 1-65536".into());
        }
        if self.delay_ms == 0 || self.export_timeout_ms == 0 {
            return Err("telemetry.delay_ms and export_timeout_ms must be at least 1".into());
        }
        if let Some(url) = self.traces_url() {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(format!(
                    "telemetry: the traces endpoint must be an http(s) URL (got {url:?})"
                ));
            }
        }
        Ok(())
    }
}

/// Caps on child registrations (`RegistrationSpec::parent`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChildrenConfig {
    /// Levels of children below a root registration (a child is level 1).
    pub max_depth: usize,
    /// Live children per registration.
    pub max_per_registration: usize,
}

/// Caps on MCP tasks (long-running tool calls the gateway tracks per registration).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TasksConfig {
    /// The longest a task lives, in seconds: a client's or upstream's TTL above it (or an
    /// upstream's unlimited one) is cut to it; at its end a live task is cancelled upstream.
    pub max_ttl_s: u64,
    /// Live tasks per registration; a task created beyond it is cancelled upstream at once.
    pub max_live_per_registration: usize,
    /// The shortest interval, in ms, at which the gateway polls an upstream about one task
    /// (its background poller, and client polls, which are answered from the table between).
    pub min_poll_interval_ms: u64,
}

impl Default for TasksConfig {
    fn default() -> Self {
        TasksConfig {
            max_ttl_s: 3600,
            max_live_per_registration: 64,
            min_poll_interval_ms: 500,
        }
    }
}

impl Default for ChildrenConfig {
    fn default() -> Self {
        ChildrenConfig {
            max_depth: 4,
            max_per_registration: 64,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:0".into(),
            admin_listen: "127.0.0.1:8788".into(),
            admin_token_file: PathBuf::from("gatehouse-admin.token"),
            public_url: None,
            node_id: None,
            linger_ms: 1000,
            keepalive_s: 15,
            max_body_bytes: 4 * 1024 * 1024,
            allowed_origins: Vec::new(),
            allow_loopback_origins: true,
            allowed_hosts: Vec::new(),
            shutdown_grace_s: 10,
            tool_name_separator: ".".into(),
            model_safe_tool_names: false,
            log_format: LogFormat::Text,
            connections: ConnectionConfig::default(),
            sessions: SessionConfig::default(),
            audit: AuditConfig::default(),
            children: ChildrenConfig::default(),
            tasks: TasksConfig::default(),
            store: StoreConfig::default(),
            cluster: ClusterConfig::default(),
            telemetry: TelemetryConfig::default(),
            policy: crate::policy::PolicyConfig::default(),
            upstreams: Vec::new(),
        }
    }
}

/// Connection bounds of the listeners (`crate::connections`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionConfig {
    /// Longest wait for a request's head (request line and headers), from the connection's
    /// accept, or from the first byte of a next request on a kept-alive connection; a slower
    /// client is disconnected (slowloris), seconds. Both listeners.
    pub header_timeout_s: u64,
    /// A kept-alive connection with no request in flight (an open SSE stream is one) and no
    /// byte of a next request is closed after this many seconds. Both listeners.
    pub idle_timeout_s: u64,
    /// Connections held at once on the data listener; beyond it a new connection gets a
    /// canned 503 and is closed. 0 = auto: 3/4 of the open-files limit, at most 16384.
    pub max: usize,
    /// Longest wait for a request's whole body once its head is read, seconds; a slower one
    /// (a body trickled a byte at a time) is answered 408 and its connection closed. Both
    /// listeners.
    pub body_timeout_s: u64,
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        ConnectionConfig {
            header_timeout_s: 30,
            idle_timeout_s: 75,
            max: 0,
            body_timeout_s: 30,
        }
    }
}

/// Session table limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    /// Idle sessions are closed after this many seconds.
    pub idle_timeout_s: u64,
    /// Sessions held at once, all registrations together.
    pub max_sessions: usize,
    /// Sessions held at once by one registration.
    pub max_per_registration: usize,
    /// Messages queued for one session's stream before the session counts as a slow reader.
    pub queue: usize,
    /// How long a message may wait for room in a full session queue before the reader counts
    /// as stuck and its session is closed, milliseconds.
    pub slow_reader_grace_ms: u64,
    /// Bytes queued for one session's stream (the encoded events) before the session counts
    /// as a slow reader; one message larger than this still goes, alone.
    pub queue_bytes: usize,
    /// Requests in flight at once on one session; one more is refused at once (429,
    /// -32030), never queued.
    pub max_in_flight: usize,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            idle_timeout_s: 15 * 60,
            max_sessions: 100_000,
            max_per_registration: 64,
            queue: 256,
            slow_reader_grace_ms: 10_000,
            queue_bytes: 4 * 1024 * 1024,
            max_in_flight: 128,
        }
    }
}

/// How the daemon's log lines are written (`log_format`).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines; ANSI colour only on a terminal.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// `text` or `json` (as in the config and `GATEHOUSE_LOG_FORMAT`).
    pub fn parse(s: &str) -> Option<LogFormat> {
        match s.trim() {
            "text" => Some(LogFormat::Text),
            "json" => Some(LogFormat::Json),
            _ => None,
        }
    }
}

/// When the audit writer calls fsync.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FsyncPolicy {
    /// After every batch of records, before any reply they describe is sent.
    Always,
    /// At most once per `fsync_interval_ms`; records still reach the file (the OS) first.
    Interval,
    /// Never; the OS decides.
    Never,
}

/// The audit trail.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Append-only JSON-lines file.
    pub path: PathBuf,
    pub fsync: FsyncPolicy,
    pub fsync_interval_ms: u64,
    /// Also write every record to stdout as a JSON line (for log collectors).
    pub stdout: bool,
    /// Record tool arguments (with `redact_keys` masked), not only their digest.
    pub record_arguments: bool,
    pub redact_keys: Vec<String>,
    /// Rotate the file when it reaches this many bytes (0 = never, the default); the chain
    /// continues into the next file.
    pub rotate_bytes: u64,
    /// A wrong or missing token shown to a live registration (or the admin API) writes an
    /// `auth_failed` record at once; the failures that follow within this many seconds are
    /// folded into one record with their count.
    pub auth_failed_interval_s: u64,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            path: PathBuf::from("gatehouse-audit.jsonl"),
            fsync: FsyncPolicy::Interval,
            fsync_interval_ms: 1000,
            stdout: false,
            record_arguments: false,
            redact_keys: Vec::new(),
            rotate_bytes: 0,
            auth_failed_interval_s: 10,
        }
    }
}

/// Where registrations are kept (`crate::store`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StoreBackend {
    /// In the process only: registrations end with it (the embedded gateways' default).
    Memory,
    /// A SQLite file written through before each answer (`gatehouse serve`'s default).
    Sqlite,
    /// etcd v3 shared by several nodes (`gateway::cluster`; a build with the `cluster` feature).
    Etcd,
}

impl StoreBackend {
    /// The name in the config and in messages: `memory`, `sqlite` or `etcd`.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreBackend::Memory => "memory",
            StoreBackend::Sqlite => "sqlite",
            StoreBackend::Etcd => "etcd",
        }
    }
}

/// The registration store.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Unset: `sqlite` for `gatehouse serve`, `memory` for the embedded gateways.
    pub backend: Option<StoreBackend>,
    /// The SQLite file; unset: beside the audit log ([`StoreConfig::path_beside`]).
    pub path: Option<PathBuf>,
    /// Release every registration on a clean stop (the behaviour before the store); else a
    /// clean stop keeps them for the next start and audits `node_stopped`.
    pub release_on_exit: bool,
    /// Calls of a `max_calls` budget reserved from the store at a time; a crash loses at most
    /// one block per registration (fewer calls allowed, never more). 1-1000000.
    pub budget_block: u64,
    /// Store writes waiting for the writer thread at most (then writers wait). 16-1048576.
    pub queue: usize,
    /// `etcd`: the members' `http(s)://host:port` (or `host:port`).
    pub endpoints: Vec<String>,
    /// `etcd`: the key prefix (default `/gatehouse/v1/`).
    pub prefix: Option<String>,
    /// `etcd`: user name (with `password_file`).
    pub user: Option<String>,
    /// `etcd`: a file holding the user's password (never in the config itself).
    pub password_file: Option<PathBuf>,
    /// `etcd` over TLS: the CA's PEM file.
    pub ca_file: Option<PathBuf>,
    /// `etcd` over TLS: this client's certificate and key (PEM).
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// `etcd`: each request's bound, in ms. 100-60000.
    pub timeout_ms: u64,
    /// The key that seals registrations' upstream credentials in a durable store (issue
    /// 47): 32 random bytes in hex, mode 0600, made on first start. Unset: beside the store
    /// file (`gatehouse-store.key`). A cluster's nodes share one key file (copy it to each).
    pub secret_key_file: Option<PathBuf>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            backend: None,
            path: None,
            release_on_exit: false,
            budget_block: 16,
            queue: 4096,
            endpoints: Vec::new(),
            prefix: None,
            user: None,
            password_file: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
            timeout_ms: 2000,
            secret_key_file: None,
        }
    }
}

impl StoreConfig {
    /// The default SQLite file beside the audit log: `gatehouse-audit.jsonl` gives
    /// `gatehouse-store.sqlite`, `audit.jsonl` `store.sqlite`, `x.jsonl` `x-store.sqlite`.
    pub fn path_beside(audit: &Path) -> PathBuf {
        let stem = audit
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let name = match stem.strip_suffix("audit") {
            Some(head) => format!("{head}store.sqlite"),
            None if stem.is_empty() => "store.sqlite".to_string(),
            None => format!("{stem}-store.sqlite"),
        };
        audit.with_file_name(name)
    }
}

/// How an upstream connection may be shared between registrations.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Sharing {
    #[default]
    PerRegistration,
    Leased,
    Shared,
}

impl Sharing {
    pub fn as_str(self) -> &'static str {
        match self {
            Sharing::PerRegistration => "per_registration",
            Sharing::Leased => "leased",
            Sharing::Shared => "shared",
        }
    }
}

/// The stateless protocol era an upstream may be configured to speak (`protocol`).
pub const MODERN_PROTOCOL: &str = "2026-07-28";

/// One upstream MCP server.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    pub id: String,
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    pub url: Option<String>,
    /// HTTP headers; a value `${NAME}` is read from the environment variable NAME.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub sharing: Sharing,
    /// Per-call timeout, seconds.
    #[serde(default = "default_call_timeout")]
    pub call_timeout_s: u64,
    /// Idle connections are closed after this many seconds.
    #[serde(default = "default_idle_timeout")]
    pub idle_timeout_s: u64,
    /// Calls in flight on one connection at once.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// How long a call's notifications may wait for its client to take one before the
    /// call's further notifications are refused (counted), milliseconds.
    #[serde(default = "default_notify_grace_ms")]
    pub notify_grace_ms: u64,
    /// Calls one registration may have in flight (waiting for a permit included) on a
    /// `shared` or `leased` connection; unset: half of `max_in_flight` (at least 1), so one
    /// registration cannot hold every permit. Over it a call is refused at once (-32030).
    pub max_in_flight_per_registration: Option<usize>,
    /// Renames: upstream tool name -> name agents see (without the `<id>.` prefix).
    #[serde(default)]
    pub rename: BTreeMap<String, String>,
    /// Expose this upstream's tools (renamed or not) without the `<id>.` prefix, e.g. for
    /// clients that call fixed tool names. Grants still name them `<id>.<tool>` or `<id>.*`.
    #[serde(default)]
    pub bare_names: bool,
    /// This upstream's separator (`"."`, `"_"`, `"__"`); unset: the gateway's
    /// `tool_name_separator`.
    pub name_separator: Option<String>,
    /// This upstream's model-safe rule; unset: the gateway's `model_safe_tool_names`.
    pub model_safe_names: Option<bool>,
    /// The client capabilities the gateway declares in this upstream's `initialize`
    /// (`"sampling"`, `"elicitation"`, `"roots"`); unset: all three on connections a
    /// registration owns (`per_registration`, `leased`), none on `shared` ones, where no
    /// registration can be named to answer (setting any there is an error).
    pub client_capabilities: Option<Vec<String>>,
    /// What a registration does when this upstream changes the definition of a tool it was
    /// granted (its surface is pinned at creation): `refuse` (the default) or `follow`.
    #[serde(default)]
    pub on_tool_change: OnToolChange,
    /// The protocol era the gateway speaks to this upstream: unset, the handshake
    /// (`initialize`, up to 2025-11-25); `"2026-07-28"`, the stateless era (`server/discover`,
    /// a per-request `_meta` envelope, tasks as the `io.modelcontextprotocol/tasks`
    /// extension).
    pub protocol: Option<String>,
    /// HTTPS only (issue 46): a PEM file of the CA(s) this upstream's certificate is checked
    /// against, instead of the platform's roots (a private CA; a self-signed server's own
    /// certificate). Relative paths are from the daemon's working directory.
    pub tls_ca_file: Option<PathBuf>,
    /// HTTPS only: a PEM client certificate (chain) presented to the upstream (mTLS); needs
    /// `tls_client_key_file`.
    pub tls_client_cert_file: Option<PathBuf>,
    /// HTTPS only: the PEM private key of `tls_client_cert_file`.
    pub tls_client_key_file: Option<PathBuf>,
    /// HTTPS only: the name the upstream's certificate is checked against instead of the
    /// URL's host (e.g. a URL with an IP address).
    pub tls_server_name: Option<String>,
    /// HTTP only (issue 47): OAuth tokens from an authorization server (`config::oauth`).
    pub oauth: Option<OAuthConfig>,
}

/// An HTTPS upstream's TLS settings, as `src/tls.rs` builds them (all unset: the platform's
/// roots, no client certificate). There is no setting that turns verification off.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UpstreamTls {
    pub ca_file: Option<PathBuf>,
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
    pub server_name: Option<String>,
}

impl UpstreamTls {
    pub fn is_set(&self) -> bool {
        *self != UpstreamTls::default()
    }
}

/// What a registration does when an upstream changes a granted tool's definition.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnToolChange {
    /// Calls to the changed tool answer a tool error saying so, audited `tool_changed`; the
    /// registration keeps listing the definition it was made with.
    #[default]
    Refuse,
    /// The registration takes the new definition (listed and served).
    Follow,
}

impl OnToolChange {
    pub fn as_str(self) -> &'static str {
        match self {
            OnToolChange::Refuse => "refuse",
            OnToolChange::Follow => "follow",
        }
    }
}

/// The client capabilities the gateway can declare upstream: the server → client requests
/// it routes to a registration's sessions (docs/upstreams.md, "Client capabilities").
pub const CLIENT_CAPABILITIES: [&str; 3] = ["sampling", "elicitation", "roots"];

impl UpstreamConfig {
    /// The `tls_*` keys.
    pub fn tls(&self) -> UpstreamTls {
        UpstreamTls {
            ca_file: self.tls_ca_file.clone(),
            client_cert_file: self.tls_client_cert_file.clone(),
            client_key_file: self.tls_client_key_file.clone(),
            server_name: self.tls_server_name.clone(),
        }
    }

    /// The `tls_*` keys where they can apply: an `https://` url, the certificate and its key
    /// together. The files are read when the transports are resolved (config_load).
    fn validate_tls(&self) -> Result<(), String> {
        let tls = self.tls();
        if !tls.is_set() {
            return Ok(());
        }
        let id = &self.id;
        match &self.url {
            None => {
                return Err(format!(
                    "upstream {id:?}: tls_* keys apply to HTTPS upstreams (url = \"https://…\"); this one is stdio (command): remove them"
                ))
            }
            Some(url) if !url.get(..8).is_some_and(|s| s.eq_ignore_ascii_case("https://")) => {
                return Err(format!(
                    "upstream {id:?}: tls_* keys need an https:// url (got {url:?}): use https:// or remove them"
                ))
            }
            Some(_) => {}
        }
        match (&tls.client_cert_file, &tls.client_key_file) {
            (Some(_), None) => Err(format!(
                "upstream {id:?}: tls_client_cert_file needs tls_client_key_file (the certificate's private key): set both"
            )),
            (None, Some(_)) => Err(format!(
                "upstream {id:?}: tls_client_key_file without tls_client_cert_file: set the certificate too, or remove the key"
            )),
            _ => Ok(()),
        }?;
        if tls
            .server_name
            .as_deref()
            .is_some_and(|n| n.trim().is_empty())
        {
            return Err(format!(
                "upstream {id:?}: tls_server_name is empty: set the name the certificate carries, or remove the key"
            ));
        }
        Ok(())
    }

    /// What this upstream's connections declare in `initialize` (a subset of
    /// [`CLIENT_CAPABILITIES`]): `client_capabilities` if set, else all of them unless the
    /// upstream is `shared`.
    pub fn declared_client_capabilities(&self) -> Vec<&str> {
        match (&self.client_capabilities, self.sharing) {
            (Some(list), _) => CLIENT_CAPABILITIES
                .into_iter()
                .filter(|c| list.iter().any(|l| l == c))
                .collect(),
            (None, Sharing::Shared) => Vec::new(),
            (None, _) => CLIENT_CAPABILITIES.to_vec(),
        }
    }

    /// One registration's share of a shared or leased connection's permits.
    pub fn registration_share(&self) -> usize {
        self.max_in_flight_per_registration
            .unwrap_or(self.max_in_flight.div_ceil(2))
            .clamp(1, self.max_in_flight.max(1))
    }

    /// How this upstream's tools are named, the gateway's defaults filled in by
    /// [`Config::resolved_upstreams`] (unset here: `.`, not model-safe).
    pub fn name_rule(&self) -> crate::tool_name::Rule {
        crate::tool_name::Rule {
            separator: self
                .name_separator
                .as_deref()
                .and_then(crate::tool_name::Separator::parse)
                .unwrap_or_default(),
            bare: self.bare_names,
            model_safe: self.model_safe_names.unwrap_or(false),
        }
    }
}

fn default_notify_grace_ms() -> u64 {
    10_000
}
fn default_call_timeout() -> u64 {
    60
}
fn default_idle_timeout() -> u64 {
    600
}
fn default_max_in_flight() -> usize {
    64
}

/// The longest `node_id`: it prefixes every registration id and URL of the node.
pub const NODE_ID_MAX: usize = 16;

/// A node id: 1-16 characters of `[a-z0-9]`. Neither it nor base64url has a `.`, the
/// separator in `<node_id>.<random>`, so one regex (`^/gw/([a-z0-9]+)\.`) reads the node of
/// any registration path.
pub fn valid_node_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= NODE_ID_MAX
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// The characters allowed in tool names seen by agents.
pub fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
}

impl Config {
    /// Reads a TOML file (or, for `.json`, an `mcpServers` file) and validates it.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml_str(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.display().to_string(),
                message,
            },
            other => other,
        })
    }

    /// Parses TOML text and validates it.
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: "<config>".into(),
            message: e.to_string(),
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The naming rule of an upstream: its own keys, else the gateway's.
    pub fn name_rule_of(&self, u: &UpstreamConfig) -> crate::tool_name::Rule {
        self.resolved(u).name_rule()
    }

    fn resolved(&self, u: &UpstreamConfig) -> UpstreamConfig {
        let mut u = u.clone();
        u.name_separator
            .get_or_insert_with(|| self.tool_name_separator.clone());
        u.model_safe_names.get_or_insert(self.model_safe_tool_names);
        u
    }

    /// The upstreams with the gateway-wide naming defaults filled in (what the pool runs).
    pub fn resolved_upstreams(&self) -> Vec<UpstreamConfig> {
        self.upstreams.iter().map(|u| self.resolved(u)).collect()
    }
}

/// How to reach an upstream MCP server, as config loading resolves it (`@self`, `${NAME}`). A closed set: adding a transport is a compile error
/// everywhere it matters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamTransport {
    /// A child process speaking newline-delimited JSON-RPC on stdin/stdout. It runs in its own
    /// process group; teardown kills the whole group.
    Stdio {
        command: String,
        args: Vec<String>,
        /// Added to (not replacing) the gateway's environment.
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    /// A Streamable HTTP MCP endpoint (legacy-handshake revisions, e.g. 2025-06-18).
    Http {
        url: String,
        /// Sent verbatim on every HTTP request (values already resolved by config).
        headers: BTreeMap<String, String>,
        /// The `tls_*` keys (an `https://` url).
        tls: UpstreamTls,
    },
}
