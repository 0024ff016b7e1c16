//! Follows the metadata on every node and makes the local broker match it: the cluster's members
//! recorded, each replicated topic created here with its configuration, the groups of the
//! partitions placed here started (and stopped once their topic is deleted).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Weak;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ferrymq_cluster::metadata::{MetaCommand, MetadataState, TopicMeta};
use ferrymq_cluster::storage::{GroupData, GroupLog, GroupStorage};
use ferrymq_cluster::{GroupId, NodeId, Request};
use ferrymq_protocol::{Frame, FrameHeader, TopicConfig};

use super::log::BrokerLog;
use super::Cluster;

/// How often the controller looks at the metadata when nothing wakes it.
const RECONCILE_EVERY: Duration = Duration::from_millis(100);

pub(super) async fn run(cluster: Weak<Cluster>) {
    let mut ticks = tokio::time::interval(RECONCILE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        cluster.add_missing_members().await;
        cluster.reconcile().await;
    }
}

/// A topic's configuration as the metadata keeps it: CREATE_TOPIC's encoding of it, so that it
/// carries every field the protocol has.
pub(super) fn encode_config(name: &str, config: &TopicConfig) -> Vec<u8> {
    let frame = Frame::CreateTopic {
        name: name.to_owned(),
        config: config.clone(),
        if_not_exists: false,
    };
    let mut buf = BytesMut::new();
    frame.encode(0, &mut buf);
    buf.to_vec()
}

pub(super) fn decode_config(bytes: &[u8]) -> Option<TopicConfig> {
    let header = FrameHeader::peek(bytes).ok()??;
    let payload =
        Bytes::copy_from_slice(bytes.get(ferrymq_protocol::limits::FRAME_HEADER_BYTES..)?);
    match Frame::decode(&header, payload).ok()? {
        Frame::CreateTopic { config, .. } => Some(config),
        _ => None,
    }
}

impl Cluster {
    /// The metadata as applied on this node (not linearizable: what the controller follows).
    pub(super) fn local_metadata(&self) -> Option<MetadataState> {
        let storage = self.node.storage(GroupId::METADATA).ok()?;
        storage.state.read(|data| match data {
            GroupData::Metadata(m) => Some(m.clone()),
            GroupData::Partition(_) => None,
        })
    }

    /// On the metadata leader: records every configured peer as a member, so that placement
    /// can use it.
    pub(super) async fn add_missing_members(&self) {
        if !self.leads(GroupId::METADATA) {
            return;
        }
        let Some(state) = self.local_metadata() else {
            return;
        };
        let missing: Vec<NodeId> = self
            .settings
            .peers
            .keys()
            .filter(|id| !state.nodes().contains(id) && !state.removed().contains(id))
            .copied()
            .collect();
        for node in missing {
            let command = Request::Metadata(MetaCommand::AddNode { node });
            let written = self
                .node
                .write(GroupId::METADATA, command, self.settings.write_timeout)
                .await;
            if let Err(e) = written {
                tracing::debug!(node, error = %e, "recording a member failed; retried");
                return;
            }
        }
    }

    /// Whether this node currently leads `group`.
    pub(super) fn leads(&self, group: GroupId) -> bool {
        self.node
            .metrics(group)
            .is_ok_and(|m| m.borrow().current_leader == Some(self.settings.node_id))
    }

    async fn reconcile(&self) {
        let Some(state) = self.local_metadata() else {
            return;
        };
        self.group_topics.lock().extend(group_topics(&state));
        let mut placed_here = BTreeSet::new();
        for (name, topic) in state.topics() {
            if let Err(e) = self.follow_topic(name, topic, &mut placed_here).await {
                tracing::warn!(topic = %name, error = %e, "cannot follow a replicated topic yet; retried");
            }
        }
        self.drop_unplaced(&state, &placed_here).await;
        self.drop_deleted(&state);
        self.follow_membership(&state).await;
        self.follow_users(&state).await;
    }

