//! Server → client requests (sampling, elicitation, roots, …): routed to a session of the one
//! registration they belong to — the call's, or (outside a call) the connection owner's or
//! lease holder's — whose client declared the capability, answered from the registration's
//! roots, or refused at once: never a silent drop that leaves the upstream waiting, never
//! another registration's session. The client's response goes back upstream under the
//! upstream's own id. Also what a connection declares in `initialize`
//! ([`declared_capabilities`]).

use crate::sync::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::{Connection, Downstream, RequestTag};
use crate::config::UpstreamConfig;
use crate::protocol::{ClientCapability, RpcError};
use crate::session::Session;
use crate::sync::lock;

/// The session id under which server requests of stateless (2026-07-28) calls wait for the
/// client's MRTR `inputResponses` (no real session has an empty id).
pub const STATELESS_SESSION: &str = "";

/// How long a server → client request may wait for room on a client stream.
const CLIENT_REQUEST_SEND_TIMEOUT: Duration = Duration::from_secs(2);

/// Who a forwarded call belongs to; travels as the [`RequestTag`] of its upstream request.
pub(super) struct CallOwner {
    pub registration_id: String,
    pub session: Option<Arc<Session>>,
    /// The call's own downstream sink (Streamable HTTP: its POST's SSE response stream; legacy
    /// SSE: the session stream). Server → client requests related to the call go here first.
    pub notify: Option<mpsc::Sender<Value>>,
}

impl CallOwner {
    pub fn tag(self) -> RequestTag {
        RequestTag(Arc::new(self))
    }
}

struct ClientRequest {
    registration_id: String,
    session_id: String,
    /// Fires when the session closes: its unanswered requests are then refused upstream
    /// (None: a stateless call's, which the MRTR table ends).
    session_closed: Option<CancellationToken>,
    to: AnswerTo,
}

/// Where a client's response to a server → client request goes.
pub(super) enum AnswerTo {
    /// Upstream, as the answer to its request of that id (on that connection).
    Upstream(Connection, Value),
    /// To the gateway itself, which asked (a 2026 upstream's task input for a 2025 client).
    Local(oneshot::Sender<Result<Value, Value>>),
}

impl AnswerTo {
    /// Refuses the request (its session closed, or it was never delivered).
    async fn refuse(self, err: Value) {
        match self {
            AnswerTo::Upstream(conn, id) => {
                let _ = conn.respond(id, Err(err)).await;
            }
            AnswerTo::Local(tx) => {
                let _ = tx.send(Err(err));
            }
        }
    }
}

/// A request of the gateway's own about one call: its id, the message to send on the call's
/// stream, and the receiver of the client's answer.
pub type Asked = (String, Value, oneshot::Receiver<Result<Value, Value>>);

/// Server → client requests one registration's clients may leave unanswered at once; one
/// more is refused (the table is bounded like every other).
const MAX_WAITING_PER_REGISTRATION: usize = 256;

/// The server → client requests waiting for a client's response, under gateway-minted ids.
#[derive(Default)]
pub(super) struct ClientRequests {
    map: Mutex<HashMap<String, ClientRequest>>,
    next: AtomicU64,
}

/// One server → client request as the connection reported it.
pub(super) struct Incoming {
    pub upstream_id: String,
    pub conn: Connection,
    pub id: Value,
    pub method: String,
    pub params: Option<Value>,
    pub related_tag: Option<RequestTag>,
    /// The registration the connection serves (`per_registration`) or whose lease the
    /// request names in `_meta["io.gatehouse/lease"]` (`leased`, the key stripped); None on a
    /// `shared` connection.
    pub registration: Option<String>,
}

/// The `capabilities` a connection of this upstream declares in `initialize`: what
/// [`UpstreamConfig::declared_client_capabilities`] says (all three on owned connections,
/// none on shared ones). `roots` with `listChanged`: a client's `roots/list_changed` is passed
/// to the connections its registration owns (`Pool::roots_list_changed`). And the MCP Apps
/// extension, always.
pub(super) fn declared_capabilities(config: &UpstreamConfig) -> Value {
    let caps: Map<String, Value> = config
        .declared_client_capabilities()
        .into_iter()
        .map(|c| {
            let v = if c == "roots" {
                json!({"listChanged": true})
            } else {
                json!({})
            };
            (c.to_string(), v)
        })
        .collect();
    let mut caps = Value::Object(caps);
    // MCP Apps: the gateway passes views through (tools' `_meta.ui` kept, `ui://` resources
    // served to the registrations granted their tools), on every kind of connection, so it
    // declares the extension whichever clients the connection will serve (docs/apps.md).
    crate::protocol::apps::declare(&mut caps, crate::protocol::apps::settings());
    caps
}

