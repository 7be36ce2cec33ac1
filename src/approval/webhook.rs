//! `[policy.approval_webhook]` (issue 49): each call held for the harness's approval is also
//! POSTed, as JSON, to a URL the operator names, signed so the receiver can tell it came from
//! this gateway: `X-Gatehouse-Signature: sha256=<hex of HMAC-SHA256(secret, body)>`, over the
//! exact bytes of the body (which carries `sent_at`, so a receiver can refuse old replays).
//!
//! Best effort and bounded: at most [`MAX_IN_FLIGHT`] POSTs at once (one more is skipped and
//! logged), each ends by its timeout; the tasks are the webhook's own (`TaskTracker`). The
//! decision still comes through the admin API; a webhook that fails changes nothing else.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::task::TaskTracker;

use super::Pending;
use crate::mrtr::hmac_sha256;
use crate::policy::ApprovalWebhook;

/// POSTs in flight at once.
pub const MAX_IN_FLIGHT: usize = 16;
/// The signature's header.
pub const SIGNATURE_HEADER: &str = "x-gatehouse-signature";

/// The webhook, ready to send.
pub struct Webhook {
    url: String,
    /// The node that holds the call (`node_id`), where the decision must be posted.
    node_id: Option<String>,
    secret: Vec<u8>,
    http: reqwest::Client,
    permits: Arc<Semaphore>,
    tasks: TaskTracker,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("Webhook").field("url", &self.url).finish()
    }
}

/// The secret of `secret_file`, trimmed; at least 16 bytes.
pub fn read_secret(path: &std::path::Path) -> Result<Vec<u8>, String> {
    let raw = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let s = raw.trim_ascii().to_vec();
    if s.len() < 16 {
        return Err(format!(
            "{}: the secret must be at least 16 bytes",
            path.display()
        ));
    }
    Ok(s)
}

impl Webhook {
    pub fn new(cfg: &ApprovalWebhook, node_id: Option<&str>) -> Result<Webhook, String> {
        let secret = read_secret(&cfg.secret_file)?;
        let mut builder = reqwest::Client::builder()
            .timeout(Duration::from_secs(cfg.timeout_s.unwrap_or(5)))
            .redirect(reqwest::redirect::Policy::none());
        if cfg.url.starts_with("https://") {
            builder = builder.use_preconfigured_tls(crate::tls::platform_client_config()?);
        }
        let http = builder.build().map_err(|e| e.to_string())?;
        Ok(Webhook {
            url: cfg.url.clone(),
            node_id: node_id.map(str::to_owned),
            secret,
            http,
            permits: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
            tasks: TaskTracker::new(),
        })
    }

    /// The signed body of one announcement, and its signature header value.
    pub fn sign(&self, pending: &Pending) -> (Vec<u8>, String) {
        let body = serde_json::json!({
            "event": "approval_requested",
            "sent_at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "node_id": self.node_id,
            "approval": pending,
        })
        .to_string()
        .into_bytes();
        let sig = format!("sha256={}", hex::encode(hmac_sha256(&self.secret, &body)));
        (body, sig)
    }

    /// Announces a held call (in the background; skipped when [`MAX_IN_FLIGHT`] are out).
    pub fn announce(&self, pending: &Pending) {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            tracing::warn!(approval = %pending.id, "approval webhook skipped: too many in flight");
            return;
        };
        let (body, sig) = self.sign(pending);
        let req = self
            .http
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, sig)
            .body(body);
        let id = pending.id.clone();
        self.tasks.spawn(async move {
            match req.send().await {
                Ok(r) if r.status().is_success() => {}
                Ok(r) => {
                    tracing::warn!(approval = %id, status = %r.status(), "approval webhook refused")
                }
                Err(e) => {
                    tracing::warn!(approval = %id, error = %e, "approval webhook not delivered")
                }
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        // RFC 4231, test case 2.
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block.
        let mac = hmac_sha256(
            &[0xaa; 131],
            b"Test Using Larger Than Block-Size Key - Hash Key First",
        );
        assert_eq!(
            hex::encode(mac),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }
}
