//! The operator's requests end to end over the binary protocol: listing and closing
//! connections, purging a topic under its consumers, pausing and resuming a subscription, and a
//! version 2 connection that does not know them.

mod common;

use common::{error_code, Raw, TestServer};
use ferrymq_protocol::{
    opcode, ErrorCode, Frame, Message, RecordBatch, StartPosition, SubscribeRequest, TopicConfig,
};

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

fn publish(topic: &str, count: usize) -> Frame {
    let messages: Vec<Message> = (0..count).map(|i| Message::new(format!("m{i}"))).collect();
    Frame::Publish {
        topic: topic.into(),
        partition: None,
        records: RecordBatch::from_messages(&messages).unwrap(),
    }
}

/// The offsets of the next DELIVER, skipping pings and replies.
async fn next_delivery(raw: &mut Raw) -> Vec<u64> {
    loop {
        let (_, frame) = raw.recv().await.expect("connection open");
        if let Frame::Deliver { deliveries, .. } = frame {
            return deliveries.iter().map(|d| d.offset).collect();
        }
    }
}

async fn create(raw: &mut Raw, topic: &str) {
    let create = Frame::CreateTopic {
        name: topic.into(),
        config: TopicConfig::default(),
        if_not_exists: false,
    };
    assert_eq!(raw.request(2, &create).await.1, Frame::Ok);
}