/// Where a server → client request goes.
enum Target {
    /// Answered by the gateway from the registration's spec (`roots/list`, roots set).
    Roots(Value),
    /// To this session: on the call's own sink first if the request belongs to a call.
    Session(Arc<Session>, Option<mpsc::Sender<Value>>),
    /// A stateless (2026-07-28) call of this registration: only its sink, where the reply
    /// engine makes the request an MRTR `input_required` result.
    Stateless(String, mpsc::Sender<Value>),
}

impl ClientRequests {
    /// Routes a server → client request to the session it belongs to, or refuses it.
    ///
    /// The registration is the connection's owner or the lease the request names, else the
    /// owner of the pending call it is attributed to; never another. `roots/list` for a
    /// registration whose harness set roots is answered from them. A request related to a
    /// call of that registration goes to the call's session: on the call's own sink first
    /// (Streamable HTTP: the POST's SSE response stream, as MCP asks for requests related to a
    /// client request), else on the session's server-to-client stream. A request no call can
    /// be named for (e.g. `roots/list` at any time) goes to the registration's most recently
    /// active session that declared the capability and has a stream open. Sampling,
    /// elicitation and roots reach a session only if its client declared them at
    /// `initialize`. A call without a session (stateless 2026-07-28 `tools/call`,
    /// `prompts/get`, `resources/read`) has only its sink: the reply engine makes the request
    /// an MRTR `input_required` result. Anything else — no registration, no such session, a
    /// full stream — gets an error upstream at once.
    pub async fn route(&self, req: Incoming, downstream: Option<Arc<dyn Downstream>>) {
        let (registration_id, session, call_sink) = match target_of(&req, downstream.as_deref()) {
            Ok(Target::Roots(roots)) => {
                tracing::debug!(upstream = %req.upstream_id, "roots/list answered from the registration's roots");
                let _ = req.conn.respond(req.id, Ok(roots)).await;
                return;
            }
            Ok(Target::Session(s, sink)) => (s.registration.id.clone(), Some(s), sink),
            Ok(Target::Stateless(r, sink)) => (r, None, Some(sink)),
            Err(why) => {
                let err = req.refusal(&why);
                let _ = req.conn.respond(req.id, Err(err)).await;
                return;
            }
        };
        let Incoming {
            upstream_id,
            conn,
            id,
            method,
            params,
            ..
        } = req;
        let Some(ds) = downstream else { return };
        let refuse = |why: &str| refusal(&upstream_id, &method, why);
        tracing::trace!(upstream = %upstream_id, method, id = %id, "server → client request");
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let down_id = format!("gatehouse-{upstream_id}-{n}");
        let (stale, full) = {
            let mut map = lock(&self.map);
            // Requests whose session closed unanswered leave the table (refused below).
            let closed: Vec<String> = map
                .iter()
                .filter(|(_, r)| r.session_closed.as_ref().is_some_and(|t| t.is_cancelled()))
                .map(|(k, _)| k.clone())
                .collect();
            let stale: Vec<ClientRequest> = closed.iter().filter_map(|k| map.remove(k)).collect();
            let waiting = map
                .values()
                .filter(|r| r.registration_id == registration_id)
                .count();
            let full = waiting >= MAX_WAITING_PER_REGISTRATION;
            if !full {
                map.insert(
                    down_id.clone(),
                    ClientRequest {
                        registration_id: registration_id.clone(),
                        session_id: session
                            .as_ref()
                            .map_or_else(|| STATELESS_SESSION.to_owned(), |s| s.id.clone()),
                        session_closed: session.as_ref().map(|s| s.cancel.clone()),
                        to: AnswerTo::Upstream(conn.clone(), id.clone()),
                    },
                );
            }
            (stale, full)
        };
        for r in stale {
            let err = RpcError::internal("gatehouse: the client session closed before answering")
                .object();
            r.to.refuse(err).await;
        }
        if full {
            let err = refuse(&format!(
                "the registration's clients leave {MAX_WAITING_PER_REGISTRATION} server requests unanswered already"
            ));
            let _ = conn.respond(id, Err(err)).await;
            return;
        }
        let mut msg = Map::new();
        msg.insert("jsonrpc".into(), json!("2.0"));
        msg.insert("id".into(), json!(down_id));
        msg.insert("method".into(), json!(method));
        if let Some(p) = params {
            msg.insert("params".into(), p);
        }
        let msg = Value::Object(msg);
        let on_call_stream = match &call_sink {
            Some(tx) => tx
                .send_timeout(msg.clone(), CLIENT_REQUEST_SEND_TIMEOUT)
                .await
                .is_ok(),
            None => false,
        };
        // (Legacy SSE: the call's sink *is* the session stream; the fallback then fails alike.)
        let delivered = on_call_stream
            || match &session {
                Some(s) => s.has_outbound() && ds.deliver(s, msg).await,
                None => false,
            };
        if delivered {
            return;
        }
        lock(&self.map).remove(&down_id);
        let err = refuse("the client has no open stream to receive it");
        let _ = conn.respond(id, Err(err)).await;
    }

