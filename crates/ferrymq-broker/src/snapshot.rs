//! The broker's side of a replicated partition's snapshots (see `replication` for the cursors):
//! where a partition's log starts, its records read back as batches for a replica that is sent
//! them, a sync of everything written so far, a jump ahead for a replica whose log ends below
//! what the others still hold, and the merged cursor state a snapshot keeps.
//!
//! A snapshot never copies the records: the partition log holds them, synced before the
//! snapshot is kept, and the replication log below it is dropped.

use std::sync::Arc;

use bytes::BytesMut;
use ferrymq_protocol::RecordBatch;

use crate::broker::Broker;
use crate::error::BrokerError;
use crate::partition::Partition;
use crate::replication::{decode, encode};
pub use crate::topic::SyncWait;
use crate::topic::Topic;

/// Bytes read in one go when records are read back as batches.
const READ_BYTES_MAX: usize = 4 << 20;

fn partition_of(topic: &Topic, partition: u32) -> Result<&Partition, BrokerError> {
    topic
        .partitions
        .get(partition as usize)
        .ok_or_else(|| BrokerError::invalid("partition", format!("{partition} does not exist")))
}

impl Broker {
    /// Replication seam: the first offset `partition` of `topic` still retains.
    pub fn first_offset(&self, topic: &Topic, partition: u32) -> Result<u64, BrokerError> {
        Ok(partition_of(topic, partition)?.state.lock().first_offset())
    }

    /// Replication seam: the retained records of `from..until` as batches of at most
    /// `records_max` records each, with the offset of each batch's first record. Records the
    /// partition no longer retains are left out at the start; a hole after that is an error.
    pub fn read_batches(
        &self,
        topic: &Topic,
        partition: u32,
        (from, until): (u64, u64),
        records_max: usize,
    ) -> Result<Vec<(u64, RecordBatch)>, BrokerError> {
        let p = partition_of(topic, partition)?;
        let mut batches: Vec<(u64, RecordBatch)> = Vec::new();
        let mut next = from;
        let mut records = Vec::with_capacity(records_max.min(4096));
        while next < until {
            records.clear();
            let after = p.state.lock().read_records(
                next,
                until,
                (records_max.max(1), READ_BYTES_MAX),
                &mut records,
            )?;
            let Some(&(first, _)) = records.first() else {
                break;
            };
            let dense = records
                .iter()
                .enumerate()
                .all(|(i, (offset, _))| *offset == first + i as u64);
            if !dense || (!batches.is_empty() && first != next) {
                return Err(BrokerError::Storage(format!(
                    "topic '{}' partition {partition}: a hole in the records read back from {next}",
                    topic.name
                )));
            }
            let mut bytes = BytesMut::with_capacity(records.iter().map(|(_, r)| r.len()).sum());
            for (_, record) in &records {
                bytes.extend_from_slice(record);
            }
            let batch = RecordBatch::decode(records.len() as u32, bytes.freeze()).map_err(|e| {
                BrokerError::Storage(format!("a stored record does not decode: {e}"))
            })?;
            batches.push((first, batch));
            next = after.max(first + records.len() as u64);
        }
        Ok(batches)
    }

    /// Replication seam: starts a sync of everything written to `partition` of `topic`; the
    /// wait resolves once it is on disk. `None` for a memory topic or when nothing is unsynced.
    pub fn sync_written(&self, topic: &Topic, partition: u32) -> Result<SyncWait, BrokerError> {
        partition_of(topic, partition)?;
        topic.sync_written(partition)
    }

    /// Replication seam: makes `partition` of `topic`, which ends below `offset`, drop every
    /// record it holds and go on at `offset` (a replica sent a snapshot whose oldest record its
    /// log does not reach). Cursors move up to `offset`; the snapshot's cursors follow.
    pub fn skip_to(
        &self,
        topic: &Arc<Topic>,
        partition: u32,
        offset: u64,
    ) -> Result<(), BrokerError> {
        let p = partition_of(topic, partition)?;
        let mut released = Vec::new();
        let skipped = {
            let mut state = p.state.lock();
            let next = state
                .disk
                .as_ref()
                .and_then(|d| d.next_offset())
                .unwrap_or_else(|| state.log.next_offset());
            if offset <= next {
                return Ok(());
            }
            for cursor in state.cursors.iter_mut() {
                let sub_id = cursor.sub_id;
                cursor.drop_below(offset, |consumer| released.push((sub_id, consumer)));
            }
            let tail_end = state.log.next_offset();
            state.trim_log_to(tail_end);
            let skipped = match state.disk.as_mut() {
                Some(disk) => {
                    disk.forget_unsynced_from(0);
                    let log = disk.open_log_mut().ok_or_else(|| {
                        BrokerError::Storage(format!(
                            "topic '{}' partition {partition}: the log is closed after a failure",
                            topic.name
                        ))
                    })?;
                    let restarted = log.restart_at(offset).map_err(|e| {
                        BrokerError::Storage(format!(
                            "topic '{}' partition {partition}: could not start the log again at \
                             {offset}: {e}",
                            topic.name
                        ))
                    });
                    if restarted.is_ok() {
                        disk.retained_from(offset);
                    }
                    restarted
                }
                None => Ok(()),
            };
            if skipped.is_ok() {
                state.log.skip_to(offset);
                state.durable_next = state.durable_next.max(offset);
            }
            skipped
        };
        topic.release_consumers(&released);
        tracing::info!(topic = %topic.name, partition, offset, "replica's log starts again where the group's retained records begin");
        skipped
    }
}

/// Replication seam: `image` (whole cursor states, as [`Broker::apply_replicated_cursors`]
/// takes them) with the cursors of `update` put in place of those of the same subscriptions.
pub fn merge_cursor_states(image: &[u8], update: &[u8]) -> Result<Vec<u8>, BrokerError> {
    let mut states = if image.is_empty() {
        Vec::new()
    } else {
        decode(image)?
    };
    for state in decode(update)? {
        match states
            .iter_mut()
            .find(|s| s.subscription == state.subscription)
        {
            Some(slot) => *slot = state,
            None => states.push(state),
        }
    }
    Ok(encode(&states))
}
