//! Frames: the fixed header, one variant per opcode, and their encodings.
//!
//! Header (12 bytes, little-endian):
//!
//! ```text
//! 0  u32 payload_len   bytes after the header
//! 4  u16 opcode
//! 6  u16 flags         reserved, zero
//! 8  u32 request_id    echoed by the response; 0 = no response wanted on success
//! ```

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::ProtocolError;
use crate::latency::{Latency, LATENCY_BUCKETS};
use crate::limits::{
    ERROR_MESSAGE_BYTES_MAX, FRAME_HEADER_BYTES, LIST_LIMIT_MAX, LIST_PAGE_BYTES_MAX,
    NAME_BYTES_MAX, PARTITIONS_MAX, RANGES_COUNT_MAX,
};
use crate::message::{DeliveryBatch, OffsetRange, RecordBatch, OFFSET_RANGE_BYTES};
use crate::status::{
    decode_entry, decode_message_status, decode_requeue_selection, encode_entry,
    encode_message_status, encode_requeue_selection, read_result, ListKind, MessageEntry,
    MessageStatus, RequeueSelection,
};
use crate::wire::{put_bytes16, put_str16, Reader};

/// The parsed fixed header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub payload_len: u32,
    pub opcode: u16,
    pub request_id: u32,
}

impl FrameHeader {
    /// Reads a header from the first 12 bytes of `buf`; `None` when fewer are there.
    pub fn peek(buf: &[u8]) -> Result<Option<FrameHeader>, ProtocolError> {
        if buf.len() < FRAME_HEADER_BYTES {
            return Ok(None);
        }
        let payload_len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
        let opcode = u16::from_le_bytes([buf[4], buf[5]]);
        let flags = u16::from_le_bytes([buf[6], buf[7]]);
        let request_id = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]);
        if flags != 0 {
            return Err(ProtocolError::InvalidFlags(flags));
        }
        Ok(Some(FrameHeader {
            payload_len,
            opcode,
            request_id,
        }))
    }

    pub fn frame_len(&self) -> usize {
        FRAME_HEADER_BYTES + self.payload_len as usize
    }
}

macro_rules! opcodes {
    ($($name:ident = $value:expr),* $(,)?) => {
        /// Opcode numbers. Requests are below 0x80, responses and server pushes at 0x80 and above.
        pub mod opcode {
            $(pub const $name: u16 = $value;)*
        }
        fn opcode_name(op: u16) -> &'static str {
            match op { $($value => stringify!($name),)* _ => "UNKNOWN" }
        }
    };
}

opcodes! {
    HELLO = 0x01,
    PING = 0x02,
    PONG = 0x03,
    CREATE_TOPIC = 0x10,
    DELETE_TOPIC = 0x11,
    LIST_TOPICS = 0x12,
    DESCRIBE_TOPIC = 0x13,
    PUBLISH = 0x20,
    SUBSCRIBE = 0x30,
    UNSUBSCRIBE = 0x31,
    CREDIT = 0x32,
    ACK = 0x33,
    NACK = 0x34,
    DELETE_SUBSCRIPTION = 0x35,
    ACK_RESULT = 0x36,
    STATS = 0x40,
    MESSAGE_STATUS = 0x41,
    LIST_MESSAGES = 0x42,
    REQUEUE_DEAD = 0x43,
    USER_ADD = 0x50,
    USER_REMOVE = 0x51,
    USER_PASSWD = 0x52,
    USER_LIST = 0x53,
    GRANT = 0x54,
    REVOKE = 0x55,
    TOKEN_CREATE = 0x56,
    TOKEN_LIST = 0x57,
    TOKEN_REVOKE = 0x58,
    HELLO_OK = 0x81,
    OK = 0x82,
    ERROR = 0x83,
    PUBLISHED = 0x84,
    TOPIC_LIST = 0x85,
    TOPIC_INFO = 0x86,
    SUBSCRIBED = 0x87,
    DELIVER = 0x88,
    STATS_REPLY = 0x89,
    MESSAGE_STATUS_REPLY = 0x8A,
    MESSAGE_LIST = 0x8B,
    REQUEUED = 0x8C,
    USER_LIST_REPLY = 0x8D,
    TOKEN_CREATED = 0x8E,
    TOKEN_LIST_REPLY = 0x8F,
}

/// Error codes carried by ERROR frames. Stable numbers: clients branch on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// The frame could not be decoded; the connection is closed after this error.
    MalformedFrame = 1,
    UnsupportedVersion = 2,
    FrameTooLarge = 3,
    MessageTooLarge = 4,
    UnknownTopic = 5,
    TopicExists = 6,
    /// A bounded topic with the `reject` policy is at its limit.
    TopicFull = 7,
    UnknownConsumer = 8,
    InvalidArgument = 9,
    AuthenticationFailed = 10,
    TooManyConnections = 11,
    /// A request arrived before a successful HELLO.
    HandshakeRequired = 12,
    Internal = 13,
    UnknownSubscription = 14,
    UnknownOpcode = 15,
    ShuttingDown = 16,
    /// A limit other than size was hit (subscriptions, consumers, credit).
    LimitExceeded = 17,
    /// Storage refused the write (disk full, read-only); the request can be retried later.
    StorageUnavailable = 18,
    Conflict = 19,
    /// No such message: never published at that id, or no longer retained.
    UnknownMessage = 20,
    /// The user is authenticated but not allowed this operation on this topic (or at all).
    Forbidden = 21,
}

impl ErrorCode {
    pub fn from_u16(v: u16) -> Option<ErrorCode> {
        use ErrorCode::*;
        Some(match v {
            1 => MalformedFrame,
            2 => UnsupportedVersion,
            3 => FrameTooLarge,
            4 => MessageTooLarge,
            5 => UnknownTopic,
            6 => TopicExists,
            7 => TopicFull,
            8 => UnknownConsumer,
            9 => InvalidArgument,
            10 => AuthenticationFailed,
            11 => TooManyConnections,
            12 => HandshakeRequired,
            13 => Internal,
            14 => UnknownSubscription,
            15 => UnknownOpcode,
            16 => ShuttingDown,
            17 => LimitExceeded,
            18 => StorageUnavailable,
            19 => Conflict,
            20 => UnknownMessage,
            21 => Forbidden,
            _ => return None,
        })
    }

    /// A stable snake_case name, used in logs, the CLI and (later) JSON errors.
    pub fn as_str(self) -> &'static str {
        use ErrorCode::*;
        match self {
            MalformedFrame => "malformed_frame",
            UnsupportedVersion => "unsupported_version",
            FrameTooLarge => "frame_too_large",
            MessageTooLarge => "message_too_large",
            UnknownTopic => "unknown_topic",
            TopicExists => "topic_exists",
            TopicFull => "topic_full",
            UnknownConsumer => "unknown_consumer",
            InvalidArgument => "invalid_argument",
            AuthenticationFailed => "authentication_failed",
            TooManyConnections => "too_many_connections",
            HandshakeRequired => "handshake_required",
            Internal => "internal",
            UnknownSubscription => "unknown_subscription",
            UnknownOpcode => "unknown_opcode",
            ShuttingDown => "shutting_down",
            LimitExceeded => "limit_exceeded",
            StorageUnavailable => "storage_unavailable",
            Conflict => "conflict",
            UnknownMessage => "unknown_message",
            Forbidden => "forbidden",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum Storage {
    #[default]
    Memory = 0,
    Disk = 1,
}

/// What a bounded topic does when a publish would exceed its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum OverflowPolicy {
    /// Discard the oldest retained messages to make room (RabbitMQ's default `drop-head`).
    #[default]
    DropOldest = 0,
    /// Refuse the publish with `TopicFull`.
    Reject = 1,
}

/// Whether a topic keeps the messages every subscription settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum RetentionPolicy {
    /// The server's default: `Stream` for disk topics, `WorkQueue` for memory topics.
    #[default]
    Default = 0,
    /// Keep messages until the age, size and count limits let them go, acked or not, so that a
    /// subscription created later with `earliest` reads them (Kafka's log, JetStream's `limits`).
    Stream = 1,
    /// Delete messages once every subscription settled them (JetStream's `workqueue`).
    WorkQueue = 2,
}

impl std::fmt::Display for RetentionPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RetentionPolicy::Default => "default",
            RetentionPolicy::Stream => "stream",
            RetentionPolicy::WorkQueue => "work_queue",
        })
    }
}

