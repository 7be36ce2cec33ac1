//! Config sources: the shipped file stays valid, environment overrides apply, unknown keys
//! and bad values are rejected with the line and key at fault, `mcpServers` JSON is accepted,
//! and `gatehouse check-config` exits non-zero on a bad file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use gatehouse::config::Sharing;
use gatehouse::testing::config_load::{load_with_env, DEFAULT_CONFIG_PATH};

fn shipped() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(DEFAULT_CONFIG_PATH)
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn shipped_config_is_valid_and_writes_every_default() {
    let c = load_with_env(&shipped(), no_env).unwrap();
    assert_eq!(c.listen, "127.0.0.1:8787");
    assert_eq!(c.admin_listen, "127.0.0.1:8788");
    assert_eq!(c.upstreams.len(), 1);
    assert_eq!(c.upstreams[0].id, "helpdesk");
    // Every top-level and table key of the built-in defaults is written in the shipped file.
    let text = std::fs::read_to_string(shipped()).unwrap();
    let d = gatehouse::Config::default();
    for key in [
        "listen",
        "admin_listen",
        "admin_token_file",
        "public_url",
        "node_id",
        "linger_ms",
        "keepalive_s",
        "max_body_bytes",
        "allowed_origins",
        "allow_loopback_origins",
        "shutdown_grace_s",
        "idle_timeout_s",
        "max_sessions",
        "max_per_registration",
        "queue",
        "fsync_interval_ms",
        "record_arguments",
        "redact_keys",
        "backend",
        "path",
        "release_on_exit",
        "budget_block",
    ] {
        assert!(
            text.lines().any(|l| l
                .trim_start()
                .trim_start_matches("# ")
                .starts_with(&format!("{key} ="))),
            "shipped config does not write {key}"
        );
    }
    assert!(text.contains(&format!("shutdown_grace_s = {}", d.shutdown_grace_s)));
    assert!(text.contains(&format!("linger_ms = {}", d.linger_ms)));
    // The store's defaults, as written.
    assert_eq!(c.store, gatehouse::config::StoreConfig::default());
    assert!(text.contains(&format!("budget_block = {}", d.store.budget_block)));
    assert!(text.contains(&format!("queue = {}", d.store.queue)));
    assert!(text.contains(&format!("release_on_exit = {}", d.store.release_on_exit)));
    assert!(text.contains(&format!(
        "admin_token_file = \"{}\"",
        d.admin_token_file.display()
    )));
}

#[test]
fn environment_overrides_win() {
    let env = |k: &str| match k {
        "GATEHOUSE_LISTEN" => Some("127.0.0.1:0".to_string()),
        "GATEHOUSE_ADMIN_LISTEN" => Some("127.0.0.1:9999".to_string()),
        "GATEHOUSE_AUDIT_PATH" => Some("/tmp/x-audit.jsonl".to_string()),
        _ => None,
    };
    let c = load_with_env(&shipped(), env).unwrap();
    assert_eq!(c.listen, "127.0.0.1:0");
    assert_eq!(c.admin_listen, "127.0.0.1:9999");
    assert_eq!(c.audit.path, PathBuf::from("/tmp/x-audit.jsonl"));
    // A bad override is rejected like a bad file value.
    let bad = |k: &str| (k == "GATEHOUSE_LISTEN").then(|| "nowhere".to_string());
    let e = load_with_env(&shipped(), bad).unwrap_err().to_string();
    assert!(e.contains("listen"), "{e}");
}

#[test]
fn unknown_keys_and_bad_values_name_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "a.toml",
        "listen = \"127.0.0.1:0\"\n\n[sessions]\nidle_timeout_s = 5\nbogus_key = 1\n",
    );
    let e = load_with_env(&p, no_env).unwrap_err().to_string();
    assert!(e.contains("line 5") && e.contains("bogus_key"), "{e}");
    let p = write(
        dir.path(),
        "b.toml",
        "linger_ms = 5\nadmin_listen = \"not an address\"\n",
    );
    let e = load_with_env(&p, no_env).unwrap_err().to_string();
    assert!(e.contains("line 2") && e.contains("admin_listen"), "{e}");
}

