//! Partition groups: each entry is one whole record batch; applying it gives the batch its
//! offsets.
//!
//! The ack point of a publish is the commit of its batch: `client_write` returns only after the
//! entry is committed (stored by a majority of the group) and applied by the leader, and the
//! response carries the [`OffsetRange`] the batch was given.
//!
//! Invariants:
//! - offsets are dense and start at 0: a batch of `n` records applied when the log ends at `o`
//!   gets `o..=o+n-1`, and the log then ends at `o+n`;
//! - every replica applies the same entries in the same order, so every replica gives every
//!   batch the same offsets;
//! - [`PartitionLog`] only ever holds committed batches, so it is never asked to forget one:
//!   every replica's log is a prefix of every other's, less what retention dropped at the head.
//!
//! Compaction: a group whose log is durable ([`PartitionLog::is_durable`]) snapshots without
//! copying its batches. The snapshot keeps where the applied log ends and the merged cursor state
//! ([`PartitionImage`]) once the log has synced what it applied; the Raft log below it is purged,
//! so a body stays on disk once per node. A replica too far behind for the remaining Raft log is
//! sent the image with the batches the leader's log still retains
//! ([`PartitionState::install`]).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

/// A batch of records as the producer sent it: opaque bytes and how many records they hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordBatch {
    /// How many records the payload holds; each gets one offset.
    pub record_count: u32,
    /// The encoded records; never looked into here.
    #[serde(with = "as_bytes")]
    pub payload: Vec<u8>,
}

/// A payload as one byte string rather than a sequence of numbers: bincode then copies it whole
/// instead of visiting every byte (which took a third of a leader's time), with the same bytes
/// on the wire and on disk as before.
pub(crate) mod as_bytes {
    use serde::de::{SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        deserializer.deserialize_byte_buf(BytesVisitor)
    }

    struct BytesVisitor;

    impl<'de> Visitor<'de> for BytesVisitor {
        type Value = Vec<u8>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("bytes")
        }

        fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }

        fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(v)
        }

        // Self-describing formats (the JSON of a snapshot) write bytes as a list of numbers.
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 20));
            while let Some(b) = seq.next_element::<u8>()? {
                out.push(b);
            }
            Ok(out)
        }
    }
}

/// A change to a partition's state beside its log, as opaque bytes: the broker's subscription
/// cursors. Every replica applies it in log order, between the batches around it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateUpdate {
    /// The encoded change; never looked into here.
    #[serde(with = "as_bytes")]
    pub payload: Vec<u8>,
}

/// Offsets given to one batch, both ends inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffsetRange {
    /// The first record's offset.
    pub first: u64,
    /// The last record's offset.
    pub last: u64,
}

/// A committed batch as the partition log keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredBatch {
    /// The offsets the batch was given.
    pub offsets: OffsetRange,
    /// The batch.
    pub batch: RecordBatch,
}

/// Why a batch was refused. Decided by the state machine alone, so every replica agrees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum PartitionError {
    /// A batch must hold at least one record.
    #[error("a record batch must hold at least one record")]
    EmptyBatch,
}

/// An I/O failure of a [`PartitionLog`]; fatal to the group on this node.
#[derive(Debug, thiserror::Error)]
#[error("partition log: {0}")]
pub struct PartitionLogError(pub String);

/// Resolves once what a [`PartitionLog`] held when it was made is on disk.
pub type Synced = Pin<Box<dyn Future<Output = Result<(), PartitionLogError>> + Send>>;