impl std::str::FromStr for RetentionPolicy {
    type Err = String;

    /// `stream`, `work_queue` (or `work-queue`), `default`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "stream" => Ok(RetentionPolicy::Stream),
            "work_queue" | "work-queue" => Ok(RetentionPolicy::WorkQueue),
            "default" => Ok(RetentionPolicy::Default),
            _ => Err(format!(
                "'{s}' is not a retention policy: use stream or work_queue"
            )),
        }
    }
}

/// Where a new subscription starts reading. Ignored when joining an existing subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartPosition {
    /// Only messages published after the subscription was created.
    #[default]
    Latest,
    /// Every message the topic still retains.
    Earliest,
    /// The given offset in every partition (clamped to what is retained).
    Offset(u64),
    /// The first message published at or after this Unix time in milliseconds.
    TimeMs(u64),
}

/// What a publish acknowledgement promises about the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum Durability {
    /// Held in memory only (a memory topic).
    #[default]
    Memory = 0,
    /// Written to the log, not yet synced (`fsync=never`).
    Written = 1,
    /// Written and synced within the topic's interval (`fsync=interval`).
    SyncedInterval = 2,
    /// Written and fsynced before this ack (`fsync=always`).
    Synced = 3,
}

/// When a disk topic's log is synced, and so what a publish acknowledgement promises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FsyncPolicy {
    /// The server's default (`always` unless configured otherwise).
    #[default]
    Default,
    /// Every publish is acknowledged after an fsync that covers it; concurrent publishes share
    /// one fsync (group commit).
    Always,
    /// The log is synced at least every this many milliseconds; publishes are acknowledged once
    /// written.
    IntervalMs(u32),
    /// Never synced by the broker (the operating system writes back when it likes); publishes are
    /// acknowledged once written.
    Never,
}

impl std::fmt::Display for FsyncPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FsyncPolicy::Default => f.write_str("default"),
            FsyncPolicy::Always => f.write_str("always"),
            FsyncPolicy::IntervalMs(ms) => write!(f, "interval:{ms}"),
            FsyncPolicy::Never => f.write_str("never"),
        }
    }
}

impl std::str::FromStr for FsyncPolicy {
    type Err = String;

    /// `always`, `never`, `default` or `interval:<ms>` (1 ms or more).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "always" => Ok(FsyncPolicy::Always),
            "never" => Ok(FsyncPolicy::Never),
            "default" => Ok(FsyncPolicy::Default),
            _ => match s.strip_prefix("interval:").map(str::parse::<u32>) {
                Some(Ok(ms)) if ms > 0 => Ok(FsyncPolicy::IntervalMs(ms)),
                _ => Err(format!(
                    "'{s}' is not an fsync policy: use always, never or interval:<ms> (ms >= 1)"
                )),
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicConfig {
    pub partitions: u32,
    pub storage: Storage,
    pub overflow: OverflowPolicy,
    /// 0 = the server's default.
    pub max_messages: u64,
    /// 0 = the server's default.
    pub max_bytes: u64,
    /// Disk topics: when the log is synced. Ignored by memory topics.
    pub fsync: FsyncPolicy,
    /// Disk topics: messages older than this many milliseconds are deleted (whole segments at a
    /// time). 0 = the server's default; `u64::MAX` = no age limit.
    pub retention_ms: u64,
    /// Whether settled messages go at once (work queue) or stay until the limits (stream).
    pub retention_policy: RetentionPolicy,
    /// How long the topic remembers deduplication ids; 0 = the server's default.
    pub dedup_window_ms: u64,
}

impl Default for TopicConfig {
    fn default() -> Self {
        TopicConfig {
            partitions: 1,
            storage: Storage::Memory,
            overflow: OverflowPolicy::DropOldest,
            max_messages: 0,
            max_bytes: 0,
            fsync: FsyncPolicy::Default,
            retention_ms: 0,
            retention_policy: RetentionPolicy::Default,
            dedup_window_ms: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: String,
    pub config: TopicConfig,
    /// Messages currently retained across partitions.
    pub messages: u64,
    pub bytes: u64,
    pub subscriptions: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubscriptionStats {
    pub name: String,
    pub ephemeral: bool,
    pub consumers: u32,
    pub messages_out: u64,
    pub bytes_out: u64,
    pub acked: u64,
    pub redelivered: u64,
    /// Messages not yet delivered (including those waiting for redelivery).
    pub backlog: u64,
    pub in_flight: u64,
    /// Messages given up after `max_attempts` deliveries (or dropped by a nack at the limit).
    pub gave_up: u64,
    /// From publish (or the end of a message's delay) to its first delivery.
    pub deliver_latency: Latency,
    /// From publish (or the end of a message's delay) to its ack, redeliveries included.
    pub ack_latency: Latency,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TopicStats {
    pub name: String,
    pub messages_in: u64,
    pub bytes_in: u64,
    pub messages_out: u64,
    pub bytes_out: u64,
    /// Messages retained (queue size).
    pub depth: u64,
    pub depth_bytes: u64,
    /// Messages discarded before every subscription had them: every message the drop-oldest
    /// policy discarded (whether or not the topic had subscriptions), and those a disk topic's
    /// retention removed before a subscription received them. Each message counts once.
    pub dropped: u64,
    pub publishers: u32,
    pub subscribers: u32,
    pub subscriptions: Vec<SubscriptionStats>,
}

/// What a consumer subscribes to and how. `Default` is the server's default for every setting:
/// a new ephemeral subscription from the latest message, with no credit; name the fields that
/// differ and fill the rest with `..Default::default()`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubscribeRequest {
    pub topic: String,
    /// Empty for an ephemeral subscription that lives as long as this consumer.
    pub subscription: String,
    pub start: StartPosition,
    /// 0 = the server's default.
    pub ack_timeout_ms: u32,
    /// 0 = the server's default.
    pub max_attempts: u32,
    /// Initial credit: how many messages the server may send before hearing more.
    pub credit: u32,
    /// Messages count as acked when sent (at-most-once, like a plain pub/sub subscriber).
    pub auto_ack: bool,
    /// Each partition's messages are delivered in offset order, the next once the one before is
    /// settled. Needs acks: the decoder refuses it together with `auto_ack`.
    pub ordered: bool,
    /// The partitions this consumer takes messages from, as inclusive ranges `(first, last)`;
    /// empty = all. See [`parse_partition_list`].
    pub partitions: Vec<(u32, u32)>,
    /// Where given-up messages go; empty = the default `<topic>.dlq`, otherwise a topic name
    /// (1..=255 bytes).
    pub dead_letter_topic: String,
}

impl SubscribeRequest {
    /// A request for subscription `name` of `topic` (empty: a new ephemeral one) from its
    /// earliest retained message, with the server's defaults for everything else.
    pub fn earliest(topic: &str, name: &str) -> Self {
        SubscribeRequest {
            topic: topic.into(),
            subscription: name.into(),
            start: StartPosition::Earliest,
            ..Default::default()
        }
    }
}

/// Parses a partition list such as `1,2,4-7` into inclusive ranges, in the order given.
pub fn parse_partition_list(text: &str) -> Result<Vec<(u32, u32)>, String> {
    let bad = |part: &str| {
        format!("'{part}' in '{text}' is not a partition or a range: write e.g. 1,2,4-7")
    };
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse(), b.trim().parse()),
            None => (part.parse(), part.parse()),
        };
        match (first, last) {
            (Ok(first), Ok(last)) if first <= last => out.push((first, last)),
            (Ok(first), Ok(last)) => {
                return Err(format!(
                    "'{part}' in '{text}' is reversed: a range goes up, write {last}-{first}"
                ))
            }
            _ => return Err(bad(part)),
        }
    }
    if out.is_empty() {
        return Err(format!("'{text}' names no partition"));
    }
    Ok(out)
}

/// Every frame of protocol version 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Hello {
        version_min: u16,
        version_max: u16,
        heartbeat_ms: u32,
        client_name: String,
        user: String,
        password: String,
    },
    Ping,
    Pong,
    CreateTopic {
        name: String,
        config: TopicConfig,
        if_not_exists: bool,
    },
    DeleteTopic {
        name: String,
    },
    ListTopics,
    DescribeTopic {
        name: String,
    },
    /// `partition: None` lets the broker choose by key (or round-robin for key-less messages).
    Publish {
        topic: String,
        partition: Option<u32>,
        records: RecordBatch,
    },
    Subscribe(SubscribeRequest),
    Unsubscribe {
        consumer_id: u32,
    },
    Credit {
        consumer_id: u32,
        credit: u32,
    },
    Ack {
        consumer_id: u32,
        ranges: Vec<OffsetRange>,
    },
    /// `delay_ms` 0 requeues at once.
    Nack {
        consumer_id: u32,
        delay_ms: u32,
        /// Move the messages to the dead-letter topic now instead of delivering them again.
        dead_letter: bool,
        /// Give the messages back unprocessed: their delivery does not count as an attempt (a
        /// consumer that stops early has not failed them). Never with `dead_letter`.
        release: bool,
        /// Why the consumer gave them back (at most 1024 bytes); carried in a dead letter.
        reason: String,
        ranges: Vec<OffsetRange>,
    },
    DeleteSubscription {
        topic: String,
        subscription: String,
    },
    Stats {
        topic: String,
    },
    /// An ACK that attaches `result` (at most [`crate::limits::ACK_RESULT_BYTES_MAX`] bytes) to
    /// every message it settles; the broker keeps it for status queries.
    AckResult {
        consumer_id: u32,
        result: Bytes,
        ranges: Vec<OffsetRange>,
    },
    /// Where one message stands in every subscription of its topic.
    MessageStatus {
        topic: String,
        partition: u32,
        offset: u64,
    },
    /// One page of a subscription's messages of one kind. `page` is a token from a previous
    /// MESSAGE_LIST (empty = the first page); `limit` is 1..=[`LIST_LIMIT_MAX`].
    ListMessages {
        topic: String,
        subscription: String,
        kind: ListKind,
        page: Bytes,
        limit: u32,
    },
    /// Publishes the selected dead letters of a dead-letter topic again to their source topic.
    RequeueDead {
        dead_letter_topic: String,
        selection: RequeueSelection,
    },

