//! `Mcp-Param-{Name}` (2026-07-28 Streamable HTTP, SEP-2243): a tool argument whose schema
//! carries `"x-mcp-header": "{Name}"` is mirrored into that header. Pure functions: the
//! annotations of an `inputSchema` (or the rule they break), the header text of an argument
//! (plain, or `=?base64?…?=`), and the check of received headers against the arguments.
//!
//! Rules (spec, "Custom Headers from Tool Parameters"): the name is a non-empty RFC 9110
//! token, case-insensitively unique in the schema, on an `integer`, `string` or `boolean`
//! property (not `number`), reached from the root through `properties` keys only (not
//! `items`, `oneOf`/`anyOf`/`allOf`/`not`, `if`/`then`/`else`, `$ref`, …). A null or absent
//! argument has no header; a present one must have it, equal after decoding (integers
//! compared numerically).

use std::borrow::Cow;
use std::sync::Arc;

use base64::Engine;
use serde_json::Value;

/// The schema annotation.
pub const ANNOTATION: &str = "x-mcp-header";
/// The header names' prefix, lowercase (header names compare case-insensitively).
pub const HEADER_PREFIX: &str = "mcp-param-";
const SENTINEL_START: &str = "=?base64?";
const SENTINEL_END: &str = "?=";
/// Deeper schemas are not walked further (serde_json parses at most 128 levels anyway).
const MAX_DEPTH: usize = 128;

/// One annotated argument of a tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamHeader {
    /// The header's name, lowercase: `mcp-param-region`.
    pub header: String,
    /// The annotation's value as written (`Region`), for messages.
    pub name: String,
    /// Where the argument is: the chain of `properties` keys from the root.
    pub path: Box<[String]>,
}

/// A tool's annotated arguments, computed once per tool (none: the tool has no entry).
pub type ParamHeaders = Arc<[ParamHeader]>;

/// The annotated arguments of a tool's `inputSchema`, in schema order, or the rule an
/// annotation breaks (the tool is then not to be offered).
pub fn scan(input_schema: &Value) -> Result<Vec<ParamHeader>, String> {
    let mut out = Vec::new();
    let mut path = Vec::new();
    walk(input_schema, &mut path, None, 0, &mut out)?;
    Ok(out)
}

/// Walks a schema node. `off`: the first keyword on the way here that is not a `properties`
/// step (None: statically reachable).
fn walk<'a>(
    node: &'a Value,
    path: &mut Vec<&'a str>,
    off: Option<&'a str>,
    depth: usize,
    out: &mut Vec<ParamHeader>,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Ok(());
    }
    let obj = match node {
        Value::Object(o) => o,
        Value::Array(a) => {
            for v in a {
                walk(v, path, off, depth + 1, out)?;
            }
            return Ok(());
        }
        _ => return Ok(()),
    };
    if let Some(name) = obj.get(ANNOTATION) {
        out.push(annotation(obj, name, path, off, out)?);
    }
    for (key, v) in obj {
        match key.as_str() {
            ANNOTATION => {}
            // Instance values, not schemas.
            "default" | "examples" | "const" | "enum" => {}
            "properties" => {
                let Some(props) = v.as_object() else { continue };
                for (pname, sub) in props {
                    path.push(pname);
                    let r = walk(sub, path, off, depth + 1, out);
                    path.pop();
                    r?;
                }
            }
            other => walk(v, path, Some(off.unwrap_or(other)), depth + 1, out)?,
        }
    }
    Ok(())
}

