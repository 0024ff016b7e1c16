//! Checks the Rust codec against `protocol/vectors.json`, the golden frames written by the
//! independent Python implementation in `protocol/gen_vectors.py`, and against
//! `protocol/vectors-v1.json` and `vectors-v2.json`, the frames of versions 1 and 2 as released,
//! each read and written in its own version.
//!
//! For every valid vector the frame built from `fields` must encode to exactly `hex`, and `hex`
//! must decode to that frame, consuming every byte. Every invalid vector must be refused with the
//! named error. The file must cover every opcode the decoder knows.

use std::collections::BTreeSet;

use bytes::{Bytes, BytesMut};
use ferrymq_protocol::{
    opcode, opcode_since, Delivery, DeliveryBatch, Durability, Frame, FrameDecoder, FrameHeader,
    FsyncPolicy, Latency, ListKind, Message, MessageEntry, MessageState, MessageStatus,
    OffsetRange, OverflowPolicy, ProtocolError, RecordBatch, RequeueSelection, RetentionPolicy,
    StartPosition, Storage, SubscribeRequest, SubscriptionMessageStatus, SubscriptionStats,
    TopicConfig, TopicInfo, TopicStats,
};
use serde_json::Value;

fn load() -> Value {
    load_file("vectors.json")
}

/// Each vector file with the protocol version its frames are in: every version still spoken.
fn every_version() -> Vec<(Value, u16)> {
    vec![
        (load(), ferrymq_protocol::limits::PROTOCOL_VERSION),
        (load_file("vectors-v2.json"), 2),
        (load_file("vectors-v1.json"), 1),
    ]
}

fn load_file(name: &str) -> Value {
    let path = format!("{}/../../protocol/{name}", env!("CARGO_MANIFEST_DIR"));
    let path = path.as_str();
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {path}: {e}"))
}

/// Every opcode the crate exports, by name. A new opcode must be added here and to the vectors;
/// `vectors_cover_every_opcode` also finds opcodes missing from this list by asking the decoder.
const OPCODES: &[(&str, u16)] = &[
    ("HELLO", opcode::HELLO),
    ("PING", opcode::PING),
    ("PONG", opcode::PONG),
    ("CREATE_TOPIC", opcode::CREATE_TOPIC),
    ("DELETE_TOPIC", opcode::DELETE_TOPIC),
    ("LIST_TOPICS", opcode::LIST_TOPICS),
    ("DESCRIBE_TOPIC", opcode::DESCRIBE_TOPIC),
    ("PUBLISH", opcode::PUBLISH),
    ("SUBSCRIBE", opcode::SUBSCRIBE),
    ("UNSUBSCRIBE", opcode::UNSUBSCRIBE),
    ("CREDIT", opcode::CREDIT),
    ("ACK", opcode::ACK),
    ("NACK", opcode::NACK),
    ("DELETE_SUBSCRIPTION", opcode::DELETE_SUBSCRIPTION),
    ("ACK_RESULT", opcode::ACK_RESULT),
    ("STATS", opcode::STATS),
    ("MESSAGE_STATUS", opcode::MESSAGE_STATUS),
    ("LIST_MESSAGES", opcode::LIST_MESSAGES),
    ("REQUEUE_DEAD", opcode::REQUEUE_DEAD),
    ("USER_ADD", opcode::USER_ADD),
    ("USER_REMOVE", opcode::USER_REMOVE),
    ("USER_PASSWD", opcode::USER_PASSWD),
    ("USER_LIST", opcode::USER_LIST),
    ("GRANT", opcode::GRANT),
    ("REVOKE", opcode::REVOKE),
    ("TOKEN_CREATE", opcode::TOKEN_CREATE),
    ("TOKEN_LIST", opcode::TOKEN_LIST),
    ("TOKEN_REVOKE", opcode::TOKEN_REVOKE),
    ("PURGE_TOPIC", opcode::PURGE_TOPIC),
    ("PAUSE_SUBSCRIPTION", opcode::PAUSE_SUBSCRIPTION),
    ("LIST_CONNECTIONS", opcode::LIST_CONNECTIONS),
    ("CLOSE_CONNECTION", opcode::CLOSE_CONNECTION),
    ("HELLO_OK", opcode::HELLO_OK),
    ("OK", opcode::OK),
    ("ERROR", opcode::ERROR),
    ("PUBLISHED", opcode::PUBLISHED),
    ("TOPIC_LIST", opcode::TOPIC_LIST),
    ("TOPIC_INFO", opcode::TOPIC_INFO),
    ("SUBSCRIBED", opcode::SUBSCRIBED),
    ("DELIVER", opcode::DELIVER),
    ("STATS_REPLY", opcode::STATS_REPLY),
    ("MESSAGE_STATUS_REPLY", opcode::MESSAGE_STATUS_REPLY),
    ("MESSAGE_LIST", opcode::MESSAGE_LIST),
    ("REQUEUED", opcode::REQUEUED),
    ("USER_LIST_REPLY", opcode::USER_LIST_REPLY),
    ("TOKEN_CREATED", opcode::TOKEN_CREATED),
    ("TOKEN_LIST_REPLY", opcode::TOKEN_LIST_REPLY),
    ("CLUSTER_INFO", opcode::CLUSTER_INFO),
    ("CLUSTER_INFO_REPLY", opcode::CLUSTER_INFO_REPLY),
    ("CONNECTION_LIST", opcode::CONNECTION_LIST),
    ("PURGED", opcode::PURGED),
];

