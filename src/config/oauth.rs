//! `[upstreams.oauth]` (issue 47): how the gateway gets OAuth access tokens for an HTTP
//! upstream from an authorization server — its own (`client_credentials`), or one per
//! registration exchanged for the subject token the harness gave it (`token_exchange`,
//! RFC 8693). Checked here; used by `upstream::oauth`.

use std::path::PathBuf;

use serde::Deserialize;

/// The grant the gateway uses toward the authorization server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OAuthGrant {
    /// The gateway's own identity for the upstream: one token per upstream.
    ClientCredentials,
    /// RFC 8693: each registration's `subject_token` exchanged for a token for the upstream.
    TokenExchange,
}

impl OAuthGrant {
    pub fn as_str(self) -> &'static str {
        match self {
            OAuthGrant::ClientCredentials => "client_credentials",
            OAuthGrant::TokenExchange => "token_exchange",
        }
    }
}

/// One upstream's OAuth client settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthConfig {
    /// The authorization server's issuer: its token (and revocation) endpoint are discovered
    /// (RFC 8414 `/.well-known/oauth-authorization-server`, then OpenID Connect's
    /// `/.well-known/openid-configuration`). Exactly one of `issuer` or `token_url`.
    pub issuer: Option<String>,
    /// The token endpoint itself (no discovery: no revocation either).
    pub token_url: Option<String>,
    /// The gateway's client id at the authorization server (for `token_exchange` too: the
    /// exchange is the gateway's request, made for the registration).
    pub client_id: String,
    /// A file holding the client secret (HTTP Basic client authentication); unset: a public
    /// client (`client_id` in the form).
    pub client_secret_file: Option<PathBuf>,
    /// The scope asked for (space-separated).
    pub scope: Option<String>,
    /// The resource indicator (RFC 8707) the token is asked for; usually the upstream's URL.
    pub resource: Option<String>,
    /// `client_credentials` or `token_exchange`: whose token the upstream sees.
    pub grant: OAuthGrant,
}

impl OAuthConfig {
    /// What serde cannot check; `http`: the upstream has a `url`.
    pub fn validate(&self, upstream: &str, http: bool) -> Result<(), String> {
        let at = |what: String| format!("upstream {upstream:?}: oauth: {what}");
        if !http {
            return Err(at("only an HTTP upstream (`url`) can use OAuth".into()));
        }
        let endpoint = match (&self.issuer, &self.token_url) {
            (Some(i), None) => ("issuer", i),
            (None, Some(t)) => ("token_url", t),
            (Some(_), Some(_)) => {
                return Err(at(
                    "set one of `issuer` (discovery) or `token_url`, not both".into(),
                ))
            }
            (None, None) => {
                return Err(at(
                    "needs `issuer` (RFC 8414 discovery) or `token_url`".into()
                ))
            }
        };
        check_url(endpoint.1).map_err(|e| at(format!("{} = {:?}: {e}", endpoint.0, endpoint.1)))?;
        if let Some(r) = &self.resource {
            let u = reqwest::Url::parse(r)
                .map_err(|e| at(format!("resource = {r:?}: not an absolute URI: {e}")))?;
            if u.fragment().is_some() {
                return Err(at(format!(
                    "resource = {r:?}: must not have a fragment (RFC 8707)"
                )));
            }
        }
        if self.client_id.trim().is_empty() {
            return Err(at("client_id must not be empty".into()));
        }
        if let Some(s) = &self.scope {
            if s.trim().is_empty() || s.chars().any(|c| c.is_control()) {
                return Err(at("scope must be space-separated scope names".into()));
            }
        }
        if let Some(f) = &self.client_secret_file {
            let secret = std::fs::read_to_string(f).map_err(|e| {
                at(format!(
                    "client_secret_file {}: cannot read it: {e}",
                    f.display()
                ))
            })?;
            if secret.trim().is_empty() {
                return Err(at(format!("client_secret_file {} is empty", f.display())));
            }
        }
        Ok(())
    }
}

fn check_url(u: &str) -> Result<(), String> {
    let url = reqwest::Url::parse(u).map_err(|e| format!("not a URL: {e}"))?;
    match url.scheme() {
        "https" | "http" => Ok(()),
        s => Err(format!(
            "scheme {s:?}: expected https (or http on a private network)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Result<OAuthConfig, String> {
        let c: OAuthConfig = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        c.validate("gh", true)?;
        Ok(c)
    }

    #[test]
    fn oauth_config_errors_name_the_setting() {
        let ok = parse(
            "issuer = \"https://as.example\"\nclient_id = \"gw\"\ngrant = \"client_credentials\"",
        );
        assert!(ok.is_ok(), "{ok:?}");
        let cases = [
            ("client_id = \"gw\"\ngrant = \"client_credentials\"", "needs `issuer`"),
            ("issuer = \"https://a\"\ntoken_url = \"https://a/t\"\nclient_id = \"gw\"\ngrant = \"token_exchange\"", "not both"),
            ("token_url = \"ftp://a/t\"\nclient_id = \"gw\"\ngrant = \"token_exchange\"", "token_url = \"ftp://a/t\""),
            ("issuer = \"https://a\"\nclient_id = \"gw\"\ngrant = \"password\"", "unknown variant `password`"),
            ("issuer = \"https://a\"\nclient_id = \"gw\"\ngrant = \"token_exchange\"\nresource = \"x\"", "resource = \"x\""),
            ("issuer = \"https://a\"\nclient_id = \"gw\"\ngrant = \"token_exchange\"\nclient_secret_file = \"/nonexistent/s\"", "client_secret_file /nonexistent/s: cannot read it"),
            ("issuer = \"https://a\"\nclient_id = \"gw\"\ngrant = \"token_exchange\"\nsecret = \"x\"", "unknown field `secret`"),
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
        let c: OAuthConfig = toml::from_str(
            "issuer = \"https://a\"\nclient_id = \"gw\"\ngrant = \"token_exchange\"",
        )
        .unwrap();
        assert!(c
            .validate("gh", false)
            .unwrap_err()
            .contains("only an HTTP upstream"));
    }
}
