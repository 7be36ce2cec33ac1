//! Reloading the daemon's config (SIGHUP, `gatehouse reload`, `POST /v1/reload`): the file
//! is read and validated again; a bad one is refused with the reason and the running config
//! stays. What a valid one changes is reported: no key is applied live yet, so every change
//! is listed as needing a restart (and the running config is kept). `config_reloaded` is
//! audited with the file's SHA-256.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::audit::Record;
use crate::config::Config;

/// What a reload found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// SHA-256 (hex) of the file read.
    pub digest: String,
    /// Keys that differ from the running config and need a restart (kept as they run).
    pub needs_restart: Vec<String>,
}

impl ReloadReport {
    /// One line for the log.
    pub fn summary(&self) -> String {
        if self.needs_restart.is_empty() {
            format!("config reloaded (sha256 {}): no change", self.digest)
        } else {
            format!(
                "config reloaded (sha256 {}): needs a restart, kept as running: {}",
                self.digest,
                self.needs_restart.join(", ")
            )
        }
    }
}

/// The keys in which `new` differs from `old` (upstreams by id: added, changed, removed).
pub fn changed_keys(old: &Config, new: &Config) -> Vec<String> {
    let mut out = Vec::new();
    let mut key = |name: &str, a: String, b: String| {
        if a != b {
            out.push(name.to_string());
        }
    };
    macro_rules! keys {
        ($($k:ident),*) => {
            $(key(stringify!($k), format!("{:?}", old.$k), format!("{:?}", new.$k));)*
        };
    }
    keys!(
        listen,
        admin_listen,
        admin_token_file,
        public_url,
        node_id,
        linger_ms,
        keepalive_s,
        max_body_bytes,
        allowed_origins,
        allow_loopback_origins,
        allowed_hosts,
        shutdown_grace_s,
        tool_name_separator,
        model_safe_tool_names,
        log_format,
        connections,
        sessions,
        audit,
        store
    );
    for u in &new.upstreams {
        match old.upstreams.iter().find(|o| o.id == u.id) {
            None => out.push(format!("upstreams.{} (added)", u.id)),
            Some(o) if format!("{o:?}") != format!("{u:?}") => {
                out.push(format!("upstreams.{} (changed)", u.id))
            }
            Some(_) => {}
        }
    }
    for o in &old.upstreams {
        if !new.upstreams.iter().any(|u| u.id == o.id) {
            out.push(format!("upstreams.{} (removed)", o.id));
        }
    }
    out
}

impl super::Gateway {
    /// Re-reads and validates the config file the daemon started with. `Err` (the reason)
    /// leaves everything as it runs; `Ok` reports what changed.
    pub async fn reload_config(&self) -> Result<ReloadReport, String> {
        let Some(path) = self.config_path() else {
            return Err("this gateway was not started from a config file".into());
        };
        let bytes =
            std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        // One line (TOML errors quote the file over several): a log line, an API error.
        let mut new = crate::config_load::load(Path::new(&path)).map_err(|e| {
            e.to_string()
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && l.chars().any(char::is_alphanumeric))
                .collect::<Vec<_>>()
                .join(" ")
        })?;
        // What the command line set on top of the file still holds.
        new.store.release_on_exit |= self.config().store.release_on_exit;
        let report = ReloadReport {
            digest: hex::encode(Sha256::digest(&bytes)),
            needs_restart: changed_keys(self.config(), &new),
        };
        let mut rec = Record::event("config_reloaded");
        rec.digest = Some(report.digest.clone().into());
        if !report.needs_restart.is_empty() {
            rec.reason =
                Some(format!("needs a restart: {}", report.needs_restart.join(", ")).into());
        }
        let _ = self.audit().record(rec).await;
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_named_by_key_and_upstream() {
        let old = Config::from_toml_str(
            "linger_ms = 5\n[[upstreams]]\nid = \"a\"\ncommand = \"x\"\n[[upstreams]]\nid = \"b\"\ncommand = \"y\"\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let new = Config::from_toml_str(
            "linger_ms = 6\n[[upstreams]]\nid = \"a\"\ncommand = \"z\"\n[[upstreams]]\nid = \"c\"\ncommand = \"y\"\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            changed_keys(&old, &new),
            [
                "linger_ms",
                "upstreams.a (changed)",
                "upstreams.c (added)",
                "upstreams.b (removed)"
            ]
        );
        assert!(changed_keys(&old, &old).is_empty());
    }
}
