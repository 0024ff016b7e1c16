//! Seams for a layer that replicates the broker's partitions (cluster mode): which replica serves
//! a partition, and its subscriptions' cursors carried from the serving replica to the others.
//!
//! The broker knows nothing of how replication is done. It offers:
//! - a serving gate per partition (`Broker::set_serving`): only the replica that serves a
//!   partition delivers its messages and takes acks for them;
//! - a [`CursorReplicator`]: the state writer hands it, with every commit, the cursors of the
//!   replicated partitions this node serves, and a confirmed ACK is answered only once the
//!   replicator has them committed;
//! - `Broker::apply_replicated_cursors`: another replica's cursors, applied here so that the
//!   next replica to serve the partition delivers nothing acked and keeps attempts and delays.
//!
//! An update holds whole cursors (floor, settled runs above it, attempts and due times), not
//! the acks since the last one: applying one replaces the cursor, so updates need no order
//! beyond the log's and a lost one is made good by the next.

use serde::{Deserialize, Serialize};

use crate::cursor::DeliveryState;
use crate::error::BrokerError;
use crate::meta::SubscriptionRecord;

/// Carries cursor updates of replicated partitions to their other replicas.
pub trait CursorReplicator: Send + Sync + 'static {
    /// Whether `topic`'s partitions are replicated (their cursors go through [`CursorReplicator::replicate`]).
    fn replicates(&self, topic: &str) -> bool;

    /// Replicates the updates, one per partition; called on the state writer's thread, it may
    /// block. `Ok` once every update is committed; otherwise why not, per update.
    fn replicate(&self, updates: Vec<CursorUpdate>) -> Vec<Result<(), String>>;
}

/// The cursors of one partition's subscriptions, as the serving replica has them.
#[derive(Debug, Clone)]
pub struct CursorUpdate {
    pub topic: String,
    pub partition: u32,
    /// The serving term the update was made in (see `Broker::set_serving`).
    pub epoch: u64,
    /// The cursors, encoded; `Broker::apply_replicated_cursors` reads them.
    pub payload: Vec<u8>,
}

/// One subscription's cursor on one partition, with what creates the subscription where it
/// does not exist yet.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CursorState {
    pub subscription: String,
    pub settings: SubscriptionRecord,
    pub floor: u64,
    pub settled: Vec<(u64, u64)>,
    pub delivery: Vec<DeliveryState>,
}

pub(crate) fn encode(states: &[CursorState]) -> Vec<u8> {
    serde_json::to_vec(states).expect("cursor states encode")
}

pub(crate) fn decode(payload: &[u8]) -> Result<Vec<CursorState>, BrokerError> {
    serde_json::from_slice(payload).map_err(|e| {
        BrokerError::Storage(format!("a replicated cursor update does not decode: {e}"))
    })
}
