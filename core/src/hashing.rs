//! SHA-256 digests written as lowercase hex: whole, or the first bytes of one as a short name.

/// The SHA-256 of `data`, as 64 hex digits.
pub fn sha256_hex(data: &[u8]) -> String {
    short_sha256_hex(data, 32)
}

/// The first `bytes` bytes of the SHA-256 of `data`, as hex (twice as many digits).
pub fn short_sha256_hex(data: &[u8], bytes: usize) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, data);
    digest.as_ref().iter().take(bytes).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_lowercase_hex() {
        assert_eq!(sha256_hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(short_sha256_hex(b"abc", 4), "ba7816bf");
    }
}
