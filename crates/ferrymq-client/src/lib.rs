//! The async Rust client for FerryMQ's binary protocol.
//!
//! ```no_run
//! use ferrymq_client::{Client, Message, SubscribeOptions};
//!
//! # async fn demo() -> ferrymq_client::Result<()> {
//! let client = Client::connect("127.0.0.1:7070").await?;
//! let id = client.publish("orders", Message::new("hello").with_key("customer-7")).await?;
//! println!("published {id}");
//!
//! let mut subscription = client.subscribe(SubscribeOptions::new("orders").subscription("billing")).await?;
//! while let Some(delivery) = subscription.next().await {
//!     let delivery = delivery?;
//!     subscription.ack(&delivery).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! How it works: one TCP connection per [`Client`], shared by every clone. Callers encode frames
//! into a shared write queue that a writer task flushes with one vectored write per wake-up, so
//! concurrent publishes, acks and credit grants coalesce into few syscalls (consecutive acks of
//! one subscription even merge into one frame). A reader task decodes
//! frames and routes answers to requests by request id (answers may come in any order) and DELIVER
//! frames to subscriptions by consumer id.
//!
//! What is bounded, and by what:
//! - Unsent bytes: [`ClientConfig::write_buffer_bytes_max`] plus one frame; callers wait for room.
//! - Requests awaiting an answer: [`ClientConfig::requests_in_flight_max`]; callers wait for a slot.
//! - Time to wait for an answer: [`ClientConfig::request_timeout`].
//! - Deliveries buffered per subscription: its credit window, granted back as the application
//!   takes messages; a server that sends more ends the subscription with an error.
//! - Frames read: the server's announced frame limit (at least the protocol default).
//! - Memory a kept delivery pins: message bodies are slices of the read buffer, not copies, but
//!   DELIVER frames under 16 KiB are copied out first, so a kept message pins at most 16 times
//!   its frame's size. Copy bodies you keep for long if that matters.
//! - A silent server: after three heartbeat intervals without a byte the connection is declared
//!   dead, pending requests fail and subscription streams end with
//!   [`Error::HeartbeatTimeout`].

mod admin;
pub mod bus;
mod client;
mod cluster_subscription;
pub mod config;
mod conn;
mod error;
mod offsets;
mod operate;
mod publish;
mod subscription;
pub mod tls;
mod view;
mod write_queue;

#[cfg(test)]
mod vectors;

pub use admin::CreatedToken;
pub use client::Client;
pub use cluster_subscription::ClusterSubscription;
pub use config::{ClientConfig, ADDR_DEFAULT};
pub use conn::ServerInfo;
pub use error::{Error, Result};
pub use offsets::push_offset;
pub use operate::ConnectionPage;
pub use publish::{MessageId, PendingPublish, PublishReceipt};
pub use subscription::{SubscribeOptions, Subscription, CREDIT_WINDOW_DEFAULT};
pub use tls::TlsOptions;
pub use view::{DeliveryBatchExt, DeliveryView, DeliveryViews, Headers};

/// The codec this client speaks, for types beyond the re-exports below.
pub use ferrymq_protocol as protocol;
pub use ferrymq_protocol::{
    ClusterInfo, ClusterNodeEntry, Delivery, DeliveryBatch, Durability, ErrorCode, FsyncPolicy,
    ListKind, Message, MessageEntry, MessageState, MessageStatus, OffsetRange, OverflowPolicy,
    PartitionLeader, PublishEncoder, RequeueSelection, RetentionPolicy, StartPosition, Storage,
    SubscriptionMessageStatus, SubscriptionStats, TokenEntry, TopicConfig, TopicInfo, TopicStats,
    UserEntry,
};

/// The README's snippets, compiled as doctests so that they stay true to the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
