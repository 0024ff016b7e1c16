//! Property tests of the codec: every frame roundtrips, the decoder never panics and never returns
//! a frame other than the one that was encoded, partial input waits for more, oversize frames are
//! refused from the header alone, and the streaming encoders agree with the batch builders.
//!
//! Failing cases are shrunk and persisted by proptest; rerun with `PROPTEST_CASES=<n>` for a
//! longer search.

use bytes::{BufMut, Bytes, BytesMut};
use ferrymq_protocol::limits::{
    frame_bytes_needed, ACK_FRAME_BYTES_MAX, ACK_RESULT_BYTES_MAX, BATCH_COUNT_MAX, DELAY_MS_MAX,
    FRAME_BYTES_DEFAULT, FRAME_HEADER_BYTES, HEADERS_COUNT_MAX, KEY_BYTES_MAX, LIST_LIMIT_MAX,
    LIST_PAGE_BYTES_MAX, NAME_BYTES_MAX, PRIORITY_MAX, RANGES_COUNT_MAX,
};
use ferrymq_protocol::{
    opcode, DeliverEncoder, Delivery, DeliveryBatch, Durability, Frame, FrameDecoder, FrameHeader,
    FsyncPolicy, Latency, ListKind, Message, MessageEntry, MessageState, MessageStatus,
    OffsetRange, OverflowPolicy, ProtocolError, PublishEncoder, RecordBatch, RequeueSelection,
    RetentionPolicy, StartPosition, Storage, SubscribeRequest, SubscriptionMessageStatus,
    SubscriptionStats, TopicConfig, TopicInfo, TopicStats, LATENCY_BUCKETS,
};
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::strategy::Union;

const ALL_OPCODES: &[u16] = &[
    opcode::HELLO,
    opcode::PING,
    opcode::PONG,
    opcode::CREATE_TOPIC,
    opcode::DELETE_TOPIC,
    opcode::LIST_TOPICS,
    opcode::DESCRIBE_TOPIC,
    opcode::PUBLISH,
    opcode::SUBSCRIBE,
    opcode::UNSUBSCRIBE,
    opcode::CREDIT,
    opcode::ACK,
    opcode::NACK,
    opcode::DELETE_SUBSCRIPTION,
    opcode::STATS,
    opcode::ACK_RESULT,
    opcode::MESSAGE_STATUS,
    opcode::LIST_MESSAGES,
    opcode::REQUEUE_DEAD,
    opcode::USER_ADD,
    opcode::USER_REMOVE,
    opcode::USER_PASSWD,
    opcode::USER_LIST,
    opcode::GRANT,
    opcode::REVOKE,
    opcode::TOKEN_CREATE,
    opcode::TOKEN_LIST,
    opcode::TOKEN_REVOKE,
    opcode::HELLO_OK,
    opcode::OK,
    opcode::ERROR,
    opcode::PUBLISHED,
    opcode::TOPIC_LIST,
    opcode::TOPIC_INFO,
    opcode::SUBSCRIBED,
    opcode::DELIVER,
    opcode::STATS_REPLY,
    opcode::MESSAGE_STATUS_REPLY,
    opcode::MESSAGE_LIST,
    opcode::REQUEUED,
    opcode::USER_LIST_REPLY,
    opcode::TOKEN_CREATED,
    opcode::TOKEN_LIST_REPLY,
    opcode::CLUSTER_INFO,
    opcode::CLUSTER_INFO_REPLY,
];

// --- strategies ----------------------------------------------------------------------------------

/// u64 values with the edges over-represented.
fn any_u64() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), Just(u64::MAX), 0..1_000u64, any::<u64>()]
}

fn any_u32() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), Just(u32::MAX), 0..1_000u32, any::<u32>()]
}

/// Any str16 string: arbitrary printable Unicode, possibly empty.
fn text() -> impl Strategy<Value = String> {
    "\\PC{0,24}"
}

/// A topic or subscription name the decoder accepts: 1..=255 bytes of UTF-8.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-zA-Z0-9._~-]{1,24}",
        2 => "\\PC{1,40}",
        1 => Just("n".repeat(NAME_BYTES_MAX)),
        1 => Just("é".repeat(NAME_BYTES_MAX / 2)),
    ]
}

fn small_message() -> impl Strategy<Value = Message> {
    (
        option::of(vec(any::<u8>(), 0..24)),
        vec(("\\PC{1,10}", "\\PC{0,12}"), 0..4),
        0..=PRIORITY_MAX,
        option::of(prop_oneof![Just(0), Just(DELAY_MS_MAX), 0..=DELAY_MS_MAX]),
        vec(any::<u8>(), 0..96),
    )
        .prop_map(|(key, headers, priority, deliver_after_ms, body)| Message {
            key: key.map(Bytes::from),
            headers,
            priority,
            deliver_after_ms,
            body: Bytes::from(body),
        })
}

/// A message at the record limits: the longest key and the most headers.
fn limit_message() -> impl Strategy<Value = Message> {
    (any::<u8>(), vec(any::<u8>(), 0..8)).prop_map(|(fill, body)| Message {
        key: Some(Bytes::from(vec![fill; KEY_BYTES_MAX])),
        headers: (0..HEADERS_COUNT_MAX)
            .map(|i| (format!("h{i}"), "v".repeat(i)))
            .collect(),
        priority: PRIORITY_MAX,
        deliver_after_ms: Some(DELAY_MS_MAX),
        body: Bytes::from(body),
    })
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![19 => small_message(), 1 => limit_message()]
}

