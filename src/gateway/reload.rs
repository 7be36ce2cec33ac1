//! Reloading the daemon's config (SIGHUP, `gatehouse reload`, `POST /v1/reload`): the file
//! is read and validated again; a bad one is refused with the reason and the running config
//! stays. Of a valid one, the upstreams are applied live (`Pool::reconfigure`: added ones serve
//! new registrations; changed and removed ones are drained, and the sessions of the
//! registrations using them get `tools/list_changed`); every other key that changed is
//! reported as needing a restart and kept as it runs. `config_reloaded` is audited with the
//! file's SHA-256.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::audit::Record;
use crate::config::Config;

/// What a reload found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// SHA-256 (hex) of the file read.
    pub digest: String,
    /// Changes applied live: `upstreams.<id> (added|changed|removed)`.
    pub applied: Vec<String>,
    /// Keys that differ from the running config and need a restart (kept as they run).
    pub needs_restart: Vec<String>,
}

impl ReloadReport {
    /// One line for the log.
    pub fn summary(&self) -> String {
        let mut out = format!("config reloaded (sha256 {})", self.digest);
        if self.applied.is_empty() && self.needs_restart.is_empty() {
            out.push_str(": no change");
        }
        if !self.applied.is_empty() {
            out.push_str(&format!("; applied: {}", self.applied.join(", ")));
        }
        if !self.needs_restart.is_empty() {
            out.push_str(&format!(
                "; needs a restart, kept as running: {}",
                self.needs_restart.join(", ")
            ));
        }
        out
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
        tasks,
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
        let transports = crate::config_load::resolve_transports(&new).map_err(|e| e.to_string())?;
        // Upstreams are compared with what the pool runs (earlier reloads included).
        let mut needs_restart: Vec<String> = changed_keys(self.config(), &new)
            .into_iter()
            .filter(|k| !k.starts_with("upstreams."))
            .collect();
        // The approvals' table and webhook are built at start (issue 49).
        let (o, n) = (&self.config().policy, &new.policy);
        if o.max_pending_approvals != n.max_pending_approvals {
            needs_restart.push("policy.max_pending_approvals".into());
        }
        if o.max_pending_approvals_per_registration != n.max_pending_approvals_per_registration {
            needs_restart.push("policy.max_pending_approvals_per_registration".into());
        }
        if o.approval_webhook != n.approval_webhook {
            needs_restart.push("policy.approval_webhook".into());
        }
        // Policy rules apply to new calls at once (validated with the file above).
        let policy_changed = self.hub().policy().replace(&new.policy) == Ok(true);
        let done = self.pool().reconfigure(transports);
        let mut applied = Vec::new();
        if policy_changed {
            applied.push("policy (changed)".to_string());
        }
        for (ids, what) in [
            (&done.added, "added"),
            (&done.changed, "changed"),
            (&done.removed, "removed"),
        ] {
            applied.extend(ids.iter().map(|id| format!("upstreams.{id} ({what})")));
        }
        let report = ReloadReport {
            digest: hex::encode(Sha256::digest(&bytes)),
            applied,
            needs_restart,
        };
        let mut rec = Record::event("config_reloaded");
        rec.rare_mut().digest = Some(report.digest.clone().into());
        let mut why = Vec::new();
        if !report.applied.is_empty() {
            why.push(format!("applied: {}", report.applied.join(", ")));
        }
        if !report.needs_restart.is_empty() {
            why.push(format!(
                "needs a restart: {}",
                report.needs_restart.join(", ")
            ));
        }
        if !why.is_empty() {
            rec.reason = Some(why.join("; ").into());
        }
        let _ = self.audit().record(rec).await;
        // The registrations granted tools of a changed or removed upstream: their sessions
        // hear that the tools changed (a call now uses the new definition, or fails naming
        // the removed upstream).
        let touched: Vec<&String> = done.changed.iter().chain(&done.removed).collect();
        if !touched.is_empty() {
            for reg in self.registry().all() {
                if reg.tools.iter().any(|t| {
                    t.upstream()
                        .is_some_and(|u| touched.iter().any(|x| *x == u))
                }) {
                    self.hub().notify_tools_list_changed(&reg.id).await;
                }
            }
        }
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