    /// Adds a user with a password and roles (bits: 1 admin, 2 monitor). Admin only.
    UserAdd {
        user: String,
        password: String,
        roles: u8,
    },
    UserRemove {
        user: String,
    },
    /// Sets a password: one's own (`user` empty or one's name), or anyone's as an admin.
    UserPasswd {
        user: String,
        password: String,
    },
    UserList,
    /// Adds `actions` (bits: 1 publish, 2 consume, 4 inspect, 8 manage) on `pattern` and
    /// `roles`; `pattern` is empty when only roles are granted.
    Grant {
        user: String,
        pattern: String,
        actions: u8,
        roles: u8,
    },
    /// Takes `actions` on exactly `pattern`, and `roles`, away.
    Revoke {
        user: String,
        pattern: String,
        actions: u8,
        roles: u8,
    },
    /// Creates a named API token; `user` empty: one's own. `expires_ms` is unix ms, 0 never.
    TokenCreate {
        user: String,
        name: String,
        expires_ms: u64,
    },
    TokenList {
        user: String,
    },
    TokenRevoke {
        user: String,
        name: String,
    },

    HelloOk {
        version: u16,
        heartbeat_ms: u32,
        frame_bytes_max: u32,
        message_bytes_max: u32,
        server: String,
    },
    Ok,
    Error {
        code: u16,
        message: String,
    },
    Published {
        durability: Durability,
        ranges: Vec<OffsetRange>,
    },
    TopicList {
        topics: Vec<TopicInfo>,
    },
    TopicInfo(TopicInfo),
    Subscribed {
        consumer_id: u32,
        subscription: String,
        partitions: u32,
    },
    Deliver {
        consumer_id: u32,
        deliveries: DeliveryBatch,
    },
    StatsReply {
        topics: Vec<TopicStats>,
    },
    MessageStatusReply(MessageStatus),
    /// `next_page` is empty on the last page.
    MessageList {
        entries: Vec<MessageEntry>,
        next_page: Bytes,
    },
    Requeued {
        /// Dead letters published again.
        requeued: u64,
        /// Selected offsets already requeued before, or not dead letters.
        skipped: u64,
    },
    UserListReply {
        users: Vec<UserEntry>,
    },
    /// The token, shown this once: the broker keeps only its hash.
    TokenCreated {
        name: String,
        token: String,
        expires_ms: u64,
    },
    TokenListReply {
        tokens: Vec<TokenEntry>,
    },
}

/// A user as USER_LIST_REPLY carries it: never a password or a hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserEntry {
    pub name: String,
    pub roles: u8,
    /// How many API tokens the user holds.
    pub tokens: u32,
    /// (pattern, action bits).
    pub grants: Vec<(String, u8)>,
}

/// A token as TOKEN_LIST_REPLY carries it: its name and dates, never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenEntry {
    pub name: String,
    pub created_ms: u64,
    /// 0: never expires.
    pub expires_ms: u64,
}

const NO_PARTITION: u32 = u32::MAX;
const SUBSCRIBE_FLAG_AUTO_ACK: u8 = 1;
const SUBSCRIBE_FLAG_ORDERED: u8 = 2;
const NACK_FLAG_DEAD_LETTER: u8 = 1;
const NACK_FLAG_RELEASE: u8 = 2;
const CREATE_FLAG_IF_NOT_EXISTS: u8 = 1;

impl Frame {
    pub fn opcode(&self) -> u16 {
        use opcode::*;
        match self {
            Frame::Hello { .. } => HELLO,
            Frame::Ping => PING,
            Frame::Pong => PONG,
            Frame::CreateTopic { .. } => CREATE_TOPIC,
            Frame::DeleteTopic { .. } => DELETE_TOPIC,
            Frame::ListTopics => LIST_TOPICS,
            Frame::DescribeTopic { .. } => DESCRIBE_TOPIC,
            Frame::Publish { .. } => PUBLISH,
            Frame::Subscribe(_) => SUBSCRIBE,
            Frame::Unsubscribe { .. } => UNSUBSCRIBE,
            Frame::Credit { .. } => CREDIT,
            Frame::Ack { .. } => ACK,
            Frame::Nack { .. } => NACK,
            Frame::DeleteSubscription { .. } => DELETE_SUBSCRIPTION,
            Frame::Stats { .. } => STATS,
            Frame::AckResult { .. } => ACK_RESULT,
            Frame::MessageStatus { .. } => MESSAGE_STATUS,
            Frame::ListMessages { .. } => LIST_MESSAGES,
            Frame::RequeueDead { .. } => REQUEUE_DEAD,
            Frame::UserAdd { .. } => USER_ADD,
            Frame::UserRemove { .. } => USER_REMOVE,
            Frame::UserPasswd { .. } => USER_PASSWD,
            Frame::UserList => USER_LIST,
            Frame::Grant { .. } => GRANT,
            Frame::Revoke { .. } => REVOKE,
            Frame::TokenCreate { .. } => TOKEN_CREATE,
            Frame::TokenList { .. } => TOKEN_LIST,
            Frame::TokenRevoke { .. } => TOKEN_REVOKE,
            Frame::HelloOk { .. } => HELLO_OK,
            Frame::Ok => OK,
            Frame::Error { .. } => ERROR,
            Frame::Published { .. } => PUBLISHED,
            Frame::TopicList { .. } => TOPIC_LIST,
            Frame::TopicInfo(_) => TOPIC_INFO,
            Frame::Subscribed { .. } => SUBSCRIBED,
            Frame::Deliver { .. } => DELIVER,
            Frame::StatsReply { .. } => STATS_REPLY,
            Frame::MessageStatusReply(_) => MESSAGE_STATUS_REPLY,
            Frame::MessageList { .. } => MESSAGE_LIST,
            Frame::Requeued { .. } => REQUEUED,
            Frame::UserListReply { .. } => USER_LIST_REPLY,
            Frame::TokenCreated { .. } => TOKEN_CREATED,
            Frame::TokenListReply { .. } => TOKEN_LIST_REPLY,
        }
    }

