//! What config (`[policy]`, `[[policy.rules]]`) and a registration (`"policy": [...]`)
//! write: a rule's id, its CEL condition and its effect.

use serde::{Deserialize, Serialize};

/// What a matching rule does.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    Allow,
    Deny,
    /// Held until its approver decides (issue 49 item 3: `approval`, `call::approve`).
    Approve,
}

/// Who approves an `approve` rule's call.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Approver {
    Harness,
    Client,
}

/// One rule, as config and the admin API write it (an absent optional field reads as none).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Named in refusals and audit records: 1-64 characters of `[A-Za-z0-9_.-]`.
    pub id: String,
    /// A CEL expression giving a boolean.
    pub when: String,
    pub effect: Effect,
    /// A `deny` rule's reason, told to the client and audited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// An `approve` rule's approver.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approver: Option<Approver>,
    /// An `approve` rule's wait for a decision, seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
    /// Config rules only: the rule applies to calls of this upstream's tools only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
}

/// What a call no rule matched gets.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DefaultEffect {
    #[default]
    Allow,
    Deny,
}

/// The `[policy]` table.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// For a call that no config rule and no rule of its root registration matched.
    pub default: DefaultEffect,
    pub rules: Vec<RuleSpec>,
    /// Calls held for approval at once, in all (over it a call is denied with the reason).
    pub max_pending_approvals: usize,
    /// Calls held for approval at once, per registration.
    pub max_pending_approvals_per_registration: usize,
    /// Where a call held for the harness's approval is also announced (a signed POST).
    pub approval_webhook: Option<ApprovalWebhook>,
}

/// `[policy.approval_webhook]`: each call held for the harness's approval is POSTed to `url`
/// as JSON, signed with HMAC-SHA256 under the secret in `secret_file`
/// (`X-Gatehouse-Signature: sha256=<hex>`, over the exact body).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ApprovalWebhook {
    /// `http://` or `https://` (platform roots).
    pub url: String,
    /// A file holding the shared secret (read at start; at least 16 bytes).
    pub secret_file: std::path::PathBuf,
    /// The POST's timeout, seconds (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            default: DefaultEffect::Allow,
            rules: Vec::new(),
            max_pending_approvals: 256,
            max_pending_approvals_per_registration: 16,
            approval_webhook: None,
        }
    }
}