    /// Deletes from the local broker the topics the metadata deleted while this node was down
    /// or behind (it never ran their groups since, so [`Cluster::drop_unplaced`] does not see
    /// them).
    fn drop_deleted(&self, state: &MetadataState) {
        for name in state.deleted_topics() {
            if self.broker.topic(name).is_err() {
                continue;
            }
            match self.broker.delete_topic(name) {
                Ok(()) => tracing::info!(topic = %name, "deleted here: the cluster deleted it"),
                Err(e) => {
                    tracing::warn!(topic = %name, error = %e, "deleting a replicated topic here")
                }
            }
        }
    }

    /// Creates `name` in the local broker if needed, and starts the groups of its partitions
    /// placed on this node.
    async fn follow_topic(
        &self,
        name: &str,
        meta: &TopicMeta,
        placed_here: &mut BTreeSet<GroupId>,
    ) -> Result<(), String> {
        let me = self.settings.node_id;
        let config = decode_config(&meta.config)
            .ok_or_else(|| "its configuration does not decode".to_owned())?;
        let topic = self
            .broker
            .create_topic(name, config, true)
            .map_err(|e| e.to_string())?;
        let running: BTreeSet<GroupId> = self.node.group_ids().into_iter().collect();
        for (partition, placement) in meta.partitions.iter().enumerate() {
            if !placement.replicas.contains(&me) {
                continue;
            }
            placed_here.insert(placement.group);
            if running.contains(&placement.group) {
                continue;
            }
            let raft_log = GroupLog::Durable(self.db.group(placement.group));
            let fresh = raft_log.is_fresh();
            let log = BrokerLog {
                broker: self.broker.clone(),
                topic: topic.clone(),
                partition: partition as u32,
                me,
                cursors: Default::default(),
            };
            let storage = GroupStorage::partition_on(raft_log, Box::new(log)).map_err(|e| {
                format!("partition {partition}'s replica cannot start from what it kept: {e}")
            })?;
            self.node
                .start_group(placement.group, storage)
                .await
                .map_err(|e| e.to_string())?;
            if fresh {
                let voters: BTreeSet<NodeId> = placement.replicas.iter().copied().collect();
                // As for the metadata: every replica proposes the same first membership.
                if let Err(e) = self.node.initialize(placement.group, &voters).await {
                    tracing::debug!(group = %placement.group, error = %e, "membership already proposed");
                }
            }
            tracing::info!(topic = %name, partition, group = %placement.group, "replica started");
        }
        Ok(())
    }

    /// Stops the groups no longer placed here (their topic was deleted), and deletes from the
    /// local broker the replicated topics the metadata no longer has.
    async fn drop_unplaced(&self, state: &MetadataState, placed_here: &BTreeSet<GroupId>) {
        let stale: Vec<GroupId> = self
            .node
            .group_ids()
            .into_iter()
            .filter(|g| !g.is_metadata() && !placed_here.contains(g))
            .collect();
        if stale.is_empty() {
            return;
        }
        for group in stale {
            self.folds.forget(group);
            if let Err(e) = self.node.stop_group(group).await {
                tracing::debug!(%group, error = %e, "stopping a group");
            }
            let name = self.group_topics.lock().remove(&group);
            if let Some(name) = name {
                if state.topic(&name).is_none() && self.broker.topic(&name).is_ok() {
                    if let Err(e) = self.broker.delete_topic(&name) {
                        tracing::warn!(topic = %name, error = %e, "deleting a replicated topic here");
                    }
                }
            }
        }
    }
}

/// The group of each partition of every replicated topic, for [`Cluster::drop_unplaced`].
fn group_topics(state: &MetadataState) -> BTreeMap<GroupId, String> {
    state
        .topics()
        .iter()
        .flat_map(|(name, t)| t.partitions.iter().map(move |p| (p.group, name.clone())))
        .collect()
}
