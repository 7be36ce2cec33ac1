//! MRTR (2026-07-28 multi round-trip requests): a stateless call whose upstream asks the client
//! something (sampling, elicitation, roots) is answered `input_required`; the call itself is
//! held here, running, until the client retries with `inputResponses` and the `requestState`
//! it was given, or until [`HOLD_TTL`] passes (then it is cancelled: the upstream is told, the
//! call is audited `cancelled`).
//!
//! `requestState` is attacker-controlled input: it is `<key>.<expiry ms>.<HMAC-SHA256>` over the
//! registration id, the key and the expiry, under a random per-gateway secret, compared in
//! constant time. It names a held call; it carries nothing else.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use rand::rngs::OsRng;
use rand::RngCore;
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::DropGuard;

use crate::sync::lock;

/// How long a held call waits for the client's retry.
pub const HOLD_TTL: Duration = Duration::from_secs(60);
/// Held calls per gateway; over it a server request is refused upstream instead.
pub const MAX_HELD: usize = 4096;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// A call waiting for the client's retry: what it still sends, its result, and its cancel.
pub struct Held {
    pub registration_id: String,
    /// The call's notifications (and further server requests), in order.
    pub notes: mpsc::Receiver<Value>,
    /// The call's final response (`None`: it ended without one, e.g. cancelled).
    pub result: oneshot::Receiver<Option<Value>>,
    /// Cancels the call when dropped unresumed (expired, registration gone); whoever resumes
    /// the call disarms it and takes the token on.
    pub cancel: DropGuard,
    /// The gateway ids of the server requests the client must answer.
    pub asked: Vec<String>,
}

/// Why a `requestState` was refused (said to the client as it is).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StateError {
    #[error("requestState is malformed or was not issued by this gateway")]
    Invalid,
    #[error("requestState has expired: call the tool again without it")]
    Expired,
    #[error("requestState names no held call (answered already, or the call ended): call the tool again without it")]
    Unknown,
}

pub struct HeldCalls {
    secret: [u8; 32],
    map: Mutex<HashMap<String, (u64, Held)>>,
}

impl Default for HeldCalls {
    fn default() -> Self {
        let mut secret = [0u8; 32];
        OsRng.fill_bytes(&mut secret);
        Self {
            secret,
            map: Mutex::new(HashMap::new()),
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// HMAC-SHA256 (RFC 2104) of `msg` under `key`.
pub(crate) fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let (mut ipad, mut opad) = ([0x36u8; 64], [0x5cu8; 64]);
    for i in 0..64 {
        ipad[i] ^= k[i];
        opad[i] ^= k[i];
    }
    let inner = Sha256::new()
        .chain_update(ipad)
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(opad)
        .chain_update(inner)
        .finalize()
        .into()
}

impl HeldCalls {
    fn mac(&self, registration_id: &str, key: &str, expiry_ms: u64) -> [u8; 32] {
        let expiry = expiry_ms.to_string();
        let parts = [
            registration_id.as_bytes(),
            key.as_bytes(),
            expiry.as_bytes(),
        ];
        let rest = parts.join(&0u8);
        let msg = [&b"v1"[..], &rest[..]].join(&0u8);
        hmac_sha256(&self.secret, &msg)
    }

    fn seal(&self, registration_id: &str, key: &str, expiry_ms: u64) -> String {
        let mac = self.mac(registration_id, key, expiry_ms);
        format!("{key}.{expiry_ms}.{}", B64.encode(mac))
    }

    /// Holds a call; returns its `requestState`. (The caller keeps to [`MAX_HELD`]: it
    /// refuses the server request instead when `len()` is at it.)
    pub fn hold(&self, held: Held) -> String {
        let mut raw = [0u8; 16];
        OsRng.fill_bytes(&mut raw);
        let key = B64.encode(raw);
        let expiry = now_ms().saturating_add(u64::try_from(HOLD_TTL.as_millis()).unwrap_or(0));
        let state = self.seal(&held.registration_id, &key, expiry);
        lock(&self.map).insert(key, (expiry, held));
        state
    }

    /// Takes the held call a `requestState` names, if it is genuine, unexpired and the
    /// registration's own.
    pub fn resume(&self, registration_id: &str, state: &str) -> Result<Held, StateError> {
        let (key, expiry_ms) = self.open(registration_id, state)?;
        if now_ms() > expiry_ms {
            return Err(StateError::Expired);
        }
        let mut map = lock(&self.map);
        match map.get(key) {
            Some((_, h)) if h.registration_id == registration_id => {
                map.remove(key).map(|(_, h)| h).ok_or(StateError::Unknown)
            }
            _ => Err(StateError::Unknown),
        }
    }

    fn open<'s>(
        &self,
        registration_id: &str,
        state: &'s str,
    ) -> Result<(&'s str, u64), StateError> {
        let mut parts = state.splitn(3, '.');
        let (Some(key), Some(expiry), Some(mac)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(StateError::Invalid);
        };
        let expiry_ms: u64 = expiry.parse().map_err(|_| StateError::Invalid)?;
        let mac = B64.decode(mac).map_err(|_| StateError::Invalid)?;
        let want = self.mac(registration_id, key, expiry_ms);
        if mac.len() != want.len() || !bool::from(mac.ct_eq(&want)) {
            return Err(StateError::Invalid);
        }
        Ok((key, expiry_ms))
    }

    /// Takes the held calls past their expiry (dropping them cancels them).
    pub fn take_expired(&self) -> Vec<Held> {
        let now = now_ms();
        let expired: Vec<Held> = {
            let mut map = lock(&self.map);
            let keys: Vec<String> = map
                .iter()
                .filter(|(_, (e, _))| *e < now)
                .map(|(k, _)| k.clone())
                .collect();
            keys.iter()
                .filter_map(|k| map.remove(k).map(|(_, h)| h))
                .collect()
        };
        expired
    }

    /// Drops a registration's held calls (each is cancelled).
    pub fn forget_registration(&self, registration_id: &str) -> Vec<Held> {
        let mut map = lock(&self.map);
        let keys: Vec<String> = map
            .iter()
            .filter(|(_, (_, h))| h.registration_id == registration_id)
            .map(|(k, _)| k.clone())
            .collect();
        keys.iter()
            .filter_map(|k| map.remove(k).map(|(_, h)| h))
            .collect()
    }

    pub fn len(&self) -> usize {
        lock(&self.map).len()
    }
}

/// Input requests, alike for MRTR's held calls and for 2026 tasks: a server → client request
/// put to a stateless client as one of `inputRequests`, keyed by the gateway's id of the
/// request (its routing id on `upstream::STATELESS_SESSION`), and answered by the client's
/// `inputResponses` under that key.
pub mod input {
    use serde_json::{json, Map, Value};

