//! [`RpcError`]: the one JSON-RPC error value. Every error object the gateway writes is made
//! here: by a constructor per code, or kept as another party sent it ([`RpcError::from_peer`]),
//! and written by one serializer ([`RpcError::object`], [`RpcError::to_value`]). The codes
//! are written as numbers in this file only.

use serde_json::{Map, Value};

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// MCP: a resource that does not exist (`resources/read`).
pub const RESOURCE_NOT_FOUND: i64 = -32002;
/// Server-defined: the gateway holds as many requests of this caller in flight as it allows
/// (a session's `sessions.max_in_flight`, a registration's share of an upstream's permits).
/// Prompt and never queued: the caller may retry once one of its requests ended.
pub const BUSY: i64 = -32030;
/// 2026-07-28: a mirrored header disagrees with the body.
pub const HEADER_MISMATCH: i64 = -32020;
/// 2026-07-28: the request needs a client capability (or extension) it did not declare.
pub const MISSING_CAPABILITY: i64 = -32021;
/// 2026-07-28: the requested protocol version is not supported.
pub const UNSUPPORTED_VERSION: i64 = -32022;
/// MCP: URL-mode elicitation required.
pub const URL_ELICITATION_REQUIRED: i64 = -32042;
/// A request cancelled.
pub const REQUEST_CANCELLED: i64 = -32800;

/// A constructor per code: `name => CODE;`, the error answering no id yet (`to`, `with_id`).
macro_rules! constructors {
    ($($(#[$doc:meta])* $name:ident => $code:ident;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(message: impl Into<String>) -> Self {
                Self::new(None, $code, message)
            }
        )*
    };
}

/// A JSON-RPC error, with the id it answers (None: the id could not be read, written `null`).
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub id: Option<Value>,
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
    /// Members of an error object another party sent besides `code`, `message` and `data`,
    /// passed on as they came ([`RpcError::from_peer`]).
    extra: Map<String, Value>,
}

impl RpcError {
    /// An error with `code` answering `id`. The named constructors below say which code.
    pub fn new(id: Option<Value>, code: i64, message: impl Into<String>) -> Self {
        RpcError {
            id,
            code,
            message: message.into(),
            data: None,
            extra: Map::new(),
        }
    }

    constructors! {
        /// -32700: the body is not JSON.
        parse_error => PARSE_ERROR;
        /// -32600: not a valid JSON-RPC request (or refused before it is read: HTTP checks).
        invalid_request => INVALID_REQUEST;
        /// -32601.
        method_not_found => METHOD_NOT_FOUND;
        /// -32602.
        invalid_params => INVALID_PARAMS;
        /// -32603: the gateway (or what it relies on) failed.
        internal => INTERNAL_ERROR;
        /// -32002: no such resource.
        resource_not_found => RESOURCE_NOT_FOUND;
        /// -32030: too many requests of this caller in flight ([`BUSY`]).
        busy => BUSY;
        /// -32020: a mirrored header disagrees with the body.
        header_mismatch => HEADER_MISMATCH;
        /// -32021: a client capability or extension not declared.
        missing_capability => MISSING_CAPABILITY;
        /// -32022: a protocol version not served.
        unsupported_version => UNSUPPORTED_VERSION;
    }

    /// An error object another party sent (an upstream's, a client's), kept as it came: its
    /// `code` (-32603 if it has none), `message` ("upstream error" if none), `data` and any
    /// other member.
    pub fn from_peer(error: &Value) -> Self {
        Self::from_peer_or(error, "upstream error")
    }

