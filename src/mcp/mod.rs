//! The MCP protocol as the gateway serves it: JSON-RPC framing (`jsonrpc`) and method
//! dispatch (`dispatch`), shared by every downstream transport.

pub mod dispatch;
pub mod jsonrpc;
pub mod proxy;
pub mod request;
pub mod tasks;

use serde_json::{json, Value};

/// Every revision served, oldest first: the one list of protocol versions. The handshake-era
/// ones, then the stateless one.
pub const ALL_VERSIONS: &[&str] = &[
    "2024-11-05",
    "2025-03-26",
    "2025-06-18",
    "2025-11-25",
    crate::config::MODERN_PROTOCOL,
];
/// Handshake-era revisions, oldest first.
pub const LEGACY_VERSIONS: &[&str] = ALL_VERSIONS.split_at(ALL_VERSIONS.len() - 1).0;
/// The newest handshake-era revision (what `initialize` answers for an unknown version).
pub const LATEST_LEGACY: &str = LEGACY_VERSIONS[LEGACY_VERSIONS.len() - 1];
/// The stateless revision.
pub const MODERN_VERSION: &str = ALL_VERSIONS[ALL_VERSIONS.len() - 1];
/// What a handshake-era request without `MCP-Protocol-Version` is assumed to speak, and the
/// one revision whose clients may send JSON-RPC batches.
pub const BATCH_VERSION: &str = ALL_VERSIONS[1];
/// Priming events (empty data with an id) go to clients at this revision or later.
pub const PRIMING_SINCE: &str = ALL_VERSIONS[3];

/// Methods served by the upstreams that run them (`mcp::proxy`), besides tools.
pub const PROXIED_METHODS: &[&str] = &[
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
];

/// Task methods, both forms (`mcp::tasks`).
pub const TASK_METHODS: &[&str] = &[
    "tasks/get",
    "tasks/result",
    "tasks/cancel",
    "tasks/list",
    "tasks/update",
];

/// The gateway's own methods (neither proxied nor tasks).
const OWN_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "logging/setLevel",
    "server/discover",
    "subscriptions/listen",
];

/// A method as a span name and a metric label may carry it: one the gateway serves or sends
/// (a closed set), anything else `_OTHER`.
pub fn method_name(method: &str) -> &'static str {
    [OWN_METHODS, PROXIED_METHODS, TASK_METHODS]
        .iter()
        .flat_map(|l| l.iter())
        .copied()
        .find(|k| *k == method)
        .unwrap_or("_OTHER")
}

/// Picks the version `initialize` answers: the client's if supported, else the latest.
pub fn negotiate(requested: Option<&str>) -> &'static str {
    requested
        .and_then(|r| LEGACY_VERSIONS.iter().find(|v| **v == r).copied())
        .unwrap_or(LATEST_LEGACY)
}

/// The server capabilities the gateway advertises.
pub fn server_capabilities() -> Value {
    json!({"tools": {"listChanged": true}, "logging": {}})
}

/// The gateway's `Implementation`.
pub fn server_info() -> Value {
    json!({"name": "gatehouse", "version": env!("CARGO_PKG_VERSION")})
}

/// RFC 5424 severities as MCP names them (`notifications/message`), least severe first.
pub const LOG_LEVELS: [&str; 8] = [
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// The index of a log level in [`LOG_LEVELS`].
pub fn log_level_index(level: &str) -> Option<u8> {
    LOG_LEVELS
        .iter()
        .position(|l| *l == level)
        .and_then(|i| u8::try_from(i).ok())
}

/// A client capability a server → client request needs (`initialize`'s `capabilities`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCapability {
    /// `sampling/createMessage`.
    Sampling,
    /// `elicitation/create`.
    Elicitation,
    /// `roots/list`.
    Roots,
}

impl ClientCapability {
    /// Every client capability the gateway can route, in the order it declares them.
    pub const ALL: [ClientCapability; 3] = [
        ClientCapability::Sampling,
        ClientCapability::Elicitation,
        ClientCapability::Roots,
    ];

    /// The key in `capabilities` (and in the upstream config's `client_capabilities`).
    pub fn as_str(self) -> &'static str {
        match self {
            ClientCapability::Sampling => "sampling",
            ClientCapability::Elicitation => "elicitation",
            ClientCapability::Roots => "roots",
        }
    }

    /// The capability a server → client request method needs (None: not one of these).
    pub fn for_method(method: &str) -> Option<ClientCapability> {
        match method {
            "sampling/createMessage" => Some(ClientCapability::Sampling),
            "elicitation/create" => Some(ClientCapability::Elicitation),
            "roots/list" => Some(ClientCapability::Roots),
            _ => None,
        }
    }

    fn bit(self) -> u8 {
        match self {
            ClientCapability::Sampling => 1,
            ClientCapability::Elicitation => 2,
            ClientCapability::Roots => 4,
        }
    }

    /// The capabilities a client declared, as a bit set (`capabilities.<key>` present and not
    /// null).
    pub fn bits_of(capabilities: Option<&Value>) -> u8 {
        Self::ALL
            .into_iter()
            .filter(|c| {
                capabilities
                    .and_then(|caps| caps.get(c.as_str()))
                    .is_some_and(|v| !v.is_null())
            })
            .fold(0, |acc, c| acc | c.bit())
    }

    /// Is this capability in a bit set made by [`ClientCapability::bits_of`]?
    pub fn in_bits(self, bits: u8) -> bool {
        bits & self.bit() != 0
    }
}

