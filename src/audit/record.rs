//! An audit record: its fields, the bounds on what a client can fill, the outcome of a
//! governed call, and the line it is written as (field by field, byte-identical to serde's).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// A key as [`Line`] writes it: `"name":`.
macro_rules! k {
    ($name:literal) => {
        concat!("\"", $name, "\":")
    };
}

/// What an event's records are about, and so what they carry (issue 50).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// One registration: its `registration_id`, `agent_id` (and `label`, if it has one); a
    /// child's also its `parent_registration_id` and `agent_path` (what
    /// `RegistrationState::audit_record` writes).
    Registration,
    /// As [`Subject::Registration`], or the admin API (then no registration at all).
    RegistrationOrAdmin,
    /// An upstream process: `upstream`, `epoch`, `pid`.
    Upstream,
    /// The node, its config or its audit log.
    Node,
}

/// Every event an audit record names, with its subject (docs/audit.md "Events" lists them;
/// tests/audit.rs produces each one about a registration for a child, and checks its agent
/// and its chain).
pub const EVENTS: [(&str, Subject); 25] = [
    ("governed_mcp_call", Subject::Registration),
    ("registration_created", Subject::Registration),
    ("registration_renewed", Subject::Registration),
    ("registration_restored", Subject::Registration),
    ("registration_released", Subject::Registration),
    ("registration_expired", Subject::Registration),
    ("release_acknowledged", Subject::Registration),
    ("tool_changed", Subject::Registration),
    ("task_created", Subject::Registration),
    ("task_outcome", Subject::Registration),
    ("auth_failed", Subject::RegistrationOrAdmin),
    ("credentials_rotated", Subject::Registration),
    ("upstream_auth_failed", Subject::Registration),
    ("credentials_refused", Subject::Registration),
    ("approval_requested", Subject::Registration),
    ("approval_decided", Subject::Registration),
    ("upstream_spawned", Subject::Upstream),
    ("upstream_exited", Subject::Upstream),
    ("upstream_killed", Subject::Upstream),
    ("audit_resumed", Subject::Node),
    ("config_reloaded", Subject::Node),
    ("node_fenced", Subject::Node),
    ("node_unfenced", Subject::Node),
    ("node_stopped", Subject::Node),
    ("daemon_stopped", Subject::Node),
];

/// The subject of `event` (`None`: not an event gatehouse writes).
pub fn subject_of(event: &str) -> Option<Subject> {
    EVENTS.iter().find(|(e, _)| *e == event).map(|(_, s)| *s)
}

/// One audit record. `ts`, `seq`, `node_id` and `prev` are set by the writer.
///
/// Its text borrows what it is about where it can (`'a`): a governed call's record borrows the
/// registration's id, agent id and label, the session id and the tool name, and names its
/// event, transport and outcome with static strings, so that building it allocates nothing
/// for them. A record read back (`Deserialize`) owns its text: `Record<'static>`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Record<'a> {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ts: String,
    #[serde(default)]
    pub seq: u64,
    /// The node that wrote the record (`node_id` of the config; absent without one), so a
    /// collector gathering several nodes' lines can tell their chains apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<Cow<'a, str>>,
    /// A cluster node (issue 36): the store revision the node had applied when it made the
    /// record (every registration decision it served was against that state or older, and
    /// never older than the fence's bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_revision: Option<u64>,
    pub event: Cow<'a, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registration_id: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_request_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// Which kind of credential the call's upstream request carried (issue 47: `none`,
    /// `static`, `registration`); never the value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_auth: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args_digest: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// What few events carry (folded `auth_failed`, `tool_changed`, a child registration's
    /// family, start-up, stop and reload), boxed: a governed call's record is built, moved
    /// and dropped with every call, and stays small without them. Written in its place among
    /// the fields, read back with them ([`Record::rare`], [`Record::rare_mut`]).
    #[serde(flatten, default, deserialize_with = "rare_of")]
    pub rare: Option<Box<Rare<'a>>>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prev: String,
}

