//! JSON-RPC 2.0 framing on `serde_json::Value`: classify what arrives, build what leaves.
//!
//! Messages are kept as `Value` maps so that fields the gateway does not understand pass
//! through unchanged. Classification validates only what routing needs.

use serde_json::{Map, Value};

pub use super::error::RpcError;
/// The member `key` of an object, found by comparing keys: a `Map` lookup SipHashes the key,
/// which costs more than comparing the few keys a message's params hold (hot request path).
pub fn member<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.iter().find_map(|(k, v)| (k == key).then_some(v))
}

/// [`member`], mutable.
pub fn member_mut<'a>(map: &'a mut Map<String, Value>, key: &str) -> Option<&'a mut Value> {
    map.iter_mut().find_map(|(k, v)| (k == key).then_some(v))
}

/// Sets member `key` in its place ([`member_mut`]), or appends it.
pub fn set_member(map: &mut Map<String, Value>, key: &str, value: Value) {
    match member_mut(map, key) {
        Some(slot) => *slot = value,
        None => {
            map.insert(key.to_owned(), value);
        }
    }
}

/// One classified JSON-RPC message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Request {
        id: Value,
        method: String,
        params: Option<Value>,
    },
    Notification {
        method: String,
        params: Option<Value>,
    },
    /// A response from the client to a request the gateway (or an upstream) sent it.
    Response { id: Value, body: Value },
}

impl Message {
    pub fn method(&self) -> Option<&str> {
        match self {
            Message::Request { method, .. } | Message::Notification { method, .. } => Some(method),
            Message::Response { .. } => None,
        }
    }

    pub fn params(&self) -> Option<&Value> {
        match self {
            Message::Request { params, .. } | Message::Notification { params, .. } => {
                params.as_ref()
            }
            Message::Response { .. } => None,
        }
    }
}

/// What a request body holds before classification.
#[derive(Debug)]
pub enum Body {
    Single(Value),
    Batch(Vec<Value>),
}

/// Parses a request body. Invalid JSON (or invalid UTF-8) is a parse error with no id.
pub fn parse_body(bytes: &[u8]) -> Result<Body, RpcError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Array(items)) => Ok(Body::Batch(items)),
        Ok(v) => Ok(Body::Single(v)),
        Err(e) => Err(RpcError::parse_error(format!(
            "parse error: body is not valid JSON ({})",
            e.classify_name()
        ))),
    }
}

/// Reads a body that holds one valid request or notification straight into a [`Message`],
/// without building a `Value` for the envelope (the common case on every transport: the
/// envelope's map, its keys and their removal cost more than the rest of the parse).
///
/// `None` for anything else — arrays, responses, invalid or unusual shapes (a `null` id,
/// duplicate keys, an escaped method name): the caller then takes [`parse_body`] and
/// [`classify`], which also word the errors. A `Some` is exactly what that path returns.
pub fn parse_request(bytes: &[u8]) -> Option<Message> {
    let env: Envelope<'_> = serde_json::from_slice(bytes).ok()?;
    if env.jsonrpc.0 != Some("2.0") {
        return None;
    }
    let method = env.method.0?.to_string();
    let params = env.params.0;
    if params
        .as_ref()
        .is_some_and(|p| !p.is_object() && !p.is_array())
    {
        return None;
    }
    match env.id.0 {
        Some(id) if valid_id(&id) => Some(Message::Request { id, method, params }),
        Some(_) => None,
        None => Some(Message::Notification { method, params }),
    }
}

/// The members of a request envelope that classification reads; others are skipped.
#[derive(serde::Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    jsonrpc: Present<&'a str>,
    #[serde(default)]
    id: Present<Value>,
    #[serde(borrow, default)]
    method: Present<&'a str>,
    #[serde(default)]
    params: Present<Value>,
}

/// A member that may be absent: `None` only when it is missing (a JSON `null` is read as
/// the member's value, so `"id": null` is not taken for a notification).
struct Present<T>(Option<T>);

impl<T> Default for Present<T> {
    fn default() -> Self {
        Present(None)
    }
}

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Present<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(|v| Present(Some(v)))
    }
}

trait ClassifyName {
    fn classify_name(&self) -> &'static str;
}

impl ClassifyName for serde_json::Error {
    fn classify_name(&self) -> &'static str {
        match self.classify() {
            serde_json::error::Category::Io => "I/O error",
            serde_json::error::Category::Syntax => "syntax error",
            serde_json::error::Category::Data => "data error",
            serde_json::error::Category::Eof => "unexpected end of input",
        }
    }
}

