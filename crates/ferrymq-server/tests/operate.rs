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
    hello_as_user_in(addr, user, password, 3).await
}

/// Connects and says HELLO as `user`, offering only protocol `version`.
async fn hello_as_user_in(
    addr: std::net::SocketAddr,
    user: &str,
    password: &str,
    version: u16,
) -> Raw {
    let mut raw = Raw::connect(addr).await;
    let hello = Frame::Hello {
        version_min: version,
        version_max: version,
        heartbeat_ms: 0,
        client_name: "rights-test/1".into(),
        user: user.into(),
        password: password.into(),
    };
    let (_, reply) = raw.request(1, &hello).await;
    assert!(matches!(reply, Frame::HelloOk { .. }), "{reply:?}");
    raw.version = version;
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

/// The refusal's message, for a frame that must be ERROR `forbidden`.
fn forbidden_message(reply: &Frame) -> &str {
    match reply {
        Frame::Error { code, message } if *code == ErrorCode::Forbidden as u16 => message,
        other => panic!("not forbidden: {other:?}"),
    }
}

#[tokio::test]
async fn purge_and_pause_are_grants_of_their_own() {
    use ferrymq_broker::auth::{ACTION_PAUSE, ACTION_PURGE, ROLE_ADMIN};
    let server = TestServer::default().await;
    let auth = server.broker.auth();
    auth.add_user("root", "root-password", ROLE_ADMIN).unwrap();
    auth.add_user("purger", "purger-password", 0).unwrap();
    auth.add_user("pauser", "pauser-password", 0).unwrap();
    auth.grant("purger", "orders", ACTION_PURGE, 0).unwrap();
    auth.grant("pauser", "orders", ACTION_PAUSE, 0).unwrap();
    let mut root = hello_as_user(server.addr, "root", "root-password").await;
    create(&mut root, "orders").await;
    assert!(matches!(
        root.request(3, &subscribe("orders", "billing", 0)).await.1,
        Frame::Subscribed { .. }
    ));
    assert!(matches!(
        root.request(4, &publish("orders", 2)).await.1,
        Frame::Published { .. }
    ));
    let purge = Frame::PurgeTopic {
        name: "orders".into(),
    };
    let pause = Frame::PauseSubscription {
        topic: "orders".into(),
        subscription: "billing".into(),
        paused: true,
    };
    let delete_topic = Frame::DeleteTopic {
        name: "orders".into(),
    };
    let delete_subscription = Frame::DeleteSubscription {
        topic: "orders".into(),
        subscription: "billing".into(),
    };

    // Purge alone: purges, deletes nothing, pauses nothing.
    let mut purger = hello_as_user(server.addr, "purger", "purger-password").await;
    assert_eq!(
        purger.request(10, &purge).await.1,
        Frame::Purged { messages: 2 }
    );
    let (_, reply) = purger.request(11, &delete_topic).await;
    assert_eq!(
        forbidden_message(&reply),
        "user 'purger' may not manage topic 'orders'"
    );
    let (_, reply) = purger.request(12, &pause).await;
    assert_eq!(
        forbidden_message(&reply),
        "user 'purger' may not pause subscriptions of topic 'orders' (needs the pause or manage action)"
    );
    assert_eq!(
        server.broker.subscription_paused("orders", "billing"),
        Ok(false)
    );

    // Pause alone: pauses and resumes, purges and deletes nothing.
    let mut pauser = hello_as_user(server.addr, "pauser", "pauser-password").await;
    assert_eq!(pauser.request(20, &pause).await.1, Frame::Ok);
    assert_eq!(
        server.broker.subscription_paused("orders", "billing"),
        Ok(true)
    );
    let (_, reply) = pauser.request(21, &purge).await;
    assert_eq!(
        forbidden_message(&reply),
        "user 'pauser' may not purge topic 'orders' (needs the purge or manage action)"
    );
    let (_, reply) = pauser.request(22, &delete_subscription).await;
    assert_eq!(
        forbidden_message(&reply),
        "user 'pauser' may not manage topic 'orders'"
    );
    assert!(server
        .broker
        .list_topics()
        .iter()
        .any(|t| t.name == "orders"));
    server.shutdown().await;
}

#[tokio::test]
async fn purge_and_pause_grants_reach_version_3_connections_only() {
    use ferrymq_broker::auth::{ACTION_INSPECT, ACTION_PURGE, ROLE_ADMIN};
    use ferrymq_protocol::UserEntry;
    let server = TestServer::default().await;
    let auth = server.broker.auth();
    auth.add_user("root", "root-password", ROLE_ADMIN).unwrap();
    auth.add_user("oncall", "oncall-password", 0).unwrap();
    let grant = |user: &str, pattern: &str, actions: u8| Frame::Grant {
        user: user.into(),
        pattern: pattern.into(),
        actions,
        roles: 0,
    };
    let mut v3 = hello_as_user(server.addr, "root", "root-password").await;
    assert_eq!(
        v3.request(2, &grant("oncall", "orders", ACTION_INSPECT | ACTION_PURGE))
            .await
            .1,
        Frame::Ok
    );
    assert_eq!(
        v3.request(3, &grant("oncall", "audit", 32)).await.1,
        Frame::Ok
    );
    let oncall = |users: Vec<UserEntry>| {
        let mut grants = users
            .into_iter()
            .find(|u| u.name == "oncall")
            .expect("oncall listed")
            .grants;
        grants.sort();
        grants
    };
    let Frame::UserListReply { users } = v3.request(4, &Frame::UserList).await.1 else {
        panic!("no listing")
    };
    assert_eq!(
        oncall(users),
        vec![("audit".to_owned(), 32), ("orders".to_owned(), 20)]
    );

    // A version 2 connection knows neither bit: it may not grant them, and its listing shows
    // what it knows of each grant (a grant of only pause not at all).
    let mut v2 = hello_as_user_in(server.addr, "root", "root-password", 2).await;
    let (_, refused) = v2
        .request(5, &grant("oncall", "orders", ACTION_PURGE))
        .await;
    assert_eq!(
        error_code(&refused),
        Some(ErrorCode::InvalidArgument),
        "{refused:?}"
    );
    let Frame::UserListReply { users } = v2.request(6, &Frame::UserList).await.1 else {
        panic!("no listing")
    };
    assert_eq!(oncall(users), vec![("orders".to_owned(), ACTION_INSPECT)]);
    server.shutdown().await;
}

#[tokio::test]
async fn statistics_say_paused_to_version_3_connections() {
    let server = TestServer::default().await;
    let mut v3 = Raw::hello(server.addr).await;
    create(&mut v3, "orders").await;
    for (i, name) in ["billing", "shipping"].into_iter().enumerate() {
        assert!(matches!(
            v3.request(3 + i as u32, &subscribe("orders", name, 0))
                .await
                .1,
            Frame::Subscribed { .. }
        ));
    }
    let pause = Frame::PauseSubscription {
        topic: "orders".into(),
        subscription: "billing".into(),
        paused: true,
    };
    assert_eq!(v3.request(5, &pause).await.1, Frame::Ok);
    let stats = Frame::Stats {
        topic: "orders".into(),
    };
    let paused_of = |reply: Frame| match reply {
        Frame::StatsReply { topics } => {
            let mut subscriptions: Vec<(String, bool)> = topics[0]
                .subscriptions
                .iter()
                .map(|s| (s.name.clone(), s.paused))
                .collect();
            subscriptions.sort();
            subscriptions
        }
        other => panic!("not statistics: {other:?}"),
    };
    assert_eq!(
        paused_of(v3.request(6, &stats).await.1),
        vec![("billing".to_owned(), true), ("shipping".to_owned(), false)]
    );
    // A version 2 connection reads the version 2 layout, whole (Raw decodes it as version 2 and
    // refuses a trailing byte), without the field.
    let mut v2 = Raw::hello_as(server.addr, 2).await;
    assert_eq!(
        paused_of(v2.request(7, &stats).await.1),
        vec![
            ("billing".to_owned(), false),
            ("shipping".to_owned(), false)
        ]
    );
    server.shutdown().await;
}