/// The fields of a [`Record`] that few events carry.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Rare<'a> {
    /// How many events one record stands for (`auth_failed`, folded per interval).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// The client's address (`auth_failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_addr: Option<Cow<'a, str>>,
    /// A tool's definition digest as pinned at registration, and its new one (`tool_changed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_digest: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_digest: Option<Cow<'a, str>>,
    /// A child registration's parent, and the agent ids from the root registration down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_registration_id: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_path: Option<Cow<'a, [String]>>,
    /// When a registration's TTL passed (RFC 3339), on one found expired at start-up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired_at: Option<Cow<'a, str>>,
    /// How many registrations (`node_stopped`: kept in the store for the next start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registrations: Option<u64>,
    /// A digest (`config_reloaded`: SHA-256 of the config file read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<Cow<'a, str>>,
    /// A task's gateway-minted id (`task_created`, `task_outcome`; `tasks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<Cow<'a, str>>,
    /// SHA-256 (hex) of the upstream's task id: never written in clear (it may be a bearer
    /// token at the upstream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_task_digest: Option<Cow<'a, str>>,
    /// A task's effective TTL in ms (`task_created`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// The OpenTelemetry trace id of a traced call (32 lowercase hex digits; issue 38).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<Cow<'a, str>>,
    /// The id of the policy rule that denied a call, or held it for approval (issue 49).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<Cow<'a, str>>,
    /// Who made a call when not the model: `"app"` for a call to a tool an MCP App's view
    /// alone can see (`_meta.ui.visibility` `["app"]`; `protocol::apps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initiator: Option<Cow<'a, str>>,
    /// The approval a call was held for (`approval_requested`, `approval_decided`, and the
    /// call's own record; issue 49).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<Cow<'a, str>>,
    /// Who is asked (`harness` or `client`; `approval_requested`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approver: Option<Cow<'a, str>>,
    /// Who decided (`harness`, `admin`, `client`, `gatehouse`) and what (`approve`, `deny`,
    /// `timeout`, `cancelled`), after how long (`approval_decided`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// No rare field at all: `None`, as a record built without them has.
static NO_RARE: Rare<'static> = Rare {
    count: None,
    client_addr: None,
    pin_digest: None,
    new_digest: None,
    parent_registration_id: None,
    agent_path: None,
    expired_at: None,
    registrations: None,
    digest: None,
    task_id: None,
    upstream_task_digest: None,
    ttl_ms: None,
    trace_id: None,
    rule: None,
    initiator: None,
    approval_id: None,
    approver: None,
    decided_by: None,
    decision: None,
    wait_ms: None,
};

/// The rare fields read back: `None` when the line has none of them.
fn rare_of<'de, 'a, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Box<Rare<'a>>>, D::Error> {
    let rare = Rare::deserialize(d)?;
    Ok((rare != NO_RARE).then(|| Box::new(rare)))
}

/// The longest a tool name may be in an audit record (bytes); longer ones are cut and
/// digested ([`bound_text`]). MCP tool names are 1-128 characters; 256 leaves room for a
/// gateway prefix.
pub const MAX_TOOL_NAME_BYTES: usize = 256;
/// The longest free text (reason, label, agent id, signal) may be in an audit record (bytes).
pub const MAX_TEXT_BYTES: usize = 1024;