#[test]
fn node_id_from_file_or_env_validated_with_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "n.toml",
        "listen = \"127.0.0.1:0\"\nnode_id = \"n1\"\n",
    );
    assert_eq!(
        load_with_env(&p, no_env).unwrap().node_id.as_deref(),
        Some("n1")
    );
    assert_eq!(load_with_env(&shipped(), no_env).unwrap().node_id, None);
    let env = |k: &str| (k == "GATEHOUSE_NODE_ID").then(|| "b7".to_string());
    assert_eq!(
        load_with_env(&p, env).unwrap().node_id.as_deref(),
        Some("b7")
    );
    assert_eq!(
        load_with_env(&shipped(), env).unwrap().node_id.as_deref(),
        Some("b7")
    );
    // Not [a-z0-9], empty, too long: refused, naming the line and key.
    for bad in ["N1", "n-1", "n.1", "n_1", "", "abcdefghijklmnopq", "é"] {
        let p = write(
            dir.path(),
            "bad-node.toml",
            &format!("listen = \"127.0.0.1:0\"\nnode_id = {bad:?}\n"),
        );
        let e = load_with_env(&p, no_env).unwrap_err().to_string();
        assert!(
            e.contains("line 2") && e.contains("node_id") && e.contains("[a-z0-9]"),
            "{bad:?}: {e}"
        );
    }
    let env = |k: &str| (k == "GATEHOUSE_NODE_ID").then(|| "Node/1".to_string());
    let e = load_with_env(&shipped(), env).unwrap_err().to_string();
    assert!(e.contains("node_id") && e.contains("Node/1"), "{e}");
    // check-config reports it.
    let out = Command::new(env!("CARGO_BIN_EXE_gatehouse"))
        .arg("check-config")
        .arg(dir.path().join("n.toml"))
        .env("GATEHOUSE_NODE_ID", "n2")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("node n2"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn mcp_servers_json_becomes_upstreams() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "claude_desktop_config.json",
        r#"{"mcpServers": {
            "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"], "env": {"A": "1"}},
            "remote": {"type": "http", "url": "http://127.0.0.1:9/mcp", "headers": {"Authorization": "${TOKEN}"}},
            "off": {"command": "x", "disabled": true}
        }}"#,
    );
    let c = load_with_env(&p, no_env).unwrap();
    assert_eq!(c.listen, "127.0.0.1:8787");
    let ids: Vec<&str> = c.upstreams.iter().map(|u| u.id.as_str()).collect();
    assert_eq!(ids, ["files", "remote"]);
    assert_eq!(c.upstreams[0].command.as_deref(), Some("npx"));
    assert_eq!(c.upstreams[0].args.len(), 3);
    assert_eq!(c.upstreams[0].call_timeout_s, 60, "upstream defaults apply");
    assert_eq!(c.upstreams[0].sharing, Sharing::PerRegistration);
    assert_eq!(
        c.upstreams[1].url.as_deref(),
        Some("http://127.0.0.1:9/mcp")
    );
    let p = write(
        dir.path(),
        "bad.json",
        r#"{"mcpServers": {"x": {"command": "a", "colour": "red"}}}"#,
    );
    let e = load_with_env(&p, no_env).unwrap_err().to_string();
    assert!(e.contains("mcpServers.x") && e.contains("colour"), "{e}");
}

#[test]
fn check_config_binary_exits_non_zero_with_line_and_key() {
    let bin = env!("CARGO_BIN_EXE_gatehouse");
    let ok = Command::new(bin)
        .args(["check-config"])
        .arg(shipped())
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "bad.toml",
        "listen = \"127.0.0.1:0\"\nlisten_typo = 1\n",
    );
    let out = Command::new(bin)
        .arg("check-config")
        .arg(&p)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 2") && err.contains("listen_typo"),
        "{err}"
    );
    // serve refuses the same file before binding anything.
    let out = Command::new(bin)
        .args(["serve", "--config"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("listener on"));
}

#[test]
fn every_verb_has_help() {
    let bin = env!("CARGO_BIN_EXE_gatehouse");
    for verb in [
        "serve",
        "register",
        "renew",
        "release",
        "list",
        "check-config",
        "audit",
    ] {
        let out = Command::new(bin).args([verb, "--help"]).output().unwrap();
        assert!(out.status.success(), "{verb} --help");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Usage: gatehouse"), "{verb}: {text}");
    }
}

