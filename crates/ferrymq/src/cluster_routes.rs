//! The HTTP API's routes through the cluster ([`ferrymq_http::cluster::ClusterRoutes`]), served
//! by this node's [`Cluster`].

use std::sync::Arc;

use ferrymq_broker::PublishReceipt;
use ferrymq_http::cluster::{ClusterFuture, ClusterRouter, ClusterRoutes};
use ferrymq_protocol::{RecordBatch, TopicConfig};
use ferrymq_server::cluster::Cluster;

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
}