    pub fn name(&self) -> &'static str {
        opcode_name(self.opcode())
    }

    /// Builds an ERROR frame, trimming the text to the protocol's limit on a char boundary.
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Frame {
        let mut message = message.into();
        if message.len() > ERROR_MESSAGE_BYTES_MAX {
            let mut cut = ERROR_MESSAGE_BYTES_MAX;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        Frame::Error {
            code: code as u16,
            message,
        }
    }

    /// Appends the whole frame, header included, to `buf`.
    ///
    /// Strings longer than their length field and name fields longer than [`NAME_BYTES_MAX`] are
    /// caller bugs: the client and server validate names before building frames.
    pub fn encode(&self, request_id: u32, buf: &mut BytesMut) {
        let start = buf.len();
        buf.put_u32_le(0);
        buf.put_u16_le(self.opcode());
        buf.put_u16_le(0);
        buf.put_u32_le(request_id);
        self.encode_payload(buf);
        let payload_len = buf.len() - start - FRAME_HEADER_BYTES;
        assert!(
            payload_len <= u32::MAX as usize,
            "frame payload does not fit u32"
        );
        buf[start..start + 4].copy_from_slice(&(payload_len as u32).to_le_bytes());
    }

    fn encode_payload(&self, buf: &mut BytesMut) {
        match self {
            Frame::Hello {
                version_min,
                version_max,
                heartbeat_ms,
                client_name,
                user,
                password,
            } => {
                buf.put_u16_le(*version_min);
                buf.put_u16_le(*version_max);
                buf.put_u32_le(*heartbeat_ms);
                put_str16(buf, client_name);
                put_str16(buf, user);
                put_str16(buf, password);
            }
            Frame::Ping | Frame::Pong | Frame::ListTopics | Frame::Ok | Frame::UserList => {}
            Frame::UserAdd {
                user,
                password,
                roles,
            } => {
                put_str16(buf, user);
                put_str16(buf, password);
                buf.put_u8(*roles);
            }
            Frame::UserRemove { user } | Frame::TokenList { user } => put_str16(buf, user),
            Frame::UserPasswd { user, password } => {
                put_str16(buf, user);
                put_str16(buf, password);
            }
            Frame::Grant {
                user,
                pattern,
                actions,
                roles,
            }
            | Frame::Revoke {
                user,
                pattern,
                actions,
                roles,
            } => {
                put_str16(buf, user);
                put_str16(buf, pattern);
                buf.put_u8(*actions);
                buf.put_u8(*roles);
            }
            Frame::TokenCreate {
                user,
                name,
                expires_ms,
            } => {
                put_str16(buf, user);
                put_str16(buf, name);
                buf.put_u64_le(*expires_ms);
            }
            Frame::TokenRevoke { user, name } => {
                put_str16(buf, user);
                put_str16(buf, name);
            }
            Frame::UserListReply { users } => {
                buf.put_u32_le(users.len() as u32);
                for u in users {
                    put_str16(buf, &u.name);
                    buf.put_u8(u.roles);
                    buf.put_u32_le(u.tokens);
                    buf.put_u16_le(u.grants.len() as u16);
                    for (pattern, actions) in &u.grants {
                        put_str16(buf, pattern);
                        buf.put_u8(*actions);
                    }
                }
            }
            Frame::TokenCreated {
                name,
                token,
                expires_ms,
            } => {
                put_str16(buf, name);
                put_str16(buf, token);
                buf.put_u64_le(*expires_ms);
            }
            Frame::TokenListReply { tokens } => {
                buf.put_u32_le(tokens.len() as u32);
                for t in tokens {
                    put_str16(buf, &t.name);
                    buf.put_u64_le(t.created_ms);
                    buf.put_u64_le(t.expires_ms);
                }
            }
            Frame::CreateTopic {
                name,
                config,
                if_not_exists,
            } => {
                put_str16(buf, name);
                encode_topic_config(config, buf);
                buf.put_u8(if *if_not_exists {
                    CREATE_FLAG_IF_NOT_EXISTS
                } else {
                    0
                });
            }
            Frame::DeleteTopic { name } | Frame::DescribeTopic { name } => put_str16(buf, name),
            Frame::Publish {
                topic,
                partition,
                records,
            } => {
                put_str16(buf, topic);
                buf.put_u32_le(partition.unwrap_or(NO_PARTITION));
                buf.put_u32_le(records.count());
                buf.put_slice(records.bytes());
            }
            Frame::Subscribe(s) => {
                put_str16(buf, &s.topic);
                put_str16(buf, &s.subscription);
                let (kind, value) = match s.start {
                    StartPosition::Latest => (0u8, 0u64),
                    StartPosition::Earliest => (1, 0),
                    StartPosition::Offset(o) => (2, o),
                    StartPosition::TimeMs(t) => (3, t),
                };
                buf.put_u8(kind);
                buf.put_u64_le(value);
                buf.put_u32_le(s.ack_timeout_ms);
                buf.put_u32_le(s.max_attempts);
                buf.put_u32_le(s.credit);
                let mut flags = 0;
                if s.auto_ack {
                    flags |= SUBSCRIBE_FLAG_AUTO_ACK;
                }
                if s.ordered {
                    flags |= SUBSCRIBE_FLAG_ORDERED;
                }
                buf.put_u8(flags);
                buf.put_u16_le(s.partitions.len() as u16);
                for &(first, last) in &s.partitions {
                    buf.put_u32_le(first);
                    buf.put_u32_le(last);
                }
                put_str16(buf, &s.dead_letter_topic);
            }
            Frame::Unsubscribe { consumer_id } => buf.put_u32_le(*consumer_id),
            Frame::Credit {
                consumer_id,
                credit,
            } => {
                buf.put_u32_le(*consumer_id);
                buf.put_u32_le(*credit);
            }
            Frame::Ack {
                consumer_id,
                ranges,
            } => {
                buf.put_u32_le(*consumer_id);
                encode_ranges(ranges, buf);
            }
            Frame::Nack {
                consumer_id,
                delay_ms,
                dead_letter,
                release,
                reason,
                ranges,
            } => {
                assert!(
                    !(*dead_letter && *release),
                    "a NACK either dead-letters or releases"
                );
                buf.put_u32_le(*consumer_id);
                buf.put_u32_le(*delay_ms);
                let mut flags = 0;
                if *dead_letter {
                    flags |= NACK_FLAG_DEAD_LETTER;
                }
                if *release {
                    flags |= NACK_FLAG_RELEASE;
                }
                buf.put_u8(flags);
                put_str16(buf, reason);
                encode_ranges(ranges, buf);
            }
            Frame::DeleteSubscription {
                topic,
                subscription,
            } => {
                put_str16(buf, topic);
                put_str16(buf, subscription);
            }
            Frame::Stats { topic } => put_str16(buf, topic),
            Frame::AckResult {
                consumer_id,
                result,
                ranges,
            } => {
                buf.put_u32_le(*consumer_id);
                put_bytes16(buf, result);
                encode_ranges(ranges, buf);
            }
            Frame::MessageStatus {
                topic,
                partition,
                offset,
            } => {
                put_str16(buf, topic);
                buf.put_u32_le(*partition);
                buf.put_u64_le(*offset);
            }
            Frame::ListMessages {
                topic,
                subscription,
                kind,
                page,
                limit,
            } => {
                put_str16(buf, topic);
                put_str16(buf, subscription);
                buf.put_u8(*kind as u8);
                put_bytes16(buf, page);
                buf.put_u32_le(*limit);
            }
            Frame::RequeueDead {
                dead_letter_topic,
                selection,
            } => {
                put_str16(buf, dead_letter_topic);
                encode_requeue_selection(selection, buf);
            }
            Frame::HelloOk {
                version,
                heartbeat_ms,
                frame_bytes_max,
                message_bytes_max,
                server,
            } => {
                buf.put_u16_le(*version);
                buf.put_u32_le(*heartbeat_ms);
                buf.put_u32_le(*frame_bytes_max);
                buf.put_u32_le(*message_bytes_max);
                put_str16(buf, server);
            }
            Frame::Error { code, message } => {
                buf.put_u16_le(*code);
                put_str16(buf, message);
            }
            Frame::Published { durability, ranges } => {
                buf.put_u8(*durability as u8);
                encode_ranges(ranges, buf);
            }
            Frame::TopicList { topics } => {
                buf.put_u32_le(topics.len() as u32);
                for t in topics {
                    encode_topic_info(t, buf);
                }
            }
            Frame::TopicInfo(t) => encode_topic_info(t, buf),
            Frame::Subscribed {
                consumer_id,
                subscription,
                partitions,
            } => {
                buf.put_u32_le(*consumer_id);
                put_str16(buf, subscription);
                buf.put_u32_le(*partitions);
            }
            Frame::Deliver {
                consumer_id,
                deliveries,
            } => {
                buf.put_u32_le(*consumer_id);
                buf.put_u32_le(deliveries.count());
                buf.put_slice(deliveries.bytes());
            }
            Frame::StatsReply { topics } => {
                buf.put_u32_le(topics.len() as u32);
                for t in topics {
                    encode_topic_stats(t, buf);
                }
            }
            Frame::MessageStatusReply(status) => encode_message_status(status, buf),
            Frame::MessageList { entries, next_page } => {
                buf.put_u32_le(entries.len() as u32);
                for e in entries {
                    encode_entry(e, buf);
                }
                put_bytes16(buf, next_page);
            }
            Frame::Requeued { requeued, skipped } => {
                buf.put_u64_le(*requeued);
                buf.put_u64_le(*skipped);
            }
        }
    }

    /// Decodes a frame's payload. `payload` must be exactly the bytes after the header.
    pub fn decode(header: &FrameHeader, payload: Bytes) -> Result<Frame, ProtocolError> {
        use opcode::*;
        debug_assert_eq!(payload.len(), header.payload_len as usize);
        let mut r = Reader::new(payload);
        let frame = match header.opcode {
            HELLO => Frame::Hello {
                version_min: r.u16("hello.version_min")?,
                version_max: r.u16("hello.version_max")?,
                heartbeat_ms: r.u32("hello.heartbeat_ms")?,
                client_name: r.str16("hello.client_name")?,
                user: r.str16("hello.user")?,
                password: r.str16("hello.password")?,
            },
            PING => Frame::Ping,
            PONG => Frame::Pong,
            CREATE_TOPIC => Frame::CreateTopic {
                name: read_name(&mut r, "create_topic.name")?,
                config: decode_topic_config(&mut r)?,
                if_not_exists: read_flags(&mut r, "create_topic.flags", CREATE_FLAG_IF_NOT_EXISTS)?
                    != 0,
            },
            DELETE_TOPIC => Frame::DeleteTopic {
                name: read_name(&mut r, "delete_topic.name")?,
            },
            LIST_TOPICS => Frame::ListTopics,
            DESCRIBE_TOPIC => Frame::DescribeTopic {
                name: read_name(&mut r, "describe_topic.name")?,
            },
            PUBLISH => {
                let topic = read_name(&mut r, "publish.topic")?;
                let partition = match r.u32("publish.partition")? {
                    NO_PARTITION => None,
                    p => Some(p),
                };
                let count = r.u32("publish.count")?;
                let records = RecordBatch::decode(count, r.rest())?;
                Frame::Publish {
                    topic,
                    partition,
                    records,
                }
            }
            SUBSCRIBE => {
                let topic = read_name(&mut r, "subscribe.topic")?;
                let subscription = r.str16("subscribe.subscription")?;
                if subscription.len() > NAME_BYTES_MAX {
                    return Err(ProtocolError::invalid(
                        "subscribe.subscription",
                        format!("longer than {NAME_BYTES_MAX} bytes"),
                    ));
                }
                let kind = r.u8("subscribe.start")?;
                let value = r.u64("subscribe.start_value")?;
                if kind <= 1 && value != 0 {
                    // Latest and earliest carry no value; refusing one keeps the decoding
                    // canonical (what decodes re-encodes to the same bytes) and the bytes free
                    // for a later version to give meaning to.
                    return Err(ProtocolError::invalid(
                        "subscribe.start_value",
                        format!("{value} must be 0 for start kind {kind}"),
                    ));
                }
                let start = match kind {
                    0 => StartPosition::Latest,
                    1 => StartPosition::Earliest,
                    2 => StartPosition::Offset(value),
                    3 => StartPosition::TimeMs(value),
                    k => {
                        return Err(ProtocolError::invalid(
                            "subscribe.start",
                            format!("unknown start kind {k}"),
                        ))
                    }
                };
                let ack_timeout_ms = r.u32("subscribe.ack_timeout_ms")?;
                let max_attempts = r.u32("subscribe.max_attempts")?;
                let credit = r.u32("subscribe.credit")?;
                let flags = read_flags(
                    &mut r,
                    "subscribe.flags",
                    SUBSCRIBE_FLAG_AUTO_ACK | SUBSCRIBE_FLAG_ORDERED,
                )?;
                let auto_ack = flags & SUBSCRIBE_FLAG_AUTO_ACK != 0;
                let ordered = flags & SUBSCRIBE_FLAG_ORDERED != 0;
                if auto_ack && ordered {
                    return Err(ProtocolError::invalid(
                        "subscribe.flags",
                        "ordered delivery needs acks: it cannot be combined with auto_ack",
                    ));
                }
                Frame::Subscribe(SubscribeRequest {
                    topic,
                    subscription,
                    start,
                    ack_timeout_ms,
                    max_attempts,
                    credit,
                    auto_ack,
                    ordered,
                    partitions: {
                        let count = r.u16("subscribe.partitions")? as usize;
                        if count > PARTITIONS_MAX as usize {
                            return Err(ProtocolError::invalid(
                                "subscribe.partitions",
                                format!("{count} ranges, above the limit of {PARTITIONS_MAX}"),
                            ));
                        }
                        let mut ranges = Vec::with_capacity(count);
                        for _ in 0..count {
                            let first = r.u32("subscribe.partitions")?;
                            let last = r.u32("subscribe.partitions")?;
                            if first > last {
                                return Err(ProtocolError::invalid(
                                    "subscribe.partitions",
                                    format!("range {first}-{last} ends before it starts"),
                                ));
                            }
                            ranges.push((first, last));
                        }
                        ranges
                    },
                    dead_letter_topic: {
                        let name = r.str16("subscribe.dead_letter_topic")?;
                        if name.len() > NAME_BYTES_MAX {
                            return Err(ProtocolError::invalid(
                                "subscribe.dead_letter_topic",
                                format!(
                                    "must be empty (the default) or 1..={NAME_BYTES_MAX} bytes"
                                ),
                            ));
                        }
                        name
                    },
                })
            }
            UNSUBSCRIBE => Frame::Unsubscribe {
                consumer_id: r.u32("unsubscribe.consumer_id")?,
            },
            CREDIT => Frame::Credit {
                consumer_id: r.u32("credit.consumer_id")?,
                credit: r.u32("credit.credit")?,
            },
            ACK => Frame::Ack {
                consumer_id: r.u32("ack.consumer_id")?,
                ranges: decode_ranges(&mut r)?,
            },
            NACK => {
                let consumer_id = r.u32("nack.consumer_id")?;
                let delay_ms = r.u32("nack.delay_ms")?;
                let flags = read_flags(
                    &mut r,
                    "nack.flags",
                    NACK_FLAG_DEAD_LETTER | NACK_FLAG_RELEASE,
                )?;
                if flags == NACK_FLAG_DEAD_LETTER | NACK_FLAG_RELEASE {
                    return Err(ProtocolError::invalid(
                        "nack.flags",
                        "dead_letter and release together: a NACK does one or the other",
                    ));
                }
                Frame::Nack {
                    consumer_id,
                    delay_ms,
                    dead_letter: flags & NACK_FLAG_DEAD_LETTER != 0,
                    release: flags & NACK_FLAG_RELEASE != 0,
                    reason: {
                        let reason = r.str16("nack.reason")?;
                        if reason.len() > ERROR_MESSAGE_BYTES_MAX {
                            return Err(ProtocolError::invalid(
                                "nack.reason",
                                format!(
                                    "{} bytes, above the limit of {ERROR_MESSAGE_BYTES_MAX}",
                                    reason.len()
                                ),
                            ));
                        }
                        reason
                    },
                    ranges: decode_ranges(&mut r)?,
                }
            }
            DELETE_SUBSCRIPTION => Frame::DeleteSubscription {
                topic: read_name(&mut r, "delete_subscription.topic")?,
                subscription: read_name(&mut r, "delete_subscription.subscription")?,
            },
            STATS => Frame::Stats {
                topic: r.str16("stats.topic")?,
            },
            ACK_RESULT => Frame::AckResult {
                consumer_id: r.u32("ack_result.consumer_id")?,
                result: read_result(&mut r, "ack_result.result")?,
                ranges: decode_ranges(&mut r)?,
            },
            MESSAGE_STATUS => Frame::MessageStatus {
                topic: read_name(&mut r, "message_status.topic")?,
                partition: r.u32("message_status.partition")?,
                offset: r.u64("message_status.offset")?,
            },
            LIST_MESSAGES => {
                let topic = read_name(&mut r, "list_messages.topic")?;
                let subscription = read_name(&mut r, "list_messages.subscription")?;
                let kind = r.u8("list_messages.kind")?;
                let kind = ListKind::from_u8(kind).ok_or_else(|| {
                    ProtocolError::invalid("list_messages.kind", format!("unknown kind {kind}"))
                })?;
                let page = read_page(&mut r, "list_messages.page")?;
                let limit = r.u32("list_messages.limit")?;
                if limit == 0 || limit > LIST_LIMIT_MAX {
                    return Err(ProtocolError::invalid(
                        "list_messages.limit",
                        format!("{limit} is not within 1..={LIST_LIMIT_MAX}"),
                    ));
                }
                Frame::ListMessages {
                    topic,
                    subscription,
                    kind,
                    page,
                    limit,
                }
            }
            REQUEUE_DEAD => Frame::RequeueDead {
                dead_letter_topic: read_name(&mut r, "requeue_dead.dead_letter_topic")?,
                selection: decode_requeue_selection(&mut r)?,
            },
            HELLO_OK => Frame::HelloOk {
                version: r.u16("hello_ok.version")?,
                heartbeat_ms: r.u32("hello_ok.heartbeat_ms")?,
                frame_bytes_max: r.u32("hello_ok.frame_bytes_max")?,
                message_bytes_max: r.u32("hello_ok.message_bytes_max")?,
                server: r.str16("hello_ok.server")?,
            },
            OK => Frame::Ok,
            ERROR => Frame::Error {
                code: r.u16("error.code")?,
                message: r.str16("error.message")?,
            },
            PUBLISHED => {
                let durability = match r.u8("published.durability")? {
                    0 => Durability::Memory,
                    1 => Durability::Written,
                    2 => Durability::SyncedInterval,
                    3 => Durability::Synced,
                    d => {
                        return Err(ProtocolError::invalid(
                            "published.durability",
                            format!("unknown value {d}"),
                        ))
                    }
                };
                Frame::Published {
                    durability,
                    ranges: decode_ranges(&mut r)?,
                }
            }
            TOPIC_LIST => {
                let count = r.u32("topic_list.count")?;
                let mut topics = Vec::with_capacity(count.min(1024) as usize);
                for _ in 0..count {
                    topics.push(decode_topic_info(&mut r)?);
                }
                Frame::TopicList { topics }
            }
            TOPIC_INFO => Frame::TopicInfo(decode_topic_info(&mut r)?),
            SUBSCRIBED => Frame::Subscribed {
                consumer_id: r.u32("subscribed.consumer_id")?,
                subscription: r.str16("subscribed.subscription")?,
                partitions: r.u32("subscribed.partitions")?,
            },
            DELIVER => {
                let consumer_id = r.u32("deliver.consumer_id")?;
                let count = r.u32("deliver.count")?;
                Frame::Deliver {
                    consumer_id,
                    deliveries: DeliveryBatch::decode(count, r.rest())?,
                }
            }
            STATS_REPLY => {
                let count = r.u32("stats_reply.count")?;
                let mut topics = Vec::with_capacity(count.min(1024) as usize);
                for _ in 0..count {
                    topics.push(decode_topic_stats(&mut r)?);
                }
                Frame::StatsReply { topics }
            }
            MESSAGE_STATUS_REPLY => Frame::MessageStatusReply(decode_message_status(&mut r)?),
            MESSAGE_LIST => {
                let count = r.u32("message_list.count")?;
                if count > LIST_LIMIT_MAX {
                    return Err(ProtocolError::invalid(
                        "message_list.count",
                        format!("{count} entries, above the limit of {LIST_LIMIT_MAX}"),
                    ));
                }
                let mut entries = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    entries.push(decode_entry(&mut r)?);
                }
                Frame::MessageList {
                    entries,
                    next_page: read_page(&mut r, "message_list.next_page")?,
                }
            }
            REQUEUED => Frame::Requeued {
                requeued: r.u64("requeued.requeued")?,
                skipped: r.u64("requeued.skipped")?,
            },
            USER_ADD => Frame::UserAdd {
                user: r.str16("user_add.user")?,
                password: r.str16("user_add.password")?,
                roles: r.u8("user_add.roles")?,
            },
            USER_REMOVE => Frame::UserRemove {
                user: r.str16("user_remove.user")?,
            },
            USER_PASSWD => Frame::UserPasswd {
                user: r.str16("user_passwd.user")?,
                password: r.str16("user_passwd.password")?,
            },
            USER_LIST => Frame::UserList,
            GRANT => Frame::Grant {
                user: r.str16("grant.user")?,
                pattern: r.str16("grant.pattern")?,
                actions: r.u8("grant.actions")?,
                roles: r.u8("grant.roles")?,
            },
            REVOKE => Frame::Revoke {
                user: r.str16("revoke.user")?,
                pattern: r.str16("revoke.pattern")?,
                actions: r.u8("revoke.actions")?,
                roles: r.u8("revoke.roles")?,
            },
            TOKEN_CREATE => Frame::TokenCreate {
                user: r.str16("token_create.user")?,
                name: r.str16("token_create.name")?,
                expires_ms: r.u64("token_create.expires_ms")?,
            },
            TOKEN_LIST => Frame::TokenList {
                user: r.str16("token_list.user")?,
            },
            TOKEN_REVOKE => Frame::TokenRevoke {
                user: r.str16("token_revoke.user")?,
                name: r.str16("token_revoke.name")?,
            },
            USER_LIST_REPLY => {
                let count = r.u32("user_list_reply.count")?;
                // Not preallocated from the count: each entry takes bytes, so a lying count
                // fails as truncated before it costs memory.
                let mut users = Vec::new();
                for _ in 0..count {
                    let name = r.str16("user_list_reply.name")?;
                    let roles = r.u8("user_list_reply.roles")?;
                    let tokens = r.u32("user_list_reply.tokens")?;
                    let grant_count = r.u16("user_list_reply.grant_count")?;
                    let mut grants = Vec::new();
                    for _ in 0..grant_count {
                        grants.push((
                            r.str16("user_list_reply.pattern")?,
                            r.u8("user_list_reply.actions")?,
                        ));
                    }
                    users.push(UserEntry {
                        name,
                        roles,
                        tokens,
                        grants,
                    });
                }
                Frame::UserListReply { users }
            }
            TOKEN_CREATED => Frame::TokenCreated {
                name: r.str16("token_created.name")?,
                token: r.str16("token_created.token")?,
                expires_ms: r.u64("token_created.expires_ms")?,
            },
            TOKEN_LIST_REPLY => {
                let count = r.u32("token_list_reply.count")?;
                let mut tokens = Vec::new();
                for _ in 0..count {
                    tokens.push(TokenEntry {
                        name: r.str16("token_list_reply.name")?,
                        created_ms: r.u64("token_list_reply.created_ms")?,
                        expires_ms: r.u64("token_list_reply.expires_ms")?,
                    });
                }
                Frame::TokenListReply { tokens }
            }
            other => return Err(ProtocolError::UnknownOpcode(other)),
        };
        r.finish(opcode_name(header.opcode))?;
        Ok(frame)
    }
}

