//! Per-stage latency histograms of the publish and delivery paths, process-wide, so that a slow
//! message can be attributed to the stage that made it slow (`/metrics` exposes them as
//! `ferrymq_stage_latency_seconds{stage=...}`; `ferrymq bench --breakdown` summarises them).
//!
//! A stage is timed once per frame, sync or commit, never per message: a batch of 1 000 costs the
//! same two clock reads as a batch of one. Recording is two relaxed atomic additions into fixed
//! buckets (the protocol's, see `ferrymq_protocol::latency_bucket`), with no lock and no
//! allocation, so it may run under the partition lock and on the sync threads alike.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ferrymq_protocol::{latency_bucket, Latency, LATENCY_BUCKETS};

/// A stage of the publish or delivery path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Decoding one request frame from the connection's read buffer.
    Decode,
    /// One publish call: routing to partitions and appending under the partition lock.
    Append,
    /// From the append to the covering fsync's completion, as the publisher's reply task sees
    /// it (its wake-up included): the whole wait of a publish under fsync=always.
    SyncWait,
    /// From a partition's sync being queued to a sync thread taking it up (the thread's wake-up
    /// included); a sync thread that chains its partition's next sync does not queue it.
    SyncQueue,
    /// One group commit on a sync thread: the deferred write and the fdatasync.
    Fsync,
    /// From the moment a subscription was told of new messages to its delivery task running.
    Wake,
    /// Encoding one DELIVER frame and handing it to the socket.
    DeliverWrite,
    /// Applying one ACK frame to the cursors.
    Ack,
    /// One commit of dirty cursors to the metadata store (redb, with its fsyncs).
    CursorCommit,
}

impl Stage {
    pub const ALL: [Stage; 9] = [
        Stage::Decode,
        Stage::Append,
        Stage::SyncWait,
        Stage::SyncQueue,
        Stage::Fsync,
        Stage::Wake,
        Stage::DeliverWrite,
        Stage::Ack,
        Stage::CursorCommit,
    ];

    /// The `stage` label in `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Decode => "decode",
            Stage::Append => "append",
            Stage::SyncWait => "sync_wait",
            Stage::SyncQueue => "sync_queue",
            Stage::Fsync => "fsync",
            Stage::Wake => "wake",
            Stage::DeliverWrite => "deliver_write",
            Stage::Ack => "ack",
            Stage::CursorCommit => "cursor_commit",
        }
    }
}

const STAGES: usize = Stage::ALL.len();

struct StageHistogram {
    counts: [AtomicU64; LATENCY_BUCKETS],
    sum_us: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: StageHistogram = StageHistogram {
    counts: [ZERO; LATENCY_BUCKETS],
    sum_us: ZERO,
};

static HISTOGRAMS: [StageHistogram; STAGES] = [EMPTY; STAGES];

/// Counts one value of `stage`, in microseconds.
#[inline]
pub fn record_us(stage: Stage, us: u64) {
    let histogram = &HISTOGRAMS[stage as usize];
    histogram.counts[latency_bucket(us)].fetch_add(1, Relaxed);
    histogram.sum_us.fetch_add(us, Relaxed);
}

/// Counts the time since `started` for `stage`.
#[inline]
pub fn record_since(stage: Stage, started: Instant) {
    record(stage, started.elapsed());
}

#[inline]
pub fn record(stage: Stage, elapsed: Duration) {
    record_us(stage, elapsed.as_micros().min(u64::MAX as u128) as u64);
}

/// Every stage's histogram as it stands, in [`Stage::ALL`]'s order.
pub fn snapshot() -> Vec<(Stage, Latency)> {
    Stage::ALL
        .iter()
        .map(|&stage| {
            let histogram = &HISTOGRAMS[stage as usize];
            let counts: Vec<u64> = histogram.counts.iter().map(|c| c.load(Relaxed)).collect();
            (
                stage,
                Latency::from_counts(&counts, histogram.sum_us.load(Relaxed)),
            )
        })
        .collect()
}

/// Microseconds since the first call in this process: a cheap timestamp that fits an atomic, for
/// stages that start on one thread and end on another (see [`Stage::Wake`]).
pub(crate) fn now_us() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_micros() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_their_stage_and_bucket() {
        let before = snapshot();
        record_us(Stage::CursorCommit, 1_500);
        record(Stage::CursorCommit, Duration::from_micros(1_500));
        let after = snapshot();
        let count = |s: &[(Stage, Latency)], stage: Stage| {
            s.iter().find(|(x, _)| *x == stage).unwrap().1.count()
        };
        // Other tests may record concurrently (the histograms are process-wide), but never less.
        assert!(count(&after, Stage::CursorCommit) >= count(&before, Stage::CursorCommit) + 2);
        let commit = &after[Stage::CursorCommit as usize].1;
        assert!(commit
            .buckets
            .iter()
            .any(|&(bucket, n)| bucket as usize == latency_bucket(1_500) && n >= 2));
        assert_eq!(after.len(), Stage::ALL.len());
        for (i, (stage, _)) in after.iter().enumerate() {
            assert_eq!(*stage as usize, i, "ALL is in declaration order");
        }
    }
}
