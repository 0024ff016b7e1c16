//! Topics: routing a publish to partitions, deduplication, retention, and the subscriptions a
//! topic wakes. Each partition's state is in `partition`.
//!
//! Lock order: a topic's `dedup` lock is taken before its partition locks, never after; a topic's
//! `subscriptions` lock may be taken before partition locks, never after; partition locks are
//! taken in ascending index order; no partition lock is held across an await or while taking the
//! broker's topic map.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};

use bytes::{Bytes, BytesMut};
use ferrymq_protocol::{
    Durability, OffsetRange, OverflowPolicy, RecordBatch, RecordSpan, SubscriptionStats,
    TopicConfig, TopicInfo, TopicStats,
};
use parking_lot::{Mutex, RwLock};
use smallvec::{smallvec, SmallVec};

use crate::clock::{unix_ms, unix_us};
use crate::config::MESSAGE_OVERHEAD_BYTES;
use crate::cursor::Cursor;
use crate::dedup::{
    DedupWindow, Seen, DEDUP_ID_BYTES_MAX, DEDUP_WINDOW_MS_DEFAULT, HEADER_DEDUP_ID,
};
use crate::disk::{AppliedFsync, DiskLog, DiskShared, FileLog, SyncTarget};
use crate::error::BrokerError;
use crate::keys::partition_for_key;
use crate::latency::Latencies;
use crate::log::MemoryLog;
use crate::partition::{DiskBatch, Partition, PartitionState, Scratch, SyncOutcome};
use crate::subscription::Subscription;

#[derive(Default)]
pub(crate) struct TopicCounters {
    pub messages_out: AtomicU64,
    pub bytes_out: AtomicU64,
    pub dropped: AtomicU64,
    pub publishers: AtomicU32,
    pub subscribers: AtomicU32,
}

/// A message given up, on its way to the dead-letter topic.
pub(crate) struct DeadLetter {
    pub topic: Arc<Topic>,
    pub partition: u32,
    pub sub_id: u64,
    pub offset: u64,
    pub attempts: u16,
    pub timestamp_ms: u64,
    pub record: Bytes,
    /// The consumer's reason, when it asked for the dead-lettering; else `max_attempts` ran out.
    pub reason: Option<String>,
    /// Why the consumer failed it last, when `max_attempts` ran out on a nack with a reason.
    pub nack_reason: Option<String>,
}

/// A named stream of messages split into partitions.
pub struct Topic {
    pub(crate) name: String,
    pub(crate) config: TopicConfig,
    pub(crate) partitions: Box<[Partition]>,
    /// Per-partition limits derived from the topic's limits.
    max_messages_per_partition: u64,
    max_bytes_per_partition: u64,
    round_robin: AtomicU32,
    pub(crate) subscriptions: RwLock<HashMap<String, Arc<Subscription>>>,
    /// Whether `subscriptions` is non-empty, written under its write lock: a publish to a topic
    /// nobody subscribes to skips the lock (shared by every core's publishes) to wake nobody.
    pub(crate) has_subscriptions: AtomicBool,
    pub(crate) counters: TopicCounters,
    pub(crate) deleted: AtomicBool,
    /// The disk side, for disk topics: the shared sync threads and the resolved policies.
    pub(crate) disk: Option<TopicDisk>,
    /// This topic's own handle, for jobs queued to the sync threads.
    self_ref: Weak<Topic>,
    /// As a dead-letter topic: which of its messages were requeued to their source.
    pub(crate) requeued: tokio::sync::Mutex<crate::requeue_ledger::Ledger>,
    /// Where messages given up go: the broker's dead-letter task.
    pub(crate) dead_letters: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<DeadLetter>>,
    /// The deduplication ids of the last window (`dedup.rs`).
    pub(crate) dedup: Arc<Mutex<DedupWindow>>,
}

pub(crate) struct TopicDisk {
    pub shared: Arc<DiskShared>,
    pub fsync: AppliedFsync,
    /// Messages older than this go (whole segments); `None`: no age limit.
    pub retention_ms: Option<u64>,
}

/// A wait for a partition's sync; `None` when nothing written waits for one.
pub type SyncWait = Option<tokio::sync::oneshot::Receiver<Result<(), BrokerError>>>;

/// A publish whose records are stored, with what still has to happen before it is acknowledged.
pub struct PublishPending {
    pub(crate) receipt: PublishReceipt,
    pub(crate) waits: Scratch<tokio::sync::oneshot::Receiver<Result<(), BrokerError>>>,
    /// The deduplication ids this publish entered, withdrawn if its sync fails.
    pub(crate) dedup_entered: Option<Box<crate::dedup::Entered>>,
    /// When the records were appended, for the sync wait's histogram (`stages`).
    pub(crate) appended: Option<std::time::Instant>,
}

impl PublishPending {
    /// A publish stored and acknowledged at once: nothing waits for a sync.
    fn stored(durability: Durability, ranges: SmallVec<[OffsetRange; 1]>) -> Self {
        PublishPending {
            receipt: PublishReceipt {
                durability,
                ranges,
                duplicates: Vec::new(),
            },
            waits: SmallVec::new(),
            dedup_entered: None,
            appended: None,
        }
    }

    /// What the publisher will be told once the sync is done: the offsets already given.
    pub fn receipt(&self) -> &PublishReceipt {
        &self.receipt
    }

    /// True when the receipt can be given at once (nothing waits for a sync).
    pub fn is_done(&self) -> bool {
        self.waits.is_empty()
    }

    /// Waits until the records are durable under the topic's fsync policy.
    pub async fn durable(self) -> Result<PublishReceipt, BrokerError> {
        let waited = !self.waits.is_empty();
        for wait in self.waits {
            let failed = match wait.await {
                Ok(Ok(())) => continue,
                Ok(Err(error)) => error,
                Err(_) => BrokerError::Storage(
                    "the partition was closed before the publish was synced".into(),
                ),
            };
            if let Some(entered) = self.dedup_entered {
                entered.withdraw();
            }
            return Err(failed);
        }
        if let (true, Some(appended)) = (waited, self.appended) {
            crate::stages::record_since(crate::stages::Stage::SyncWait, appended);
        }
        Ok(self.receipt)
    }
}

/// What a successful publish returns: the offsets given to the messages, in message order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishReceipt {
    pub durability: Durability,
    /// Inline for the usual publish, whose offsets make one range.
    pub ranges: SmallVec<[OffsetRange; 1]>,
    /// The indexes in the batch of the messages not stored because their deduplication id was
    /// seen within the window; their ids in `ranges` are those of the messages stored first.
    pub duplicates: Vec<usize>,
}

impl PublishReceipt {
    /// The `(partition, offset)` of each message, in publish order.
    pub fn ids(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.ranges
            .iter()
            .flat_map(|r| (r.offset..r.end()).map(move |o| (r.partition, o)))
    }
}

/// A batch's records with their partitions, in batch order, and the messages and bytes per
/// partition, indexed by partition.
type Routing = (Scratch<(u32, RecordSpan)>, Scratch<(u64, u64)>);

