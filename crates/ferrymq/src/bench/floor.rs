//! `--fsync-floor DIR`: what the disk itself costs a durable publish, measured in the same run.
//!
//! Before the load starts, one thread appends writes of one publish's log bytes (the entries a
//! PUBLISH frame of `--batch` messages of `--size` bytes becomes) to a fresh file in DIR and
//! `fdatasync`s after each, as the broker's group commit does for a lone publish. DIR should be
//! on the broker's data directory's file system (the data directory itself will do). The file is
//! removed afterwards. FerryMQ's p99 is then printed against this floor's.
//!
//! A message's latency is weighted by time, a fsync's is not: one fdatasync that stalls for
//! 20 ms holds up 200 messages at 10 k msg/s but counts once among thousands of fsyncs. So the
//! floor is also given as a group commit over the same series of fdatasyncs would see it: a
//! message arriving during one fdatasync waits for the rest of it and then all of the next (the
//! best a broker running one sync at a time can do on this disk).

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
/// Arrivals of the group-commit model are taken this far apart, in nanoseconds (10 µs: the
/// interval between messages at 100 k msg/s).
const ARRIVAL_STEP_NS: u64 = 10_000;

/// The floor: each append + fdatasync on its own, and as the messages of a group commit over the
/// same series see it (see the module doc). Nanoseconds.
pub(super) struct Floor {
    pub fsyncs: Histogram<u64>,
    pub group_commit: Histogram<u64>,
}

/// Appends `write_bytes` and fdatasyncs, in a loop, and returns the floor.
pub(super) fn measure(dir: &Path, write_bytes: usize) -> anyhow::Result<Floor> {
    let path = dir.join(format!(".ferrymq-bench-fsync-floor-{}", std::process::id()));
    let result = measure_into(&path, write_bytes);
    let _ = std::fs::remove_file(&path);
    let durations = result?;
    let mut fsyncs = new_histogram()?;
    for &d in &durations {
        fsyncs.saturating_record(d);
    }
    Ok(Floor {
        fsyncs,
        group_commit: group_commit(&durations)?,
    })
}

/// What messages arriving every [`ARRIVAL_STEP_NS`] would wait under a group commit whose
/// fdatasyncs took `durations` one after the other: the rest of the one in progress, then the
/// next.
fn group_commit(durations: &[u64]) -> anyhow::Result<Histogram<u64>> {
    let mut histogram = new_histogram()?;
    for pair in durations.windows(2) {
        let (current, next) = (pair[0], pair[1]);
        let mut since = 0;
        while since < current {
            histogram.saturating_record(current - since + next);
            since += ARRIVAL_STEP_NS;
        }
    }
    Ok(histogram)
}

/// Each append + fdatasync's duration in nanoseconds, in order.
fn measure_into(path: &Path, write_bytes: usize) -> anyhow::Result<Vec<u64>> {
    let mut file = std::fs::OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(path)
        .with_context(|| format!("--fsync-floor cannot create {}", path.display()))?;
    let block = vec![0x5a_u8; write_bytes.max(1)];
    let mut durations = Vec::new();
    let started = Instant::now();
    for _ in 0..FLOOR_WRITES_MAX {
        if started.elapsed() >= FLOOR_DURATION {
            break;
        }
        let write = Instant::now();
        file.write_all(&block)
            .and_then(|_| file.sync_data())
            .with_context(|| format!("--fsync-floor cannot write {}", path.display()))?;
        durations.push(write.elapsed().as_nanos() as u64);
    }
    Ok(durations)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_measured_and_its_file_removed() {
        let dir = std::env::temp_dir().join(format!("ferrymq-floor-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let floor = measure(&dir, 160).unwrap();
        assert!(!floor.fsyncs.is_empty());
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "the file is gone"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_long_fsync_weighs_by_the_messages_it_holds_up() {
        // 199 fsyncs of 100 µs and one of 10 ms: 0.5 % of the fsyncs (their p99 is 100 µs), but
        // a third of the time, so a tenth of the messages wait more than 7 ms.
        let mut durations = vec![100_000; 200];
        durations[50] = 10_000_000;
        let model = group_commit(&durations).unwrap();
        assert_eq!(model.len(), 198 * 10 + 1_000);
        assert!(model.value_at_quantile(0.90) > 7_000_000);
        assert!(model.min() >= 100_000, "the next fsync is waited for too");
    }
}