    use crate::protocol::ClientCapability;

    /// Why `method` may not be asked of a client whose request declared `declared`
    /// (`ClientCapability::bits_of`): it did not declare the capability the method needs.
    pub fn undeclared(method: &str, declared: u8) -> Option<String> {
        let ok = ClientCapability::for_method(method).is_some_and(|c| c.in_bits(declared));
        (!ok).then(|| {
            format!("{method} refused: the client did not declare the capability it needs")
        })
    }

    /// The `inputRequests` entry of a request: its method and, if it has them, its params.
    pub fn request(method: Value, params: Option<Value>) -> Value {
        let mut entry = Map::new();
        entry.insert("method".into(), method);
        if let Some(p) = params {
            entry.insert("params".into(), p);
        }
        Value::Object(entry)
    }

    /// What goes upstream for the client's response to one: its result.
    pub fn answered(response: &Value) -> Value {
        json!({ "result": response })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_request_is_asked_only_with_its_capability_and_answered_by_its_result() {
        let elicit = crate::protocol::ClientCapability::for_method("elicitation/create")
            .map(|c| {
                crate::protocol::ClientCapability::bits_of(Some(
                    &serde_json::json!({c.as_str(): {}}),
                ))
            })
            .unwrap_or(0);
        assert!(input::undeclared("elicitation/create", 0).is_some());
        assert_eq!(input::undeclared("elicitation/create", elicit), None);
        assert!(input::undeclared("sampling/createMessage", elicit).is_some());
        let r = input::request("roots/list".into(), None);
        assert_eq!(r, serde_json::json!({"method": "roots/list"}));
        let r = input::request("x".into(), Some(serde_json::json!({"a": 1})));
        assert_eq!(r, serde_json::json!({"method": "x", "params": {"a": 1}}));
        assert_eq!(
            input::answered(&serde_json::json!({})),
            serde_json::json!({"result": {}})
        );
    }

    fn held(reg: &str) -> (Held, tokio_util::sync::CancellationToken) {
        let (_tx, notes) = mpsc::channel(1);
        let (_rtx, result) = oneshot::channel();
        let cancel = tokio_util::sync::CancellationToken::new();
        (
            Held {
                registration_id: reg.into(),
                notes,
                result,
                cancel: cancel.clone().drop_guard(),
                asked: vec![],
            },
            cancel,
        )
    }

    #[test]
    fn a_state_resumes_once_and_only_for_its_registration() {
        let t = HeldCalls::default();
        let (h, cancel) = held("reg-a");
        let state = t.hold(h);
        assert_eq!(t.resume("reg-b", &state).err(), Some(StateError::Invalid));
        let h = t.resume("reg-a", &state).ok().unwrap();
        assert_eq!(t.resume("reg-a", &state).err(), Some(StateError::Unknown));
        let _token = h.cancel.disarm();
        assert!(!cancel.is_cancelled(), "a resumed call goes on");
    }

    #[test]
    fn tampered_or_expired_states_are_refused_and_dropping_cancels() {
        let t = HeldCalls::default();
        let (h, cancel) = held("reg-a");
        let state = t.hold(h);
        let (key, rest) = state.split_once('.').unwrap();
        let (expiry, mac) = rest.split_once('.').unwrap();
        let later = format!("{key}.{}.{mac}", expiry.parse::<u64>().unwrap() + 1);
        assert_eq!(t.resume("reg-a", &later).err(), Some(StateError::Invalid));
        assert_eq!(
            t.resume("reg-a", "garbage").err(),
            Some(StateError::Invalid)
        );
        assert_eq!(t.resume("reg-a", "a.b.c").err(), Some(StateError::Invalid));
        // A genuine state past its expiry.
        let old = t.seal("reg-a", key, 1);
        assert_eq!(t.resume("reg-a", &old).err(), Some(StateError::Expired));
        // Forgetting the registration drops (and so cancels) its held call.
        drop(t.forget_registration("reg-a"));
        assert!(cancel.is_cancelled());
        assert_eq!(t.len(), 0);
    }
}
