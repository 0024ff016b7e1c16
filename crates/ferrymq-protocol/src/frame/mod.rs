//! Frames: the fixed header, one variant per opcode, and their encodings, one file per frame
//! family with encode beside decode.
//!
//! Layers, each using only the ones above it (no module imports one that imports it back):
//! 1. `header` (the fixed header and opcodes), `fields` (fields several frames share), and the
//!    values frames carry: `error_code`, `durability`, `topic_config`, `topic_stats`,
//!    `subscribe_request`, `user_entry`, `cluster_info`;
//! 2. `kind`: the [`Frame`] enum;
//! 3. one file per frame family: `session`, `topics`, `publish`, `subscribe`, `deliver`, `ack`,
//!    `stats`, `messages`, `users`, `tokens`, `cluster`, `operate`;
//! 4. `codec`: [`Frame::encode`] and [`Frame::decode`], one dispatch table each; `decoder`:
//!    [`FrameDecoder`].
//!
//! The byte layout of every frame is drawn in `docs/protocol.md`.

mod ack;
mod cluster;
mod cluster_info;
mod codec;
mod decoder;
mod deliver;
mod durability;
mod error_code;
mod fields;
mod header;
mod kind;
mod messages;
mod operate;
mod publish;
mod session;
mod stats;
mod subscribe;
mod subscribe_request;
#[cfg(test)]
mod testing;
mod tokens;
mod topic_config;
mod topic_stats;
mod topics;
mod user_entry;
mod users;

pub use cluster_info::{ClusterInfo, ClusterNodeEntry, PartitionLeader};
pub use decoder::FrameDecoder;
pub use deliver::DeliverEncoder;
pub use durability::Durability;
pub use error_code::ErrorCode;
pub use header::{opcode, opcode_since, FrameHeader};
pub use kind::Frame;
pub use operate::ConnectionEntry;
pub use publish::PublishEncoder;
pub use subscribe_request::{parse_partition_list, StartPosition, SubscribeRequest};
pub use topic_config::{
    FsyncPolicy, OverflowPolicy, RetentionPolicy, Storage, TopicConfig, TopicInfo,
};
pub use topic_stats::{SubscriptionStats, TopicStats};
pub use user_entry::{
    action_bits_in_version, TokenEntry, UserEntry, ACTION_BITS_V1, ACTION_BITS_V3,
};