fn read_name(r: &mut Reader, field: &'static str) -> Result<String, ProtocolError> {
    let name = r.str16(field)?;
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(ProtocolError::invalid(
            field,
            format!("must be 1..={NAME_BYTES_MAX} bytes"),
        ));
    }
    Ok(name)
}

/// A page token of LIST_MESSAGES / MESSAGE_LIST: bytes16 of at most [`LIST_PAGE_BYTES_MAX`].
fn read_page(r: &mut Reader, field: &'static str) -> Result<Bytes, ProtocolError> {
    let page = r.bytes16(field)?;
    if page.len() > LIST_PAGE_BYTES_MAX {
        return Err(ProtocolError::invalid(
            field,
            format!(
                "{} bytes, above the limit of {LIST_PAGE_BYTES_MAX}",
                page.len()
            ),
        ));
    }
    Ok(page)
}

fn read_flags(r: &mut Reader, field: &'static str, known: u8) -> Result<u8, ProtocolError> {
    let flags = r.u8(field)?;
    if flags & !known != 0 {
        return Err(ProtocolError::invalid(
            field,
            format!("unknown bits 0x{flags:02x}"),
        ));
    }
    Ok(flags)
}

fn encode_ranges(ranges: &[OffsetRange], buf: &mut BytesMut) {
    assert!(
        ranges.len() <= RANGES_COUNT_MAX as usize,
        "{} ranges exceed the protocol limit",
        ranges.len()
    );
    buf.reserve(4 + ranges.len() * OFFSET_RANGE_BYTES);
    buf.put_u32_le(ranges.len() as u32);
    for range in ranges {
        range.encode(buf);
    }
}