/// One annotation, checked.
fn annotation(
    obj: &serde_json::Map<String, Value>,
    name: &Value,
    path: &[&str],
    off: Option<&str>,
    seen: &[ParamHeader],
) -> Result<ParamHeader, String> {
    let Some(name) = name.as_str().filter(|n| is_token(n)) else {
        return Err(format!(
            "{ANNOTATION} {name} is not an HTTP field-name token (1*tchar, RFC 9110)"
        ));
    };
    if let Some(kw) = off {
        return Err(format!(
            "{ANNOTATION} {name:?} is reached through {kw:?}: only a chain of \"properties\" keys may lead to it"
        ));
    }
    if path.is_empty() {
        return Err(format!(
            "{ANNOTATION} {name:?} is on the schema root, not on a property"
        ));
    }
    let primitive = |t: &str| matches!(t, "string" | "integer" | "boolean");
    let typed = match obj.get("type") {
        Some(Value::String(t)) => Some(t.as_str()),
        // A nullable primitive (`["string", "null"]`): a null argument has no header.
        Some(Value::Array(ts)) => {
            let mut non_null = ts.iter().filter(|t| t.as_str() != Some("null"));
            match (non_null.next().and_then(Value::as_str), non_null.next()) {
                (Some(t), None) => Some(t),
                _ => None,
            }
        }
        _ => None,
    };
    match typed {
        Some(t) if primitive(t) => {}
        Some("number") => {
            return Err(format!(
                "{ANNOTATION} {name:?} is on a number parameter (number is not permitted: integer, string or boolean only)"
            ))
        }
        _ => {
            return Err(format!(
                "{ANNOTATION} {name:?} is not on a primitive parameter (type integer, string or boolean)"
            ))
        }
    }
    if seen.iter().any(|p| p.name.eq_ignore_ascii_case(name)) {
        return Err(format!(
            "{ANNOTATION} {name:?} is used twice (names are case-insensitively unique)"
        ));
    }
    Ok(ParamHeader {
        header: format!("{HEADER_PREFIX}{}", name.to_ascii_lowercase()),
        name: name.to_string(),
        path: path.iter().map(|s| s.to_string()).collect(),
    })
}

/// RFC 9110 `1*tchar`.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'!' | b'#'
                        | b'$'
                        | b'%'
                        | b'&'
                        | b'\''
                        | b'*'
                        | b'+'
                        | b'-'
                        | b'.'
                        | b'^'
                        | b'_'
                        | b'`'
                        | b'|'
                        | b'~'
                )
        })
}

/// The argument at `path` in `arguments` (None: absent or null).
pub fn value_at<'a>(arguments: Option<&'a Value>, path: &[String]) -> Option<&'a Value> {
    let mut v = arguments?;
    for key in path {
        v = v.as_object()?.get(key)?;
    }
    (!v.is_null()).then_some(v)
}

/// The text of an argument (before encoding): a string as is, an integer in decimal, a
/// boolean `true`/`false`. None for what a header cannot carry (null, objects, arrays).
pub fn text_of(v: &Value) -> Option<Cow<'_, str>> {
    match v {
        Value::String(s) => Some(Cow::Borrowed(s)),
        Value::Bool(b) => Some(Cow::Borrowed(if *b { "true" } else { "false" })),
        Value::Number(n) => Some(Cow::Owned(match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (None, Some(u), _) => u.to_string(),
            // 42.0 is the integer 42.
            (None, None, Some(f)) if f.fract() == 0.0 && f.abs() < 9.007_199_254_740_992e15 => {
                format!("{}", f as i64)
            }
            _ => n.to_string(),
        })),
        _ => None,
    }
}

/// Is this text sent as is? Visible ASCII, spaces and tabs inside, no whitespace at either
/// end, not empty, and not itself in the sentinel form.
fn is_plain(v: &str) -> bool {
    let ws = |b: u8| b == b' ' || b == b'\t';
    let bytes = v.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(&f), Some(&l)) if !ws(f) && !ws(l) => {}
        _ => return false,
    }
    bytes.iter().all(|&b| (0x21..0x7f).contains(&b) || ws(b))
        && !(v.starts_with(SENTINEL_START) && v.ends_with(SENTINEL_END))
}

/// A value as header text: as is when plain, else `=?base64?{base64 of its UTF-8}?=`.
pub fn encode(v: &str) -> Cow<'_, str> {
    if is_plain(v) {
        return Cow::Borrowed(v);
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(v.as_bytes());
    Cow::Owned(format!("{SENTINEL_START}{b64}{SENTINEL_END}"))
}

