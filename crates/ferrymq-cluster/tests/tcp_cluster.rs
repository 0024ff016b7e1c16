//! Three nodes over real TCP on 127.0.0.1 (ephemeral ports): elections and commits in the
//! metadata group and a partition group, a listener that goes away and comes back, and a node
//! of another cluster refused at the handshake. Every wait is a bounded poll for a state.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ferrymq_cluster::metadata::{MetaCommand, MetaOutcome};
use ferrymq_cluster::partition::{MemPartitionLog, RecordBatch};
use ferrymq_cluster::storage::GroupStorage;
use ferrymq_cluster::tcp::{TcpConfig, TcpServer, TcpTransport};
use ferrymq_cluster::transport::{Envelope, RaftRpc, Transport, TransportError};
use ferrymq_cluster::{ClusterError, ClusterNode, GroupId, GroupTiming, NodeId, Request, Response};
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use openraft::{CommittedLeaderId, EntryPayload, LogId, Vote};
use tokio::net::TcpListener;

const CLUSTER: &str = "ferry-test";
const PARTITION: GroupId = GroupId(1);
const WAIT: Duration = Duration::from_secs(15);

type Node = Arc<ClusterNode<TcpTransport>>;

struct Cluster {
    nodes: BTreeMap<NodeId, Node>,
    transports: BTreeMap<NodeId, TcpTransport>,
    servers: BTreeMap<NodeId, TcpServer>,
    addrs: BTreeMap<NodeId, SocketAddr>,
}

/// Polls `check` every 10 ms until it gives `Some`, failing the test after `WAIT`.
async fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn start_cluster(size: u64) -> Cluster {
    start_cluster_with(size, TcpConfig::new(CLUSTER, 0).max_frame_bytes).await
}

async fn start_cluster_with(size: u64, max_frame_bytes: u32) -> Cluster {
    let mut listeners = BTreeMap::new();
    for id in 1..=size {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listeners.insert(id, listener);
    }
    let addrs: BTreeMap<NodeId, SocketAddr> = listeners
        .iter()
        .map(|(&id, l)| (id, l.local_addr().unwrap()))
        .collect();
    let mut cluster = Cluster {
        nodes: BTreeMap::new(),
        transports: BTreeMap::new(),
        servers: BTreeMap::new(),
        addrs: addrs.clone(),
    };
    for (id, listener) in listeners {
        let config = TcpConfig {
            max_frame_bytes,
            ..TcpConfig::new(CLUSTER, id)
        };
        let transport = TcpTransport::new(config.clone(), addrs.clone());
        let node = Arc::new(ClusterNode::new(transport.clone(), GroupTiming::default()));
        let server = TcpServer::serve(listener, &config, node.router()).unwrap();
        let _clock = node.spawn_heartbeats();
        node.start_group(GroupId::METADATA, GroupStorage::metadata())
            .await
            .unwrap();
        let log = Box::<MemPartitionLog>::default();
        node.start_group(PARTITION, GroupStorage::partition(log))
            .await
            .unwrap();
        cluster.nodes.insert(id, node);
        cluster.transports.insert(id, transport);
        cluster.servers.insert(id, server);
    }
    let members: BTreeSet<NodeId> = (1..=size).collect();
    cluster.nodes[&1]
        .initialize(GroupId::METADATA, &members)
        .await
        .unwrap();
    cluster.nodes[&2]
        .initialize(PARTITION, &members)
        .await
        .unwrap();
    cluster
}