/// The one copy of a published batch that its stored records slice.
enum BatchCopy {
    /// All of it.
    Whole(Bytes),
    /// Only what its partitions keep.
    Cut(Survivors),
}

/// A batch cut to what its partitions keep (see [`Topic::batch_survivors`]).
struct Survivors {
    /// The records that stay, copied back to back.
    copy: Bytes,
    /// Per record of the batch, where it lies in `copy`; `None` if it goes at once.
    at: Vec<Option<(usize, usize)>>,
    /// Per partition, how many of its records in the batch go at once.
    dropped: Vec<u64>,
}

/// What becomes of one message of a replicated publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicatedFate {
    /// Stored: proposed to the partition's group.
    Store,
    /// Not stored: it repeats the message stored at this partition and offset.
    Duplicate(u32, u64),
    /// Not stored: it repeats the message at this index of the same batch.
    RepeatOf(usize),
}

/// The duplicates of a replicated publish's part, found before it is proposed.
#[derive(Debug)]
pub struct DedupCheck {
    /// Per message of the part, in order.
    pub fates: Vec<ReplicatedFate>,
    /// What is left to store; `None` when every message is a duplicate.
    pub kept: Option<RecordBatch>,
}

impl DedupCheck {
    /// Every message's (partition, offset) once the kept messages were stored from `first` in
    /// `partition`, and the indexes of the duplicates.
    pub fn ids(&self, partition: u32, first: u64) -> (Vec<(u32, u64)>, Vec<usize>) {
        let mut next = first;
        let mut all: Vec<(u32, u64)> = Vec::with_capacity(self.fates.len());
        let mut duplicates = Vec::new();
        for (index, fate) in self.fates.iter().enumerate() {
            match *fate {
                ReplicatedFate::Store => {
                    all.push((partition, next));
                    next += 1;
                }
                ReplicatedFate::Duplicate(p, offset) => {
                    duplicates.push(index);
                    all.push((p, offset));
                }
                ReplicatedFate::RepeatOf(i) => {
                    duplicates.push(index);
                    all.push(all[i]);
                }
            }
        }
        (all, duplicates)
    }
}

/// Each message's deduplication id, or `None` (no allocation) when no message of the batch has
/// one. An id must be 1 to [`DEDUP_ID_BYTES_MAX`] bytes.
fn dedup_ids(records: &RecordBatch) -> Result<Option<Vec<Option<Bytes>>>, BrokerError> {
    let bytes = records.bytes();
    let mut ids: Option<Vec<Option<Bytes>>> = None;
    for (index, span) in records.spans().enumerate() {
        let record = &bytes[span.start..span.end];
        let Some(id) = ferrymq_protocol::record_header(record, HEADER_DEDUP_ID) else {
            continue;
        };
        if id.is_empty() || id.len() > DEDUP_ID_BYTES_MAX {
            return Err(BrokerError::invalid(
                "dedup id",
                format!(
                    "message {index} has a {}-byte {HEADER_DEDUP_ID}: give 1 to {DEDUP_ID_BYTES_MAX} bytes",
                    id.len()
                ),
            ));
        }
        let ids = ids.get_or_insert_with(|| vec![None; records.count() as usize]);
        ids[index] = Some(bytes.slice_ref(id));
    }
    Ok(ids)
}

/// What becomes of one message of a batch with deduplication ids: `None` to store, or the
/// (partition, offset) it duplicates; a repeat of an id within the batch duplicates the batch's
/// first message with it (`Err` holds that message's index).
type Fate = Option<Result<(u32, u64), usize>>;

/// The fate of each message of a batch, by its deduplication id.
fn duplicate_fates(window: &DedupWindow, ids: &[Option<Bytes>]) -> Vec<Fate> {
    let mut first_in_batch: HashMap<&[u8], usize> = HashMap::new();
    let mut fate: Vec<Fate> = Vec::with_capacity(ids.len());
    for (index, id) in ids.iter().enumerate() {
        fate.push(match id {
            None => None,
            Some(id) => match window.get(id) {
                Some(seen) => Some(Ok((seen.partition, seen.offset))),
                None => match first_in_batch.get(id.as_ref()) {
                    Some(&first) => Some(Err(first)),
                    None => {
                        first_in_batch.insert(id.as_ref(), index);
                        None
                    }
                },
            },
        });
    }
    fate
}

/// The batch without its duplicates: the `stored_count` messages whose fate is to be stored.
fn without_duplicates(
    records: &RecordBatch,
    fate: &[Fate],
    stored_count: usize,
) -> Result<RecordBatch, BrokerError> {
    let bytes = records.bytes();
    let mut kept = BytesMut::new();
    for (span, f) in records.spans().zip(fate) {
        if f.is_none() {
            kept.extend_from_slice(&bytes[span.start..span.end]);
        }
    }
    RecordBatch::decode(stored_count as u32, kept.freeze())
        .map_err(|e| BrokerError::invalid("message", e.to_string()))
}

impl Topic {
    pub(crate) fn new(name: String, config: TopicConfig) -> Arc<Topic> {
        Self::build(name, config, None, Vec::new())
    }

    /// A disk topic over its opened partition logs (one per partition, in order).
    pub(crate) fn new_disk(
        name: String,
        config: TopicConfig,
        disk: TopicDisk,
        logs: Vec<(Result<FileLog, String>, std::path::PathBuf)>,
    ) -> Arc<Topic> {
        assert_eq!(logs.len(), config.partitions as usize);
        Self::build(name, config, Some(disk), logs)
    }

    fn build(
        name: String,
        config: TopicConfig,
        disk: Option<TopicDisk>,
        logs: Vec<(Result<FileLog, String>, std::path::PathBuf)>,
    ) -> Arc<Topic> {
        assert!(config.partitions >= 1 && config.max_messages >= 1 && config.max_bytes >= 1);
        let mut logs = logs.into_iter();
        let keep_settled =
            disk.is_none() && config.retention_policy == ferrymq_protocol::RetentionPolicy::Stream;
        let partitions = (0..config.partitions)
            .map(|index| {
                let (log, disk_log, durable_next) = partition_logs(disk.as_ref(), logs.next());
                Partition::new(index, log, disk_log, durable_next, keep_settled)
            })
            .collect();
        let n = config.partitions as u64;
        let dedup_window_ms = match config.dedup_window_ms {
            0 => DEDUP_WINDOW_MS_DEFAULT,
            ms => ms,
        };
        Arc::new_cyclic(|self_ref| Topic {
            name,
            max_messages_per_partition: config.max_messages.div_ceil(n),
            max_bytes_per_partition: config.max_bytes.div_ceil(n),
            config,
            partitions,
            round_robin: AtomicU32::new(0),
            subscriptions: RwLock::new(HashMap::new()),
            has_subscriptions: AtomicBool::new(false),
            counters: TopicCounters::default(),
            deleted: AtomicBool::new(false),
            self_ref: self_ref.clone(),
            dead_letters: std::sync::OnceLock::new(),
            requeued: Default::default(),
            // A disk topic's logs may hold ids from before the start; a memory topic starts empty.
            dedup: Arc::new(Mutex::new(DedupWindow::new(
                dedup_window_ms,
                disk.is_none(),
            ))),
            disk,
        })
    }

