//! Broker settings with their defaults. The numbers and their reasons live here; the server maps
//! flags, environment and TOML onto this struct.

use ferrymq_protocol::limits::{
    ACK_TIMEOUT_MS_DEFAULT, MAX_ATTEMPTS_DEFAULT, MESSAGE_BODY_BYTES_DEFAULT,
};
use ferrymq_protocol::{FsyncPolicy, OverflowPolicy, Storage};

#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Create a topic with the defaults below on first publish or subscribe.
    pub auto_create_topics: bool,
    /// Largest message body accepted.
    pub message_body_bytes_max: u32,
    pub topic_defaults: TopicDefaults,
    pub ack_timeout_ms_default: u32,
    pub max_attempts_default: u32,
    /// Topics one broker holds; each costs a few hundred bytes plus its partitions.
    pub topics_max: usize,
    /// Subscriptions per topic: every publish touches each one, so fan-out width is bounded.
    pub subscriptions_per_topic_max: usize,
    /// Consumers attached to one subscription.
    pub consumers_per_subscription_max: usize,
    /// Unacked messages one consumer may hold. Credit bounds what is in transit; this bounds what
    /// a consumer that receives but never acks can pin.
    pub consumer_in_flight_max: u32,
    /// How often timers (ack deadlines, delayed redeliveries) are checked; the precision of an
    /// ack timeout.
    pub timer_tick_ms: u64,
    /// How many acked and how many dead-lettered messages each subscription remembers per
    /// partition for status queries and listings (about 50 bytes each, plus ack results).
    pub status_history: usize,
}

/// What a topic gets when its creator leaves a setting at zero / default.
#[derive(Debug, Clone)]
pub struct TopicDefaults {
    pub partitions: u32,
    pub storage: Storage,
    pub overflow: OverflowPolicy,
    /// Memory topics keep at most this many messages: 5 M small messages is ~ 0.5 GB with overhead.
    pub max_messages: u64,
    /// And at most this many bytes (records plus per-message overhead).
    pub max_bytes: u64,
    /// Disk topics keep at most this many messages (whole segments are deleted past it).
    pub disk_max_messages: u64,
    /// And at most this many bytes of log files.
    pub disk_max_bytes: u64,
    /// Disk topics' fsync policy when a topic does not choose one.
    pub fsync: FsyncPolicy,
    /// Disk topics delete segments whose messages are all older than this; `u64::MAX`: never.
    pub retention_ms: u64,
    /// How long a topic remembers a message's deduplication id (`x-ferrymq-dedup-id`), so that a
    /// retried publish with the same id is not stored twice.
    pub dedup_window_ms: u64,
}

impl Default for TopicDefaults {
    fn default() -> Self {
        TopicDefaults {
            partitions: 1,
            storage: Storage::Memory,
            overflow: OverflowPolicy::DropOldest,
            max_messages: 5_000_000,
            max_bytes: 512 * 1024 * 1024,
            // Bounded by the disk, retention by age, and acks (work queues), not by count.
            disk_max_messages: u64::MAX,
            disk_max_bytes: u64::MAX,
            fsync: FsyncPolicy::Always,
            // A week, as Kafka: long enough for a consumer to come back after an outage.
            retention_ms: 7 * 24 * 3600 * 1000,
            // Two minutes, as JetStream's duplicate window: longer than a client's reconnects and
            // retries, short enough that the window's ids stay few.
            dedup_window_ms: crate::dedup::DEDUP_WINDOW_MS_DEFAULT,
        }
    }
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            auto_create_topics: true,
            message_body_bytes_max: MESSAGE_BODY_BYTES_DEFAULT,
            topic_defaults: TopicDefaults::default(),
            ack_timeout_ms_default: ACK_TIMEOUT_MS_DEFAULT,
            max_attempts_default: MAX_ATTEMPTS_DEFAULT,
            topics_max: 100_000,
            subscriptions_per_topic_max: 1024,
            consumers_per_subscription_max: 10_000,
            consumer_in_flight_max: 65_536,
            timer_tick_ms: 10,
            status_history: 1000,
        }
    }
}

/// Fixed cost charged per retained message on top of its record bytes, so `max_bytes` bounds real
/// memory: the log entry (timestamp, shared buffer handle) and its share of cursor state.
pub const MESSAGE_OVERHEAD_BYTES: u64 = 64;