/// `s` cut to at most `max` bytes, at a character boundary.
pub fn prefix(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `s` if it fits in `max` bytes, else its first bytes (cut at a character boundary) then
/// `…[cut: N bytes, sha256:<hex of the whole>]`: a record stays small whatever a client
/// sent, and the digest still tells two long values apart. Text that fits is left as it is
/// (borrowed text stays borrowed); only a cut makes a copy.
pub fn bound_text(s: &mut Cow<'_, str>, max: usize) {
    if s.len() <= max {
        return;
    }
    let digest = hex::encode(Sha256::digest(s.as_bytes()));
    let total = s.len();
    *s = Cow::Owned(format!(
        "{}…[cut: {total} bytes, sha256:{digest}]",
        prefix(s, max / 2)
    ));
}

/// `s` as owned text (a copy only when it is borrowed).
fn owned(s: Cow<'_, str>) -> Cow<'static, str> {
    Cow::Owned(s.into_owned())
}

impl<'a> Record<'a> {
    /// Cuts over-long fields (tool names, free text) so that no request can make a record
    /// large: what a client controls is at most a few hundred bytes per field here.
    pub fn bounded(&mut self) {
        for (field, max) in [
            (&mut self.tool, MAX_TOOL_NAME_BYTES),
            (&mut self.reason, MAX_TEXT_BYTES),
            (&mut self.label, MAX_TEXT_BYTES),
            (&mut self.agent_id, MAX_TEXT_BYTES),
            (&mut self.session_id, MAX_TOOL_NAME_BYTES),
            (&mut self.signal, MAX_TEXT_BYTES),
        ] {
            if let Some(s) = field {
                bound_text(s, max);
            }
        }
        if let Some(tools) = &mut self.tools {
            for t in tools.iter_mut().filter(|t| t.len() > MAX_TOOL_NAME_BYTES) {
                let mut cut = Cow::Borrowed(t.as_str());
                bound_text(&mut cut, MAX_TOOL_NAME_BYTES);
                *t = cut.into_owned();
            }
        }
    }

    pub fn event(event: impl Into<Cow<'a, str>>) -> Self {
        Record {
            event: event.into(),
            ..Default::default()
        }
    }

    /// A record about one registration: its id, `agent_id` and label, as the registration
    /// holds them (`RegistrationState::audit_record` is the one caller, so `agent_id` never
    /// comes from a request). Borrowed, not copied.
    pub fn about(
        event: &'a str,
        registration_id: &'a str,
        agent_id: &'a str,
        label: Option<&'a str>,
    ) -> Self {
        Record {
            event: Cow::Borrowed(event),
            registration_id: Some(Cow::Borrowed(registration_id)),
            agent_id: Some(Cow::Borrowed(agent_id)),
            label: label.map(Cow::Borrowed),
            ..Default::default()
        }
    }

    pub fn set_outcome(&mut self, outcome: Outcome) {
        self.outcome = Some(Cow::Borrowed(outcome.as_str()));
    }

    /// The fields few events carry (all `None` when the record has none).
    pub fn rare(&self) -> &Rare<'a> {
        self.rare.as_deref().unwrap_or(&NO_RARE)
    }

    /// The fields few events carry, to set one.
    pub fn rare_mut(&mut self) -> &mut Rare<'a> {
        self.rare.get_or_insert_with(Default::default)
    }

    /// This record with all its text owned (for a record that outlives what it borrows: one
    /// queued for the writer thread). Owned text is moved, not copied.
    pub fn into_owned(self) -> Record<'static> {
        let text = |s: Option<Cow<'_, str>>| s.map(owned);
        Record {
            ts: self.ts,
            seq: self.seq,
            node_id: text(self.node_id),
            store_revision: self.store_revision,
            event: owned(self.event),
            registration_id: text(self.registration_id),
            agent_id: text(self.agent_id),
            label: text(self.label),
            session_id: text(self.session_id),
            transport: text(self.transport),
            tool: text(self.tool),
            upstream: text(self.upstream),
            upstream_request_id: self.upstream_request_id,
            epoch: self.epoch,
            upstream_auth: text(self.upstream_auth),
            args_digest: text(self.args_digest),
            arguments: self.arguments,
            outcome: text(self.outcome),
            error_code: self.error_code,
            reason: text(self.reason),
            duration_ms: self.duration_ms,
            pid: self.pid,
            signal: text(self.signal),
            tools: self.tools,
            rare: self.rare.map(|r| {
                Box::new(Rare {
                    count: r.count,
                    client_addr: r.client_addr.map(owned),
                    pin_digest: r.pin_digest.map(owned),
                    new_digest: r.new_digest.map(owned),
                    parent_registration_id: r.parent_registration_id.map(owned),
                    agent_path: r.agent_path.map(|p| Cow::Owned(p.into_owned())),
                    expired_at: r.expired_at.map(owned),
                    registrations: r.registrations,
                    digest: r.digest.map(owned),
                    task_id: r.task_id.map(owned),
                    upstream_task_digest: r.upstream_task_digest.map(owned),
                    ttl_ms: r.ttl_ms,
                    trace_id: r.trace_id.map(owned),
                    rule: r.rule.map(owned),
                    initiator: r.initiator.map(owned),
                    approval_id: r.approval_id.map(owned),
                    approver: r.approver.map(owned),
                    decided_by: r.decided_by.map(owned),
                    decision: r.decision.map(owned),
                    wait_ms: r.wait_ms,
                })
            }),
            prev: self.prev,
        }
    }

    /// Appends this record's line (without the newline) to `out`: the bytes
    /// `serde_json::to_string` writes for it, with `ts` (when the record has none), `seq` and
    /// `prev` given by the writer (its clock's timestamp and a line hash in hex: written
    /// without the escape scan). Written field by field, with no intermediate `String`s: the
    /// chain hashes these exact bytes, and a test holds them equal to serde's.
    pub fn encode_line(&self, ts: &str, seq: u64, prev: &str, out: &mut Vec<u8>) {
        self.encode_line_on(None, ts, seq, prev, out)
    }

    /// [`Record::encode_line`] on a node: `node` (when the record has none) is its `node_id`.
    pub fn encode_line_on(
        &self,
        node: Option<&str>,
        ts: &str,
        seq: u64,
        prev: &str,
        out: &mut Vec<u8>,
    ) {
        self.encode_line_at(node, None, ts, seq, prev, out)
    }

    /// [`Record::encode_line_on`] on a cluster node: `revision` (when the record has none)
    /// is its `store_revision`.
    pub fn encode_line_at(
        &self,
        node: Option<&str>,
        revision: Option<u64>,
        ts: &str,
        seq: u64,
        prev: &str,
        out: &mut Vec<u8>,
    ) {
        let mut line = Line::open(out);
        let ts = if self.ts.is_empty() { ts } else { &self.ts };
        if !ts.is_empty() {
            if self.ts.is_empty() {
                // The writer's own timestamp (digits, `-`, `:`, `.`, `T`, `Z`).
                line.plain(k!("ts"), ts);
            } else {
                line.str(k!("ts"), ts);
            }
        }
        line.u64(k!("seq"), seq);
        if let Some(node) = self.node_id.as_deref().or(node) {
            line.str(k!("node_id"), node);
        }
        if let Some(rev) = self.store_revision.or(revision) {
            line.u64(k!("store_revision"), rev);
        }
        line.str(k!("event"), &self.event);
        line.opt_str(k!("registration_id"), &self.registration_id);
        line.opt_str(k!("agent_id"), &self.agent_id);
        line.opt_str(k!("label"), &self.label);
        line.opt_str(k!("session_id"), &self.session_id);
        line.opt_str(k!("transport"), &self.transport);
        line.opt_str(k!("tool"), &self.tool);
        line.opt_str(k!("upstream"), &self.upstream);
        if let Some(v) = self.upstream_request_id {
            line.u64(k!("upstream_request_id"), v);
        }
        if let Some(v) = self.epoch {
            line.u64(k!("epoch"), v);
        }
        line.opt_str(k!("upstream_auth"), &self.upstream_auth);
        line.opt_str(k!("args_digest"), &self.args_digest);
        if let Some(v) = &self.arguments {
            line.serde(k!("arguments"), v);
        }
        line.opt_str(k!("outcome"), &self.outcome);
        if let Some(v) = self.error_code {
            line.serde(k!("error_code"), &v);
        }
        line.opt_str(k!("reason"), &self.reason);
        if let Some(v) = self.duration_ms {
            line.serde(k!("duration_ms"), &v);
        }
        if let Some(v) = self.pid {
            line.u64(k!("pid"), u64::from(v));
        }
        line.opt_str(k!("signal"), &self.signal);
        if let Some(v) = &self.tools {
            line.serde(k!("tools"), v);
        }
        if let Some(r) = &self.rare {
            if let Some(v) = r.count {
                line.u64(k!("count"), v);
            }
            line.opt_str(k!("client_addr"), &r.client_addr);
            line.opt_str(k!("pin_digest"), &r.pin_digest);
            line.opt_str(k!("new_digest"), &r.new_digest);
            line.opt_str(k!("parent_registration_id"), &r.parent_registration_id);
            if let Some(v) = &r.agent_path {
                line.serde(k!("agent_path"), v);
            }
            line.opt_str(k!("expired_at"), &r.expired_at);
            if let Some(v) = r.registrations {
                line.u64(k!("registrations"), v);
            }
            line.opt_str(k!("digest"), &r.digest);
            line.opt_str(k!("task_id"), &r.task_id);
            line.opt_str(k!("upstream_task_digest"), &r.upstream_task_digest);
            if let Some(v) = r.ttl_ms {
                line.u64(k!("ttl_ms"), v);
            }
            line.opt_str(k!("trace_id"), &r.trace_id);
            line.opt_str(k!("rule"), &r.rule);
            line.opt_str(k!("initiator"), &r.initiator);
            line.opt_str(k!("approval_id"), &r.approval_id);
            line.opt_str(k!("approver"), &r.approver);
            line.opt_str(k!("decided_by"), &r.decided_by);
            line.opt_str(k!("decision"), &r.decision);
            if let Some(v) = r.wait_ms {
                line.u64(k!("wait_ms"), v);
            }
        }
        if !prev.is_empty() {
            // A line hash: lowercase hex, nothing to escape.
            line.plain(k!("prev"), prev);
        }
        line.out.push(b'}');
    }
}