    pub fn is_disk(&self) -> bool {
        self.disk.is_some()
    }

    /// Hands messages given up to the broker's dead-letter task. Without one (a topic not owned
    /// by a running broker) they are settled where they are, and said so.
    pub(crate) fn send_dead_letters(&self, letters: Vec<DeadLetter>) {
        for letter in letters {
            let unsent = match self.dead_letters.get() {
                Some(tx) => tx.send(letter).err().map(|e| e.0),
                None => Some(letter),
            };
            if let Some(letter) = unsent {
                tracing::warn!(topic = %self.name, partition = letter.partition, offset = letter.offset,
                    "no dead-letter task: the message given up is dropped");
                let mut state = self.partitions[letter.partition as usize].state.lock();
                if let Some(cursor) = state.cursor_mut(letter.sub_id) {
                    cursor.settle_dead(
                        letter.offset,
                        unix_ms(),
                        "dropped: no dead-letter task",
                        None,
                    );
                }
                state.trim_settled();
            }
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn config(&self) -> &TopicConfig {
        &self.config
    }

    pub fn partition_count(&self) -> u32 {
        self.partitions.len() as u32
    }

    /// True once the topic was deleted; a handle to it accepts nothing more.
    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Relaxed)
    }

    /// Appends a validated batch, less the messages whose deduplication id the window holds.
    pub(crate) fn publish(
        &self,
        partition: Option<u32>,
        records: RecordBatch,
        body_bytes_max: u32,
    ) -> Result<PublishPending, BrokerError> {
        let Some(ids) = dedup_ids(&records)? else {
            return self.publish_stored(partition, records, body_bytes_max);
        };
        let mut window = self.dedup.lock();
        let now_ms = unix_ms();
        window.expire(now_ms);
        if !window.rebuilt {
            self.rebuild_dedup(&mut window, now_ms);
        }
        let fate = duplicate_fates(&window, &ids);
        let stored_count = fate.iter().filter(|f| f.is_none()).count();
        let mut pending = if stored_count == records.count() as usize {
            self.publish_stored(partition, records, body_bytes_max)?
        } else {
            let kept = without_duplicates(&records, &fate, stored_count)?;
            self.publish_stored(partition, kept, body_bytes_max)?
        };
        self.enter_dedup_ids(&mut window, &ids, &fate, &mut pending);
        Ok(pending)
    }

    /// Replication seam: which messages of `records` repeat a deduplication id the window holds
    /// (or one earlier in the batch); `None` when no message carries an id.
    pub(crate) fn replicated_duplicates(
        &self,
        records: &RecordBatch,
    ) -> Result<Option<DedupCheck>, BrokerError> {
        let Some(ids) = dedup_ids(records)? else {
            return Ok(None);
        };
        let mut window = self.dedup.lock();
        let now_ms = unix_ms();
        window.expire(now_ms);
        if !window.rebuilt {
            self.rebuild_dedup(&mut window, now_ms);
        }
        let fate = duplicate_fates(&window, &ids);
        drop(window);
        let stored_count = fate.iter().filter(|f| f.is_none()).count();
        let kept = match stored_count {
            0 => None,
            n if n == records.count() as usize => Some(records.clone()),
            n => Some(without_duplicates(records, &fate, n)?),
        };
        let fates = fate
            .into_iter()
            .map(|f| match f {
                None => ReplicatedFate::Store,
                Some(Ok((p, offset))) => ReplicatedFate::Duplicate(p, offset),
                Some(Err(first)) => ReplicatedFate::RepeatOf(first),
            })
            .collect();
        Ok(Some(DedupCheck { fates, kept }))
    }

    /// Enters the deduplication ids of a replicated batch stored at `first` in `partition`.
    fn note_replicated_ids(&self, partition: u32, records: &RecordBatch, first: u64) {
        let Ok(Some(ids)) = dedup_ids(records) else {
            return;
        };
        let mut window = self.dedup.lock();
        let stored_ms = unix_ms();
        for (index, id) in ids.into_iter().enumerate() {
            if let Some(id) = id {
                let seen = Seen {
                    partition,
                    offset: first + index as u64,
                    stored_ms,
                };
                window.insert(id, seen);
            }
        }
    }

    /// Stores `records` in `partition` as they are, without deduplication (the replication seam).
    pub(crate) fn publish_exact(
        &self,
        partition: u32,
        records: RecordBatch,
    ) -> Result<PublishPending, BrokerError> {
        let pending = self.publish_stored(Some(partition), records.clone(), u32::MAX)?;
        if let Some((_, first)) = pending.receipt.ids().next() {
            // Every replica learns the ids, so that the next leader recognises a retry.
            self.note_replicated_ids(partition, &records, first);
        }
        Ok(pending)
    }

    /// Enters the ids of the messages a publish stored into the window, and gives each
    /// duplicate in the receipt the id of the message it duplicates.
    fn enter_dedup_ids(
        &self,
        window: &mut DedupWindow,
        ids: &[Option<Bytes>],
        fate: &[Fate],
        pending: &mut PublishPending,
    ) {
        let stored: Vec<(u32, u64)> = pending.receipt.ids().collect();
        let stored_ms = unix_ms();
        let mut stored = stored.into_iter();
        let mut all: Vec<(u32, u64)> = Vec::with_capacity(fate.len());
        let mut duplicates = Vec::new();
        let mut originals: Scratch<(u32, u64)> = SmallVec::new();
        let mut entered = Vec::new();
        for (index, f) in fate.iter().enumerate() {
            match f {
                None => {
                    let (p, offset) = stored.next().expect("an id per stored message");
                    if let Some(id) = &ids[index] {
                        if !pending.waits.is_empty() {
                            entered.push((id.clone(), p, offset));
                        }
                        window.insert(
                            id.clone(),
                            Seen {
                                partition: p,
                                offset,
                                stored_ms,
                            },
                        );
                    }
                    all.push((p, offset));
                }
                Some(Ok(first)) => {
                    duplicates.push(index);
                    all.push(*first);
                    originals.push(*first);
                }
                Some(Err(first_index)) => {
                    duplicates.push(index);
                    all.push(all[*first_index]);
                }
            }
        }
        if !entered.is_empty() {
            pending.dedup_entered = Some(Box::new(crate::dedup::Entered {
                window: self.dedup.clone(),
                ids: entered,
            }));
        }
        if !duplicates.is_empty() {
            pending.receipt.ranges = OffsetRange::coalesce_into(all);
            pending.receipt.duplicates = duplicates;
        }
        self.wait_for_originals(&originals, pending);
    }

