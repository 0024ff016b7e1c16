//! A partition group's committed batches kept in the broker's own partition log: the state
//! machine of a replicated partition is the broker's log, so consumers read replicated messages
//! exactly as they read local ones.

use std::sync::Arc;

use bytes::Bytes;
use ferrymq_broker::{Broker, Topic};
use ferrymq_cluster::partition::{
    OffsetRange, PartitionLog, PartitionLogError, RecordBatch, StateUpdate, StoredBatch, Synced,
};
use ferrymq_cluster::NodeId;

/// Records per batch when a partition's records are read back for a snapshot.
const SNAPSHOT_BATCH_RECORDS: usize = 4096;

/// One partition of one topic of the local broker, as a group's [`PartitionLog`].
pub(super) struct BrokerLog {
    pub(super) broker: Broker,
    pub(super) topic: Arc<Topic>,
    pub(super) partition: u32,
    /// This node.
    pub(super) me: NodeId,
    /// Committed cursor updates, merged: whole cursor states by subscription, what a snapshot
    /// keeps beside the log (see [`CursorImage`]).
    pub(super) cursors: parking_lot::Mutex<CursorImage>,
}

/// The cursors of every committed update, merged lazily: updates are kept as they came and
/// folded into the image every [`CursorImage::PENDING_MAX`] updates and when a snapshot asks,
/// so that applying an update costs no decoding.
#[derive(Default)]
pub(super) struct CursorImage {
    merged: Vec<u8>,
    pending: Vec<Vec<u8>>,
}

impl CursorImage {
    const PENDING_MAX: usize = 256;

    fn push(&mut self, update: &[u8]) -> Result<(), PartitionLogError> {
        self.pending.push(update.to_vec());
        if self.pending.len() >= Self::PENDING_MAX {
            self.merge()?;
        }
        Ok(())
    }

    fn merge(&mut self) -> Result<(), PartitionLogError> {
        for update in self.pending.drain(..) {
            self.merged =
                ferrymq_broker::merge_cursor_states(&self.merged, &update).map_err(log_error)?;
        }
        Ok(())
    }

    fn image(&mut self) -> Result<Vec<u8>, PartitionLogError> {
        self.merge()?;
        Ok(self.merged.clone())
    }

    fn replace(&mut self, image: &[u8]) {
        self.merged = image.to_vec();
        self.pending.clear();
    }
}

fn log_error(e: impl std::fmt::Display) -> PartitionLogError {
    PartitionLogError(e.to_string())
}

impl PartitionLog for BrokerLog {
    fn next_offset(&self) -> u64 {
        self.broker
            .next_offset(&self.topic, self.partition)
            .unwrap_or(0)
    }

    fn first_offset(&self) -> u64 {
        self.broker
            .first_offset(&self.topic, self.partition)
            .unwrap_or_else(|_| self.next_offset())
    }

    fn append_committed(&mut self, batch: RecordBatch) -> Result<OffsetRange, PartitionLogError> {
        let count = batch.record_count;
        let records = ferrymq_protocol::RecordBatch::decode(count, Bytes::from(batch.payload))
            .map_err(|e| PartitionLogError(format!("a committed batch does not decode: {e}")))?;
        let pending = self
            .broker
            .append_replicated(&self.topic, self.partition, records)
            .map_err(log_error)?;
        // The group's Raft log holds the batch durably (fsynced on a majority before it was
        // committed); the broker's log is synced on its own schedule, and before a snapshot
        // stands for it (`sync`). A tail lost in a crash is applied again from the Raft log.
        let mut ids = pending.receipt().ids();
        let (_, first) = ids
            .next()
            .ok_or_else(|| PartitionLogError("a committed batch stored nothing".into()))?;
        Ok(OffsetRange {
            first,
            last: first + u64::from(count) - 1,
        })
    }

    fn append_tail(&mut self, stored: StoredBatch, from: u64) -> Result<(), PartitionLogError> {
        let skip = from.saturating_sub(stored.offsets.first) as usize;
        let count = stored.batch.record_count;
        let records =
            ferrymq_protocol::RecordBatch::decode(count, Bytes::from(stored.batch.payload))
                .map_err(|e| {
                    PartitionLogError(format!("a snapshot's batch does not decode: {e}"))
                })?;
        let Some(start) = records.spans().nth(skip).map(|span| span.start) else {
            return Ok(());
        };
        let tail = records.bytes().slice(start..);
        let payload = tail.to_vec();
        self.append_committed(RecordBatch {
            record_count: count - skip as u32,
            payload,
        })
        .map(|_| ())
    }

    fn read_range(
        &self,
        from_offset: u64,
        until: u64,
        max_batches: usize,
    ) -> Result<Vec<StoredBatch>, PartitionLogError> {
        let batches = self
            .broker
            .read_batches(
                &self.topic,
                self.partition,
                (from_offset, until),
                SNAPSHOT_BATCH_RECORDS,
            )
            .map_err(log_error)?;
        Ok(batches
            .into_iter()
            .take(max_batches)
            .map(|(first, batch)| StoredBatch {
                offsets: OffsetRange {
                    first,
                    last: first + u64::from(batch.count()) - 1,
                },
                batch: RecordBatch {
                    record_count: batch.count(),
                    payload: batch.bytes().to_vec(),
                },
            })
            .collect())
    }

    fn skip_to(&mut self, offset: u64) -> Result<(), PartitionLogError> {
        self.broker
            .skip_to(&self.topic, self.partition, offset)
            .map_err(log_error)
    }

    fn is_durable(&self) -> bool {
        self.topic.is_disk()
    }

    fn sync(&mut self) -> Synced {
        let wait = self.broker.sync_written(&self.topic, self.partition);
        Box::pin(async move {
            match wait.map_err(log_error)? {
                None => Ok(()),
                Some(wait) => match wait.await {
                    Ok(done) => done.map_err(log_error),
                    Err(_) => Err(PartitionLogError(
                        "the partition closed before its sync finished".into(),
                    )),
                },
            }
        })
    }

    fn apply_state(&mut self, update: &StateUpdate) -> Result<(), PartitionLogError> {
        if let Some(cursors) = update.payload.get(super::serving::HEADER_BYTES..) {
            self.cursors.lock().push(cursors)?;
        }
        super::serving::apply_update(&self.broker, self.me, &self.topic, self.partition, update)
    }

    fn state_image(&self) -> Result<Vec<u8>, PartitionLogError> {
        self.cursors.lock().image()
    }

    fn restore_state(&mut self, image: &[u8]) -> Result<(), PartitionLogError> {
        self.cursors.lock().replace(image);
        if image.is_empty() {
            return Ok(());
        }
        self.broker
            .apply_replicated_cursors(&self.topic, self.partition, image)
            .map_err(log_error)
    }
}
