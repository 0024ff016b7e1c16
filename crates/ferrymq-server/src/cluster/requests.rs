//! What clients ask of a cluster node: replicated topics created and deleted through the
//! metadata group, publishes proposed to their partitions' groups, and the view of who leads
//! what.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use bytes::Bytes;

use ferrymq_broker::{BrokerError, PublishReceipt, Topic};
use ferrymq_cluster::metadata::{MetaCommand, MetaError, MetaOutcome, TopicMeta};
use ferrymq_cluster::storage::GroupData;
use ferrymq_cluster::{ClusterError, GroupId, NodeId, Request, Response};
use ferrymq_protocol::{Durability, OffsetRange, RecordBatch, TopicConfig, HEADER_DEDUP_ID};

use super::controller::encode_config;
use super::Cluster;

/// One partition of a replicated topic, as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionView {
    pub topic: String,
    pub partition: u32,
    /// Its Raft group.
    pub group: u64,
    /// The node leading its group, when this node runs a replica of it and knows.
    pub leader: Option<NodeId>,
    /// The nodes holding a replica; the first is the preferred leader.
    pub replicas: Vec<NodeId>,
}

/// The cluster as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    pub node_id: NodeId,
    /// The metadata group's leader.
    pub metadata_leader: Option<NodeId>,
    /// Every node: its id and, once known, where clients reach it.
    pub nodes: Vec<(NodeId, Option<String>)>,
    pub partitions: Vec<PartitionView>,
}

/// How long creating a topic waits for the partitions placed here to elect their leaders, so
/// that a publish right after it finds them.
const LEADERS_WAIT: Duration = Duration::from_secs(5);

/// How long a publish waits for a leader just elected to apply its predecessors' entries.
const TAKE_OVER_WAIT: Duration = Duration::from_secs(2);

impl Cluster {
    /// The replicated topic `name`, if the metadata (as applied here) has it.
    /// Read in place: it is asked on every publish, and the metadata holds every topic.
    pub fn replicated(&self, name: &str) -> Option<TopicMeta> {
        let storage = self.node.storage(GroupId::METADATA).ok()?;
        storage.state.read(|data| match data {
            GroupData::Metadata(m) => m.topic(name).cloned(),
            GroupData::Partition(_) => None,
        })
    }

    /// Who leads what, as this node knows it.
    pub fn view(&self) -> ClusterView {
        let state = self.local_metadata().unwrap_or_default();
        let directory = self.directory.all();
        let nodes = self
            .members()
            .keys()
            .map(|id| (*id, directory.get(id).cloned()))
            .collect();
        let partitions = state
            .topics()
            .iter()
            .flat_map(|(name, t)| {
                t.partitions
                    .iter()
                    .enumerate()
                    .map(move |(p, placement)| (name, p, placement))
            })
            .map(|(name, p, placement)| PartitionView {
                topic: name.clone(),
                partition: p as u32,
                group: placement.group.0,
                leader: self.leader_of(placement.group),
                replicas: placement.replicas.clone(),
            })
            .collect();
        ClusterView {
            node_id: self.settings.node_id,
            metadata_leader: self.leader_of(GroupId::METADATA),
            nodes,
            partitions,
        }
    }

    pub(super) fn leader_of(&self, group: GroupId) -> Option<NodeId> {
        let metrics = self.node.metrics(group).ok()?;
        let leader = metrics.borrow().current_leader;
        leader
    }

    /// `not_leader` for `what` (led by `group`), naming its leader and address when known.
    fn not_leader(&self, what: &str, group: GroupId, leader: Option<NodeId>) -> BrokerError {
        let me = self.settings.node_id;
        let leader = leader.or_else(|| self.leader_of(group));
        BrokerError::NotLeader(match leader {
            Some(id) if id != me => match self.directory.get(id) {
                Some(addr) => format!("node {me} does not lead {what}: node {id} at {addr} does"),
                None => format!("node {me} does not lead {what}: node {id} does"),
            },
            _ => format!("{what} has no leader at the moment (an election is under way); retry"),
        })
    }

