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
use crate::partition::{PartitionImage, PartitionLogError, PartitionState};
pub use crate::types::SnapshotError;
use crate::types::{Entry, LogId, NodeId, Request, Response, StorageError, TypeConfig};

#[derive(Debug, Default)]
struct LogInner {
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId>,
    last_purged: Option<LogId>,
    entries: BTreeMap<u64, Entry>,
    snapshot: Option<Vec<u8>>,
}

/// A group's Raft log in memory. Clones share the log.
#[derive(Debug, Clone, Default)]
pub struct MemLogStore {
    inner: Arc<Mutex<LogInner>>,
}

impl MemLogStore {
    /// The index of the last entry, if any (the last purged one when every entry is purged).
    pub fn last_index(&self) -> Option<u64> {
        let inner = self.inner.lock();
        let last = inner.entries.keys().next_back().copied();
        last.or(inner.last_purged.map(|l| l.index))
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
#[derive(Debug, Clone, Serialize, Deserialize)]
enum SnapshotData {
    Metadata(MetadataState),
    /// Kept without batches; sent with them.
    Partition(PartitionImage),
}

/// A snapshot as its node keeps it (bincode, in the group's [`GroupLog`]) and sends it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SnapshotRecord {
    meta: SnapshotMeta<NodeId, openraft::EmptyNode>,
    data: SnapshotData,
}

impl SnapshotRecord {
    fn encode(&self) -> Result<Vec<u8>, SnapshotError> {
        bincode::serialize(self).map_err(|e| SnapshotError(format!("encoding: {e}")))
    }