    /// A duplicate is answered no sooner than the message it repeats: under `fsync=always` a
    /// retry that arrives while the first publish still waits for its sync waits for the same
    /// sync, and fails with it (the first publish then takes its ids back, so the next retry is
    /// stored). Called under the dedup lock, which comes before the partition locks.
    fn wait_for_originals(&self, originals: &[(u32, u64)], pending: &mut PublishPending) {
        let Some(disk) = self.disk.as_ref() else {
            return;
        };
        if originals.is_empty() || !matches!(disk.fsync, AppliedFsync::Always) {
            return;
        }
        // Per partition, the last message repeated: a sync that covers it covers the others.
        let mut last: Scratch<(u32, u64)> = SmallVec::new();
        for &(p, offset) in originals {
            match last.iter_mut().find(|(q, _)| *q == p) {
                Some(entry) => entry.1 = entry.1.max(offset),
                None => last.push((p, offset)),
            }
        }
        for (p, offset) in last {
            let mut state = self.partitions[p as usize].state.lock();
            if offset < state.durable_next {
                continue;
            }
            let disk_log = state.disk.as_mut().expect("a disk partition");
            match disk_log.check_writable() {
                Ok(_) => pending.waits.push(disk_log.wait_for(offset + 1)),
                Err(error) => {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let _ = tx.send(Err(error));
                    pending.waits.push(rx);
                }
            }
        }
    }

    /// Reads the deduplication ids of the last window back from a disk topic's logs, once after
    /// the start: the logs are the record of what was stored, so nothing else needs saving.
    fn rebuild_dedup(&self, window: &mut DedupWindow, now_ms: u64) {
        let since_ms = now_ms.saturating_sub(window.window_ms);
        let mut found = 0usize;
        for partition in self.partitions.iter() {
            let state = partition.state.lock();
            let Some(log) = state.disk.as_ref().and_then(|d| d.open_log()) else {
                continue;
            };
            let mut next = match log.offset_for_time(since_ms) {
                Ok(offset) => offset.max(log.start_offset()),
                Err(error) => {
                    tracing::warn!(topic = %self.name, partition = partition.index, %error,
                        "cannot read the deduplication ids of the last window back; retries of messages stored before the start may be stored again");
                    continue;
                }
            };
            while next < log.next_offset() {
                let entries = match log.read(next, 4 << 20, 4096) {
                    Ok(entries) if !entries.is_empty() => entries,
                    Ok(_) => break,
                    Err(error) => {
                        tracing::warn!(topic = %self.name, partition = partition.index, %error,
                            "cannot read the deduplication ids of the last window back; retries of messages stored before the start may be stored again");
                        break;
                    }
                };
                for entry in &entries {
                    if entry.timestamp_ms < since_ms {
                        continue;
                    }
                    if let Some(id) =
                        ferrymq_protocol::record_header(&entry.record, HEADER_DEDUP_ID)
                    {
                        found += 1;
                        window.insert(
                            Bytes::copy_from_slice(id),
                            Seen {
                                partition: partition.index,
                                offset: entry.offset,
                                stored_ms: entry.timestamp_ms,
                            },
                        );
                    }
                }
                next = entries.last().expect("not empty").offset + 1;
            }
        }
        window.rebuilt = true;
        if found > 0 {
            tracing::info!(topic = %self.name, ids = found, "deduplication ids of the last window read back from the log");
        }
    }

    /// Appends a validated batch. All of it is stored or none: partitions are locked in index
    /// order and limits checked for every one before anything is appended.
    fn publish_stored(
        &self,
        partition: Option<u32>,
        records: RecordBatch,
        body_bytes_max: u32,
    ) -> Result<PublishPending, BrokerError> {
        let n = self.partition_count();
        if let Some(p) = partition {
            if p >= n {
                return Err(BrokerError::invalid(
                    "partition",
                    format!("{p} does not exist: topic '{}' has {n}", self.name),
                ));
            }
        }
        let durability = self
            .disk
            .as_ref()
            .map_or(Durability::Memory, |d| d.fsync.durability());
        if records.is_empty() {
            return Ok(PublishPending::stored(durability, SmallVec::new()));
        }
        let (routed, totals) = self.route(partition, &records, body_bytes_max)?;
        let touched: Scratch<u32> = (0..n).filter(|&p| totals[p as usize].0 > 0).collect();
        if self.disk.is_some() {
            return self.publish_disk(&touched, &totals, &routed, records.bytes(), durability);
        }
        self.publish_memory(&touched, &totals, &routed, records, durability)
    }

    /// A batch split by the partition each record goes to (as a publish would route it), in
    /// partition order, each part keeping its records' order.
    pub(crate) fn split(
        &self,
        partition: Option<u32>,
        records: &RecordBatch,
        body_bytes_max: u32,
    ) -> Result<Vec<(u32, RecordBatch)>, BrokerError> {
        let (routed, totals) = self.route(partition, records, body_bytes_max)?;
        let bytes = records.bytes();
        let mut parts = Vec::new();
        for (p, &(count, _)) in totals.iter().enumerate() {
            if count == 0 {
                continue;
            }
            let p = p as u32;
            if count == u64::from(records.count()) {
                parts.push((p, records.clone()));
                break;
            }
            let mut kept = BytesMut::new();
            for (_, span) in routed.iter().filter(|(to, _)| *to == p) {
                kept.extend_from_slice(&bytes[span.start..span.end]);
            }
            let part = RecordBatch::decode(count as u32, kept.freeze())
                .map_err(|e| BrokerError::invalid("message", e.to_string()))?;
            parts.push((p, part));
        }
        Ok(parts)
    }

    /// The offset the next message stored in `partition` gets.
    pub(crate) fn next_offset(&self, partition: u32) -> Option<u64> {
        let p = self.partitions.get(partition as usize)?;
        let state = p.state.lock();
        // Under fsync=always written records reach the in-memory tail only once synced: the
        // disk log's own end counts them.
        let next = state
            .disk
            .as_ref()
            .and_then(|disk| disk.next_offset())
            .unwrap_or_else(|| state.log.next_offset());
        Some(next)
    }

    /// Gives each record of a batch its partition: the one asked for, its key's, or the next in
    /// turn. Returns the records with their partitions in batch order, and the messages and
    /// bytes per partition, indexed by partition.
    fn route(
        &self,
        partition: Option<u32>,
        records: &RecordBatch,
        body_bytes_max: u32,
    ) -> Result<Routing, BrokerError> {
        let n = self.partition_count();
        let bytes = records.bytes();
        let mut routed: Scratch<(u32, RecordSpan)> =
            SmallVec::with_capacity(records.count() as usize);
        let mut totals: Scratch<(u64, u64)> = smallvec![(0, 0); n as usize];
        for (index, span) in records.spans().enumerate() {
            if span.body_len > body_bytes_max {
                return Err(BrokerError::MessageTooLarge {
                    index,
                    size: span.body_len,
                    max: body_bytes_max,
                });
            }
            let p = match (partition, span.key) {
                (Some(p), _) => p,
                (None, Some((start, end))) => partition_for_key(&bytes[start..end], n),
                (None, None) if n == 1 => 0,
                (None, None) => self.round_robin.fetch_add(1, Relaxed) % n,
            };
            let total = &mut totals[p as usize];
            total.0 += 1;
            total.1 += (span.end - span.start) as u64 + MESSAGE_OVERHEAD_BYTES;
            routed.push((p, span));
        }
        Ok((routed, totals))
    }

