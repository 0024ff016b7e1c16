//! Header names the broker itself sets on messages it moves, and how a cursor reads them. A leaf
//! module: the cursor needs these names, and must not depend on the dead-letter task above it.

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

/// True when `record` is a requeued dead letter meant for another subscription than
/// `subscription`: that one passes it by.
pub(crate) fn requeued_for_another(record: &[u8], subscription: &str) -> bool {
    ferrymq_protocol::record_header(record, HEADER_REQUEUE_FOR)
        .is_some_and(|name| name != subscription.as_bytes())
}