fn range() -> impl Strategy<Value = OffsetRange> {
    (any_u32(), any_u64(), any_u32()).prop_map(|(partition, offset, count)| OffsetRange {
        partition,
        offset: offset.min(u64::MAX - count as u64),
        count,
    })
}

fn ranges() -> impl Strategy<Value = Vec<OffsetRange>> {
    vec(range(), 0..6)
}

fn topic_config() -> impl Strategy<Value = TopicConfig> {
    (
        any_u32(),
        prop_oneof![Just(Storage::Memory), Just(Storage::Disk)],
        prop_oneof![
            Just(OverflowPolicy::DropOldest),
            Just(OverflowPolicy::Reject)
        ],
        any_u64(),
        any_u64(),
        prop_oneof![
            Just(FsyncPolicy::Default),
            Just(FsyncPolicy::Always),
            (1..=u32::MAX).prop_map(FsyncPolicy::IntervalMs),
            Just(FsyncPolicy::Never),
        ],
        any_u64(),
        prop_oneof![
            Just(RetentionPolicy::Default),
            Just(RetentionPolicy::Stream),
            Just(RetentionPolicy::WorkQueue),
        ],
        any_u64(),
    )
        .prop_map(
            |(
                partitions,
                storage,
                overflow,
                max_messages,
                max_bytes,
                fsync,
                retention_ms,
                retention_policy,
                dedup_window_ms,
            )| {
                TopicConfig {
                    partitions,
                    storage,
                    overflow,
                    max_messages,
                    max_bytes,
                    fsync,
                    retention_ms,
                    retention_policy,
                    dedup_window_ms,
                    replicas: 0,
                }
            },
        )
}

fn topic_info() -> impl Strategy<Value = TopicInfo> {
    (
        text(),
        topic_config(),
        any_u64(),
        any_u64(),
        vec(text(), 0..4),
    )
        .prop_map(|(name, config, messages, bytes, subscriptions)| TopicInfo {
            name,
            config,
            messages,
            bytes,
            subscriptions,
        })
}

fn subscription_stats() -> impl Strategy<Value = SubscriptionStats> {
    (
        text(),
        any::<bool>(),
        any_u32(),
        [
            any_u64(),
            any_u64(),
            any_u64(),
            any_u64(),
            any_u64(),
            any_u64(),
            any_u64(),
        ],
        latency(),
        latency(),
        any::<bool>(),
    )
        .prop_map(
            |(
                name,
                ephemeral,
                consumers,
                [messages_out, bytes_out, acked, redelivered, backlog, in_flight, gave_up],
                deliver_latency,
                ack_latency,
                paused,
            )| {
                SubscriptionStats {
                    name,
                    ephemeral,
                    consumers,
                    messages_out,
                    bytes_out,
                    acked,
                    redelivered,
                    backlog,
                    in_flight,
                    gave_up,
                    deliver_latency,
                    ack_latency,
                    paused,
                }
            },
        )
}

/// A histogram in canonical form: distinct buckets, ascending, none empty.
fn latency() -> impl Strategy<Value = Latency> {
    (
        any_u64(),
        proptest::collection::btree_map(0..LATENCY_BUCKETS as u16, 1..=u64::MAX, 0..20),
    )
        .prop_map(|(sum_us, buckets)| Latency {
            sum_us,
            buckets: buckets.into_iter().collect(),
        })
}

fn topic_stats() -> impl Strategy<Value = TopicStats> {
    (
        text(),
        [
            any_u64(),
            any_u64(),
            any_u64(),
            any_u64(),
            any_u64(),
            any_u64(),
            any_u64(),
        ],
        any_u32(),
        any_u32(),
        vec(subscription_stats(), 0..3),
    )
        .prop_map(
            |(
                name,
                [messages_in, bytes_in, messages_out, bytes_out, depth, depth_bytes, dropped],
                publishers,
                subscribers,
                subscriptions,
            )| {
                TopicStats {
                    name,
                    messages_in,
                    bytes_in,
                    messages_out,
                    bytes_out,
                    depth,
                    depth_bytes,
                    dropped,
                    publishers,
                    subscribers,
                    subscriptions,
                }
            },
        )
}

fn start_position() -> impl Strategy<Value = StartPosition> {
    prop_oneof![
        Just(StartPosition::Latest),
        Just(StartPosition::Earliest),
        any_u64().prop_map(StartPosition::Offset),
        any_u64().prop_map(StartPosition::TimeMs),
    ]
}

fn delivery() -> impl Strategy<Value = Delivery> {
    (any_u32(), any_u64(), any_u64(), any::<u16>(), message()).prop_map(
        |(partition, offset, timestamp_ms, attempt, message)| Delivery {
            partition,
            offset,
            timestamp_ms,
            attempt,
            message,
        },
    )
}

/// Bytes of up to `max`, the edge over-represented.
fn bytes_up_to(max: usize) -> impl Strategy<Value = Bytes> {
    prop_oneof![
        4 => vec(any::<u8>(), 0..24),
        1 => Just(vec![0xa5; max]),
    ]
    .prop_map(Bytes::from)
}

fn message_state() -> impl Strategy<Value = MessageState> {
    prop_oneof![
        Just(MessageState::Pending),
        Just(MessageState::Delayed),
        Just(MessageState::InFlight),
        Just(MessageState::Acked),
        Just(MessageState::DeadLettered),
        Just(MessageState::Settled),
        Just(MessageState::BeforeStart),
    ]
}

