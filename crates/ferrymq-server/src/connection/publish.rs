//! PUBLISH: the topic handles a connection publishes to, and the PUBLISHED receipt.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use ferrymq_broker::{Action, BrokerError, Topic};
use ferrymq_protocol::{Frame, RecordBatch};

use super::outbound::reply_to;
use super::Session;

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
