//! One partition of a topic: its in-memory log or tail, the disk log under it, the cursors of
//! the topic's subscriptions over it, and the one way to read a record by offset (from memory,
//! or below the tail from the files).
//!
//! Depends on the log, the disk layer and the cursor below it, and on nothing above: the topic
//! owns partitions and drives them, never the reverse.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use bytes::Bytes;
use ferrymq_protocol::RecordSpan;
use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::cursor::Cursor;
use crate::disk::{AppliedFsync, DiskConfig, DiskLog, DiskShared, SyncEnd, Waiter};
use crate::error::BrokerError;
use crate::log::{MemoryLog, Stored};

pub(crate) struct PartitionState {
    /// A memory topic's messages; a disk topic's in-memory tail of delivered-ready records (the
    /// rest is read from `disk`). Its end is where delivery stops.
    pub log: MemoryLog,
    /// One cursor per subscription of the topic.
    pub cursors: Vec<Cursor>,
    /// The durable log of a disk topic's partition.
    pub disk: Option<DiskLog>,
    /// Disk topics: every offset below this was synced (or found on disk at start).
    pub durable_next: u64,
    /// Messages and bytes published to this partition. Counted under the partition's lock that
    /// the publish holds anyway, rather than in topic-wide atomics that every core's publishes
    /// would contend for.
    pub messages_in: u64,
    pub bytes_in: u64,
    /// A memory topic with the stream retention policy: settled messages stay until the limits
    /// drop them.
    pub keep_settled: bool,
}

impl PartitionState {
    pub fn cursor_mut(&mut self, sub_id: u64) -> Option<&mut Cursor> {
        self.cursors.iter_mut().find(|c| c.sub_id == sub_id)
    }

    pub fn cursor(&self, sub_id: u64) -> Option<&Cursor> {
        self.cursors.iter().find(|c| c.sub_id == sub_id)
    }

    /// Frees every message all subscriptions have settled. Without subscriptions the log keeps
    /// messages up to the topic's limits, for a later subscription that starts at `earliest`.
    /// (A disk topic frees only its in-memory tail here; its files go by retention.)
    pub fn trim_settled(&mut self) {
        if self.keep_settled {
            return;
        }
        if let Some(min_floor) = self.cursors.iter().map(Cursor::floor).min() {
            self.trim_log_to(min_floor);
        }
    }

    /// Drops the in-memory entries below `offset`; for a disk partition (whose files keep them)
    /// this only frees its tail, and the broker's count of tail bytes follows.
    pub fn trim_log_to(&mut self, offset: u64) {
        let before = self.log.bytes();
        self.log.trim_to(offset);
        if let Some(disk) = &self.disk {
            disk.tail_bytes()
                .fetch_sub(before - self.log.bytes(), Relaxed);
        }
    }

    /// Messages and bytes the partition retains: in memory, or in its log files.
    pub fn retained(&self) -> (u64, u64) {
        match &self.disk {
            Some(disk) => match disk.open_log() {
                Some(log) => (log.next_offset() - log.start_offset(), log.size_bytes()),
                // Closed for a reopen: what it held when last seen.
                None => (
                    self.log.next_offset().saturating_sub(disk.start_offset()),
                    0,
                ),
            },
            None => (self.log.len(), self.log.bytes()),
        }
    }

    /// The lowest offset a new subscription can start at. For a disk partition whose log is
    /// closed for a reopen, where it started when last seen (never the in-memory tail's head).
    pub fn first_offset(&self) -> u64 {
        match &self.disk {
            Some(disk) => disk
                .open_log()
                .map_or(disk.start_offset(), |log| log.start_offset())
                .min(self.log.next_offset()),
            None => self.log.head(),
        }
    }

    /// The first offset at or after `timestamp_ms`, up to the delivered end.
    pub fn offset_for_time(&self, timestamp_ms: u64) -> Result<u64, BrokerError> {
        match &self.disk {
            Some(disk) => Ok(disk
                .log()?
                .offset_for_time(timestamp_ms)
                .map_err(|e| BrokerError::Storage(e.to_string()))?
                .min(self.log.next_offset())),
            None => Ok(self.log.offset_for_time(timestamp_ms)),
        }
    }
}

pub(crate) struct Partition {
    pub index: u32,
    pub state: Mutex<PartitionState>,
    /// Set while some cursor has pending timers, so the timer task skips idle partitions cheaply.
    pub timers_pending: AtomicBool,
    /// Disk topics with `fsync=interval`: set when a write is waiting for the next interval sync.
    pub sync_due: AtomicBool,
    /// Whether this node delivers the partition's messages and takes acks for them:
    /// [`SERVING_LOCAL`] for a partition of this node alone; for a replicated one, the leader
    /// term in which this node serves it, or [`SERVING_NONE`] while another replica does.
    pub serving: AtomicU64,
}

