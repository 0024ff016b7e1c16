//! Dead letters: messages a subscription gave up on after `max_attempts` deliveries move to the
//! topic `<topic>.dlq`, with headers saying where they came from and why.
//!
//! Order of events, so that nothing is lost: the cursor marks the message dead (it is not
//! delivered again, and not settled); its record is taken under the partition lock and handed to
//! the broker's dead-letter task; the task publishes it to the dead-letter topic (on a disk
//! topic, durably) and only then settles it in the source subscription. A crash in between
//! delivers the message again, and it is given up again: at least once, like everything else.

use ferrymq_protocol::Message;

use crate::clock::unix_ms;
use crate::topic::DeadLetter;

use crate::headers::*;

/// Most bytes of a dead letter's reason: a consumer's own reason is refused above this (the
/// protocol's limit), and the attempts that ran out with a nack's reason are cut to it.
pub(crate) const REASON_BYTES_MAX: usize = ferrymq_protocol::limits::ERROR_MESSAGE_BYTES_MAX;

/// `text` cut to [`REASON_BYTES_MAX`] bytes on a character boundary, ending in `...` if cut.
fn bounded(text: &str) -> String {
    if text.len() <= REASON_BYTES_MAX {
        return text.to_string();
    }
    let mut end = REASON_BYTES_MAX - 3;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

impl DeadLetter {
    /// Why it was given up: the consumer's reason, or the attempts that ran out with the
    /// reason of the nack that spent the last one (at most [`REASON_BYTES_MAX`] bytes in all).
    pub fn reason_text(&self, max_attempts: u32) -> String {
        if let Some(reason) = &self.reason {
            return reason.clone();
        }
        let ran_out = format!("max_attempts ({max_attempts}) reached");
        match self.nack_reason.as_deref() {
            Some(last) if !last.is_empty() => bounded(&format!("{ran_out}: {last}")),
            _ => ran_out,
        }
    }

    /// The message as it goes to the dead-letter topic: the original, with headers saying where
    /// it came from (the original's headers are kept as far as the header limit allows).
    pub fn message(&self, subscription: &str, max_attempts: u32) -> Message {
        let mut message = crate::log::decode_stored(self.record.clone());
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
