//! Credentials sealed for the durable store (issue 47): ChaCha20-Poly1305 under a 256-bit key
//! kept in a file of its own beside the store (`[store] secret_key_file`, mode 0600, made on
//! first start). A sealed value is `v1.<key id>.<base64url(nonce ‖ ciphertext ‖ tag)>`, bound
//! (associated data) to its registration and upstream, so a value moved to another row does
//! not open. The key id (the first 8 bytes of the key's SHA-256, hex) says which key sealed a
//! value, so a wrong key is told apart from a damaged value.
//!
//! Invariant: the store holds no credential in clear; without its key file a copy of the
//! store shows none.

use std::path::{Path, PathBuf};

use base64::Engine;
use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use sha2::{Digest, Sha256};

use super::StoreError;

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// The store's sealing key.
pub struct Sealer {
    cipher: ChaCha20Poly1305,
    kid: String,
    path: PathBuf,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer").field("kid", &self.kid).finish()
    }
}

/// The key file's default place: beside the store (`gatehouse-store.sqlite` gives
/// `gatehouse-store.key`).
pub fn key_path_beside(store: &Path) -> PathBuf {
    store.with_extension("key")
}

fn open_err(path: &Path, message: impl std::fmt::Display) -> StoreError {
    StoreError::Open {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

impl Sealer {
    /// Reads the key file at `path`, or makes it (32 random bytes, hex, mode 0600) when it
    /// does not exist. Returns the sealer and whether the file was made now. A file that is
    /// not 64 hex digits is refused (never replaced).
    pub fn load_or_create(path: &Path) -> Result<(Sealer, bool), StoreError> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let (key, made) = match std::fs::read_to_string(path) {
            Ok(text) => {
                let mut key = [0u8; 32];
                hex::decode_to_slice(text.trim(), &mut key)
                    .map_err(|_| open_err(path, "secret key file: not 64 hex digits"))?;
                if let Ok(m) = std::fs::metadata(path) {
                    if m.mode() & 0o077 != 0 {
                        tracing::warn!(path = %path.display(), mode = format!("{:o}", m.mode() & 0o777), "the secret key file is readable by others than its owner: chmod 600 it");
                    }
                }
                (key, false)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                use std::io::Write;
                let key: [u8; 32] = ChaCha20Poly1305::generate_key(&mut OsRng).into();
                if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| open_err(path, e))?;
                }
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .map_err(|e| {
                        open_err(path, format!("cannot create the secret key file: {e}"))
                    })?;
                f.write_all(format!("{}\n", hex::encode(key)).as_bytes())
                    .and_then(|()| f.sync_all())
                    .map_err(|e| open_err(path, e))?;
                (key, true)
            }
            Err(e) => return Err(open_err(path, format!("secret key file: {e}"))),
        };
        let kid = hex::encode(&Sha256::digest(key)[..8]);
        Ok((
            Sealer {
                cipher: ChaCha20Poly1305::new(Key::from_slice(&key)),
                kid,
                path: path.to_path_buf(),
            },
            made,
        ))
    }

    /// The key's id (not secret).
    pub fn key_id(&self) -> &str {
        &self.kid
    }

    fn aad(registration: &str, upstream: &str) -> Vec<u8> {
        format!("gatehouse credentials v1\0{registration}\0{upstream}").into_bytes()
    }

    /// `plain` sealed for `upstream` of `registration`.
    pub fn seal(&self, registration: &str, upstream: &str, plain: &[u8]) -> String {
        let nonce = ChaCha20Poly1305::generate_nonce(&mut OsRng);
        let aad = Self::aad(registration, upstream);
        // Encryption fails only for a message over ~256 GiB.
        let ct = self
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plain,
                    aad: &aad,
                },
            )
            .unwrap_or_default();
        let mut out = nonce.to_vec();
        out.extend_from_slice(&ct);
        format!("v1.{}.{}", self.kid, B64.encode(out))
    }

    /// Opens a value sealed for `upstream` of `registration`; the error says why (another
    /// key, or damaged), never what.
    pub fn open(
        &self,
        registration: &str,
        upstream: &str,
        sealed: &str,
    ) -> Result<Vec<u8>, String> {
        let mut parts = sealed.splitn(3, '.');
        let (Some("v1"), Some(kid), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
            return Err("not a sealed value this gatehouse reads".into());
        };
        if kid != self.kid {
            return Err(format!(
                "sealed with another key (key id {kid}; the key file {} has key id {}): the key file is missing or was replaced",
                self.path.display(),
                self.kid
            ));
        }
        let raw = B64
            .decode(body)
            .map_err(|_| "the sealed value is damaged".to_string())?;
        if raw.len() < 12 + 16 {
            return Err("the sealed value is damaged".into());
        }
        let (nonce, ct) = raw.split_at(12);
        let aad = Self::aad(registration, upstream);
        self.cipher
            .decrypt(Nonce::from_slice(nonce), Payload { msg: ct, aad: &aad })
            .map_err(|_| "the sealed value does not open under this key (damaged, or moved from another registration)".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_value_opens_only_under_its_key_for_its_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.key");
        let (a, made) = Sealer::load_or_create(&path).unwrap();
        assert!(made);
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        let (again, made) = Sealer::load_or_create(&path).unwrap();
        assert!(!made);
        let s = a.seal("r1", "gh", b"{\"bearer\":\"tok-XYZ\"}");
        assert!(!s.contains("tok-XYZ"));
        assert_eq!(
            again.open("r1", "gh", &s).unwrap(),
            b"{\"bearer\":\"tok-XYZ\"}"
        );
        assert!(again.open("r2", "gh", &s).is_err());
        assert!(again.open("r1", "jira", &s).is_err());
        let (other, _) = Sealer::load_or_create(&dir.path().join("o.key")).unwrap();
        let e = other.open("r1", "gh", &s).unwrap_err();
        assert!(e.contains("another key"), "{e}");
        std::fs::write(dir.path().join("bad.key"), "nothex").unwrap();
        assert!(Sealer::load_or_create(&dir.path().join("bad.key")).is_err());
    }
}