/// A partition that is this node's alone: always served.
pub(crate) const SERVING_LOCAL: u64 = u64::MAX;
/// A replicated partition that another replica serves.
pub(crate) const SERVING_NONE: u64 = 0;

impl Partition {
    /// Whether this node delivers the partition and takes its acks.
    pub fn is_serving(&self) -> bool {
        self.serving.load(Relaxed) != SERVING_NONE
    }

    /// Whether the partition is replicated, and served here.
    pub fn serving_replicated(&self) -> bool {
        !matches!(self.serving.load(Relaxed), SERVING_NONE | SERVING_LOCAL)
    }
}

/// Appends records to a partition's in-memory tail, counting their bytes in `tail_bytes`.
fn extend_tail(
    tail: &mut MemoryLog,
    records: impl Iterator<Item = (u64, Stored)>,
    tail_bytes: &AtomicU64,
) {
    let before = tail.bytes();
    for (offset, stored) in records {
        tail.append_at(offset, stored.timestamp_us, stored.record);
    }
    tail_bytes.fetch_add(tail.bytes() - before, Relaxed);
}

impl PartitionState {
    /// Moves the records a finished sync covers from `unsynced` to the tail: they are delivered
    /// (and their publishers acknowledged) from now on.
    ///
    /// The tail is not trimmed here but by the next publish ([`Self::trim_tail`]), so it may
    /// pass its bound by one group commit meanwhile. What a trim drops was allocated by the
    /// publishing workers; freed on a sync thread, every block would go back through the
    /// allocator's slow, locked path, while a worker that frees it gets it back for its next
    /// publish.
    pub(crate) fn durable_to(&mut self, covers: u64, tail_bytes: &AtomicU64) {
        let disk = self.disk.as_mut().expect("a disk partition");
        extend_tail(&mut self.log, disk.take_synced(covers), tail_bytes);
        self.durable_next = self.durable_next.max(covers);
    }

    /// Appends written records straight to the tail (fsync=interval or never).
    pub(crate) fn written_visible(
        &mut self,
        records: impl Iterator<Item = (u64, Stored)>,
        tail_bytes: &AtomicU64,
        config: &DiskConfig,
    ) {
        extend_tail(&mut self.log, records, tail_bytes);
        self.trim_tail(tail_bytes, config);
    }

    /// Keeps the in-memory tail within its bounds; what it drops is read from the files.
    pub(crate) fn trim_tail(&mut self, tail_bytes: &AtomicU64, config: &DiskConfig) {
        let limit = if tail_bytes.load(Relaxed) > config.tail_cache_budget_bytes {
            config.tail_cache_bytes_min
        } else {
            config.tail_cache_bytes
        };
        if self.log.bytes() <= limit {
            return;
        }
        let head = self.log.head_to_fit(u64::MAX, limit);
        self.trim_log_to(head);
    }

    /// After a reopen found the log ending at `next`: what was written beyond is gone.
    pub(crate) fn recovered_to(
        &mut self,
        next: u64,
        released: &mut Vec<(u64, u64)>,
        tail_bytes: &AtomicU64,
        config: &DiskConfig,
    ) {
        let visible = self.log.next_offset();
        if next < visible {
            tracing::error!(
                lost_from = next,
                lost_to = visible,
                "the reopened log ends before messages that were already delivered; they are lost"
            );
            let before = self.log.bytes();
            self.log.truncate_back(next);
            tail_bytes.fetch_sub(before - self.log.bytes(), Relaxed);
            for cursor in self.cursors.iter_mut() {
                let sub_id = cursor.sub_id;
                cursor.truncate_to(next, |consumer| released.push((sub_id, consumer)));
            }
            self.durable_next = next;
        }
        let disk = self.disk.as_mut().expect("a disk partition");
        let lost = disk.forget_unsynced_from(next);
        if lost > 0 {
            tracing::warn!(
                messages = lost,
                "written but unacknowledged messages were not in the reopened log; their publishers were told of the failure"
            );
        }
        // Everything the reopened log holds was synced by the reopen.
        self.durable_to(next.max(self.durable_next), tail_bytes);
        self.trim_tail(tail_bytes, config);
    }
}

/// A publish's working lists (records by partition, totals per partition, the locks it holds, the
/// offsets it gave), kept inline up to this many entries: a publish of a few messages to a topic
/// of a few partitions, as an HTTP request or a small client batch is, allocates none of them.
pub(crate) const PUBLISH_INLINE: usize = 4;

/// A publish's working list: see [`PUBLISH_INLINE`].
pub(crate) type Scratch<T> = SmallVec<[T; PUBLISH_INLINE]>;

