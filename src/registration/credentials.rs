//! Per-registration upstream credentials (issue 47): what a harness gives a registration for
//! an HTTP upstream (`{"bearer": "…"}` or `{"headers": {"<name>": "<value>"}}`), and the cells
//! that upstream connections read them from on every request, so a rotation reaches the next
//! request without a new connection.
//!
//! Invariants: a credential's value is held only as a [`Secret`], which prints and serializes
//! as `"set"`; a credential is never an agent's: it goes only on the requests of the
//! registration it was given to (or of its children, unless a child has its own), on a
//! connection of its own (`upstream::pool` keys such a slot by registration and cell).
//! With no credentials anywhere, a lookup ([`Credentials::cell`]) is one atomic load.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use crate::sync::lock;

/// Headers a credential may not set: the gateway's own (MCP session and version, mirrored
/// 2026 headers, trace context) and HTTP framing.
const RESERVED: &[&str] = &[
    "accept",
    "content-type",
    "content-length",
    "transfer-encoding",
    "connection",
    "host",
    "te",
    "upgrade",
    "keep-alive",
    "mcp-session-id",
    "mcp-protocol-version",
    "mcp-method",
    "mcp-name",
    "last-event-id",
    "traceparent",
    "tracestate",
    "baggage",
];

/// Most headers one credential may set.
pub const MAX_HEADERS: usize = 32;
/// Most bytes of one credential (names and values).
pub const MAX_CREDENTIAL_BYTES: usize = 16 * 1024;

/// A secret string: `Debug` and `Display` show `"set"`, never the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The value itself: for the upstream request's header and the sealed store only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"set\"")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("set")
    }
}

/// One upstream's credential as a harness gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credential {
    /// `Authorization: Bearer <token>`.
    Bearer(Secret),
    /// Headers set on every request (names lowercased).
    Headers(Vec<(String, Secret)>),
    /// For a `token_exchange` upstream: what the gateway exchanges for the registration's
    /// access tokens (RFC 8693 `subject_token`); sets no header itself.
    SubjectToken(Secret),
}

/// A registration's credentials by upstream id, as given.
pub type CredentialSet = BTreeMap<String, Credential>;

impl Credential {
    /// Reads `{"bearer": "…"}` or `{"headers": {"<name>": "<value>", …}}`; errors name the
    /// field (`what`), never a value.
    pub fn from_json(what: &str, v: &Value) -> Result<Credential, String> {
        let Value::Object(m) = v else {
            return Err(format!(
                "{what}: must be {{\"bearer\": \"…\"}} or {{\"headers\": {{\"<name>\": \"<value>\"}}}}"
            ));
        };
        if m.len() != 1 {
            return Err(format!(
                "{what}: exactly one of \"bearer\" or \"headers\" (got {} fields)",
                m.len()
            ));
        }
        if let Some(t) = m.get("subject_token") {
            let Value::String(t) = t else {
                return Err(format!("{what}.subject_token: must be a string"));
            };
            let c = Credential::SubjectToken(Secret::new(t.clone()));
            c.header_map().map_err(|e| format!("{what}: {e}"))?;
            return Ok(c);
        }
        let c = match (m.get("bearer"), m.get("headers")) {
            (Some(Value::String(t)), None) => Credential::Bearer(Secret::new(t.clone())),
            (Some(_), None) => return Err(format!("{what}.bearer: must be a string")),
            (None, Some(Value::Object(h))) => {
                let mut headers = Vec::with_capacity(h.len());
                for (name, value) in h {
                    let Value::String(value) = value else {
                        return Err(format!("{what}.headers.{name}: must be a string"));
                    };
                    headers.push((name.to_ascii_lowercase(), Secret::new(value.clone())));
                }
                Credential::Headers(headers)
            }
            (None, Some(_)) => {
                return Err(format!(
                    "{what}.headers: must be an object of header names to values"
                ))
            }
            _ => {
                let k = m.keys().next().map(String::as_str).unwrap_or("");
                return Err(format!(
                    "{what}.{k}: unknown field (expected \"bearer\", \"headers\" or \"subject_token\")"
                ));
            }
        };
        c.header_map().map_err(|e| format!("{what}: {e}"))?;
        Ok(c)
    }