#[tokio::test]
async fn connections_are_listed_with_their_counters_and_one_can_be_closed() {
    let server = TestServer::default().await;
    let mut admin = Raw::hello(server.addr).await;
    let mut worker = Raw::hello(server.addr).await;
    create(&mut admin, "orders").await;
    assert!(matches!(
        worker.request(3, &publish("orders", 3)).await.1,
        Frame::Published { .. }
    ));
    assert!(matches!(
        worker
            .request(4, &subscribe("orders", "billing", 2))
            .await
            .1,
        Frame::Subscribed { .. }
    ));
    assert_eq!(next_delivery(&mut worker).await, vec![0, 1]);

    let (_, reply) = admin
        .request(
            5,
            &Frame::ListConnections {
                after: 0,
                limit: 10,
            },
        )
        .await;
    let Frame::ConnectionList {
        total,
        next_after,
        connections,
    } = reply
    else {
        panic!("{reply:?}");
    };
    assert_eq!((total, next_after, connections.len()), (2, 0, 2));
    let listed = &connections[1];
    assert_eq!(listed.client_name, format!("test-v{}", worker.version));
    assert!(!listed.tls);
    assert_eq!(listed.peer, worker.stream.local_addr().unwrap().to_string());
    assert_eq!((listed.messages_in, listed.messages_out), (3, 2));
    assert_eq!((listed.subscriptions, listed.consumers), (1, 1));
    assert_eq!((listed.credit, listed.unacked), (0, 2));
    assert!(listed.bytes_in > 0 && listed.bytes_out > 0);

    // A page of one, then the next.
    let (_, first) = admin
        .request(6, &Frame::ListConnections { after: 0, limit: 1 })
        .await;
    let Frame::ConnectionList {
        next_after,
        connections,
        ..
    } = first
    else {
        panic!("{first:?}");
    };
    assert_eq!(next_after, connections[0].id);

    let id = listed.id;
    assert_eq!(
        admin.request(7, &Frame::CloseConnection { id }).await.1,
        Frame::Ok
    );
    let mut told = false;
    while let Some((_, frame)) = worker.recv().await {
        told |= error_code(&frame) == Some(ErrorCode::ShuttingDown);
    }
    assert!(told, "the closed connection is told why");
    // The entry goes once the session ends: poll for it, bounded.
    for _ in 0..200 {
        if server.broker.connections().count() == 1 {
            break;
        }
        tokio::task::yield_now().await;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(server.broker.connections().count(), 1);
    let (_, again) = admin.request(8, &Frame::CloseConnection { id }).await;
    assert_eq!(error_code(&again), Some(ErrorCode::InvalidArgument));
    let Frame::Error { message, .. } = again else {
        unreachable!()
    };
    assert!(
        message.contains(&format!("unknown connection {id}")),
        "{message}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_purge_drops_the_backlog_and_attached_consumers_get_what_comes_next() {
    let server = TestServer::default().await;
    let mut raw = Raw::hello(server.addr).await;
    create(&mut raw, "orders").await;
    assert!(matches!(
        raw.request(3, &publish("orders", 5)).await.1,
        Frame::Published { .. }
    ));
    assert!(matches!(
        raw.request(4, &subscribe("orders", "billing", 0)).await.1,
        Frame::Subscribed { .. }
    ));
    let (_, purged) = raw
        .request(
            5,
            &Frame::PurgeTopic {
                name: "orders".into(),
            },
        )
        .await;
    assert_eq!(purged, Frame::Purged { messages: 5 });
    assert!(matches!(
        raw.request(6, &publish("orders", 1)).await.1,
        Frame::Published { .. }
    ));
    raw.send(
        &Frame::Credit {
            consumer_id: 1,
            credit: 10,
        },
        0,
    )
    .await;
    assert_eq!(next_delivery(&mut raw).await, vec![5]);
    let (_, unknown) = raw
        .request(
            7,
            &Frame::PurgeTopic {
                name: "nope".into(),
            },
        )
        .await;
    assert_eq!(error_code(&unknown), Some(ErrorCode::UnknownTopic));
    server.shutdown().await;
}

#[tokio::test]
async fn a_paused_subscription_delivers_nothing_until_resumed() {
    let server = TestServer::default().await;
    let mut raw = Raw::hello(server.addr).await;
    create(&mut raw, "orders").await;
    assert!(matches!(
        raw.request(3, &subscribe("orders", "billing", 0)).await.1,
        Frame::Subscribed { .. }
    ));
    let pause = |paused| Frame::PauseSubscription {
        topic: "orders".into(),
        subscription: "billing".into(),
        paused,
    };
    assert_eq!(raw.request(4, &pause(true)).await.1, Frame::Ok);
    assert!(matches!(
        raw.request(5, &publish("orders", 2)).await.1,
        Frame::Published { .. }
    ));
    raw.send(
        &Frame::Credit {
            consumer_id: 1,
            credit: 10,
        },
        0,
    )
    .await;
    // A request answered after the credit: had the consumer not been paused, its DELIVER
    // would have been queued before this reply.
    let (_, reply) = raw
        .request(
            6,
            &Frame::Stats {
                topic: "orders".into(),
            },
        )
        .await;
    assert!(
        matches!(reply, Frame::StatsReply { .. }),
        "no delivery while paused: {reply:?}"
    );
    assert_eq!(
        server.broker.subscription_paused("orders", "billing"),
        Ok(true)
    );
    assert_eq!(raw.request(7, &pause(false)).await.1, Frame::Ok);
    assert_eq!(next_delivery(&mut raw).await, vec![0, 1]);
    let missing = Frame::PauseSubscription {
        topic: "orders".into(),
        subscription: "nobody".into(),
        paused: true,
    };
    let (_, unknown) = raw.request(8, &missing).await;
    assert_eq!(error_code(&unknown), Some(ErrorCode::UnknownSubscription));
    server.shutdown().await;
}

#[tokio::test]
async fn a_version_2_connection_does_not_know_the_operator_opcodes() {
    let server = TestServer::default().await;
    for op in [
        opcode::LIST_CONNECTIONS,
        opcode::CLOSE_CONNECTION,
        opcode::PURGE_TOPIC,
        opcode::PAUSE_SUBSCRIPTION,
    ] {
        let mut raw = Raw::hello_as(server.addr, 2).await;
        let mut bytes = Vec::new();
        bytes.extend(0u32.to_le_bytes());
        bytes.extend(op.to_le_bytes());
        bytes.extend(0u16.to_le_bytes());
        bytes.extend(9u32.to_le_bytes());
        raw.send_bytes(&bytes).await;
        let (header, reply) = raw.recv().await.expect("an answer");
        assert_eq!(header.request_id, 9);
        assert_eq!(
            error_code(&reply),
            Some(ErrorCode::UnknownOpcode),
            "{op:#x}: {reply:?}"
        );
        assert!(raw.closed().await);
    }
    server.shutdown().await;
}

/// Connects and says HELLO as `user`.
async fn hello_as_user(addr: std::net::SocketAddr, user: &str, password: &str) -> Raw {
    let mut raw = Raw::connect(addr).await;
    let hello = Frame::Hello {
        version_min: 3,
        version_max: 3,
        heartbeat_ms: 0,
        client_name: "rights-test/1".into(),
        user: user.into(),
        password: password.into(),
    };
    let (_, reply) = raw.request(1, &hello).await;
    assert!(matches!(reply, Frame::HelloOk { .. }), "{reply:?}");
    raw
}

#[tokio::test]
async fn a_user_without_the_right_is_refused_and_nothing_changes() {
    use ferrymq_broker::auth::{ACTION_PUBLISH, ROLE_ADMIN};
    let server = TestServer::default().await;
    let auth = server.broker.auth();
    auth.add_user("root", "root-password", ROLE_ADMIN).unwrap();
    auth.add_user("bob", "bob-password", 0).unwrap();
    auth.grant("bob", "orders", ACTION_PUBLISH, 0).unwrap();
    let mut root = hello_as_user(server.addr, "root", "root-password").await;
    create(&mut root, "orders").await;
    assert!(matches!(
        root.request(3, &publish("orders", 2)).await.1,
        Frame::Published { .. }
    ));
    assert!(matches!(
        root.request(4, &subscribe("orders", "billing", 0)).await.1,
        Frame::Subscribed { .. }
    ));
    let mut bob = hello_as_user(server.addr, "bob", "bob-password").await;
    let refused = [
        Frame::ListConnections {
            after: 0,
            limit: 10,
        },
        Frame::CloseConnection { id: 1 },
        Frame::PurgeTopic {
            name: "orders".into(),
        },
        Frame::PauseSubscription {
            topic: "orders".into(),
            subscription: "billing".into(),
            paused: true,
        },
    ];
    for (i, frame) in refused.iter().enumerate() {
        let (_, reply) = bob.request(10 + i as u32, frame).await;
        assert_eq!(
            error_code(&reply),
            Some(ErrorCode::Forbidden),
            "{frame:?}: {reply:?}"
        );
    }
    // Nothing changed: both connections open, the messages kept, the subscription running.
    assert_eq!(server.broker.connections().count(), 2);
    assert_eq!(
        server.broker.subscription_paused("orders", "billing"),
        Ok(false)
    );
    let (_, purged) = root
        .request(
            20,
            &Frame::PurgeTopic {
                name: "orders".into(),
            },
        )
        .await;
    assert_eq!(purged, Frame::Purged { messages: 2 });
    server.shutdown().await;
}
