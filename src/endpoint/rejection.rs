//! Why an endpoint refuses a request, as one type: the HTTP status, the JSON-RPC error (code,
//! message, the request id where it could be read, data) and the header the status calls for
//! (`WWW-Authenticate` on 401, `Allow` on 405). Its one `IntoResponse` writes them all, and
//! marks the response with why it was refused (`refusals::Refused`, read by the accept loop).

use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;

use crate::mcp::jsonrpc::{self, RpcError};
use crate::refusals::{AuthFailure, Reason, Refused};

#[derive(Debug)]
pub struct Rejection {
    status: StatusCode,
    error: RpcError,
    header: Option<(HeaderName, HeaderValue)>,
    /// Why, for the operators (`refusals`): by default what the status stands for.
    refused: Box<Refused>,
}

impl Rejection {
    pub fn new(status: StatusCode, code: i64, message: impl Into<String>) -> Self {
        Self::rpc(status, RpcError::new(None, code, message))
    }

    /// A JSON-RPC error as the body, under `status`.
    pub fn rpc(status: StatusCode, error: RpcError) -> Self {
        Rejection {
            status,
            error,
            header: None,
            refused: Box::new(Refused::new(Reason::of_status(status))),
        }
    }

    /// Says why more precisely than the status does.
    pub fn because(mut self, reason: Reason) -> Self {
        self.refused.reason = reason;
        self
    }

    /// Names the registration the request was for (shortened in logs).
    pub fn about(mut self, id: &str) -> Self {
        self.refused.registration = Some(crate::refusals::shorten(id).into());
        self
    }

    /// A live registration shown a wrong or missing token: audited `auth_failed`.
    pub fn auth_failed(
        mut self,
        registration: std::sync::Arc<crate::registry::RegistrationState>,
        transport: &'static str,
    ) -> Self {
        let missing = self.refused.reason == Reason::MissingToken;
        self.refused.auth = Some(AuthFailure {
            registration: Some(registration),
            transport,
            missing,
        });
        self
    }

    /// A malformed message (400), with the id where it could be read.
    pub fn malformed(error: RpcError) -> Self {
        Self::rpc(StatusCode::BAD_REQUEST, error)
    }

    /// 400 with -32600.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, jsonrpc::INVALID_REQUEST, message)
    }

    /// 404 with -32600.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, jsonrpc::INVALID_REQUEST, message)
    }

    /// The 404 of a registration id that is not live, saying (to the operators, not the
    /// client) whether it was released lately or never known.
    pub fn unknown_registration(registry: &crate::registry::Registry, id: &str) -> Self {
        Self::not_found("registration not found")
            .because(Reason::missing_registration(registry, id))
            .about(id)
    }

    /// 403 with -32600.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, jsonrpc::INVALID_REQUEST, message)
    }

    /// 503 with -32603 (a session cap).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            jsonrpc::INTERNAL_ERROR,
            message,
        )
    }

    /// A fenced cluster node (`fence`): 503 with -32603 and `Retry-After: 1` (the node
    /// serves again once fresh; another node may serve now).
    pub fn fenced(message: impl Into<String>) -> Self {
        Self::unavailable(message).with_header(header::RETRY_AFTER, HeaderValue::from_static("1"))
    }

    /// A request a session may not start (`Session::begin_call`): a reused id in flight
    /// is 400 with -32600; a session at its maximum in flight 429 with -32030 and
    /// `Retry-After: 1`. Either carries the request's id.
    pub fn call_refused(why: crate::session::CallRefused, id: Value) -> Self {
        let r = match why {
            crate::session::CallRefused::DuplicateId => Self::bad_request(why.to_string()),
            crate::session::CallRefused::TooMany(_) => Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                jsonrpc::BUSY,
                why.to_string(),
            )
            .with_header(header::RETRY_AFTER, HeaderValue::from_static("1")),
        };
        r.with_id(Some(id))
    }

    /// The same refusal as a JSON-RPC error object (one item of a batch).
    pub fn call_refused_value(why: crate::session::CallRefused, id: Value) -> Value {
        let code = match why {
            crate::session::CallRefused::DuplicateId => jsonrpc::INVALID_REQUEST,
            crate::session::CallRefused::TooMany(_) => jsonrpc::BUSY,
        };
        RpcError::new(Some(id), code, why.to_string()).to_value()
    }

    pub fn with_id(mut self, id: Option<Value>) -> Self {
        self.error.id = id;
        self
    }

    pub fn with_data(mut self, data: Option<Value>) -> Self {
        self.error.data = data;
        self
    }

    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.header = Some((name, value));
        self
    }
}

impl IntoResponse for Rejection {
    fn into_response(self) -> Response {
        let mut r = json_response(self.status, &self.error.to_value());
        if let Some((name, value)) = self.header {
            r.headers_mut().insert(name, value);
        }
        r.extensions_mut().insert(*self.refused);
        r
    }
}

/// A 200 with a response's JSON (a passed-through result is written as it came).
pub fn reply_response(reply: &crate::mcp::jsonrpc::Reply) -> Response {
    json_bytes(StatusCode::OK, reply.to_vec())
}

/// A JSON body with a status.
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    // `to_vec` writes straight into the buffer (`to_string` goes through `fmt::Display`); it
    // cannot fail for a `Value` (map keys are strings).
    json_bytes(status, serde_json::to_vec(body).unwrap_or_default())
}

/// `application/json` bytes with a status.
fn json_bytes(status: StatusCode, body: Vec<u8>) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        Bytes::from(body),
    )
        .into_response()
}