/// Is this a valid JSON-RPC id (string or integer; never null, float or other)?
fn valid_id(id: &Value) -> bool {
    match id {
        Value::String(_) => true,
        Value::Number(n) => n.is_i64() || n.is_u64(),
        _ => false,
    }
}

/// Classifies one message. Errors carry the id where it could be read.
pub fn classify(value: Value) -> Result<Message, RpcError> {
    let Value::Object(mut map) = value else {
        return Err(RpcError::invalid_request(
            "invalid request: a JSON-RPC message must be a JSON object",
        ));
    };
    let id = map.remove("id");
    let readable_id = id.as_ref().filter(|v| valid_id(v)).cloned();
    match map.get("jsonrpc") {
        Some(Value::String(v)) if v == "2.0" => {}
        _ => {
            return Err(
                RpcError::invalid_request("invalid request: \"jsonrpc\" must be \"2.0\"")
                    .with_id(readable_id),
            )
        }
    }
    if let Some(id) = &id {
        if !valid_id(id) {
            return Err(RpcError::invalid_request(
                "invalid request: \"id\" must be a string or an integer",
            ));
        }
    }
    match map.remove("method") {
        Some(Value::String(method)) => {
            let params = map.remove("params");
            if let Some(p) = &params {
                if !p.is_object() && !p.is_array() {
                    return Err(RpcError::invalid_request(
                        "invalid request: \"params\" must be an object",
                    )
                    .with_id(readable_id));
                }
            }
            match id {
                Some(id) => Ok(Message::Request { id, method, params }),
                None => Ok(Message::Notification { method, params }),
            }
        }
        Some(_) => Err(
            RpcError::invalid_request("invalid request: \"method\" must be a string")
                .with_id(readable_id),
        ),
        None => {
            let has_result = map.contains_key("result");
            let has_error = map.contains_key("error");
            match id {
                Some(id) if has_result != has_error => {
                    map.insert("id".into(), id.clone());
                    Ok(Message::Response {
                        id,
                        body: Value::Object(map),
                    })
                }
                _ => Err(
                    RpcError::invalid_request("invalid request: missing \"method\"")
                        .with_id(readable_id),
                ),
            }
        }
    }
}

/// A response to send: a message as a `Value`, or a success whose result is JSON text as an
/// upstream wrote it (a forwarded tool result passes through without being parsed and
/// encoded again; ARCHITECTURE.md, Decisions: a tool result passes through).
#[derive(Debug)]
pub enum Reply {
    Value(Value),
    Raw {
        id: Value,
        result: Box<serde_json::value::RawValue>,
    },
}

impl From<Value> for Reply {
    fn from(v: Value) -> Self {
        Reply::Value(v)
    }
}

impl Reply {
    /// The response as a `Value` (a raw result is parsed: it is valid JSON).
    pub fn into_value(self) -> Value {
        match self {
            Reply::Value(v) => v,
            Reply::Raw { id, result } => success(id, raw_value(&result)),
        }
    }

    /// Answers `id` instead (a held stateless call's result goes to the client's retry).
    pub fn set_id(&mut self, new: Value) {
        match self {
            Reply::Value(v) => {
                if let Some(slot) = v.get_mut("id") {
                    *slot = new;
                }
            }
            Reply::Raw { id, .. } => *id = new,
        }
    }

    /// Appends the response's compact JSON to `out`. A raw result holds no line break: it
    /// was one line of its upstream's output, or encoded by serde_json.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        // Writing a `Value` into a `Vec` cannot fail (map keys are strings); should it, it
        // is written as `null` rather than half a value.
        fn value(out: &mut Vec<u8>, v: &Value) {
            let head = out.len();
            if serde_json::to_writer(&mut *out, v).is_err() {
                out.truncate(head);
                out.extend_from_slice(b"null");
            }
        }
        match self {
            Reply::Value(v) => value(out, v),
            Reply::Raw { id, result } => {
                out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
                value(out, id);
                out.extend_from_slice(br#","result":"#);
                out.extend_from_slice(result.get().as_bytes());
                out.push(b'}');
            }
        }
    }

    /// The response's compact JSON.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        self.write_json(&mut out);
        out
    }
}

/// Raw JSON text as a `Value`. The text was validated when it was read, so the `Null` of a
/// failed parse is never seen.
pub fn raw_value(raw: &serde_json::value::RawValue) -> Value {
    serde_json::from_str(raw.get()).unwrap_or(Value::Null)
}