    /// The memory path of [`Topic::publish`]: the partitions the batch touches are locked in
    /// index order, their limits checked, then the records appended.
    fn publish_memory(
        &self,
        touched: &[u32],
        totals: &[(u64, u64)],
        routed: &[(u32, RecordSpan)],
        records: RecordBatch,
        durability: Durability,
    ) -> Result<PublishPending, BrokerError> {
        let n = self.partition_count();
        // One copy per batch: the stored records then pin exactly this allocation, not the
        // connection's read buffer they arrived in. Allocated and copied, like the other
        // buffers here, before the locks are taken, so that no other publisher waits for it.
        // A batch larger than a drop-oldest partition keeps is copied without the records the
        // limits drop at once, so the few it keeps do not pin all of it.
        let copy = match self.batch_survivors(totals, routed, records.bytes()) {
            Some(survivors) => BatchCopy::Cut(survivors),
            None => BatchCopy::Whole(match records.into_exact_bytes() {
                Ok(exact) => exact,
                Err(records) => Bytes::copy_from_slice(records.bytes()),
            }),
        };
        let mut ids: Scratch<(u32, u64)> = SmallVec::with_capacity(routed.len());
        let now = unix_us();
        // Position of each partition's guard in `guards`.
        let mut slot_of: Scratch<usize> = smallvec![usize::MAX; n as usize];
        for (i, &p) in touched.iter().enumerate() {
            slot_of[p as usize] = i;
        }
        let mut guards: Scratch<_> = touched
            .iter()
            .map(|&p| (p, self.partitions[p as usize].state.lock()))
            .collect();
        // Under the lock: a deletion empties the partitions under it after setting the flag.
        if self.deleted.load(Relaxed) {
            return Err(BrokerError::UnknownTopic(self.name.clone()));
        }
        self.check_limits(&guards, totals)?;
        let mut released = Vec::new();
        match copy {
            BatchCopy::Cut(survivors) => self.publish_survivors(
                &survivors,
                routed,
                &mut guards,
                &slot_of,
                now,
                &mut ids,
                &mut released,
            ),
            BatchCopy::Whole(owned) => {
                store_whole(owned, routed, &mut guards, &slot_of, now, &mut ids)
            }
        }
        for (_, state) in guards.iter_mut() {
            self.enforce_limits(state, &mut released);
        }
        drop(guards);
        self.release_consumers(&released);
        self.notify_subscriptions();
        Ok(PublishPending::stored(
            durability,
            OffsetRange::coalesce_into(ids),
        ))
    }

