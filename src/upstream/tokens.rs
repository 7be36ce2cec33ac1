//! Cached upstream access tokens (issue 47): one [`Tokens`] per upstream for
//! `client_credentials`, one per registration and upstream for `token_exchange`. A token is
//! used until shortly before it expires; then the first request that finds it stale starts
//! ONE token request, which every other request waiting meanwhile shares (a shared future: no
//! lock is held across `.await`). A 401 for a token drops it and fetches one more, once; a
//! 401 for that one is final (no retry storm). Also what picks a registration's own slot
//! ([`OwnAuth`]: its credential cell and, for a child, the agent path its exchange names).

use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, FutureExt, Shared};

use super::oauth::{Ask, OAuthClient, OAuthError, Token};
use crate::config::OAuthGrant;
use crate::registration::{AuthCell, AuthState, Credential};
use crate::sync::lock;

type Flight = Shared<BoxFuture<'static, Result<Arc<Token>, OAuthError>>>;

/// Whose tokens these are.
enum Kind {
    /// The gateway's own (`client_credentials`).
    Own,
    /// A registration's: its subject token read from `cell` at each request (a rotation is
    /// seen by the next one); `actor`: a child's agent path.
    Exchange {
        cell: Option<Arc<AuthCell>>,
        actor: Option<String>,
    },
}

#[derive(Default)]
struct State {
    current: Option<Arc<Token>>,
    /// The subject credential `current` was exchanged for (compared by pointer).
    subject: Option<Arc<Credential>>,
    inflight: Option<Flight>,
    /// The next fetch replaces a token an upstream refused.
    next_after_401: bool,
    /// The last token request failed (when, why, for which subject): requests within
    /// [`FAILED_HOLD`] fail with it, without another (a server down is not hammered).
    failed: Option<(tokio::time::Instant, OAuthError, Option<Arc<Credential>>)>,
}

/// How long a failed token request's error answers the requests that follow it.
const FAILED_HOLD: std::time::Duration = std::time::Duration::from_secs(1);

fn same_subject(a: &Option<Arc<Credential>>, b: &Option<Arc<Credential>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// One token holder. Cheap to share; every connection of its slot reads it.
pub struct Tokens {
    client: Arc<OAuthClient>,
    kind: Kind,
    /// Shared with a token request under way only weakly (no cycle through `inflight`).
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("upstream", &self.client.upstream())
            .finish_non_exhaustive()
    }
}

impl Tokens {
    /// The gateway's own tokens for `client`'s upstream.
    pub fn own(client: Arc<OAuthClient>) -> Arc<Tokens> {
        Arc::new(Tokens {
            client,
            kind: Kind::Own,
            state: Arc::default(),
        })
    }

    /// A registration's exchanged tokens: its subject token from `cell`; `actor`: a child's
    /// agent path.
    pub fn exchange(
        client: Arc<OAuthClient>,
        cell: Option<Arc<AuthCell>>,
        actor: Option<String>,
    ) -> Arc<Tokens> {
        Arc::new(Tokens {
            client,
            kind: Kind::Exchange { cell, actor },
            state: Arc::default(),
        })
    }

    pub fn grant(&self) -> OAuthGrant {
        self.client.grant()
    }

    /// The subject credential to exchange now (exchange only).
    fn subject(&self) -> Result<Option<Arc<Credential>>, OAuthError> {
        let Kind::Exchange { cell, .. } = &self.kind else {
            return Ok(None);
        };
        match cell.as_ref().map(|c| c.state()) {
            Some(AuthState::Set(_, c)) if matches!(*c, Credential::SubjectToken(_)) => Ok(Some(c)),
            _ => Err(OAuthError::NoSubject {
                upstream: self.client.upstream().to_string(),
            }),
        }
    }

    /// `Some` for an exchange: its actor (a child's agent path, if any).
    fn actor(&self) -> Option<&str> {
        match &self.kind {
            Kind::Exchange { actor, .. } => actor.as_deref(),
            Kind::Own => None,
        }
    }