/// A received header value decoded: the `=?base64?…?=` form's UTF-8, or the plain value
/// (visible ASCII, space and tab only). Err: why it is not a valid value.
pub fn decode(raw: &[u8]) -> Result<Cow<'_, str>, &'static str> {
    if !raw.iter().all(|&b| (0x20..0x7f).contains(&b) || b == b'\t') {
        return Err("contains invalid characters");
    }
    let text = std::str::from_utf8(raw).map_err(|_| "contains invalid characters")?;
    if let Some(b64) = text
        .strip_prefix(SENTINEL_START)
        .and_then(|r| r.strip_suffix(SENTINEL_END))
    {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| "is not valid base64 in the =?base64?…?= form")?;
        return String::from_utf8(bytes)
            .map(Cow::Owned)
            .map_err(|_| "is not UTF-8 once decoded");
    }
    Ok(Cow::Borrowed(text))
}

/// Does a decoded header text stand for the body value? Strings and booleans compare
/// exactly, numbers numerically (`42.0` is `42`).
pub fn matches(text: &str, body: &Value) -> bool {
    match body {
        Value::String(s) => s == text,
        Value::Bool(b) => text == if *b { "true" } else { "false" },
        Value::Number(n) => {
            if let (Ok(h), Some(b)) = (text.parse::<i64>(), n.as_i64()) {
                return h == b;
            }
            match (text.parse::<f64>(), n.as_f64()) {
                (Ok(h), Some(b)) => h.is_finite() && h == b,
                _ => false,
            }
        }
        _ => false,
    }
}

/// What a request carries under one header name.
pub enum Received<'a> {
    None,
    One(&'a [u8]),
    Many,
}

