//! The server at the frame level: handshake, request ids, malformed input and limits, over real
//! sockets on 127.0.0.1.

mod common;

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use common::{error_code, hello_frame, Raw, TestServer};
use ferrymq_protocol::{
    ErrorCode, Frame, Message, OffsetRange, RecordBatch, StartPosition, SubscribeRequest,
    TopicConfig,
};
use ferrymq_server::ServerConfig;

fn publish(topic: &str, messages: &[Message]) -> Frame {
    Frame::Publish {
        topic: topic.into(),
        partition: None,
        records: RecordBatch::from_messages(messages).unwrap(),
    }
}

fn subscribe(topic: &str, subscription: &str, credit: u32) -> Frame {
    Frame::Subscribe(SubscribeRequest {
        topic: topic.into(),
        subscription: subscription.into(),
        start: StartPosition::Earliest,
        ack_timeout_ms: 0,
        max_attempts: 0,
        credit,
        auto_ack: false,
        ordered: false,
        partitions: Vec::new(),
        dead_letter_topic: String::new(),
    })
}

#[tokio::test]
async fn a_request_before_hello_is_refused_and_the_connection_closed() {
    let server = TestServer::default().await;
    let mut raw = Raw::connect(server.addr).await;
    let (header, reply) = raw.request(7, &Frame::ListTopics).await;
    assert_eq!(header.request_id, 7);
    assert_eq!(error_code(&reply), Some(ErrorCode::HandshakeRequired));
    assert!(raw.closed().await);
    server.shutdown().await;
}

#[tokio::test]
async fn unsupported_versions_are_refused() {
    let server = TestServer::default().await;
    let mut raw = Raw::connect(server.addr).await;
    let hello = Frame::Hello {
        version_min: 4,
        version_max: 5,
        heartbeat_ms: 0,
        client_name: "future".into(),
        user: String::new(),
        password: String::new(),
    };
    let (_, reply) = raw.request(1, &hello).await;
    assert_eq!(error_code(&reply), Some(ErrorCode::UnsupportedVersion));
    assert!(raw.closed().await);
    server.shutdown().await;
}