fn list_kind() -> impl Strategy<Value = ListKind> {
    prop_oneof![
        Just(ListKind::Pending),
        Just(ListKind::InFlight),
        Just(ListKind::Acked),
        Just(ListKind::DeadLettered),
    ]
}

fn message_entry() -> impl Strategy<Value = MessageEntry> {
    (
        (any_u32(), any_u64(), message_state(), any::<u16>()),
        [any_u64(), any_u64(), any_u64(), any_u64()],
        bytes_up_to(ACK_RESULT_BYTES_MAX),
        text(),
        option::of((any_u32(), any_u64())),
    )
        .prop_map(
            |(
                (partition, offset, state, attempts),
                [published_ms, first_delivered_ms, settled_ms, due_ms],
                result,
                reason,
                dead_letter,
            )| MessageEntry {
                partition,
                offset,
                state,
                attempts,
                published_ms,
                first_delivered_ms,
                settled_ms,
                due_ms,
                result,
                reason,
                dead_letter,
            },
        )
}

fn message_status() -> impl Strategy<Value = MessageStatus> {
    (
        (any_u32(), any_u64(), any_u64(), 0..=PRIORITY_MAX),
        option::of(bytes_up_to(KEY_BYTES_MAX)),
        any_u32(),
        vec(
            (text(), message_entry()).prop_map(|(subscription, entry)| SubscriptionMessageStatus {
                subscription,
                entry,
            }),
            0..3,
        ),
    )
        .prop_map(
            |((partition, offset, published_ms, priority), key, body_bytes, subscriptions)| {
                MessageStatus {
                    partition,
                    offset,
                    published_ms,
                    priority,
                    key,
                    body_bytes,
                    subscriptions,
                }
            },
        )
}

fn requeue_selection() -> impl Strategy<Value = RequeueSelection> {
    prop_oneof![
        Just(RequeueSelection::All),
        (any_u32(), any_u64(), any_u64()).prop_map(|(partition, a, b)| RequeueSelection::Range {
            partition,
            first: a.min(b),
            last: a.max(b),
        }),
    ]
}

/// A partition the wire can express: u32::MAX is the "broker chooses" marker, i.e. `None`.
fn partition() -> impl Strategy<Value = Option<u32>> {
    option::of(prop_oneof![0..16u32, 0..u32::MAX])
}