    /// Reads a whole `{"<upstream>": {…}, …}` object (`what`: the field's name).
    pub fn set_from_json(what: &str, v: &Value) -> Result<CredentialSet, String> {
        let Value::Object(m) = v else {
            return Err(format!(
                "{what}: must be an object of upstream ids to {{\"bearer\": …}} or {{\"headers\": …}}"
            ));
        };
        m.iter()
            .map(|(up, c)| {
                Ok((
                    up.clone(),
                    Credential::from_json(&format!("{what}.{up}"), c)?,
                ))
            })
            .collect()
    }

    /// Its plain JSON form (what is sealed in the store; never logged or answered).
    pub fn to_json(&self) -> Value {
        match self {
            Credential::Bearer(t) => serde_json::json!({"bearer": t.expose()}),
            Credential::Headers(h) => {
                let m: serde_json::Map<String, Value> = h
                    .iter()
                    .map(|(n, v)| (n.clone(), Value::String(v.expose().to_string())))
                    .collect();
                serde_json::json!({ "headers": m })
            }
            Credential::SubjectToken(t) => serde_json::json!({"subject_token": t.expose()}),
        }
    }

    /// The headers it sets, checked (names, values, bounds); values marked sensitive.
    pub fn header_map(&self) -> Result<HeaderMap, String> {
        let mut map = HeaderMap::new();
        let mut bytes = 0usize;
        let mut put = |name: &str, value: String| -> Result<(), String> {
            bytes += name.len() + value.len();
            if bytes > MAX_CREDENTIAL_BYTES {
                return Err(format!("at most {MAX_CREDENTIAL_BYTES} bytes"));
            }
            if RESERVED.contains(&name) {
                return Err(format!(
                    "header {name:?} is set by the gateway and cannot be a credential"
                ));
            }
            let n = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("header name {name:?} is not a valid HTTP header name"))?;
            let visible = !value.is_empty() && value.bytes().all(|b| (0x20..0x7f).contains(&b));
            let mut v = HeaderValue::from_str(&value)
                .ok()
                .filter(|_| visible)
                .ok_or_else(|| {
                    format!("the value of header {name:?} must be non-empty visible ASCII")
                })?;
            v.set_sensitive(true);
            map.append(n, v);
            Ok(())
        };
        match self {
            Credential::Bearer(t) => {
                let t = t.expose();
                if t.is_empty() || t.bytes().any(|b| b.is_ascii_whitespace()) {
                    return Err("bearer: must be a non-empty token without whitespace".into());
                }
                put("authorization", format!("Bearer {t}"))?;
            }
            Credential::SubjectToken(t) => {
                let t = t.expose();
                if t.is_empty()
                    || t.len() > MAX_CREDENTIAL_BYTES
                    || !t.bytes().all(|b| (0x21..0x7f).contains(&b))
                {
                    return Err(format!(
                        "subject_token: must be 1 to {MAX_CREDENTIAL_BYTES} bytes of visible ASCII"
                    ));
                }
            }
            Credential::Headers(h) => {
                if h.is_empty() || h.len() > MAX_HEADERS {
                    return Err(format!("headers: 1 to {MAX_HEADERS} headers"));
                }
                for (n, v) in h {
                    put(n, v.expose().to_string())?;
                }
            }
        }
        Ok(map)
    }
}

/// Which kind of credential an upstream request carried (`upstream_auth` in a call's audit
/// record and span); never the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum AuthKind {
    /// Nothing but what every request carries.
    None = 1,
    /// The upstream's configured `headers` (the same for every registration).
    Static = 2,
    /// This registration's own (or its parent's) `upstream_credentials`.
    Registration = 3,
    /// The gateway's own OAuth token for the upstream (`client_credentials`).
    ClientCredentials = 4,
    /// The registration's subject token exchanged for an OAuth token (`token_exchange`).
    TokenExchange = 5,
}