fn decode_ranges(r: &mut Reader) -> Result<Vec<OffsetRange>, ProtocolError> {
    let count = r.u32("ranges.count")?;
    if count > RANGES_COUNT_MAX {
        return Err(ProtocolError::invalid(
            "ranges.count",
            format!("{count}, limit {RANGES_COUNT_MAX}"),
        ));
    }
    if (count as usize) * OFFSET_RANGE_BYTES > r.remaining() {
        return Err(ProtocolError::Truncated { field: "ranges" });
    }
    (0..count).map(|_| OffsetRange::decode(r)).collect()
}

fn encode_topic_config(c: &TopicConfig, buf: &mut BytesMut) {
    buf.put_u32_le(c.partitions);
    buf.put_u8(c.storage as u8);
    buf.put_u8(c.overflow as u8);
    buf.put_u64_le(c.max_messages);
    buf.put_u64_le(c.max_bytes);
    let (kind, interval_ms) = match c.fsync {
        FsyncPolicy::Default => (0, 0),
        FsyncPolicy::Always => (1, 0),
        FsyncPolicy::IntervalMs(ms) => (2, ms),
        FsyncPolicy::Never => (3, 0),
    };
    buf.put_u8(kind);
    buf.put_u32_le(interval_ms);
    buf.put_u64_le(c.retention_ms);
    buf.put_u8(c.retention_policy as u8);
    buf.put_u64_le(c.dedup_window_ms);
}