    fn unknown_outcome(&self, what: &str, error: &ClusterError) -> BrokerError {
        BrokerError::Storage(format!(
            "replicating {what}: {error}; the request may or may not have taken effect"
        ))
    }

    /// Creates a replicated topic through the metadata group: placed on `replicas` nodes
    /// (the cluster's default when 0), created on each by its controller. Returns once this node
    /// has it and the partitions placed here have leaders.
    pub async fn create_topic(
        &self,
        name: &str,
        config: TopicConfig,
        if_not_exists: bool,
    ) -> Result<(), BrokerError> {
        if if_not_exists && self.replicated(name).is_some() {
            // Known here already: any node answers, as a single node does.
            return Ok(());
        }
        let replicas = self.replicas_for(config.replicas)?;
        let config = self.broker.resolve_config(config)?;
        // Placement uses the recorded members: record any configured peer not yet recorded
        // (the controller does so too, but a topic created at once must not wait for it).
        self.add_missing_members().await;
        self.check_members(replicas)?;
        let command = MetaCommand::CreateTopic {
            name: name.to_owned(),
            partitions: config.partitions,
            replicas,
            config: encode_config(name, &config),
        };
        match self.write_metadata(command, "the topic").await? {
            Ok(MetaOutcome::TopicCreated { .. }) => {}
            Err(MetaError::TopicExists(_)) if if_not_exists => {}
            Err(MetaError::TopicExists(_)) => {
                return Err(BrokerError::TopicExists(name.to_owned()))
            }
            Err(e) => return Err(BrokerError::invalid("topic", e.to_string())),
            Ok(other) => {
                return Err(BrokerError::Storage(format!(
                    "the metadata group answered {other:?}"
                )))
            }
        }
        self.broker.create_topic(name, config, true)?;
        self.wait_for_leaders(name).await;
        Ok(())
    }

    /// Refuses, as retryable, a topic's creation while the metadata holds fewer members than
    /// it needs replicas: a leader just elected records the configured peers first (a refusal
    /// of the placement would read as the client's mistake).
    fn check_members(&self, replicas: u32) -> Result<(), BrokerError> {
        let members = self.local_metadata().map_or(0, |s| s.nodes().len());
        if members >= replicas as usize {
            return Ok(());
        }
        if !self.leads(GroupId::METADATA) {
            return Err(self.not_leader("the cluster metadata", GroupId::METADATA, None));
        }
        Err(BrokerError::NotLeader(format!(
            "node {} leads the cluster metadata and has recorded {members} of its nodes so far; \
             retry in a moment",
            self.settings.node_id
        )))
    }

    /// The replicas a topic asking for `asked` gets: the cluster's default for 0; 1, 3 or 5 when
    /// the cluster has that many nodes.
    fn replicas_for(&self, asked: u8) -> Result<u32, BrokerError> {
        let nodes = self.members().len();
        match asked {
            0 => Ok(self.settings.replicas_default()),
            1 | 3 | 5 if usize::from(asked) <= nodes => Ok(u32::from(asked)),
            1 | 3 | 5 => Err(BrokerError::invalid(
                "replicas",
                format!(
                    "{asked}, but the cluster has {nodes} node(s): add nodes, or ask for at most \
                     {nodes}"
                ),
            )),
            _ => Err(BrokerError::invalid(
                "replicas",
                format!("{asked}: give 1, 3 or 5 (a majority of 3 or 5 survives a node or two)"),
            )),
        }
    }

    /// Proposes `command` to the metadata group here, which must lead it. The outer error is the
    /// client's answer (`not_leader`, or an unknown outcome naming `what`); the inner result is
    /// the command's own, the same on every replica.
    pub(super) async fn write_metadata(
        &self,
        command: MetaCommand,
        what: &str,
    ) -> Result<Result<MetaOutcome, MetaError>, BrokerError> {
        let timeout = self.settings.write_timeout;
        let written = self
            .node
            .write(GroupId::METADATA, Request::Metadata(command), timeout)
            .await;
        match written {
            Ok((_, Response::Metadata(outcome))) => Ok(outcome),
            Ok((_, other)) => Err(BrokerError::Storage(format!(
                "the metadata group answered {other:?}"
            ))),
            Err(ClusterError::NotLeader { leader, .. }) => {
                Err(self.not_leader("the cluster metadata", GroupId::METADATA, leader))
            }
            Err(e) => Err(self.unknown_outcome(what, &e)),
        }
    }

