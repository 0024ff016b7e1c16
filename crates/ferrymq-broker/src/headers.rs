//! Header names the broker itself sets on messages it moves, how a cursor reads them, and the
//! names of dead-letter topics. A leaf module: the cursor, subscriptions and access rules need
//! these, and must not depend on the dead-letter task above them.

/// Header names a dead letter carries.
pub const HEADER_TOPIC: &str = "x-ferrymq-dead-topic";
pub const HEADER_PARTITION: &str = "x-ferrymq-dead-partition";
pub const HEADER_OFFSET: &str = "x-ferrymq-dead-offset";
pub const HEADER_SUBSCRIPTION: &str = "x-ferrymq-dead-subscription";
pub const HEADER_ATTEMPTS: &str = "x-ferrymq-dead-attempts";
pub const HEADER_REASON: &str = "x-ferrymq-dead-reason";
pub const HEADER_TIME_MS: &str = "x-ferrymq-dead-time-ms";
pub const HEADER_PUBLISHED_MS: &str = "x-ferrymq-dead-published-ms";
/// Header of a requeued dead letter: the only subscription of the source that takes it.
pub const HEADER_REQUEUE_FOR: &str = "x-ferrymq-requeue-for";

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

/// True when `record` is a requeued dead letter meant for another subscription than
/// `subscription`: that one passes it by.
pub(crate) fn requeued_for_another(record: &[u8], subscription: &str) -> bool {
    ferrymq_protocol::record_header(record, HEADER_REQUEUE_FOR)
        .is_some_and(|name| name != subscription.as_bytes())
}
