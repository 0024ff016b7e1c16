//! PUBLISH: the topic handles a connection publishes to, and the PUBLISHED receipt.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use ferrymq_broker::{Action, BrokerError, Topic};
use ferrymq_protocol::{Frame, RecordBatch};

use super::outbound::reply_to;
use super::Session;
use crate::cluster::Cluster;

pub(super) fn published(receipt: ferrymq_broker::PublishReceipt) -> Frame {
    Frame::Published {
        durability: receipt.durability,
        ranges: receipt.ranges.into_vec(),
    }
}

impl Session {
    /// Answered at once on a memory topic; under fsync=always the reply waits for the sync in a
    /// task of its own, holding a permit, while the reader goes on.
    pub(super) async fn publish(
        &mut self,
        id: u32,
        topic: &str,
        partition: Option<u32>,
        records: RecordBatch,
    ) {
        let count = u64::from(records.count());
        if let Some(cluster) = self.config.cluster.clone() {
            self.out.counters.messages_in.fetch_add(count, Relaxed);
            return self
                .publish_replicated(id, cluster, topic, partition, records)
                .await;
        }
        let started = self
            .allow(Action::Publish, topic)
            .and_then(|_| self.publish_target(topic))
            .and_then(|target| self.broker.publish_start(&target, partition, records));
        if started.is_ok() {
            let counters = &self.out.counters;
            counters.messages_in.fetch_add(count, Relaxed);
        }
        match started {
            Ok(pending) if !pending.is_done() => {
                let out = self.out.clone();
                let permit = self.waiting.clone().acquire_owned().await;
                tokio::spawn(async move {
                    let result = pending.durable().await;
                    reply_to(&out, id, result.map(published));
                    out.flush();
                    drop(permit);
                });
            }
            Ok(pending) => self.reply(id, pending.durable().await.map(published)),
            Err(error) => self.reply(id, Err(error)),
        }
    }

    /// In a cluster: a replicated topic's publish is proposed to its partitions' groups, and
    /// answered in a task of its own once committed, holding a permit, while the reader goes
    /// on. A topic not yet known is created replicated (as a single node creates it on its first
    /// publish); a local topic from before the cluster is published to as before.
    async fn publish_replicated(
        &mut self,
        id: u32,
        cluster: Arc<Cluster>,
        topic: &str,
        partition: Option<u32>,
        records: RecordBatch,
    ) {
        if let Err(error) = self.allow(Action::Publish, topic) {
            return self.reply(id, Err(error));
        }
        let mut meta = cluster.replicated(topic);
        if meta.is_none() && self.broker.topic(topic).is_err() {
            if let Err(error) = self.create_on_publish(&cluster, topic).await {
                return self.reply(id, Err(error));
            }
            meta = cluster.replicated(topic);
        }
        let target = self.publish_target(topic);
        let (meta, target) = match (meta, target) {
            (_, Err(error)) => return self.reply(id, Err(error)),
            (None, Ok(target)) => {
                let result = self.broker.publish_to(&target, partition, records).await;
                return self.reply(id, result.map(published));
            }
            (Some(meta), Ok(target)) => (meta, target),
        };
        let out = self.out.clone();
        let permit = self.waiting.clone().acquire_owned().await;
        tokio::spawn(async move {
            // Parts led elsewhere are passed to their leaders: a client that does not follow
            // leaders (or picked none, the broker choosing the partition) is served too.
            let result = cluster
                .publish_anywhere(&target, &meta, partition, records)
                .await
                .map(|(receipt, _)| receipt);
            reply_to(&out, id, result.map(published));
            out.flush();
            drop(permit);
        });
    }

    /// Creates a topic on its first publish, replicated, if the broker creates topics on
    /// publish at all.
    async fn create_on_publish(
        &mut self,
        cluster: &Cluster,
        topic: &str,
    ) -> Result<(), BrokerError> {
        if !self.broker.config().auto_create_topics {
            return Err(BrokerError::UnknownTopic(topic.to_owned()));
        }
        cluster
            .create_topic_anywhere(topic, ferrymq_protocol::TopicConfig::default(), true)
            .await
            .map(|_| ())
    }

    /// The topic handle for publishing, resolved once per connection and topic.
    pub(super) fn publish_target(&mut self, topic: &str) -> Result<Arc<Topic>, BrokerError> {
        if let Some((handle, _)) = self.publishing.get(topic) {
            if !handle.is_deleted() {
                return Ok(handle.clone());
            }
            self.publishing.remove(topic);
        }
        let handle = self.broker.topic_or_create(topic)?;
        let guard = self.broker.register_publisher(&handle);
        self.publishing
            .insert(topic.to_owned(), (handle.clone(), guard));
        Ok(handle)
    }
}
