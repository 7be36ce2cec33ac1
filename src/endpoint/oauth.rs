//! What OAuth-aware clients read when a token is refused: the 401's `WWW-Authenticate`
//! challenge (RFC 6750), the RFC 9728 protected-resource metadata of each registration's
//! endpoints, and plain answers at the OAuth discovery paths such clients fall back to.
//!
//! gatehouse is not an authorization server: a registration's bearer token is issued out of
//! band (the harness creates the registration over the admin API and hands the token to its
//! agent). The metadata therefore names no `authorization_servers`, and every answer says in
//! words that the token sent is missing or invalid, so a client that goes looking for an
//! OAuth flow ends on that sentence rather than on a bare 404.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::json;

use std::sync::Arc;

use super::origin::check_host_origin;
use super::{json_response, Rejection};
use crate::hub::Hub;
use crate::protocol::RpcError;

/// Which endpoint of a registration a request is for (its 401 points at that endpoint's
/// protected-resource metadata).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// `/gw/<id>/sse` and `/gw/<id>/messages/`.
    Sse,
    /// `/gw/<id>/mcp`.
    Mcp,
}

/// Prefix of the RFC 9728 well-known path; the resource's own path follows it (§3.1).
pub const PRM_PREFIX: &str = "/.well-known/oauth-protected-resource";

/// Why a request gets 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer …` at all. RFC 6750 §3.1: the challenge carries no error code.
    Missing,
    /// A bearer token that is not this registration's.
    Invalid,
}

impl Refusal {
    fn description(self) -> &'static str {
        match self {
            Refusal::Missing => "missing bearer token",
            Refusal::Invalid => "invalid bearer token",
        }
    }
}

/// What the documents say about where tokens come from.
const OUT_OF_BAND: &str =
    "gatehouse issues each registration's bearer token out of band: the harness \
     that created the registration (admin API POST /v1/registrations) hands it to the agent. \
     There is no OAuth authorization server and no client registration.";

/// The base URL a client reached us by: `public_url` if set (behind a proxy), else the
/// request's `Host` (already checked against the allowed hosts), else the bound address.
fn base_url(gw: &Hub, headers: &HeaderMap) -> String {
    if let Some(u) = &gw.config().public_url {
        return u.trim_end_matches('/').to_string();
    }
    if let Some(h) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) {
        return format!("http://{h}");
    }
    match gw.local_addr() {
        Some(a) => format!("http://{a}"),
        None => String::from("http://127.0.0.1"),
    }
}

/// The path segment of the endpoint whose metadata a 401 names: the Streamable HTTP endpoint,
/// or the legacy SSE stream (also for its `messages/` POSTs).
fn resource_tail(surface: Surface) -> &'static str {
    match surface {
        Surface::Mcp => "mcp",
        Surface::Sse => "sse",
    }
}

/// The 401 of an agent-facing request: JSON-RPC error body (as every other refusal), and
/// `WWW-Authenticate: Bearer realm="gatehouse"[, error="invalid_token", error_description=…],
/// resource_metadata="<RFC 9728 document of this endpoint>"`.
pub fn unauthorized(
    gw: &Hub,
    headers: &HeaderMap,
    id: &str,
    surface: Surface,
    why: Refusal,
) -> Rejection {
    let message = match why {
        Refusal::Missing => "missing bearer token: send Authorization: Bearer <the registration's token>",
        Refusal::Invalid => "invalid bearer token: it is not this registration's token (tokens are issued out of band, with the registration)",
    };
    let reason = match why {
        Refusal::Missing => crate::refusals::Reason::MissingToken,
        Refusal::Invalid => crate::refusals::Reason::BadToken,
    };
    let r = Rejection::new(
        reason,
        StatusCode::UNAUTHORIZED,
        RpcError::invalid_request(message),
    )
    .about(id);
    let metadata = format!(
        "{}{PRM_PREFIX}/gw/{id}/{}",
        base_url(gw, headers),
        resource_tail(surface)
    );
    let challenge = challenge(why, &metadata);
    // The id is base64url (plus an optional `<node>.`) and the host passed `host_allowed`, so
    // the value is visible ASCII; should it not be, the bare scheme still says "Bearer".
    let value = HeaderValue::from_str(&challenge)
        .unwrap_or(HeaderValue::from_static("Bearer realm=\"gatehouse\""));
    r.with_header(header::WWW_AUTHENTICATE, value)
}