/// Any valid frame of any variant.
fn frame() -> impl Strategy<Value = Frame> {
    Union::new(vec![
        (
            any::<u16>(),
            any::<u16>(),
            any_u32(),
            text(),
            text(),
            text(),
        )
            .prop_map(
                |(version_min, version_max, heartbeat_ms, client_name, user, password)| {
                    Frame::Hello {
                        version_min,
                        version_max,
                        heartbeat_ms,
                        client_name,
                        user,
                        password,
                    }
                },
            )
            .boxed(),
        Just(Frame::Ping).boxed(),
        Just(Frame::Pong).boxed(),
        (name(), topic_config(), any::<bool>())
            .prop_map(|(name, config, if_not_exists)| Frame::CreateTopic {
                name,
                config,
                if_not_exists,
            })
            .boxed(),
        name().prop_map(|name| Frame::DeleteTopic { name }).boxed(),
        Just(Frame::ListTopics).boxed(),
        name()
            .prop_map(|name| Frame::DescribeTopic { name })
            .boxed(),
        (name(), partition(), vec(message(), 0..6))
            .prop_map(|(topic, partition, messages)| Frame::Publish {
                topic,
                partition,
                records: RecordBatch::from_messages(&messages).unwrap(),
            })
            .boxed(),
        (
            name(),
            prop_oneof![Just(String::new()), name()],
            start_position(),
            any_u32(),
            any_u32(),
            any_u32(),
            any::<bool>(),
            any::<bool>(),
            vec(
                (any_u32(), any_u32()).prop_map(|(a, b)| (a.min(b), a.max(b))),
                0..4,
            ),
            prop_oneof![Just(String::new()), name()],
        )
            .prop_map(
                |(
                    topic,
                    subscription,
                    start,
                    ack_timeout_ms,
                    max_attempts,
                    credit,
                    auto_ack,
                    ordered,
                    partitions,
                    dead_letter_topic,
                )| {
                    Frame::Subscribe(SubscribeRequest {
                        topic,
                        subscription,
                        start,
                        ack_timeout_ms,
                        max_attempts,
                        credit,
                        auto_ack,
                        // Ordered delivery needs acks: the decoder refuses both together.
                        ordered: ordered && !auto_ack,
                        partitions,
                        dead_letter_topic,
                    })
                },
            )
            .boxed(),
        any_u32()
            .prop_map(|consumer_id| Frame::Unsubscribe { consumer_id })
            .boxed(),
        (any_u32(), any_u32())
            .prop_map(|(consumer_id, credit)| Frame::Credit {
                consumer_id,
                credit,
            })
            .boxed(),
        (any_u32(), ranges())
            .prop_map(|(consumer_id, ranges)| Frame::Ack {
                consumer_id,
                ranges,
            })
            .boxed(),
        (any_u32(), any_u32(), 0u8..3, text(), ranges())
            .prop_map(
                |(consumer_id, delay_ms, action, reason, ranges)| Frame::Nack {
                    consumer_id,
                    delay_ms,
                    dead_letter: action == 1,
                    release: action == 2,
                    reason,
                    ranges,
                },
            )
            .boxed(),
        (name(), name())
            .prop_map(|(topic, subscription)| Frame::DeleteSubscription {
                topic,
                subscription,
            })
            .boxed(),
        prop_oneof![Just(String::new()), name()]
            .prop_map(|topic| Frame::Stats { topic })
            .boxed(),
        (any_u32(), bytes_up_to(ACK_RESULT_BYTES_MAX), ranges())
            .prop_map(|(consumer_id, result, ranges)| Frame::AckResult {
                consumer_id,
                result,
                ranges,
            })
            .boxed(),
        (name(), any_u32(), any_u64())
            .prop_map(|(topic, partition, offset)| Frame::MessageStatus {
                topic,
                partition,
                offset,
            })
            .boxed(),
        (
            name(),
            name(),
            list_kind(),
            bytes_up_to(LIST_PAGE_BYTES_MAX),
            prop_oneof![Just(1), Just(LIST_LIMIT_MAX), 1..=LIST_LIMIT_MAX],
        )
            .prop_map(
                |(topic, subscription, kind, page, limit)| Frame::ListMessages {
                    topic,
                    subscription,
                    kind,
                    page,
                    limit,
                },
            )
            .boxed(),
        (name(), requeue_selection())
            .prop_map(|(dead_letter_topic, selection)| Frame::RequeueDead {
                dead_letter_topic,
                selection,
            })
            .boxed(),
        (text(), text(), any::<u8>())
            .prop_map(|(user, password, roles)| Frame::UserAdd {
                user,
                password,
                roles,
            })
            .boxed(),
        text().prop_map(|user| Frame::UserRemove { user }).boxed(),
        (text(), text())
            .prop_map(|(user, password)| Frame::UserPasswd { user, password })
            .boxed(),
        Just(Frame::UserList).boxed(),
        (text(), text(), any::<u8>(), any::<u8>(), any::<bool>())
            .prop_map(|(user, pattern, actions, roles, grant)| match grant {
                true => Frame::Grant {
                    user,
                    pattern,
                    actions,
                    roles,
                },
                false => Frame::Revoke {
                    user,
                    pattern,
                    actions,
                    roles,
                },
            })
            .boxed(),
        (text(), text(), any_u64())
            .prop_map(|(user, name, expires_ms)| Frame::TokenCreate {
                user,
                name,
                expires_ms,
            })
            .boxed(),
        text().prop_map(|user| Frame::TokenList { user }).boxed(),
        (text(), text())
            .prop_map(|(user, name)| Frame::TokenRevoke { user, name })
            .boxed(),
        (any::<u16>(), any_u32(), any_u32(), any_u32(), text())
            .prop_map(
                |(version, heartbeat_ms, frame_bytes_max, message_bytes_max, server)| {
                    Frame::HelloOk {
                        version,
                        heartbeat_ms,
                        frame_bytes_max,
                        message_bytes_max,
                        server,
                    }
                },
            )
            .boxed(),
        Just(Frame::Ok).boxed(),
        (any::<u16>(), text())
            .prop_map(|(code, message)| Frame::Error { code, message })
            .boxed(),
        (
            prop_oneof![
                Just(Durability::Memory),
                Just(Durability::Written),
                Just(Durability::SyncedInterval),
                Just(Durability::Synced)
            ],
            ranges(),
        )
            .prop_map(|(durability, ranges)| Frame::Published { durability, ranges })
            .boxed(),
        vec(topic_info(), 0..4)
            .prop_map(|topics| Frame::TopicList { topics })
            .boxed(),
        topic_info().prop_map(Frame::TopicInfo).boxed(),
        (any_u32(), text(), any_u32())
            .prop_map(
                |(consumer_id, subscription, partitions)| Frame::Subscribed {
                    consumer_id,
                    subscription,
                    partitions,
                },
            )
            .boxed(),
        (any_u32(), vec(delivery(), 0..5))
            .prop_map(|(consumer_id, deliveries)| Frame::Deliver {
                consumer_id,
                deliveries: DeliveryBatch::from_deliveries(&deliveries).unwrap(),
            })
            .boxed(),
        vec(topic_stats(), 0..3)
            .prop_map(|topics| Frame::StatsReply { topics })
            .boxed(),
        message_status().prop_map(Frame::MessageStatusReply).boxed(),
        (vec(message_entry(), 0..4), bytes_up_to(LIST_PAGE_BYTES_MAX))
            .prop_map(|(entries, next_page)| Frame::MessageList { entries, next_page })
            .boxed(),
        (any_u64(), any_u64())
            .prop_map(|(requeued, skipped)| Frame::Requeued { requeued, skipped })
            .boxed(),
        vec(
            (
                text(),
                any::<u8>(),
                any_u32(),
                vec((text(), any::<u8>()), 0..3),
            ),
            0..3,
        )
        .prop_map(|users| Frame::UserListReply {
            users: users
                .into_iter()
                .map(
                    |(name, roles, tokens, grants)| ferrymq_protocol::UserEntry {
                        name,
                        roles,
                        tokens,
                        grants,
                    },
                )
                .collect(),
        })
        .boxed(),
        (text(), text(), any_u64())
            .prop_map(|(name, token, expires_ms)| Frame::TokenCreated {
                name,
                token,
                expires_ms,
            })
            .boxed(),
        vec((text(), any_u64(), any_u64()), 0..4)
            .prop_map(|tokens| Frame::TokenListReply {
                tokens: tokens
                    .into_iter()
                    .map(
                        |(name, created_ms, expires_ms)| ferrymq_protocol::TokenEntry {
                            name,
                            created_ms,
                            expires_ms,
                        },
                    )
                    .collect(),
            })
            .boxed(),
        Just(Frame::ClusterInfo).boxed(),
        cluster_info().prop_map(Frame::ClusterInfoReply).boxed(),
    ])
}

