//! Why an endpoint refuses a request, as one type: the HTTP status, the one JSON-RPC error
//! value (`protocol::RpcError`: code, message, the request id where it could be read, data) and the header the status calls for
//! (`WWW-Authenticate` on 401, `Allow` on 405). Its one `IntoResponse` writes them all, and
//! marks the response with why it was refused (`refusals::Refused`, read by the accept loop).

use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::Value;

use crate::protocol::RpcError;
use crate::refusals::{AuthFailure, Reason, Refused};

#[derive(Debug)]
pub struct Rejection {
    status: StatusCode,
    error: RpcError,
    header: Option<(HeaderName, HeaderValue)>,
    /// Why, for the operators (`refusals`): given by whoever builds it (every constructor
    /// takes it or names it; there is no default, so a 503 of a fenced node cannot be
    /// counted as a cap reached).
    refused: Box<Refused>,
}

impl Rejection {
    /// A JSON-RPC error as the body, under `status`, refused for `reason`.
    pub fn new(reason: Reason, status: StatusCode, error: RpcError) -> Self {
        Rejection {
            status,
            error,
            header: None,
            refused: Box::new(Refused::new(reason)),
        }
    }

    /// Why it was refused (`refusals`).
    #[cfg(test)]
    pub fn reason(&self) -> Reason {
        self.refused.reason
    }

    #[cfg(test)]
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Names the registration the request was for (shortened in logs).
    pub fn about(mut self, id: &str) -> Self {
        self.refused.registration = Some(crate::refusals::shorten(id).into());
        self
    }

    /// A live registration shown a wrong or missing token: audited `auth_failed`.
    pub fn auth_failed(
        mut self,
        registration: std::sync::Arc<crate::registration::RegistrationState>,
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

    /// A malformed message (400, `bad_request`), with the id where it could be read.
    pub fn malformed(error: RpcError) -> Self {
        Self::new(Reason::BadRequest, StatusCode::BAD_REQUEST, error)
    }

    /// 400 with -32600 (`bad_request`).
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::malformed(RpcError::invalid_request(message))
    }

    /// 404 with -32600, for `reason` (no route, an unknown session, a released registration).
    pub fn not_found(reason: Reason, message: impl Into<String>) -> Self {
        Self::new(
            reason,
            StatusCode::NOT_FOUND,
            RpcError::invalid_request(message),
        )
    }

    /// The 404 of a registration id that is not live, saying (to the operators, not the
    /// client) whether it was released lately or never known.
    pub fn unknown_registration(registry: &crate::registration::Registry, id: &str) -> Self {
        Self::not_found(
            Reason::missing_registration(registry, id),
            "registration not found",
        )
        .about(id)
    }

    /// 403 with -32600, for `reason` (`Host` or `Origin`).
    pub fn forbidden(reason: Reason, message: impl Into<String>) -> Self {
        Self::new(
            reason,
            StatusCode::FORBIDDEN,
            RpcError::invalid_request(message),
        )
    }