    /// A token to send now: the cached one while fresh, else the one request in flight's.
    pub async fn get(&self) -> Result<Arc<Token>, OAuthError> {
        let flight = {
            let subject = self.subject()?;
            let mut s = lock(&self.state);
            let now = tokio::time::Instant::now();
            if let Some(t) = s
                .current
                .as_ref()
                .filter(|_| same_subject(&subject, &s.subject))
            {
                if now < t.refresh_at {
                    return Ok(t.clone());
                }
            }
            if let Some((at, e, failed_for)) = &s.failed {
                if now < *at + FAILED_HOLD && same_subject(&subject, failed_for) {
                    return Err(e.clone());
                }
            }
            match &s.inflight {
                Some(f) => f.clone(),
                None => {
                    let after_401 = std::mem::take(&mut s.next_after_401);
                    let f = fetch(
                        self.client.clone(),
                        self.actor().map(str::to_owned),
                        Arc::downgrade(&self.state),
                        subject,
                        after_401,
                    )
                    .boxed()
                    .shared();
                    s.inflight = Some(f.clone());
                    f
                }
            }
        };
        flight.await
    }

    /// The upstream answered 401 to `token`: true when one more token should be tried (the
    /// caller then [`Tokens::get`]s it); false when `token` was itself such a retry.
    pub fn rejected(&self, token: &Arc<Token>) -> bool {
        if token.after_401 {
            return false;
        }
        let mut s = lock(&self.state);
        if s.current.as_ref().is_some_and(|c| Arc::ptr_eq(c, token)) {
            s.current = None;
            s.next_after_401 = true;
        }
        true
    }

    /// Drops the cached token and revokes it (RFC 7009, in the background) where the server
    /// offers it: a registration's release.
    pub fn revoke(&self) {
        let old = {
            let mut s = lock(&self.state);
            s.subject = None;
            s.current.take()
        };
        if let Some(t) = old {
            self.client.revoke_later(t);
        }
    }

    /// The cached token, if any, fetching none (a session's closing DELETE).
    pub fn cached(&self) -> Option<Arc<Token>> {
        lock(&self.state).current.clone()
    }
}

/// A registration's credential cell for an upstream (its own or its nearest ancestor's), and
/// its agent path (`/`-joined, a child's only): a token exchange names it as the actor.
pub(crate) struct OwnAuth {
    pub cell: Arc<crate::registration::AuthCell>,
    pub actor: Option<String>,
}

/// A child's agent path as the actor token of its token exchange: the agent ids from the
/// root down, each form-encoded (so a `/` in an id stays inside it), joined by `/`.
pub(crate) fn agent_path_token(path: &[String]) -> String {
    let ids: Vec<String> = path
        .iter()
        .map(|id| form_urlencoded::byte_serialize(id.as_bytes()).collect())
        .collect();
    ids.join("/")
}

/// One token request, shared by every request waiting for it (`Tokens::get`); it writes its
/// result back into `state` if the holder still exists. `actor` is meaningful for an exchange
/// only (a subject credential is given then).
async fn fetch(
    client: Arc<OAuthClient>,
    actor: Option<String>,
    state: std::sync::Weak<Mutex<State>>,
    subject: Option<Arc<Credential>>,
    after_401: bool,
) -> Result<Arc<Token>, OAuthError> {
    let exchange = client.grant() == OAuthGrant::TokenExchange;
    let ask = match subject.as_deref() {
        Some(Credential::SubjectToken(t)) if exchange => Ask::Exchange {
            subject: t.expose(),
            actor: actor.as_deref(),
        },
        _ if exchange => {
            return Err(OAuthError::NoSubject {
                upstream: client.upstream().to_string(),
            })
        }
        _ => Ask::ClientCredentials,
    };
    let got = client.request(ask, after_401).await.map(Arc::new);
    let Some(state) = state.upgrade() else {
        // Its holder is gone (a released registration): the token is not wanted.
        if let (true, Ok(t)) = (exchange, &got) {
            client.revoke_later(t.clone());
        }
        return got;
    };
    let replaced = {
        let mut s = lock(&state);
        s.inflight = None;
        match &got {
            Ok(t) => {
                s.failed = None;
                s.subject = subject;
                s.current.replace(t.clone())
            }
            Err(e) => {
                s.failed = Some((tokio::time::Instant::now(), e.clone(), subject));
                None
            }
        }
    };
    if let Some(old) = replaced {
        // A token of a rotated subject: no longer wanted (one that expired is harmless).
        if exchange && old.refresh_at > tokio::time::Instant::now() {
            client.revoke_later(old);
        }
    }
    got
}