fn decode_topic_config(r: &mut Reader) -> Result<TopicConfig, ProtocolError> {
    let partitions = r.u32("topic.partitions")?;
    let storage = match r.u8("topic.storage")? {
        0 => Storage::Memory,
        1 => Storage::Disk,
        s => {
            return Err(ProtocolError::invalid(
                "topic.storage",
                format!("unknown storage {s}"),
            ))
        }
    };
    let overflow = match r.u8("topic.overflow")? {
        0 => OverflowPolicy::DropOldest,
        1 => OverflowPolicy::Reject,
        o => {
            return Err(ProtocolError::invalid(
                "topic.overflow",
                format!("unknown policy {o}"),
            ))
        }
    };
    let max_messages = r.u64("topic.max_messages")?;
    let max_bytes = r.u64("topic.max_bytes")?;
    let kind = r.u8("topic.fsync")?;
    let interval_ms = r.u32("topic.fsync_interval_ms")?;
    let fsync = match (kind, interval_ms) {
        (0, 0) => FsyncPolicy::Default,
        (1, 0) => FsyncPolicy::Always,
        (2, ms) if ms > 0 => FsyncPolicy::IntervalMs(ms),
        (3, 0) => FsyncPolicy::Never,
        (2, _) => {
            return Err(ProtocolError::invalid(
                "topic.fsync_interval_ms",
                "must be at least 1 for the interval policy",
            ))
        }
        (0..=3, ms) => {
            return Err(ProtocolError::invalid(
                "topic.fsync_interval_ms",
                format!("{ms} given for a policy without an interval: must be 0"),
            ))
        }
        (k, _) => {
            return Err(ProtocolError::invalid(
                "topic.fsync",
                format!("unknown fsync policy {k}"),
            ))
        }
    };
    Ok(TopicConfig {
        partitions,
        storage,
        overflow,
        max_messages,
        max_bytes,
        fsync,
        retention_ms: r.u64("topic.retention_ms")?,
        retention_policy: match r.u8("topic.retention_policy")? {
            0 => RetentionPolicy::Default,
            1 => RetentionPolicy::Stream,
            2 => RetentionPolicy::WorkQueue,
            p => {
                return Err(ProtocolError::invalid(
                    "topic.retention_policy",
                    format!("unknown retention policy {p}"),
                ))
            }
        },
        dedup_window_ms: r.u64("topic.dedup_window_ms")?,
    })
}

fn encode_topic_info(t: &TopicInfo, buf: &mut BytesMut) {
    put_str16(buf, &t.name);
    encode_topic_config(&t.config, buf);
    buf.put_u64_le(t.messages);
    buf.put_u64_le(t.bytes);
    buf.put_u32_le(t.subscriptions.len() as u32);
    for s in &t.subscriptions {
        put_str16(buf, s);
    }
}

fn decode_topic_info(r: &mut Reader) -> Result<TopicInfo, ProtocolError> {
    let name = r.str16("topic_info.name")?;
    let config = decode_topic_config(r)?;
    let messages = r.u64("topic_info.messages")?;
    let bytes = r.u64("topic_info.bytes")?;
    let count = r.u32("topic_info.subscription_count")?;
    let mut subscriptions = Vec::with_capacity(count.min(1024) as usize);
    for _ in 0..count {
        subscriptions.push(r.str16("topic_info.subscription")?);
    }
    Ok(TopicInfo {
        name,
        config,
        messages,
        bytes,
        subscriptions,
    })
}

fn encode_topic_stats(t: &TopicStats, buf: &mut BytesMut) {
    put_str16(buf, &t.name);
    for v in [
        t.messages_in,
        t.bytes_in,
        t.messages_out,
        t.bytes_out,
        t.depth,
        t.depth_bytes,
        t.dropped,
    ] {
        buf.put_u64_le(v);
    }
    buf.put_u32_le(t.publishers);
    buf.put_u32_le(t.subscribers);
    buf.put_u32_le(t.subscriptions.len() as u32);
    for s in &t.subscriptions {
        put_str16(buf, &s.name);
        buf.put_u8(s.ephemeral as u8);
        buf.put_u32_le(s.consumers);
        for v in [
            s.messages_out,
            s.bytes_out,
            s.acked,
            s.redelivered,
            s.backlog,
            s.in_flight,
            s.gave_up,
        ] {
            buf.put_u64_le(v);
        }
        encode_latency(&s.deliver_latency, buf);
        encode_latency(&s.ack_latency, buf);
    }
}

fn encode_latency(h: &Latency, buf: &mut BytesMut) {
    buf.put_u64_le(h.sum_us);
    buf.put_u16_le(h.buckets.len() as u16);
    for &(bucket, count) in &h.buckets {
        buf.put_u16_le(bucket);
        buf.put_u64_le(count);
    }
}

/// A histogram in its one canonical form: buckets ascending, each known and non-empty.
fn decode_latency(r: &mut Reader, field: &'static str) -> Result<Latency, ProtocolError> {
    let sum_us = r.u64(field)?;
    let n = r.u16(field)? as usize;
    if n > LATENCY_BUCKETS {
        return Err(ProtocolError::invalid(
            field,
            format!("{n} buckets, above the {LATENCY_BUCKETS} there are"),
        ));
    }
    let mut buckets = Vec::with_capacity(n);
    for _ in 0..n {
        let bucket = r.u16(field)?;
        let count = r.u64(field)?;
        if bucket as usize >= LATENCY_BUCKETS {
            return Err(ProtocolError::invalid(
                field,
                format!(
                    "bucket {bucket} is beyond the last, {}",
                    LATENCY_BUCKETS - 1
                ),
            ));
        }
        if buckets.last().is_some_and(|&(b, _)| b >= bucket) {
            return Err(ProtocolError::invalid(
                field,
                format!("bucket {bucket} is out of ascending order"),
            ));
        }
        if count == 0 {
            return Err(ProtocolError::invalid(
                field,
                format!("bucket {bucket} has a count of 0 (empty buckets are left out)"),
            ));
        }
        buckets.push((bucket, count));
    }
    Ok(Latency { sum_us, buckets })
}

