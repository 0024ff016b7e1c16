//! The client against a scripted fake server: handshake, request matching, pipelining, flow
//! control, heartbeats and connection loss.

mod common;

use std::time::Duration;

use common::{within, FakeServer, STEP};
use ferrymq_client::{
    Client, ClientConfig, Delivery, DeliveryBatch, DeliveryBatchExt, Durability, Error, ErrorCode,
    Message, MessageId, OffsetRange, SubscribeOptions, TopicConfig, TopicInfo,
};
use ferrymq_protocol::{Frame, StartPosition};

fn topic_info(name: &str) -> TopicInfo {
    TopicInfo {
        name: name.into(),
        config: TopicConfig::default(),
        messages: 0,
        bytes: 0,
        subscriptions: vec![],
    }
}

fn delivery(offset: u64, body: &str) -> Delivery {
    Delivery {
        partition: 0,
        offset,
        timestamp_ms: 1_700_000_000_000,
        attempt: 1,
        message: Message::new(body.to_string()),
    }
}

#[tokio::test]
async fn handshake_sends_hello_and_reads_the_server_limits() {
    let server = FakeServer::bind().await;
    let config = ClientConfig::new(server.addr.clone())
        .client_name("tester")
        .credentials("alice", "secret");
    let (client, hello) = tokio::join!(Client::connect_with(config), async {
        let mut peer = server.accept().await;
        let hello = peer.handshake(2_000).await;
        (peer, hello)
    });
    let client = client.expect("connect");
    let (_peer, hello) = hello;
    match hello {
        Frame::Hello {
            version_min,
            version_max,
            heartbeat_ms,
            client_name,
            user,
            password,
        } => {
            assert_eq!(
                (version_min, version_max),
                (
                    ferrymq_protocol::limits::PROTOCOL_VERSION,
                    ferrymq_protocol::limits::PROTOCOL_VERSION
                ),
                "the newest version only"
            );
            assert_eq!(heartbeat_ms, 5_000);
            assert_eq!(
                (client_name.as_str(), user.as_str(), password.as_str()),
                ("tester", "alice", "secret")
            );
        }
        other => panic!("expected HELLO, got {other:?}"),
    }
    assert_eq!(client.server_info().heartbeat_ms, 2_000);
    assert_eq!(client.server_info().message_bytes_max, 256 * 1024);
    assert_eq!(client.server_info().server, "fake-ferrymq/0");
}

#[tokio::test]
async fn refused_handshake_is_a_server_error() {
    let server = FakeServer::bind().await;
    let (client, _) = tokio::join!(Client::connect(server.addr.clone()), async {
        let mut peer = server.accept().await;
        let (header, _) = peer.recv().await;
        peer.send(
            &Frame::error(ErrorCode::AuthenticationFailed, "bad password"),
            header.request_id,
        )
        .await;
        peer
    });
    let error = client.expect_err("handshake must fail");
    assert_eq!(
        error.code(),
        Some(ErrorCode::AuthenticationFailed),
        "{error}"
    );
}

#[tokio::test]
async fn connecting_to_a_closed_port_fails_with_io() {
    let server = FakeServer::bind().await;
    let addr = server.addr.clone();
    drop(server);
    let error = within(Client::connect(addr))
        .await
        .expect_err("nothing listens");
    assert!(matches!(error, Error::Io(_)), "{error}");
}

