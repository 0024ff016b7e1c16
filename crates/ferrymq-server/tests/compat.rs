//! Clients of every protocol version the server still speaks, side by side, through every
//! operation, over real sockets on 127.0.0.1.
//!
//! A client of version 1 is this crate's codec pinned to version 1 (`Raw::hello_as(addr, 1)`):
//! the codec's version 1 layout is checked byte for byte against `protocol/vectors-v1.json`,
//! the frames as version 1 was released, in `ferrymq-protocol/tests/vectors.rs`. Its decoder is
//! strict (a frame must be consumed exactly), so a reply written in another version's layout
//! fails here as it would fail the deployed client.

mod common;

use bytes::Bytes;
use common::{error_code, Raw, TestServer};
use ferrymq_protocol::limits::PROTOCOL_VERSION;
use ferrymq_protocol::{
    ErrorCode, Frame, ListKind, Message, MessageState, OffsetRange, RecordBatch, RequeueSelection,
    RetentionPolicy, StartPosition, Storage, SubscribeRequest, TopicConfig,
};
use ferrymq_server::ServerConfig;

fn subscribe(topic: &str, subscription: &str, start: StartPosition, credit: u32) -> Frame {
    Frame::Subscribe(SubscribeRequest {
        topic: topic.into(),
        subscription: subscription.into(),
        start,
        ack_timeout_ms: 0,
        max_attempts: 2,
        credit,
        auto_ack: false,
        ordered: false,
        partitions: Vec::new(),
        dead_letter_topic: String::new(),
    })
}

fn publish(topic: &str, bodies: &[&str]) -> Frame {
    let messages: Vec<Message> = bodies.iter().map(|b| Message::new(b.to_string())).collect();
    Frame::Publish {
        topic: topic.into(),
        partition: None,
        records: RecordBatch::from_messages(&messages).unwrap(),
    }
}

/// The next DELIVER, skipping pings and replies to earlier requests.
async fn next_delivery(raw: &mut Raw) -> Vec<(u64, u16)> {
    loop {
        let (_, frame) = raw.recv().await.expect("connection open");
        if let Frame::Deliver { deliveries, .. } = frame {
            return deliveries.iter().map(|d| (d.offset, d.attempt)).collect();
        }
    }
}

/// Sends `frame` with the next request id and returns the answer.
async fn ask(raw: &mut Raw, id: &mut u32, frame: Frame) -> Frame {
    *id += 1;
    raw.request(*id, &frame).await.1
}

fn range(offset: u64, count: u32) -> Vec<OffsetRange> {
    vec![OffsetRange {
        partition: 0,
        offset,
        count,
    }]
}