impl AuthKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthKind::None => "none",
            AuthKind::Static => "static",
            AuthKind::Registration => "registration",
            AuthKind::ClientCredentials => "client_credentials",
            AuthKind::TokenExchange => "token_exchange",
        }
    }

    pub fn from_u8(v: u8) -> Option<AuthKind> {
        match v {
            1 => Some(AuthKind::None),
            2 => Some(AuthKind::Static),
            3 => Some(AuthKind::Registration),
            4 => Some(AuthKind::ClientCredentials),
            5 => Some(AuthKind::TokenExchange),
            _ => None,
        }
    }
}

/// What a cell holds now.
#[derive(Clone)]
pub enum AuthState {
    /// No credential (removed by a rotation): requests go without one.
    Unset,
    /// The headers every request sets, and the credential they came from.
    Set(Arc<HeaderMap>, Arc<Credential>),
    /// Restored from the store but not usable (e.g. sealed with another key): calls are
    /// refused with this reason until the harness rotates them.
    Refused(Arc<str>),
}

/// One upstream's credential of one registration, read by its connection on every request
/// (`upstream::http`), replaced in place by a rotation. A registration keeps its cell for an
/// upstream once made, so its connection keeps reading the current value.
pub struct AuthCell {
    state: Mutex<AuthState>,
}

impl std::fmt::Debug for AuthCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthCell")
    }
}

impl AuthCell {
    fn new(state: AuthState) -> Self {
        AuthCell {
            state: Mutex::new(state),
        }
    }

    pub fn state(&self) -> AuthState {
        lock(&self.state).clone()
    }

    /// The headers to set on a request now (none when unset or refused).
    pub fn headers(&self) -> Option<Arc<HeaderMap>> {
        match &*lock(&self.state) {
            AuthState::Set(h, _) => Some(h.clone()),
            _ => None,
        }
    }

    fn set(&self, state: AuthState) {
        *lock(&self.state) = state;
    }
}

/// A registration's credentials by upstream.
#[derive(Default)]
pub struct Credentials {
    /// Whether any cell was ever made: the lookup of a registration without credentials is
    /// this one load.
    any: AtomicBool,
    cells: Mutex<BTreeMap<String, Arc<AuthCell>>>,
    /// The sealed form last applied (opaque, not secret): a cluster node's watch opens a
    /// stored value again only when it changed (a rotation made on another node).
    sealed: Mutex<Option<BTreeMap<String, String>>>,
    /// Held by a rotation from its check to its audit record: two concurrent rotations of
    /// one registration are applied one after the other, so the store and the cells end on
    /// the same one (an async lock: the store's write is awaited under it).
    rotation: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.summary()).finish()
    }
}

impl Credentials {
    /// Credentials holding `set`; an error names the upstream whose credential is not valid.
    pub fn of(set: &CredentialSet) -> Result<Credentials, String> {
        let c = Credentials::default();
        c.rotate(set)?;
        Ok(c)
    }

