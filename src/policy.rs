//! Governed calls decided per call (issue 49): policy rules in CEL over the tool and its
//! arguments ([`rules`]: what config and a registration write; [`compile`]: checked and
//! bounded once, at config load and at registration; [`eval`]: the call's variables and the
//! first-match decision), and rate limits over time ([`limits`]: token buckets).
//!
//! A leaf of the vocabulary (rank 0): it knows no registration, tool or call; the call's
//! admission (`call::admit`) hands it plain values. With no rule anywhere the call path pays
//! one atomic load and two `None` checks.

pub mod compile;
pub mod eval;
pub mod limits;
pub mod rules;

pub use compile::{compile, Rules};
pub use eval::{decide, CallFacts, Decision, Layers, Live};
pub use limits::{Buckets, RateLimited};
pub use rules::{ApprovalWebhook, Approver, DefaultEffect, Effect, PolicyConfig, RuleSpec};
