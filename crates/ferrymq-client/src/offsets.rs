//! Runs of acked offsets: what acks and nacks carry, built by the subscription and by a
//! batch's views alike.

use ferrymq_protocol::OffsetRange;

/// Appends `(partition, offset)` to `ranges`, extending the last range when it is the next offset
/// of the same partition: build ack ranges while iterating a batch, with no allocation once warm.
pub fn push_offset(ranges: &mut Vec<OffsetRange>, partition: u32, offset: u64) {
    match ranges.last_mut() {
        Some(last)
            if last.partition == partition && last.end() == offset && last.count < u32::MAX =>
        {
            last.count += 1
        }
        _ => ranges.push(OffsetRange::single(partition, offset)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_offset_merges_runs_within_a_partition() {
        let mut ranges = Vec::new();
        for (partition, offset) in [(0, 1), (0, 2), (0, 3), (1, 4), (0, 4), (0, 6)] {
            push_offset(&mut ranges, partition, offset);
        }
        assert_eq!(
            ranges,
            vec![
                OffsetRange {
                    partition: 0,
                    offset: 1,
                    count: 3
                },
                OffsetRange::single(1, 4),
                OffsetRange::single(0, 4),
                OffsetRange::single(0, 6),
            ]
        );
    }
}