    /// Takes the request a client's response answers, if the id is one the gateway minted for
    /// this registration and session: the connection, the upstream's id, and the outcome.
    pub fn answer(
        &self,
        registration_id: &str,
        session_id: &str,
        id: &Value,
        body: &Value,
    ) -> Option<(AnswerTo, Result<Value, Value>)> {
        let key = id.as_str()?;
        let req = {
            let mut map = lock(&self.map);
            match map.get(key) {
                Some(r) if r.registration_id == registration_id && r.session_id == session_id => {
                    map.remove(key)
                }
                _ => None,
            }
        }?;
        let outcome = match (body.get("result"), body.get("error")) {
            (Some(r), _) => Ok(r.clone()),
            (None, Some(e)) => Err(e.clone()),
            (None, None) => Err(RpcError::internal("client sent an empty response").object()),
        };
        Some((req.to, outcome))
    }

    /// A request of the gateway's own (`method`, `params`) to a session of
    /// `registration_id`, on its server-to-client stream: the receiver of the client's
    /// answer. `None`: the registration leaves too many unanswered, or the session has no
    /// open stream (nothing was sent).
    pub async fn ask_session(
        &self,
        session: &Arc<Session>,
        method: &str,
        params: Value,
        ds: &dyn Downstream,
    ) -> Option<oneshot::Receiver<Result<Value, Value>>> {
        let (down_id, rx) = self.reserve(
            &session.registration.id,
            session.id.clone(),
            Some(session.cancel.clone()),
        )?;
        let msg = json!({"jsonrpc": "2.0", "id": down_id, "method": method, "params": params});
        if session.has_outbound() && ds.deliver(session, msg).await {
            return Some(rx);
        }
        lock(&self.map).remove(&down_id);
        None
    }

    /// A request of the gateway's own about one call of `registration_id` (its `session`, or
    /// none: a stateless call, answered by the MRTR retry's `inputResponses`): the message the
    /// caller sends on the call's own stream, and the receiver of the client's answer.
    /// `None`: the registration leaves too many unanswered.
    pub fn ask_call(
        &self,
        registration_id: &str,
        session: Option<&Arc<Session>>,
        method: &str,
        params: Value,
    ) -> Option<Asked> {
        let session_id = session.map_or_else(|| STATELESS_SESSION.to_owned(), |s| s.id.clone());
        let (down_id, rx) = self.reserve(
            registration_id,
            session_id,
            session.map(|s| s.cancel.clone()),
        )?;
        let msg = json!({"jsonrpc": "2.0", "id": down_id, "method": method, "params": params});
        Some((down_id, msg, rx))
    }

    /// An id for a request of the gateway's own to a client of `registration_id`, and the
    /// receiver of its answer. `None`: the registration leaves too many unanswered.
    fn reserve(
        &self,
        registration_id: &str,
        session_id: String,
        session_closed: Option<CancellationToken>,
    ) -> Option<(String, oneshot::Receiver<Result<Value, Value>>)> {
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let down_id = format!("gatehouse-{n}");
        let (tx, rx) = oneshot::channel();
        let mut map = lock(&self.map);
        let waiting = map
            .values()
            .filter(|r| r.registration_id == registration_id)
            .count();
        if waiting >= MAX_WAITING_PER_REGISTRATION {
            return None;
        }
        let to = AnswerTo::Local(tx);
        let request = ClientRequest {
            registration_id: registration_id.to_string(),
            session_id,
            session_closed,
            to,
        };
        map.insert(down_id.clone(), request);
        Some((down_id, rx))
    }