/// Checks the received `Mcp-Param-*` headers of a call against its arguments: each annotated
/// argument with a value needs its header, equal once decoded; one without a value must have
/// none. Err: the `HeaderMismatch` message.
pub fn check<'h>(
    params: &[ParamHeader],
    arguments: Option<&Value>,
    header: impl Fn(&str) -> Received<'h>,
) -> Result<(), String> {
    for p in params {
        let body = value_at(arguments, &p.path);
        let shown = || format!("Mcp-Param-{}", p.name);
        match (header(&p.header), body) {
            (Received::None, None) => {}
            (Received::None, Some(_)) => {
                return Err(format!(
                    "header mismatch: {} is required (argument {:?} has a value)",
                    shown(),
                    p.path.join(".")
                ))
            }
            (Received::Many, _) => return Err(format!("header mismatch: {} is repeated", shown())),
            (Received::One(_), None) => {
                return Err(format!(
                    "header mismatch: {} is sent but argument {:?} has no value",
                    shown(),
                    p.path.join(".")
                ))
            }
            (Received::One(raw), Some(v)) => {
                let text =
                    decode(raw).map_err(|why| format!("header mismatch: {} {why}", shown()))?;
                if !matches(&text, v) {
                    return Err(format!(
                        "header mismatch: {} does not match the request body",
                        shown()
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The headers a client sends for a call: (lowercase name, header text) of each annotated
/// argument that has a value.
pub fn headers_for<'a>(
    params: &'a [ParamHeader],
    arguments: Option<&'a Value>,
) -> impl Iterator<Item = (&'a str, String)> + 'a {
    params.iter().filter_map(move |p| {
        let text = text_of(value_at(arguments, &p.path)?)?;
        Some((p.header.as_str(), encode(&text).into_owned()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(props: Value) -> Value {
        json!({"type": "object", "properties": props})
    }

    #[test]
    fn the_specs_encoding_examples() {
        // The spec's table (Value Encoding); each decodes back.
        let table = [
            ("us-west1", "us-west1"),
            ("Hello, 世界", "=?base64?SGVsbG8sIOS4lueVjA==?="),
            (" padded ", "=?base64?IHBhZGRlZCA=?="),
            ("line1\nline2", "=?base64?bGluZTEKbGluZTI=?="),
            ("=?base64?literal?=", "=?base64?PT9iYXNlNjQ/bGl0ZXJhbD89?="),
        ];
        for (v, encoded) in table {
            assert_eq!(encode(v), encoded);
            assert_eq!(decode(encode(v).as_bytes()).unwrap(), v);
        }
        assert_eq!(text_of(&json!(42)).unwrap(), "42");
        assert_eq!(text_of(&json!(-7)).unwrap(), "-7");
        assert_eq!(text_of(&json!(true)).unwrap(), "true");
        assert_eq!(text_of(&json!(false)).unwrap(), "false");
        assert!(text_of(&json!(null)).is_none());
        assert!(text_of(&json!({"a": 1})).is_none());
    }

    #[test]
    fn badly_encoded_values_are_refused() {
        assert!(decode(b"=?base64?not base64!?=").is_err());
        assert!(
            decode(b"=?base64?/w==?=").is_err(),
            "not UTF-8 once decoded"
        );
        assert!(decode(b"caf\xc3\xa9").is_err(), "raw non-ASCII");
        assert!(decode(b"a\x01b").is_err(), "a control character");
        // Without the exact (lowercase) wrapper the value is literal.
        assert_eq!(decode(b"=?BASE64?dXM=?=").unwrap(), "=?BASE64?dXM=?=");
    }

    #[test]
    fn the_specs_example_tool_mirrors_region() {
        let s = json!({
            "type": "object",
            "properties": {
                "region": {"type": "string", "description": "The region", "x-mcp-header": "Region"},
                "query": {"type": "string"}
            },
            "required": ["region", "query"]
        });
        let p = scan(&s).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].header, "mcp-param-region");
        let args = json!({"region": "us-west1", "query": "SELECT * FROM users"});
        let h: Vec<_> = headers_for(&p, Some(&args)).collect();
        assert_eq!(h, [("mcp-param-region", "us-west1".to_string())]);
    }

    #[test]
    fn nested_properties_chains_are_reachable() {
        let s = schema(json!({"opts": {"type": "object", "properties": {
            "tenant": {"type": "integer", "x-mcp-header": "Tenant"}}}}));
        let p = scan(&s).unwrap();
        assert_eq!(&*p[0].path, ["opts".to_string(), "tenant".to_string()]);
        let args = json!({"opts": {"tenant": 7}});
        assert_eq!(
            headers_for(&p, Some(&args)).collect::<Vec<_>>(),
            [("mcp-param-tenant", "7".to_string())]
        );
        // A property merely named like the annotation is not one.
        assert!(scan(&schema(json!({"x-mcp-header": {"type": "string"}})))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn annotations_breaking_the_rules_are_named() {
        let bad = [
            (
                schema(json!({"a": {"type": "object", "x-mcp-header": "A"}})),
                "primitive",
            ),
            (
                schema(json!({"a": {"type": "number", "x-mcp-header": "A"}})),
                "number",
            ),
            (schema(json!({"a": {"x-mcp-header": "A"}})), "primitive"),
            (
                schema(json!({"a": {"type": "string", "x-mcp-header": ""}})),
                "token",
            ),
            (
                schema(json!({"a": {"type": "string", "x-mcp-header": "A B"}})),
                "token",
            ),
            (
                schema(json!({"a": {"type": "string", "x-mcp-header": "A\r\n"}})),
                "token",
            ),
            (
                schema(json!({"a": {"type": "string", "x-mcp-header": 5}})),
                "token",
            ),
            (
                schema(json!({"a": {"type": "string", "x-mcp-header": "Dup"},
                              "b": {"type": "string", "x-mcp-header": "dup"}})),
                "twice",
            ),
            (
                schema(
                    json!({"a": {"type": "array", "items": {"type": "string", "x-mcp-header": "A"}}}),
                ),
                "\"items\"",
            ),
            (
                json!({"type": "object", "oneOf": [{"properties": {"a": {"type": "string", "x-mcp-header": "A"}}}]}),
                "\"oneOf\"",
            ),
            (
                json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/r"}},
                       "$defs": {"r": {"type": "string", "x-mcp-header": "A"}}}),
                "\"$defs\"",
            ),
            (
                schema(json!({"a": {"allOf": [{"type": "string", "x-mcp-header": "A"}]}})),
                "\"allOf\"",
            ),
            (json!({"type": "string", "x-mcp-header": "Root"}), "root"),
        ];
        for (s, rule) in bad {
            let e = scan(&s).expect_err(&s.to_string());
            assert!(e.contains(rule), "{s}: {e}");
        }
        // A nullable primitive is still a primitive.
        assert!(scan(&schema(
            json!({"a": {"type": ["string", "null"], "x-mcp-header": "A"}})
        ))
        .is_ok());
    }

    fn received<'a>(h: &'a [(&'a str, &'a [u8])]) -> impl Fn(&str) -> Received<'a> + 'a {
        move |name| {
            let mut it = h.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name));
            match (it.next(), it.next()) {
                (None, _) => Received::None,
                (Some((_, v)), None) => Received::One(v),
                _ => Received::Many,
            }
        }
    }

    #[test]
    fn the_server_checks_headers_against_the_arguments() {
        let s = schema(json!({
            "region": {"type": "string", "x-mcp-header": "Region"},
            "n": {"type": "integer", "x-mcp-header": "N"},
            "on": {"type": "boolean", "x-mcp-header": "On"},
            "text": {"type": "string", "x-mcp-header": "Text"}
        }));
        let p = scan(&s).unwrap();
        let args = json!({"region": "us-west1", "n": 42, "on": true, "text": "Hello, 世界"});
        let good: &[(&str, &[u8])] = &[
            ("Mcp-Param-Region", b"us-west1"),
            ("mcp-param-n", b"42.0"),
            ("MCP-PARAM-ON", b"true"),
            ("mcp-param-text", b"=?base64?SGVsbG8sIOS4lueVjA==?="),
        ];
        check(&p, Some(&args), received(good)).unwrap();
        // Null and absent arguments expect no header.
        check(&p, Some(&json!({"n": null})), received(&[])).unwrap();
        type Headers<'a> = &'a [(&'a str, &'a [u8])];
        let cases: &[(Headers, &str)] = &[
            (&good[1..], "Mcp-Param-Region is required"),
            (
                &[
                    ("mcp-param-region", b"us-east1"),
                    ("mcp-param-n", b"42"),
                    ("mcp-param-on", b"true"),
                    ("mcp-param-text", b"=?base64?SGVsbG8sIOS4lueVjA==?="),
                ],
                "Mcp-Param-Region does not match",
            ),
            (
                &[
                    ("mcp-param-region", b"us-west1"),
                    ("mcp-param-n", b"43"),
                    ("mcp-param-on", b"true"),
                    ("mcp-param-text", b"=?base64?SGVsbG8sIOS4lueVjA==?="),
                ],
                "Mcp-Param-N does not match",
            ),
            (
                &[
                    ("mcp-param-region", b"us-west1"),
                    ("mcp-param-n", b"42"),
                    ("mcp-param-on", b"True"),
                    ("mcp-param-text", b"=?base64?SGVsbG8sIOS4lueVjA==?="),
                ],
                "Mcp-Param-On does not match",
            ),
            (
                &[
                    ("mcp-param-region", b"us-west1"),
                    ("mcp-param-n", b"42"),
                    ("mcp-param-on", b"true"),
                    ("mcp-param-text", b"=?base64?%%%?="),
                ],
                "Mcp-Param-Text is not valid base64",
            ),
            (
                &[
                    ("mcp-param-region", b"us-west1"),
                    ("mcp-param-n", b"42"),
                    ("mcp-param-on", b"true"),
                    ("mcp-param-text", "Hello, 世界".as_bytes()),
                ],
                "Mcp-Param-Text contains invalid characters",
            ),
            (
                &[
                    ("mcp-param-region", b"us-west1"),
                    ("mcp-param-region", b"us-west1"),
                    ("mcp-param-n", b"42"),
                    ("mcp-param-on", b"true"),
                    ("mcp-param-text", b"=?base64?SGVsbG8sIOS4lueVjA==?="),
                ],
                "repeated",
            ),
        ];
        for (h, want) in cases {
            let e = check(&p, Some(&args), received(h)).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
        let e = check(
            &p,
            Some(&json!({})),
            received(&[("mcp-param-region", b"x")]),
        )
        .unwrap_err();
        assert!(e.contains("has no value"), "{e}");
    }
}
