//! Shards: which partition of a bus topic a message goes to.
//!
//! An int or string key follows the broker's partition rule (`partition_for_key` in
//! `ferrymq-broker`): key bytes of 1..=20 ASCII digits that parse as a u64 give that number mod N,
//! any other bytes give FNV-1a-64 mod N. A UUID's shard is the sum of its 16 bytes mod N, as the
//! NanoMessageBus did for GUIDs (a sum does not depend on the byte order). The table in
//! `protocol/bus-vectors.json` pins all three.

use std::fmt;

use super::BusError;

/// A message's key, as the bus shards it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BusKey {
    Int(i64),
    Str(String),
    Uuid(uuid::Uuid),
}

impl BusKey {
    /// The bytes the key travels as: decimal ASCII for an int, UTF-8 for a string, the
    /// 36-character lowercase form for a UUID.
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            BusKey::Int(v) => v.to_string().into_bytes(),
            BusKey::Str(s) => s.as_bytes().to_vec(),
            BusKey::Uuid(u) => u.hyphenated().to_string().into_bytes(),
        }
    }
}

impl fmt::Display for BusKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BusKey::Int(v) => write!(f, "{v}"),
            BusKey::Str(s) => write!(f, "{s:?}"),
            BusKey::Uuid(u) => write!(f, "{u}"),
        }
    }
}

fn fnv1a64(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The broker's partition rule for key bytes.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    assert!(partitions > 0, "a topic has at least one partition");
    let as_int = (!key.is_empty() && key.len() <= 20 && key.iter().all(u8::is_ascii_digit))
        .then(|| std::str::from_utf8(key).ok()?.parse::<u64>().ok())
        .flatten();
    (as_int.unwrap_or_else(|| fnv1a64(key)) % partitions as u64) as u32
}

/// The default shard of `key` among `shard_count` shards.
pub fn shard_for_key(key: &BusKey, shard_count: u32) -> Result<u32, BusError> {
    if shard_count == 0 {
        return Err(BusError::Config(
            "the shard count must be at least 1".into(),
        ));
    }
    Ok(match key {
        BusKey::Uuid(u) => {
            (u.as_bytes().iter().map(|&b| b as u64).sum::<u64>() % shard_count as u64) as u32
        }
        other => partition_for_key(&other.bytes(), shard_count),
    })
}

/// `"1,2,4-7"` as inclusive ranges `[(1, 1), (2, 2), (4, 7)]`.
pub fn parse_shards(spec: &str) -> Result<Vec<(u32, u32)>, BusError> {
    let bad = || BusError::Config(format!("shard ranges look like '1,2,4-7', got {spec:?}"));
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (
                a.trim().parse().map_err(|_| bad())?,
                b.trim().parse().map_err(|_| bad())?,
            ),
            None => {
                let v = part.parse().map_err(|_| bad())?;
                (v, v)
            }
        };
        if last < first {
            return Err(bad());
        }
        out.push((first, last));
    }
    if out.is_empty() {
        return Err(bad());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_ranges_parse_and_refuse_nonsense() {
        assert_eq!(
            parse_shards("1,2,4-7").unwrap(),
            vec![(1, 1), (2, 2), (4, 7)]
        );
        for bad in ["", "a", "3-1", "-1", "1,,x"] {
            assert!(parse_shards(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_zero_shard_count_is_an_error() {
        assert!(shard_for_key(&BusKey::Int(1), 0).is_err());
    }
}
