//! What a request is served with, whatever its transport: the hub, the registration, the
//! session (none for stateless requests) and where the request's notifications go.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;

use crate::hub::Hub;
use crate::registration::RegistrationState;
use crate::session::{Session, Transport};

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
}