// --- reading `fields` ----------------------------------------------------------------------------

fn get<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.get(key)
        .unwrap_or_else(|| panic!("missing field {key:?} in {v}"))
}

fn u64_of(v: &Value) -> u64 {
    match v {
        Value::Number(n) => n.as_u64().unwrap_or_else(|| panic!("{n} is not a u64")),
        Value::String(s) => s
            .parse()
            .unwrap_or_else(|e| panic!("{s:?} is not a u64: {e}")),
        other => panic!("{other} is not a u64"),
    }
}

fn u64f(v: &Value, key: &str) -> u64 {
    u64_of(get(v, key))
}

fn u32f(v: &Value, key: &str) -> u32 {
    u32::try_from(u64f(v, key)).unwrap_or_else(|_| panic!("{key} does not fit a u32"))
}

fn u16f(v: &Value, key: &str) -> u16 {
    u16::try_from(u64f(v, key)).unwrap_or_else(|_| panic!("{key} does not fit a u16"))
}

fn u8f(v: &Value, key: &str) -> u8 {
    u8::try_from(u64f(v, key)).unwrap_or_else(|_| panic!("{key} does not fit a u8"))
}

fn strf(v: &Value, key: &str) -> String {
    get(v, key)
        .as_str()
        .unwrap_or_else(|| panic!("{key} is not a string"))
        .to_owned()
}

fn boolf(v: &Value, key: &str) -> bool {
    get(v, key)
        .as_bool()
        .unwrap_or_else(|| panic!("{key} is not a boolean"))
}

fn arrf<'a>(v: &'a Value, key: &str) -> &'a Vec<Value> {
    get(v, key)
        .as_array()
        .unwrap_or_else(|| panic!("{key} is not an array"))
}

fn bytes_of(v: &Value) -> Bytes {
    if let Some(s) = v.get("utf8") {
        Bytes::from(s.as_str().expect("utf8 is a string").to_owned())
    } else if let Some(h) = v.get("hex") {
        Bytes::from(hex::decode(h.as_str().expect("hex is a string")).expect("valid hex"))
    } else {
        panic!("{v} is neither {{\"utf8\"}} nor {{\"hex\"}}")
    }
}

