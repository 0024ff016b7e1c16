//! The HTTP API's routes through the cluster ([`ferrymq_http::cluster::ClusterRoutes`]), served
//! by this node's [`Cluster`].

use std::sync::Arc;
use std::time::Duration;

use std::future::Future;
use std::pin::Pin;

use ferrymq_broker::PublishReceipt;
use ferrymq_http::cluster::{
    ClusterFuture, ClusterOverview, ClusterRouter, ClusterRoutes, ElectionJson, ForwardAnswerer,
    PartitionLeader, PartitionPlace, PeerReport, PeerReports,
};
use ferrymq_http::{FollowerFacts, GroupFacts};
use ferrymq_protocol::{RecordBatch, TopicConfig};
use ferrymq_server::cluster::{Cluster, GroupState, LAG_ENTRIES_MAX};

struct Routes(Arc<Cluster>);

/// The router HTTP uses on a cluster node.
pub(crate) fn router(cluster: Arc<Cluster>) -> ClusterRouter {
    ClusterRouter(Arc::new(Routes(cluster)))
}

impl ClusterRoutes for Routes {
    fn publishes_to(&self, topic: &str) -> bool {
        self.0.publishes_to(topic)
    }

    fn publish(
        &self,
        topic: &str,
        partition: Option<u32>,
        records: RecordBatch,
    ) -> ClusterFuture<(PublishReceipt, Vec<u64>)> {
        let (cluster, topic) = (self.0.clone(), topic.to_owned());
        Box::pin(async move { cluster.publish_named(&topic, partition, records).await })
    }

    fn create_topic(
        &self,
        name: &str,
        config: TopicConfig,
        if_not_exists: bool,
    ) -> ClusterFuture<u64> {
        let (cluster, name) = (self.0.clone(), name.to_owned());
        Box::pin(async move {
            cluster
                .create_topic_anywhere(&name, config, if_not_exists)
                .await
        })
    }

    fn delete_topic(&self, name: &str) -> Option<ClusterFuture<u64>> {
        self.0.replicated(name)?;
        let (cluster, name) = (self.0.clone(), name.to_owned());
        Some(Box::pin(async move {
            cluster.delete_topic_anywhere(&name).await
        }))
    }

    fn unserved(&self, topic: &str, partitions: &[u32]) -> Option<String> {
        self.0.unserved(topic, partitions)
    }

    fn node_id(&self) -> u64 {
        self.0.node_id()
    }

    fn partition_leaders(&self, topic: &str, partitions: &[u32]) -> Option<Vec<PartitionLeader>> {
        self.0.partition_leaders(topic, partitions)
    }

    fn forward(&self, node: u64, request: Vec<u8>, timeout: Duration) -> ClusterFuture<Vec<u8>> {
        let cluster = self.0.clone();
        Box::pin(async move { cluster.forward_http(node, request, timeout).await })
    }

    fn set_forward_answerer(&self, answerer: ForwardAnswerer) {
        self.0.set_http_answerer(answerer);
    }

    fn overview(&self) -> ClusterOverview {
        let view = self.0.view();
        ClusterOverview {
            cluster_id: self.0.settings().cluster_id.clone(),
            node_id: view.node_id,
            metadata_leader: view.metadata_leader,
            nodes: view.nodes,
            partitions: view
                .partitions
                .into_iter()
                .map(|p| PartitionPlace {
                    topic: p.topic,
                    partition: p.partition,
                    group: p.group,
                    leader: p.leader,
                    replicas: p.replicas,
                })
                .collect(),
            lag_entries_max: LAG_ENTRIES_MAX,
            elections: self
                .0
                .elections()
                .into_iter()
                .map(|e| ElectionJson {
                    group: e.group,
                    topic: e.topic,
                    partition: e.partition,
                    term: e.term,
                    leader: e.leader,
                    at_ms: e.at_ms,
                })
                .collect(),
            groups: self.0.group_states().into_iter().map(group_facts).collect(),
        }
    }

    fn peer_reports(&self) -> Pin<Box<dyn Future<Output = PeerReports> + Send>> {
        let cluster = self.0.clone();
        Box::pin(async move {
            cluster
                .peer_statuses()
                .await
                .into_iter()
                .map(|(node, status)| {
                    let report = status.map(|s| PeerReport {
                        resources: s.resources,
                        groups: s.groups.into_iter().map(group_facts).collect(),
                    });
                    (node, report)
                })
                .collect()
        })
    }

    fn set_resources_source(&self, source: Arc<dyn Fn() -> Vec<u8> + Send + Sync>) {
        self.0.set_status_source(source);
    }

    fn add_node(&self, node: u64, cluster_addr: String) -> ClusterFuture<u64> {
        let cluster = self.0.clone();
        Box::pin(async move { cluster.add_node_anywhere(node, &cluster_addr).await })
    }

    fn remove_node(&self, node: u64) -> ClusterFuture<u64> {
        let cluster = self.0.clone();
        Box::pin(async move { cluster.remove_node_anywhere(node).await })
    }
}

/// A group's state as HTTP shows it (`GET /node`, `/cluster`, `/metrics`).
pub(crate) fn group_facts(g: GroupState) -> GroupFacts {
    GroupFacts {
        group: g.group,
        topic: g.topic,
        partition: g.partition,
        role: g.role,
        term: g.term,
        leader: g.leader,
        last_log_index: g.last_log_index,
        applied_index: g.applied_index,
        snapshot_index: g.snapshot_index,
        purged_index: g.purged_index,
        voters: g.voters,
        leader_commit: g.leader_commit,
        caught_up: g.caught_up,
        followers: g
            .followers
            .into_iter()
            .map(|(node, lag_entries)| FollowerFacts { node, lag_entries })
            .collect(),
    }
}