fn cluster_info() -> impl Strategy<Value = ferrymq_protocol::ClusterInfo> {
    let node =
        (any_u64(), text()).prop_map(|(id, addr)| ferrymq_protocol::ClusterNodeEntry { id, addr });
    let partition = (text(), any::<u32>(), any_u64(), vec(any_u64(), 0..6)).prop_map(
        |(topic, partition, leader, replicas)| ferrymq_protocol::PartitionLeader {
            topic,
            partition,
            leader,
            replicas,
        },
    );
    (any_u64(), any_u64(), vec(node, 0..4), vec(partition, 0..4)).prop_map(
        |(node_id, metadata_leader, nodes, partitions)| ferrymq_protocol::ClusterInfo {
            node_id,
            metadata_leader,
            nodes,
            partitions,
        },
    )
}

// --- helpers -------------------------------------------------------------------------------------

fn encode(frame: &Frame, request_id: u32) -> Bytes {
    let mut buf = BytesMut::new();
    frame.encode(request_id, &mut buf);
    buf.freeze()
}

fn decoder() -> FrameDecoder {
    FrameDecoder::new(FRAME_BYTES_DEFAULT as usize)
}

/// Decodes everything in `input` the way a connection would, checking on every step what the
/// decoder promises: no panic; a frame only once all of its bytes are there; and a decoded frame
/// that re-encodes to exactly the bytes it was decoded from, so that no input yields a frame other
/// than the one its bytes spell. Returns the frames and the error that stopped decoding, if any.
fn decode_all(decoder: &FrameDecoder, input: &[u8]) -> (Vec<(u32, Frame)>, Option<ProtocolError>) {
    let mut buf = BytesMut::from(input);
    let mut frames = Vec::new();
    loop {
        let before = buf.clone();
        match decoder.decode(&mut buf) {
            Ok(Some((header, frame))) => {
                let consumed = before.len() - buf.len();
                assert_eq!(
                    consumed,
                    header.frame_len(),
                    "decoder consumed a different length than the header says"
                );
                assert_eq!(header.opcode, frame.opcode());
                assert_eq!(
                    encode(&frame, header.request_id),
                    before[..consumed],
                    "decoded {frame:?} does not re-encode to its bytes"
                );
                frames.push((header.request_id, frame));
            }
            Ok(None) => {
                assert_eq!(
                    buf, before,
                    "a decoder waiting for more bytes must not consume any"
                );
                match FrameHeader::peek(&buf).unwrap() {
                    None => assert!(buf.len() < FRAME_HEADER_BYTES),
                    Some(header) => assert!(buf.len() < header.frame_len()),
                }
                return (frames, None);
            }
            Err(e) => return (frames, Some(e)),
        }
    }
}

