//! How digests are written in every output: `sha256:<lowercase hex>`.

use sha2::{Digest, Sha256};

/// `sha256:<hex>` of a finished hash.
pub fn named(hash: Sha256) -> String {
    let hex: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// `sha256:<hex>` of `bytes`.
pub fn of(bytes: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(bytes);
    named(hash)
}
