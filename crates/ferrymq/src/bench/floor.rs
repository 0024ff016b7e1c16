//! `--fsync-floor DIR`: what the disk itself costs a durable publish, measured in the same run.
//!
//! Before the load starts, one thread appends writes of one publish's log bytes (the entries a
//! PUBLISH frame of `--batch` messages of `--size` bytes becomes) to a fresh file in DIR and
//! `fdatasync`s after each, as the broker's group commit does for a lone publish. DIR should be
//! on the broker's data directory's file system (the data directory itself will do). The file is
//! removed afterwards. FerryMQ's p99 is then printed against this floor's.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;

use super::new_histogram;

/// How long the floor is measured: enough for a p99.9 of a few thousand fsyncs.
const FLOOR_DURATION: Duration = Duration::from_secs(3);
/// Most writes measured, whatever the disk's speed; bounds the file to this many writes.
const FLOOR_WRITES_MAX: u64 = 50_000;

/// Appends `write_bytes` and fdatasyncs, in a loop, and returns the histogram of each
/// write + fdatasync in nanoseconds.
pub(super) fn measure(dir: &Path, write_bytes: usize) -> anyhow::Result<Histogram<u64>> {
    let path = dir.join(format!(".ferrymq-bench-fsync-floor-{}", std::process::id()));
    let result = measure_into(&path, write_bytes);
    let _ = std::fs::remove_file(&path);
    result
}

fn measure_into(path: &Path, write_bytes: usize) -> anyhow::Result<Histogram<u64>> {
    let mut file = std::fs::OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(path)
        .with_context(|| format!("--fsync-floor cannot create {}", path.display()))?;
    let block = vec![0x5a_u8; write_bytes.max(1)];
    let mut histogram = new_histogram()?;
    let started = Instant::now();
    for _ in 0..FLOOR_WRITES_MAX {
        if started.elapsed() >= FLOOR_DURATION {
            break;
        }
        let write = Instant::now();
        file.write_all(&block)
            .and_then(|_| file.sync_data())
            .with_context(|| format!("--fsync-floor cannot write {}", path.display()))?;
        histogram.saturating_record(write.elapsed().as_nanos() as u64);
    }
    Ok(histogram)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_measured_and_its_file_removed() {
        let dir = std::env::temp_dir().join(format!("ferrymq-floor-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let histogram = measure(&dir, 160).unwrap();
        assert!(!histogram.is_empty());
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "the file is gone"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
