//! A single node's API: starting and stopping groups, writes and reads, and the errors.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ferrymq_cluster::inproc::{FaultConfig, InProcNetwork};
use ferrymq_cluster::metadata::{MetaCommand, MetaOutcome};
use ferrymq_cluster::partition::{MemPartitionLog, PartitionError, RecordBatch};
use ferrymq_cluster::storage::GroupStorage;
use ferrymq_cluster::{ClusterError, ClusterNode, GroupId, GroupTiming, Request, Response};

const TIMEOUT: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn one_node_runs_groups_and_refuses_what_it_cannot_do() {
    ferrymq_cluster::runtime::seed_thread_rng(3);
    let net = InProcNetwork::new(3, FaultConfig::default());
    let node = Arc::new(ClusterNode::new(net.transport(1), GroupTiming::default()));
    net.attach(1, node.router());
    let _clock = node.spawn_heartbeats();
    let only_me = BTreeSet::from([1]);
    let partition = GroupId(5);

    node.start_group(GroupId::METADATA, GroupStorage::metadata())
        .await
        .unwrap();
    let again = node
        .start_group(GroupId::METADATA, GroupStorage::metadata())
        .await;
    assert_eq!(
        again.err(),
        Some(ClusterError::GroupRunning(GroupId::METADATA))
    );
    let log = Box::<MemPartitionLog>::default();
    node.start_group(partition, GroupStorage::partition(log))
        .await
        .unwrap();
    node.initialize(GroupId::METADATA, &only_me).await.unwrap();
    node.initialize(partition, &only_me).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;

    let add = Request::Metadata(MetaCommand::AddNode { node: 1 });
    let (_, added) = node.write(GroupId::METADATA, add, TIMEOUT).await.unwrap();
    assert_eq!(added, Response::Metadata(Ok(MetaOutcome::NodeAdded)));
    let nodes = node
        .read_metadata(GroupId::METADATA, TIMEOUT, |m| m.nodes().clone())
        .await
        .unwrap();
    assert_eq!(nodes, only_me);

    let empty = Request::Append(RecordBatch {
        record_count: 0,
        payload: Vec::new(),
    });
    let (_, refused) = node.write(partition, empty, TIMEOUT).await.unwrap();
    assert_eq!(refused, Response::Appended(Err(PartitionError::EmptyBatch)));
    let not_meta = node.read_metadata(partition, TIMEOUT, |_| ()).await;
    assert_eq!(not_meta, Err(ClusterError::NotMetadata(partition)));

    let unknown = node.write(
        GroupId(99),
        Request::Metadata(MetaCommand::AddNode { node: 2 }),
        TIMEOUT,
    );
    assert_eq!(
        unknown.await.err(),
        Some(ClusterError::NoSuchGroup(GroupId(99)))
    );

    let kept = node.stop_group(partition).await.unwrap();
    assert!(
        kept.log.last_index().is_some(),
        "the stopped group's log is handed back"
    );
    assert_eq!(node.group_ids(), vec![GroupId::METADATA]);
    node.start_group(partition, kept).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let batch = Request::Append(RecordBatch {
        record_count: 3,
        payload: b"abc".to_vec(),
    });
    let (_, appended) = node.write(partition, batch, TIMEOUT).await.unwrap();
    assert!(matches!(appended, Response::Appended(Ok(r)) if r.first == 0 && r.last == 2));
}