/// A notification from an upstream, as the gateway routes it: read once from its method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    ToolsListChanged,
    PromptsListChanged,
    ResourcesListChanged,
    /// `notifications/resources/updated`: to the subscribers of its `params.uri` only.
    ResourcesUpdated,
    /// `notifications/message`: to the sessions whose log level it reaches.
    Log,
    /// `notifications/tasks/status` (2025-11-25): to the registration owning the task it names.
    TaskStatus,
    /// Any other method: not delivered outside a call.
    Other,
}

impl Notice {
    pub fn of(method: &str) -> Notice {
        match method {
            "notifications/tools/list_changed" => Notice::ToolsListChanged,
            "notifications/prompts/list_changed" => Notice::PromptsListChanged,
            "notifications/resources/list_changed" => Notice::ResourcesListChanged,
            "notifications/resources/updated" => Notice::ResourcesUpdated,
            "notifications/message" => Notice::Log,
            "notifications/tasks/status" => Notice::TaskStatus,
            _ => Notice::Other,
        }
    }

    /// The kind of a whole message (its `method`).
    pub fn of_message(msg: &Value) -> Notice {
        msg.get("method")
            .and_then(Value::as_str)
            .map_or(Notice::Other, Notice::of)
    }

    /// Where this notification goes when an upstream sends it outside any call: the one
    /// routing decision, for every kind. `named` is the registration the connection or its
    /// lease names (`per_registration` owner, or the holder of the lease in `_meta`).
    pub fn route(self, named: Option<String>) -> Route {
        match (self, named) {
            // The catalog first; the registrations whose list changed are told then.
            (Notice::ToolsListChanged, _) => Route::RefreshCatalog,
            (Notice::TaskStatus, _) => Route::Task,
            (Notice::Other, _) => Route::Refused,
            (kind, Some(registration)) => Route::Registration(registration, kind),
            // A list change or a resource update concerns everyone granted the upstream; a
            // log is not broadcast (it may say what only its registration may read).
            (Notice::Log, None) => Route::Refused,
            (kind, None) => Route::Grantees(kind),
        }
    }
}

/// Where an upstream's notification outside any call is delivered ([`Notice::route`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `tools/list_changed`: the pool refreshes the catalog; the hub then tells each
    /// registration whose pinned list changed.
    RefreshCatalog,
    /// The sessions and listen streams of this registration (a log only to the sessions whose
    /// level it reaches; a resource update only to the subscribers of its URI).
    Registration(String, Notice),
    /// Every registration granted the upstream (a resource update only to subscribers).
    Grantees(Notice),
    /// `tasks/status`: to the registration that owns the task it names (the gateway's task
    /// table; the upstream's task id rewritten to the gateway's).
    Task,
    /// Not delivered: counted (`gatehouse_notifications_refused_total`), logged at debug.
    Refused,
}

#[cfg(test)]
mod tests {
    use super::ClientCapability as C;
    use serde_json::json;

    #[test]
    fn method_names_are_a_closed_set() {
        use super::method_name;
        assert_eq!(method_name("prompts/get"), "prompts/get");
        assert_eq!(method_name("tasks/update"), "tasks/update");
        assert_eq!(method_name("subscriptions/listen"), "subscriptions/listen");
        assert_eq!(method_name("x/anything-the-client-sent"), "_OTHER");
    }

    #[test]
    fn notices_are_read_once_from_their_method_and_routed_by_kind() {
        use super::Notice as N;
        assert_eq!(
            N::of("notifications/tools/list_changed"),
            N::ToolsListChanged
        );
        assert_eq!(
            N::of_message(&json!({"method": "notifications/message", "params": {}})),
            N::Log
        );
        assert_eq!(N::of_message(&json!({"id": 1})), N::Other);
        let named = || Some("r1".to_string());
        let routed: Vec<_> = [
            N::ToolsListChanged,
            N::PromptsListChanged,
            N::ResourcesListChanged,
            N::ResourcesUpdated,
            N::Log,
            N::TaskStatus,
            N::Other,
        ]
        .into_iter()
        .map(|n| (n.route(named()), n.route(None)))
        .collect();
        use super::Route as R;
        let reg = |n| R::Registration("r1".into(), n);
        assert_eq!(
            routed,
            [
                (R::RefreshCatalog, R::RefreshCatalog),
                (
                    reg(N::PromptsListChanged),
                    R::Grantees(N::PromptsListChanged)
                ),
                (
                    reg(N::ResourcesListChanged),
                    R::Grantees(N::ResourcesListChanged)
                ),
                (reg(N::ResourcesUpdated), R::Grantees(N::ResourcesUpdated)),
                (reg(N::Log), R::Refused),
                (R::Task, R::Task),
                (R::Refused, R::Refused),
            ]
        );
    }

    /// The one list, and what is read from it.
    #[test]
    fn protocol_versions_come_from_one_list() {
        use super::*;
        assert_eq!(LEGACY_VERSIONS, &ALL_VERSIONS[..4]);
        assert_eq!(
            (LATEST_LEGACY, MODERN_VERSION, BATCH_VERSION, PRIMING_SINCE),
            ("2025-11-25", "2026-07-28", "2025-03-26", "2025-11-25")
        );
    }

    #[test]
    fn declared_client_capabilities_and_the_methods_that_need_them() {
        let bits = C::bits_of(Some(
            &json!({"sampling": {}, "roots": {"listChanged": true}, "elicitation": null}),
        ));
        assert!(C::Sampling.in_bits(bits) && C::Roots.in_bits(bits));
        assert!(!C::Elicitation.in_bits(bits), "null is not a declaration");
        assert_eq!(C::bits_of(None), 0);
        assert_eq!(C::for_method("elicitation/create"), Some(C::Elicitation));
        assert_eq!(C::for_method("roots/list"), Some(C::Roots));
        assert_eq!(C::for_method("ping"), None);
    }
}
