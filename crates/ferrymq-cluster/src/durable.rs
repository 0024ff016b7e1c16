//! The durable Raft log: every group of a node in one redb file.
//!
//! [`LogDb`] is one redb database per node; [`LogDb::group`] gives a group its
//! [`RedbLogStore`]. Two tables hold everything, keyed by group: `raft_log` maps
//! `(group, index)` to an encoded entry, `raft_state` maps `(group, name)` to the vote, the
//! committed log id and the last purged log id.
//!
//! Durability rule: every write (vote, appended entries, committed, truncation, purge) is its own
//! redb transaction committed with `Durability::Immediate`, which returns only once the data is
//! on disk (fsync). `save_vote` returns, and `append` calls openraft's flush callback, only after
//! that commit; so whatever openraft was told is stored survives a crash. Writes run on tokio's
//! blocking pool so a slow disk does not stall the runtime.
//!
//! Invariants:
//! - `append` makes entries visible to readers before it reports them flushed;
//! - `truncate(id)` drops `id.index` and everything after it; `purge(id)` drops up to and
//!   including it and remembers `id` as the last purged, in one transaction.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, ErrorSubject, ErrorVerb, LogState, OptionalSend, RaftLogReader, StorageIOError, Vote,
};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::types::{Entry, GroupId, LogId, NodeId, SnapshotError, StorageError, TypeConfig};

const LOG: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("raft_log");
const STATE: TableDefinition<(u64, &str), &[u8]> = TableDefinition::new("raft_state");
const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const PURGED: &str = "purged";
const SNAPSHOT: &str = "snapshot";

/// Why the log database could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("raft log database: {0}")]
pub struct LogDbError(String);

/// A node's durable Raft logs, one file for all its groups. Clones share the database.
#[derive(Clone)]
pub struct LogDb {
    db: Arc<Database>,
}

impl Debug for LogDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogDb").finish_non_exhaustive()
    }
}

impl LogDb {
    /// Opens the database at `path`, creating it if missing. redb refuses a second open of one
    /// file in the same process, so a node opens it once and shares the handle.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LogDbError> {
        let db = Database::create(path).map_err(|e| LogDbError(e.to_string()))?;
        let this = Self { db: Arc::new(db) };
        // Create both tables so that reads never meet a missing table.
        this.write(|txn| {
            txn.open_table(LOG)?;
            txn.open_table(STATE)?;
            Ok(())
        })
        .map_err(|e| LogDbError(e.to_string()))?;
        Ok(this)
    }

    /// The log of `group` in this database.
    pub fn group(&self, group: GroupId) -> RedbLogStore {
        RedbLogStore {
            db: self.clone(),
            group: group.0,
        }
    }

    /// One durable write transaction: committed and fsynced before this returns.
    fn write(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> Result<(), redb::Error> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        f(&txn)?;
        txn.commit()?;
        Ok(())
    }
}

/// One group's durable Raft log. Clones share the database.
#[derive(Debug, Clone)]
pub struct RedbLogStore {
    db: LogDb,
    group: u64,
}

fn storage_error(subject: ErrorSubject<NodeId>, verb: ErrorVerb, e: impl ToString) -> StorageError {
    let e = std::io::Error::other(e.to_string());
    StorageIOError::new(subject, verb, AnyError::new(&e)).into()
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, redb::Error> {
    bincode::serialize(value).map_err(|e| redb::Error::from(std::io::Error::other(e)))
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, redb::Error> {
    bincode::deserialize(bytes).map_err(|e| redb::Error::from(std::io::Error::other(e)))
}

fn index_range(range: &impl RangeBounds<u64>) -> Option<(u64, u64)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e,
        Bound::Excluded(&e) => e.checked_sub(1)?,
        Bound::Unbounded => u64::MAX,
    };
    (start <= end).then_some((start, end))
}

impl RedbLogStore {
    /// The index of the last entry, if any (the last purged one when every entry is purged).
    pub fn last_index(&self) -> Option<u64> {
        let last = self.last_entry().ok().flatten().map(|e| e.log_id.index);
        last.or_else(|| {
            let purged: Option<LogId> = self.read_state(PURGED).ok().flatten();
            purged.map(|l| l.index)
        })
    }

    fn last_entry(&self) -> Result<Option<Entry>, redb::Error> {
        let txn = self.db.db.begin_read()?;
        let table = txn.open_table(LOG)?;
        let last = table
            .range((self.group, 0)..=(self.group, u64::MAX))?
            .next_back();
        match last {
            Some(row) => Ok(Some(decode(row?.1.value())?)),
            None => Ok(None),
        }
    }

    fn read_state<T: DeserializeOwned>(&self, name: &str) -> Result<Option<T>, redb::Error> {
        let txn = self.db.db.begin_read()?;
        let table = txn.open_table(STATE)?;
        match table.get((self.group, name))? {
            Some(v) => Ok(Some(decode(v.value())?)),
            None => Ok(None),
        }
    }

    fn entries(&self, start: u64, end: u64) -> Result<Vec<Entry>, redb::Error> {
        let txn = self.db.db.begin_read()?;
        let table = txn.open_table(LOG)?;
        let mut out = Vec::new();
        for row in table.range((self.group, start)..=(self.group, end))? {
            out.push(decode(row?.1.value())?);
        }
        Ok(out)
    }