    /// 503 with -32603: a cap reached (`overloaded`: the session cap).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            Reason::Overloaded,
            StatusCode::SERVICE_UNAVAILABLE,
            RpcError::internal(message),
        )
    }

    /// A fenced cluster node (`fence`): 503 with -32603 and `Retry-After: 1` (the node
    /// serves again once fresh; another node may serve now), counted `fenced`.
    pub fn fenced(message: impl Into<String>) -> Self {
        Self::new(
            Reason::Fenced,
            StatusCode::SERVICE_UNAVAILABLE,
            RpcError::internal(message),
        )
        .with_header(header::RETRY_AFTER, HeaderValue::from_static("1"))
    }

    /// A request a session may not start (`Session::begin_call`): a reused id in flight
    /// is 400 with -32600; a session at its maximum in flight 429 with -32030 and
    /// `Retry-After: 1`. Either carries the request's id.
    pub fn call_refused(why: crate::session::CallRefused, id: Value) -> Self {
        let r = match why {
            crate::session::CallRefused::DuplicateId => Self::bad_request(why.to_string()),
            crate::session::CallRefused::TooMany(_) => Self::new(
                Reason::RateLimited,
                StatusCode::TOO_MANY_REQUESTS,
                RpcError::busy(why.to_string()),
            )
            .with_header(header::RETRY_AFTER, HeaderValue::from_static("1")),
        };
        r.with_id(Some(id))
    }

    /// The same refusal as a JSON-RPC error object (one item of a batch).
    pub fn call_refused_value(why: crate::session::CallRefused, id: Value) -> Value {
        Self::call_refused(why, id).error.to_value()
    }

    pub fn with_id(mut self, id: Option<Value>) -> Self {
        self.error.id = id;
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
pub fn reply_response(reply: &crate::protocol::jsonrpc::Reply) -> Response {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::CallRefused;

    /// Every constructor of a `Rejection`, with the status and the reason it carries, and
    /// the reason its response is marked with (what `/metrics` and the logs count). Every
    /// `Reason` a request handler can give is made here at least once, `fenced` among them
    /// (a fenced node's 503 was counted `overloaded`, issue 50). `new` takes the
    /// reason (there is no default); the named ones fix it.
    #[test]
    fn every_constructor_carries_its_reason() {
        let registry = crate::registration::Registry::default();
        let err = || RpcError::invalid_request("x");
        let cases: Vec<(&str, Rejection, StatusCode, Reason)> = vec![
            (
                "new",
                Rejection::new(Reason::BodyTooLarge, StatusCode::PAYLOAD_TOO_LARGE, err()),
                StatusCode::PAYLOAD_TOO_LARGE,
                Reason::BodyTooLarge,
            ),
            (
                "malformed",
                Rejection::malformed(err()),
                StatusCode::BAD_REQUEST,
                Reason::BadRequest,
            ),
            (
                "bad_request",
                Rejection::bad_request("x"),
                StatusCode::BAD_REQUEST,
                Reason::BadRequest,
            ),
            (
                "not_found",
                Rejection::not_found(Reason::SessionUnknown, "x"),
                StatusCode::NOT_FOUND,
                Reason::SessionUnknown,
            ),
            (
                "unknown_registration",
                Rejection::unknown_registration(&registry, "never-seen"),
                StatusCode::NOT_FOUND,
                Reason::UnknownRegistration,
            ),
            (
                "forbidden",
                Rejection::forbidden(Reason::Host, "x"),
                StatusCode::FORBIDDEN,
                Reason::Host,
            ),
            (
                "unavailable",
                Rejection::unavailable("x"),
                StatusCode::SERVICE_UNAVAILABLE,
                Reason::Overloaded,
            ),
            (
                "fenced",
                Rejection::fenced("x"),
                StatusCode::SERVICE_UNAVAILABLE,
                Reason::Fenced,
            ),
            (
                "call_refused(DuplicateId)",
                Rejection::call_refused(CallRefused::DuplicateId, Value::from(1)),
                StatusCode::BAD_REQUEST,
                Reason::BadRequest,
            ),
            (
                "call_refused(TooMany)",
                Rejection::call_refused(CallRefused::TooMany(4), Value::from(1)),
                StatusCode::TOO_MANY_REQUESTS,
                Reason::RateLimited,
            ),
        ];
        for (what, r, status, reason) in cases {
            assert_eq!((r.status(), r.reason()), (status, reason), "{what}");
            // The modifiers keep the reason.
            let r = r.with_id(Some(Value::from(7))).about("abcdefghijkl");
            assert_eq!(r.reason(), reason, "{what}");
            let resp = r.into_response();
            assert_eq!(resp.status(), status, "{what}");
            let mark = resp.extensions().get::<Refused>();
            assert_eq!(mark.map(|m| m.reason), Some(reason), "{what}: its mark");
            assert_eq!(
                mark.and_then(|m| m.registration.as_deref()),
                Some("abcdef…"),
                "{what}"
            );
        }
        // A fenced node's 503 says when to retry, and is not a cap reached.
        let resp = Rejection::fenced("x").into_response();
        assert_eq!(
            resp.headers()
                .get(header::RETRY_AFTER)
                .map(|v| v.as_bytes()),
            Some(&b"1"[..])
        );
        assert_ne!(
            resp.extensions().get::<Refused>().map(|m| m.reason),
            Some(Reason::Overloaded)
        );
    }
}