    /// The cell of `upstream`, if one was ever made (its state may be unset). Inlined: most
    /// registrations have none, and every forwarded call asks (one atomic load).
    #[inline]
    pub fn cell(&self, upstream: &str) -> Option<Arc<AuthCell>> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.cells).get(upstream).cloned()
    }

    /// Waits for the other rotations of this registration to end ([`Credentials::rotation`]).
    pub async fn rotating(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.rotation.lock().await
    }

    /// Whether any cell was ever made.
    pub fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    /// Replaces every credential with `set`: each upstream it names gets its value (its
    /// cell made if need be), each other cell is unset. Checked whole before anything changes.
    pub fn rotate(&self, set: &CredentialSet) -> Result<(), String> {
        let mut built = Vec::with_capacity(set.len());
        for (up, c) in set {
            let h = c
                .header_map()
                .map_err(|e| format!("upstream_credentials.{up}: {e}"))?;
            built.push((up.clone(), AuthState::Set(Arc::new(h), Arc::new(c.clone()))));
        }
        let mut cells = lock(&self.cells);
        for (up, cell) in cells.iter() {
            if !set.contains_key(up) {
                cell.set(AuthState::Unset);
            }
        }
        for (up, state) in built {
            match cells.get(&up) {
                Some(cell) => cell.set(state),
                None => {
                    cells.insert(up, Arc::new(AuthCell::new(state)));
                }
            }
        }
        if !cells.is_empty() {
            self.any.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Notes the sealed form the credentials now come from; true if it differs from the last.
    pub fn note_sealed(&self, sealed: Option<&BTreeMap<String, String>>) -> bool {
        let mut last = lock(&self.sealed);
        if last.as_ref() == sealed {
            return false;
        }
        *last = sealed.cloned();
        true
    }

    /// Marks `upstream`'s credential refused for `why` (a restore that could not open it).
    pub fn refuse(&self, upstream: &str, why: &str) {
        let mut cells = lock(&self.cells);
        let state = AuthState::Refused(Arc::from(why));
        match cells.get(upstream) {
            Some(cell) => cell.set(state),
            None => {
                cells.insert(upstream.to_string(), Arc::new(AuthCell::new(state)));
            }
        }
        self.any.store(true, Ordering::Release);
    }

    /// The credentials set now, by upstream (what the store seals).
    pub fn current(&self) -> CredentialSet {
        lock(&self.cells)
            .iter()
            .filter_map(|(up, cell)| match cell.state() {
                AuthState::Set(_, c) => Some((up.clone(), (*c).clone())),
                _ => None,
            })
            .collect()
    }

    /// What the admin API shows: `"set"` or `"refused"` per upstream; never a value.
    pub fn summary(&self) -> BTreeMap<String, &'static str> {
        lock(&self.cells)
            .iter()
            .filter_map(|(up, cell)| match cell.state() {
                AuthState::Set(..) => Some((up.clone(), "set")),
                AuthState::Refused(_) => Some((up.clone(), "refused")),
                AuthState::Unset => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_parse_check_and_never_print_their_values() {
        let v = serde_json::json!({"gh": {"bearer": "s3cret-A"}, "jira": {"headers": {"X-Api-Key": "k3y"}}});
        let set = Credential::set_from_json("upstream_credentials", &v).unwrap();
        let text = format!("{set:?}");
        assert!(!text.contains("s3cret") && !text.contains("k3y"), "{text}");
        let c = Credentials::of(&set).unwrap();
        assert!(!format!("{c:?}").contains("s3cret"));
        let h = c.cell("gh").unwrap().headers().unwrap();
        assert_eq!(h["authorization"], "Bearer s3cret-A");
        assert!(h["authorization"].is_sensitive());
        assert_eq!(
            c.cell("jira").unwrap().headers().unwrap()["x-api-key"],
            "k3y"
        );
        assert_eq!(c.summary()["gh"], "set");
        for bad in [
            serde_json::json!({"gh": {"bearer": "a b"}}),
            serde_json::json!({"gh": {"bearer": "a", "headers": {}}}),
            serde_json::json!({"gh": {"headers": {"mcp-session-id": "x"}}}),
            serde_json::json!({"gh": {"headers": {"x": "line\nbreak"}}}),
            serde_json::json!({"gh": {"token": "x"}}),
            serde_json::json!({"gh": "x"}),
        ] {
            let e = Credential::set_from_json("upstream_credentials", &bad).unwrap_err();
            assert!(e.starts_with("upstream_credentials.gh"), "{e}");
            assert!(!e.contains("line\nbreak"), "{e}");
        }
        // A rotation replaces values in the same cell and unsets what it leaves out.
        let cell = c.cell("gh").unwrap();
        let mut next = CredentialSet::new();
        next.insert("gh".into(), Credential::Bearer(Secret::new("B")));
        c.rotate(&next).unwrap();
        assert_eq!(cell.headers().unwrap()["authorization"], "Bearer B");
        assert!(c.cell("jira").unwrap().headers().is_none());
        assert!(Credentials::default().cell("gh").is_none());
    }
}