impl Cluster {
    /// Writes through whichever node leads `group`, retrying until `WAIT` has passed.
    async fn write(&self, group: GroupId, request: Request) -> (u64, Response) {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut at = 1;
        loop {
            let attempt = self.nodes[&at]
                .write(group, request.clone(), Duration::from_secs(2))
                .await;
            match attempt {
                Ok((log_id, response)) => return (log_id.index, response),
                Err(ClusterError::NotLeader {
                    leader: Some(l), ..
                }) => at = l,
                Err(_) => {
                    at = at % self.nodes.len() as u64 + 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no write to {group} within {WAIT:?}"
            );
        }
    }

    fn applied(&self, node: NodeId, group: GroupId) -> u64 {
        let metrics = self.nodes[&node].metrics(group).unwrap();
        let applied = metrics.borrow().last_applied;
        applied.map_or(0, |l| l.index)
    }

    /// Waits until every node has applied `group` up to `index`.
    async fn wait_applied(&self, group: GroupId, index: u64) {
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        wait_for(&format!("{group} applied to {index} everywhere"), || {
            ids.iter()
                .all(|&n| self.applied(n, group) >= index)
                .then_some(())
        })
        .await;
    }

    fn leader(&self, group: GroupId) -> Option<NodeId> {
        let metrics = self.nodes[&1].metrics(group).ok()?;
        let leader = metrics.borrow().current_leader;
        leader
    }
}

fn batch(tag: u8) -> Request {
    Request::Append(RecordBatch {
        record_count: 2,
        payload: vec![tag, tag],
    })
}

fn a_vote(from: NodeId, to: NodeId, group: GroupId) -> Envelope {
    Envelope {
        group,
        from,
        to,
        rpc: RaftRpc::Vote(VoteRequest::new(Vote::new(0, from), None)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_over_tcp_elect_and_commit_in_two_groups() {
    let cluster = start_cluster(3).await;
    let meta_leader = wait_for("a metadata leader", || cluster.leader(GroupId::METADATA)).await;
    assert!((1..=3).contains(&meta_leader));
    for node in 1..=3 {
        let add = Request::Metadata(MetaCommand::AddNode { node });
        let (_, response) = cluster.write(GroupId::METADATA, add).await;
        assert_eq!(response, Response::Metadata(Ok(MetaOutcome::NodeAdded)));
    }
    let create = Request::Metadata(MetaCommand::CreateTopic {
        name: "orders".into(),
        partitions: 3,
        replicas: 3,
        config: Vec::new(),
    });
    let (meta_index, created) = cluster.write(GroupId::METADATA, create).await;
    assert!(matches!(
        created,
        Response::Metadata(Ok(MetaOutcome::TopicCreated { .. }))
    ));
    let mut last = 0;
    for tag in 0..5u8 {
        let (index, response) = cluster.write(PARTITION, batch(tag)).await;
        let first = u64::from(tag) * 2;
        let Response::Appended(Ok(offsets)) = response else {
            panic!("{response:?}")
        };
        assert_eq!((offsets.first, offsets.last), (first, first + 1));
        last = index;
    }
    cluster.wait_applied(GroupId::METADATA, meta_index).await;
    cluster.wait_applied(PARTITION, last).await;
    for node in cluster.nodes.values() {
        let storage = node.storage(PARTITION).unwrap();
        let next = storage.state.read(|data| match data {
            ferrymq_cluster::storage::GroupData::Partition(p) => p.log().next_offset(),
            _ => unreachable!(),
        });
        assert_eq!(next, 10, "node {} holds every record", node.id());
    }
    // Links are made on first use: the leader has one to each follower.
    let leader = cluster.leader(GroupId::METADATA).unwrap();
    for to in (1..=3).filter(|&to| to != leader) {
        assert!(
            cluster.transports[&leader].is_connected(to),
            "{leader} -> {to}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_listener_restarts_catches_up() {
    let mut cluster = start_cluster(3).await;
    let (first, _) = cluster.write(PARTITION, batch(1)).await;
    cluster.wait_applied(PARTITION, first).await;

    let down = 3;
    drop(cluster.servers.remove(&down));
    let probe = cluster.transports[&1].clone();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let answer = probe
            .call(a_vote(1, down, GroupId(99)), Duration::from_millis(500))
            .await;
        if matches!(answer, Err(TransportError::Unreachable { .. })) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node 3 still reachable"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // The other two still form a majority and commit.
    let (during, _) = cluster.write(PARTITION, batch(2)).await;

    let config = TcpConfig::new(CLUSTER, down);
    let server = TcpServer::bind(cluster.addrs[&down], &config, cluster.nodes[&down].router())
        .await
        .unwrap();
    cluster.servers.insert(down, server);
    wait_for("node 1 reconnected to node 3", || {
        probe.is_connected(down).then_some(())
    })
    .await;
    let (after, _) = cluster.write(PARTITION, batch(3)).await;
    assert!(after > during);
    cluster.wait_applied(PARTITION, after).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_another_cluster_is_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = TcpConfig::new(CLUSTER, 1);
    let node = Arc::new(ClusterNode::new(
        TcpTransport::new(config.clone(), BTreeMap::<NodeId, SocketAddr>::new()),
        GroupTiming::default(),
    ));
    let _server = TcpServer::serve(listener, &config, node.router()).unwrap();
    let peers = BTreeMap::from([(1, addr)]);

    let same = TcpTransport::new(TcpConfig::new(CLUSTER, 2), peers.clone());
    let answer = same
        .call(a_vote(2, 1, GroupId(99)), Duration::from_secs(5))
        .await;
    assert_eq!(
        answer.unwrap_err(),
        TransportError::NoSuchGroup {
            node: 1,
            group: GroupId(99)
        },
        "a node of the same cluster is answered by the group router"
    );

    let other = TcpTransport::new(TcpConfig::new("another-cluster", 9), peers);
    let mut refused = None;
    let deadline = tokio::time::Instant::now() + WAIT;
    while refused.is_none() {
        assert!(tokio::time::Instant::now() < deadline, "never refused");
        let answer = other
            .call(a_vote(9, 1, GroupId(99)), Duration::from_secs(5))
            .await;
        match answer {
            Err(TransportError::Refused { node: 1, reason }) => refused = Some(reason),
            Err(TransportError::Unreachable { .. }) | Err(TransportError::Timeout { .. }) => {
                tokio::time::sleep(Duration::from_millis(10)).await
            }
            other => panic!("a node of another cluster got {other:?}"),
        }
    }
    let reason = refused.unwrap();
    assert!(reason.contains("cluster id mismatch"), "{reason}");
    assert!(reason.contains("another-cluster"), "{reason}");
    assert!(!other.is_connected(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_larger_than_one_frame_are_split_or_refused() {
    const LIMIT: u32 = 16 << 10;
    let cluster = start_cluster_with(3, LIMIT).await;
    let leader = wait_for("a partition leader", || cluster.leader(PARTITION)).await;

    // One message that fits no frame is refused at once, typed.
    let entry = ferrymq_cluster::types::Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, leader), 1),
        payload: EntryPayload::Normal(Request::Append(RecordBatch {
            record_count: 1,
            payload: vec![7; LIMIT as usize],
        })),
    };
    let to = leader % 3 + 1;
    let huge = Envelope {
        group: GroupId(99),
        from: leader,
        to,
        rpc: RaftRpc::AppendEntries(AppendEntriesRequest {
            vote: Vote::new_committed(1, leader),
            prev_log_id: None,
            entries: vec![entry],
            leader_commit: None,
        }),
    };
    let answer = cluster.transports[&leader]
        .call(huge, Duration::from_secs(5))
        .await;
    assert!(
        matches!(answer, Err(TransportError::FrameTooLarge { node, .. }) if node == to),
        "{answer:?}"
    );

    // Many appends that together exceed a frame are replicated in several.
    let mut writes = tokio::task::JoinSet::new();
    for tag in 0..20u8 {
        let node = cluster.nodes[&leader].clone();
        let request = Request::Append(RecordBatch {
            record_count: 2,
            payload: vec![tag; 3000],
        });
        writes.spawn(async move { node.write(PARTITION, request, WAIT).await });
    }
    let mut last = 0;
    while let Some(written) = writes.join_next().await {
        let (log_id, response) = written.unwrap().expect("append committed");
        assert!(
            matches!(response, Response::Appended(Ok(_))),
            "{response:?}"
        );
        last = last.max(log_id.index);
    }
    cluster.wait_applied(PARTITION, last).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_link_queue_is_refused_and_calls_time_out() {
    // A peer that accepts the TCP connection but never answers the handshake.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let peers = BTreeMap::from([(2, silent.local_addr().unwrap())]);
    let config = TcpConfig {
        queue_capacity: 1,
        handshake_timeout: Duration::from_secs(5),
        ..TcpConfig::new(CLUSTER, 1)
    };
    let transport = TcpTransport::new(config, peers);
    // The link waits for the handshake, so the first call's request stays queued until it
    // times out, and fills the queue of one.
    let started = tokio::time::Instant::now();
    let answer = transport
        .call(a_vote(1, 2, GroupId(99)), Duration::from_millis(300))
        .await;
    let took = started.elapsed();
    assert_eq!(
        answer.unwrap_err(),
        TransportError::Timeout {
            node: 2,
            timeout_ms: 300
        }
    );
    assert!(took < Duration::from_secs(2), "the call waited {took:?}");
    let started = tokio::time::Instant::now();
    let answer = transport
        .call(a_vote(1, 2, GroupId(99)), Duration::from_secs(5))
        .await;
    assert_eq!(answer.unwrap_err(), TransportError::QueueFull { node: 2 });
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused at once"
    );
    drop(silent);
}
