//! The FerryMQ broker core: topics, partitions, subscriptions and the scheduler of deliveries, as
//! state that can be driven without sockets. The server maps the binary protocol onto these calls;
//! an application can open a [`Broker`] in-process and use the very same calls.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ferrymq_broker::BrokerError> {
//! use ferrymq_broker::{Broker, BrokerConfig};
//! use ferrymq_protocol::{Message, SubscribeRequest, StartPosition};
//!
//! let broker = Broker::open(BrokerConfig::default());
//! let consumer = broker.subscribe(&SubscribeRequest {
//!     topic: "orders".into(), subscription: "billing".into(), start: StartPosition::Earliest,
//!     ack_timeout_ms: 0, max_attempts: 0, credit: 0, auto_ack: false, ordered: false,
//!     partitions: vec![], dead_letter_topic: String::new(),
//! })?;
//! broker.publish_messages("orders", &[Message::new("order 1")]).await?;
//! for delivery in consumer.recv(100).await? {
//!     consumer.ack(&[ferrymq_protocol::OffsetRange::single(delivery.partition, delivery.offset)])?;
//! }
//! # Ok(()) }
//! ```
//!
//! Invariants, held by the modules named:
//! - Offsets in a partition are dense and never reused (`log`).
//! - A publish is all-or-nothing across partitions (`topic`).
//! - A message is in flight to at most one consumer of a subscription at a time, and an ack
//!   counts only from the consumer that holds the current delivery (`cursor`).
//! - Everything that grows is bounded: the log by the topic's limits, a cursor's window by the log,
//!   a consumer's unacked messages by `consumer_in_flight_max` (`config`).

pub mod auth;
mod broker;
mod clock;
mod config;
pub mod connections;
mod consumer;
mod cursor;
mod dead_letter;
mod dedup;
mod disk;
mod error;
mod headers;
mod health;
mod keys;
mod latency;
mod limits;
mod log;
mod meta;
mod names;
mod partition;
mod replication;
mod requeue;
mod requeue_ledger;
mod serving;
mod snapshot;
pub mod stages;
mod state_writer;
mod status;
mod subscription;
mod throttle;
mod topic;
mod write_faults;

pub use auth::{Access, Action, Auth, Identity};
pub use broker::Broker;
pub use config::{BrokerConfig, TopicDefaults, MESSAGE_OVERHEAD_BYTES};
pub use connections::{ConnectionGuard, ConnectionInfo, ConnectionPage, Connections, Listener};
pub use consumer::Consumer;
pub use dedup::{
    DEDUP_IDS_MAX, DEDUP_ID_BYTES_MAX, DEDUP_WINDOW_MS_DEFAULT, DEDUP_WINDOW_MS_MAX,
    HEADER_DEDUP_ID,
};
pub use disk::{DiskConfig, FileStorageFactory, StorageFactory};
pub use error::BrokerError;
pub use headers::{
    dead_letter_source, dead_letter_topic, HEADER_ATTEMPTS, HEADER_OFFSET, HEADER_PARTITION,
    HEADER_PUBLISHED_MS, HEADER_REASON, HEADER_REQUEUE_FOR, HEADER_SUBSCRIPTION, HEADER_TIME_MS,
    HEADER_TOPIC,
};
pub use health::{Fault, FaultKind};
pub use keys::{key_hash, partition_for_key};
pub use limits::{
    log_files_max, open_files_limit, raise_open_files_limit, OpenFilesLimit, LOG_FILES_MAX,
};
pub use names::{validate_name, ValidName};
pub use replication::{CursorReplicator, CursorUpdate};
pub use requeue::{RequeueOutcome, HEADER_REQUEUED_FROM};
pub use snapshot::{merge_cursor_states, SyncWait};
pub use status::{MessagePage, StoredMessage};
pub use subscription::Subscription;
pub use throttle::LogThrottle;
pub use topic::{
    DedupCheck, PartitionFault, PublishPending, PublishReceipt, PublisherGuard, ReplicatedFate,
    Topic,
};
