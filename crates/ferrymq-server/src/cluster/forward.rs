//! Requests a node passes on to the node that can answer them, so that a client reaching any
//! node is served: a publish's part for a partition this node does not lead goes to that
//! partition's leader, a topic's creation or deletion to the metadata group's leader. They travel
//! over the peers' connection ([`ClusterNode::forward`]), already authenticated and authorized
//! by the node the client reached; the node that receives one answers it as its own client's
//! request and never passes it on again.
//!
//! The binary protocol's clients follow leaders themselves (`not_leader` names the leader);
//! HTTP callers cannot, so HTTP goes through here.
//!
//! [`ClusterNode::forward`]: ferrymq_cluster::ClusterNode::forward

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use ferrymq_broker::{BrokerError, PublishReceipt, Topic};
use ferrymq_cluster::metadata::{MetaCommand, TopicMeta};
use ferrymq_cluster::transport::{ForwardFuture, ForwardHandler, TransportError};
use ferrymq_cluster::{GroupId, NodeId};
use ferrymq_protocol::{Durability, ErrorCode, OffsetRange, RecordBatch, TopicConfig};

use super::controller::{decode_config, encode_config};
use super::status::GroupState;
use super::Cluster;

/// How long a request waits for the leader it needs: an election (about 1 to 1.5 election
/// timeouts) and the new leader's take-over fit well within it.
const LEADER_WAIT: Duration = Duration::from_secs(5);

/// Between two tries while a leader is elected or unreachable.
const RETRY_PAUSE: Duration = Duration::from_millis(25);

/// A request passed to another node.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Forwarded {
    /// One partition's part of a publish, for that partition's leader.
    Publish {
        topic: String,
        partition: u32,
        count: u32,
        records: Vec<u8>,
    },
    /// For the metadata group's leader; the config is encoded as the metadata holds it.
    CreateTopic {
        name: String,
        config: Vec<u8>,
        if_not_exists: bool,
    },
    DeleteTopic {
        name: String,
    },
    /// The node's status, as its [`StatusSource`] gives it.
    Status,
    /// For the metadata group's leader: admit a node (`ferrymq cluster add-node`).
    Join {
        node: NodeId,
        cluster_addr: String,
    },
    /// For the metadata group's leader: remove a node (`ferrymq cluster remove-node`).
    Leave {
        node: NodeId,
    },
    /// For the metadata group's leader: a user's whole record (`None`: removed).
    PutUser {
        name: String,
        record: Option<Vec<u8>>,
    },
    /// For the metadata group's leader: the users of a node, taken if the metadata holds none.
    SeedUsers {
        users: std::collections::BTreeMap<String, Vec<u8>>,
    },
    /// A request of the HTTP API's own (a consumer's poll, ack or nack), for its
    /// [`HttpAnswerer`]: bytes the HTTP API defines, carried unread.
    Http(Vec<u8>),
}

/// A partition, its leader as a node knows it, and its replicas
/// ([`Cluster::partition_leaders`]).
pub type PartitionLeader = (u32, Option<NodeId>, Vec<NodeId>);

/// What answers the HTTP API's requests forwarded by other nodes ([`Cluster::forward_http`]).
pub type HttpAnswerer =
    Arc<dyn Fn(Vec<u8>) -> std::pin::Pin<Box<dyn Future<Output = Vec<u8>> + Send>> + Send + Sync>;

/// What a node answers a peer asking for its status besides its groups: bytes its HTTP API
/// defines (the cluster carries them without reading them).
pub type StatusSource = Arc<dyn Fn() -> Vec<u8> + Send + Sync>;

/// How long a peer's status is waited for: a node that does not answer in time is shown as
/// not answering rather than holding the page.
const STATUS_WAIT: Duration = Duration::from_secs(1);

/// What the node answered.
#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    /// `(partition, offset, count)` ranges and the indexes of the duplicates in the part.
    Published {
        ranges: Vec<(u32, u64, u32)>,
        duplicates: Vec<usize>,
    },
    Done,
    Status(PeerStatus),
    Http(Vec<u8>),
}