/// One partition's share of a publish to a disk topic: see [`PartitionState::publish_to_disk`].
pub(crate) struct DiskBatch<'a> {
    pub topic: &'a str,
    pub partition: u32,
    /// The whole batch by partition; this partition's records are those routed to it.
    pub routed: &'a [(u32, RecordSpan)],
    pub bytes: &'a [u8],
    pub now_us: u64,
    /// This partition's records and bytes in the batch.
    pub total: (u64, u64),
    /// A reject-overflow topic's per-partition limits (messages, bytes).
    pub limits: Option<(u64, u64)>,
}

/// What one partition's share of a disk publish leaves to the topic.
pub(crate) struct DiskPublished {
    /// The offset given to the partition's first record.
    pub first: u64,
    /// The publisher's wait for the sync that covers the records (fsync=always).
    pub wait: Option<tokio::sync::oneshot::Receiver<Result<(), BrokerError>>>,
    /// Jobs for the sync threads to queue: a recovery of a failed log, a sync.
    pub queue_recovery: bool,
    pub queue_sync: bool,
    /// The records are visible to subscriptions now (fsync=interval or never).
    pub visible: bool,
    /// The write failed: what the publisher is told.
    pub error: Option<BrokerError>,
}

impl DiskPublished {
    /// The jobs to queue for the sync threads, in order: `true` a recovery, `false` a sync.
    pub(crate) fn sync_jobs(&self) -> impl Iterator<Item = bool> {
        let recovery = self.queue_recovery.then_some(true);
        let sync = self.queue_sync.then_some(false);
        recovery.into_iter().chain(sync)
    }
}

/// A publish to a disk partition.
impl PartitionState {
    /// Appends this partition's records of a batch to its log with one write. Under
    /// `fsync=always` they wait, unseen, for the sync that covers them; otherwise they are
    /// visible at once. A refusal (a failed log, a full reject-overflow partition) stores
    /// nothing.
    pub(crate) fn publish_to_disk(
        &mut self,
        batch: &DiskBatch<'_>,
        shared: &DiskShared,
        fsync: AppliedFsync,
    ) -> Result<DiskPublished, BrokerError> {
        // Under fsync=always the syncs move records into the tail and the publishers keep it
        // bounded (see `PartitionState::durable_to`).
        self.trim_tail(&shared.tail_bytes, &shared.config);
        let disk = self.disk.as_mut().expect("a disk partition");
        disk.check_append(batch.topic, batch.partition, batch.total, batch.limits)?;
        let spans: Scratch<RecordSpan> = batch
            .routed
            .iter()
            .filter(|(q, _)| *q == batch.partition)
            .map(|(_, span)| *span)
            .collect();
        // Timestamps never decrease within a partition, whatever the clock or the order in
        // which concurrent publishers took the lock.
        let ts = batch
            .now_us
            .max(self.log.last_timestamp_us())
            .max(disk.unsynced_timestamp_us());
        // The files keep milliseconds.
        let entries: Scratch<(u64, &[u8])> = spans
            .iter()
            .map(|span| (ts / 1000, &batch.bytes[span.start..span.end]))
            .collect();
        let appended = disk.append(batch.topic, batch.partition, &entries);
        let (first, end) = (appended.first, appended.end);
        let written = appended.records.into_iter().enumerate().map(|(i, record)| {
            (
                first + i as u64,
                Stored {
                    timestamp_us: ts,
                    record,
                },
            )
        });
        let mut published = DiskPublished {
            first,
            wait: None,
            queue_recovery: appended.wants_recovery,
            queue_sync: false,
            visible: false,
            error: appended.error,
        };
        match fsync {
            AppliedFsync::Always => {
                (published.wait, published.queue_sync) =
                    disk.keep_until_synced(written, (first, end));
            }
            AppliedFsync::Interval(_) | AppliedFsync::Never => {
                self.written_visible(written, &shared.tail_bytes, &shared.config);
                published.visible = true;
            }
        }
        self.messages_in += end - first;
        self.bytes_in += spans
            .iter()
            .take((end - first) as usize)
            .map(|span| (span.end - span.start) as u64)
            .sum::<u64>();
        Ok(published)
    }
}

impl Partition {
    pub(crate) fn new(
        index: u32,
        log: MemoryLog,
        disk: Option<DiskLog>,
        durable_next: u64,
        keep_settled: bool,
    ) -> Partition {
        Partition {
            index,
            state: Mutex::new(PartitionState {
                log,
                cursors: Vec::new(),
                disk,
                durable_next,
                messages_in: 0,
                bytes_in: 0,
                keep_settled,
            }),
            timers_pending: AtomicBool::new(false),
            sync_due: AtomicBool::new(false),
            serving: AtomicU64::new(SERVING_LOCAL),
        }
    }
}