/// A success response.
pub fn success(id: Value, result: Value) -> Value {
    let mut m = Map::with_capacity(3);
    m.insert("jsonrpc".into(), Value::from("2.0"));
    m.insert("id".into(), id);
    m.insert("result".into(), result);
    Value::Object(m)
}

/// A notification.
pub fn notification(method: &str, params: Option<Value>) -> Value {
    let mut m = Map::with_capacity(3);
    m.insert("jsonrpc".into(), Value::from("2.0"));
    m.insert("method".into(), Value::from(method));
    if let Some(p) = params {
        m.insert("params".into(), p);
    }
    Value::Object(m)
}

/// A stable map key for a request id, so `1` and `"1"` stay distinct and two ids are the
/// same key exactly when their JSON texts are (`s:<string>` / `n:<the value as JSON>` as
/// strings). An integer id, what nearly every client sends, is kept as a number: no
/// formatting and no allocation (two per call: begin and end).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum IdKey {
    /// A non-negative integer.
    Unsigned(u64),
    /// A negative integer.
    Negative(i64),
    /// A string id.
    Text(String),
    /// Any other value, as JSON (`1.5`, `null`, `[1]`).
    Other(String),
}

impl IdKey {
    pub fn of(id: &Value) -> IdKey {
        match id {
            Value::String(s) => IdKey::Text(s.clone()),
            Value::Number(n) => match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => IdKey::Unsigned(u),
                (None, Some(i)) => IdKey::Negative(i),
                (None, None) => IdKey::Other(n.to_string()),
            },
            other => IdKey::Other(other.to_string()),
        }
    }
}

