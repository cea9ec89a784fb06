//! Erasure receipts (RQ-6): the subject of a request only as a keyed hash, and the chain of
//! receipts that outlives the data — appended inside the request's own transaction, verified
//! link by link, exported as JSON lines and found by a subject's recomputed hash.
//!
//! A receipt's body is the erasure job's (its request, ref, scope kind, counts, `subject_hash`
//! and `key_id`, never a subject id); this module chains and reads it, whatever it holds.

mod chain;
mod read;

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use uuid::Uuid;

pub use chain::{Broken, GENESIS, Head, Verified, append, link, verify};
pub use read::{Found, OtherKey, Receipt, export, find};

/// `[erasure] receipt_key`: the secret a subject is hashed under. Never shown: its `Debug` and
/// `Display` print that it is set, not what it is.
#[derive(Clone, PartialEq, Eq)]
pub struct ReceiptKey(Vec<u8>);

/// What the key's fingerprint is the MAC of: a fixed label, never a subject.
const KEY_ID_LABEL: &[u8] = b"sexton receipt key id";

impl ReceiptKey {
    pub fn new(secret: impl Into<Vec<u8>>) -> Self {
        Self(secret.into())
    }

    fn mac(&self, message: &[u8]) -> String {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(message);
        hex(&mac.finalize().into_bytes())
    }

    /// The subject's keyed hash: HMAC-SHA-256 of its id (hyphenated, lower case), in hex.
    pub fn subject_hash(&self, id: Uuid) -> String {
        self.mac(id.hyphenated().to_string().as_bytes())
    }

    /// The key's fingerprint (its era), which each receipt stores as `key_id`: the first 16 hex
    /// digits of the HMAC of a fixed label. It tells which receipts this key can check after
    /// the key changed, and says nothing of the key.
    pub fn key_id(&self) -> String {
        let mut id = self.mac(KEY_ID_LABEL);
        id.truncate(16);
        id
    }
}

impl fmt::Debug for ReceiptKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReceiptKey(set, not shown)")
    }
}

impl fmt::Display for ReceiptKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("(set, not shown)")
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ReceiptKey {
        ReceiptKey::new("receipt key for tests")
    }

    #[test]
    fn rq6_a_subjects_hash_is_hmac_sha256_of_its_hyphenated_id() {
        // Computed apart from this code (Python's hmac): a receipt written today is found by
        // the same key in any later version.
        let id = Uuid::from_u128(1);
        assert_eq!(
            key().subject_hash(id),
            "277385594b727a739bb4e9cc1f2ba113fadef5ca16ac94c2612eeac962185da1"
        );
        // Control: another id, or another key, gives another hash.
        assert_ne!(
            key().subject_hash(Uuid::from_u128(2)),
            key().subject_hash(id)
        );
        assert_ne!(
            ReceiptKey::new("another").subject_hash(id),
            key().subject_hash(id)
        );
    }

    #[test]
    fn rq6_a_keys_id_is_stable_short_and_tells_keys_apart() {
        assert_eq!(key().key_id(), "8874bb25e087f535");
        assert_eq!(key().key_id(), key().key_id());
        assert_ne!(ReceiptKey::new("another").key_id(), key().key_id());
        // The fingerprint is not the hash of any subject, nor a prefix of the key.
        assert!(!key().subject_hash(Uuid::nil()).starts_with(&key().key_id()));
    }

    #[test]
    fn rq6_the_key_is_never_shown() {
        let shown = format!("{:?} {}", key(), key());
        assert!(!shown.contains("receipt key for tests"), "{shown}");
        assert!(shown.contains("not shown"));
    }
}