/// A JSON object being written by [`Record::encode_line`].
struct Line<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Line<'a> {
    fn open(out: &'a mut Vec<u8>) -> Self {
        // A governed call's line is ~450 bytes: grown once, not field by field.
        out.reserve(512);
        out.push(b'{');
        Line { out, first: true }
    }

    /// `key` (a `"name":` literal, [`k!`]), after a comma unless it is the first field: one
    /// copy per key, not one per quote and name.
    fn key(&mut self, key: &str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        self.out.extend_from_slice(key.as_bytes());
    }

    fn str(&mut self, key: &str, v: &str) {
        self.key(key);
        json_str(self.out, v);
    }

    /// A string the writer made itself, with nothing JSON escapes (a hex hash, its own
    /// timestamp): copied without the escape scan. Checked in debug builds.
    fn plain(&mut self, key: &str, v: &str) {
        debug_assert!(!needs_escape(v.as_bytes()), "{v:?}");
        self.key(key);
        self.out.reserve(v.len() + 2);
        self.out.push(b'"');
        self.out.extend_from_slice(v.as_bytes());
        self.out.push(b'"');
    }

    fn opt_str(&mut self, key: &str, v: &Option<Cow<'_, str>>) {
        if let Some(v) = v {
            self.str(key, v);
        }
    }

    fn u64(&mut self, key: &str, v: u64) {
        self.key(key);
        // What serde_json writes for a `u64` (it uses `itoa` too), without its serializer.
        self.out
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
    }

    /// A value serde_json writes itself (numbers, JSON values, lists).
    fn serde(&mut self, key: &str, v: &impl Serialize) {
        self.key(key);
        // Writing to a `Vec` cannot fail, and these values always serialize (map keys of a
        // `Value` are strings; a non-finite float is `null`).
        let _ = serde_json::to_writer(&mut *self.out, v);
    }
}