#[tokio::test]
async fn answers_are_matched_by_request_id_not_by_order() {
    let server = FakeServer::bind().await;
    let (client, peer) = tokio::join!(
        Client::connect(server.addr.clone()),
        server.accept_ready(5_000)
    );
    let client = client.unwrap();
    let mut peer = peer;

    let requests = async {
        tokio::join!(
            client.describe_topic("alpha"),
            client.list_topics(),
            client.create_topic("beta", TopicConfig::default(), true),
            client.describe_topic("gamma"),
        )
    };
    let server_side = async {
        let mut received = Vec::new();
        for _ in 0..4 {
            received.push(peer.recv_skipping_pings().await);
        }
        // Answer in reverse order of arrival.
        for (header, frame) in received.into_iter().rev() {
            let answer = match frame {
                Frame::DescribeTopic { name } if name == "gamma" => {
                    Frame::error(ErrorCode::UnknownTopic, "no topic gamma")
                }
                Frame::DescribeTopic { name } => Frame::TopicInfo(topic_info(&name)),
                Frame::ListTopics => Frame::TopicList {
                    topics: vec![topic_info("x"), topic_info("y")],
                },
                Frame::CreateTopic {
                    name,
                    if_not_exists,
                    ..
                } => {
                    assert_eq!(name, "beta");
                    assert!(if_not_exists);
                    Frame::Ok
                }
                other => panic!("unexpected request {other:?}"),
            };
            peer.send(&answer, header.request_id).await;
        }
    };
    let ((alpha, list, create, gamma), ()) =
        within(async { tokio::join!(requests, server_side) }).await;
    assert_eq!(alpha.unwrap().name, "alpha");
    assert_eq!(
        list.unwrap()
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["x", "y"]
    );
    create.unwrap();
    let gamma = gamma.expect_err("gamma does not exist");
    assert_eq!(gamma.code(), Some(ErrorCode::UnknownTopic));
    assert!(gamma.to_string().contains("no topic gamma"));
}

#[tokio::test]
async fn pipelined_batches_are_all_sent_before_any_receipt() {
    let server = FakeServer::bind().await;
    let (client, peer) = tokio::join!(
        Client::connect(server.addr.clone()),
        server.accept_ready(5_000)
    );
    let client = client.unwrap();
    let mut peer = peer;
    const BATCHES: u64 = 16;
    const PER_BATCH: u64 = 10;

    let mut pending = Vec::new();
    for batch in 0..BATCHES {
        let messages: Vec<Message> = (0..PER_BATCH)
            .map(|i| Message::new(format!("{batch}/{i}")))
            .collect();
        pending.push(
            within(client.send_batch("orders", Some(1), &messages))
                .await
                .unwrap(),
        );
    }
    // The fake server sees every batch while no receipt has been sent yet.
    let mut frames = Vec::new();
    for _ in 0..BATCHES {
        let (header, frame) = peer.recv_skipping_pings().await;
        let Frame::Publish {
            topic,
            partition,
            records,
        } = frame
        else {
            panic!("expected PUBLISH")
        };
        assert_eq!(
            (topic.as_str(), partition, records.count()),
            ("orders", Some(1), PER_BATCH as u32)
        );
        let first = records.messages().next().unwrap();
        frames.push((
            header.request_id,
            String::from_utf8(first.body.to_vec()).unwrap(),
        ));
    }
    // Receipts go back in a scrambled order; batch b gets offsets b*100..
    frames.sort_by_key(|(request_id, _)| (request_id % 3, *request_id));
    for (request_id, first_body) in &frames {
        let batch: u64 = first_body.split('/').next().unwrap().parse().unwrap();
        let ranges = vec![OffsetRange {
            partition: 1,
            offset: batch * 100,
            count: PER_BATCH as u32,
        }];
        peer.send(
            &Frame::Published {
                durability: Durability::Memory,
                ranges,
            },
            *request_id,
        )
        .await;
    }
    for (batch, receipt) in pending.into_iter().enumerate() {
        let receipt = within(receipt).await.unwrap();
        let ids: Vec<MessageId> = receipt.ids().collect();
        assert_eq!(ids.len(), PER_BATCH as usize);
        assert_eq!(ids[0], MessageId::new(1, batch as u64 * 100));
        assert_eq!(ids[9].to_string(), format!("1-{}", batch as u64 * 100 + 9));
    }
}