/// Where a partition group keeps its committed batches: the broker's segmented log on a node,
/// [`MemPartitionLog`] in tests and the simulation.
pub trait PartitionLog: Send + Sync + 'static {
    /// The offset the next record will get (0 for an empty log).
    fn next_offset(&self) -> u64;

    /// The first offset the log still holds (retention drops the oldest); `next_offset` when it
    /// holds none.
    fn first_offset(&self) -> u64 {
        0
    }

    /// Appends a committed batch, giving it the next offsets.
    fn append_committed(&mut self, batch: RecordBatch) -> Result<OffsetRange, PartitionLogError>;

    /// Appends the records of `stored` from offset `from` on (`stored` starts before it: the
    /// log already holds its head). A log that cannot split a batch refuses.
    fn append_tail(&mut self, stored: StoredBatch, from: u64) -> Result<(), PartitionLogError> {
        if stored.offsets.first == from {
            return self.append_committed(stored.batch).map(|_| ());
        }
        Err(PartitionLogError(format!(
            "cannot split the batch at {:?} at offset {from}",
            stored.offsets
        )))
    }

    /// The batches holding offsets `from_offset..until`, at most `max_batches`, in order.
    fn read_range(
        &self,
        from_offset: u64,
        until: u64,
        max_batches: usize,
    ) -> Result<Vec<StoredBatch>, PartitionLogError>;

    /// Makes an empty log, or one that ends below `offset`, hold nothing and go on at `offset`:
    /// a replica sent a snapshot whose oldest retained offset its log does not reach.
    fn skip_to(&mut self, offset: u64) -> Result<(), PartitionLogError>;

    /// Whether the batches survive a restart of the node. Only then may the group compact its
    /// Raft log: a log that forgets would have nothing to rebuild from.
    fn is_durable(&self) -> bool {
        true
    }

    /// Starts a sync of everything appended so far; the future resolves once it is on disk.
    fn sync(&mut self) -> Synced {
        Box::pin(async { Ok(()) })
    }

    /// Applies a committed [`StateUpdate`]. A log that keeps no state beside its batches
    /// ignores it.
    fn apply_state(&mut self, update: &StateUpdate) -> Result<(), PartitionLogError> {
        let _ = update;
        Ok(())
    }

    /// The state beside the batches after every update applied so far, for a snapshot (opaque;
    /// empty for a log that keeps none).
    fn state_image(&self) -> Result<Vec<u8>, PartitionLogError> {
        Ok(Vec::new())
    }

    /// Takes back a [`Self::state_image`]: after a restart, or from a snapshot.
    fn restore_state(&mut self, image: &[u8]) -> Result<(), PartitionLogError> {
        let _ = image;
        Ok(())
    }
}

/// A partition's snapshot: where its applied log ends and the state beside it. Kept on the node
/// without batches (its log holds them); sent to a replica with the batches still retained.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionImage {
    /// The offset after the last batch applied.
    pub applied_next: u64,
    /// The first offset of `batches`: what the sender's log still retained.
    pub first: u64,
    /// [`PartitionLog::state_image`].
    #[serde(with = "as_bytes")]
    pub state: Vec<u8>,
    /// `first..applied_next`, when sent.
    pub batches: Vec<StoredBatch>,
}

/// A [`PartitionLog`] in memory. Not durable unless made with [`MemPartitionLog::durable`]
/// (the simulation keeps its handles across a node's restart, so it may compact).
///
/// Its state beside the batches models the broker's cursors: a [`StateUpdate`] whose payload
/// is a key's length (one byte), the key and a value replaces that key's value, as a cursor
/// update replaces its subscription's cursor.
#[derive(Debug, Default)]
pub struct MemPartitionLog {
    batches: VecDeque<StoredBatch>,
    next_offset: u64,
    durable: bool,
    states: std::collections::BTreeMap<Vec<u8>, Vec<u8>>,
}

impl MemPartitionLog {
    /// A log that counts as durable: its owner keeps it across restarts.
    pub fn durable() -> Self {
        Self {
            durable: true,
            ..Self::default()
        }
    }
}

impl PartitionLog for MemPartitionLog {
    fn next_offset(&self) -> u64 {
        self.next_offset
    }

    fn append_committed(&mut self, batch: RecordBatch) -> Result<OffsetRange, PartitionLogError> {
        let count = u64::from(batch.record_count);
        if count == 0 {
            return Err(PartitionLogError("empty batch reached the log".into()));
        }
        let offsets = OffsetRange {
            first: self.next_offset,
            last: self.next_offset + count - 1,
        };
        self.next_offset += count;
        self.batches.push_back(StoredBatch { offsets, batch });
        Ok(offsets)
    }

    fn first_offset(&self) -> u64 {
        self.batches
            .front()
            .map_or(self.next_offset, |b| b.offsets.first)
    }

    fn read_range(
        &self,
        from_offset: u64,
        until: u64,
        max_batches: usize,
    ) -> Result<Vec<StoredBatch>, PartitionLogError> {
        let start = self
            .batches
            .partition_point(|b| b.offsets.last < from_offset);
        Ok(self
            .batches
            .iter()
            .skip(start)
            .take_while(|b| b.offsets.first < until)
            .take(max_batches)
            .cloned()
            .collect())
    }

