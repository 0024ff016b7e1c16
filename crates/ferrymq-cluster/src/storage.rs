//! The Raft log of a group (in memory or durable) and the group state machine.
//!
//! [`MemLogStore`] keeps a group's Raft log, vote and committed position in memory;
//! [`crate::durable::RedbLogStore`] keeps them on disk; [`GroupLog`] is either.
//! [`GroupStateMachine`] applies committed entries to the metadata or partition state. All are
//! cheap handles over shared state: a node that is stopped and started again gets the same
//! handles back, which is how the simulation models a restart over durable storage.
//!
//! The state machine itself is not persisted: after a process restart it starts empty and
//! openraft rebuilds it by re-applying the log up to the durable committed id (logs are never
//! purged, see `SnapshotPolicy::Never` in [`crate::node`]). A partition whose
//! [`crate::partition::PartitionLog`] is durable will instead have to report what it applied.
//!
//! Invariants the Raft core relies on:
//! - `append` makes entries visible to readers before it reports them flushed;
//! - `truncate(id)` drops `id.index` and everything after it; `purge(id)` drops up to and
//!   including it and remembers `id` as the last purged;
//! - `apply` is called with consecutive committed entries and answers one response per entry.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    EntryPayload, LogState, OptionalSend, RaftLogReader, RaftSnapshotBuilder, Snapshot,
    SnapshotMeta, StorageIOError, StoredMembership, Vote,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::durable::RedbLogStore;
use crate::metadata::MetadataState;
use crate::partition::{PartitionLogError, PartitionState, StoredBatch};
use crate::types::{Entry, LogId, NodeId, Request, Response, StorageError, TypeConfig};

#[derive(Debug, Default)]
struct LogInner {
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
    entries: BTreeMap<u64, Entry>,
}

/// A group's Raft log in memory. Clones share the log.
#[derive(Debug, Clone, Default)]
pub struct MemLogStore {
    inner: Arc<Mutex<LogInner>>,
}

impl MemLogStore {
    /// The index of the last entry, if any.
    pub fn last_index(&self) -> Option<u64> {
        self.inner.lock().entries.keys().next_back().copied()
    }
}

