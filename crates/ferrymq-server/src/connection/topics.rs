//! Topic and subscription management: CREATE_TOPIC, DELETE_TOPIC, LIST_TOPICS, DESCRIBE_TOPIC,
//! DELETE_SUBSCRIPTION, and REQUEUE_DEAD (dead letters back to their topic).

use ferrymq_broker::{Action, BrokerError};
use ferrymq_protocol::{
    ClusterInfo, ClusterNodeEntry, Frame, PartitionLeader, RequeueSelection, TopicConfig, TopicInfo,
};

use super::outbound::reply_to;
use super::Session;

impl Session {
    /// In a cluster the topic is created through the metadata group, replicated.
    pub(super) async fn create_topic(
        &mut self,
        id: u32,
        name: &str,
        config: TopicConfig,
        if_not_exists: bool,
    ) {
        let result = match (
            self.allow(Action::Manage, name),
            self.config.cluster.clone(),
        ) {
            (Err(e), _) => Err(e),
            (Ok(()), Some(cluster)) => cluster
                .create_topic(name, config, if_not_exists)
                .await
                .map(|()| Frame::Ok),
            (Ok(()), None) if config.replicas > 1 => Err(BrokerError::invalid(
                "replicas",
                format!(
                    "{}: this broker runs alone and keeps one copy; 3 or 5 replicas need a \
                     cluster (ferrymq serve --node-id --cluster-addr --peers)",
                    config.replicas
                ),
            )),
            (Ok(()), None) => self
                .broker
                .create_topic(name, config, if_not_exists)
                .map(|_| Frame::Ok),
        };
        self.reply(id, result)
    }

    /// A replicated topic is deleted through the metadata group, on every node.
    pub(super) async fn delete_topic(&mut self, id: u32, name: &str) {
        if let Err(e) = self.allow(Action::Manage, name) {
            return self.reply(id, Err(e));
        }
        self.publishing.remove(name);
        let cluster = self.config.cluster.clone();
        let result = match cluster {
            Some(cluster) if cluster.replicated(name).is_some() => cluster.delete_topic(name).await,
            _ => self.broker.delete_topic(name),
        };
        self.reply(id, result.map(|()| Frame::Ok))
    }

    /// The cluster's nodes and who leads each partition of the topics this connection may see;
    /// a single node answers with node 0 and nothing else.
    pub(super) fn cluster_info(&mut self, id: u32) {
        let Some(cluster) = self.config.cluster.clone() else {
            return self.reply(id, Ok(Frame::ClusterInfoReply(ClusterInfo::default())));
        };
        let view = cluster.view();
        let access = self.access();
        let partitions = view
            .partitions
            .into_iter()
            .filter(|p| access.sees(&p.topic).unwrap_or(false))
            .map(|p| PartitionLeader {
                topic: p.topic,
                partition: p.partition,
                leader: p.leader.unwrap_or(0),
                replicas: p.replicas,
            })
            .collect();
        let nodes = view
            .nodes
            .into_iter()
            .map(|(id, addr)| ClusterNodeEntry {
                id,
                addr: addr.unwrap_or_default(),
            })
            .collect();
        let info = ClusterInfo {
            node_id: view.node_id,
            metadata_leader: view.metadata_leader.unwrap_or(0),
            nodes,
            partitions,
        };
        self.reply(id, Ok(Frame::ClusterInfoReply(info)))
    }

    /// Only the topics this connection may see.
    pub(super) fn list_topics(&mut self, id: u32) {
        let mut topics = self.broker.list_topics();
        let access = self.access();
        topics.retain(|t| access.sees(&t.name).unwrap_or(false));
        for topic in &mut topics {
            self.fill_replicas(topic);
        }
        self.reply(id, Ok(Frame::TopicList { topics }))
    }

    pub(super) fn describe_topic(&mut self, id: u32, name: &str) {
        let result = self
            .allow(Action::Inspect, name)
            .and_then(|_| self.broker.describe_topic(name))
            .map(|mut topic| {
                self.fill_replicas(&mut topic);
                Frame::TopicInfo(topic)
            });
        self.reply(id, result)
    }

    /// How many copies of the topic's partitions the cluster keeps (1 on a single node, or for a
    /// topic this node held before it joined a cluster).
    fn fill_replicas(&self, topic: &mut TopicInfo) {
        let replicated = self
            .config
            .cluster
            .as_ref()
            .and_then(|cluster| cluster.replicated(&topic.name));
        topic.config.replicas = replicated
            .and_then(|meta| meta.partitions.first().map(|p| p.replicas.len() as u8))
            .unwrap_or(1);
    }

    pub(super) fn delete_subscription(&mut self, id: u32, topic: &str, subscription: &str) {
        let result = self.allow(Action::Manage, topic).and_then(|_| {
            self.broker
                .delete_subscription(topic, subscription)
                .map(|_| Frame::Ok)
        });
        self.reply(id, result)
    }

    pub(super) async fn requeue_dead(
        &mut self,
        id: u32,
        dead_letter_topic: String,
        selection: RequeueSelection,
    ) {
        if let Err(error) = self.allow(Action::Manage, &dead_letter_topic) {
            self.reply(id, Err(error));
            return;
        }
        let range = match selection {
            RequeueSelection::All => None,
            RequeueSelection::Range {
                partition,
                first,
                last,
            } => Some((partition, first, last)),
        };
        // Requeueing publishes (and on disk topics syncs) every selected dead letter: it
        // runs beside the reader, like a publish waiting for its sync, holding a permit.
        let (out, broker) = (self.out.clone(), self.broker.clone());
        let permit = self.waiting.clone().acquire_owned().await;
        tokio::spawn(async move {
            let result = broker
                .requeue_dead_letters(&dead_letter_topic, range)
                .await
                .map(|outcome| Frame::Requeued {
                    requeued: outcome.requeued,
                    skipped: outcome.skipped,
                });
            reply_to(&out, id, result);
            out.flush();
            drop(permit);
        });
    }
}
