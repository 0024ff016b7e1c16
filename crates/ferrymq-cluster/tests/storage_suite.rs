//! The in-memory log store and the group state machine pass openraft's own storage test suite,
//! for both kinds of group.

use ferrymq_cluster::partition::MemPartitionLog;
use ferrymq_cluster::storage::{GroupStateMachine, GroupStorage, MemLogStore};
use ferrymq_cluster::types::{StorageError, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};

struct Metadata;
struct Partition;

impl StoreBuilder<TypeConfig, MemLogStore, GroupStateMachine> for Metadata {
    async fn build(&self) -> Result<((), MemLogStore, GroupStateMachine), StorageError> {
        let storage = GroupStorage::metadata();
        Ok(((), storage.log, storage.state))
    }
}

impl StoreBuilder<TypeConfig, MemLogStore, GroupStateMachine> for Partition {
    async fn build(&self) -> Result<((), MemLogStore, GroupStateMachine), StorageError> {
        let storage = GroupStorage::partition(Box::<MemPartitionLog>::default());
        Ok(((), storage.log, storage.state))
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