/// A node's status: what its [`StatusSource`] gives, and its Raft groups.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PeerStatus {
    pub resources: Vec<u8>,
    pub groups: Vec<GroupState>,
}

/// An error as the answering node's client would have read it: its protocol code and message.
type Reply = Result<Answer, (u16, String)>;

fn to_wire(error: BrokerError) -> (u16, String) {
    (error.code() as u16, error.to_string())
}

fn from_wire((code, message): (u16, String)) -> BrokerError {
    BrokerError::Remote {
        code: ErrorCode::from_u16(code).unwrap_or(ErrorCode::Internal),
        message,
    }
}

/// A forwarded publish's receipt, from the answer of `node`.
fn published(answer: Answer, node: NodeId) -> Option<(PublishReceipt, NodeId)> {
    let Answer::Published { ranges, duplicates } = answer else {
        return None;
    };
    let ranges = ranges
        .into_iter()
        .map(|(partition, offset, count)| OffsetRange {
            partition,
            offset,
            count,
        })
        .collect();
    let receipt = PublishReceipt {
        durability: Durability::Synced,
        ranges,
        duplicates,
    };
    Some((receipt, node))
}

/// The [`ForwardHandler`] of a cluster node.
pub(super) struct Handler(pub(super) Weak<Cluster>);

impl ForwardHandler for Handler {
    fn handle(&self, from: NodeId, request: Vec<u8>) -> ForwardFuture {
        let cluster = self.0.clone();
        Box::pin(async move {
            let request: Forwarded = bincode::deserialize(&request)
                .map_err(|e| format!("a forwarded request from node {from} is malformed: {e}"))?;
            let Some(cluster) = cluster.upgrade() else {
                return Err("the node is shutting down".to_owned());
            };
            let reply = cluster.answer(request).await.map_err(to_wire);
            bincode::serialize(&reply).map_err(|e| e.to_string())
        })
    }
}

impl Cluster {
    /// Answers a request another node forwarded, as this node's own (never passed on again).
    async fn answer(&self, request: Forwarded) -> Result<Answer, BrokerError> {
        match request {
            Forwarded::Publish {
                topic,
                partition,
                count,
                records,
            } => {
                let meta = self
                    .replicated(&topic)
                    .ok_or_else(|| BrokerError::UnknownTopic(topic.clone()))?;
                let handle = self.broker.topic(&topic)?;
                let records = RecordBatch::decode(count, Bytes::from(records))
                    .map_err(|e| BrokerError::invalid("records", e.to_string()))?;
                let receipt = self
                    .publish(&handle, &meta, Some(partition), records)
                    .await?;
                Ok(Answer::Published {
                    ranges: receipt
                        .ranges
                        .iter()
                        .map(|r| (r.partition, r.offset, r.count))
                        .collect(),
                    duplicates: receipt.duplicates,
                })
            }
            Forwarded::CreateTopic {
                name,
                config,
                if_not_exists,
            } => {
                let config = decode_config(&config)
                    .ok_or_else(|| BrokerError::invalid("config", "not a topic config"))?;
                self.create_topic(&name, config, if_not_exists).await?;
                Ok(Answer::Done)
            }
            Forwarded::DeleteTopic { name } => {
                self.delete_topic(&name).await?;
                Ok(Answer::Done)
            }
            Forwarded::Join { node, cluster_addr } => {
                self.add_node(node, &cluster_addr).await?;
                Ok(Answer::Done)
            }
            Forwarded::Leave { node } => {
                self.remove_node(node).await?;
                Ok(Answer::Done)
            }
            Forwarded::PutUser { name, record } => {
                let command = super::users::user_command(&name, record);
                self.write_users(command).await?;
                Ok(Answer::Done)
            }
            Forwarded::SeedUsers { users } => {
                self.write_users(MetaCommand::SeedUsers { users }).await?;
                Ok(Answer::Done)
            }
            Forwarded::Status => match self.status_source.get() {
                Some(source) => Ok(Answer::Status(PeerStatus {
                    resources: source(),
                    groups: self.group_states(),
                })),
                None => Err(BrokerError::ShuttingDown),
            },
            Forwarded::Http(request) => self.answer_http(request).await,
        }
    }

