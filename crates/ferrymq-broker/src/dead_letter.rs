//! Dead letters: messages a subscription gave up on after `max_attempts` deliveries move to the
//! topic `<topic>.dlq`, with headers saying where they came from and why.
//!
//! Order of events, so that nothing is lost: the cursor marks the message dead (it is not
//! delivered again, and not settled); its record is taken under the partition lock and handed to
//! the broker's dead-letter task; the task publishes it to the dead-letter topic (on a disk
//! topic, durably) and only then settles it in the source subscription. A crash in between
//! delivers the message again, and it is given up again: at least once, like everything else.

use std::sync::Arc;

use bytes::Bytes;
use ferrymq_protocol::Message;

use crate::topic::{unix_ms, PartitionState, Topic};

pub use crate::headers::*;

/// A message given up, on its way to the dead-letter topic.
pub(crate) struct DeadLetter {
    pub topic: Arc<Topic>,
    pub partition: u32,
    pub sub_id: u64,
    pub offset: u64,
    pub attempts: u16,
    pub timestamp_ms: u64,
    pub record: Bytes,
    /// The consumer's reason, when it asked for the dead-lettering; else `max_attempts` ran out.
    pub reason: Option<String>,
}

/// The name of `topic`'s dead-letter topic.
pub fn dead_letter_topic(topic: &str) -> String {
    format!("{topic}.dlq")
}

/// The source topic of a default dead-letter topic name (`orders` for `orders.dlq`).
pub fn dead_letter_source(topic: &str) -> Option<&str> {
    topic
        .strip_suffix(".dlq")
        .filter(|source| !source.is_empty())
}

impl PartitionState {
    /// Takes the messages the cursors gave up since last asked, with their records (from the
    /// in-memory tail, or the files). One whose record cannot be read now is made ready again.
    pub(crate) fn take_dead_letters(
        &mut self,
        topic: &Arc<Topic>,
        partition: u32,
        reason: Option<&str>,
        out: &mut Vec<DeadLetter>,
    ) {
        for cursor in self.cursors.iter_mut() {
            for crate::cursor::GivenUp { offset, attempts } in cursor.take_dead() {
                let stored = self
                    .log
                    .get(offset)
                    .map(|s| (s.timestamp_ms(), s.record.clone()));
                let stored = stored.or_else(|| {
                    let log = self.disk.as_ref()?.log.as_ref()?;
                    let entry = log.read(offset, 0, 1).ok()?.into_iter().next()?;
                    (entry.offset == offset).then_some((entry.timestamp_ms, entry.record))
                });
                match stored {
                    Some((timestamp_ms, record)) => out.push(DeadLetter {
                        topic: topic.clone(),
                        partition,
                        sub_id: cursor.sub_id,
                        offset,
                        attempts,
                        timestamp_ms,
                        record,
                        reason: reason.map(str::to_string),
                    }),
                    None => {
                        tracing::warn!(topic = %topic.name, partition, offset, "cannot read a message to dead-letter it now; it is delivered again");
                        cursor.revive_dead(offset);
                    }
                }
            }
        }
    }
}

impl DeadLetter {
    /// Why it was given up: the consumer's reason, or the attempts that ran out.
    pub fn reason_text(&self, max_attempts: u32) -> String {
        self.reason
            .clone()
            .unwrap_or_else(|| format!("max_attempts ({max_attempts}) reached"))
    }

    /// The message as it goes to the dead-letter topic: the original, with headers saying where
    /// it came from (the original's headers are kept as far as the header limit allows).
    pub fn message(&self, subscription: &str, max_attempts: u32) -> Message {
        let mut message = crate::subscription::decode_stored(self.record.clone());
        let added = [
            (HEADER_TOPIC, self.topic.name.clone()),
            (HEADER_PARTITION, self.partition.to_string()),
            (HEADER_OFFSET, self.offset.to_string()),
            (HEADER_SUBSCRIPTION, subscription.to_string()),
            (HEADER_ATTEMPTS, self.attempts.to_string()),
            (HEADER_REASON, self.reason_text(max_attempts)),
            (HEADER_TIME_MS, unix_ms().to_string()),
            (HEADER_PUBLISHED_MS, self.timestamp_ms.to_string()),
        ];
        // A dead letter is a message of its own: two subscriptions giving up the same message
        // store two, which the original's deduplication id would otherwise fold into one.
        message
            .headers
            .retain(|(k, _)| k != crate::dedup::HEADER_DEDUP_ID);
        let room = ferrymq_protocol::limits::HEADERS_COUNT_MAX.saturating_sub(added.len());
        message.headers.truncate(room);
        message
            .headers
            .extend(added.into_iter().map(|(k, v)| (k.to_string(), v)));
        // Delivered at once from the dead-letter topic.
        message.deliver_after_ms = None;
        message
    }
}