    /// [`RpcError::from_peer`], `fallback` the message when the object has none.
    pub fn from_peer_or(error: &Value, fallback: &str) -> Self {
        let mut e = Self::new(
            None,
            Self::code_of(error),
            error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or(fallback),
        );
        if let Value::Object(m) = error {
            for (k, v) in m {
                match k.as_str() {
                    "code" | "message" => {}
                    "data" => e.data = Some(v.clone()),
                    _ => {
                        e.extra.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        e
    }

    /// The code of an error object another party sent (-32603 if it has none).
    pub fn code_of(error: &Value) -> i64 {
        error
            .get("code")
            .and_then(Value::as_i64)
            .unwrap_or(INTERNAL_ERROR)
    }

    /// Without the members a peer added besides `code`, `message` and `data`.
    pub fn bare(mut self) -> Self {
        self.extra.clear();
        self
    }

    /// Answers `id`.
    pub fn to(mut self, id: Value) -> Self {
        self.id = Some(id);
        self
    }

    /// The response answering `id`: `.to(id).to_value()` for an id held by reference.
    pub fn answer(self, id: &Value) -> Value {
        self.to(id.clone()).to_value()
    }

    /// Answers `id` (None: written `null`).
    pub fn with_id(mut self, id: Option<Value>) -> Self {
        self.id = id;
        self
    }

    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// The error object (`{"code", "message", "data"?}`, then the members a peer added): the
    /// one place one is built.
    pub fn object(&self) -> Value {
        let mut err = Map::with_capacity(3 + self.extra.len());
        err.insert("code".into(), Value::from(self.code));
        err.insert("message".into(), Value::from(self.message.as_str()));
        if let Some(d) = &self.data {
            err.insert("data".into(), d.clone());
        }
        for (k, v) in &self.extra {
            err.insert(k.clone(), v.clone());
        }
        Value::Object(err)
    }

    /// The full JSON-RPC response object for this error.
    pub fn to_value(&self) -> Value {
        let mut m = Map::with_capacity(3);
        m.insert("jsonrpc".into(), Value::from("2.0"));
        m.insert("id".into(), self.id.clone().unwrap_or(Value::Null));
        m.insert("error".into(), self.object());
        Value::Object(m)
    }

    /// A response body without envelope, `{"error": …}`, as a client's answer to a request
    /// the gateway relays is read (`Pool::client_response`).
    pub fn to_body(&self) -> Value {
        let mut m = Map::with_capacity(1);
        m.insert("error".into(), self.object());
        Value::Object(m)
    }

    /// Appends the response's compact JSON to `out` (writing a `Value` into a `Vec` cannot
    /// fail: its keys are strings; should it, `null` is written rather than half a value).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let head = out.len();
        if serde_json::to_writer(&mut *out, &self.to_value()).is_err() {
            out.truncate(head);
            out.extend_from_slice(b"null");
        }
    }

    /// `error.type` of a code (span attribute, metric label): the code as a string when it is
    /// one of the protocol's own (a closed set), else `_OTHER`.
    pub fn type_of(code: i64) -> &'static str {
        match code {
            PARSE_ERROR => "-32700",
            INVALID_REQUEST => "-32600",
            METHOD_NOT_FOUND => "-32601",
            INVALID_PARAMS => "-32602",
            INTERNAL_ERROR => "-32603",
            RESOURCE_NOT_FOUND => "-32002",
            BUSY => "-32030",
            URL_ELICITATION_REQUIRED => "-32042",
            REQUEST_CANCELLED => "-32800",
            _ => "_OTHER",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn one_serializer_writes_every_error() {
        let e = RpcError::invalid_params("bad").to(json!(7));
        assert_eq!(
            e.to_value(),
            json!({"jsonrpc": "2.0", "id": 7, "error": {"code": -32602, "message": "bad"}})
        );
        let e = RpcError::internal("x").with_data(json!({"k": 1}));
        assert_eq!(
            e.to_value(),
            json!({"jsonrpc": "2.0", "id": null,
                   "error": {"code": -32603, "message": "x", "data": {"k": 1}}})
        );
        assert_eq!(
            e.to_body(),
            json!({"error": {"code": -32603, "message": "x", "data": {"k": 1}}})
        );
        let mut out = Vec::new();
        RpcError::parse_error("p").write_json(&mut out);
        assert_eq!(
            out,
            br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"p"}}"#
        );
    }

    #[test]
    fn a_peers_error_passes_through_as_it_came() {
        let sent = json!({"code": -32042, "message": "m", "data": [1], "x-more": true});
        let e = RpcError::from_peer(&sent).to(json!("a"));
        assert_eq!(e.object(), sent);
        assert_eq!(e.code, URL_ELICITATION_REQUIRED);
        let e = RpcError::from_peer_or(&json!({"data": 1}), "fell back");
        assert_eq!(
            e.object(),
            json!({"code": -32603, "message": "fell back", "data": 1})
        );
        assert_eq!(
            RpcError::from_peer(&json!("text")).message,
            "upstream error"
        );
    }

    #[test]
    fn error_types_are_a_closed_set() {
        assert_eq!(RpcError::type_of(INTERNAL_ERROR), "-32603");
        assert_eq!(RpcError::type_of(HEADER_MISMATCH), "_OTHER");
        assert_eq!(RpcError::type_of(-1), "_OTHER");
    }
}
