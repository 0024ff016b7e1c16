//! The in-memory and the durable log store, with the group state machine, pass openraft's own
//! storage test suite, for both kinds of group.

use ferrymq_cluster::durable::LogDb;
use ferrymq_cluster::partition::MemPartitionLog;
use ferrymq_cluster::storage::{GroupLog, GroupStateMachine, GroupStorage};
use ferrymq_cluster::types::{StorageError, TypeConfig};
use ferrymq_cluster::GroupId;
use openraft::testing::{StoreBuilder, Suite};
use tempfile::TempDir;

struct Metadata;
struct Partition;
struct DurableMetadata;
struct DurablePartition;

impl StoreBuilder<TypeConfig, GroupLog, GroupStateMachine> for Metadata {
    async fn build(&self) -> Result<((), GroupLog, GroupStateMachine), StorageError> {
        let storage = GroupStorage::metadata();
        Ok(((), storage.log, storage.state))
    }
}

impl StoreBuilder<TypeConfig, GroupLog, GroupStateMachine> for Partition {
    async fn build(&self) -> Result<((), GroupLog, GroupStateMachine), StorageError> {
        let storage = GroupStorage::partition(Box::<MemPartitionLog>::default());
        Ok(((), storage.log, storage.state))
    }
}

/// A fresh database in a directory that lives as long as the test.
fn durable_log(group: GroupId) -> (TempDir, GroupLog) {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = LogDb::open(dir.path().join("raft.redb")).expect("open log db");
    (dir, GroupLog::Durable(db.group(group)))
}

impl StoreBuilder<TypeConfig, GroupLog, GroupStateMachine, TempDir> for DurableMetadata {
    async fn build(&self) -> Result<(TempDir, GroupLog, GroupStateMachine), StorageError> {
        let (dir, log) = durable_log(GroupId::METADATA);
        let storage = GroupStorage::metadata_on(log).unwrap();
        Ok((dir, storage.log, storage.state))
    }
}

impl StoreBuilder<TypeConfig, GroupLog, GroupStateMachine, TempDir> for DurablePartition {
    async fn build(&self) -> Result<(TempDir, GroupLog, GroupStateMachine), StorageError> {
        let (dir, log) = durable_log(GroupId(7));
        let storage = GroupStorage::partition_on(log, Box::<MemPartitionLog>::default()).unwrap();
        Ok((dir, storage.log, storage.state))
    }
}

#[test]
fn metadata_group_storage_passes_the_openraft_suite() {
    Suite::test_all(Metadata).expect("openraft storage suite");
}

#[test]
fn partition_group_storage_passes_the_openraft_suite() {
    Suite::test_all(Partition).expect("openraft storage suite");
}

#[test]
fn durable_metadata_group_storage_passes_the_openraft_suite() {
    Suite::test_all(DurableMetadata).expect("openraft storage suite");
}

#[test]
fn durable_partition_group_storage_passes_the_openraft_suite() {
    Suite::test_all(DurablePartition).expect("openraft storage suite");
}
