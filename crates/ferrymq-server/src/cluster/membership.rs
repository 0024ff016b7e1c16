//! Nodes joining and leaving a running cluster.
//!
//! `ferrymq cluster add-node` writes a `Join` to the metadata: the node becomes a member that new
//! partitions are placed on, and every node learns its cluster address. `remove-node` writes a
//! `RemoveNode`: the metadata moves each of the node's replicas to the least loaded other member
//! at once. Neither changes a Raft group by itself: each group's leader moves its voters towards
//! what the metadata says ([`Cluster::follow_membership`], every controller pass), adding a new
//! replica as a learner and making it a voter only once it has caught up, and dropping a removed
//! one in the same change. The metadata group's own voters follow its members the same way.
//!
//! A removed node's process may keep running: it is no voter anywhere once the moves are done,
//! and stops its partitions' groups when it sees they are no longer placed on it.

use std::collections::{BTreeMap, BTreeSet};

use ferrymq_broker::BrokerError;
use ferrymq_cluster::metadata::{MetaCommand, MetaError, MetaOutcome, MetadataState};
use ferrymq_cluster::{ClusterError, GroupId, NodeId};

use super::Cluster;

/// How long one step of a group's move may take before the next controller pass tries again.
const MOVE_STEP: std::time::Duration = std::time::Duration::from_secs(5);

/// What a node's removal did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    /// The partitions that got a replica on another node in its place.
    pub moved_replicas: u32,
}

impl Cluster {
    /// Every member's cluster address: the configured peers and the nodes that joined, less the
    /// nodes removed.
    pub fn members(&self) -> BTreeMap<NodeId, String> {
        let state = self.local_metadata().unwrap_or_default();
        let mut members = self.settings.peers.clone();
        for (id, addr) in state.joined_addrs() {
            members.insert(*id, addr.clone());
        }
        for id in state.removed() {
            members.remove(id);
        }
        members
    }

    /// Whether the cluster removed this node (as far as this node applied the metadata).
    pub fn is_removed(&self) -> bool {
        self.local_metadata()
            .is_some_and(|m| m.removed().contains(&self.settings.node_id))
    }

    /// Admits node `node`, listening for its peers at `cluster_addr`, from any node (at the
    /// metadata group's leader). Returns the node that wrote it.
    pub async fn add_node_anywhere(
        &self,
        node: NodeId,
        cluster_addr: &str,
    ) -> Result<NodeId, BrokerError> {
        if node == 0 {
            return Err(BrokerError::invalid("node", "node ids start at 1"));
        }
        super::split_host_port(cluster_addr)
            .map_err(|e| BrokerError::invalid("cluster_addr", e))?;
        let request = super::forward::Forwarded::Join {
            node,
            cluster_addr: cluster_addr.to_owned(),
        };
        let local = || self.add_node(node, cluster_addr);
        self.metadata_request(&request, "the node's admission", local)
            .await
    }

    /// Removes node `node` from any node (at the metadata group's leader): its replicas are
    /// given to other members, and the groups move their voters after.
    pub async fn remove_node_anywhere(&self, node: NodeId) -> Result<NodeId, BrokerError> {
        let request = super::forward::Forwarded::Leave { node };
        let local = || async move { self.remove_node(node).await.map(|_| ()) };
        self.metadata_request(&request, "the node's removal", local)
            .await
    }

    /// Writes the admission here, the metadata group's leader.
    pub(super) async fn add_node(
        &self,
        node: NodeId,
        cluster_addr: &str,
    ) -> Result<(), BrokerError> {
        let command = MetaCommand::Join {
            node,
            cluster_addr: cluster_addr.to_owned(),
        };
        match self.write_metadata(command, "the node's admission").await? {
            Ok(_) => {
                tracing::info!(node, cluster_addr, "node admitted to the cluster");
                Ok(())
            }
            Err(e) => Err(BrokerError::invalid("node", e.to_string())),
        }
    }

    /// Writes the removal here, the metadata group's leader.
    pub(super) async fn remove_node(&self, node: NodeId) -> Result<Removed, BrokerError> {
        match self
            .write_metadata(MetaCommand::RemoveNode { node }, "the node's removal")
            .await?
        {
            Ok(MetaOutcome::NodeRemoved { moved_replicas }) => {
                tracing::info!(
                    node,
                    moved_replicas,
                    "node removed from the cluster; its replicas move"
                );
                Ok(Removed { moved_replicas })
            }
            Ok(other) => Err(BrokerError::Storage(format!(
                "the metadata answered a removal with {other:?}"
            ))),
            Err(MetaError::NoSuchNode(_)) => Err(BrokerError::invalid(
                "node",
                format!("node {node} is not a member of the cluster (GET /cluster lists them)"),
            )),
            Err(e) => Err(BrokerError::invalid("node", e.to_string())),
        }
    }

    /// One controller pass: peers' addresses learnt from the metadata, and each group led here
    /// a step closer to the voters the metadata gives it.
    pub(super) async fn follow_membership(&self, state: &MetadataState) {
        let me = self.settings.node_id;
        for (&id, addr) in state.joined_addrs() {
            if id != me && !self.settings.peers.contains_key(&id) {
                self.node.transport().set_peer_addr(id, addr);
            }
        }
        if self.leads(GroupId::METADATA) {
            if let Ok(current) = self.node.voters(GroupId::METADATA) {
                // The configured peers are voters from the start; joined members are added,
                // removed ones dropped.
                let wanted: BTreeSet<NodeId> = current
                    .union(state.nodes())
                    .filter(|n| !state.removed().contains(n))
                    .copied()
                    .collect();
                self.move_group(GroupId::METADATA, &wanted).await;
            }
        }
        for placement in state.partition_groups() {
            if placement.replicas.is_empty() || !self.leads(placement.group) {
                continue;
            }
            let wanted: BTreeSet<NodeId> = placement.replicas.iter().copied().collect();
            self.move_group(placement.group, &wanted).await;
        }
    }

    async fn move_group(&self, group: GroupId, wanted: &BTreeSet<NodeId>) {
        match self.node.move_voters(group, wanted, MOVE_STEP).await {
            Ok(_) => {}
            Err(ClusterError::NoSuchGroup(_)) => {}
            Err(e) => {
                tracing::info!(%group, voters = ?wanted, error = %e, "moving a group's voters; tried again");
            }
        }
    }
}