/// What a group commit leaves to the topic once its last phase is done.
pub(crate) enum SyncOutcome {
    /// The log was closed meanwhile: nothing follows.
    Gone,
    /// The log failed; it wants recovery.
    Failed,
    /// Synced; `again` when writes that asked for a sync came in meanwhile.
    Synced { again: bool },
}

/// The group commit and the recovery of a disk partition, the parts that hold its lock.
impl PartitionState {
    /// The last phase of a group commit: what the fsync covers becomes visible, and the
    /// publishers it covers are moved to `covered`, to be answered after the lock is released.
    pub(crate) fn finish_sync(
        &mut self,
        done: ferrymq_storage::SyncDone,
        tail_bytes: &AtomicU64,
        covered: &mut Vec<Waiter>,
    ) -> SyncOutcome {
        let Some(disk) = self.disk.as_mut() else {
            return SyncOutcome::Gone;
        };
        let covers = match disk.finish_sync(done) {
            SyncEnd::Gone => return SyncOutcome::Gone,
            SyncEnd::Failed => return SyncOutcome::Failed,
            SyncEnd::Covered(covers) => covers,
        };
        // Healthy again only once new data reached the disk: a sync that found nothing to
        // write (one queued before a failure, run after the reopen) says nothing about whether
        // the disk takes writes.
        if covers > self.durable_next {
            disk.wrote_through();
        }
        self.durable_to(covers, tail_bytes);
        let durable = self.durable_next;
        let disk = self.disk.as_mut().expect("checked above");
        disk.take_covered_waiters(covers, covered);
        SyncOutcome::Synced {
            again: disk.wants_another_sync(durable),
        }
    }

    /// Reopens a failed log; what it holds becomes the partition's truth, and records written
    /// but lost are forgotten, and reported. True when it was reopened.
    pub(crate) fn recover(
        &mut self,
        released: &mut Vec<(u64, u64)>,
        tail_bytes: &AtomicU64,
        config: &DiskConfig,
    ) -> bool {
        let Some(next) = self
            .disk
            .as_mut()
            .and_then(|disk| disk.reopen_failed(config))
        else {
            return false;
        };
        self.recovered_to(next, released, tail_bytes, config);
        true
    }
}

/// Reads by offset: the in-memory log first, then the files below it.
impl PartitionState {
    /// The publish time and record of `offset`, from memory or the partition's files; `None`
    /// when it is no longer retained (or cannot be read now).
    pub(crate) fn stored_at(&self, offset: u64) -> Option<(u64, Bytes)> {
        self.read_stored(offset).ok().flatten()
    }

    /// [`PartitionState::stored_at`], with the read's error when the files fail (damage).
    pub(crate) fn read_stored(
        &self,
        offset: u64,
    ) -> Result<Option<(u64, Bytes)>, ferrymq_storage::LogError> {
        if let Some(stored) = self.log.get(offset) {
            return Ok(Some((stored.timestamp_ms(), stored.record.clone())));
        }
        let Some(log) = self.disk.as_ref().and_then(|d| d.open_log()) else {
            return Ok(None);
        };
        if offset < log.start_offset() || offset >= log.next_offset() {
            return Ok(None);
        }
        let entry = log.read(offset, 0, 1)?.into_iter().next();
        Ok(entry
            .filter(|e| e.offset == offset)
            .map(|e| (e.timestamp_ms, e.record)))
    }

    /// Reads the retained records from `from` up to `end` (exclusive): from the in-memory log,
    /// or below its head from the files. At most `records_max` records and about `bytes_max`
    /// bytes (the first record is always read, whatever its size); returns where to go on.
    pub(crate) fn read_records(
        &self,
        from: u64,
        end: u64,
        (records_max, bytes_max): (usize, usize),
        out: &mut Vec<(u64, Bytes)>,
    ) -> Result<u64, BrokerError> {
        let mut next = from.max(self.first_offset());
        let end = end.min(self.log.next_offset());
        let mut bytes = 0usize;
        while next < end && out.len() < records_max && bytes < bytes_max {
            if let Some(stored) = self.log.get(next) {
                bytes += stored.record.len();
                out.push((next, stored.record.clone()));
                next += 1;
                continue;
            }
            let Some(disk) = &self.disk else {
                // Not retained (cannot happen above the first offset); nothing to select.
                next += 1;
                continue;
            };
            let log = disk.log()?;
            let count = (records_max - out.len()).min((end - next) as usize);
            let entries = log
                .read(next, bytes_max - bytes, count)
                .map_err(|e| BrokerError::Storage(e.to_string()))?;
            if entries.is_empty() {
                break;
            }
            for entry in entries {
                if entry.offset >= end {
                    break;
                }
                bytes += entry.record.len();
                next = entry.offset + 1;
                out.push((entry.offset, entry.record));
            }
        }
        Ok(next.max(from))
    }
}