    /// Refuses a batch that a reject-overflow partition cannot take, before anything is
    /// stored: larger than the partition's limits, or more than it has room for now.
    fn check_limits(
        &self,
        guards: &[(u32, parking_lot::MutexGuard<'_, PartitionState>)],
        totals: &[(u64, u64)],
    ) -> Result<(), BrokerError> {
        let reject = self.config.overflow == OverflowPolicy::Reject;
        for (p, state) in guards.iter() {
            let (count, bytes) = totals[*p as usize];
            if reject
                && (count > self.max_messages_per_partition || bytes > self.max_bytes_per_partition)
            {
                return Err(BrokerError::LimitExceeded(format!(
                    "batch of {count} messages / {bytes} bytes exceeds the per-partition limits of topic '{}' ({} messages, {} bytes)",
                    self.name, self.max_messages_per_partition, self.max_bytes_per_partition
                )));
            }
            let over_messages =
                (state.log.len() + count).saturating_sub(self.max_messages_per_partition);
            let over_bytes =
                (state.log.bytes() + bytes).saturating_sub(self.max_bytes_per_partition);
            if (over_messages > 0 || over_bytes > 0) && reject {
                return Err(BrokerError::TopicFull {
                    topic: self.name.clone(),
                    reason: format!(
                        "partition {p} holds {} messages, {} bytes",
                        state.log.len(),
                        state.log.bytes()
                    ),
                });
            }
        }
        Ok(())
    }

    /// The disk path of [`Topic::publish`]: each partition's records are appended to its log with
    /// one write. Under `fsync=always` they wait, unseen, for the sync that covers them.
    ///
    /// A batch spread over several partitions is stored partition by partition: if a later
    /// partition's write fails, the earlier ones are kept (and delivered), and the publisher gets
    /// the error. A publisher that retries may then store those messages twice.
    fn publish_disk(
        &self,
        touched: &[u32],
        totals: &[(u64, u64)],
        routed: &[(u32, RecordSpan)],
        bytes: &[u8],
        durability: Durability,
    ) -> Result<PublishPending, BrokerError> {
        let disk = self.disk.as_ref().expect("a disk topic");
        let now_us = unix_us();
        let limits = (self.config.overflow == OverflowPolicy::Reject).then_some((
            self.max_messages_per_partition,
            self.max_bytes_per_partition,
        ));
        let mut first_offset: Scratch<u64> = smallvec![0; self.partitions.len()];
        let mut waits = SmallVec::new();
        let mut to_sync: Scratch<(u32, bool)> = SmallVec::new();
        let mut visible = false;
        let mut failure = None;
        for &p in touched {
            let partition = &self.partitions[p as usize];
            let batch = DiskBatch {
                topic: &self.name,
                partition: p,
                routed,
                bytes,
                now_us,
                total: totals[p as usize],
                limits,
            };
            let mut state = partition.state.lock();
            let mut published = match state.publish_to_disk(&batch, &disk.shared, disk.fsync) {
                Ok(published) => published,
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            };
            if published.visible {
                visible = true;
                if matches!(disk.fsync, AppliedFsync::Interval(_)) {
                    partition.sync_due.store(true, Relaxed);
                }
            }
            drop(state);
            waits.extend(published.wait.take());
            to_sync.extend(published.sync_jobs().map(|recover| (p, recover)));
            first_offset[p as usize] = published.first;
            if let Some(error) = published.error {
                failure = Some(error);
                break;
            }
        }
        for (p, recover) in to_sync {
            self.queue_disk_job(&disk.shared, p, recover);
        }
        if visible {
            self.notify_subscriptions();
        }
        if let Some(error) = failure {
            return Err(error);
        }
        let mut pending =
            PublishPending::stored(durability, offsets_in_order(routed, first_offset));
        pending.waits = waits;
        Ok(pending)
    }

    /// Deletes the segments of a disk partition that retention lets go: everything every
    /// subscription settled, messages past the age limit, and (drop-oldest topics) what exceeds
    /// the size and count limits. Returns the new first offset if it moved.
    pub(crate) fn apply_retention(&self, state: &mut PartitionState, now_ms: u64) -> Option<u64> {
        let min_floor = state.cursors.iter().map(Cursor::floor).min();
        let disk = self.disk.as_ref()?;
        let log = state.disk.as_mut()?.open_log_mut()?;
        let start = log.start_offset();
        let mut result = Ok(0);
        let work_queue =
            self.config.retention_policy == ferrymq_protocol::RetentionPolicy::WorkQueue;
        if let (Some(floor), true) = (min_floor, work_queue) {
            result = log.delete_segments_below(floor);
        }
        if let (Ok(_), Some(age)) = (&result, disk.retention_ms) {
            result = log.delete_segments_older_than(now_ms, age);
        }
        if self.config.overflow == OverflowPolicy::DropOldest {
            if result.is_ok() && self.max_bytes_per_partition < u64::MAX {
                result = log.delete_segments_over_size(self.max_bytes_per_partition);
            }
            if result.is_ok() && self.max_messages_per_partition < u64::MAX {
                let keep_from = log
                    .next_offset()
                    .saturating_sub(self.max_messages_per_partition);
                result = log.delete_segments_below(keep_from);
            }
        }
        if let Err(error) = result {
            static SITE: std::sync::OnceLock<crate::throttle::LogThrottle> =
                std::sync::OnceLock::new();
            if let Some(skipped) = crate::throttle::throttled(&SITE) {
                tracing::warn!(topic = %self.name, %error, skipped, "retention could not delete a segment; retrying later");
            }
        }
        let new_start = log.start_offset();
        if let Some(disk) = state.disk.as_mut() {
            disk.retained_from(new_start);
        }
        (new_start > start).then_some(new_start)
    }

    /// Drops every message a partition retains: each subscription's cursor moves past them (its
    /// in-flight messages leave flight; `released` gets whose), the memory tail goes, and a disk
    /// partition deletes its segments. Returns how many messages it retained and the
    /// subscriptions whose cursor moved.
    pub(crate) fn purge_partition(
        &self,
        state: &mut PartitionState,
        released: &mut Vec<(u64, u64)>,
    ) -> Result<(u64, Vec<u64>), BrokerError> {
        let (retained, _) = state.retained();
        let end = state.log.next_offset();
        let mut moved = Vec::new();
        for cursor in state.cursors.iter_mut() {
            if cursor.floor() < end {
                let sub_id = cursor.sub_id;
                cursor.drop_below(end, |consumer| released.push((sub_id, consumer)));
                moved.push(sub_id);
            }
        }
        if let Some(disk) = state.disk.as_mut() {
            if let Some(log) = disk.open_log_mut() {
                log.delete_all_below(end).map_err(|error| {
                    BrokerError::Storage(format!(
                        "topic '{}': could not delete purged segments: {error}; the messages are \
                         no longer delivered and go by retention",
                        self.name
                    ))
                })?;
                let start = log.start_offset();
                disk.retained_from(start);
            }
        }
        state.trim_log_to(end);
        Ok((retained, moved))
    }

    /// Drop-oldest: discard from the head until the partition is within its limits again. Every
    /// message discarded counts in `dropped`, once, whether or not a subscription had received it
    /// (a topic with no subscription loses them all the same); in-flight ones leave flight.
    fn enforce_limits(&self, state: &mut PartitionState, released: &mut Vec<(u64, u64)>) {
        let new_head = state.log.head_to_fit(
            self.max_messages_per_partition,
            self.max_bytes_per_partition,
        );
        self.drop_below(state, new_head, released);
    }

    /// Drops the messages of a memory partition below `new_head`, which may lie beyond its end
    /// (offsets given to messages never stored): they count as dropped for the subscriptions
    /// that had not received them.
    fn drop_below(
        &self,
        state: &mut PartitionState,
        new_head: u64,
        released: &mut Vec<(u64, u64)>,
    ) {
        let head = state.log.head();
        if new_head <= head {
            return;
        }
        for cursor in state.cursors.iter_mut() {
            let sub_id = cursor.sub_id;
            cursor.drop_below(new_head, |consumer| released.push((sub_id, consumer)));
        }
        state.log.trim_to(new_head);
        self.counters.dropped.fetch_add(new_head - head, Relaxed);
    }

    /// For a drop-oldest batch that gives a partition more than it keeps: a copy of the records
    /// that stay, and how many of each partition's records go at once. `None` when every record
    /// stays, the usual case.
    ///
    /// What stays is what [`MemoryLog::head_to_fit`] would keep of the batch alone: the longest
    /// run of each partition's newest records within both limits. Everything older in that
    /// partition goes too, the messages it held before included.
    fn batch_survivors(
        &self,
        totals: &[(u64, u64)],
        routed: &[(u32, RecordSpan)],
        bytes: &[u8],
    ) -> Option<Survivors> {
        let (max_messages, max_bytes) = (
            self.max_messages_per_partition,
            self.max_bytes_per_partition,
        );
        if self.config.overflow != OverflowPolicy::DropOldest
            || !totals
                .iter()
                .any(|&(count, size)| count > max_messages || size > max_bytes)
        {
            return None;
        }
        // Newest first: per partition, what is kept so far, and whether it is full.
        let mut kept = vec![(0u64, 0u64, false); totals.len()];
        let mut dropped = vec![0u64; totals.len()];
        let mut keep = vec![false; routed.len()];
        let mut copy_len = 0;
        for (i, (p, span)) in routed.iter().enumerate().rev() {
            let (count, size, full) = &mut kept[*p as usize];
            let len = span.end - span.start;
            let with = *size + len as u64 + MESSAGE_OVERHEAD_BYTES;
            if *full || *count + 1 > max_messages || with > max_bytes {
                *full = true;
                dropped[*p as usize] += 1;
                continue;
            }
            (*count, *size) = (*count + 1, with);
            keep[i] = true;
            copy_len += len;
        }
        let mut copy = BytesMut::with_capacity(copy_len);
        let at = routed
            .iter()
            .zip(keep)
            .map(|((_, span), keep)| {
                keep.then(|| {
                    let start = copy.len();
                    copy.extend_from_slice(&bytes[span.start..span.end]);
                    (start, copy.len())
                })
            })
            .collect();
        Some(Survivors {
            copy: copy.freeze(),
            at,
            dropped,
        })
    }

    /// The append of a batch that [`Topic::batch_survivors`] cut: in each partition that loses
    /// records, everything below the first survivor is dropped first (the records that go are
    /// given their offsets but never stored), then the survivors are appended.
    #[allow(clippy::too_many_arguments)]
    fn publish_survivors(
        &self,
        survivors: &Survivors,
        routed: &[(u32, RecordSpan)],
        guards: &mut [(u32, parking_lot::MutexGuard<'_, PartitionState>)],
        slot_of: &[usize],
        now: u64,
        ids: &mut Scratch<(u32, u64)>,
        released: &mut Vec<(u64, u64)>,
    ) {
        // The next offset of each partition, stored or not.
        let mut next = vec![0u64; slot_of.len()];
        for (p, state) in guards.iter_mut() {
            next[*p as usize] = state.log.next_offset();
            let dropped = survivors.dropped[*p as usize];
            if dropped > 0 {
                let first_kept = state.log.next_offset() + dropped;
                self.drop_below(state, first_kept, released);
                state.log.skip_to(first_kept);
            }
        }
        for ((p, span), at) in routed.iter().zip(&survivors.at) {
            let state = &mut guards[slot_of[*p as usize]].1;
            state.messages_in += 1;
            state.bytes_in += (span.end - span.start) as u64;
            let offset = next[*p as usize];
            next[*p as usize] += 1;
            if let Some((start, end)) = *at {
                let ts = now.max(state.log.last_timestamp_us());
                // The log is empty at the first survivor (and starts there), dense after it.
                state
                    .log
                    .append_at(offset, ts, survivors.copy.slice(start..end));
            }
            ids.push((*p, offset));
        }
    }

    /// Lowers the in-flight counts of consumers whose messages left flight under a partition
    /// lock; called after that lock is released (lock order).
    pub(crate) fn release_consumers(&self, released: &[(u64, u64)]) {
        if released.is_empty() {
            return;
        }
        let subscriptions = self.subscriptions.read();
        for &(sub_id, consumer) in released {
            if let Some(s) = subscriptions.values().find(|s| s.id == sub_id) {
                s.consumer_released(consumer, 1);
            }
        }
    }

    pub(crate) fn notify_subscriptions(&self) {
        if !self.has_subscriptions.load(Relaxed) {
            return;
        }
        let now_us = crate::stages::now_us().max(1);
        for s in self.subscriptions.read().values() {
            s.woken_at_us.store(now_us, Relaxed);
            s.notify.notify_waiters();
        }
    }

    pub fn info(&self) -> TopicInfo {
        let (messages, bytes) = self.partitions.iter().fold((0, 0), |(m, b), p| {
            let (pm, pb) = p.state.lock().retained();
            (m + pm, b + pb)
        });
        let mut subscriptions: Vec<String> = self.subscriptions.read().keys().cloned().collect();
        subscriptions.sort();
        TopicInfo {
            name: self.name.clone(),
            config: self.config.clone(),
            messages,
            bytes,
            subscriptions,
        }
    }

    pub fn stats(&self) -> TopicStats {
        let c = &self.counters;
        let mut stats = TopicStats {
            name: self.name.clone(),
            messages_out: c.messages_out.load(Relaxed),
            bytes_out: c.bytes_out.load(Relaxed),
            dropped: c.dropped.load(Relaxed),
            publishers: c.publishers.load(Relaxed),
            subscribers: c.subscribers.load(Relaxed),
            ..Default::default()
        };
        let subs: Vec<Arc<Subscription>> = self.subscriptions.read().values().cloned().collect();
        let mut per_sub: Vec<SubscriptionStats> = subs.iter().map(|s| s.stats_counters()).collect();
        let mut latencies: Vec<Latencies> = subs.iter().map(|_| Latencies::default()).collect();
        for p in self.partitions.iter() {
            let state = p.state.lock();
            stats.messages_in += state.messages_in;
            stats.bytes_in += state.bytes_in;
            let (messages, bytes) = state.retained();
            stats.depth += messages;
            stats.depth_bytes += bytes;
            let log_next = state.log.next_offset();
            for ((s, out), latency) in subs.iter().zip(per_sub.iter_mut()).zip(&mut latencies) {
                if let Some(cursor) = state.cursor(s.id) {
                    out.backlog += cursor.backlog(log_next);
                    out.in_flight += cursor.in_flight();
                    cursor.latencies().add_into(latency);
                }
            }
        }
        for (out, latency) in per_sub.iter_mut().zip(&latencies) {
            out.deliver_latency = latency.deliver.to_latency();
            out.ack_latency = latency.ack.to_latency();
        }
        per_sub.sort_by(|a, b| a.name.cmp(&b.name));
        stats.subscriptions = per_sub;
        stats
    }
}

impl Topic {
    /// Takes the messages the cursors gave up since last asked, with their records (from the
    /// in-memory tail, or the files). One whose record cannot be read now is made ready again.
    pub(crate) fn take_dead_letters(
        self: &Arc<Self>,
        state: &mut PartitionState,
        partition: u32,
        reason: Option<&str>,
        out: &mut Vec<DeadLetter>,
    ) {
        for i in 0..state.cursors.len() {
            for crate::cursor::GivenUp { offset, attempts } in state.cursors[i].take_dead() {
                let stored = state.stored_at(offset);
                let cursor = &mut state.cursors[i];
                match stored {
                    Some((timestamp_ms, record)) => out.push(DeadLetter {
                        topic: self.clone(),
                        partition,
                        sub_id: cursor.sub_id,
                        offset,
                        attempts,
                        timestamp_ms,
                        record,
                        reason: reason.map(str::to_string),
                        nack_reason: None,
                    }),
                    None => {
                        static SITE: std::sync::OnceLock<crate::throttle::LogThrottle> =
                            std::sync::OnceLock::new();
                        if let Some(skipped) = crate::throttle::throttled(&SITE) {
                            tracing::warn!(topic = %self.name, partition, offset, skipped, "cannot read a message to dead-letter it now; it is delivered again");
                        }
                        cursor.revive_dead(offset);
                    }
                }
            }
        }
    }
}

/// The sync threads' work on this topic's partitions: the phases that hold a partition's lock
/// are the partition's; waking subscriptions and queueing the next job are the topic's.
impl SyncTarget for Topic {
    fn sync_partition(&self, shared: &DiskShared, index: u32) -> bool {
        let partition = &self.partitions[index as usize];
        let job = partition
            .state
            .lock()
            .disk
            .as_mut()
            .and_then(DiskLog::begin_sync);
        let Some(job) = job else {
            return false;
        };
        let started = std::time::Instant::now();
        let done = job.run();
        crate::stages::record_since(crate::stages::Stage::Fsync, started);
        let mut covered = Vec::new();
        let outcome = partition
            .state
            .lock()
            .finish_sync(done, &shared.tail_bytes, &mut covered);
        for (_, tx) in covered {
            let _ = tx.send(Ok(()));
        }
        match outcome {
            SyncOutcome::Gone => false,
            SyncOutcome::Synced { again } => {
                self.notify_subscriptions();
                again && self.sync_again(shared, partition)
            }
            SyncOutcome::Failed => {
                // Ask for recovery right away (it retries on the timer if the cause is still
                // there).
                let mut state = partition.state.lock();
                if let Some(disk) = state.disk.as_mut() {
                    if disk.want_recovery() {
                        drop(state);
                        self.queue_disk_job(shared, partition.index, true);
                    }
                }
                false
            }
        }
    }

    fn recover_partition(&self, shared: &DiskShared, index: u32) {
        let partition = &self.partitions[index as usize];
        let mut released = Vec::new();
        let recovered =
            partition
                .state
                .lock()
                .recover(&mut released, &shared.tail_bytes, &shared.config);
        if recovered {
            self.release_consumers(&released);
            self.notify_subscriptions();
        }
    }
}

impl Topic {
    /// After a sync, when writes asked for another: true when the calling sync thread is to run
    /// it now, else it was queued (or one is queued or running already).
    fn sync_again(&self, shared: &DiskShared, partition: &Partition) -> bool {
        let mut state = partition.state.lock();
        let Some(disk) = state.disk.as_mut() else {
            return false;
        };
        if !disk.claim_sync() {
            return false;
        }
        drop(state);
        if shared.may_continue() {
            return true;
        }
        self.queue_disk_job(shared, partition.index, false);
        false
    }

    /// Queues a sync or (`recover`) a recovery of one partition for the sync threads.
    /// Starts a sync of everything written to `partition` (see `Broker::sync_written`).
    pub(crate) fn sync_written(&self, partition: u32) -> Result<SyncWait, BrokerError> {
        let Some(disk) = self.disk.as_ref() else {
            return Ok(None);
        };
        let Some(p) = self.partitions.get(partition as usize) else {
            return Ok(None);
        };
        let mut state = p.state.lock();
        let durable_next = state.durable_next;
        let Some(disk_log) = state.disk.as_mut() else {
            return Ok(None);
        };
        if !disk_log.has_unsynced_writes(durable_next) {
            return Ok(None);
        }
        disk_log.check_writable()?;
        let end = disk_log.next_written();
        let wait = disk_log.wait_for(end);
        let queue = disk_log.want_sync();
        drop(state);
        if queue {
            self.queue_disk_job(&disk.shared, partition, false);
        }
        Ok(Some(wait))
    }

    fn queue_disk_job(&self, shared: &DiskShared, partition: u32, recover: bool) {
        // The topic is alive while a sync thread works on it: the upgrade only fails during
        // its drop, when nothing is left to sync.
        if let Some(me) = self.self_ref.upgrade() {
            if recover {
                shared.queue_recovery(&me, partition);
            } else {
                shared.queue_sync(&me, partition);
            }
        }
    }
}

/// A partition's in-memory log, disk log and durable end: over the log opened for it (a disk
/// topic's, or its reason for being damaged), or in memory only.
fn partition_logs(
    disk: Option<&TopicDisk>,
    opened: Option<(Result<FileLog, String>, std::path::PathBuf)>,
) -> (MemoryLog, Option<DiskLog>, u64) {
    match (disk, opened) {
        (Some(d), Some((Ok(log), dir))) => {
            let next = log.next_offset();
            (
                MemoryLog::starting_at(next),
                Some(DiskLog::new(d.shared.clone(), log, dir, d.fsync)),
                next,
            )
        }
        (Some(d), Some((Err(reason), dir))) => (
            MemoryLog::default(),
            Some(DiskLog::damaged(d.shared.clone(), dir, d.fsync, reason)),
            0,
        ),
        _ => (MemoryLog::default(), None, 0),
    }
}

/// The offsets of a batch's records, in batch order, given the first offset each partition
/// gave to its records.
fn offsets_in_order(
    routed: &[(u32, RecordSpan)],
    mut next: Scratch<u64>,
) -> SmallVec<[OffsetRange; 1]> {
    let ids = routed.iter().map(|(p, _)| {
        let offset = next[*p as usize];
        next[*p as usize] += 1;
        (*p, offset)
    });
    OffsetRange::coalesce_into(ids)
}

/// Appends the records of a batch kept whole: each is a slice of the batch's one copy.
fn store_whole(
    owned: Bytes,
    routed: &[(u32, RecordSpan)],
    guards: &mut [(u32, parking_lot::MutexGuard<'_, PartitionState>)],
    slot_of: &[usize],
    now: u64,
    ids: &mut Scratch<(u32, u64)>,
) {
    let mut store = |p: u32, span: &RecordSpan, record: Bytes| {
        let state = &mut guards[slot_of[p as usize]].1;
        state.messages_in += 1;
        state.bytes_in += (span.end - span.start) as u64;
        let ts = now.max(state.log.last_timestamp_us());
        ids.push((p, state.log.append(ts, record)));
    };
    match routed {
        // A batch of one record (an HTTP publish) is stored as the copy itself: a slice would
        // share the copy, and sharing it the first time allocates.
        [(p, span)] => {
            debug_assert_eq!((span.start, span.end), (0, owned.len()));
            store(*p, span, owned)
        }
        many => {
            for (p, span) in many {
                store(*p, span, owned.slice(span.start..span.end));
            }
        }
    }
}

/// A partition that refuses writes or failed its last one: its log failed (a full disk, an I/O
/// error) and is reopened automatically, and healthy again once a write reaches the disk; or it
/// was found damaged at start and waits for its operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionFault {
    pub topic: String,
    pub partition: u32,
    /// Found damaged at start: out of service until repaired and the broker restarted.
    pub damaged: bool,
    pub reason: String,
}

impl Topic {
    /// This topic's partitions that refuse writes now, or failed their last one.
    pub fn faults(&self) -> Vec<PartitionFault> {
        let mut faults = Vec::new();
        for (index, p) in self.partitions.iter().enumerate() {
            let state = p.state.lock();
            if let Some(disk) = &state.disk {
                if let Some(reason) = disk.fault() {
                    faults.push(PartitionFault {
                        topic: self.name.clone(),
                        partition: index as u32,
                        damaged: disk.is_damaged(),
                        reason: reason.to_string(),
                    });
                }
            }
        }
        faults
    }
}

/// Counts a publisher as connected to a topic while it lives.
pub struct PublisherGuard {
    topic: Arc<Topic>,
}

impl PublisherGuard {
    pub(crate) fn new(topic: Arc<Topic>) -> Self {
        topic.counters.publishers.fetch_add(1, Relaxed);
        PublisherGuard { topic }
    }
}

impl Drop for PublisherGuard {
    fn drop(&mut self) {
        self.topic.counters.publishers.fetch_sub(1, Relaxed);
    }
}

impl Topic {
    /// Adds a subscription to the map (the caller holds its write lock). Every subscription joins
    /// through here, those restored at start included: publishes wake subscriptions only when
    /// `has_subscriptions` is set, so a subscription added without it would sleep until another
    /// was created.
    pub(crate) fn insert_subscription(
        &self,
        subscriptions: &mut HashMap<String, Arc<Subscription>>,
        name: String,
        subscription: Arc<Subscription>,
    ) {
        subscriptions.insert(name, subscription);
        self.has_subscriptions.store(true, Relaxed);
    }

    /// Removes a subscription and its cursors, then frees what no remaining subscription needs.
    pub(crate) fn remove_subscription(&self, sub_id: u64, name: &str) {
        let mut subscriptions = self.subscriptions.write();
        if subscriptions.get(name).is_some_and(|s| s.id == sub_id) {
            subscriptions.remove(name);
            self.has_subscriptions
                .store(!subscriptions.is_empty(), Relaxed);
        }
        for partition in self.partitions.iter() {
            let mut state = partition.state.lock();
            state.cursors.retain(|c| c.sub_id != sub_id);
            state.trim_settled();
        }
    }
}
