//! Key hashing, shared by partition routing (`topic`) and ordered delivery (`cursor`): a leaf
//! module, so the cursor depends on nothing above it.

/// FNV-1a, 64-bit: stable across versions and platforms, so a key keeps its partition.
pub fn key_hash(key: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        hash ^= b as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}
