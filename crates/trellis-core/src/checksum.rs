//! SHA-256 checksums of checkpoint bytes (docs/design.md §10, invariant 6): computed when a checkpoint
//! is made and verified on every read, so a corrupt checkpoint is detected instead of restored.

use sha2::{Digest, Sha256};

/// Returns the SHA-256 digest of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Returns true when `bytes` hash to `expected`.
pub fn verify(bytes: &[u8], expected: &[u8]) -> bool {
    expected.len() == 32 && sha256(bytes).as_slice() == expected
}

#[cfg(test)]
mod tests {
    #[test]
    fn known_digest_and_verification() {
        let digest = super::sha256(b"abc");
        assert_eq!(
            digest[..4],
            [0xba, 0x78, 0x16, 0xbf],
            "SHA-256(\"abc\") starts ba7816bf"
        );
        assert!(super::verify(b"abc", &digest));
        assert!(!super::verify(b"abd", &digest));
        assert!(!super::verify(b"abc", &digest[..31]));
    }
}