#[tokio::test]
async fn a_version_1_client_does_everything_it_could_against_the_newest_server() {
    let server = TestServer::default().await;
    let mut v1 = Raw::hello_as(server.addr, 1).await;
    let mut id = 10;

    // CREATE_TOPIC with version 1's 35-byte config; a version 1 client that sets nothing says
    // memory and drop-oldest.
    let config = TopicConfig {
        partitions: 1,
        storage: Storage::Memory,
        ..TopicConfig::default()
    };
    let create = Frame::CreateTopic {
        name: "old".into(),
        config,
        if_not_exists: false,
    };
    assert_eq!(ask(&mut v1, &mut id, create).await, Frame::Ok);

    // DESCRIBE_TOPIC and LIST_TOPICS read back in version 1's layout.
    let info = match ask(
        &mut v1,
        &mut id,
        Frame::DescribeTopic { name: "old".into() },
    )
    .await
    {
        Frame::TopicInfo(info) => info,
        other => panic!("{other:?}"),
    };
    assert_eq!(info.config.storage, Storage::Memory);
    assert_eq!(info.config.partitions, 1);
    // Version 1 has no retention policy or dedup window on the wire: they read as defaults.
    assert_eq!(info.config.retention_policy, RetentionPolicy::Default);
    assert_eq!(info.config.dedup_window_ms, 0);
    match ask(&mut v1, &mut id, Frame::ListTopics).await {
        Frame::TopicList { topics } => assert_eq!(topics.len(), 1),
        other => panic!("{other:?}"),
    }

    // PUBLISH, then a subscription that starts after the first two messages.
    assert!(matches!(
        ask(&mut v1, &mut id, publish("old", &["a", "b"])).await,
        Frame::Published { .. }
    ));
    let late = subscribe("old", "late", StartPosition::Latest, 0);
    let late_id = match ask(&mut v1, &mut id, late).await {
        Frame::Subscribed { consumer_id, .. } => consumer_id,
        other => panic!("{other:?}"),
    };
    assert!(matches!(
        ask(&mut v1, &mut id, publish("old", &["c", "d", "e"])).await,
        Frame::Published { .. }
    ));
    let consumer_id = match ask(
        &mut v1,
        &mut id,
        subscribe("old", "work", StartPosition::Earliest, 8),
    )
    .await
    {
        Frame::Subscribed { consumer_id, .. } => consumer_id,
        other => panic!("{other:?}"),
    };
    let delivered = next_delivery(&mut v1).await;
    assert_eq!(delivered.first(), Some(&(0, 1)));

    // MESSAGE_STATUS: message 0-0 lies before where "late" started. Version 2 says before_start;
    // version 1 has no such state and reads settled, as its docs promised for such messages.
    let status = Frame::MessageStatus {
        topic: "old".into(),
        partition: 0,
        offset: 0,
    };
    let reply = ask(&mut v1, &mut id, status.clone()).await;
    let Frame::MessageStatusReply(old_view) = reply else {
        panic!("{reply:?}")
    };
    let state_of = |status: &ferrymq_protocol::MessageStatus, name: &str| {
        status
            .subscriptions
            .iter()
            .find(|s| s.subscription == name)
            .map(|s| s.entry.state)
    };
    assert_eq!(state_of(&old_view, "late"), Some(MessageState::Settled));
    assert_eq!(state_of(&old_view, "work"), Some(MessageState::InFlight));
    let mut v2 = Raw::hello(server.addr).await;
    let reply = v2.request(2, &status).await.1;
    let Frame::MessageStatusReply(new_view) = reply else {
        panic!("{reply:?}")
    };
    assert_eq!(state_of(&new_view, "late"), Some(MessageState::BeforeStart));

    // ACK, ACK_RESULT and a NACK without the release flag (version 1 has none).
    let ack = Frame::Ack {
        consumer_id,
        ranges: range(0, 1),
    };
    assert_eq!(ask(&mut v1, &mut id, ack).await, Frame::Ok);
    let ack_result = Frame::AckResult {
        consumer_id,
        result: Bytes::from_static(b"done"),
        ranges: range(1, 1),
    };
    assert_eq!(ask(&mut v1, &mut id, ack_result).await, Frame::Ok);
    let nack = Frame::Nack {
        consumer_id,
        delay_ms: 0,
        dead_letter: true,
        release: false,
        reason: "unreadable".into(),
        ranges: range(2, 1),
    };
    assert_eq!(ask(&mut v1, &mut id, nack).await, Frame::Ok);
    let credit = Frame::Credit {
        consumer_id,
        credit: 1,
    };
    assert_eq!(ask(&mut v1, &mut id, credit).await, Frame::Ok);

    // LIST_MESSAGES, STATS, REQUEUE_DEAD, PING.
    let list = Frame::ListMessages {
        topic: "old".into(),
        subscription: "work".into(),
        kind: ListKind::Acked,
        page: Bytes::new(),
        limit: 10,
    };
    match ask(&mut v1, &mut id, list).await {
        Frame::MessageList { entries, .. } => assert_eq!(entries.len(), 2),
        other => panic!("{other:?}"),
    }
    match ask(
        &mut v1,
        &mut id,
        Frame::Stats {
            topic: "old".into(),
        },
    )
    .await
    {
        Frame::StatsReply { topics } => assert_eq!(topics[0].name, "old"),
        other => panic!("{other:?}"),
    }
    let requeue = Frame::RequeueDead {
        dead_letter_topic: "old.dlq".into(),
        selection: RequeueSelection::All,
    };
    assert!(matches!(
        ask(&mut v1, &mut id, requeue).await,
        Frame::Requeued { requeued: 1, .. }
    ));
    assert_eq!(ask(&mut v1, &mut id, Frame::Ping).await, Frame::Pong);

    // A topic created by a newer client reads in version 1's layout too.
    let newer = Frame::CreateTopic {
        name: "new".into(),
        config: TopicConfig {
            retention_policy: RetentionPolicy::Stream,
            dedup_window_ms: 5_000,
            ..TopicConfig::default()
        },
        if_not_exists: false,
    };
    assert_eq!(v2.request(3, &newer).await.1, Frame::Ok);
    match ask(&mut v1, &mut id, Frame::ListTopics).await {
        Frame::TopicList { topics } => assert_eq!(topics.len(), 3, "{topics:?}"),
        other => panic!("{other:?}"),
    }

    // UNSUBSCRIBE, DELETE_SUBSCRIPTION, DELETE_TOPIC.
    for consumer_id in [consumer_id, late_id] {
        let unsubscribe = Frame::Unsubscribe { consumer_id };
        assert_eq!(ask(&mut v1, &mut id, unsubscribe).await, Frame::Ok);
    }
    let delete_subscription = Frame::DeleteSubscription {
        topic: "old".into(),
        subscription: "late".into(),
    };
    assert_eq!(ask(&mut v1, &mut id, delete_subscription).await, Frame::Ok);
    for name in ["old", "new", "old.dlq"] {
        let delete = Frame::DeleteTopic { name: name.into() };
        assert_eq!(ask(&mut v1, &mut id, delete).await, Frame::Ok, "{name}");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_version_1_client_writing_a_newer_layout_is_told_which_version_it_agreed() {
    let server = TestServer::default().await;
    let mut v1 = Raw::hello_as(server.addr, 1).await;
    // A CREATE_TOPIC in version 2's layout (44-byte config) on a version 1 connection.
    let create = Frame::CreateTopic {
        name: "t".into(),
        config: TopicConfig::default(),
        if_not_exists: false,
    };
    let mut bytes = bytes::BytesMut::new();
    create.encode_as(PROTOCOL_VERSION, 5, &mut bytes);
    v1.send_bytes(&bytes).await;
    let (header, reply) = v1.recv().await.expect("an error before the close");
    assert_eq!(header.request_id, 5);
    assert_eq!(error_code(&reply), Some(ErrorCode::MalformedFrame));
    let Frame::Error { message, .. } = reply else {
        unreachable!()
    };
    assert!(message.contains("protocol version 1"), "{message}");
    assert!(v1.closed().await);

    // A NACK with the release flag, which version 1 does not have.
    let mut v1 = Raw::hello_as(server.addr, 1).await;
    let nack = Frame::Nack {
        consumer_id: 1,
        delay_ms: 0,
        dead_letter: false,
        release: true,
        reason: String::new(),
        ranges: range(0, 1),
    };
    let mut bytes = bytes::BytesMut::new();
    nack.encode_as(PROTOCOL_VERSION, 6, &mut bytes);
    v1.send_bytes(&bytes).await;
    let (_, reply) = v1.recv().await.expect("an error before the close");
    assert_eq!(error_code(&reply), Some(ErrorCode::MalformedFrame));
    assert!(v1.closed().await);

    // The broker is unaffected: a client of the newest version creates the topic.
    let mut v2 = Raw::hello(server.addr).await;
    assert_eq!(v2.request(2, &create).await.1, Frame::Ok);
    server.shutdown().await;
}

#[tokio::test]
async fn versions_outside_the_servers_range_are_refused_naming_both() {
    let server = TestServer::start(ServerConfig::default()).await;
    for (min, max, expect) in [
        (PROTOCOL_VERSION + 1, PROTOCOL_VERSION + 5, "offered"),
        (0, 0, "offered 0..=0"),
        (2, 1, "version_min is above version_max"),
    ] {
        let mut raw = Raw::connect(server.addr).await;
        let hello = Frame::Hello {
            version_min: min,
            version_max: max,
            heartbeat_ms: 0,
            client_name: "c".into(),
            user: String::new(),
            password: String::new(),
        };
        let (_, reply) = raw.request(1, &hello).await;
        assert_eq!(error_code(&reply), Some(ErrorCode::UnsupportedVersion));
        let Frame::Error { message, .. } = reply else {
            unreachable!()
        };
        assert!(
            message.contains(&format!("versions 1..={PROTOCOL_VERSION}")),
            "{message}"
        );
        assert!(message.contains(expect), "{message}");
        assert!(raw.closed().await);
    }
    // Each client of a supported version still gets its own.
    for version in 1..=PROTOCOL_VERSION {
        let mut raw = Raw::hello_as(server.addr, version).await;
        assert_eq!(raw.request(2, &Frame::Ping).await.1, Frame::Pong);
    }
    server.shutdown().await;
}