    fn skip_to(&mut self, offset: u64) -> Result<(), PartitionLogError> {
        if offset < self.next_offset {
            return Err(PartitionLogError(format!(
                "cannot skip back to {offset}: the log ends at {}",
                self.next_offset
            )));
        }
        self.batches.clear();
        self.next_offset = offset;
        Ok(())
    }

    fn is_durable(&self) -> bool {
        self.durable
    }

    fn apply_state(&mut self, update: &StateUpdate) -> Result<(), PartitionLogError> {
        let bytes = &update.payload;
        let key_len = usize::from(*bytes.first().unwrap_or(&0));
        let (Some(key), Some(value)) = (bytes.get(1..1 + key_len), bytes.get(1 + key_len..)) else {
            // Not in the keyed form: nothing to keep.
            return Ok(());
        };
        self.states.insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn state_image(&self) -> Result<Vec<u8>, PartitionLogError> {
        bincode::serialize(&self.states).map_err(|e| PartitionLogError(e.to_string()))
    }

    fn restore_state(&mut self, image: &[u8]) -> Result<(), PartitionLogError> {
        self.states = match image {
            // No state kept (as a log without state images gives).
            [] => Default::default(),
            bytes => bincode::deserialize(bytes).map_err(|e| PartitionLogError(e.to_string()))?,
        };
        Ok(())
    }
}

/// The replicated state of one partition: its committed log.
///
/// The log may outlive the state machine: the broker's log keeps its batches across a restart,
/// while the state machine starts empty and the group replays its Raft log from the start. So
/// `apply` counts the offsets each entry gets and stores a batch only where the log ends; a batch
/// the log already holds is answered with its offsets and not stored again.
pub struct PartitionState {
    log: Box<dyn PartitionLog>,
    /// The offset the next applied batch gets.
    applied_next: u64,
}

impl std::fmt::Debug for PartitionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionState")
            .field("next_offset", &self.log.next_offset())
            .finish()
    }
}

impl PartitionState {
    /// A partition kept in `log`.
    pub fn new(log: Box<dyn PartitionLog>) -> Self {
        Self {
            log,
            applied_next: 0,
        }
    }

    /// Applies one committed batch. The outer error is an I/O failure of the log; the inner one
    /// a refusal that every replica makes alike.
    pub fn apply(
        &mut self,
        batch: RecordBatch,
    ) -> Result<Result<OffsetRange, PartitionError>, PartitionLogError> {
        if batch.record_count == 0 {
            return Ok(Err(PartitionError::EmptyBatch));
        }
        let count = u64::from(batch.record_count);
        let first = self.applied_next;
        let wanted = OffsetRange {
            first,
            last: first + count - 1,
        };
        let stored_next = self.log.next_offset();
        if stored_next == first {
            let offsets = self.log.append_committed(batch)?;
            if offsets != wanted {
                return Err(PartitionLogError(format!(
                    "a batch applied at {wanted:?} was stored at {offsets:?}"
                )));
            }
        } else if stored_next < first + count {
            return Err(PartitionLogError(format!(
                "the partition log ends at {stored_next}, not where the batch at {first}..={} \
                 starts or beyond it",
                wanted.last
            )));
        }
        self.applied_next = wanted.last + 1;
        Ok(Ok(wanted))
    }

    /// Applies a committed state update (see [`PartitionLog::apply_state`]).
    pub fn apply_state(&mut self, update: &StateUpdate) -> Result<(), PartitionLogError> {
        self.log.apply_state(update)
    }

    /// The committed log, read-only.
    pub fn log(&self) -> &dyn PartitionLog {
        self.log.as_ref()
    }

    /// The offset after the last batch applied.
    pub fn applied_next(&self) -> u64 {
        self.applied_next
    }

    /// Every committed batch the log holds.
    pub fn all_batches(&self) -> Result<Vec<StoredBatch>, PartitionLogError> {
        self.log.read_range(0, u64::MAX, usize::MAX)
    }

    /// A snapshot of what is applied, without batches, and the sync that must finish before the
    /// snapshot may stand for them.
    pub fn checkpoint(&mut self) -> Result<(PartitionImage, Synced), PartitionLogError> {
        let image = PartitionImage {
            applied_next: self.applied_next,
            first: self.log.first_offset().min(self.applied_next),
            state: self.log.state_image()?,
            batches: Vec::new(),
        };
        Ok((image, self.log.sync()))
    }

