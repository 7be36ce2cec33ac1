//! Notifications from upstreams: their kind, read once from the method, and where each kind
//! is routed.

use serde_json::Value;

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
    use serde_json::json;

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
}