// Unit tests only (never built into the daemon): an unwrap that fails is the test failing.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::error::{INVALID_REQUEST, PARSE_ERROR};
    use serde_json::json;

    #[test]
    fn a_raw_reply_is_the_envelope_around_the_text_as_written() {
        let text = r#"{"b": 1.50, "a": [ true ]}"#;
        let raw = serde_json::value::RawValue::from_string(text.to_string()).unwrap();
        let mut r = Reply::Raw {
            id: json!("x\"y"),
            result: raw,
        };
        assert_eq!(
            String::from_utf8(r.to_vec()).unwrap(),
            format!(r#"{{"jsonrpc":"2.0","id":"x\"y","result":{text}}}"#)
        );
        r.set_id(json!(7));
        let v = r.into_value();
        assert_eq!(v, success(json!(7), json!({"b": 1.5, "a": [true]})));
        let mut plain = Reply::from(success(json!(1), json!({})));
        plain.set_id(json!(2));
        assert_eq!(plain.to_vec(), br#"{"jsonrpc":"2.0","id":2,"result":{}}"#);
    }

    #[test]
    fn classifies_requests_notifications_and_responses() {
        let m = classify(json!({"jsonrpc":"2.0","id":1,"method":"ping"}));
        assert!(matches!(m, Ok(Message::Request { .. })));
        let m = classify(json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
        assert!(matches!(m, Ok(Message::Notification { .. })));
        let m = classify(json!({"jsonrpc":"2.0","id":"a","result":{}}));
        assert!(matches!(m, Ok(Message::Response { .. })));
    }

    /// The classification of `bytes` by the general path (`parse_body` + `classify`).
    fn general(bytes: &[u8]) -> Option<Result<Message, RpcError>> {
        match parse_body(bytes) {
            Ok(Body::Single(v)) => Some(classify(v)),
            _ => None,
        }
    }

    #[test]
    fn plain_requests_and_notifications_take_the_direct_path() {
        for body in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"m":"hi"}}}"#,
            r#"{"method":"ping","id":"a-1","jsonrpc":"2.0"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":18446744073709551615,"method":"x","params":[1,2],"extra":{"k":[true]}}"#,
            r#" {"jsonrpc":"2.0","id":-3,"method":"x"} "#,
        ] {
            let direct = parse_request(body.as_bytes());
            assert!(direct.is_some(), "{body}");
            assert_eq!(direct.map(Ok), general(body.as_bytes()), "{body}");
        }
    }

    #[test]
    fn unusual_shapes_are_left_to_the_general_path() {
        for body in [
            r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","id":2}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"p\u0069ng"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":null}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":null}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":"x"}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#,
            r#"{"id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"} x"#,
            "",
        ] {
            assert_eq!(parse_request(body.as_bytes()), None, "{body}");
        }
        let not_utf8 = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"p\xffng\"}";
        assert_eq!(parse_request(not_utf8), None);
    }

    proptest::proptest! {
        // About one body in ten is a valid request or notification.
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]
        /// Whatever the direct path returns is what the general path returns.
        #[test]
        fn the_direct_path_agrees_with_the_general_one(
            members in proptest::sample::subsequence(
                vec![0usize, 1, 2, 3, 4, 5, 6], 0..=7),
            picks in proptest::collection::vec(0usize..12, 7),
            shuffle in proptest::collection::vec(0usize..7, 7),
        ) {
            const JSONRPC: &[&str] = &[r#""2.0""#, r#""1.0""#, "2", "null", r#""2\u002e0""#];
            const ID: &[&str] = &["1", "-5", r#""a""#, "null", "1.5", "[1]", "18446744073709551615", "{}"];
            const METHOD: &[&str] = &[r#""ping""#, r#""tools/call""#, "3", "null", r#""p\u0069ng""#, r#""""#];
            const PARAMS: &[&str] = &["{}", r#"{"name":"x","arguments":{"a":1}}"#, "[]", r#""s""#, "null", "7"];
            const EXTRA: &[&str] = &[r#""result":{}"#, r#""error":{"code":1,"message":"m"}"#, r#""x":[1,{"y":2}]"#, r#""id":2"#];
            let mut parts: Vec<String> = members
                .iter()
                .map(|&m| {
                    // A pick past the end of a set takes its first (valid) choice, so that
                    // valid envelopes are common.
                    let pick = |set: &[&str]| set.get(picks[m]).unwrap_or(&set[0]).to_string();
                    match m {
                        0 => format!(r#""jsonrpc":{}"#, pick(JSONRPC)),
                        1 => format!(r#""id":{}"#, pick(ID)),
                        2 => format!(r#""method":{}"#, pick(METHOD)),
                        3 => format!(r#""params":{}"#, pick(PARAMS)),
                        _ => pick(EXTRA),
                    }
                })
                .collect();
            for (i, &j) in shuffle.iter().enumerate() {
                if i < parts.len() {
                    let j = j % parts.len();
                    parts.swap(i, j);
                }
            }
            let body = format!("{{{}}}", parts.join(","));
            if let Some(m) = parse_request(body.as_bytes()) {
                proptest::prop_assert_eq!(Some(Ok(m)), general(body.as_bytes()), "{}", body);
            }
        }
    }

    /// Two ids are one key exactly when their formatted keys (`s:…` / `n:<JSON>`, what the
    /// table was keyed by before) are equal.
    #[test]
    fn id_keys_are_equal_when_the_formatted_values_are() {
        let was = |id: &Value| match id {
            Value::String(s) => format!("s:{s}"),
            other => format!("n:{other}"),
        };
        let ids = [
            json!(0),
            json!(7),
            json!("7"),
            json!(-1),
            json!("-1"),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(i64::MAX),
            json!(1.5),
            json!("1.5"),
            json!(1.0),
            json!(""),
            json!("é\"x"),
            Value::Null,
            json!("null"),
            json!([1]),
            serde_json::from_str::<Value>("7").unwrap(),
            serde_json::from_str::<Value>("-0").unwrap(),
        ];
        for a in &ids {
            for b in &ids {
                assert_eq!(IdKey::of(a) == IdKey::of(b), was(a) == was(b), "{a} vs {b}");
            }
        }
        assert_eq!(IdKey::of(&json!(7)), IdKey::Unsigned(7));
    }

    #[test]
    fn errors_keep_readable_ids() {
        let e = classify(json!({"jsonrpc":"1.0","id":7,"method":"ping"})).unwrap_err();
        assert_eq!(e.id, Some(json!(7)));
        assert_eq!(e.code, INVALID_REQUEST);
        let e = classify(json!({"jsonrpc":"2.0","id":null,"method":"ping"})).unwrap_err();
        assert_eq!(e.id, None);
        let e = classify(json!({"jsonrpc":"2.0","id":1.5,"method":"ping"})).unwrap_err();
        assert_eq!(e.id, None);
        let e = classify(json!({"jsonrpc":"2.0","id":3})).unwrap_err();
        assert_eq!(e.id, Some(json!(3)));
        let e = classify(json!("x")).unwrap_err();
        assert_eq!(e.code, INVALID_REQUEST);
        let e = parse_body(b"{nope").unwrap_err();
        assert_eq!(e.code, PARSE_ERROR);
    }
}