/// The `WWW-Authenticate` value (pure, for tests).
pub fn challenge(why: Refusal, resource_metadata: &str) -> String {
    let quoted = resource_metadata.replace(['"', '\\'], "");
    match why {
        Refusal::Missing => format!("Bearer realm=\"gatehouse\", resource_metadata=\"{quoted}\""),
        Refusal::Invalid => format!(
            "Bearer realm=\"gatehouse\", error=\"invalid_token\", error_description=\"{}\", resource_metadata=\"{quoted}\"",
            Refusal::Invalid.description()
        ),
    }
}

/// The protected-resource metadata document of one endpoint (pure, for tests). No
/// `authorization_servers`: tokens are issued out of band.
pub fn metadata_document(resource: &str) -> serde_json::Value {
    json!({
        "resource": resource,
        "bearer_methods_supported": ["header"],
        "resource_name": "gatehouse registration endpoint",
        "io.gatehouse/token_issuance": "out_of_band",
        "io.gatehouse/description": OUT_OF_BAND,
    })
}

/// `GET /.well-known/oauth-protected-resource/gw/<id>/{mcp,sse}`: the RFC 9728 document of a
/// registration's endpoint. It needs no token (that is its point) and passes the Host and
/// Origin checks like every other request; an unknown registration is 404, as on its paths.
pub async fn protected_resource(
    State(gw): State<Arc<Hub>>,
    Path((id, tail)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, Rejection> {
    check_host_origin(gw.config(), &headers)?;
    if !matches!(tail.as_str(), "mcp" | "sse") {
        return Err(Rejection::not_found(
            crate::refusals::Reason::NoRoute,
            "registration not found",
        ));
    }
    if gw.registry().get(&id).is_none() {
        return Err(Rejection::unknown_registration(gw.registry(), &id));
    }
    let resource = format!("{}/gw/{id}/{tail}", base_url(&gw, &headers));
    let mut r = json_response(StatusCode::OK, &metadata_document(&resource));
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}

/// The OAuth discovery paths a client tries after the metadata names no authorization server
/// (`/.well-known/oauth-authorization-server[…]`, `/.well-known/openid-configuration[…]`,
/// the bare `/.well-known/oauth-protected-resource`): 404 (there is no such document), with
/// an RFC 6749-shaped error body whose description is the sentence a user needs.
pub async fn no_authorization_server() -> Response {
    json_response(StatusCode::NOT_FOUND, &not_an_authorization_server())
}

/// `POST /register`, where OAuth clients attempt dynamic client registration (RFC 7591) when
/// no authorization server metadata exists: 403 (registration is refused, not missing — a
/// 404 makes mcp-remote retry the whole flow over the other transport), same body.
/// mcp-remote and MCP Inspector 2 print this body verbatim as their final error.
pub async fn no_client_registration() -> Response {
    json_response(StatusCode::FORBIDDEN, &not_an_authorization_server())
}

/// The body of [`no_authorization_server`] (pure, for tests).
pub fn not_an_authorization_server() -> serde_json::Value {
    json!({
        "error": "invalid_token",
        "error_description": format!(
            "{OUT_OF_BAND} A 401 from /gw/<id>/... means the bearer token sent is missing or is not that registration's token."
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_follow_rfc_6750() {
        let m = "http://127.0.0.1:1/.well-known/oauth-protected-resource/gw/abc/mcp";
        let missing = challenge(Refusal::Missing, m);
        assert!(missing.starts_with("Bearer realm=\"gatehouse\""));
        assert!(
            !missing.contains("error="),
            "no error code without credentials (§3.1)"
        );
        assert!(missing.contains(&format!("resource_metadata=\"{m}\"")));
        let invalid = challenge(Refusal::Invalid, m);
        assert!(invalid.contains("error=\"invalid_token\""));
        assert!(invalid.contains(&format!("resource_metadata=\"{m}\"")));
        // A quote cannot break out of the parameter.
        assert!(!challenge(Refusal::Invalid, "x\"y").contains("x\"y"));
    }

    #[test]
    fn metadata_names_no_authorization_server() {
        let d = metadata_document("http://h/gw/a/mcp");
        assert_eq!(d["resource"], "http://h/gw/a/mcp");
        assert!(d.get("authorization_servers").is_none());
        assert_eq!(d["bearer_methods_supported"], json!(["header"]));
        assert_eq!(d["io.gatehouse/token_issuance"], "out_of_band");
    }
}
