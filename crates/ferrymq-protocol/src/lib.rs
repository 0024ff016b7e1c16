//! The FerryMQ binary protocol as a pure codec: bytes in, frames out, no sockets, no runtime.
//!
//! Invariants:
//! - Every integer is little-endian; every string is UTF-8 with a u16 length prefix.
//! - A frame is a 12-byte header (payload length, opcode, flags, request id) and a payload of
//!   exactly `payload_len` bytes. Decoding a frame consumes exactly those bytes or fails; trailing
//!   bytes inside a payload are an error, never ignored.
//! - [`FrameDecoder`] refuses a frame larger than its limit from the header alone, before buffering
//!   the body.
//! - Decoding never panics on any input; it returns [`ProtocolError`] naming the field at fault.
//! - Message records are validated once when their batch is decoded; afterwards the raw record
//!   bytes are trusted and copied verbatim into deliveries.
//!
//! The byte layout is drawn in `docs/protocol.md`; `protocol/vectors.json` holds golden frames
//! that every client implementation decodes and re-encodes.

mod error;
mod frame;
mod latency;
pub mod limits;
mod message;
mod record;
mod status;
mod wire;

pub use error::ProtocolError;
pub use frame::{
    action_bits_in_version, opcode, opcode_since, parse_partition_list, ClusterInfo,
    ClusterNodeEntry, ConnectionEntry, DeliverEncoder, Durability, ErrorCode, Frame, FrameDecoder,
    FrameHeader, FsyncPolicy, OverflowPolicy, PartitionLeader, PublishEncoder, RetentionPolicy,
    StartPosition, Storage, SubscribeRequest, SubscriptionStats, TokenEntry, TopicConfig,
    TopicInfo, TopicStats, UserEntry, ACTION_BITS_V1, ACTION_BITS_V3,
};
pub use latency::{
    latency_bucket, latency_bucket_high, latency_bucket_low, Latency, LatencySummary,
    LATENCY_BUCKETS,
};
pub use message::{
    Delivery, DeliveryBatch, Message, OffsetRange, Record, RecordBatch, DELIVERY_PREFIX_BYTES,
    HEADER_DEDUP_ID, OFFSET_RANGE_BYTES,
};
pub use record::{
    put_record_header, record_deliver_after_ms, record_header, record_header_len, record_key,
    set_record_body_len, RecordHead, RecordPrefix, RecordSpan, RECORD_PREFIX_BYTES,
};
pub use status::{
    ListKind, MessageEntry, MessageState, MessageStatus, RequeueSelection,
    SubscriptionMessageStatus,
};