/// A JSON string as serde_json writes it: quotes, and `"`, `\\` and control characters escaped
/// (everything else, non-ASCII included, as is). Strings with nothing to escape — ids,
/// digests, timestamps, almost every name — are copied in one go.
fn json_str(out: &mut Vec<u8>, s: &str) {
    if needs_escape(s.as_bytes()) {
        let _ = serde_json::to_writer(&mut *out, s);
        return;
    }
    out.reserve(s.len() + 2);
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
}

/// Outcome of a governed call, as written in `outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    ToolError,
    ProtocolError,
    Denied,
    Cancelled,
    Timeout,
    UpstreamFailed,
}

impl Outcome {
    /// Every outcome, in the order of the enum.
    pub const ALL: [Outcome; 7] = [
        Outcome::Ok,
        Outcome::ToolError,
        Outcome::ProtocolError,
        Outcome::Denied,
        Outcome::Cancelled,
        Outcome::Timeout,
        Outcome::UpstreamFailed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ToolError => "tool_error",
            Outcome::ProtocolError => "protocol_error",
            Outcome::Denied => "denied",
            Outcome::Cancelled => "cancelled",
            Outcome::Timeout => "timeout",
            Outcome::UpstreamFailed => "upstream_failed",
        }
    }
}

/// Does `s` hold a byte that JSON strings escape (`"`, `\\`, a control character)? Eight
/// bytes at a time: a byte is below `n` where `(x - n·0x01…) & !x & 0x80…` is set (exact as
/// to whether one exists, for `n` ≤ 0x80), and equal to `c` where `x ^ c·0x01…` is zero.
fn needs_escape(s: &[u8]) -> bool {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let below = |x: u64, n: u8| x.wrapping_sub(LO * u64::from(n)) & !x;
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        let x = u64::from_le_bytes(w);
        let hits = below(x, 0x20)
            | below(x ^ (LO * u64::from(b'"')), 1)
            | below(x ^ (LO * u64::from(b'\\')), 1);
        if hits & HI != 0 {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

// Unit tests only (never built into the daemon): an unwrap that fails is the test failing.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::audit::chain::{digest_value, line_hash, GENESIS};

    /// What the writer wrote before `encode_line`: serde's encoding of the record with `ts`
    /// (if it had none), `seq` and `prev` set.
    fn serde_line(r: &Record, ts: &str, seq: u64, prev: &str) -> String {
        serde_line_on(r, None, ts, seq, prev)
    }

    /// ...and with `node_id` (if it had none) set to `node`.
    fn serde_line_on(r: &Record, node: Option<&str>, ts: &str, seq: u64, prev: &str) -> String {
        let mut r = r.clone();
        if r.ts.is_empty() {
            r.ts = ts.to_string();
        }
        if r.node_id.is_none() {
            r.node_id = node.map(|n| Cow::Owned(n.to_string()));
        }
        r.seq = seq;
        r.prev = prev.to_string();
        serde_json::to_string(&r).unwrap()
    }

    fn encoded(r: &Record, ts: &str, seq: u64, prev: &str) -> String {
        let mut out = Vec::new();
        r.encode_line(ts, seq, prev, &mut out);
        String::from_utf8(out).unwrap()
    }

    fn encoded_on(r: &Record, node: Option<&str>, ts: &str, seq: u64, prev: &str) -> String {
        let mut out = Vec::new();
        r.encode_line_on(node, ts, seq, prev, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn encoded_lines_are_serdes_bytes() {
        let full = Record {
            ts: String::new(),
            seq: 0,
            node_id: None,
            store_revision: Some(12),
            event: "governed_mcp_call".into(),
            registration_id: Some("q0b6zN3Lq6m1o0m9v5d0Yw".into()),
            agent_id: Some("agent \"7\"\\\n\u{1}\u{7f}é🙂".into()),
            label: Some(String::new().into()),
            session_id: Some("s".into()),
            transport: Some("streamable_http".into()),
            tool: Some("echo".into()),
            upstream: Some("up".into()),
            upstream_request_id: Some(u64::MAX),
            epoch: Some(0),
            upstream_auth: Some("registration".into()),
            args_digest: Some(digest_value(&serde_json::json!({"b": 1, "a": [1.5, null]})).into()),
            arguments: Some(serde_json::json!({"z": "\u{0}", "a": {"x": -1e300}})),
            outcome: Some("ok".into()),
            error_code: Some(i64::MIN),
            reason: Some("line\r\nbreak\t".into()),
            duration_ms: Some(0.042),
            pid: Some(u32::MAX),
            signal: Some("SIGTERM".into()),
            tools: Some(vec!["a".into(), "b\"".into()]),
            rare: Some(Box::new(Rare {
                count: Some(9_999),
                client_addr: Some("[::1]:54321".into()),
                pin_digest: Some("ab".repeat(32).into()),
                new_digest: Some("cd".repeat(32).into()),
                parent_registration_id: Some("p".into()),
                agent_path: Some(vec!["planner".to_string(), "re\"searcher".to_string()].into()),
                expired_at: Some("2026-11-29T11:00:00.000Z".into()),
                registrations: Some(u64::MAX),
                digest: Some("ab\"".into()),
                task_id: Some("gtask_\"x".into()),
                upstream_task_digest: Some("ef".repeat(32).into()),
                ttl_ms: Some(u64::MAX),
                trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
                rule: Some("no_\"etc".into()),
                initiator: Some("app".into()),
                approval_id: Some("ap\"1".into()),
                approver: Some("harness".into()),
                decided_by: Some("client".into()),
                decision: Some("approve".into()),
                wait_ms: Some(u64::MAX),
            })),
            prev: String::new(),
        };
        let ts = "2026-11-29T12:00:00.000000Z";
        let prev = GENESIS;
        for r in [
            full.clone(),
            Record::event("daemon_stopped"),
            Record {
                ts: "1999-01-01T00:00:00Z".into(),
                arguments: Some(Value::Null),
                ..Record::event("x")
            },
        ] {
            assert_eq!(encoded(&r, ts, 7, prev), serde_line(&r, ts, 7, prev));
            assert_eq!(encoded(&r, "", 1, ""), serde_line(&r, "", 1, ""));
            // On a node (DESIGN.md §8): the writer's node id, or the record's own.
            for node in [Some("n1"), Some("0"), None] {
                assert_eq!(
                    encoded_on(&r, node, ts, 7, prev),
                    serde_line_on(&r, node, ts, 7, prev)
                );
                let own = Record {
                    node_id: Some("own".into()),
                    ..r.clone()
                };
                assert_eq!(
                    encoded_on(&own, node, ts, 7, prev),
                    serde_line_on(&own, node, ts, 7, prev)
                );
            }
        }
        assert!(encoded_on(&full, Some("n1"), ts, 7, prev)
            .starts_with(r#"{"ts":"2026-11-29T12:00:00.000000Z","seq":7,"node_id":"n1","store_revision":12,"event":"#));
        for d in [
            f64::NAN,
            f64::INFINITY,
            -0.0,
            1e-7,
            123456789.0,
            0.1 + 0.2,
            1e21,
        ] {
            let r = Record {
                duration_ms: Some(d),
                ..full.clone()
            };
            assert_eq!(encoded(&r, ts, 1, prev), serde_line(&r, ts, 1, prev));
        }
    }

    proptest::proptest! {
        #[test]
        fn encoded_lines_match_serde_for_any_text(
            event in ".*",
            agent in proptest::option::of(".*"),
            reason in proptest::option::of("\\PC*"),
            tool in proptest::option::of("[\\x00-\\x7f]*"),
            code in proptest::option::of(proptest::num::i64::ANY),
            ms in proptest::option::of(proptest::num::f64::ANY),
            seq in proptest::num::u64::ANY,
            node in proptest::option::of("[a-z0-9]{1,16}"),
        ) {
            let r = Record {
                agent_id: agent.map(Into::into),
                reason: reason.map(Into::into),
                tool: tool.map(Into::into),
                error_code: code,
                duration_ms: ms,
                ..Record::event(&event)
            };
            let ts = "2026-11-29T12:00:00.123456Z";
            proptest::prop_assert_eq!(encoded(&r, ts, seq, GENESIS), serde_line(&r, ts, seq, GENESIS));
            proptest::prop_assert_eq!(
                encoded_on(&r, node.as_deref(), ts, seq, GENESIS),
                serde_line_on(&r, node.as_deref(), ts, seq, GENESIS)
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn needs_escape_is_the_bytewise_test(s in proptest::collection::vec(proptest::num::u8::ANY, 0..40)) {
            let naive = s.iter().any(|&b| b < 0x20 || b == b'"' || b == b'\\');
            proptest::prop_assert_eq!(needs_escape(&s), naive);
        }
    }

    #[test]
    fn needs_escape_finds_each_byte_in_each_lane() {
        for b in 0..=255u8 {
            let naive = b < 0x20 || b == b'"' || b == b'\\';
            for at in 0..20 {
                let mut s = vec![b'a'; 20];
                s[at] = b;
                assert_eq!(needs_escape(&s), naive, "byte {b:#x} at {at}");
            }
        }
    }

    #[test]
    fn digests_match_the_previous_formatting() {
        let v = serde_json::json!({"message": "hello", "n": [1, 2.5, null, {"k": "v"}]});
        assert_eq!(
            digest_value(&v),
            hex::encode(Sha256::digest(serde_json::to_vec(&v).unwrap()))
        );
        assert_eq!(line_hash("abc"), hex::encode(Sha256::digest(b"abc")));
    }
}