// --- properties ----------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn every_frame_roundtrips(frame in frame(), request_id in any_u32()) {
        let raw = encode(&frame, request_id);
        prop_assert_eq!(raw.len(), FRAME_HEADER_BYTES + u32::from_le_bytes(raw[..4].try_into().unwrap()) as usize);
        let mut buf = BytesMut::from(&raw[..]);
        let (header, decoded) = decoder().decode(&mut buf).unwrap().expect("a whole frame decodes");
        prop_assert!(buf.is_empty());
        prop_assert_eq!(header.request_id, request_id);
        prop_assert_eq!(header.opcode, frame.opcode());
        prop_assert_eq!(header.frame_len(), raw.len());
        prop_assert_eq!(encode(&decoded, request_id), raw);
        prop_assert_eq!(&decoded, &frame);

        // The payloads kept as bytes read back as the values they were built from.
        match (&decoded, &frame) {
            (Frame::Publish { records: got, .. }, Frame::Publish { records: want, .. }) => {
                prop_assert_eq!(got.messages().collect::<Vec<_>>(), want.messages().collect::<Vec<_>>());
                for record in got.records() {
                    let message = record.to_message();
                    prop_assert_eq!(record.priority, message.priority);
                    prop_assert_eq!(record.deliver_after_ms, message.deliver_after_ms);
                    prop_assert_eq!(&record.key, &message.key);
                    prop_assert_eq!(record.body_len as usize, message.body.len());
                    prop_assert_eq!(record.raw.len(), message.encoded_len());
                }
            }
            (Frame::Deliver { deliveries: got, .. }, Frame::Deliver { deliveries: want, .. }) => {
                prop_assert_eq!(got.iter().collect::<Vec<_>>(), want.iter().collect::<Vec<_>>());
            }
            _ => {}
        }
    }

    #[test]
    fn pipelined_frames_split_into_arbitrary_chunks_decode_the_same(
        frames in vec(frame(), 1..5),
        chunk_lens in vec(1..48usize, 1..64),
    ) {
        let mut stream = BytesMut::new();
        for (i, frame) in frames.iter().enumerate() {
            frame.encode(i as u32 + 1, &mut stream);
        }
        let decoder = decoder();
        let mut buf = BytesMut::new();
        let mut decoded = Vec::new();
        let mut fed = 0;
        let mut chunks = chunk_lens.iter().cycle();
        while fed < stream.len() {
            let n = (*chunks.next().unwrap()).min(stream.len() - fed);
            buf.extend_from_slice(&stream[fed..fed + n]);
            fed += n;
            while let Some((header, frame)) = decoder.decode(&mut buf).unwrap() {
                decoded.push((header.request_id, frame));
            }
        }
        prop_assert!(buf.is_empty());
        let expected: Vec<(u32, Frame)> = frames.into_iter().enumerate().map(|(i, f)| (i as u32 + 1, f)).collect();
        prop_assert_eq!(decoded, expected);
    }

    #[test]
    fn every_strict_prefix_waits_for_more_bytes(frame in frame(), request_id in any_u32()) {
        let raw = encode(&frame, request_id);
        let decoder = decoder();
        for len in 0..raw.len() {
            let mut buf = BytesMut::from(&raw[..len]);
            prop_assert_eq!(decoder.decode(&mut buf), Ok(None), "prefix of {} bytes", len);
            prop_assert_eq!(&buf[..], &raw[..len]);
        }
    }

    #[test]
    fn every_shortened_payload_is_refused_as_truncated(frame in frame()) {
        let raw = encode(&frame, 7);
        let payload = &raw[FRAME_HEADER_BYTES..];
        for len in 0..payload.len() {
            let header = FrameHeader { payload_len: len as u32, opcode: frame.opcode(), request_id: 7 };
            let result = Frame::decode(&header, Bytes::copy_from_slice(&payload[..len]));
            prop_assert!(
                matches!(result, Err(ProtocolError::Truncated { .. })),
                "payload cut to {} of {} bytes gave {:?}", len, payload.len(), result
            );
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_nor_yield_a_wrong_frame(bytes in vec(any::<u8>(), 0..256), limit in 12..512usize) {
        decode_all(&FrameDecoder::new(limit), &bytes);
    }

    #[test]
    fn arbitrary_payloads_never_panic_nor_yield_a_wrong_frame(
        opcode in prop_oneof![3 => proptest::sample::select(ALL_OPCODES), 1 => any::<u16>()],
        request_id in any::<u32>(),
        payload in vec(any::<u8>(), 0..160),
    ) {
        let mut raw = BytesMut::new();
        raw.put_u32_le(payload.len() as u32);
        raw.put_u16_le(opcode);
        raw.put_u16_le(0);
        raw.put_u32_le(request_id);
        raw.put_slice(&payload);
        let (frames, error) = decode_all(&decoder(), &raw);
        prop_assert_eq!(frames.len() + error.iter().count(), 1, "a whole frame decodes or is refused");
    }

    #[test]
    fn mutated_frames_never_panic_nor_yield_a_wrong_frame(
        frame in frame(),
        mutations in vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut raw = BytesMut::from(&encode(&frame, 1)[..]);
        for (index, byte) in mutations {
            let at = index.index(raw.len());
            raw[at] = byte;
        }
        decode_all(&decoder(), &raw);
    }

    #[test]
    fn oversize_frames_are_refused_from_the_header_alone(
        limit in 12..100_000usize,
        excess in 1..=(u32::MAX as usize - 100_000),
        opcode in any::<u16>(),
        body in vec(any::<u8>(), 0..64),
    ) {
        let payload_len = limit - FRAME_HEADER_BYTES + excess;
        let mut buf = BytesMut::with_capacity(FRAME_HEADER_BYTES + body.len());
        buf.put_u32_le(payload_len as u32);
        buf.put_u16_le(opcode);
        buf.put_u16_le(0);
        buf.put_u32_le(9);
        buf.put_slice(&body);
        let capacity = buf.capacity();
        let result = FrameDecoder::new(limit).decode(&mut buf);
        prop_assert_eq!(result, Err(ProtocolError::FrameTooLarge { len: FRAME_HEADER_BYTES + payload_len, max: limit }));
        prop_assert_eq!(buf.len(), FRAME_HEADER_BYTES + body.len(), "nothing consumed");
        prop_assert_eq!(buf.capacity(), capacity, "no room reserved for the refused body");
    }

    #[test]
    fn a_frame_at_the_limit_decodes_and_one_byte_over_is_refused(frame in frame()) {
        let raw = encode(&frame, 3);
        let mut buf = BytesMut::from(&raw[..]);
        prop_assert_eq!(FrameDecoder::new(raw.len()).decode(&mut buf).unwrap().map(|(_, f)| f), Some(frame));
        if raw.len() > FRAME_HEADER_BYTES {
            let mut buf = BytesMut::from(&raw[..FRAME_HEADER_BYTES]);
            let result = FrameDecoder::new(raw.len() - 1).decode(&mut buf);
            prop_assert_eq!(result, Err(ProtocolError::FrameTooLarge { len: raw.len(), max: raw.len() - 1 }));
        }
    }

    #[test]
    fn publish_encoder_matches_record_batch(
        topic in name(),
        partition in partition(),
        request_id in any_u32(),
        items in vec(
            prop_oneof![
                message().prop_map(|m| (m, false)),
                (option::of(vec(any::<u8>(), 0..24)), 0..=PRIORITY_MAX, vec(any::<u8>(), 0..96)).prop_map(
                    |(key, priority, body)| {
                        let message = Message { key: key.map(Bytes::from), priority, body: Bytes::from(body), ..Default::default() };
                        (message, true)
                    },
                ),
            ],
            0..8,
        ),
    ) {
        let mut encoder = PublishEncoder::new(&topic, partition, request_id);
        prop_assert!(encoder.is_empty());
        for (message, fast_path) in &items {
            if *fast_path {
                encoder.push_body(message.key.as_deref(), message.priority, &message.body);
            } else {
                encoder.push(message).unwrap();
            }
        }
        prop_assert_eq!(encoder.count() as usize, items.len());
        let len = encoder.len();
        let raw = encoder.finish();
        prop_assert_eq!(raw.len(), len);

        let messages: Vec<Message> = items.into_iter().map(|(m, _)| m).collect();
        let expected = Frame::Publish { topic, partition, records: RecordBatch::from_messages(&messages).unwrap() };
        prop_assert_eq!(&raw, &encode(&expected, request_id));
        let mut buf = BytesMut::from(&raw[..]);
        let (header, decoded) = decoder().decode(&mut buf).unwrap().unwrap();
        prop_assert!(buf.is_empty());
        prop_assert_eq!(header.request_id, request_id);
        let Frame::Publish { records, .. } = &decoded else { panic!("not a PUBLISH: {decoded:?}") };
        prop_assert_eq!(records.messages().collect::<Vec<_>>(), messages);
        prop_assert_eq!(decoded, expected);
    }

    #[test]
    fn deliver_encoder_matches_delivery_batch(
        already_buffered in vec(any::<u8>(), 0..32),
        consumer_id in any_u32(),
        deliveries in vec(delivery(), 0..6),
    ) {
        let mut buf = BytesMut::from(&already_buffered[..]);
        let mut encoder = DeliverEncoder::begin(&mut buf, consumer_id);
        prop_assert!(encoder.is_empty());
        for d in &deliveries {
            let mut record = BytesMut::new();
            d.message.encode_record(&mut record);
            encoder.push(d.partition, d.offset, d.timestamp_ms, d.attempt, &record);
        }
        prop_assert_eq!(encoder.count() as usize, deliveries.len());
        let len = encoder.len();
        let count = encoder.finish();
        prop_assert_eq!(count as usize, deliveries.len());
        prop_assert_eq!(&buf[..already_buffered.len()], &already_buffered[..], "bytes before the frame untouched");
        if deliveries.is_empty() {
            prop_assert_eq!(buf.len(), already_buffered.len(), "an empty DELIVER frame is removed again");
            return Ok(());
        }
        prop_assert_eq!(buf.len() - already_buffered.len(), len);

        let expected = Frame::Deliver { consumer_id, deliveries: DeliveryBatch::from_deliveries(&deliveries).unwrap() };
        let mut frame_bytes = buf.split_off(already_buffered.len());
        prop_assert_eq!(&frame_bytes[..], &encode(&expected, 0)[..]);
        let (header, decoded) = decoder().decode(&mut frame_bytes).unwrap().unwrap();
        prop_assert!(frame_bytes.is_empty());
        prop_assert_eq!(header.request_id, 0, "deliveries are pushed with request_id 0");
        let Frame::Deliver { deliveries: got, .. } = &decoded else { panic!("not a DELIVER: {decoded:?}") };
        prop_assert_eq!(got.iter().collect::<Vec<_>>(), deliveries);
        prop_assert_eq!(decoded, expected);
    }
}

// --- limits of the streaming encoders --------------------------------------------------------------

#[test]
fn publish_encoder_refuses_more_than_a_batch() {
    let mut encoder = PublishEncoder::new("t", None, 1);
    let message = Message::new("");
    for _ in 0..BATCH_COUNT_MAX {
        encoder.push(&message).unwrap();
    }
    assert!(matches!(
        encoder.push(&message),
        Err(ProtocolError::InvalidValue { field: "batch", .. })
    ));
    assert_eq!(encoder.count(), BATCH_COUNT_MAX);
    let mut buf = BytesMut::from(&encoder.finish()[..]);
    let (_, frame) = decoder().decode(&mut buf).unwrap().unwrap();
    let Frame::Publish { records, .. } = frame else {
        panic!("not a PUBLISH")
    };
    assert_eq!(records.count(), BATCH_COUNT_MAX);
}

#[test]
#[should_panic(expected = "BATCH_COUNT_MAX")]
fn deliver_encoder_asserts_the_batch_limit() {
    let mut buf = BytesMut::new();
    let mut record = BytesMut::new();
    Message::new("").encode_record(&mut record);
    let mut encoder = DeliverEncoder::begin(&mut buf, 1);
    for offset in 0..=BATCH_COUNT_MAX as u64 {
        encoder.push(0, offset, 0, 1, &record);
    }
}

#[test]
fn from_deliveries_refuses_more_than_a_batch() {
    let one = Delivery {
        partition: 0,
        offset: 0,
        timestamp_ms: 0,
        attempt: 1,
        message: Message::new(""),
    };
    let too_many = vec![one; BATCH_COUNT_MAX as usize + 1];
    assert!(matches!(
        DeliveryBatch::from_deliveries(&too_many),
        Err(ProtocolError::InvalidValue { .. })
    ));
}

// --- limits of the new request fields --------------------------------------------------------------

fn decode_one(frame: &Frame) -> Result<Frame, ProtocolError> {
    let mut buf = BytesMut::from(&encode(frame, 1)[..]);
    decoder()
        .decode(&mut buf)
        .map(|f| f.expect("a whole frame").1)
}

fn refused_field(result: Result<Frame, ProtocolError>) -> &'static str {
    match result {
        Err(ProtocolError::InvalidValue { field, .. }) => field,
        other => panic!("expected an invalid value, got {other:?}"),
    }
}

