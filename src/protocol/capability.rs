//! What each side declares: the client capabilities a server → client request needs, and
//! the gateway's own capabilities, `Implementation` and log levels.

use serde_json::{json, Value};

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

#[cfg(test)]
mod tests {
    use super::ClientCapability as C;
    use serde_json::json;

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
