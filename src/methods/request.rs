//! What a request is served with, whatever its transport: the hub, the registration, the
//! session (none for stateless requests) and where the request's notifications go.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;

use crate::hub::Hub;
use crate::registration::RegistrationState;
use crate::session::{Session, Transport};

/// One request as a handler gets it: its id, method and params, the token that cancels it,
/// and its SERVER span (tracing on).
pub struct Served<'a> {
    pub id: Value,
    pub method: &'a str,
    pub params: Option<Value>,
    pub cancel: tokio_util::sync::CancellationToken,
    pub trace: Option<&'a crate::telemetry::CallTrace>,
}

/// Everything a request is served with.
#[derive(Clone)]
pub struct RequestCtx {
    pub hub: Arc<Hub>,
    pub registration: Arc<RegistrationState>,
    pub session: Option<Arc<Session>>,
    pub transport: Transport,
    /// Where notifications related to this request (progress, logs) go.
    pub notify: Option<mpsc::Sender<Value>>,
    /// The request's W3C trace headers; read (by the front door) only when tracing is on.
    pub trace_headers: Option<Arc<crate::telemetry::TraceHeaders>>,
}

impl RequestCtx {
    /// The one constructor: a request's context as the front door hands it on, complete
    /// (`door::request_ctx` reads the trace headers; its notifications' channel is set by the
    /// reply engine, per call).
    pub fn new(
        hub: Arc<Hub>,
        registration: Arc<RegistrationState>,
        session: Option<Arc<Session>>,
        transport: Transport,
        trace_headers: Option<Arc<crate::telemetry::TraceHeaders>>,
    ) -> Self {
        RequestCtx {
            hub,
            registration,
            session,
            transport,
            notify: None,
            trace_headers,
        }
    }

    pub fn session_id(&self) -> Option<&str> {
        self.session.as_ref().map(|s| s.id.as_str())
    }

    /// What every SERVER span of request `id` says of it.
    pub fn span_common<'a>(&'a self, id: &'a Value) -> crate::telemetry::Common<'a> {
        crate::telemetry::Common {
            request_id: id,
            protocol_version: self.session.as_ref().and_then(|s| s.protocol_version()),
            session_id: self.session_id(),
            agent_id: &self.registration.agent_id,
            registration_id: &self.registration.id,
            transport: self.transport.as_str(),
        }
    }
}
