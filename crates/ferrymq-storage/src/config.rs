//! Limits of one partition log, each with the reason for its number. Names carry units last.

use crate::error::LogError;
use crate::format::ENTRY_HEADER_BYTES;

/// Default segment size: 1 GiB keeps the number of files (three per segment) small for a large
/// backlog while retention, which deletes whole segments, still frees space in useful steps.
pub const SEGMENT_BYTES_DEFAULT: u64 = 1024 * 1024 * 1024;
/// Largest configurable segment: index points store byte positions as `u32`, and a segment may
/// exceed its limit by one batch (a batch is never split between segments, so one larger than
/// the limit gets a segment of its own), so 2 GiB leaves room below 4 GiB for the largest batch.
pub const SEGMENT_BYTES_CEILING: u64 = 2 * 1024 * 1024 * 1024;
/// Largest batch one append may write, entries included: a batch stays in one segment so that
/// recovery can cut it whole, and a segment plus a batch must fit the index's `u32` positions.
/// The broker's batches are bounded far below by the frame limit.
pub const BATCH_BYTES_MAX: u64 = 1024 * 1024 * 1024;
const _: () = assert!(SEGMENT_BYTES_CEILING + BATCH_BYTES_MAX <= u32::MAX as u64);
/// Default segment age: a week, so that retention by age on a quiet topic can still delete data
/// within a week of its limit (it only deletes whole, closed segments).
pub const SEGMENT_AGE_MS_DEFAULT: u64 = 7 * 24 * 3600 * 1000;
/// Default bytes between index points: 4 KiB bounds the scan from an index point to any entry to
/// about one page, and costs 20 bytes of index (offset + time) per 4 KiB of log, 0.5 %.
pub const INDEX_INTERVAL_BYTES_DEFAULT: u32 = 4096;
/// Largest interval: past 1 MiB a read would scan more than it returns for small messages.
pub const INDEX_INTERVAL_BYTES_MAX: u32 = 1024 * 1024;

/// Configuration of one partition log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// A segment is closed and a new one started before an append would make it larger than
    /// this. Whole segments are the unit of retention, so this is also its granularity.
    pub segment_bytes_max: u64,
    /// A segment is closed before an append whose timestamp is this much later than the segment's
    /// first entry, so that retention by age is not held back by a segment that never fills.
    pub segment_age_ms_max: u64,
    /// An index point is written for the first entry at least this many bytes after the previous
    /// point: it bounds how far a read scans from the point it seeks to.
    pub index_interval_bytes: u32,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes_max: SEGMENT_BYTES_DEFAULT,
            segment_age_ms_max: SEGMENT_AGE_MS_DEFAULT,
            index_interval_bytes: INDEX_INTERVAL_BYTES_DEFAULT,
        }
    }
}

impl LogConfig {
    /// Refuses settings the format cannot honour, naming the setting and its bounds.
    pub fn validate(&self) -> Result<(), LogError> {
        if self.segment_bytes_max < ENTRY_HEADER_BYTES as u64
            || self.segment_bytes_max > SEGMENT_BYTES_CEILING
        {
            return Err(LogError::Config(format!(
                "segment_bytes_max is {}, it must be {ENTRY_HEADER_BYTES}..={SEGMENT_BYTES_CEILING}",
                self.segment_bytes_max
            )));
        }
        if self.segment_age_ms_max == 0 {
            return Err(LogError::Config(
                "segment_age_ms_max must be positive".to_string(),
            ));
        }
        if self.index_interval_bytes == 0 || self.index_interval_bytes > INDEX_INTERVAL_BYTES_MAX {
            return Err(LogError::Config(format!(
                "index_interval_bytes is {}, it must be 1..={INDEX_INTERVAL_BYTES_MAX}",
                self.index_interval_bytes
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bounds_are_enforced() {
        LogConfig::default().validate().unwrap();
        let bad = [
            LogConfig {
                segment_bytes_max: 1,
                ..LogConfig::default()
            },
            LogConfig {
                segment_bytes_max: SEGMENT_BYTES_CEILING + 1,
                ..LogConfig::default()
            },
            LogConfig {
                segment_age_ms_max: 0,
                ..LogConfig::default()
            },
            LogConfig {
                index_interval_bytes: 0,
                ..LogConfig::default()
            },
        ];
        for config in bad {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains("must be"), "{err}");
        }
    }
}