#[test]
fn gatehouse_store_names_the_backend_and_file() {
    use gatehouse::config::StoreBackend;
    let with = |v: &'static str| move |k: &str| (k == "GATEHOUSE_STORE").then(|| v.to_string());
    let c = load_with_env(&shipped(), with("memory")).unwrap();
    assert_eq!(c.store.backend, Some(StoreBackend::Memory));
    let c = load_with_env(&shipped(), with("sqlite:/tmp/x/s.db")).unwrap();
    assert_eq!(c.store.backend, Some(StoreBackend::Sqlite));
    assert_eq!(c.store.path, Some(PathBuf::from("/tmp/x/s.db")));
    let e = load_with_env(&shipped(), with("redis"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("GATEHOUSE_STORE"), "{e}");
    // etcd (issue 36): endpoints from the list; a cluster node needs a node_id.
    let etcd = |k: &str| match k {
        "GATEHOUSE_STORE" => Some("etcd://127.0.0.1:2379, 127.0.0.1:2479".to_string()),
        "GATEHOUSE_NODE_ID" => Some("n1".to_string()),
        _ => None,
    };
    let c = load_with_env(&shipped(), etcd).unwrap();
    assert_eq!(c.store.backend, Some(StoreBackend::Etcd));
    assert_eq!(
        c.store.endpoints,
        vec![
            "http://127.0.0.1:2379".to_string(),
            "http://127.0.0.1:2479".to_string()
        ]
    );
    let mut no_node = c.clone();
    no_node.node_id = None;
    let e = no_node.validate().unwrap_err().to_string();
    assert!(e.contains("node_id"), "{e}");
    // Unset path: beside the audit log, named after it.
    assert_eq!(
        gatehouse::config::StoreConfig::path_beside(Path::new("/var/lib/g/gatehouse-audit.jsonl")),
        Path::new("/var/lib/g/gatehouse-store.sqlite")
    );
    assert_eq!(
        gatehouse::config::StoreConfig::path_beside(Path::new("x.jsonl")),
        Path::new("x-store.sqlite")
    );
}

#[test]
fn otel_variables_override_the_telemetry_section_and_tracing_is_off_unless_configured() {
    let dir = tempfile::tempdir().unwrap();
    let off = load_with_env(&shipped(), no_env).unwrap();
    assert_eq!(off.telemetry.traces_url(), None, "off by default");
    let p = write(
        dir.path(),
        "t.toml",
        "[telemetry]\nendpoint = \"http://file:4318\"\nsampler = \"always_on\"\nheaders = { k = \"from-file\" }\n",
    );
    let c = load_with_env(&p, no_env).unwrap();
    assert_eq!(
        c.telemetry.traces_url().as_deref(),
        Some("http://file:4318/v1/traces")
    );
    let env = |k: &str| {
        match k {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://env:4318/"),
            "OTEL_EXPORTER_OTLP_HEADERS" => Some("api-key=s3cret%20value, x=1"),
            "OTEL_SERVICE_NAME" => Some("gw-a"),
            "OTEL_RESOURCE_ATTRIBUTES" => Some("deployment.environment=prod,team=infra"),
            "OTEL_TRACES_SAMPLER" => Some("parentbased_traceidratio"),
            "OTEL_TRACES_SAMPLER_ARG" => Some("0.25"),
            "OTEL_BSP_MAX_QUEUE_SIZE" => Some("100"),
            _ => None,
        }
        .map(str::to_string)
    };
    let c = load_with_env(&p, env).unwrap().telemetry;
    assert_eq!(c.traces_url().as_deref(), Some("http://env:4318/v1/traces"));
    assert_eq!(c.headers["api-key"], "s3cret value");
    assert_eq!(c.headers["x"], "1");
    assert_eq!(c.headers["k"], "from-file");
    assert_eq!(c.service_name, "gw-a");
    assert_eq!(c.resource_attributes["team"], "infra");
    assert_eq!(c.sampler, "parentbased_traceidratio");
    assert_eq!(c.sampler_arg, Some(0.25));
    assert_eq!(c.max_queue, 100);
    // Header values are secrets: not in the config's Debug.
    assert!(!format!("{c:?}").contains("s3cret"), "{c:?}");
    // The per-signal endpoint is used as it is and wins.
    let env2 = |k: &str| {
        match k {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://env:4318"),
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" => Some("http://traces:9999/custom"),
            _ => None,
        }
        .map(str::to_string)
    };
    let c = load_with_env(&p, env2).unwrap().telemetry;
    assert_eq!(c.traces_url().as_deref(), Some("http://traces:9999/custom"));
    // OTEL_SDK_DISABLED turns it off whatever else is set.
    let disabled = |k: &str| (k == "OTEL_SDK_DISABLED").then(|| "true".to_string());
    assert_eq!(
        load_with_env(&p, disabled).unwrap().telemetry.traces_url(),
        None
    );
    // gRPC is not in the build; bad samplers and ratios are refused, naming the key.
    let grpc = |k: &str| (k == "OTEL_EXPORTER_OTLP_PROTOCOL").then(|| "grpc".to_string());
    let e = load_with_env(&p, grpc).unwrap_err().to_string();
    assert!(e.contains("http/protobuf"), "{e}");
    let bad = |k: &str| (k == "OTEL_TRACES_SAMPLER").then(|| "sometimes".to_string());
    let e = load_with_env(&p, bad).unwrap_err().to_string();
    assert!(e.contains("telemetry.sampler"), "{e}");
    let ratio = |k: &str| (k == "OTEL_TRACES_SAMPLER_ARG").then(|| "2".to_string());
    assert!(load_with_env(&p, ratio).is_err());
    let hdr = |k: &str| (k == "OTEL_EXPORTER_OTLP_HEADERS").then(|| "novalue".to_string());
    let e = load_with_env(&p, hdr).unwrap_err().to_string();
    assert!(
        e.contains("OTEL_EXPORTER_OTLP_HEADERS") && !e.contains("novalue"),
        "{e}"
    );
}