fn message_of(v: &Value) -> Message {
    let key = match get(v, "key") {
        Value::Null => None,
        k => Some(bytes_of(k)),
    };
    let headers = arrf(v, "headers")
        .iter()
        .map(|pair| {
            let pair = pair.as_array().expect("a header is a [name, value] pair");
            assert_eq!(pair.len(), 2, "a header is a [name, value] pair");
            (
                pair[0].as_str().unwrap().to_owned(),
                pair[1].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let deliver_after_ms = match get(v, "deliver_after_ms") {
        Value::Null => None,
        d => Some(u64_of(d)),
    };
    Message {
        key,
        headers,
        priority: u8f(v, "priority"),
        deliver_after_ms,
        body: bytes_of(get(v, "body")),
    }
}

fn ranges_of(v: &Value) -> Vec<OffsetRange> {
    arrf(v, "ranges")
        .iter()
        .map(|r| OffsetRange {
            partition: u32f(r, "partition"),
            offset: u64f(r, "offset"),
            count: u32f(r, "count"),
        })
        .collect()
}

fn topic_config_of(v: &Value) -> TopicConfig {
    TopicConfig {
        partitions: u32f(v, "partitions"),
        storage: match strf(v, "storage").as_str() {
            "memory" => Storage::Memory,
            "disk" => Storage::Disk,
            "default" => Storage::Default,
            s => panic!("unknown storage {s}"),
        },
        overflow: match strf(v, "overflow").as_str() {
            "drop_oldest" => OverflowPolicy::DropOldest,
            "reject" => OverflowPolicy::Reject,
            "default" => OverflowPolicy::Default,
            s => panic!("unknown overflow {s}"),
        },
        max_messages: u64f(v, "max_messages"),
        max_bytes: u64f(v, "max_bytes"),
        fsync: match strf(v, "fsync").as_str() {
            "default" => FsyncPolicy::Default,
            "always" => FsyncPolicy::Always,
            "interval" => FsyncPolicy::IntervalMs(u32f(v, "fsync_interval_ms")),
            "never" => FsyncPolicy::Never,
            s => panic!("unknown fsync policy {s}"),
        },
        retention_ms: u64f(v, "retention_ms"),
        // Version 1's config has neither field: the server's default.
        retention_policy: match v
            .get("retention_policy")
            .map_or("default", |p| p.as_str().unwrap())
        {
            "default" => RetentionPolicy::Default,
            "stream" => RetentionPolicy::Stream,
            "work_queue" => RetentionPolicy::WorkQueue,
            s => panic!("unknown retention policy {s}"),
        },
        dedup_window_ms: v.get("dedup_window_ms").map_or(0, u64_of),
        replicas: v.get("replicas").map_or(0, |r| r.as_u64().unwrap() as u8),
    }
}

fn topic_info_of(v: &Value) -> TopicInfo {
    TopicInfo {
        name: strf(v, "name"),
        config: topic_config_of(get(v, "config")),
        messages: u64f(v, "messages"),
        bytes: u64f(v, "bytes"),
        subscriptions: arrf(v, "subscriptions")
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect(),
    }
}

fn topic_stats_of(v: &Value) -> TopicStats {
    TopicStats {
        name: strf(v, "name"),
        messages_in: u64f(v, "messages_in"),
        bytes_in: u64f(v, "bytes_in"),
        messages_out: u64f(v, "messages_out"),
        bytes_out: u64f(v, "bytes_out"),
        depth: u64f(v, "depth"),
        depth_bytes: u64f(v, "depth_bytes"),
        dropped: u64f(v, "dropped"),
        publishers: u32f(v, "publishers"),
        subscribers: u32f(v, "subscribers"),
        subscriptions: arrf(v, "subscriptions")
            .iter()
            .map(|s| SubscriptionStats {
                name: strf(s, "name"),
                ephemeral: boolf(s, "ephemeral"),
                consumers: u32f(s, "consumers"),
                messages_out: u64f(s, "messages_out"),
                bytes_out: u64f(s, "bytes_out"),
                acked: u64f(s, "acked"),
                redelivered: u64f(s, "redelivered"),
                backlog: u64f(s, "backlog"),
                in_flight: u64f(s, "in_flight"),
                gave_up: u64f(s, "gave_up"),
                deliver_latency: latency_of(get(s, "deliver_latency")),
                ack_latency: latency_of(get(s, "ack_latency")),
                // From version 3 on; the older files' entries have none.
                paused: s
                    .get("paused")
                    .is_some_and(|p| p.as_bool().expect("a boolean")),
            })
            .collect(),
    }
}

fn latency_of(v: &Value) -> Latency {
    Latency {
        sum_us: u64f(v, "sum_us"),
        buckets: arrf(v, "buckets")
            .iter()
            .map(|pair| {
                let pair = pair.as_array().expect("a [bucket, count] pair");
                let bucket = u16::try_from(u64_of(&pair[0])).expect("a bucket fits a u16");
                (bucket, u64_of(&pair[1]))
            })
            .collect(),
    }
}

fn message_entry_of(v: &Value) -> MessageEntry {
    MessageEntry {
        partition: u32f(v, "partition"),
        offset: u64f(v, "offset"),
        state: strf(v, "state").parse::<MessageState>().unwrap(),
        attempts: u16f(v, "attempts"),
        published_ms: u64f(v, "published_ms"),
        first_delivered_ms: u64f(v, "first_delivered_ms"),
        settled_ms: u64f(v, "settled_ms"),
        due_ms: u64f(v, "due_ms"),
        result: bytes_of(get(v, "result")),
        reason: strf(v, "reason"),
        dead_letter: match get(v, "dead_letter") {
            Value::Null => None,
            d => Some((u32f(d, "partition"), u64f(d, "offset"))),
        },
    }
}

fn message_status_of(v: &Value) -> MessageStatus {
    MessageStatus {
        partition: u32f(v, "partition"),
        offset: u64f(v, "offset"),
        published_ms: u64f(v, "published_ms"),
        priority: u8f(v, "priority"),
        key: match get(v, "key") {
            Value::Null => None,
            k => Some(bytes_of(k)),
        },
        body_bytes: u32f(v, "body_bytes"),
        subscriptions: arrf(v, "subscriptions")
            .iter()
            .map(|s| SubscriptionMessageStatus {
                subscription: strf(s, "subscription"),
                entry: message_entry_of(get(s, "entry")),
            })
            .collect(),
    }
}

fn assert_no_fields(f: &Value) {
    assert_eq!(
        f.as_object().map(|o| o.len()),
        Some(0),
        "expected empty fields, got {f}"
    );
}

/// Builds the frame a vector describes, using only the crate's public constructors.
fn frame_of(name: &str, f: &Value) -> Frame {
    match name {
        "HELLO" => Frame::Hello {
            version_min: u16f(f, "version_min"),
            version_max: u16f(f, "version_max"),
            heartbeat_ms: u32f(f, "heartbeat_ms"),
            client_name: strf(f, "client_name"),
            user: strf(f, "user"),
            password: strf(f, "password"),
        },
        "PING" => {
            assert_no_fields(f);
            Frame::Ping
        }
        "PONG" => {
            assert_no_fields(f);
            Frame::Pong
        }
        "CREATE_TOPIC" => Frame::CreateTopic {
            name: strf(f, "name"),
            config: topic_config_of(get(f, "config")),
            if_not_exists: boolf(f, "if_not_exists"),
        },
        "DELETE_TOPIC" => Frame::DeleteTopic {
            name: strf(f, "name"),
        },
        "LIST_TOPICS" => {
            assert_no_fields(f);
            Frame::ListTopics
        }
        "DESCRIBE_TOPIC" => Frame::DescribeTopic {
            name: strf(f, "name"),
        },
        "PUBLISH" => {
            let messages: Vec<Message> = arrf(f, "messages").iter().map(message_of).collect();
            Frame::Publish {
                topic: strf(f, "topic"),
                partition: match get(f, "partition") {
                    Value::Null => None,
                    _ => Some(u32f(f, "partition")),
                },
                records: RecordBatch::from_messages(&messages).expect("vector messages are valid"),
            }
        }
        "SUBSCRIBE" => {
            let start = get(f, "start");
            Frame::Subscribe(SubscribeRequest {
                topic: strf(f, "topic"),
                subscription: strf(f, "subscription"),
                start: match strf(start, "kind").as_str() {
                    "latest" => StartPosition::Latest,
                    "earliest" => StartPosition::Earliest,
                    "offset" => StartPosition::Offset(u64f(start, "value")),
                    "time_ms" => StartPosition::TimeMs(u64f(start, "value")),
                    k => panic!("unknown start kind {k}"),
                },
                ack_timeout_ms: u32f(f, "ack_timeout_ms"),
                max_attempts: u32f(f, "max_attempts"),
                credit: u32f(f, "credit"),
                auto_ack: boolf(f, "auto_ack"),
                ordered: boolf(f, "ordered"),
                partitions: get(f, "partitions")
                    .as_array()
                    .expect("partitions is a list")
                    .iter()
                    .map(|r| (u32f(r, "first"), u32f(r, "last")))
                    .collect(),
                dead_letter_topic: strf(f, "dead_letter_topic"),
            })
        }
        "UNSUBSCRIBE" => Frame::Unsubscribe {
            consumer_id: u32f(f, "consumer_id"),
        },
        "CREDIT" => Frame::Credit {
            consumer_id: u32f(f, "consumer_id"),
            credit: u32f(f, "credit"),
        },
        "ACK" => Frame::Ack {
            consumer_id: u32f(f, "consumer_id"),
            ranges: ranges_of(f),
        },
        "NACK" => Frame::Nack {
            consumer_id: u32f(f, "consumer_id"),
            delay_ms: u32f(f, "delay_ms"),
            dead_letter: boolf(f, "dead_letter"),
            // Version 1's NACK has no release flag.
            release: f.get("release").is_some_and(|r| r.as_bool().unwrap()),
            reason: strf(f, "reason"),
            ranges: ranges_of(f),
        },
        "DELETE_SUBSCRIPTION" => Frame::DeleteSubscription {
            topic: strf(f, "topic"),
            subscription: strf(f, "subscription"),
        },
        "STATS" => Frame::Stats {
            topic: strf(f, "topic"),
        },
        "ACK_RESULT" => Frame::AckResult {
            consumer_id: u32f(f, "consumer_id"),
            result: bytes_of(get(f, "result")),
            ranges: ranges_of(f),
        },
        "MESSAGE_STATUS" => Frame::MessageStatus {
            topic: strf(f, "topic"),
            partition: u32f(f, "partition"),
            offset: u64f(f, "offset"),
        },
        "LIST_MESSAGES" => Frame::ListMessages {
            topic: strf(f, "topic"),
            subscription: strf(f, "subscription"),
            kind: strf(f, "kind").parse::<ListKind>().unwrap(),
            page: bytes_of(get(f, "page")),
            limit: u32f(f, "limit"),
        },
        "REQUEUE_DEAD" => {
            let selection = get(f, "selection");
            Frame::RequeueDead {
                dead_letter_topic: strf(f, "dead_letter_topic"),
                selection: match strf(selection, "kind").as_str() {
                    "all" => RequeueSelection::All,
                    "range" => RequeueSelection::Range {
                        partition: u32f(selection, "partition"),
                        first: u64f(selection, "first_offset"),
                        last: u64f(selection, "last_offset"),
                    },
                    k => panic!("unknown requeue selection {k}"),
                },
            }
        }
        "HELLO_OK" => Frame::HelloOk {
            version: u16f(f, "version"),
            heartbeat_ms: u32f(f, "heartbeat_ms"),
            frame_bytes_max: u32f(f, "frame_bytes_max"),
            message_bytes_max: u32f(f, "message_bytes_max"),
            server: strf(f, "server"),
        },
        "OK" => {
            assert_no_fields(f);
            Frame::Ok
        }
        "ERROR" => Frame::Error {
            code: u16f(f, "code"),
            message: strf(f, "message"),
        },
        "PUBLISHED" => Frame::Published {
            durability: match strf(f, "durability").as_str() {
                "memory" => Durability::Memory,
                "written" => Durability::Written,
                "synced_interval" => Durability::SyncedInterval,
                "synced" => Durability::Synced,
                d => panic!("unknown durability {d}"),
            },
            ranges: ranges_of(f),
        },
        "TOPIC_LIST" => Frame::TopicList {
            topics: arrf(f, "topics").iter().map(topic_info_of).collect(),
        },
        "TOPIC_INFO" => Frame::TopicInfo(topic_info_of(f)),
        "SUBSCRIBED" => Frame::Subscribed {
            consumer_id: u32f(f, "consumer_id"),
            subscription: strf(f, "subscription"),
            partitions: u32f(f, "partitions"),
        },
        "DELIVER" => {
            let deliveries: Vec<Delivery> = arrf(f, "deliveries")
                .iter()
                .map(|d| Delivery {
                    partition: u32f(d, "partition"),
                    offset: u64f(d, "offset"),
                    timestamp_ms: u64f(d, "timestamp_ms"),
                    attempt: u16f(d, "attempt"),
                    message: message_of(get(d, "message")),
                })
                .collect();
            Frame::Deliver {
                consumer_id: u32f(f, "consumer_id"),
                deliveries: DeliveryBatch::from_deliveries(&deliveries)
                    .expect("vector deliveries are valid"),
            }
        }
        "STATS_REPLY" => Frame::StatsReply {
            topics: arrf(f, "topics").iter().map(topic_stats_of).collect(),
        },
        "MESSAGE_STATUS_REPLY" => Frame::MessageStatusReply(message_status_of(f)),
        "MESSAGE_LIST" => Frame::MessageList {
            entries: arrf(f, "entries").iter().map(message_entry_of).collect(),
            next_page: bytes_of(get(f, "next_page")),
        },
        "REQUEUED" => Frame::Requeued {
            requeued: u64f(f, "requeued"),
            skipped: u64f(f, "skipped"),
        },
        "USER_ADD" => Frame::UserAdd {
            user: strf(f, "user"),
            password: strf(f, "password"),
            roles: u8f(f, "roles"),
        },
        "USER_REMOVE" => Frame::UserRemove {
            user: strf(f, "user"),
        },
        "USER_PASSWD" => Frame::UserPasswd {
            user: strf(f, "user"),
            password: strf(f, "password"),
        },
        "USER_LIST" => {
            assert_no_fields(f);
            Frame::UserList
        }
        "GRANT" => Frame::Grant {
            user: strf(f, "user"),
            pattern: strf(f, "pattern"),
            actions: u8f(f, "actions"),
            roles: u8f(f, "roles"),
        },
        "REVOKE" => Frame::Revoke {
            user: strf(f, "user"),
            pattern: strf(f, "pattern"),
            actions: u8f(f, "actions"),
            roles: u8f(f, "roles"),
        },
        "TOKEN_CREATE" => Frame::TokenCreate {
            user: strf(f, "user"),
            name: strf(f, "name"),
            expires_ms: u64f(f, "expires_ms"),
        },
        "TOKEN_LIST" => Frame::TokenList {
            user: strf(f, "user"),
        },
        "TOKEN_REVOKE" => Frame::TokenRevoke {
            user: strf(f, "user"),
            name: strf(f, "name"),
        },
        "USER_LIST_REPLY" => Frame::UserListReply {
            users: arrf(f, "users")
                .iter()
                .map(|u| ferrymq_protocol::UserEntry {
                    name: strf(u, "name"),
                    roles: u8f(u, "roles"),
                    tokens: u32f(u, "tokens"),
                    grants: arrf(u, "grants")
                        .iter()
                        .map(|g| (strf(g, "pattern"), u8f(g, "actions")))
                        .collect(),
                })
                .collect(),
        },
        "TOKEN_CREATED" => Frame::TokenCreated {
            name: strf(f, "name"),
            token: strf(f, "token"),
            expires_ms: u64f(f, "expires_ms"),
        },
        "TOKEN_LIST_REPLY" => Frame::TokenListReply {
            tokens: arrf(f, "tokens")
                .iter()
                .map(|t| ferrymq_protocol::TokenEntry {
                    name: strf(t, "name"),
                    created_ms: u64f(t, "created_ms"),
                    expires_ms: u64f(t, "expires_ms"),
                })
                .collect(),
        },
        "CLUSTER_INFO" => Frame::ClusterInfo,
        "CLUSTER_INFO_REPLY" => Frame::ClusterInfoReply(ferrymq_protocol::ClusterInfo {
            node_id: u64f(f, "node_id"),
            metadata_leader: u64f(f, "metadata_leader"),
            nodes: arrf(f, "nodes")
                .iter()
                .map(|n| ferrymq_protocol::ClusterNodeEntry {
                    id: u64f(n, "id"),
                    addr: strf(n, "addr"),
                })
                .collect(),
            partitions: arrf(f, "partitions")
                .iter()
                .map(|p| ferrymq_protocol::PartitionLeader {
                    topic: strf(p, "topic"),
                    partition: u32f(p, "partition"),
                    leader: u64f(p, "leader"),
                    replicas: arrf(p, "replicas")
                        .iter()
                        .map(|r| r.as_u64().unwrap())
                        .collect(),
                })
                .collect(),
        }),
        other => operator_frame_of(other, f),
    }
}

/// The version 3 operator frames.
fn operator_frame_of(name: &str, f: &Value) -> Frame {
    match name {
        "LIST_CONNECTIONS" => Frame::ListConnections {
            after: u64f(f, "after"),
            limit: u32f(f, "limit"),
        },
        "CLOSE_CONNECTION" => Frame::CloseConnection { id: u64f(f, "id") },
        "PURGE_TOPIC" => Frame::PurgeTopic {
            name: strf(f, "name"),
        },
        "PURGED" => Frame::Purged {
            messages: u64f(f, "messages"),
        },
        "PAUSE_SUBSCRIPTION" => Frame::PauseSubscription {
            topic: strf(f, "topic"),
            subscription: strf(f, "subscription"),
            paused: boolf(f, "paused"),
        },
        "CONNECTION_LIST" => Frame::ConnectionList {
            total: u64f(f, "total"),
            next_after: u64f(f, "next_after"),
            connections: arrf(f, "connections")
                .iter()
                .map(|c| ferrymq_protocol::ConnectionEntry {
                    id: u64f(c, "id"),
                    listener: u8f(c, "listener"),
                    tls: boolf(c, "tls"),
                    peer: strf(c, "peer"),
                    user: strf(c, "user"),
                    client_name: strf(c, "client_name"),
                    connected_ms: u64f(c, "connected_ms"),
                    subscriptions: u32f(c, "subscriptions"),
                    consumers: u32f(c, "consumers"),
                    messages_in: u64f(c, "messages_in"),
                    bytes_in: u64f(c, "bytes_in"),
                    messages_out: u64f(c, "messages_out"),
                    bytes_out: u64f(c, "bytes_out"),
                    credit: u64f(c, "credit"),
                    unacked: u64f(c, "unacked"),
                })
                .collect(),
        },
        other => panic!("vector names unknown frame {other}"),
    }
}

fn decoder(file: &Value) -> FrameDecoder {
    FrameDecoder::new(u64f(file, "frame_bytes_max") as usize)
}

fn error_kind(e: &ProtocolError) -> (&'static str, Option<&'static str>) {
    match e {
        ProtocolError::Truncated { field } => ("Truncated", Some(field)),
        ProtocolError::FrameTooLarge { .. } => ("FrameTooLarge", None),
        ProtocolError::UnknownOpcode(_) => ("UnknownOpcode", None),
        ProtocolError::InvalidFlags(_) => ("InvalidFlags", None),
        ProtocolError::InvalidUtf8 { field } => ("InvalidUtf8", Some(field)),
        ProtocolError::InvalidValue { field, .. } => ("InvalidValue", Some(field)),
        ProtocolError::TrailingBytes { .. } => ("TrailingBytes", None),
    }
}

// --- tests ---------------------------------------------------------------------------------------

#[test]
fn files_are_the_current_version_and_every_released_one() {
    assert_eq!(u64f(&load_file("vectors-v1.json"), "version"), 1);
    assert_eq!(u64f(&load_file("vectors-v2.json"), "version"), 2);
    let file = load();
    assert_eq!(
        u64f(&file, "version"),
        ferrymq_protocol::limits::PROTOCOL_VERSION as u64
    );
    assert!(arrf(&file, "vectors").len() >= OPCODES.len());
    assert!(!arrf(&file, "invalid").is_empty());
    assert_eq!(
        u64f(&file, "frame_bytes_max"),
        ferrymq_protocol::limits::FRAME_BYTES_DEFAULT as u64
    );
}

#[test]
fn valid_vectors_encode_to_the_exact_bytes() {
    for (file, version) in every_version() {
        for v in arrf(&file, "vectors") {
            let name = strf(v, "name");
            let frame = frame_of(&strf(v, "frame"), get(v, "fields"));
            assert_eq!(
                frame.opcode() as u64,
                u64f(v, "opcode"),
                "v{version} {name}: opcode"
            );
            assert_eq!(
                frame.name(),
                strf(v, "frame"),
                "v{version} {name}: frame name"
            );
            let mut buf = BytesMut::new();
            frame.encode_as(version, u32f(v, "request_id"), &mut buf);
            assert_eq!(
                hex::encode(&buf),
                strf(v, "hex"),
                "v{version} {name}: encoding differs from the golden bytes"
            );
        }
    }
}

#[test]
fn valid_vectors_decode_to_the_frame_and_consume_every_byte() {
    for (file, version) in every_version() {
        let decoder = decoder(&file);
        for v in arrf(&file, "vectors") {
            let name = strf(v, "name");
            let expected = frame_of(&strf(v, "frame"), get(v, "fields"));
            let raw = hex::decode(strf(v, "hex")).unwrap();
            let mut buf = BytesMut::from(&raw[..]);
            let (header, frame) = decoder
                .decode_as(version, &mut buf)
                .unwrap_or_else(|e| panic!("v{version} {name}: {e}"))
                .unwrap_or_else(|| panic!("v{version} {name}: decoder wants more bytes"));
            assert!(
                buf.is_empty(),
                "v{version} {name}: {} bytes left over",
                buf.len()
            );
            assert_eq!(
                header.frame_len(),
                raw.len(),
                "v{version} {name}: frame length"
            );
            assert_eq!(
                header.opcode as u64,
                u64f(v, "opcode"),
                "v{version} {name}: opcode"
            );
            assert_eq!(
                header.request_id as u64,
                u64f(v, "request_id"),
                "v{version} {name}: request id"
            );
            assert_eq!(frame, expected, "v{version} {name}: decoded frame");

            // The payloads kept as bytes must also read back as the messages in the vector.
            match (&frame, &expected) {
                (Frame::Publish { records, .. }, _) => {
                    let messages: Vec<Message> = records.messages().collect();
                    let want: Vec<Message> = arrf(get(v, "fields"), "messages")
                        .iter()
                        .map(message_of)
                        .collect();
                    assert_eq!(messages, want, "v{version} {name}: messages");
                    assert_eq!(records.count() as usize, want.len());
                }
                (
                    Frame::Deliver { deliveries, .. },
                    Frame::Deliver {
                        deliveries: want, ..
                    },
                ) => {
                    let got: Vec<Delivery> = deliveries.iter().collect();
                    let want: Vec<Delivery> = want.iter().collect();
                    assert_eq!(got.len(), arrf(get(v, "fields"), "deliveries").len());
                    assert_eq!(got, want, "v{version} {name}: deliveries");
                }
                _ => {}
            }
        }
    }
}

#[test]
fn valid_vectors_decode_the_same_when_split_after_every_byte() {
    for (file, version) in every_version() {
        let decoder = decoder(&file);
        for v in arrf(&file, "vectors") {
            let name = strf(v, "name");
            let raw = hex::decode(strf(v, "hex")).unwrap();
            let mut buf = BytesMut::new();
            let mut decoded = None;
            for (i, byte) in raw.iter().enumerate() {
                buf.extend_from_slice(&[*byte]);
                match decoder
                    .decode_as(version, &mut buf)
                    .unwrap_or_else(|e| panic!("v{version} {name}: {e} after {} bytes", i + 1))
                {
                    Some(frame) => {
                        assert_eq!(
                            i + 1,
                            raw.len(),
                            "v{version} {name}: decoded before the last byte"
                        );
                        decoded = Some(frame.1);
                    }
                    None => assert!(
                        i + 1 < raw.len(),
                        "v{version} {name}: not decoded after the last byte"
                    ),
                }
            }
            assert_eq!(
                decoded,
                Some(frame_of(&strf(v, "frame"), get(v, "fields"))),
                "v{version} {name}"
            );
        }
    }
}

#[test]
fn invalid_vectors_are_refused_with_the_named_error() {
    for (file, version) in every_version() {
        let decoder = decoder(&file);
        for v in arrf(&file, "invalid") {
            let name = strf(v, "name");
            let raw = hex::decode(strf(v, "hex")).unwrap();
            let mut buf = BytesMut::from(&raw[..]);
            let error = match decoder.decode_as(version, &mut buf) {
                Err(e) => e,
                Ok(Some((_, frame))) => panic!("v{version} {name}: decoded to {frame:?}"),
                Ok(None) => panic!("v{version} {name}: decoder wants more bytes"),
            };
            let (kind, field) = error_kind(&error);
            assert_eq!(
                kind,
                strf(v, "error"),
                "v{version} {name}: wrong error {error:?}"
            );
            if let Some(want) = v.get("field") {
                assert_eq!(
                    field,
                    want.as_str(),
                    "v{version} {name}: wrong field in {error:?}"
                );
            }
            // Only an oversize frame stays in the buffer (the connection closes); any other refused
            // frame was taken off whole, as its header announced.
            if kind == "FrameTooLarge" {
                assert_eq!(buf.len(), raw.len(), "v{version} {name}");
            } else if kind != "InvalidFlags" {
                assert!(
                    buf.is_empty(),
                    "v{version} {name}: {} bytes left",
                    buf.len()
                );
            }
        }
    }
}

/// The file's `opcode_since` table is the codec's: each opcode newer than version 1 is listed
/// with the version it arrived in, and a connection on an older version refuses it.
#[test]
fn opcodes_arrive_in_the_version_the_file_says() {
    let file = load();
    let table = get(&file, "opcode_since").as_object().unwrap().clone();
    for (name, code) in OPCODES {
        let since = table.get(*name).map_or(1, |v| v.as_u64().unwrap() as u16);
        assert_eq!(opcode_since(*code), since, "version of {name}");
        for version in ferrymq_protocol::limits::PROTOCOL_VERSION_MIN..since {
            let header = FrameHeader {
                payload_len: 0,
                opcode: *code,
                request_id: 0,
            };
            assert_eq!(
                Frame::decode_as(version, &header, Bytes::new()),
                Err(ProtocolError::UnknownOpcode(*code)),
                "{name} on a version {version} connection"
            );
        }
    }
    for name in table.keys() {
        assert!(
            OPCODES.iter().any(|(n, _)| n == name),
            "{name} is no opcode"
        );
    }
}

#[test]
fn vector_names_are_unique() {
    for (file, _version) in every_version() {
        let mut names = BTreeSet::new();
        for v in arrf(&file, "vectors").iter().chain(arrf(&file, "invalid")) {
            let name = strf(v, "name");
            assert!(names.insert(name.clone()), "duplicate vector name {name}");
        }
    }
}

#[test]
fn vectors_cover_every_opcode() {
    let file = load();
    let covered: BTreeSet<u16> = arrf(&file, "vectors")
        .iter()
        .map(|v| u16f(v, "opcode"))
        .collect();

    // Every exported opcode constant has a vector, and the file's table agrees with the crate.
    let table = get(&file, "opcodes");
    for (name, code) in OPCODES {
        assert!(
            covered.contains(code),
            "no vector for {name} (0x{code:02x})"
        );
        assert_eq!(u16f(table, name), *code, "opcode table entry {name}");
    }
    assert_eq!(
        table.as_object().unwrap().len(),
        OPCODES.len(),
        "opcode table size"
    );

    // Every opcode the decoder recognises (any answer but UnknownOpcode) has a vector too, so an
    // opcode added to the codec but forgotten in OPCODES above still fails this test.
    let known: BTreeSet<u16> = (0..=u16::MAX)
        .filter(|&op| {
            let header = FrameHeader {
                payload_len: 0,
                opcode: op,
                request_id: 0,
            };
            !matches!(
                Frame::decode(&header, Bytes::new()),
                Err(ProtocolError::UnknownOpcode(_))
            )
        })
        .collect();
    let exported: BTreeSet<u16> = OPCODES.iter().map(|(_, code)| *code).collect();
    assert_eq!(
        known, exported,
        "opcodes the decoder knows vs. the exported constants"
    );
    assert_eq!(
        covered, known,
        "opcodes in vectors.json vs. opcodes the decoder knows"
    );

    // Both directions are exercised: requests below 0x80, responses and pushes at 0x80 and above.
    assert!(covered.iter().any(|&op| op < 0x80) && covered.iter().any(|&op| op >= 0x80));
}

#[test]
fn error_code_table_matches_the_crate() {
    let file = load();
    let table = get(&file, "error_codes").as_object().unwrap();
    let mut seen = 0;
    for code in 0..=u16::MAX {
        if let Some(e) = ferrymq_protocol::ErrorCode::from_u16(code) {
            assert_eq!(e as u16, code);
            assert_eq!(
                table.get(e.as_str()).map(u64_of),
                Some(code as u64),
                "error code {}",
                e.as_str()
            );
            seen += 1;
        }
    }
    assert_eq!(
        seen,
        table.len(),
        "error codes in vectors.json that the crate does not know"
    );
}

/// The file's own rule: a JavaScript reader holds every number exactly, so a u64 above 2^53 - 1
/// is a decimal string wherever it appears.
#[test]
fn no_number_is_beyond_what_javascript_holds_exactly() {
    const JS_SAFE_INTEGER_MAX: u64 = (1 << 53) - 1;
    fn walk(value: &Value, path: &str, found: &mut Vec<String>) {
        match value {
            Value::Number(n) if n.as_u64().is_none_or(|n| n > JS_SAFE_INTEGER_MAX) => {
                found.push(format!("{path} = {n}"))
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, &format!("{path}[{i}]"), found);
                }
            }
            Value::Object(map) => {
                for (key, item) in map {
                    walk(item, &format!("{path}.{key}"), found);
                }
            }
            _ => {}
        }
    }
    let mut found = Vec::new();
    walk(&load(), "", &mut found);
    assert!(
        found.is_empty(),
        "numbers a JavaScript reader would round: {found:?}"
    );
}
