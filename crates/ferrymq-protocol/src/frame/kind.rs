//! The frames of the protocol, one variant per opcode; a frame is the same value in every
//! version, and only its encoding differs (see `codec`).

use bytes::Bytes;

use super::cluster_info::ClusterInfo;
use super::durability::Durability;
use super::error_code::ErrorCode;
use super::header::{opcode, opcode_name};
use super::operate::ConnectionEntry;
use super::subscribe_request::SubscribeRequest;
use super::topic_config::{TopicConfig, TopicInfo};
use super::topic_stats::TopicStats;
use super::user_entry::{TokenEntry, UserEntry};
use crate::limits::ERROR_MESSAGE_BYTES_MAX;
use crate::message::{DeliveryBatch, OffsetRange, RecordBatch};
use crate::status::{ListKind, MessageEntry, MessageStatus, RequeueSelection};

/// Every frame of every protocol version (see `opcode_since` for when each arrived).
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
    /// MESSAGE_LIST (empty = the first page); `limit` is 1..=[`crate::limits::LIST_LIMIT_MAX`].
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
    /// Adds `actions` (bits: 1 publish, 2 consume, 4 inspect, 8 manage; from version 3 on also
    /// 16 purge, 32 pause) on `pattern` and `roles`; `pattern` is empty when only roles are
    /// granted.
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
    /// One page of the broker's client connections, in id order, those with ids above `after`
    /// (0: the first page); `limit` is 1..=[`crate::limits::LIST_LIMIT_MAX`]. Version 3; the
    /// monitor or admin role.
    ListConnections {
        after: u64,
        limit: u32,
    },
    /// Closes a client connection, telling it why; answered OK. Version 3; the admin role.
    CloseConnection {
        id: u64,
    },
    /// Drops every message the topic retains; its subscriptions continue with what is published
    /// next. Answered PURGED. Version 3; the manage action on the topic.
    PurgeTopic {
        name: String,
    },
    /// Pauses (or resumes) deliveries of a subscription to every consumer; publishing goes on
    /// and the backlog grows. Kept across restarts. Answered OK. Version 3; the manage action.
    PauseSubscription {
        topic: String,
        subscription: String,
        paused: bool,
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

    /// Asks a node for the cluster's nodes and partition leaders (version 3).
    ClusterInfo,
    ClusterInfoReply(ClusterInfo),
    /// `next_after` is 0 on the last page; `total` counts every open connection.
    ConnectionList {
        total: u64,
        next_after: u64,
        connections: Vec<ConnectionEntry>,
    },
    Purged {
        /// Messages dropped.
        messages: u64,
    },
}

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
            Frame::ListConnections { .. } => LIST_CONNECTIONS,
            Frame::CloseConnection { .. } => CLOSE_CONNECTION,
            Frame::PurgeTopic { .. } => PURGE_TOPIC,
            Frame::PauseSubscription { .. } => PAUSE_SUBSCRIPTION,
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
            Frame::ClusterInfo => CLUSTER_INFO,
            Frame::ClusterInfoReply(_) => CLUSTER_INFO_REPLY,
            Frame::ConnectionList { .. } => CONNECTION_LIST,
            Frame::Purged { .. } => PURGED,
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
}
