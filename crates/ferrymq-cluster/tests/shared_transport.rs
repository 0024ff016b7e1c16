//! Many groups on a few nodes share one link per pair of nodes, and the node's heartbeat clock
//! lets one frame carry many groups' heartbeats.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ferrymq_cluster::inproc::{FaultConfig, InProcNetwork, InProcTransport};
use ferrymq_cluster::partition::{MemPartitionLog, OffsetRange, RecordBatch};
use ferrymq_cluster::storage::GroupStorage;
use ferrymq_cluster::{ClusterError, ClusterNode, GroupId, GroupTiming, NodeId, Request, Response};

const GROUPS: u64 = 24;
const NODES: u64 = 3;

async fn write_anywhere(
    nodes: &BTreeMap<NodeId, Arc<ClusterNode<InProcTransport>>>,
    group: GroupId,
    request: Request,
) -> Response {
    let mut at = 1;
    loop {
        match nodes[&at]
            .write(group, request.clone(), Duration::from_secs(1))
            .await
        {
            Ok((_, response)) => return response,
            Err(ClusterError::NotLeader {
                leader: Some(l), ..
            }) => at = l,
            Err(_) => {
                at = at % NODES + 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn many_groups_share_one_link_per_peer() {
    ferrymq_cluster::runtime::seed_thread_rng(1);
    let net = InProcNetwork::new(1, FaultConfig::default());
    let members: BTreeSet<NodeId> = (1..=NODES).collect();
    let mut nodes = BTreeMap::new();
    for id in 1..=NODES {
        let node = Arc::new(ClusterNode::new(net.transport(id), GroupTiming::default()));
        net.attach(id, node.router());
        let _clock = node.spawn_heartbeats();
        for g in 1..=GROUPS {
            let storage = GroupStorage::partition(Box::<MemPartitionLog>::default());
            node.start_group(GroupId(g), storage).await.unwrap();
        }
        nodes.insert(id, node);
    }
    for g in 1..=GROUPS {
        let first = &nodes[&(g % NODES + 1)];
        first.initialize(GroupId(g), &members).await.unwrap();
    }
    for g in 1..=GROUPS {
        let batch = RecordBatch {
            record_count: 2,
            payload: b"ab".to_vec(),
        };
        let response = write_anywhere(&nodes, GroupId(g), Request::Append(batch)).await;
        assert_eq!(
            response,
            Response::Appended(Ok(OffsetRange { first: 0, last: 1 }))
        );
    }
    let before = net.stats();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle = net.stats();
    let envelopes = idle.envelopes_sent - before.envelopes_sent;
    let frames = idle.frames_sent - before.frames_sent;
    eprintln!("idle: {envelopes} heartbeats in {frames} frames");
    assert_eq!(net.link_count(), (NODES * (NODES - 1)) as usize);
    assert!(envelopes > 0);
    // Idle traffic is heartbeats; at least four groups' worth share each frame on average.
    assert!(
        envelopes >= 4 * frames,
        "{envelopes} heartbeats in {frames} frames"
    );
    let wrong = write_anywhere(
        &nodes,
        GroupId(1),
        Request::Metadata(ferrymq_cluster::metadata::MetaCommand::DeleteTopic { name: "x".into() }),
    )
    .await;
    assert_eq!(wrong, Response::WrongGroup);
}