    /// Runs a durable write on the blocking pool.
    async fn write_durably(
        &self,
        f: impl FnOnce(&redb::WriteTransaction, u64) -> Result<(), redb::Error> + Send + 'static,
    ) -> Result<(), redb::Error> {
        let db = self.db.clone();
        let group = self.group;
        tokio::task::spawn_blocking(move || db.write(|txn| f(txn, group)))
            .await
            .map_err(|e| redb::Error::from(std::io::Error::other(e)))?
    }

    async fn save_state<T: Serialize>(
        &self,
        name: &'static str,
        value: &T,
    ) -> Result<(), redb::Error> {
        let bytes = encode(value)?;
        self.write_durably(move |txn, group| {
            txn.open_table(STATE)?
                .insert((group, name), bytes.as_slice())?;
            Ok(())
        })
        .await
    }
}

fn remove_range(
    txn: &redb::WriteTransaction,
    group: u64,
    start: u64,
    end: u64,
) -> Result<(), redb::Error> {
    let mut table = txn.open_table(LOG)?;
    let keys: Vec<u64> = table
        .range((group, start)..=(group, end))?
        .map(|row| row.map(|(k, _)| k.value().1))
        .collect::<Result<_, _>>()?;
    for index in keys {
        table.remove((group, index))?;
    }
    Ok(())
}

impl RedbLogStore {
    /// The group's kept snapshot, encoded.
    pub fn load_snapshot(&self) -> Result<Option<Vec<u8>>, SnapshotError> {
        let read = || -> Result<Option<Vec<u8>>, redb::Error> {
            let txn = self.db.db.begin_read()?;
            let table = txn.open_table(STATE)?;
            Ok(table
                .get((self.group, SNAPSHOT))?
                .map(|v| v.value().to_vec()))
        };
        read().map_err(|e| SnapshotError(format!("reading: {e}")))
    }

    /// Keeps `bytes` as the group's snapshot, on disk when this returns.
    pub async fn save_snapshot(&self, bytes: Vec<u8>) -> Result<(), SnapshotError> {
        self.write_durably(move |txn, group| {
            txn.open_table(STATE)?
                .insert((group, SNAPSHOT), bytes.as_slice())?;
            Ok(())
        })
        .await
        .map_err(|e| SnapshotError(format!("keeping: {e}")))
    }
}

impl RaftLogReader<TypeConfig> for RedbLogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let Some((start, end)) = index_range(&range) else {
            return Ok(Vec::new());
        };
        self.entries(start, end)
            .map_err(|e| storage_error(ErrorSubject::Logs, ErrorVerb::Read, e))
    }
}

impl RaftLogStorage<TypeConfig> for RedbLogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let read = |e: redb::Error| storage_error(ErrorSubject::Logs, ErrorVerb::Read, e);
        let purged: Option<LogId> = self.read_state(PURGED).map_err(read)?;
        let last = self.last_entry().map_err(read)?.map(|e| e.log_id);
        Ok(LogState {
            last_purged_log_id: purged,
            last_log_id: last.or(purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.save_state(VOTE, vote)
            .await
            .map_err(|e| storage_error(ErrorSubject::Vote, ErrorVerb::Write, e))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.read_state(VOTE)
            .map_err(|e| storage_error(ErrorSubject::Vote, ErrorVerb::Read, e))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.save_state(COMMITTED, &committed)
            .await
            .map_err(|e| storage_error(ErrorSubject::Store, ErrorVerb::Write, e))
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let committed: Option<Option<LogId>> = self
            .read_state(COMMITTED)
            .map_err(|e| storage_error(ErrorSubject::Store, ErrorVerb::Read, e))?;
        Ok(committed.flatten())
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
        let encoded: Result<Vec<(u64, Vec<u8>)>, redb::Error> = entries
            .into_iter()
            .map(|e| Ok((e.log_id.index, encode(&e)?)))
            .collect();
        let written = match encoded {
            Ok(rows) => {
                self.write_durably(move |txn, group| {
                    let mut table = txn.open_table(LOG)?;
                    for (index, bytes) in &rows {
                        table.insert((group, *index), bytes.as_slice())?;
                    }
                    Ok(())
                })
                .await
            }
            Err(e) => Err(e),
        };
        // The callback runs only after the commit above has reached the disk.
        match written {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(storage_error(ErrorSubject::Logs, ErrorVerb::Write, e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.write_durably(move |txn, group| remove_range(txn, group, log_id.index, u64::MAX))
            .await
            .map_err(|e| storage_error(ErrorSubject::Logs, ErrorVerb::Delete, e))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let bytes =
            encode(&log_id).map_err(|e| storage_error(ErrorSubject::Logs, ErrorVerb::Delete, e))?;
        self.write_durably(move |txn, group| {
            remove_range(txn, group, 0, log_id.index)?;
            txn.open_table(STATE)?
                .insert((group, PURGED), bytes.as_slice())?;
            Ok(())
        })
        .await
        .map_err(|e| storage_error(ErrorSubject::Logs, ErrorVerb::Delete, e))
    }
}
