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
//! - [`PartitionLog`] only ever holds committed batches, so it is never asked to forget one,
//!   except when a snapshot replaces the whole state.

use std::collections::VecDeque;

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
mod as_bytes {
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

/// Where a partition group keeps its committed batches. The seam for the broker's durable log.
///
/// The broker's segmented on-disk log is meant to implement this; [`MemPartitionLog`] is the
/// in-memory version used until then and by the simulation.
pub trait PartitionLog: Send + Sync + 'static {
    /// The offset the next record will get (0 for an empty log).
    fn next_offset(&self) -> u64;

    /// Appends a committed batch, giving it the next offsets.
    fn append_committed(&mut self, batch: RecordBatch) -> Result<OffsetRange, PartitionLogError>;

    /// Up to `max_batches` batches, the first one holding `from_offset` or starting after it.
    fn read_range(
        &self,
        from_offset: u64,
        max_batches: usize,
    ) -> Result<Vec<StoredBatch>, PartitionLogError>;

    /// Drops every batch whose offsets reach `from_offset` or beyond. Used only when a snapshot
    /// replaces the whole state; committed data is otherwise never dropped here.
    fn truncate(&mut self, from_offset: u64) -> Result<(), PartitionLogError>;

    /// Applies a committed [`StateUpdate`]. A log that keeps no state beside its batches
    /// ignores it.
    fn apply_state(&mut self, update: &StateUpdate) -> Result<(), PartitionLogError> {
        let _ = update;
        Ok(())
    }
}

/// A [`PartitionLog`] in memory.
#[derive(Debug, Default)]
pub struct MemPartitionLog {
    batches: VecDeque<StoredBatch>,
    next_offset: u64,
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

    fn read_range(
        &self,
        from_offset: u64,
        max_batches: usize,
    ) -> Result<Vec<StoredBatch>, PartitionLogError> {
        let start = self
            .batches
            .partition_point(|b| b.offsets.last < from_offset);
        Ok(self
            .batches
            .iter()
            .skip(start)
            .take(max_batches)
            .cloned()
            .collect())
    }

    fn truncate(&mut self, from_offset: u64) -> Result<(), PartitionLogError> {
        let keep = self
            .batches
            .partition_point(|b| b.offsets.last < from_offset);
        self.batches.truncate(keep);
        self.next_offset = self.batches.back().map_or(0, |b| b.offsets.last + 1);
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

    /// Every committed batch, for a snapshot.
    pub fn all_batches(&self) -> Result<Vec<StoredBatch>, PartitionLogError> {
        self.log.read_range(0, usize::MAX)
    }

    /// Replaces the whole state with `batches`, from a snapshot.
    pub fn replace(&mut self, batches: Vec<StoredBatch>) -> Result<(), PartitionLogError> {
        self.log.truncate(0)?;
        self.applied_next = 0;
        for stored in batches {
            let offsets = self.log.append_committed(stored.batch)?;
            self.applied_next = offsets.last + 1;
            if offsets != stored.offsets {
                return Err(PartitionLogError(format!(
                    "snapshot batch at {:?} landed at {offsets:?}",
                    stored.offsets
                )));
            }
        }
        Ok(())
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
        let read = state.log().read_range(4, 10).unwrap();
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
    fn replace_rebuilds_the_same_offsets() {
        let mut a = PartitionState::new(Box::<MemPartitionLog>::default());
        a.apply(batch(2)).unwrap().unwrap();
        a.apply(batch(1)).unwrap().unwrap();
        let mut b = PartitionState::new(Box::<MemPartitionLog>::default());
        b.apply(batch(7)).unwrap().unwrap();
        b.replace(a.all_batches().unwrap()).unwrap();
        assert_eq!(b.all_batches().unwrap(), a.all_batches().unwrap());
        assert_eq!(b.log().next_offset(), 3);
    }
}
