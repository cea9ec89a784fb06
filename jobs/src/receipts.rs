//! Erasure receipts (RQ-6): the subject of a request only as a keyed hash, and the chain of
//! receipts that outlives the data.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use uuid::Uuid;

/// `[erasure] receipt_key`: the secret a subject is hashed under. Never shown: its `Debug` and
/// `Display` print that it is set, not what it is.
#[derive(Clone, PartialEq, Eq)]
pub struct ReceiptKey(Vec<u8>);

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
}

impl fmt::Debug for ReceiptKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ReceiptKey(set, not shown)")
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