#[test]
fn ack_result_takes_a_result_up_to_its_limit() {
    let ack = |len: usize| Frame::AckResult {
        consumer_id: 1,
        result: Bytes::from(vec![b'r'; len]),
        ranges: vec![OffsetRange::single(0, 0)],
    };
    let at_limit = ack(ACK_RESULT_BYTES_MAX);
    assert_eq!(decode_one(&at_limit), Ok(at_limit));
    assert_eq!(
        refused_field(decode_one(&ack(ACK_RESULT_BYTES_MAX + 1))),
        "ack_result.result"
    );
}

#[test]
fn list_messages_limit_and_page_are_bounded() {
    let list = |limit: u32, page: usize| Frame::ListMessages {
        topic: "t".into(),
        subscription: "s".into(),
        kind: ListKind::Pending,
        page: Bytes::from(vec![1; page]),
        limit,
    };
    for ok in [list(1, 0), list(LIST_LIMIT_MAX, LIST_PAGE_BYTES_MAX)] {
        assert_eq!(decode_one(&ok), Ok(ok));
    }
    assert_eq!(
        refused_field(decode_one(&list(0, 0))),
        "list_messages.limit"
    );
    assert_eq!(
        refused_field(decode_one(&list(LIST_LIMIT_MAX + 1, 0))),
        "list_messages.limit"
    );
    assert_eq!(
        refused_field(decode_one(&list(1, LIST_PAGE_BYTES_MAX + 1))),
        "list_messages.page"
    );
}

