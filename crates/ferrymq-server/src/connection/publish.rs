//! PUBLISH: the topic handles a connection publishes to, and the PUBLISHED receipt.

use std::sync::Arc;

use ferrymq_broker::{BrokerError, Topic};
use ferrymq_protocol::Frame;

use super::Session;

pub(super) fn published(receipt: ferrymq_broker::PublishReceipt) -> Frame {
    Frame::Published {
        durability: receipt.durability,
        ranges: receipt.ranges.into_vec(),
    }
}

impl Session {
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