    /// Answers a request of another node's HTTP API with this node's.
    async fn answer_http(&self, request: Vec<u8>) -> Result<Answer, BrokerError> {
        match self.http_answerer.get() {
            Some(answer) => Ok(Answer::Http(answer(request).await)),
            None => Err(BrokerError::NotLeader(format!(
                "node {} is starting: its HTTP API is not up yet",
                self.node_id()
            ))),
        }
    }

    /// Sets what answers the HTTP API's requests forwarded by other nodes (once; later calls
    /// are ignored).
    pub fn set_http_answerer(&self, answerer: HttpAnswerer) {
        let _ = self.http_answerer.set(answerer);
    }

    /// Passes `request` (bytes the HTTP API defines) to node `to`'s HTTP API and waits at most
    /// `timeout` for its answer. `not_leader` when it never got there (down, unreachable,
    /// refused: trying again or elsewhere is safe), `storage_unavailable` when the answer did not
    /// come back (it may have been carried out there).
    pub async fn forward_http(
        &self,
        to: NodeId,
        request: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, BrokerError> {
        let me = self.node_id();
        let bytes = bincode::serialize(&Forwarded::Http(request))
            .map_err(|e| BrokerError::Storage(e.to_string()))?;
        let reply = match self.node.forward(to, bytes, timeout).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(reason)) => {
                return Err(BrokerError::Storage(format!(
                    "node {to} could not take the request passed on by node {me}: {reason}"
                )))
            }
            Err(
                e @ (TransportError::Unreachable { .. }
                | TransportError::Refused { .. }
                | TransportError::QueueFull { .. }),
            ) => {
                return Err(BrokerError::NotLeader(format!(
                    "node {me} cannot reach node {to} to pass the request on: {e}; retry once it \
                     is back or another node leads"
                )))
            }
            Err(e) => {
                return Err(BrokerError::Storage(format!(
                    "node {me} passed the request on to node {to} and got no answer: {e}"
                )))
            }
        };
        match bincode::deserialize::<Reply>(&reply) {
            Ok(Ok(Answer::Http(answer))) => Ok(answer),
            Ok(Err(error)) => Err(from_wire(error)),
            Ok(Ok(_)) | Err(_) => Err(BrokerError::Storage(format!(
                "node {to} answered the request passed on unreadably"
            ))),
        }
    }

    /// Sets what this node answers a peer asking for its status (once; later calls are
    /// ignored).
    pub fn set_status_source(&self, source: StatusSource) {
        let _ = self.status_source.set(source);
    }

    /// Every other node's status, asked at once: the bytes of its [`StatusSource`], or why it
    /// gave none (down, unreachable, no answer within a second).
    pub async fn peer_statuses(&self) -> Vec<(NodeId, Result<PeerStatus, String>)> {
        let me = self.node_id();
        let request = bincode::serialize(&Forwarded::Status).expect("a unit variant encodes");
        let mut asks = tokio::task::JoinSet::new();
        for &peer in self.members().keys().filter(|id| **id != me) {
            let (node, request) = (self.node.clone(), request.clone());
            asks.spawn(async move { (peer, node.forward(peer, request, STATUS_WAIT).await) });
        }
        let mut statuses = Vec::new();
        while let Some(asked) = asks.join_next().await {
            let Ok((peer, answer)) = asked else { continue };
            let status = match answer {
                Ok(Ok(bytes)) => match bincode::deserialize::<Reply>(&bytes) {
                    Ok(Ok(Answer::Status(status))) => Ok(status),
                    Ok(Err(error)) => Err(from_wire(error).to_string()),
                    Ok(Ok(_)) | Err(_) => Err(format!("node {peer} answered unreadably")),
                },
                Ok(Err(reason)) => Err(reason),
                Err(e) => Err(e.to_string()),
            };
            statuses.push((peer, status));
        }
        statuses.sort_by_key(|(peer, _)| *peer);
        statuses
    }

    /// Sends `request` to `to`. `Ok(None)`: it never got there (unreachable, refused, queue
    /// full), so trying again or elsewhere is safe.
    async fn send(
        &self,
        to: NodeId,
        request: &Forwarded,
        what: &str,
    ) -> Result<Option<Answer>, BrokerError> {
        let bytes = bincode::serialize(request).map_err(|e| BrokerError::Storage(e.to_string()))?;
        match self
            .node
            .forward(to, bytes, self.settings.write_timeout)
            .await
        {
            Ok(Ok(reply)) => {
                let reply: Reply = bincode::deserialize(&reply).map_err(|e| {
                    BrokerError::Storage(format!("node {to} answered {what} unreadably: {e}"))
                })?;
                reply.map(Some).map_err(from_wire)
            }
            Ok(Err(reason)) => Err(BrokerError::Storage(format!(
                "node {to} could not take {what}: {reason}"
            ))),
            Err(
                TransportError::Unreachable { .. }
                | TransportError::Refused { .. }
                | TransportError::QueueFull { .. },
            ) => Ok(None),
            Err(e) => Err(BrokerError::Storage(format!(
                "passing {what} to node {to}: {e}; it may or may not have taken effect"
            ))),
        }
    }

    /// The node to send a request for `group` to: its leader when this node knows it, else the
    /// replicas in turn (one that does not lead names the leader, or says none is elected).
    fn target(&self, group: GroupId, replicas: &[NodeId], attempt: usize) -> Option<NodeId> {
        self.leader_of(group)
            .or_else(|| replicas.get(attempt % replicas.len().max(1)).copied())
    }

    /// Why this node cannot deliver `partitions` of `topic` (all of them when empty): it leads
    /// none of them, and only a partition's leader delivers it. The message names each one's
    /// leader. `None` when the topic is not replicated, or this node leads one of them.
    pub fn unserved(&self, topic: &str, partitions: &[u32]) -> Option<String> {
        let meta = self.replicated(topic)?;
        let me = self.node_id();
        let wanted: Vec<u32> = match partitions {
            [] => (0..meta.partitions.len() as u32).collect(),
            some => some.to_vec(),
        };
        let mut leaders = Vec::new();
        for p in wanted {
            // A partition the topic does not have is the broker's to refuse.
            let placement = meta.partitions.get(p as usize)?;
            match self.leader_of(placement.group) {
                Some(leader) if leader == me => return None,
                Some(leader) => leaders.push(match self.directory.get(leader) {
                    Some(addr) => format!("partition {p} by node {leader} (clients at {addr})"),
                    None => format!("partition {p} by node {leader}"),
                }),
                None if !placement.replicas.contains(&me) => {
                    let replicas: Vec<String> =
                        placement.replicas.iter().map(u64::to_string).collect();
                    leaders.push(format!(
                        "partition {p} by one of nodes {} (node {me} holds no replica of it)",
                        replicas.join(",")
                    ))
                }
                None => leaders.push(format!("partition {p} by none yet (an election)")),
            }
        }
        Some(format!(
            "node {me} leads none of the partitions of '{topic}' asked for, and only a \
             partition's leader delivers it: {} are led; open the stream at a leader (GET \
             /cluster lists them) or poll through any node, or retry once a failover is over",
            leaders.join(", ")
        ))
    }

    /// The leader of each of `partitions` of `topic` (every partition when empty) as this node
    /// knows it, and its replicas. `None` for the leader while an election is under way, and on
    /// a node holding no replica of the partition, which does not hear its group's elections.
    /// Partitions the topic does not have are left out: they are the broker's to refuse. `None`
    /// when the topic is not replicated.
    pub fn partition_leaders(
        &self,
        topic: &str,
        partitions: &[u32],
    ) -> Option<Vec<PartitionLeader>> {
        let meta = self.replicated(topic)?;
        let wanted: Vec<u32> = match partitions {
            [] => (0..meta.partitions.len() as u32).collect(),
            some => some.to_vec(),
        };
        let leaders = wanted
            .into_iter()
            .filter_map(|p| {
                let placement = meta.partitions.get(p as usize)?;
                let leader = self.leader_of(placement.group);
                Some((p, leader, placement.replicas.clone()))
            })
            .collect();
        Some(leaders)
    }

    /// Whether a publish to `topic` goes through the cluster: a replicated topic, or one this
    /// node does not have (created replicated by the publish). A local topic from before the
    /// cluster is published to on this node, as before.
    pub fn publishes_to(&self, topic: &str) -> bool {
        self.replicated(topic).is_some() || self.broker.topic(topic).is_err()
    }

    /// A publish to `topic` by name from any node, as [`Cluster::publish_anywhere`]; a topic not
    /// known yet is created replicated first, if the broker creates topics on publish.
    pub async fn publish_named(
        &self,
        topic: &str,
        partition: Option<u32>,
        records: RecordBatch,
    ) -> Result<(PublishReceipt, Vec<NodeId>), BrokerError> {
        if self.replicated(topic).is_none() {
            if !self.broker.config().auto_create_topics {
                return Err(BrokerError::UnknownTopic(topic.to_owned()));
            }
            self.create_topic_anywhere(topic, TopicConfig::default(), true)
                .await?;
        }
        let meta = self
            .replicated(topic)
            .ok_or_else(|| BrokerError::UnknownTopic(topic.to_owned()))?;
        let handle = self.broker.topic(topic)?;
        self.publish_anywhere(&handle, &meta, partition, records)
            .await
    }

    /// Publishes to a replicated topic from any node: each partition's part is published here
    /// when this node leads the partition, and passed to its leader otherwise. Returns the
    /// receipt and the nodes that served the parts.
    pub async fn publish_anywhere(
        &self,
        topic: &Arc<Topic>,
        meta: &TopicMeta,
        partition: Option<u32>,
        records: RecordBatch,
    ) -> Result<(PublishReceipt, Vec<NodeId>), BrokerError> {
        let parts = self.broker.split_by_partition(topic, partition, &records)?;
        let mut receipt = PublishReceipt {
            durability: Durability::Synced,
            ranges: Default::default(),
            duplicates: Vec::new(),
        };
        let mut served = Vec::new();
        let mut base = 0usize;
        for (p, part) in parts {
            let count = part.count() as usize;
            let (part_receipt, node) = self.publish_part_anywhere(topic, meta, p, part).await?;
            receipt.ranges.extend(part_receipt.ranges);
            receipt
                .duplicates
                .extend(part_receipt.duplicates.into_iter().map(|i| base + i));
            if !served.contains(&node) {
                served.push(node);
            }
            base += count;
        }
        Ok((receipt, served))
    }

    /// One partition's part, published at its leader; retried (bounded by [`LEADER_WAIT`])
    /// while no leader is known or reachable, never once its outcome is unknown.
    async fn publish_part_anywhere(
        &self,
        topic: &Arc<Topic>,
        meta: &TopicMeta,
        p: u32,
        part: RecordBatch,
    ) -> Result<(PublishReceipt, NodeId), BrokerError> {
        let placement = meta
            .partitions
            .get(p as usize)
            .ok_or_else(|| BrokerError::invalid("partition", format!("{p} is not placed")))?;
        let what = format!("the publish to partition {p} of '{}'", topic.name());
        // Built on the first pass to another node: a part published here is not copied.
        let request = std::sync::OnceLock::new();
        let me = self.node_id();
        let nobody = || {
            format!(
                "{what} found no leader within {} s: the partition's replicas are down or \
                 unreachable from node {me}; retry once a majority of them runs",
                LEADER_WAIT.as_secs()
            )
        };
        let (part, what) = (&part, what.as_str());
        self.at_leader(placement.group, &placement.replicas, nobody, |node| {
            let request = &request;
            async move {
                if node == me {
                    let (ranges, duplicates) =
                        self.publish_here(topic, meta, p, part.clone()).await?;
                    let receipt = PublishReceipt {
                        durability: Durability::Synced,
                        ranges: ranges.into(),
                        duplicates,
                    };
                    return Ok(Some((receipt, me)));
                }
                let request = request.get_or_init(|| Forwarded::Publish {
                    topic: topic.name().to_owned(),
                    partition: p,
                    count: part.count(),
                    records: part.bytes().to_vec(),
                });
                let answer = self.send(node, request, what).await?;
                Ok(answer.and_then(|a| published(a, node)))
            }
        })
        .await
    }

    /// Runs `attempt` at the leader of `group`: this node or another, the `replicas` tried in
    /// turn while no leader is known here (one that does not lead names it, or says none is
    /// elected). Tried again while the answer is `not_leader` or the node was not reached
    /// (`Ok(None)`), bounded by [`LEADER_WAIT`]; `nobody` says why when no leader answered.
    async fn at_leader<T, F, Fut>(
        &self,
        group: GroupId,
        replicas: &[NodeId],
        nobody: impl Fn() -> String,
        mut attempt: F,
    ) -> Result<T, BrokerError>
    where
        F: FnMut(NodeId) -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>, BrokerError>>,
    {
        let deadline = Instant::now() + LEADER_WAIT;
        let mut tries = 0;
        loop {
            let outcome = match self.target(group, replicas, tries) {
                Some(node) => attempt(node).await,
                None => Ok(None),
            };
            tries += 1;
            match outcome {
                Ok(Some(done)) => return Ok(done),
                Err(e) if e.code() != ErrorCode::NotLeader || Instant::now() >= deadline => {
                    return Err(e)
                }
                Ok(None) if Instant::now() >= deadline => {
                    return Err(BrokerError::NotLeader(nobody()))
                }
                _ => tokio::time::sleep(RETRY_PAUSE).await,
            }
        }
    }

    /// Creates a replicated topic from any node: here when this node leads the metadata group,
    /// else at its leader, then waits (bounded) until this node has the topic too. Returns the
    /// node that created it.
    pub async fn create_topic_anywhere(
        &self,
        name: &str,
        config: TopicConfig,
        if_not_exists: bool,
    ) -> Result<NodeId, BrokerError> {
        let request = Forwarded::CreateTopic {
            name: name.to_owned(),
            config: encode_config(name, &config),
            if_not_exists,
        };
        let local = || self.create_topic(name, config.clone(), if_not_exists);
        let node = self
            .metadata_request(&request, "the topic's creation", local)
            .await?;
        self.wait_local(|| self.broker.topic(name).is_ok()).await;
        self.wait_for_leaders(name).await;
        Ok(node)
    }

    /// Deletes a replicated topic from any node, as [`Cluster::create_topic_anywhere`] creates it.
    pub async fn delete_topic_anywhere(&self, name: &str) -> Result<NodeId, BrokerError> {
        let request = Forwarded::DeleteTopic {
            name: name.to_owned(),
        };
        let node = self
            .metadata_request(&request, "the topic's deletion", || self.delete_topic(name))
            .await?;
        self.wait_local(|| self.replicated(name).is_none()).await;
        Ok(node)
    }

    /// Runs a metadata change here (`local`) or at the metadata group's leader, retried while
    /// the leader is unknown or unreachable, bounded by [`LEADER_WAIT`].
    pub(super) async fn metadata_request<F, Fut>(
        &self,
        request: &Forwarded,
        what: &str,
        local: F,
    ) -> Result<NodeId, BrokerError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<(), BrokerError>>,
    {
        let me = self.node_id();
        let peers: Vec<NodeId> = self.members().keys().copied().collect();
        let nobody = || {
            format!(
                "{what} found no metadata leader within {} s: fewer than a majority of the \
                 cluster's nodes are reachable from node {me}",
                LEADER_WAIT.as_secs()
            )
        };
        let local = &local;
        self.at_leader(GroupId::METADATA, &peers, nobody, |node| async move {
            if node == me {
                local().await?;
                return Ok(Some(me));
            }
            let answer = self.send(node, request, what).await?;
            Ok(answer.map(|_| node))
        })
        .await
    }

    /// Waits, bounded by [`LEADER_WAIT`], until this node's metadata and broker show `done`: a
    /// change made at the metadata leader reaches the others once they apply it.
    async fn wait_local(&self, done: impl Fn() -> bool) {
        let deadline = Instant::now() + LEADER_WAIT;
        while !done() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
