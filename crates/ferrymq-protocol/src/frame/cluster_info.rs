//! What CLUSTER_INFO_REPLY carries: the nodes of a cluster and who leads each replicated
//! partition.

/// A node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNodeEntry {
    pub id: u64,
    /// Where clients reach it (`host:port` of its binary protocol listener); empty if unknown.
    pub addr: String,
}

/// One partition of a replicated topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionLeader {
    pub topic: String,
    pub partition: u32,
    /// The node leading the partition; 0 when the answering node does not know (an election is
    /// under way, or it holds no replica).
    pub leader: u64,
    /// The nodes holding a replica; the first is the preferred leader.
    pub replicas: Vec<u64>,
}

/// The cluster as the answering node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterInfo {
    /// The answering node; 0 when it runs alone, not in a cluster.
    pub node_id: u64,
    /// The metadata leader (topics are created and deleted there); 0 when unknown.
    pub metadata_leader: u64,
    pub nodes: Vec<ClusterNodeEntry>,
    pub partitions: Vec<PartitionLeader>,
}
