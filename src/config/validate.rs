//! The checks of a config serde cannot make: addresses, bounds, ids, one transport per
//! upstream, names. Each error names the setting at fault.

use std::net::SocketAddr;

use super::*;

impl Config {
    /// Checks what serde cannot: addresses, ids, one transport per upstream.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.telemetry.validate().map_err(ConfigError::Invalid)?;
        self.listen
            .parse::<SocketAddr>()
            .map_err(|e| ConfigError::Invalid(format!("listen = {:?}: {e}", self.listen)))?;
        self.admin_listen.parse::<SocketAddr>().map_err(|e| {
            ConfigError::Invalid(format!("admin_listen = {:?}: {e}", self.admin_listen))
        })?;
        if self.max_body_bytes < 1024 {
            return Err(ConfigError::Invalid(
                "max_body_bytes must be at least 1024".into(),
            ));
        }
        if self.keepalive_s == 0 {
            return Err(ConfigError::Invalid(
                "keepalive_s must be at least 1".into(),
            ));
        }
        within("store.budget_block", self.store.budget_block, 1, 1_000_000)?;
        within("store.queue", self.store.queue, 16, 1_048_576)?;
        self.validate_bounds()?;
        crate::policy::compile(&self.policy.rules, "policy.rules", true)
            .map_err(ConfigError::Invalid)?;
        for (i, r) in self.policy.rules.iter().enumerate() {
            if let Some(u) = &r.upstream {
                if !self.upstreams.iter().any(|x| &x.id == u) {
                    return Err(ConfigError::Invalid(format!(
                        "policy.rules[{i}] (rule {:?}): upstream {u:?} is not a configured upstream",
                        r.id
                    )));
                }
            }
        }
        if let Some(w) = &self.policy.approval_webhook {
            if !(w.url.starts_with("http://") || w.url.starts_with("https://")) {
                return Err(ConfigError::Invalid(format!(
                    "policy.approval_webhook.url {:?} must be an http:// or https:// URL",
                    w.url
                )));
            }
            let secret = std::fs::read(&w.secret_file).map_err(|e| {
                ConfigError::Invalid(format!(
                    "policy.approval_webhook.secret_file {}: {e}",
                    w.secret_file.display()
                ))
            })?;
            if secret.trim_ascii().len() < 16 {
                return Err(ConfigError::Invalid(format!(
                    "policy.approval_webhook.secret_file {}: the secret must be at least 16 bytes",
                    w.secret_file.display()
                )));
            }
            if w.timeout_s.is_some_and(|t| t == 0 || t > 60) {
                return Err(ConfigError::Invalid(
                    "policy.approval_webhook.timeout_s must be 1-60".into(),
                ));
            }
        }
        self.validate_cluster()?;
        let mut seen = std::collections::BTreeSet::new();
        for u in &self.upstreams {
            if !valid_tool_name(&u.id) || u.id.contains('.') {
                return Err(ConfigError::Invalid(format!(
                    "upstream id {:?} must be 1-128 characters of [A-Za-z0-9_-]",
                    u.id
                )));
            }
            if !seen.insert(u.id.clone()) {
                return Err(ConfigError::Invalid(format!(
                    "upstream id {:?} is declared twice",
                    u.id
                )));
            }
            self.validate_upstream(u)?;
        }
        Ok(())
    }

    /// The bounds of connections, tasks and sessions.
    fn validate_bounds(&self) -> Result<(), ConfigError> {
        let c = &self.connections;
        within("connections.header_timeout_s", c.header_timeout_s, 1, 3600)?;
        within("connections.body_timeout_s", c.body_timeout_s, 1, 3600)?;
        within("connections.idle_timeout_s", c.idle_timeout_s, 1, 86_400)?;
        if c.max > 1_000_000 {
            return Err(ConfigError::Invalid(
                "connections.max must be at most 1000000 (0 = auto, from the open-files limit)"
                    .into(),
            ));
        }
        let t = &self.tasks;
        within("tasks.max_ttl_s", t.max_ttl_s, 1, 7 * 86_400)?;
        within(
            "tasks.max_live_per_registration",
            t.max_live_per_registration,
            1,
            4096,
        )?;
        within(
            "tasks.min_poll_interval_ms",
            t.min_poll_interval_ms,
            100,
            3_600_000,
        )?;
        let s = &self.sessions;
        within("sessions.queue_bytes", s.queue_bytes, 64 * 1024, 1 << 30)?;
        within("sessions.max_in_flight", s.max_in_flight, 1, 65_536)?;
        Ok(())
    }

    /// The node id, an `etcd` store's settings, the cluster's timings and the separator.
    fn validate_cluster(&self) -> Result<(), ConfigError> {
        if let Some(node) = &self.node_id {
            if !valid_node_id(node) {
                return Err(ConfigError::Invalid(format!(
                    "node_id = {node:?}: must be 1-{NODE_ID_MAX} characters of [a-z0-9] (registration ids become <node_id>.<random>)"
                )));
            }
        }
        if self.store.backend == Some(StoreBackend::Etcd) {
            if self.node_id.is_none() {
                return Err(ConfigError::Invalid(
                    "store.backend = \"etcd\" needs node_id (GATEHOUSE_NODE_ID): it names the node's heartbeat and sessions".into(),
                ));
            }
            if self.store.endpoints.is_empty() {
                return Err(ConfigError::Invalid(
                    "store.backend = \"etcd\" needs store.endpoints (or GATEHOUSE_STORE=etcd://host:port,...)".into(),
                ));
            }
            within("store.timeout_ms", self.store.timeout_ms, 100, 60_000)?;
        }
        let cl = &self.cluster;
        within("cluster.release_bound_ms", cl.release_bound_ms, 100, 60_000)?;
        if !(10..=10_000).contains(&cl.heartbeat_ms) || cl.heartbeat_ms >= cl.release_bound_ms {
            return Err(ConfigError::Invalid(
                "cluster.heartbeat_ms must be 10-10000 and below cluster.release_bound_ms".into(),
            ));
        }
        if crate::tool_name::Separator::parse(&self.tool_name_separator).is_none() {
            return Err(ConfigError::Invalid(format!(
                "tool_name_separator = {:?}: must be \".\", \"_\" or \"__\"",
                self.tool_name_separator
            )));
        }
        Ok(())
    }

    /// One upstream's settings (its id's shape and uniqueness are checked by the caller).
    fn validate_upstream(&self, u: &UpstreamConfig) -> Result<(), ConfigError> {
        if u.max_in_flight == 0 {
            return Err(ConfigError::Invalid(format!(
                "upstream {:?}: max_in_flight must be at least 1",
                u.id
            )));
        }
        if let Some(n) = u.max_in_flight_per_registration {
            if n == 0 || n > u.max_in_flight {
                return Err(ConfigError::Invalid(format!(
                    "upstream {:?}: max_in_flight_per_registration must be 1-{} (its max_in_flight)",
                    u.id, u.max_in_flight
                )));
            }
        }
        match (&u.command, &u.url) {
            (Some(_), None) | (None, Some(_)) => {}
            _ => {
                return Err(ConfigError::Invalid(format!(
                    "upstream {:?} needs exactly one of `command` (stdio) or `url` (HTTP)",
                    u.id
                )))
            }
        }
        u.validate_tls().map_err(ConfigError::Invalid)?;
        if let Some(o) = &u.oauth {
            o.validate(&u.id, u.url.is_some())
                .map_err(ConfigError::Invalid)?;
        }
        match u.protocol.as_deref() {
            None | Some(MODERN_PROTOCOL) => {}
            Some(other) => {
                return Err(ConfigError::Invalid(format!(
                    "upstream {:?}: protocol = {other:?}: expected \"2026-07-28\" (or leave it unset for the handshake)",
                    u.id
                )))
            }
        }
        if let Some(caps) = &u.client_capabilities {
            if let Some(bad) = caps
                .iter()
                .find(|c| !CLIENT_CAPABILITIES.contains(&c.as_str()))
            {
                return Err(ConfigError::Invalid(format!(
                    "upstream {:?}: client_capabilities: unknown capability {bad:?} (expected \"sampling\", \"elicitation\", \"roots\")",
                    u.id
                )));
            }
            if u.sharing == Sharing::Shared && !caps.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "upstream {:?}: client_capabilities cannot be declared on a shared connection: no registration can be named to answer the server's requests (use sharing = \"per_registration\" or \"leased\")",
                    u.id
                )));
            }
        }
        if let Some(sep) = &u.name_separator {
            if crate::tool_name::Separator::parse(sep).is_none() {
                return Err(ConfigError::Invalid(format!(
                    "upstream {:?}: name_separator = {sep:?}: must be \".\", \"_\" or \"__\"",
                    u.id
                )));
            }
        }
        let rule = self.name_rule_of(u);
        if rule.model_safe && !rule.bare && rule.separator == crate::tool_name::Separator::Dot {
            return Err(ConfigError::Invalid(format!(
                "upstream {:?}: model-safe tool names cannot contain \".\": set name_separator (or tool_name_separator) to \"_\" or \"__\"",
                u.id
            )));
        }
        for (from, to) in &u.rename {
            if !valid_tool_name(to) {
                return Err(ConfigError::Invalid(format!(
                    "upstream {:?}: rename {from:?} -> {to:?}: names are 1-128 characters of [A-Za-z0-9_.-]",
                    u.id
                )));
            }
        }
        Ok(())
    }
}

/// `value` of config `key` within `lo..=hi`, else the error that names the key and the range.
fn within<T: PartialOrd + std::fmt::Display>(
    key: &str,
    value: T,
    lo: T,
    hi: T,
) -> Result<(), ConfigError> {
    if lo <= value && value <= hi {
        return Ok(());
    }
    Err(ConfigError::Invalid(format!("{key} must be {lo}-{hi}")))
}
