//! Identifiers and the one Raft type configuration shared by every group.
//!
//! All groups, metadata and partitions alike, use [`TypeConfig`], so one transport carries the
//! messages of every group and only the [`GroupId`] tells them apart. What a group's entries mean
//! is decided by its state machine: a metadata group accepts [`Request::Metadata`], a partition
//! group accepts [`Request::Append`]; the other kind is answered with [`Response::WrongGroup`],
//! deterministically on every replica.

use std::io::Cursor;

use serde::{Deserialize, Serialize};

pub use crate::ids::{GroupId, NodeId};
use crate::metadata::{MetaCommand, MetaError, MetaOutcome};
use crate::partition::{OffsetRange, PartitionError, RecordBatch, StateUpdate};
use crate::runtime::SeededRuntime;

/// What a client proposes to a group: one log entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// A change to the cluster metadata (metadata group only).
    Metadata(MetaCommand),
    /// A whole record batch for a partition (partition groups only).
    Append(RecordBatch),
    /// A change to a partition's replicated state beside its log (its subscriptions' cursors),
    /// opaque here and handed to the partition's [`PartitionLog::apply_state`].
    ///
    /// [`PartitionLog::apply_state`]: crate::partition::PartitionLog::apply_state
    State(StateUpdate),
}

/// What applying one entry produced; identical on every replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    /// The outcome of a metadata command.
    Metadata(Result<MetaOutcome, MetaError>),
    /// The offsets a batch was given, or why it was refused.
    Appended(Result<OffsetRange, PartitionError>),
    /// A state update was applied.
    StateApplied,
    /// The request was for the other kind of group; nothing changed.
    WrongGroup,
    /// An entry Raft itself wrote (a new leader's blank entry, a membership change); no client
    /// waits for it.
    Empty,
}

openraft::declare_raft_types!(
    /// The Raft types of every FerryMQ group.
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = NodeId,
        Node = openraft::EmptyNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = SeededRuntime,
);

/// A log entry of any group.
pub type Entry = openraft::Entry<TypeConfig>;
/// A log position: term, leader and index.
pub type LogId = openraft::LogId<NodeId>;
/// A running Raft instance of one group on one node.
pub type Raft = openraft::Raft<TypeConfig>;
/// Storage errors as openraft wants them.
pub type StorageError = openraft::StorageError<NodeId>;

/// Why a group's kept snapshot could not be read, taken back or kept.
#[derive(Debug, Clone, thiserror::Error)]
#[error("snapshot: {0}")]
pub struct SnapshotError(pub String);

impl From<SnapshotError> for StorageError {
    fn from(e: SnapshotError) -> Self {
        openraft::StorageIOError::write_snapshot(None, openraft::AnyError::new(&e)).into()
    }
}
