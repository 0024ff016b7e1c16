//! Key hashing and key routing, shared by partition routing (`topic`) and ordered delivery
//! (`cursor`): a leaf module, so the cursor depends on nothing above it.

/// FNV-1a, 64-bit: stable across versions and platforms, so a key keeps its partition.
pub fn key_hash(key: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        hash ^= b as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The partition a key goes to: an ASCII decimal integer key modulo the partition count, any other
/// key by its stable hash.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    let as_int = (!key.is_empty() && key.len() <= 20 && key.iter().all(u8::is_ascii_digit))
        .then(|| std::str::from_utf8(key).ok()?.parse::<u64>().ok())
        .flatten();
    (as_int.unwrap_or_else(|| key_hash(key)) % partitions as u64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_keys_go_modulo_and_other_keys_by_stable_hash() {
        assert_eq!(partition_for_key(b"7", 4), 3);
        assert_eq!(partition_for_key(b"12", 4), 0);
        assert_eq!(partition_for_key(b"18446744073709551615", 10), 5);
        // A 21-digit or signed key is not an integer key: hashed.
        assert_eq!(
            partition_for_key(b"-1", 1000),
            (key_hash(b"-1") % 1000) as u32
        );
        // FNV-1a 64 reference values.
        assert_eq!(key_hash(b""), 0xcbf29ce484222325);
        assert_eq!(key_hash(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(
            partition_for_key(b"user-42", 8),
            partition_for_key(b"user-42", 8)
        );
    }
}
