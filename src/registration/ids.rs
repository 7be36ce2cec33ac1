//! Registration ids and bearer tokens: minted from the OS CSPRNG, base64url; an id may carry
//! its node (`<node>.<random>`). A token is kept only as its SHA-256 digest.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use rand::rngs::OsRng;
use rand::RngCore;
use sha2::{Digest, Sha256};

/// Random bytes from the OS CSPRNG, base64url without padding.
pub fn random_b64(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    OsRng.fill_bytes(&mut buf);
    URL_SAFE_NO_PAD.encode(buf)
}

/// A registration id: 128 bits.
pub fn new_registration_id() -> String {
    random_b64(16)
}

/// A registration id of a node: `<node>.<128 random bits, base64url>` with a node id
/// (`[a-z0-9]`, see `config::valid_node_id`), else a plain [`new_registration_id`]. `.` is in
/// neither part, so the node is everything before the first `.` (DESIGN.md §8).
pub fn new_registration_id_on(node: Option<&str>) -> String {
    match node {
        Some(node) => format!("{node}.{}", new_registration_id()),
        None => new_registration_id(),
    }
}

/// Is `id` shaped like a registration id: base64url characters, optionally after a node
/// prefix `<[a-z0-9]+>.`? (A shape check for fast paths; the registry decides what exists.)
pub fn id_shaped(id: &str) -> bool {
    // One table lookup per byte (the id, 22 bytes or more, is read on every request).
    const B64URL: [bool; 256] = {
        let mut t = [false; 256];
        let mut c = 0;
        while c < 256 {
            let b = c as u8;
            t[c] = b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
            c += 1;
        }
        t
    };
    let plain = |s: &str| !s.is_empty() && s.bytes().all(|c| B64URL[usize::from(c)]);
    // A byte scan for the `.`: a `str` search sets up a searcher that costs more than this
    // short id (it runs on every request). A `.` is one byte, so both halves are `str`s.
    match id.bytes().position(|c| c == b'.') {
        None => plain(id),
        Some(dot) => crate::config::valid_node_id(&id[..dot]) && plain(&id[dot + 1..]),
    }
}

/// A bearer token: 256 bits.
pub fn new_token() -> String {
    random_b64(32)
}

pub(super) fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_tokens_are_long_and_distinct() {
        let a = new_registration_id();
        let b = new_registration_id();
        assert_ne!(a, b);
        assert_eq!(URL_SAFE_NO_PAD.decode(&a).map(|v| v.len()).ok(), Some(16));
        let t = new_token();
        assert_eq!(URL_SAFE_NO_PAD.decode(&t).map(|v| v.len()).ok(), Some(32));
    }

    #[test]
    fn node_ids_prefix_the_random_part_and_keep_128_bits() {
        assert_eq!(new_registration_id_on(None).len(), 22);
        let a = new_registration_id_on(Some("n1"));
        let (node, random) = a.split_once('.').unwrap();
        assert_eq!(node, "n1");
        assert_eq!(
            URL_SAFE_NO_PAD.decode(random).map(|v| v.len()).ok(),
            Some(16)
        );
        assert!(!random.contains('.'));
        assert_ne!(a, new_registration_id_on(Some("n1")));
        for id in [a.as_str(), "abc", "-x_Y", "n1.-x", "0.a"] {
            assert!(id_shaped(id), "{id}");
        }
        for id in [
            "", ".", "n1.", ".abc", "N1.abc", "a.b.c", "..", "a-b.c", "a%2Eb", "a/b",
        ] {
            assert!(!id_shaped(id), "{id}");
        }
    }
}
