//! The methods the gateway serves, as one enum: each known method once, with what the
//! gateway does with it (its own, proxied to an upstream, a task method); anything else is
//! [`Method::Other`] (the name stays with the message).

/// A request method, read once from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    Initialize,
    Ping,
    ToolsList,
    ToolsCall,
    LoggingSetLevel,
    ServerDiscover,
    SubscriptionsListen,
    ResourcesList,
    ResourcesRead,
    ResourcesTemplatesList,
    ResourcesSubscribe,
    ResourcesUnsubscribe,
    PromptsList,
    PromptsGet,
    CompletionComplete,
    TasksGet,
    TasksResult,
    TasksCancel,
    TasksList,
    TasksUpdate,
    /// A method the gateway does not know: passed on or refused by name.
    Other,
}

impl Method {
    /// The method's name; `_OTHER` for an unknown one (what a span name and a metric label
    /// carry: a closed set).
    pub const fn name(self) -> &'static str {
        match self {
            Method::Initialize => "initialize",
            Method::Ping => "ping",
            Method::ToolsList => "tools/list",
            Method::ToolsCall => "tools/call",
            Method::LoggingSetLevel => "logging/setLevel",
            Method::ServerDiscover => "server/discover",
            Method::SubscriptionsListen => "subscriptions/listen",
            Method::ResourcesList => "resources/list",
            Method::ResourcesRead => "resources/read",
            Method::ResourcesTemplatesList => "resources/templates/list",
            Method::ResourcesSubscribe => "resources/subscribe",
            Method::ResourcesUnsubscribe => "resources/unsubscribe",
            Method::PromptsList => "prompts/list",
            Method::PromptsGet => "prompts/get",
            Method::CompletionComplete => "completion/complete",
            Method::TasksGet => "tasks/get",
            Method::TasksResult => "tasks/result",
            Method::TasksCancel => "tasks/cancel",
            Method::TasksList => "tasks/list",
            Method::TasksUpdate => "tasks/update",
            Method::Other => "_OTHER",
        }
    }

    /// The method named `name` ([`Method::Other`] when unknown).
    pub fn of(name: &str) -> Method {
        match name {
            "initialize" => Method::Initialize,
            "ping" => Method::Ping,
            "tools/list" => Method::ToolsList,
            "tools/call" => Method::ToolsCall,
            "logging/setLevel" => Method::LoggingSetLevel,
            "server/discover" => Method::ServerDiscover,
            "subscriptions/listen" => Method::SubscriptionsListen,
            "resources/list" => Method::ResourcesList,
            "resources/read" => Method::ResourcesRead,
            "resources/templates/list" => Method::ResourcesTemplatesList,
            "resources/subscribe" => Method::ResourcesSubscribe,
            "resources/unsubscribe" => Method::ResourcesUnsubscribe,
            "prompts/list" => Method::PromptsList,
            "prompts/get" => Method::PromptsGet,
            "completion/complete" => Method::CompletionComplete,
            "tasks/get" => Method::TasksGet,
            "tasks/result" => Method::TasksResult,
            "tasks/cancel" => Method::TasksCancel,
            "tasks/list" => Method::TasksList,
            "tasks/update" => Method::TasksUpdate,
            _ => Method::Other,
        }
    }

    /// Served by the upstreams that run it (`methods::proxy`), besides tools.
    pub const fn is_proxied(self) -> bool {
        matches!(
            self,
            Method::ResourcesList
                | Method::ResourcesRead
                | Method::ResourcesTemplatesList
                | Method::ResourcesSubscribe
                | Method::ResourcesUnsubscribe
                | Method::PromptsList
                | Method::PromptsGet
                | Method::CompletionComplete
        )
    }

    /// A task method, either form (`mcp::tasks`).
    pub const fn is_task(self) -> bool {
        matches!(
            self,
            Method::TasksGet
                | Method::TasksResult
                | Method::TasksCancel
                | Method::TasksList
                | Method::TasksUpdate
        )
    }
}

/// A method as a span name and a metric label may carry it: one the gateway serves or sends
/// (a closed set), anything else `_OTHER`.
pub fn method_name(method: &str) -> &'static str {
    Method::of(method).name()
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Method {
        /// Every known method.
        pub const KNOWN: [Method; 20] = [
            Method::Initialize,
            Method::Ping,
            Method::ToolsList,
            Method::ToolsCall,
            Method::LoggingSetLevel,
            Method::ServerDiscover,
            Method::SubscriptionsListen,
            Method::ResourcesList,
            Method::ResourcesRead,
            Method::ResourcesTemplatesList,
            Method::ResourcesSubscribe,
            Method::ResourcesUnsubscribe,
            Method::PromptsList,
            Method::PromptsGet,
            Method::CompletionComplete,
            Method::TasksGet,
            Method::TasksResult,
            Method::TasksCancel,
            Method::TasksList,
            Method::TasksUpdate,
        ];

        /// One of the gateway's own methods (neither proxied nor a task one).
        pub const fn is_own(self) -> bool {
            !matches!(self, Method::Other) && !self.is_proxied() && !self.is_task()
        }
    }

    #[test]
    fn method_names_are_a_closed_set() {
        assert_eq!(method_name("prompts/get"), "prompts/get");
        assert_eq!(method_name("tasks/update"), "tasks/update");
        assert_eq!(method_name("subscriptions/listen"), "subscriptions/listen");
        assert_eq!(method_name("x/anything-the-client-sent"), "_OTHER");
    }

    #[test]
    fn every_known_method_is_read_back_from_its_name_and_has_one_kind() {
        for m in Method::KNOWN {
            assert_eq!(Method::of(m.name()), m);
            let kinds = [m.is_own(), m.is_proxied(), m.is_task()];
            assert_eq!(kinds.iter().filter(|k| **k).count(), 1, "{m:?}");
        }
        let own: Vec<_> = Method::KNOWN.into_iter().filter(|m| m.is_own()).collect();
        assert_eq!(own.len(), 7, "{own:?}");
        assert!(!Method::Other.is_own());
    }
}