#[tokio::test]
async fn publish_returns_the_id_and_refusals_carry_the_code() {
    let server = FakeServer::bind().await;
    let (client, peer) = tokio::join!(
        Client::connect(server.addr.clone()),
        server.accept_ready(5_000)
    );
    let client = client.unwrap();
    let mut peer = peer;
    let server_side = async {
        let (header, frame) = peer.recv_skipping_pings().await;
        let Frame::Publish {
            records, partition, ..
        } = frame
        else {
            panic!("expected PUBLISH")
        };
        assert_eq!(partition, None);
        let message = records.messages().next().unwrap();
        assert_eq!(message.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(message.headers, vec![("h".to_string(), "v".to_string())]);
        let ranges = vec![OffsetRange::single(2, 41)];
        peer.send(
            &Frame::Published {
                durability: Durability::Synced,
                ranges,
            },
            header.request_id,
        )
        .await;
        let (header, _) = peer.recv_skipping_pings().await;
        peer.send(
            &Frame::error(ErrorCode::TopicFull, "topic orders is full"),
            header.request_id,
        )
        .await;
    };
    let client_side = async {
        let id = client
            .publish(
                "orders",
                Message::new("a").with_key("k").with_header("h", "v"),
            )
            .await
            .unwrap();
        assert_eq!(id.to_string(), "2-41");
        let error = client
            .publish("orders", Message::new("b"))
            .await
            .expect_err("full");
        assert_eq!(error.code(), Some(ErrorCode::TopicFull));
    };
    within(async { tokio::join!(server_side, client_side) }).await;

    // Checked locally: nothing is sent for a message over the server's limit.
    let too_big = Message::new(vec![0u8; 256 * 1024 + 1]);
    assert!(matches!(
        client.publish("orders", too_big).await,
        Err(Error::InvalidMessage(_))
    ));
    assert!(matches!(
        client.publish_batch("orders", None, &[]).await,
        Err(Error::InvalidMessage(_))
    ));
}

#[tokio::test]
async fn encoded_frames_are_sent_as_is() {
    let server = FakeServer::bind().await;
    let (client, peer) = tokio::join!(
        Client::connect(server.addr.clone()),
        server.accept_ready(5_000)
    );
    let client = client.unwrap();
    let mut peer = peer;
    let mut encoder = client.publish_encoder("bench", None).unwrap();
    for i in 0..1000u32 {
        encoder.push_body(None, 0, &i.to_le_bytes());
    }
    let pending = client.send_encoded(encoder.finish()).await.unwrap();
    assert_eq!(pending.count(), 1000);
    let (header, frame) = peer.recv_skipping_pings().await;
    let Frame::Publish { records, .. } = frame else {
        panic!("expected PUBLISH")
    };
    assert_eq!(records.count(), 1000);
    let ranges = vec![OffsetRange {
        partition: 0,
        offset: 0,
        count: 1000,
    }];
    peer.send(
        &Frame::Published {
            durability: Durability::Memory,
            ranges,
        },
        header.request_id,
    )
    .await;
    assert_eq!(within(pending).await.unwrap().len(), 1000);
}

/// The fake server grants nothing beyond the credit it has seen; the client must replenish as the
/// application consumes, or the stream stalls.
#[tokio::test]
async fn credit_is_replenished_as_messages_are_taken_and_never_exceeded() {
    const WINDOW: u32 = 8;
    const TOTAL: u64 = 100;
    let server = FakeServer::bind().await;
    let (client, peer) = tokio::join!(
        Client::connect(server.addr.clone()),
        server.accept_ready(5_000)
    );
    let client = client.unwrap();
    let mut peer = peer;

    let server_side = async {
        let (header, frame) = peer.recv_skipping_pings().await;
        let Frame::Subscribe(request) = frame else {
            panic!("expected SUBSCRIBE")
        };
        assert_eq!(request.credit, WINDOW);
        assert_eq!(request.subscription, "work");
        assert_eq!(request.start, StartPosition::Earliest);
        assert!(!request.auto_ack);
        let subscribed = Frame::Subscribed {
            consumer_id: 7,
            subscription: "work".into(),
            partitions: 1,
        };
        peer.send(&subscribed, header.request_id).await;

        let mut credit = WINDOW as u64;
        let mut sent = 0u64;
        let mut acked = 0u64;
        let mut credit_frames = 0u32;
        // Bounded: every turn sends deliveries or reads a frame, and each read has a time limit.
        for _ in 0..10_000 {
            if acked == TOTAL {
                break;
            }
            if credit > 0 && sent < TOTAL {
                let n = credit.min(3).min(TOTAL - sent);
                let deliveries: Vec<Delivery> = (sent..sent + n)
                    .map(|o| delivery(o, &format!("m{o}")))
                    .collect();
                let frame = Frame::Deliver {
                    consumer_id: 7,
                    deliveries: DeliveryBatch::from_deliveries(&deliveries).unwrap(),
                };
                peer.send(&frame, 0).await;
                sent += n;
                credit -= n;
                continue;
            }
            let (header, frame) = peer.recv_skipping_pings().await;
            assert_eq!(header.request_id, 0, "credit and acks are fire-and-forget");
            match frame {
                Frame::Credit {
                    consumer_id,
                    credit: more,
                } => {
                    assert_eq!(consumer_id, 7);
                    assert_eq!(more, WINDOW / 2, "credit comes back in half-window steps");
                    credit += more as u64;
                    assert!(
                        credit <= WINDOW as u64,
                        "client granted more than its window"
                    );
                    credit_frames += 1;
                }
                Frame::Ack {
                    consumer_id,
                    ranges,
                } => {
                    assert_eq!(consumer_id, 7);
                    for range in ranges {
                        assert_eq!(range.offset, acked, "acks arrive in order");
                        acked += range.count as u64;
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!((sent, acked), (TOTAL, TOTAL));
        assert!(credit_frames >= ((TOTAL - WINDOW as u64) / (WINDOW as u64 / 2)) as u32);
    };

    let client_side = async {
        let options = SubscribeOptions::new("jobs")
            .subscription("work")
            .start(StartPosition::Earliest)
            .credit(WINDOW);
        let mut subscription = client.subscribe(options).await.unwrap();
        assert_eq!(subscription.consumer_id(), 7);
        assert_eq!(subscription.name(), "work");
        for expected in 0..TOTAL {
            let delivery = subscription
                .next()
                .await
                .expect("stream open")
                .expect("delivery");
            assert_eq!(delivery.offset, expected);
            assert_eq!(delivery.message.body, format!("m{expected}").into_bytes());
            subscription.ack(&delivery).await.unwrap();
        }
        subscription
    };
    let ((), subscription) = within(async { tokio::join!(server_side, client_side) }).await;

    // Dropping the subscription unsubscribes with a fire-and-forget frame.
    drop(subscription);
    let (header, frame) = peer.recv_skipping_pings().await;
    assert_eq!(
        (header.request_id, frame),
        (0, Frame::Unsubscribe { consumer_id: 7 })
    );
}

#[tokio::test]
async fn batches_are_delivered_whole_and_acked_in_ranges() {
    let server = FakeServer::bind().await;
    let (client, peer) = tokio::join!(
        Client::connect(server.addr.clone()),
        server.accept_ready(5_000)
    );
    let client = client.unwrap();
    let mut peer = peer;
    let server_side = async {
        let (header, frame) = peer.recv_skipping_pings().await;
        let Frame::Subscribe(request) = frame else {
            panic!("expected SUBSCRIBE")
        };
        assert!(request.auto_ack);
        assert_eq!(request.subscription, "");
        peer.send(
            &Frame::Subscribed {
                consumer_id: 3,
                subscription: "eph-1".into(),
                partitions: 2,
            },
            header.request_id,
        )
        .await;
        let deliveries: Vec<Delivery> = (10..20).map(|o| delivery(o, "x")).collect();
        let batch = DeliveryBatch::from_deliveries(&deliveries).unwrap();
        peer.send(
            &Frame::Deliver {
                consumer_id: 3,
                deliveries: batch,
            },
            0,
        )
        .await;
        let (header, frame) = peer.recv_skipping_pings().await;
        assert_eq!(
            frame,
            Frame::Credit {
                consumer_id: 3,
                credit: 10
            }
        );
        assert_eq!(header.request_id, 0);
        let (_, frame) = peer.recv_skipping_pings().await;
        assert_eq!(
            frame,
            Frame::Ack {
                consumer_id: 3,
                ranges: vec![OffsetRange {
                    partition: 0,
                    offset: 10,
                    count: 10
                }]
            }
        );
        let (header, frame) = peer.recv_skipping_pings().await;
        assert_eq!(frame, Frame::Unsubscribe { consumer_id: 3 });
        assert_ne!(header.request_id, 0, "close waits for the server's OK");
        peer.send(&Frame::Ok, header.request_id).await;
    };
    let client_side = async {
        let mut subscription = client
            .subscribe(SubscribeOptions::new("events").auto_ack(true).credit(20))
            .await
            .unwrap();
        assert_eq!(
            (subscription.name(), subscription.partitions()),
            ("eph-1", 2)
        );
        let batch = subscription.next_batch().await.unwrap().unwrap();
        assert_eq!(batch.count(), 10);
        subscription.ack_batch(&batch).await.unwrap();
        subscription.close().await.unwrap();
    };
    within(async { tokio::join!(server_side, client_side) }).await;
}

#[tokio::test]
async fn a_server_that_oversteps_credit_ends_the_subscription() {
    let server = FakeServer::bind().await;
    let (client, peer) = tokio::join!(
        Client::connect(server.addr.clone()),
        server.accept_ready(5_000)
    );
    let client = client.unwrap();
    let mut peer = peer;
    let server_side = async {
        let (header, _) = peer.recv_skipping_pings().await;
        peer.send(
            &Frame::Subscribed {
                consumer_id: 1,
                subscription: "s".into(),
                partitions: 1,
            },
            header.request_id,
        )
        .await;
        let deliveries: Vec<Delivery> = (0..5).map(|o| delivery(o, "x")).collect();
        let batch = DeliveryBatch::from_deliveries(&deliveries).unwrap();
        peer.send(
            &Frame::Deliver {
                consumer_id: 1,
                deliveries: batch,
            },
            0,
        )
        .await;
        let (_, frame) = peer.recv_skipping_pings().await;
        assert_eq!(frame, Frame::Unsubscribe { consumer_id: 1 });
    };
    let client_side = async {
        let mut subscription = client
            .subscribe(SubscribeOptions::new("t").credit(4))
            .await
            .unwrap();
        let error = subscription
            .next()
            .await
            .expect("an error item")
            .expect_err("overstep");
        assert!(matches!(error, Error::UnexpectedResponse(_)), "{error}");
        assert!(subscription.next().await.is_none());
    };
    within(async { tokio::join!(server_side, client_side) }).await;
}

/// A batch that arrived within the credit, then one past it: the subscription ends, and an ack of
/// the first batch fails with that reason at once instead of reaching a server that no longer
/// knows the consumer (it would answer `unknown_consumer`, which says nothing of the cause).
#[tokio::test]
async fn acks_after_an_overstep_fail_with_its_reason_without_reaching_the_server() {
    let server = FakeServer::bind().await;
    let (client, peer) = tokio::join!(
        Client::connect(server.addr.clone()),
        server.accept_ready(5_000)
    );
    let client = client.unwrap();
    let mut peer = peer;
    let server_side = async {
        let (header, _) = peer.recv_skipping_pings().await;
        peer.send(
            &Frame::Subscribed {
                consumer_id: 1,
                subscription: "s".into(),
                partitions: 1,
            },
            header.request_id,
        )
        .await;
        for offsets in [0..3u64, 3..8] {
            let deliveries: Vec<Delivery> = offsets.map(|o| delivery(o, "x")).collect();
            peer.send(
                &Frame::Deliver {
                    consumer_id: 1,
                    deliveries: DeliveryBatch::from_deliveries(&deliveries).unwrap(),
                },
                0,
            )
            .await;
        }
        let (_, frame) = peer.recv_skipping_pings().await;
        assert_eq!(frame, Frame::Unsubscribe { consumer_id: 1 });
        // Nothing more until the client closes: no ACK for a consumer it gave up.
        while let Some((header, frame)) = peer.recv_within(STEP).await {
            assert!(
                matches!(frame, Frame::Ping) && header.request_id == 0,
                "{frame:?} after the UNSUBSCRIBE"
            );
        }
    };
    let client_side = async {
        let mut subscription = client
            .subscribe(SubscribeOptions::new("t").credit(4))
            .await
            .unwrap();
        let first = subscription
            .next_batch()
            .await
            .expect("the batch within the credit")
            .unwrap();
        assert_eq!(first.count(), 3);
        let mut ranges = Vec::new();
        first.extend_ranges(&mut ranges);
        for error in [
            subscription.ack_confirmed(&ranges).await.unwrap_err(),
            subscription.ack_ranges(&ranges).await.unwrap_err(),
        ] {
            assert!(
                matches!(&error, Error::UnexpectedResponse(text) if text.contains("credit")),
                "{error}"
            );
        }
        let end = subscription
            .next_batch()
            .await
            .expect("the end")
            .unwrap_err();
        assert!(matches!(end, Error::UnexpectedResponse(_)), "{end}");
        drop(subscription);
        client.close().await.unwrap();
    };
    within(async { tokio::join!(server_side, client_side) }).await;
}

#[tokio::test]
async fn an_error_without_request_id_surfaces_on_the_only_subscription() {
    let server = FakeServer::bind().await;
    let (client, peer) = tokio::join!(
        Client::connect(server.addr.clone()),
        server.accept_ready(5_000)
    );
    let client = client.unwrap();
    let mut peer = peer;
    let server_side = async {
        let (header, _) = peer.recv_skipping_pings().await;
        peer.send(
            &Frame::Subscribed {
                consumer_id: 1,
                subscription: "s".into(),
                partitions: 1,
            },
            header.request_id,
        )
        .await;
        let (_, frame) = peer.recv_skipping_pings().await;
        assert!(matches!(frame, Frame::Ack { .. }));
        peer.send(
            &Frame::error(ErrorCode::InvalidArgument, "offset 99 was never delivered"),
            0,
        )
        .await;
        let batch = DeliveryBatch::from_deliveries(&[delivery(0, "after")]).unwrap();
        peer.send(
            &Frame::Deliver {
                consumer_id: 1,
                deliveries: batch,
            },
            0,
        )
        .await;
    };
    let client_side = async {
        let mut subscription = client.subscribe(SubscribeOptions::new("t")).await.unwrap();
        subscription
            .ack_ranges(&[OffsetRange::single(0, 99)])
            .await
            .unwrap();
        let error = subscription
            .next()
            .await
            .unwrap()
            .expect_err("the refused ack");
        assert_eq!(error.code(), Some(ErrorCode::InvalidArgument));
        let delivery = subscription
            .next()
            .await
            .unwrap()
            .expect("the stream goes on");
        assert_eq!(delivery.message.body, &b"after"[..]);
        subscription
    };
    let ((), _subscription) = within(async { tokio::join!(server_side, client_side) }).await;
    assert_eq!(client.async_error_count(), 1);
    assert_eq!(
        client.last_async_error().and_then(|e| e.code()),
        Some(ErrorCode::InvalidArgument)
    );
}

#[tokio::test]
async fn server_ping_is_answered_with_pong_and_idle_clients_send_pings() {
    let server = FakeServer::bind().await;
    let (client, peer) = tokio::join!(
        Client::connect(server.addr.clone()),
        server.accept_ready(100)
    );
    let client = client.unwrap();
    let mut peer = peer;
    peer.send(&Frame::Ping, 42).await;
    let (header, frame) = peer.recv_skipping_pings().await;
    assert_eq!((header.request_id, frame), (42, Frame::Pong));

    // Idle for a few intervals: the client keeps the connection alive with PINGs of id 0.
    let mut pings = 0;
    for _ in 0..3 {
        let (header, frame) = peer
            .recv_within(Duration::from_millis(500))
            .await
            .expect("heartbeat");
        assert_eq!((header.request_id, frame), (0, Frame::Ping));
        pings += 1;
        // Our own traffic keeps the client's dead-peer timer from firing.
        peer.send(&Frame::Ping, 0).await;
    }
    assert_eq!(pings, 3);
    assert!(!client.is_closed());

    // A client-initiated ping is a request like any other.
    let ping = tokio::spawn({
        let client = client.clone();
        async move { client.ping().await }
    });
    let (header, frame) = peer.recv_skipping_pings().await;
    assert_eq!(frame, Frame::Ping);
    assert_ne!(header.request_id, 0);
    peer.send(&Frame::Pong, header.request_id).await;
    within(ping).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_silent_server_is_declared_dead_after_three_heartbeats() {
    let server = FakeServer::bind().await;
    let (client, peer) = tokio::join!(
        Client::connect(server.addr.clone()),
        server.accept_ready(100)
    );
    let client = client.unwrap();
    let _peer = peer; // keeps the socket open but never answers
    let started = std::time::Instant::now();
    let error = within(client.list_topics()).await.expect_err("dead server");
    assert!(
        matches!(error, Error::HeartbeatTimeout { silence_ms: 300 }),
        "{error}"
    );
    assert!(error.is_connection_error());
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert!(client.is_closed());
    assert!(matches!(
        client.list_topics().await,
        Err(Error::HeartbeatTimeout { .. })
    ));
}

#[tokio::test]
async fn connection_loss_fails_pending_requests_and_ends_subscriptions() {
    let server = FakeServer::bind().await;
    let (client, peer) = tokio::join!(
        Client::connect(server.addr.clone()),
        server.accept_ready(5_000)
    );
    let client = client.unwrap();
    let mut peer = peer;
    let subscribe = async {
        let (header, _) = peer.recv_skipping_pings().await;
        peer.send(
            &Frame::Subscribed {
                consumer_id: 5,
                subscription: "s".into(),
                partitions: 1,
            },
            header.request_id,
        )
        .await;
    };
    let (subscription, ()) =
        within(async { tokio::join!(client.subscribe(SubscribeOptions::new("t")), subscribe) })
            .await;
    let mut subscription = subscription.unwrap();

    let pending = tokio::spawn({
        let client = client.clone();
        async move { tokio::join!(client.list_topics(), client.stats(None)) }
    });
    // Both requests reach the server, which then vanishes without answering.
    for _ in 0..2 {
        peer.recv_skipping_pings().await;
    }
    drop(peer);
    let (list, stats) = within(pending).await.unwrap();
    for error in [list.expect_err("closed"), stats.expect_err("closed")] {
        assert!(error.is_connection_error(), "{error}");
    }
    let end = within(subscription.next())
        .await
        .expect("one error item")
        .expect_err("connection lost");
    assert!(end.is_connection_error(), "{end}");
    assert!(within(subscription.next()).await.is_none());
    assert!(client
        .publish("t", Message::new("late"))
        .await
        .expect_err("closed")
        .is_connection_error());
}

#[tokio::test]
async fn requests_time_out_when_the_server_never_answers() {
    let server = FakeServer::bind().await;
    let config =
        ClientConfig::new(server.addr.clone()).request_timeout(Some(Duration::from_millis(200)));
    let (client, peer) = tokio::join!(Client::connect_with(config), server.accept_ready(5_000));
    let client = client.unwrap();
    let _peer = peer;
    let error = within(client.describe_topic("t"))
        .await
        .expect_err("no answer");
    assert!(matches!(error, Error::Timeout(_)), "{error}");
    assert!(!error.is_connection_error());
    assert!(
        !client.is_closed(),
        "one slow answer does not close the connection"
    );
}

#[tokio::test]
async fn close_flushes_queued_frames_then_closes() {
    let server = FakeServer::bind().await;
    let (client, peer) = tokio::join!(
        Client::connect(server.addr.clone()),
        server.accept_ready(5_000)
    );
    let client = client.unwrap();
    let mut peer = peer;
    let pending = client
        .send_batch("t", None, &[Message::new("queued")])
        .await
        .unwrap();
    within(client.close()).await.unwrap();
    let (_, frame) = peer.recv_skipping_pings().await;
    assert!(
        matches!(frame, Frame::Publish { .. }),
        "queued frames are written before the close"
    );
    assert!(peer.closed_within(STEP).await);
    assert!(matches!(
        within(pending).await,
        Err(Error::ConnectionClosed)
    ));
    assert!(matches!(
        client.list_topics().await,
        Err(Error::ConnectionClosed)
    ));
}

#[tokio::test]
async fn dropping_the_last_client_closes_the_connection() {
    let server = FakeServer::bind().await;
    let (client, peer) = tokio::join!(
        Client::connect(server.addr.clone()),
        server.accept_ready(5_000)
    );
    let mut peer = peer;
    let clone = client.unwrap().clone();
    drop(clone);
    assert!(peer.closed_within(STEP).await);
}

/// A server that stops reading: the client's queue fills to its bound and callers wait instead of
/// buffering without limit.
#[tokio::test]
async fn a_full_write_buffer_makes_publishers_wait() {
    let server = FakeServer::bind().await;
    let config = ClientConfig::new(server.addr.clone()).write_buffer_bytes_max(256 * 1024);
    let (client, peer) = tokio::join!(Client::connect_with(config), server.accept_ready(5_000));
    let client = client.unwrap();
    let _peer = peer; // never reads
    let body = vec![0u8; 200 * 1024];
    let messages = vec![Message::new(body)];
    let queued = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let publisher = tokio::spawn({
        let client = client.clone();
        let queued = queued.clone();
        async move {
            let mut pending = Vec::new();
            for _ in 0..2000 {
                pending.push(client.send_batch("t", None, &messages).await);
                queued.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let queued = queued.load(std::sync::atomic::Ordering::Relaxed);
    // 2000 batches are 400 MB; kernel socket buffers take a few MB, the client a bounded amount.
    assert!(
        queued < 300,
        "{queued} batches queued: the write buffer is not bounded"
    );
    assert!(queued > 0);
    publisher.abort();
}