#[tokio::test]
async fn hello_negotiates_heartbeat_and_limits() {
    let server = TestServer::default().await;
    let mut raw = Raw::connect(server.addr).await;
    let hello = Frame::Hello {
        version_min: 1,
        version_max: 9,
        heartbeat_ms: 1,
        client_name: "c".into(),
        user: String::new(),
        password: String::new(),
    };
    let (_, reply) = raw.request(1, &hello).await;
    let Frame::HelloOk {
        version,
        heartbeat_ms,
        message_bytes_max,
        frame_bytes_max,
        ..
    } = reply
    else {
        panic!("{reply:?}")
    };
    assert_eq!(
        version,
        ferrymq_protocol::limits::PROTOCOL_VERSION,
        "the highest in common"
    );
    assert_eq!(heartbeat_ms, 100, "clamped to the minimum");
    assert_eq!(message_bytes_max, 256 * 1024);
    assert!(
        frame_bytes_max as usize >= ferrymq_protocol::limits::frame_bytes_needed(message_bytes_max)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_malformed_frame_closes_only_its_connection() {
    let server = TestServer::default().await;
    let mut good = Raw::hello(server.addr).await;
    let mut bad = Raw::hello(server.addr).await;
    // A PUBLISH whose record claims more body than the frame holds.
    let mut frame = BytesMut::new();
    Frame::Publish {
        topic: "t".into(),
        partition: None,
        records: RecordBatch::from_messages(&[Message::new("hello")]).unwrap(),
    }
    .encode(5, &mut frame);
    let body_len_at = frame.len() - 5 - 4;
    frame[body_len_at..body_len_at + 4].copy_from_slice(&100u32.to_le_bytes());
    bad.send_bytes(&frame).await;
    let (header, reply) = bad.recv().await.expect("an error before closing");
    assert_eq!(header.request_id, 5);
    assert_eq!(error_code(&reply), Some(ErrorCode::MalformedFrame));
    let Frame::Error { message, .. } = &reply else {
        unreachable!()
    };
    assert!(
        message.contains("record.body"),
        "the error names the field: {message}"
    );
    assert!(bad.closed().await);

    // Garbage flags in a header, on another connection.
    let mut flags = Raw::hello(server.addr).await;
    let mut header = BytesMut::new();
    header.put_u32_le(0);
    header.put_u16_le(0x02);
    header.put_u16_le(0xffff);
    header.put_u32_le(3);
    flags.send_bytes(&header).await;
    let (_, reply) = flags.recv().await.unwrap();
    assert_eq!(error_code(&reply), Some(ErrorCode::MalformedFrame));
    assert!(flags.closed().await);

    // The good connection is untouched.
    let (_, reply) = good
        .request(9, &publish("t", &[Message::new("still fine")]))
        .await;
    assert!(matches!(reply, Frame::Published { .. }), "{reply:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn unknown_opcodes_and_server_frames_are_refused() {
    let server = TestServer::default().await;
    let mut raw = Raw::hello(server.addr).await;
    let mut frame = BytesMut::new();
    frame.put_u32_le(0);
    frame.put_u16_le(0x7f);
    frame.put_u16_le(0);
    frame.put_u32_le(4);
    raw.send_bytes(&frame).await;
    let (_, reply) = raw.recv().await.unwrap();
    assert_eq!(error_code(&reply), Some(ErrorCode::UnknownOpcode));
    assert!(raw.closed().await);

    let mut raw = Raw::hello(server.addr).await;
    let (_, reply) = raw.request(2, &Frame::Ok).await;
    assert_eq!(error_code(&reply), Some(ErrorCode::MalformedFrame));
    assert!(raw.closed().await);
    server.shutdown().await;
}

#[tokio::test]
async fn an_oversize_frame_is_refused_from_its_header() {
    let mut config = ServerConfig::default();
    config.broker.message_body_bytes_max = 1024;
    config.frame_bytes_max = 0; // smallest frame that fits the largest message
    let server = TestServer::start(config).await;
    let mut raw = Raw::hello(server.addr).await;
    // Announce a 1 GiB frame and send only its header: the refusal must not wait for the body.
    let mut header = BytesMut::new();
    header.put_u32_le(1 << 30);
    header.put_u16_le(0x20);
    header.put_u16_le(0);
    header.put_u32_le(11);
    raw.send_bytes(&header).await;
    let (_, reply) = raw.recv().await.unwrap();
    assert_eq!(error_code(&reply), Some(ErrorCode::FrameTooLarge));
    assert!(raw.closed().await);
    server.shutdown().await;
}

#[tokio::test]
async fn statistics_above_the_frame_limit_are_refused_and_the_connection_stays() {
    let mut config = ServerConfig::default();
    config.broker.message_body_bytes_max = 16;
    config.frame_bytes_max = 0; // the smallest: the largest ACK_RESULT frame, about 1 MB
    let frame_max = config.effective_frame_bytes_max();
    assert_eq!(frame_max, ferrymq_protocol::limits::ACK_FRAME_BYTES_MAX);
    let server = TestServer::start(config).await;
    let mut raw = Raw::hello(server.addr).await;
    // Each topic's entry takes 78 bytes: these do not fit one frame.
    let topics = (frame_max / 78 + 1) as u32;
    for i in 0..topics {
        let (_, reply) = raw
            .request(
                10 + i,
                &publish(&format!("topic-{i:02}"), &[Message::new("m")]),
            )
            .await;
        assert!(matches!(reply, Frame::Published { .. }), "{reply:?}");
    }
    let (_, reply) = raw.request(40, &Frame::Stats { topic: "".into() }).await;
    // The error names the limit; the request is refused, not the connection.
    assert_eq!(
        error_code(&reply),
        Some(ErrorCode::FrameTooLarge),
        "{reply:?}"
    );
    let Frame::Error { message, .. } = reply else {
        unreachable!()
    };
    assert!(
        message.contains(&frame_max.to_string()) && message.contains("one topic at a time"),
        "{message}"
    );
    let (_, reply) = raw
        .request(
            41,
            &Frame::Stats {
                topic: "topic-07".into(),
            },
        )
        .await;
    let Frame::StatsReply { topics } = reply else {
        panic!("{reply:?}")
    };
    assert_eq!((topics.len(), topics[0].messages_in), (1, 1));
    server.shutdown().await;
}

#[tokio::test]
async fn the_largest_ack_fits_the_smallest_frame_limit() {
    let mut config = ServerConfig::default();
    config.broker.message_body_bytes_max = 16;
    config.frame_bytes_max = 0;
    let server = TestServer::start(config).await;
    let mut raw = Raw::hello(server.addr).await;
    let ranges = (0..ferrymq_protocol::limits::RANGES_COUNT_MAX as u64)
        .map(|i| OffsetRange::single(0, 2 * i))
        .collect();
    let (_, reply) = raw
        .request(
            5,
            &Frame::AckResult {
                consumer_id: 9,
                result: vec![b'r'; ferrymq_protocol::limits::ACK_RESULT_BYTES_MAX].into(),
                ranges,
            },
        )
        .await;
    // Decoded and answered (no such consumer), not refused as too large.
    assert_eq!(
        error_code(&reply),
        Some(ErrorCode::UnknownConsumer),
        "{reply:?}"
    );
    let (_, reply) = raw.request(6, &Frame::Ping).await;
    assert!(matches!(reply, Frame::Pong), "{reply:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn an_oversize_message_gets_a_clear_error_and_the_connection_stays() {
    let mut config = ServerConfig::default();
    config.broker.message_body_bytes_max = 1000;
    let server = TestServer::start(config).await;
    let mut raw = Raw::hello(server.addr).await;
    let (_, reply) = raw
        .request(
            3,
            &publish(
                "t",
                &[Message::new(vec![0u8; 10]), Message::new(vec![0u8; 1001])],
            ),
        )
        .await;
    assert_eq!(error_code(&reply), Some(ErrorCode::MessageTooLarge));
    let Frame::Error { message, .. } = reply else {
        unreachable!()
    };
    assert!(
        message.contains("message 1") && message.contains("1000"),
        "{message}"
    );
    let (_, reply) = raw
        .request(4, &Frame::DescribeTopic { name: "t".into() })
        .await;
    let Frame::TopicInfo(info) = reply else {
        panic!("{reply:?}")
    };
    assert_eq!(info.messages, 0, "nothing of the refused batch was stored");
    server.shutdown().await;
}

#[tokio::test]
async fn connections_beyond_the_limit_are_told_why() {
    let config = ServerConfig {
        connections_max: 2,
        ..Default::default()
    };
    let server = TestServer::start(config).await;
    let _a = Raw::hello(server.addr).await;
    let _b = Raw::hello(server.addr).await;
    let mut c = Raw::connect(server.addr).await;
    let (_, reply) = c.recv().await.expect("an error frame");
    assert_eq!(error_code(&reply), Some(ErrorCode::TooManyConnections));
    assert!(c.closed().await);
    drop(_a);
    // The freed slot is usable again (the server notices the close asynchronously).
    let mut admitted = false;
    for _ in 0..50 {
        let mut d = Raw::connect(server.addr).await;
        d.send(&hello_frame(), 1).await;
        if let Some((_, Frame::HelloOk { .. })) = d.recv().await {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(admitted);
    server.shutdown().await;
}

#[tokio::test]
async fn pipelined_requests_are_answered_by_id_and_id_zero_is_silent_on_success() {
    let server = TestServer::default().await;
    let mut raw = Raw::hello(server.addr).await;
    raw.send(&publish("t", &[Message::new("a")]), 0).await;
    for id in 10..20u32 {
        raw.send(&publish("t", &[Message::new(format!("{id}"))]), id)
            .await;
    }
    raw.send(
        &Frame::DescribeTopic {
            name: "nope".into(),
        },
        0,
    )
    .await;
    let mut seen = Vec::new();
    for _ in 0..11 {
        let (header, frame) = raw.recv().await.unwrap();
        seen.push((header.request_id, frame));
    }
    let ids: Vec<u32> = seen.iter().map(|(id, _)| *id).collect();
    assert_eq!(&ids[..10], &(10..20).collect::<Vec<_>>()[..]);
    for (i, (_, frame)) in seen[..10].iter().enumerate() {
        let Frame::Published { ranges, .. } = frame else {
            panic!("{frame:?}")
        };
        assert_eq!(ranges, &vec![OffsetRange::single(0, i as u64 + 1)]);
    }
    assert_eq!(ids[10], 0, "an error for a request with id 0 still arrives");
    assert_eq!(error_code(&seen[10].1), Some(ErrorCode::UnknownTopic));
    server.shutdown().await;
}

#[tokio::test]
async fn credit_bounds_deliveries_and_acks_settle() {
    let server = TestServer::default().await;
    let mut raw = Raw::hello(server.addr).await;
    let (_, reply) = raw
        .request(
            1,
            &Frame::CreateTopic {
                name: "q".into(),
                config: TopicConfig::default(),
                if_not_exists: false,
            },
        )
        .await;
    assert_eq!(reply, Frame::Ok);
    let messages: Vec<Message> = (0..10).map(|i| Message::new(format!("{i}"))).collect();
    raw.request(2, &publish("q", &messages)).await;
    let (_, reply) = raw.request(3, &subscribe("q", "work", 3)).await;
    let Frame::Subscribed { consumer_id, .. } = reply else {
        panic!("{reply:?}")
    };

    let mut delivered = Vec::new();
    while delivered.len() < 3 {
        let (_, frame) = raw.recv().await.unwrap();
        if let Frame::Deliver { deliveries, .. } = frame {
            delivered.extend(deliveries.iter());
        }
    }
    assert_eq!(delivered.len(), 3);
    // No more without credit.
    let (_, reply) = raw.request(4, &Frame::Stats { topic: "q".into() }).await;
    let Frame::StatsReply { topics } = reply else {
        panic!()
    };
    assert_eq!(topics[0].subscriptions[0].in_flight, 3);
    assert_eq!(topics[0].subscriptions[0].backlog, 7);

    let ranges = OffsetRange::coalesce(delivered.iter().map(|d| (d.partition, d.offset)));
    raw.send(
        &Frame::Ack {
            consumer_id,
            ranges,
        },
        0,
    )
    .await;
    raw.send(
        &Frame::Credit {
            consumer_id,
            credit: 100,
        },
        0,
    )
    .await;
    let mut more = Vec::new();
    while more.len() < 7 {
        let (_, frame) = raw.recv().await.unwrap();
        if let Frame::Deliver { deliveries, .. } = frame {
            more.extend(deliveries.iter());
        }
    }
    let bodies: Vec<String> = more
        .iter()
        .map(|d| String::from_utf8(d.message.body.to_vec()).unwrap())
        .collect();
    assert_eq!(bodies, ["3", "4", "5", "6", "7", "8", "9"]);
    let (_, reply) = raw
        .request(
            5,
            &Frame::Ack {
                consumer_id: 99,
                ranges: vec![],
            },
        )
        .await;
    assert_eq!(error_code(&reply), Some(ErrorCode::UnknownConsumer));
    server.shutdown().await;
}

#[tokio::test]
async fn a_closed_connection_returns_its_in_flight_messages_at_once() {
    let server = TestServer::default().await;
    let mut first = Raw::hello(server.addr).await;
    first
        .request(1, &publish("q", &[Message::new("job")]))
        .await;
    first.request(2, &subscribe("q", "work", 10)).await;
    loop {
        if let (_, Frame::Deliver { .. }) = first.recv().await.unwrap() {
            break;
        }
    }
    drop(first);
    let mut second = Raw::hello(server.addr).await;
    second.request(1, &subscribe("q", "work", 10)).await;
    loop {
        if let (_, Frame::Deliver { deliveries, .. }) = second.recv().await.unwrap() {
            let d: Vec<_> = deliveries.iter().collect();
            assert_eq!(d[0].message.body, "job");
            assert_eq!(d[0].attempt, 2);
            break;
        }
    }
    server.shutdown().await;
}

#[tokio::test]
async fn the_server_pings_idle_clients_and_drops_silent_ones() {
    let server = TestServer::default().await;
    let mut raw = Raw::connect(server.addr).await;
    let hello = Frame::Hello {
        version_min: 1,
        version_max: 1,
        heartbeat_ms: 100,
        client_name: "c".into(),
        user: String::new(),
        password: String::new(),
    };
    raw.request(1, &hello).await;
    let (header, frame) = raw.recv().await.unwrap();
    assert_eq!(frame, Frame::Ping);
    assert_ne!(header.request_id, 0);
    // Stay silent: within about three intervals the server hangs up.
    let start = std::time::Instant::now();
    assert!(raw.closed().await);
    assert!(start.elapsed() < Duration::from_secs(2));
    server.shutdown().await;
}

#[tokio::test]
async fn shutdown_finishes_requests_already_read() {
    let server = TestServer::default().await;
    let mut raw = Raw::hello(server.addr).await;
    for id in 1..=50u32 {
        raw.send(&publish("t", &[Message::new("x")]), id).await;
    }
    let (header, _) = raw.recv().await.unwrap();
    assert_eq!(header.request_id, 1);
    let broker = server.broker.clone();
    server.shutdown().await;
    let mut answered = 1;
    while let Some((_, frame)) = raw.recv().await {
        if matches!(frame, Frame::Published { .. }) {
            answered += 1;
        }
    }
    let stored = broker.describe_topic("t").unwrap().messages;
    assert_eq!(
        answered, stored,
        "every publish the server stored was acknowledged before it closed"
    );
}