    /// Waits (bounded) until every partition of `name` placed here has a leader.
    pub(super) async fn wait_for_leaders(&self, name: &str) {
        let deadline = Instant::now() + LEADERS_WAIT;
        while Instant::now() < deadline {
            let me = self.settings.node_id;
            let ready = self.replicated(name).is_some_and(|t| {
                t.partitions
                    .iter()
                    .filter(|p| p.replicas.contains(&me))
                    .all(|p| self.leader_of(p.group).is_some())
            });
            if ready {
                // Open the partitions led here now rather than at the gate's next pass.
                self.update_gates();
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Deletes a replicated topic through the metadata group; each node's controller then
    /// deletes it there.
    pub async fn delete_topic(&self, name: &str) -> Result<(), BrokerError> {
        let command = MetaCommand::DeleteTopic {
            name: name.to_owned(),
        };
        match self.write_metadata(command, "the deletion").await? {
            Ok(_) => {}
            Err(MetaError::NoSuchTopic(_)) => {
                return Err(BrokerError::UnknownTopic(name.to_owned()))
            }
            Err(e) => return Err(BrokerError::invalid("topic", e.to_string())),
        }
        match self.broker.delete_topic(name) {
            Ok(()) | Err(BrokerError::UnknownTopic(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Publishes to a replicated topic: each partition's part, less the messages whose
    /// deduplication id the partition's window holds, is proposed to its group here, which must
    /// serve it, and acknowledged once committed by a majority of its replicas.
    pub async fn publish(
        &self,
        topic: &Topic,
        meta: &TopicMeta,
        partition: Option<u32>,
        records: RecordBatch,
    ) -> Result<PublishReceipt, BrokerError> {
        let parts = self.broker.split_by_partition(topic, partition, &records)?;
        let mut ranges: Vec<OffsetRange> = Vec::new();
        let mut duplicates = Vec::new();
        // Messages of the parts before this one, for the duplicates' indexes.
        let mut base = 0usize;
        for (p, part) in parts {
            let count = part.count() as usize;
            let (part_ranges, part_duplicates) = self.publish_here(topic, meta, p, part).await?;
            ranges.extend(part_ranges);
            duplicates.extend(part_duplicates.into_iter().map(|i| base + i));
            base += count;
        }
        Ok(PublishReceipt {
            durability: Durability::Synced,
            ranges: ranges.into(),
            duplicates,
        })
    }

    /// One partition's part of a publish, at this node, which must serve the partition (after
    /// waiting, bounded, for a leader just elected): where its messages are, as ranges, and the
    /// indexes of its duplicates.
    pub(super) async fn publish_here(
        &self,
        topic: &Topic,
        meta: &TopicMeta,
        p: u32,
        part: RecordBatch,
    ) -> Result<(Vec<OffsetRange>, Vec<usize>), BrokerError> {
        let Some(placement) = meta.partitions.get(p as usize) else {
            return Err(BrokerError::invalid(
                "partition",
                format!("{p} is not placed"),
            ));
        };
        let what = format!("partition {p} of '{}'", topic.name());
        if self.node.raft(placement.group).is_err() {
            return Err(self.not_leader(&what, placement.group, None));
        }
        if !self.await_serving(topic, p, placement.group).await {
            // Not its leader, or a leader still applying its predecessors' entries (whose
            // deduplication ids a retry must be checked against).
            if self.leads(placement.group) {
                return Err(BrokerError::NotLeader(format!(
                    "node {} was just elected leader of {what} and is applying what its \
                     predecessors committed; retry in a moment",
                    self.settings.node_id
                )));
            }
            return Err(self.not_leader(&what, placement.group, None));
        }
        self.publish_part(topic, p, placement.group, part, &what)
            .await
    }

    /// Whether this node serves `partition` of `topic`; a leader just elected is waited for
    /// (bounded) while it applies its predecessors' entries, so that a publish right after an
    /// election is not refused.
    async fn await_serving(&self, topic: &Topic, partition: u32, group: GroupId) -> bool {
        let deadline = Instant::now() + TAKE_OVER_WAIT;
        loop {
            if self.broker.serving_term(topic, partition).is_some() {
                return true;
            }
            if !self.leads(group) || Instant::now() >= deadline {
                return false;
            }
            self.update_gates();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// One partition's part of a publish: its duplicates answered from the window, the rest
    /// proposed. Returns where its messages are, as ranges, and the duplicates' indexes.
    async fn publish_part(
        &self,
        topic: &Topic,
        p: u32,
        group: GroupId,
        part: RecordBatch,
        what: &str,
    ) -> Result<(Vec<OffsetRange>, Vec<usize>), BrokerError> {
        let Some(check) = self.broker.replicated_duplicates(topic, &part)? else {
            // No dedup id: one range, without an id per message.
            let count = part.count();
            let first = self.propose_batch(group, part, what).await?;
            let range = OffsetRange {
                partition: p,
                offset: first,
                count,
            };
            return Ok((vec![range], Vec::new()));
        };
        let first = match &check.kept {
            None => 0,
            Some(kept) => {
                // Held until the outcome is known: a retry of the same id meanwhile is refused
                // rather than stored a second time.
                let _claim = DedupClaim::take(&self.dedup_pending, topic.name(), kept)?;
                self.propose_batch(group, kept.clone(), what).await?
            }
        };
        let (ids, duplicates) = check.ids(p, first);
        Ok((OffsetRange::coalesce_into(ids), duplicates))
    }

    /// Proposes one batch to `group` here, folded with the other publishes waiting for it
    /// (`fold.rs`); the offset its first record got.
    async fn propose_batch(
        &self,
        group: GroupId,
        part: RecordBatch,
        what: &str,
    ) -> Result<u64, BrokerError> {
        let timeout = self.settings.write_timeout;
        let records = (part.count(), part.bytes().clone());
        match self.folds.append(&self.node, group, records, timeout).await {
            Ok(first) => Ok(first),
            Err(ClusterError::NotLeader { leader, .. }) => {
                Err(self.not_leader(what, group, leader))
            }
            Err(e) => Err(self.unknown_outcome(what, &e)),
        }
    }
}

/// The deduplication ids of a publish being replicated on this node, by topic.
pub(super) type PendingIds = parking_lot::Mutex<HashSet<(String, Bytes)>>;

/// The ids of one batch in [`PendingIds`] while it is replicated.
struct DedupClaim<'a> {
    pending: &'a PendingIds,
    keys: Vec<(String, Bytes)>,
}

impl<'a> DedupClaim<'a> {
    fn take(
        pending: &'a PendingIds,
        topic: &str,
        batch: &RecordBatch,
    ) -> Result<Self, BrokerError> {
        let bytes = batch.bytes();
        let keys: Vec<(String, Bytes)> = batch
            .spans()
            .filter_map(|span| {
                ferrymq_protocol::record_header(&bytes[span.start..span.end], HEADER_DEDUP_ID)
                    .map(|id| (topic.to_owned(), Bytes::copy_from_slice(id)))
            })
            .collect();
        let mut held = pending.lock();
        if let Some((_, id)) = keys.iter().find(|k| held.contains(*k)) {
            return Err(BrokerError::Storage(format!(
                "a publish with dedup id '{}' to '{topic}' is still being replicated; retry once it \
                 is answered",
                String::from_utf8_lossy(id)
            )));
        }
        held.extend(keys.iter().cloned());
        drop(held);
        Ok(DedupClaim { pending, keys })
    }
}

impl Drop for DedupClaim<'_> {
    fn drop(&mut self) {
        let mut held = self.pending.lock();
        for key in &self.keys {
            held.remove(key);
        }
    }
}