#[test]
fn subscribe_refuses_ordered_with_auto_ack_and_long_dead_letter_topics() {
    let subscribe = |auto_ack: bool, ordered: bool, dead_letter_topic: String| {
        Frame::Subscribe(SubscribeRequest {
            topic: "t".into(),
            subscription: "s".into(),
            start: StartPosition::Latest,
            ack_timeout_ms: 0,
            max_attempts: 0,
            credit: 0,
            auto_ack,
            ordered,
            partitions: Vec::new(),
            dead_letter_topic,
        })
    };
    for ok in [
        subscribe(false, true, String::new()),
        subscribe(true, false, "t.failed".into()),
        subscribe(false, false, "d".repeat(NAME_BYTES_MAX)),
    ] {
        assert_eq!(decode_one(&ok), Ok(ok));
    }
    match decode_one(&subscribe(true, true, String::new())) {
        Err(ProtocolError::InvalidValue { field, reason }) => {
            assert_eq!(field, "subscribe.flags");
            assert!(reason.contains("ordered delivery needs acks"), "{reason}");
        }
        other => panic!("expected an invalid value, got {other:?}"),
    }
    assert_eq!(
        refused_field(decode_one(&subscribe(
            false,
            false,
            "d".repeat(NAME_BYTES_MAX + 1)
        ))),
        "subscribe.dead_letter_topic"
    );
}

#[test]
fn requeue_dead_selections_are_canonical() {
    let requeue = |selection| Frame::RequeueDead {
        dead_letter_topic: "t.dlq".into(),
        selection,
    };
    let one = requeue(RequeueSelection::Range {
        partition: 2,
        first: 7,
        last: 7,
    });
    assert_eq!(decode_one(&one), Ok(one));
    assert_eq!(
        refused_field(decode_one(&requeue(RequeueSelection::Range {
            partition: 0,
            first: 8,
            last: 7,
        }))),
        "requeue_dead.last_offset"
    );
}

#[test]
fn the_largest_acks_fit_the_smallest_frame_limit() {
    let ranges: Vec<OffsetRange> = (0..RANGES_COUNT_MAX as u64)
        .map(|i| OffsetRange::single(7, 2 * i))
        .collect();
    let largest = [
        Frame::AckResult {
            consumer_id: 1,
            result: Bytes::from(vec![b'r'; ACK_RESULT_BYTES_MAX]),
            ranges: ranges.clone(),
        },
        Frame::Nack {
            consumer_id: 1,
            delay_ms: 1,
            dead_letter: true,
            release: false,
            reason: "x".repeat(1024),
            ranges: ranges.clone(),
        },
        Frame::Ack {
            consumer_id: 1,
            ranges,
        },
    ];
    let sizes: Vec<usize> = largest
        .iter()
        .map(|frame| {
            let mut buf = BytesMut::new();
            frame.encode(1, &mut buf);
            let decoder = FrameDecoder::new(frame_bytes_needed(1));
            decoder
                .decode(&mut buf)
                .expect("within the limit")
                .expect("whole");
            buf.len()
        })
        .collect();
    assert!(
        sizes.iter().all(|&n| n == 0),
        "each frame was consumed whole"
    );
    let mut encoded = BytesMut::new();
    largest[0].encode(1, &mut encoded);
    assert_eq!(
        encoded.len(),
        ACK_FRAME_BYTES_MAX,
        "ACK_RESULT is the largest"
    );
    assert!(frame_bytes_needed(1) >= ACK_FRAME_BYTES_MAX);
}
