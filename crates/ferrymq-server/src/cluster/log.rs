//! A partition group's committed batches kept in the broker's own partition log: the state
//! machine of a replicated partition is the broker's log, so consumers read replicated messages
//! exactly as they read local ones.

use std::sync::Arc;

use bytes::Bytes;
use ferrymq_broker::{Broker, Topic};
use ferrymq_cluster::partition::{
    OffsetRange, PartitionLog, PartitionLogError, RecordBatch, StateUpdate, StoredBatch,
};
use ferrymq_cluster::NodeId;

/// One partition of one topic of the local broker, as a group's [`PartitionLog`].
pub(super) struct BrokerLog {
    pub(super) broker: Broker,
    pub(super) topic: Arc<Topic>,
    pub(super) partition: u32,
    /// This node.
    pub(super) me: NodeId,
}

impl PartitionLog for BrokerLog {
    fn next_offset(&self) -> u64 {
        self.broker
            .next_offset(&self.topic, self.partition)
            .unwrap_or(0)
    }

    fn append_committed(&mut self, batch: RecordBatch) -> Result<OffsetRange, PartitionLogError> {
        let count = batch.record_count;
        let records = ferrymq_protocol::RecordBatch::decode(count, Bytes::from(batch.payload))
            .map_err(|e| PartitionLogError(format!("a committed batch does not decode: {e}")))?;
        let pending = self
            .broker
            .append_replicated(&self.topic, self.partition, records)
            .map_err(|e| PartitionLogError(e.to_string()))?;
        // The group's Raft log holds the batch durably (fsynced on a majority before it was
        // committed); the broker's log is synced on its own schedule, and a tail lost in a crash
        // is applied again from the Raft log on restart.
        let mut ids = pending.receipt().ids();
        let (_, first) = ids
            .next()
            .ok_or_else(|| PartitionLogError("a committed batch stored nothing".into()))?;
        Ok(OffsetRange {
            first,
            last: first + u64::from(count) - 1,
        })
    }

    fn read_range(
        &self,
        _from_offset: u64,
        _max_batches: usize,
    ) -> Result<Vec<StoredBatch>, PartitionLogError> {
        Err(PartitionLogError(
            "snapshots of a broker partition are not built: the group's log is kept whole".into(),
        ))
    }

    fn truncate(&mut self, _from_offset: u64) -> Result<(), PartitionLogError> {
        Err(PartitionLogError(
            "a broker partition is never truncated: it holds committed batches only".into(),
        ))
    }

    fn apply_state(&mut self, update: &StateUpdate) -> Result<(), PartitionLogError> {
        super::serving::apply_update(&self.broker, self.me, &self.topic, self.partition, update)
    }
}