    /// `image` with the batches of `image.first..image.applied_next` the log still retains, to
    /// send to a replica.
    pub fn with_batches(
        &self,
        image: &PartitionImage,
    ) -> Result<PartitionImage, PartitionLogError> {
        let first = self.log.first_offset().min(image.applied_next);
        let batches = self.log.read_range(first, image.applied_next, usize::MAX)?;
        Ok(PartitionImage {
            first: batches
                .first()
                .map_or(first, |b| b.offsets.first.max(first)),
            batches,
            ..image.clone()
        })
    }

    /// Takes back the state of a snapshot this node kept, after a restart: the log must hold
    /// every batch the snapshot covers (it was synced before the snapshot was kept).
    pub fn restore(&mut self, image: &PartitionImage) -> Result<(), PartitionLogError> {
        let stored_next = self.log.next_offset();
        if stored_next < image.applied_next {
            return Err(PartitionLogError(format!(
                "the partition log ends at {stored_next}, below the {} its snapshot covers: \
                 it lost synced data",
                image.applied_next
            )));
        }
        self.log.restore_state(&image.state)?;
        self.applied_next = image.applied_next;
        Ok(())
    }

    /// Installs a snapshot sent by another replica: the log takes the batches it lacks (skipping
    /// ahead when it does not reach the oldest one sent) and the state beside it.
    pub fn install(&mut self, image: PartitionImage) -> Result<Synced, PartitionLogError> {
        if self.log.next_offset() < image.first {
            self.log.skip_to(image.first)?;
        }
        for stored in image.batches {
            let next = self.log.next_offset();
            if stored.offsets.last < next {
                continue;
            }
            if stored.offsets.first > next {
                return Err(PartitionLogError(format!(
                    "a snapshot's batch at {:?} does not follow the log's end at {next}",
                    stored.offsets
                )));
            }
            self.log.append_tail(stored, next)?;
        }
        let stored_next = self.log.next_offset();
        if stored_next < image.applied_next {
            return Err(PartitionLogError(format!(
                "a snapshot up to offset {} left the log ending at {stored_next}",
                image.applied_next
            )));
        }
        self.log.restore_state(&image.state)?;
        self.applied_next = image.applied_next;
        Ok(self.log.sync())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(n: u32) -> RecordBatch {
        RecordBatch {
            record_count: n,
            payload: vec![n as u8],
        }
    }

    #[test]
    fn offsets_are_dense_and_reads_find_the_holding_batch() {
        let mut state = PartitionState::new(Box::<MemPartitionLog>::default());
        assert_eq!(
            state.apply(batch(3)).unwrap(),
            Ok(OffsetRange { first: 0, last: 2 })
        );
        assert_eq!(
            state.apply(batch(0)).unwrap(),
            Err(PartitionError::EmptyBatch)
        );
        assert_eq!(
            state.apply(batch(2)).unwrap(),
            Ok(OffsetRange { first: 3, last: 4 })
        );
        let read = state.log().read_range(4, u64::MAX, 10).unwrap();
        assert_eq!(read.len(), 1);
        assert_eq!(read[0].offsets.first, 3);
        assert_eq!(state.log().next_offset(), 5);
    }

    #[test]
    fn a_replay_over_a_log_that_kept_its_batches_stores_nothing_twice() {
        let mut first = PartitionState::new(Box::<MemPartitionLog>::default());
        first.apply(batch(2)).unwrap().unwrap();
        first.apply(batch(3)).unwrap().unwrap();
        let kept = first.all_batches().unwrap();
        let mut log = MemPartitionLog::default();
        for stored in &kept {
            log.append_committed(stored.batch.clone()).unwrap();
        }
        // A restart: a new state machine over the same log replays every entry, then goes on.
        let mut replay = PartitionState::new(Box::new(log));
        assert_eq!(
            replay.apply(batch(2)).unwrap(),
            Ok(OffsetRange { first: 0, last: 1 })
        );
        assert_eq!(
            replay.apply(batch(3)).unwrap(),
            Ok(OffsetRange { first: 2, last: 4 })
        );
        assert_eq!(replay.log().next_offset(), 5);
        assert_eq!(
            replay.apply(batch(1)).unwrap(),
            Ok(OffsetRange { first: 5, last: 5 })
        );
        assert_eq!(replay.log().next_offset(), 6);
        // A log that ends inside a batch is damage, not something to paper over.
        let mut short = MemPartitionLog::default();
        short.append_committed(batch(1)).unwrap();
        let mut broken = PartitionState::new(Box::new(short));
        assert!(broken.apply(batch(2)).is_err());
    }

    #[test]
    fn a_batch_encodes_as_before_and_reads_back_from_both_formats() {
        let batch = RecordBatch {
            record_count: 2,
            payload: vec![1, 2, 250],
        };
        let encoded = bincode::serialize(&batch).unwrap();
        // u32 count, u64 length, then the bytes: what a sequence of u8 was written as.
        assert_eq!(encoded, [2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 1, 2, 250]);
        assert_eq!(
            bincode::deserialize::<RecordBatch>(&encoded).unwrap(),
            batch
        );
        let json = serde_json::to_string(&batch).unwrap();
        assert_eq!(serde_json::from_str::<RecordBatch>(&json).unwrap(), batch);
    }

    #[test]
    fn an_image_installs_on_an_empty_a_short_and_a_full_log() {
        let mut leader = PartitionState::new(Box::new(MemPartitionLog::durable()));
        for n in [2, 1, 3] {
            leader.apply(batch(n)).unwrap().unwrap();
        }
        let (image, _) = leader.checkpoint().unwrap();
        assert_eq!((image.first, image.applied_next), (0, 6));
        assert!(image.batches.is_empty());
        leader.apply(batch(4)).unwrap().unwrap();
        // Sent later: only what the snapshot covers, not the batch applied since.
        let sent = leader.with_batches(&image).unwrap();
        assert_eq!(sent.batches.len(), 3);

        let mut empty = PartitionState::new(Box::<MemPartitionLog>::default());
        drop(empty.install(sent.clone()).unwrap());
        assert_eq!(empty.log().next_offset(), 6);
        assert_eq!(
            empty.apply(batch(4)).unwrap(),
            Ok(OffsetRange { first: 6, last: 9 })
        );
        assert_eq!(empty.all_batches().unwrap(), leader.all_batches().unwrap());

        let mut short = PartitionState::new(Box::<MemPartitionLog>::default());
        short.apply(batch(2)).unwrap().unwrap();
        drop(short.install(sent.clone()).unwrap());
        assert_eq!(short.all_batches().unwrap(), sent.batches);

        // A log that already holds more than the snapshot keeps it all.
        let mut ahead = PartitionState::new(Box::<MemPartitionLog>::default());
        for n in [2, 1, 3, 4] {
            ahead.apply(batch(n)).unwrap().unwrap();
        }
        drop(ahead.install(sent).unwrap());
        assert_eq!(ahead.log().next_offset(), 10);
        assert_eq!(ahead.applied_next(), 6);
    }

    #[test]
    fn a_log_below_the_senders_oldest_batch_skips_ahead_and_a_gap_is_refused() {
        let image = PartitionImage {
            applied_next: 8,
            first: 5,
            state: Vec::new(),
            batches: vec![StoredBatch {
                offsets: OffsetRange { first: 5, last: 7 },
                batch: batch(3),
            }],
        };
        let mut behind = PartitionState::new(Box::<MemPartitionLog>::default());
        behind.apply(batch(2)).unwrap().unwrap();
        drop(behind.install(image.clone()).unwrap());
        assert_eq!(behind.log().first_offset(), 5);
        assert_eq!(behind.log().next_offset(), 8);

        let gap = PartitionImage {
            batches: vec![StoredBatch {
                offsets: OffsetRange { first: 6, last: 7 },
                batch: batch(2),
            }],
            ..image
        };
        let mut fresh = PartitionState::new(Box::<MemPartitionLog>::default());
        assert!(fresh.install(gap).is_err());
    }

    #[test]
    fn a_restore_over_a_log_that_lost_synced_batches_is_refused() {
        let mut state = PartitionState::new(Box::<MemPartitionLog>::default());
        let image = PartitionImage {
            applied_next: 3,
            first: 0,
            state: Vec::new(),
            batches: Vec::new(),
        };
        assert!(state.restore(&image).is_err());
        state.apply(batch(3)).unwrap().unwrap();
        let mut again = PartitionState::new(Box::new({
            let mut log = MemPartitionLog::default();
            log.append_committed(batch(3)).unwrap();
            log
        }));
        again.restore(&image).unwrap();
        assert_eq!(
            again.apply(batch(1)).unwrap(),
            Ok(OffsetRange { first: 3, last: 3 })
        );
    }
}
