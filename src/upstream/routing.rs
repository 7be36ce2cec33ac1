//! Server → client requests (sampling, elicitation, roots, …): routed to the one session whose
//! call they belong to, or refused at once — never a silent drop that leaves the upstream
//! waiting. The client's response goes back upstream under the upstream's own id.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::{Connection, Downstream, RequestTag};
use crate::session::Session;
use crate::sync::lock;

/// The session id under which server requests of stateless (2026-07-28) calls wait for the
/// client's MRTR `inputResponses` (no real session has an empty id).
pub const STATELESS_SESSION: &str = "";

/// JSON-RPC error code for server → client requests the gateway refuses.
const REFUSED: i64 = -32603;
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
    conn: Connection,
    upstream_request_id: Value,
}

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
}

impl ClientRequests {
    /// Routes a server → client request to the session it belongs to, or refuses it.
    ///
    /// The request must be attributable to one pending call of a session. It goes on that
    /// call's own sink first (Streamable HTTP: the POST's SSE response stream, as MCP asks for
    /// requests related to a client request), else on the session's server-to-client stream
    /// (legacy SSE stream / Streamable HTTP GET stream). A call without a session (stateless
    /// 2026-07-28 `tools/call`) has only its sink: the reply engine makes the request an MRTR
    /// `input_required` result. If nothing takes it, the upstream gets an error at once.
    pub async fn route(&self, req: Incoming, downstream: Option<Arc<dyn Downstream>>) {
        let Incoming {
            upstream_id,
            conn,
            id,
            method,
            params,
            related_tag,
        } = req;
        let refuse = |why: &str| {
            tracing::warn!(upstream = %upstream_id, method, why, "server → client request refused");
            json!({"code": REFUSED, "message": format!("gatehouse: {method} refused: {why}")})
        };
        let owner = related_tag
            .as_ref()
            .and_then(|t| t.0.downcast_ref::<CallOwner>());
        let (owner, session, ds) = match (owner, downstream) {
            (Some(o), Some(ds)) => match o.session.clone() {
                Some(s) if !s.cancel.is_cancelled() => (o, Some(s), ds),
                Some(_) => {
                    let _ = conn
                        .respond(id, Err(refuse("the client session is closed")))
                        .await;
                    return;
                }
                // A stateless (2026-07-28) call: the request goes on the call's own sink, and
                // the reply engine turns it into an MRTR `input_required` result.
                None if o.notify.is_some() => (o, None, ds),
                None => {
                    let err = refuse("the call has no client to ask");
                    let _ = conn.respond(id, Err(err)).await;
                    return;
                }
            },
            _ => {
                let err = refuse("not attributable to one client session");
                let _ = conn.respond(id, Err(err)).await;
                return;
            }
        };
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let down_id = format!("gatehouse-{upstream_id}-{n}");
        lock(&self.map).insert(
            down_id.clone(),
            ClientRequest {
                registration_id: owner.registration_id.clone(),
                session_id: session
                    .as_ref()
                    .map_or_else(|| STATELESS_SESSION.to_owned(), |s| s.id.clone()),
                conn: conn.clone(),
                upstream_request_id: id.clone(),
            },
        );
        let mut msg = Map::new();
        msg.insert("jsonrpc".into(), json!("2.0"));
        msg.insert("id".into(), json!(down_id));
        msg.insert("method".into(), json!(method));
        if let Some(p) = params {
            msg.insert("params".into(), p);
        }
        let msg = Value::Object(msg);
        let on_call_stream = match &owner.notify {
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
    ) -> Option<(Connection, Value, Result<Value, Value>)> {
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
            (None, None) => {
                Err(json!({"code": REFUSED, "message": "client sent an empty response"}))
            }
        };
        Some((req.conn, req.upstream_request_id, outcome))
    }

    pub fn forget_registration(&self, registration_id: &str) {
        lock(&self.map).retain(|_, r| r.registration_id != registration_id);
    }
}