impl RaftLogReader<TypeConfig> for MemLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let inner = self.inner.lock();
        Ok(inner.entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for MemLogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let inner = self.inner.lock();
        let last = inner.entries.values().next_back().map(|e| e.log_id);
        Ok(LogState {
            last_purged_log_id: inner.last_purged,
            last_log_id: last.or(inner.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.inner.lock().vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        Ok(self.inner.lock().vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.inner.lock().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.inner.lock().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        {
            let mut inner = self.inner.lock();
            for entry in entries {
                inner.entries.insert(entry.log_id.index, entry);
            }
        }
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut inner = self.inner.lock();
        let _dropped = inner.entries.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut inner = self.inner.lock();
        let kept = inner.entries.split_off(&(log_id.index + 1));
        inner.entries = kept;
        inner.last_purged = Some(log_id);
        Ok(())
    }
}

/// What a group replicates.
#[derive(Debug)]
pub enum GroupData {
    /// The cluster metadata (group 0).
    Metadata(MetadataState),
    /// One partition's committed log.
    Partition(PartitionState),
}

/// The state a snapshot carries.
#[derive(Serialize, Deserialize)]
enum SnapshotData {
    Metadata(MetadataState),
    Partition(Vec<StoredBatch>),
}

#[derive(Debug)]
struct SmInner {
    last_applied: Option<LogId>,
    membership: StoredMembership<NodeId, openraft::EmptyNode>,
    data: GroupData,
    snapshot: Option<(SnapshotMeta<NodeId, openraft::EmptyNode>, Vec<u8>)>,
    snapshots_built: u64,
}

/// A group's state machine. Clones share the state.
#[derive(Debug, Clone)]
pub struct GroupStateMachine {
    inner: Arc<Mutex<SmInner>>,
}

/// Why a snapshot could not be built.
#[derive(Debug, thiserror::Error)]
enum SnapshotBuildError {
    #[error(transparent)]
    Log(#[from] PartitionLogError),
    #[error("encoding the snapshot: {0}")]
    Encode(#[from] serde_json::Error),
}

fn io_error(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_state_machine(openraft::AnyError::new(&e)).into()
}

impl GroupStateMachine {
    /// A state machine over `data`, nothing applied yet.
    pub fn new(data: GroupData) -> Self {
        Self {
            inner: Arc::new(Mutex::new(SmInner {
                last_applied: None,
                membership: StoredMembership::default(),
                data,
                snapshot: None,
                snapshots_built: 0,
            })),
        }
    }

    /// The last applied log position.
    pub fn last_applied(&self) -> Option<LogId> {
        self.inner.lock().last_applied
    }

    /// Reads the applied state. Not linearizable by itself: see
    /// [`crate::node::ClusterNode::read_metadata`].
    pub fn read<R>(&self, f: impl FnOnce(&GroupData) -> R) -> R {
        f(&self.inner.lock().data)
    }

    fn snapshot_of(inner: &mut SmInner) -> Result<Snapshot<TypeConfig>, SnapshotBuildError> {
        let data = match &inner.data {
            GroupData::Metadata(m) => SnapshotData::Metadata(m.clone()),
            GroupData::Partition(p) => SnapshotData::Partition(p.all_batches()?),
        };
        let bytes = serde_json::to_vec(&data)?;
        inner.snapshots_built += 1;
        let snapshot_id = format!(
            "{}-{}",
            inner.last_applied.map_or(0, |l| l.index),
            inner.snapshots_built
        );
        let meta = SnapshotMeta {
            last_log_id: inner.last_applied,
            last_membership: inner.membership.clone(),
            snapshot_id,
        };
        inner.snapshot = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftSnapshotBuilder<TypeConfig> for GroupStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let mut inner = self.inner.lock();
        Self::snapshot_of(&mut inner).map_err(io_error)
    }
}

fn apply_one(data: &mut GroupData, request: Request) -> Result<Response, PartitionLogError> {
    Ok(match (data, request) {
        (GroupData::Metadata(m), Request::Metadata(cmd)) => Response::Metadata(m.apply(cmd)),
        (GroupData::Partition(p), Request::Append(batch)) => Response::Appended(p.apply(batch)?),
        (GroupData::Partition(p), Request::State(update)) => {
            p.apply_state(&update)?;
            Response::StateApplied
        }
        _ => Response::WrongGroup,
    })
}

impl RaftStateMachine<TypeConfig> for GroupStateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, openraft::EmptyNode>), StorageError> {
        let inner = self.inner.lock();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.inner.lock();
        let mut responses = Vec::new();
        for entry in entries {
            inner.last_applied = Some(entry.log_id);
            let response = match entry.payload {
                EntryPayload::Blank => Response::Empty,
                EntryPayload::Normal(request) => {
                    apply_one(&mut inner.data, request).map_err(io_error)?
                }
                EntryPayload::Membership(m) => {
                    inner.membership = StoredMembership::new(Some(entry.log_id), m);
                    Response::Empty
                }
            };
            responses.push(response);
        }
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, openraft::EmptyNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.into_inner();
        let data: SnapshotData = serde_json::from_slice(&bytes).map_err(|e| {
            StorageIOError::read_snapshot(Some(meta.signature()), openraft::AnyError::new(&e))
        })?;
        let mut inner = self.inner.lock();
        match (&mut inner.data, data) {
            (GroupData::Metadata(m), SnapshotData::Metadata(new)) => *m = new,
            (GroupData::Partition(p), SnapshotData::Partition(batches)) => {
                p.replace(batches).map_err(io_error)?
            }
            _ => {
                let e = std::io::Error::other("snapshot of the other kind of group");
                return Err(StorageIOError::read_snapshot(
                    Some(meta.signature()),
                    openraft::AnyError::new(&e),
                )
                .into());
            }
        }
        inner.last_applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        inner.snapshot = Some((meta.clone(), bytes));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let inner = self.inner.lock();
        Ok(inner.snapshot.as_ref().map(|(meta, bytes)| Snapshot {
            meta: meta.clone(),
            snapshot: Box::new(Cursor::new(bytes.clone())),
        }))
    }
}

/// A group's Raft log: in memory (tests, the simulation) or durable.
#[derive(Debug, Clone)]
pub enum GroupLog {
    Memory(MemLogStore),
    Durable(RedbLogStore),
}

impl Default for GroupLog {
    fn default() -> Self {
        Self::Memory(MemLogStore::default())
    }
}

impl GroupLog {
    /// The index of the last entry, if any.
    pub fn last_index(&self) -> Option<u64> {
        match self {
            Self::Memory(m) => m.last_index(),
            Self::Durable(d) => d.last_index(),
        }
    }
}

/// Calls the same method on whichever store `self` is.
macro_rules! delegate {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            GroupLog::Memory($s) => $call,
            GroupLog::Durable($s) => $call,
        }
    };
}

impl RaftLogReader<TypeConfig> for GroupLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        delegate!(self, s => s.try_get_log_entries(range).await)
    }
}

impl RaftLogStorage<TypeConfig> for GroupLog {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        delegate!(self, s => s.get_log_state().await)
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        delegate!(self, s => s.save_vote(vote).await)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        delegate!(self, s => s.read_vote().await)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        delegate!(self, s => s.save_committed(committed).await)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        delegate!(self, s => s.read_committed().await)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        delegate!(self, s => s.append(entries, callback).await)
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        delegate!(self, s => s.truncate(log_id).await)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        delegate!(self, s => s.purge(log_id).await)
    }
}

/// Everything a group keeps on one node, kept across a restart of that node.
#[derive(Debug, Clone)]
pub struct GroupStorage {
    pub log: GroupLog,
    pub state: GroupStateMachine,
}

impl GroupStorage {
    /// Empty in-memory storage for the metadata group.
    pub fn metadata() -> Self {
        Self::metadata_on(GroupLog::default())
    }

    /// Empty in-memory storage for a partition group kept in `log`.
    pub fn partition(log: Box<dyn crate::partition::PartitionLog>) -> Self {
        Self::partition_on(GroupLog::default(), log)
    }

    /// The metadata group over the Raft log `raft_log`; the state is rebuilt from the log.
    pub fn metadata_on(raft_log: GroupLog) -> Self {
        Self {
            log: raft_log,
            state: GroupStateMachine::new(GroupData::Metadata(MetadataState::default())),
        }
    }

    /// A partition group over the Raft log `raft_log`, its batches kept in `log`.
    pub fn partition_on(raft_log: GroupLog, log: Box<dyn crate::partition::PartitionLog>) -> Self {
        Self {
            log: raft_log,
            state: GroupStateMachine::new(GroupData::Partition(PartitionState::new(log))),
        }
    }
}