fn decode_topic_stats(r: &mut Reader) -> Result<TopicStats, ProtocolError> {
    let mut t = TopicStats {
        name: r.str16("stats.topic.name")?,
        ..Default::default()
    };
    t.messages_in = r.u64("stats.topic.messages_in")?;
    t.bytes_in = r.u64("stats.topic.bytes_in")?;
    t.messages_out = r.u64("stats.topic.messages_out")?;
    t.bytes_out = r.u64("stats.topic.bytes_out")?;
    t.depth = r.u64("stats.topic.depth")?;
    t.depth_bytes = r.u64("stats.topic.depth_bytes")?;
    t.dropped = r.u64("stats.topic.dropped")?;
    t.publishers = r.u32("stats.topic.publishers")?;
    t.subscribers = r.u32("stats.topic.subscribers")?;
    let count = r.u32("stats.topic.subscription_count")?;
    for _ in 0..count {
        let mut s = SubscriptionStats {
            name: r.str16("stats.subscription.name")?,
            ..Default::default()
        };
        s.ephemeral = match r.u8("stats.subscription.ephemeral")? {
            0 => false,
            1 => true,
            b => {
                return Err(ProtocolError::invalid(
                    "stats.subscription.ephemeral",
                    format!("{b} is not a boolean (0 or 1)"),
                ))
            }
        };
        s.consumers = r.u32("stats.subscription.consumers")?;
        s.messages_out = r.u64("stats.subscription.messages_out")?;
        s.bytes_out = r.u64("stats.subscription.bytes_out")?;
        s.acked = r.u64("stats.subscription.acked")?;
        s.redelivered = r.u64("stats.subscription.redelivered")?;
        s.backlog = r.u64("stats.subscription.backlog")?;
        s.in_flight = r.u64("stats.subscription.in_flight")?;
        s.gave_up = r.u64("stats.subscription.gave_up")?;
        s.deliver_latency = decode_latency(r, "stats.subscription.deliver_latency")?;
        s.ack_latency = decode_latency(r, "stats.subscription.ack_latency")?;
        t.subscriptions.push(s);
    }
    Ok(t)
}

/// Writes a DELIVER frame straight into an output buffer, one delivery at a time, so the server
/// copies stored record bytes once and builds no intermediate values.
pub struct DeliverEncoder<'a> {
    buf: &'a mut BytesMut,
    start: usize,
    count: u32,
}

impl<'a> DeliverEncoder<'a> {
    pub fn begin(buf: &'a mut BytesMut, consumer_id: u32) -> Self {
        let start = buf.len();
        buf.put_u32_le(0);
        buf.put_u16_le(opcode::DELIVER);
        buf.put_u16_le(0);
        buf.put_u32_le(0);
        buf.put_u32_le(consumer_id);
        buf.put_u32_le(0);
        DeliverEncoder {
            buf,
            start,
            count: 0,
        }
    }

    /// Appends one delivery. `record` must be a record validated on publish. A frame holds at most
    /// [`crate::limits::BATCH_COUNT_MAX`] deliveries (the decoder refuses more); callers start a
    /// new frame when [`DeliverEncoder::count`] reaches it.
    pub fn push(
        &mut self,
        partition: u32,
        offset: u64,
        timestamp_ms: u64,
        attempt: u16,
        record: &[u8],
    ) {
        assert!(
            self.count < crate::limits::BATCH_COUNT_MAX,
            "a DELIVER frame holds at most BATCH_COUNT_MAX deliveries"
        );
        self.buf
            .reserve(crate::message::DELIVERY_PREFIX_BYTES + record.len());
        crate::message::put_delivery_prefix(self.buf, partition, offset, timestamp_ms, attempt);
        self.buf.put_slice(record);
        self.count += 1;
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// Bytes written so far for this frame.
    pub fn len(&self) -> usize {
        self.buf.len() - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Patches the length and count. A frame with no deliveries is removed again.
    pub fn finish(self) -> u32 {
        if self.count == 0 {
            self.buf.truncate(self.start);
            return 0;
        }
        let payload_len = (self.buf.len() - self.start - FRAME_HEADER_BYTES) as u32;
        self.buf[self.start..self.start + 4].copy_from_slice(&payload_len.to_le_bytes());
        let count_at = self.start + FRAME_HEADER_BYTES + 4;
        self.buf[count_at..count_at + 4].copy_from_slice(&self.count.to_le_bytes());
        self.count
    }
}

/// Writes a PUBLISH frame message by message, so a client batches without building a `Vec`.
pub struct PublishEncoder {
    buf: BytesMut,
    count: u32,
    count_at: usize,
}

impl PublishEncoder {
    pub fn new(topic: &str, partition: Option<u32>, request_id: u32) -> Self {
        let mut buf = BytesMut::with_capacity(4096);
        buf.put_u32_le(0);
        buf.put_u16_le(opcode::PUBLISH);
        buf.put_u16_le(0);
        buf.put_u32_le(request_id);
        put_str16(&mut buf, topic);
        buf.put_u32_le(partition.unwrap_or(NO_PARTITION));
        let count_at = buf.len();
        buf.put_u32_le(0);
        PublishEncoder {
            buf,
            count: 0,
            count_at,
        }
    }

    /// Appends one message; fails on a message that breaks a codec limit, or when the frame
    /// already holds [`crate::limits::BATCH_COUNT_MAX`] messages (the decoder would refuse more).
    pub fn push(&mut self, message: &Message) -> Result<(), ProtocolError> {
        if self.count >= crate::limits::BATCH_COUNT_MAX {
            return Err(ProtocolError::invalid(
                "batch",
                format!("full at {} messages", crate::limits::BATCH_COUNT_MAX),
            ));
        }
        message.validate()?;
        message.encode_record(&mut self.buf);
        self.count += 1;
        Ok(())
    }

    /// Appends a record from its parts without building a [`Message`]: the fast path for bodies
    /// without headers or delay. The caller keeps within the limits `push` checks: priority,
    /// key length and [`crate::limits::BATCH_COUNT_MAX`] messages per frame.
    pub fn push_body(&mut self, key: Option<&[u8]>, priority: u8, body: &[u8]) {
        assert!(priority <= crate::limits::PRIORITY_MAX);
        assert!(
            self.count < crate::limits::BATCH_COUNT_MAX,
            "a PUBLISH frame holds at most BATCH_COUNT_MAX messages"
        );
        let key_len = key.map_or(0, |k| k.len());
        assert!(key_len <= crate::limits::KEY_BYTES_MAX && body.len() <= u32::MAX as usize);
        self.buf
            .reserve(crate::message::RECORD_PREFIX_BYTES + key_len + body.len());
        self.buf.put_u8(priority);
        self.buf.put_u8(if key.is_some() { 1 } else { 0 });
        self.buf.put_u16_le(key_len as u16);
        self.buf.put_u16_le(0);
        self.buf.put_u32_le(body.len() as u32);
        if let Some(key) = key {
            self.buf.put_slice(key);
        }
        self.buf.put_slice(body);
        self.count += 1;
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The finished frame, header included.
    pub fn finish(mut self) -> Bytes {
        let payload_len = (self.buf.len() - FRAME_HEADER_BYTES) as u32;
        self.buf[0..4].copy_from_slice(&payload_len.to_le_bytes());
        let at = self.count_at;
        self.buf[at..at + 4].copy_from_slice(&self.count.to_le_bytes());
        self.buf.freeze()
    }
}

use crate::message::Message;

/// Splits frames off a growing read buffer. Sans-IO: the caller reads bytes into `buf` however it
/// likes and calls [`FrameDecoder::decode`] until it returns `Ok(None)`.
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    frame_bytes_max: usize,
}

impl FrameDecoder {
    pub fn new(frame_bytes_max: usize) -> Self {
        assert!(frame_bytes_max >= FRAME_HEADER_BYTES);
        FrameDecoder { frame_bytes_max }
    }

    /// Checks the header as soon as it is complete, so an oversize frame is refused before its
    /// body is buffered, then decodes the whole frame once it has arrived.
    pub fn decode(
        &self,
        buf: &mut BytesMut,
    ) -> Result<Option<(FrameHeader, Frame)>, ProtocolError> {
        let Some(header) = FrameHeader::peek(buf)? else {
            return Ok(None);
        };
        if header.frame_len() > self.frame_bytes_max {
            return Err(ProtocolError::FrameTooLarge {
                len: header.frame_len(),
                max: self.frame_bytes_max,
            });
        }
        if buf.len() < header.frame_len() {
            buf.reserve(header.frame_len() - buf.len());
            return Ok(None);
        }
        let mut frame = buf.split_to(header.frame_len());
        let payload = frame.split_off(FRAME_HEADER_BYTES).freeze();
        Frame::decode(&header, payload).map(|f| Some((header, f)))
    }
}
