//! Random identifiers from the kernel (`/dev/urandom`): browser session ids, submission keys.

/// `n` random bytes, in hex (`2n` digits). An error when the kernel's source cannot be read:
/// a caller that needs secrecy must not fall back to anything guessable.
pub fn random_hex(n: usize) -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(crate::hex::encode(&bytes))
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_of_the_asked_length_and_never_twice() {
        let a = super::random_hex(16).unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, super::random_hex(16).unwrap());
    }
}