    /// Forgets a request of the gateway's own that will not be answered (its call ended).
    pub fn forget(&self, id: &str) {
        lock(&self.map).remove(id);
    }

    pub fn forget_registration(&self, registration_id: &str) {
        lock(&self.map).retain(|_, r| r.registration_id != registration_id);
    }
}

/// Which session (or the registration's roots) answers a server → client request; `Err` says
/// why none may (the upstream gets it in the error).
/// Where a server → client request goes: a 2026-form task's side channel the gateway holds
/// open if the request names that task (stdio cannot tell which pending request it belongs
/// to), else what [`pick`] finds. `Err`: why it is refused.
fn target_of(req: &Incoming, downstream: Option<&dyn Downstream>) -> Result<Target, String> {
    let task_sink = downstream.and_then(|ds| {
        let up_task = req
            .params
            .as_ref()?
            .get(crate::protocol::meta::META)?
            .get(crate::protocol::meta::RELATED_TASK)?
            .get("taskId")?
            .as_str()?;
        ds.task_inputs(&req.upstream_id, req.conn.epoch(), up_task)
    });
    match (downstream, task_sink) {
        (_, Some((reg, sink))) => Ok(Target::Stateless(reg, sink)),
        (Some(ds), None) => pick(
            ds,
            &req.method,
            req.related_tag.as_ref(),
            req.registration.clone(),
        ),
        (None, None) => Err("the gateway is shutting down".to_string()),
    }
}

/// The error a refused server → client request is answered with (and logged).
fn refusal(upstream_id: &str, method: &str, why: &str) -> Value {
    tracing::warn!(upstream = %upstream_id, method, why, "server → client request refused");
    RpcError::internal(format!("gatehouse: {method} refused: {why}")).object()
}

impl Incoming {
    fn refusal(&self, why: &str) -> Value {
        refusal(&self.upstream_id, &self.method, why)
    }
}

fn pick(
    ds: &dyn Downstream,
    method: &str,
    related_tag: Option<&RequestTag>,
    named: Option<String>,
) -> Result<Target, String> {
    let call = related_tag.and_then(|t| t.0.downcast_ref::<CallOwner>());
    // The connection's owner or the lease named wins over the stdio heuristic's guess of a
    // call: a call of another registration is not this request's.
    let registration_id = match (named, call) {
        (Some(r), _) => r,
        (None, Some(c)) => c.registration_id.clone(),
        (None, None) => return Err("not attributable to one client session".into()),
    };
    let call = call.filter(|c| c.registration_id == registration_id);
    let cap = ClientCapability::for_method(method);
    if cap == Some(ClientCapability::Roots) {
        let reg = call
            .and_then(|c| c.session.as_ref().map(|s| s.registration.clone()))
            .or_else(|| ds.registration(&registration_id));
        if let Some(roots) = reg.as_ref().and_then(|r| r.roots.as_ref()) {
            return Ok(Target::Roots(json!({ "roots": roots })));
        }
    }
    let undeclared = |c: ClientCapability| {
        format!(
            "the client session did not declare the {} capability at initialize",
            c.as_str()
        )
    };
    if let Some(c) = call {
        return match c.session.clone() {
            Some(s) if s.cancel.is_cancelled() => Err("the client session is closed".into()),
            Some(s) => match cap {
                Some(cap) if !s.declares(cap) => Err(undeclared(cap)),
                _ => Ok(Target::Session(s, c.notify.clone())),
            },
            // A stateless (2026-07-28) call: the request goes on the call's own sink, and the
            // reply engine turns it into an MRTR `input_required` result (it checks the
            // capabilities the request declared in its `_meta`).
            None => match &c.notify {
                Some(sink) => Ok(Target::Stateless(c.registration_id.clone(), sink.clone())),
                None => Err("the call has no client to ask".into()),
            },
        };
    }
    let Some(cap) = cap else {
        return Err(format!(
            "not attributable to one client session ({method} outside a call is not routed)"
        ));
    };
    ds.sessions_of(&registration_id)
        .into_iter()
        .filter(|s| !s.cancel.is_cancelled() && s.declares(cap) && s.has_outbound())
        .max_by_key(|s| s.last_active())
        .map(|s| Target::Session(s, None))
        .ok_or_else(|| {
            format!(
                "no session of the registration that owns this connection declared the {} capability and has a stream open",
                cap.as_str()
            )
        })
}