    fn decode(bytes: &[u8]) -> Result<Self, SnapshotError> {
        bincode::deserialize(bytes).map_err(|e| SnapshotError(format!("decoding: {e}")))
    }
}

#[derive(Debug)]
struct SmInner {
    last_applied: Option<LogId>,
    membership: StoredMembership<NodeId, openraft::EmptyNode>,
    data: GroupData,
    /// The last snapshot built or installed, as kept (a partition's without batches).
    snapshot: Option<SnapshotRecord>,
    snapshots_built: u64,
    snapshots_installed: u64,
}

/// A group's state machine. Clones share the state.
///
/// Snapshots are kept in the group's [`GroupLog`] beside its Raft log, so that after a restart
/// the state starts from the last one and the log below it can be purged. A metadata snapshot
/// is the whole metadata; a partition's is a [`PartitionImage`] taken once the partition log
/// has synced what it applied, so a body is stored once per node however long the topic lives.
#[derive(Debug, Clone)]
pub struct GroupStateMachine {
    inner: Arc<Mutex<SmInner>>,
    keeper: GroupLog,
    /// One snapshot is kept at a time.
    keeping: Arc<tokio::sync::Mutex<()>>,
}

fn io_error(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_state_machine(openraft::AnyError::new(&e)).into()
}

impl GroupStateMachine {
    /// A state machine over `data`, nothing applied yet, keeping its snapshots in `keeper`.
    fn new(data: GroupData, keeper: GroupLog) -> Self {
        Self {
            inner: Arc::new(Mutex::new(SmInner {
                last_applied: None,
                membership: StoredMembership::default(),
                data,
                snapshot: None,
                snapshots_built: 0,
                snapshots_installed: 0,
            })),
            keeper,
            keeping: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// A state machine that starts from the snapshot `keeper` holds, if any.
    fn restored(data: GroupData, keeper: GroupLog) -> Result<Self, SnapshotError> {
        let this = Self::new(data, keeper);
        let Some(bytes) = this.keeper.load_snapshot()? else {
            return Ok(this);
        };
        let record = SnapshotRecord::decode(&bytes)?;
        {
            let mut inner = this.inner.lock();
            match (&mut inner.data, &record.data) {
                (GroupData::Metadata(m), SnapshotData::Metadata(kept)) => *m = kept.clone(),
                (GroupData::Partition(p), SnapshotData::Partition(image)) => p
                    .restore(image)
                    .map_err(|e| SnapshotError(format!("taking it back: {e}")))?,
                _ => return Err(SnapshotError("it is of the other kind of group".into())),
            }
            inner.last_applied = record.meta.last_log_id;
            inner.membership = record.meta.last_membership.clone();
            inner.snapshot = Some(record);
        }
        Ok(this)
    }

    /// The last applied log position.
    pub fn last_applied(&self) -> Option<LogId> {
        self.inner.lock().last_applied
    }

    /// The last position a snapshot covers, if one was taken or installed.
    pub fn snapshot_last(&self) -> Option<LogId> {
        self.inner
            .lock()
            .snapshot
            .as_ref()
            .and_then(|r| r.meta.last_log_id)
    }

    /// How many snapshots this state machine built, and how many it installed from another
    /// replica.
    pub fn snapshot_counts(&self) -> (u64, u64) {
        let inner = self.inner.lock();
        (inner.snapshots_built, inner.snapshots_installed)
    }

    /// Whether the group may purge its Raft log below a snapshot: only when its state can be
    /// rebuilt without it (metadata always; a partition when its log is durable).
    pub fn compacts(&self) -> bool {
        match &self.inner.lock().data {
            GroupData::Metadata(_) => true,
            GroupData::Partition(p) => p.log().is_durable(),
        }
    }

    /// Reads the applied state. Not linearizable by itself: see
    /// [`crate::node::ClusterNode::read_metadata`].
    pub fn read<R>(&self, f: impl FnOnce(&GroupData) -> R) -> R {
        f(&self.inner.lock().data)
    }

    /// Keeps `record` as the group's snapshot, on disk first, unless a newer one is kept.
    async fn keep(&self, record: SnapshotRecord) -> Result<(), StorageError> {
        let _one = self.keeping.lock().await;
        let newer = self.snapshot_last() > record.meta.last_log_id;
        if newer {
            return Ok(());
        }
        self.keeper.save_snapshot(record.encode()?).await?;
        self.inner.lock().snapshot = Some(record);
        Ok(())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for GroupStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let (record, synced) = {
            let mut inner = self.inner.lock();
            let (data, synced) = match &mut inner.data {
                GroupData::Metadata(m) => (SnapshotData::Metadata(m.clone()), None),
                GroupData::Partition(p) => {
                    let (image, synced) = p.checkpoint().map_err(io_error)?;
                    (SnapshotData::Partition(image), Some(synced))
                }
            };
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
            (SnapshotRecord { meta, data }, synced)
        };
        // The partition log's sync must finish before the snapshot may stand for its batches.
        if let Some(synced) = synced {
            synced.await.map_err(io_error)?;
        }
        let meta = record.meta.clone();
        let bytes = record.encode()?;
        self.keep(record).await?;
        // openraft keeps only the meta of a built snapshot; a replica is sent
        // `get_current_snapshot`'s, which carries the batches.
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
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
        let sent = SnapshotRecord::decode(&snapshot.into_inner())?;
        let (kept, synced) = {
            let mut inner = self.inner.lock();
            let (kept, synced) = match (&mut inner.data, sent.data) {
                (GroupData::Metadata(m), SnapshotData::Metadata(new)) => {
                    *m = new.clone();
                    (SnapshotData::Metadata(new), None)
                }
                (GroupData::Partition(p), SnapshotData::Partition(image)) => {
                    let without = PartitionImage {
                        batches: Vec::new(),
                        ..image.clone()
                    };
                    let synced = p.install(image).map_err(io_error)?;
                    (SnapshotData::Partition(without), Some(synced))
                }
                _ => {
                    let e = std::io::Error::other("snapshot of the other kind of group");
                    return Err(StorageIOError::read_snapshot(
                        Some(meta.signature()),
                        openraft::AnyError::new(&e),
                    )
                    .into());
                }
            };
            inner.last_applied = meta.last_log_id;
            inner.membership = meta.last_membership.clone();
            inner.snapshots_installed += 1;
            (kept, synced)
        };
        if let Some(synced) = synced {
            synced.await.map_err(io_error)?;
        }
        tracing::info!(snapshot = %meta.snapshot_id, last = ?meta.last_log_id, "installed a snapshot sent by the leader");
        self.keep(SnapshotRecord {
            meta: meta.clone(),
            data: kept,
        })
        .await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let record = {
            let inner = self.inner.lock();
            let Some(kept) = inner.snapshot.clone() else {
                return Ok(None);
            };
            match (&inner.data, kept.data) {
                (GroupData::Partition(p), SnapshotData::Partition(image)) => SnapshotRecord {
                    meta: kept.meta,
                    data: SnapshotData::Partition(p.with_batches(&image).map_err(io_error)?),
                },
                (_, data) => SnapshotRecord {
                    meta: kept.meta,
                    data,
                },
            }
        };
        Ok(Some(Snapshot {
            meta: record.meta.clone(),
            snapshot: Box::new(Cursor::new(record.encode()?)),
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

    /// Whether the group was never started here: no entry, no snapshot.
    pub fn is_fresh(&self) -> bool {
        self.last_index().is_none() && matches!(self.load_snapshot(), Ok(None))
    }

    /// The snapshot kept with the log, encoded.
    pub fn load_snapshot(&self) -> Result<Option<Vec<u8>>, SnapshotError> {
        match self {
            Self::Memory(m) => Ok(m.inner.lock().snapshot.clone()),
            Self::Durable(d) => d.load_snapshot(),
        }
    }

    /// Keeps `bytes` as the group's snapshot; on disk before it returns, for a durable log.
    pub async fn save_snapshot(&self, bytes: Vec<u8>) -> Result<(), SnapshotError> {
        match self {
            Self::Memory(m) => {
                m.inner.lock().snapshot = Some(bytes);
                Ok(())
            }
            Self::Durable(d) => d.save_snapshot(bytes).await,
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
        Self::metadata_on(GroupLog::default()).expect("an empty log holds no snapshot")
    }

    /// Empty in-memory storage for a partition group kept in `log`.
    pub fn partition(log: Box<dyn crate::partition::PartitionLog>) -> Self {
        Self::partition_on(GroupLog::default(), log).expect("an empty log holds no snapshot")
    }

    /// The metadata group over the Raft log `raft_log`; the state starts from the snapshot kept
    /// with it, if any, and the log after it is applied again.
    pub fn metadata_on(raft_log: GroupLog) -> Result<Self, SnapshotError> {
        let data = GroupData::Metadata(MetadataState::default());
        Ok(Self {
            state: GroupStateMachine::restored(data, raft_log.clone())?,
            log: raft_log,
        })
    }

    /// A partition group over the Raft log `raft_log`, its batches kept in `log`. Fails when
    /// `log` lacks batches the kept snapshot covers.
    pub fn partition_on(
        raft_log: GroupLog,
        log: Box<dyn crate::partition::PartitionLog>,
    ) -> Result<Self, SnapshotError> {
        let data = GroupData::Partition(PartitionState::new(log));
        Ok(Self {
            state: GroupStateMachine::restored(data, raft_log.clone())?,
            log: raft_log,
        })
    }
}
