//! End-to-end over real sockets with the Rust client: fan-out, load balancing, redelivery on
//! timeout and on disconnect, many producers and consumers, slow consumers. Every wait is bounded.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{Raw, TestServer, STEP};
use ferrymq_client::{Client, Message, StartPosition, SubscribeOptions, TopicConfig};
use ferrymq_protocol::{Frame, SubscribeRequest};
use ferrymq_server::ServerConfig;

async fn connect(server: &TestServer) -> Client {
    Client::connect(server.addr.to_string())
        .await
        .expect("connect")
}

/// Receives until `n` deliveries arrived (acking them unless `ack` is false), bounded by STEP.
async fn take(
    sub: &mut ferrymq_client::Subscription,
    n: usize,
    ack: bool,
) -> Vec<ferrymq_client::Delivery> {
    let mut got = Vec::new();
    tokio::time::timeout(STEP, async {
        while got.len() < n {
            let d = sub.next().await.expect("stream open").expect("delivery");
            if ack {
                sub.ack(&d).await.unwrap();
            }
            got.push(d);
        }
    })
    .await
    .unwrap_or_else(|_| panic!("received {} of {n} in time", got.len()));
    got
}

fn body(d: &ferrymq_client::Delivery) -> String {
    String::from_utf8(d.message.body.to_vec()).unwrap()
}

#[tokio::test]
async fn fan_out_every_subscription_gets_every_message() {
    let server = TestServer::default().await;
    let (a, b, producer) = (
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
    );
    let mut sub_a = a
        .subscribe(SubscribeOptions::new("news").subscription("a"))
        .await
        .unwrap();
    let mut sub_b = b
        .subscribe(SubscribeOptions::new("news").subscription("b"))
        .await
        .unwrap();
    let messages: Vec<Message> = (0..100).map(|i| Message::new(format!("{i}"))).collect();
    let receipt = producer
        .publish_batch("news", None, &messages)
        .await
        .unwrap();
    assert_eq!(receipt.len(), 100);
    for sub in [&mut sub_a, &mut sub_b] {
        let got: Vec<String> = take(sub, 100, true).await.iter().map(body).collect();
        assert_eq!(got, (0..100).map(|i| i.to_string()).collect::<Vec<_>>());
    }
    server.shutdown().await;
}

#[tokio::test]
async fn load_balancing_shares_a_subscription_without_duplicates() {
    let server = TestServer::default().await;
    let producer = connect(&server).await;
    producer
        .create_topic("jobs", TopicConfig::default(), false)
        .await
        .unwrap();
    let (c1, c2) = (connect(&server).await, connect(&server).await);
    let mut w1 = c1
        .subscribe(
            SubscribeOptions::new("jobs")
                .subscription("workers")
                .credit(8),
        )
        .await
        .unwrap();
    let mut w2 = c2
        .subscribe(
            SubscribeOptions::new("jobs")
                .subscription("workers")
                .credit(8),
        )
        .await
        .unwrap();
    for chunk in 0..10 {
        let messages: Vec<Message> = (0..100)
            .map(|i| Message::new(format!("{}", chunk * 100 + i)))
            .collect();
        producer
            .publish_batch("jobs", None, &messages)
            .await
            .unwrap();
    }
    let mut seen = HashSet::new();
    let mut per_worker = [0usize; 2];
    tokio::time::timeout(Duration::from_secs(10), async {
        while seen.len() < 1000 {
            tokio::select! {
                Some(d) = w1.next() => { let d = d.unwrap(); w1.ack(&d).await.unwrap(); per_worker[0] += 1; assert!(seen.insert(body(&d)), "duplicate"); }
                Some(d) = w2.next() => { let d = d.unwrap(); w2.ack(&d).await.unwrap(); per_worker[1] += 1; assert!(seen.insert(body(&d)), "duplicate"); }
            }
        }
    })
    .await
    .expect("all 1000 jobs in time");
    assert!(
        per_worker[0] > 0 && per_worker[1] > 0,
        "both workers got work: {per_worker:?}"
    );
    // Acks travel asynchronously (within the client's ack flush delay): wait for them, bounded.
    let mut sub = producer.stats(Some("jobs")).await.unwrap()[0].subscriptions[0].clone();
    for _ in 0..100 {
        if sub.acked == 1000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        sub = producer.stats(Some("jobs")).await.unwrap()[0].subscriptions[0].clone();
    }
    assert_eq!(
        (sub.name.as_str(), sub.acked, sub.consumers),
        ("workers", 1000, 2)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn unacked_messages_come_back_after_the_ack_timeout() {
    let server = TestServer::default().await;
    let client = connect(&server).await;
    let mut sub = client
        .subscribe(
            SubscribeOptions::new("t")
                .subscription("s")
                .ack_timeout(Duration::from_millis(200)),
        )
        .await
        .unwrap();
    client.publish("t", Message::new("slow")).await.unwrap();
    let first = take(&mut sub, 1, false).await;
    assert_eq!(first[0].attempt, 1);
    let started = std::time::Instant::now();
    let again = take(&mut sub, 1, true).await;
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "redelivered too early"
    );
    assert_eq!((body(&again[0]), again[0].attempt), ("slow".to_owned(), 2));
    server.shutdown().await;
}

#[tokio::test]
async fn nack_requeues_at_once_or_after_a_delay() {
    let server = TestServer::default().await;
    let client = connect(&server).await;
    let mut sub = client
        .subscribe(SubscribeOptions::new("t").subscription("s"))
        .await
        .unwrap();
    client.publish("t", Message::new("retry me")).await.unwrap();
    let d = take(&mut sub, 1, false).await.remove(0);
    sub.nack(&d, Duration::ZERO).await.unwrap();
    let d = take(&mut sub, 1, false).await.remove(0);
    assert_eq!(d.attempt, 2);
    let started = std::time::Instant::now();
    sub.nack(&d, Duration::from_millis(300)).await.unwrap();
    let d = take(&mut sub, 1, true).await.remove(0);
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_eq!(d.attempt, 3);
    server.shutdown().await;
}

#[tokio::test]
async fn a_disconnecting_consumer_gives_its_messages_back_at_once() {
    let server = TestServer::default().await;
    let producer = connect(&server).await;
    let quitter = connect(&server).await;
    let mut sub = quitter
        .subscribe(SubscribeOptions::new("q").subscription("work"))
        .await
        .unwrap();
    let messages: Vec<Message> = (0..5).map(|i| Message::new(format!("{i}"))).collect();
    producer.publish_batch("q", None, &messages).await.unwrap();
    take(&mut sub, 5, false).await;
    quitter.close().await.unwrap();
    drop(sub);

    let stayer = connect(&server).await;
    let mut sub = stayer
        .subscribe(SubscribeOptions::new("q").subscription("work"))
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let got = take(&mut sub, 5, true).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "returned at once, not after the 30 s ack timeout"
    );
    assert!(got.iter().all(|d| d.attempt == 2));
    let mut bodies: Vec<String> = got.iter().map(body).collect();
    bodies.sort();
    assert_eq!(bodies, ["0", "1", "2", "3", "4"]);
    server.shutdown().await;
}

#[tokio::test]
async fn many_producers_and_consumers_deliver_each_message_exactly_once_when_acked() {
    let server = TestServer::default().await;
    let admin = connect(&server).await;
    admin
        .create_topic(
            "work",
            TopicConfig {
                partitions: 3,
                ..Default::default()
            },
            false,
        )
        .await
        .unwrap();
    let mut consumers = Vec::new();
    for _ in 0..3 {
        let client = connect(&server).await;
        let sub = client
            .subscribe(
                SubscribeOptions::new("work")
                    .subscription("pool")
                    .credit(64),
            )
            .await
            .unwrap();
        consumers.push((client, sub));
    }
    let mut producers = Vec::new();
    for p in 0..4 {
        let client = connect(&server).await;
        producers.push(tokio::spawn(async move {
            for batch in 0..10 {
                let messages: Vec<Message> = (0..50)
                    .map(|i| {
                        Message::new(format!("{p}-{}", batch * 50 + i)).with_key(format!("{p}"))
                    })
                    .collect();
                client.publish_batch("work", None, &messages).await.unwrap();
            }
        }));
    }
    for p in producers {
        p.await.unwrap();
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(4096);
    let mut tasks = Vec::new();
    for (client, mut sub) in consumers {
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let _client = client;
            while let Ok(Some(Ok(d))) =
                tokio::time::timeout(Duration::from_millis(500), sub.next()).await
            {
                sub.ack(&d).await.unwrap();
                let _ = tx.send(body(&d)).await;
            }
        }));
    }
    drop(tx);
    let mut seen = HashSet::new();
    let mut total = 0;
    while let Ok(Some(b)) = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
        total += 1;
        seen.insert(b);
    }
    assert_eq!((total, seen.len()), (2000, 2000));
    // Per-producer order holds, since a producer's key pins one partition.
    let stats = admin.stats(Some("work")).await.unwrap();
    assert_eq!(stats[0].messages_in, 2000);
    assert_eq!(stats[0].subscriptions[0].acked, 2000);
    server.shutdown().await;
}

#[tokio::test]
async fn a_consumer_that_never_reads_pins_a_bounded_amount() {
    let mut config = ServerConfig::default();
    config.broker.consumer_in_flight_max = 10_000;
    config.outbound_bytes_max = 256 * 1024;
    let server = TestServer::start(config).await;
    // A raw subscriber with a huge credit that never reads its socket.
    let mut slow = Raw::hello(server.addr).await;
    let request = SubscribeRequest {
        topic: "firehose".into(),
        subscription: "slow".into(),
        start: StartPosition::Latest,
        ack_timeout_ms: 0,
        max_attempts: 0,
        credit: 1_000_000,
        auto_ack: false,
        ordered: false,
        partitions: Vec::new(),
        dead_letter_topic: String::new(),
    };
    let (_, reply) = slow.request(1, &Frame::Subscribe(request)).await;
    assert!(matches!(reply, Frame::Subscribed { .. }));

    let producer = connect(&server).await;
    let messages: Vec<Message> = (0..1000).map(|_| Message::new(vec![b'x'; 100])).collect();
    tokio::time::timeout(Duration::from_secs(20), async {
        for _ in 0..100 {
            producer
                .publish_batch("firehose", None, &messages)
                .await
                .unwrap();
        }
    })
    .await
    .expect("the publisher is not stalled by a slow consumer on another connection");
    let stats = producer.stats(Some("firehose")).await.unwrap();
    let sub = &stats[0].subscriptions[0];
    assert!(
        sub.in_flight <= 10_000,
        "in flight {} above the per-consumer limit",
        sub.in_flight
    );
    assert_eq!(
        sub.in_flight + sub.backlog,
        100_000,
        "nothing lost: what is not in flight waits"
    );
    drop(slow);
    server.shutdown().await;
}

#[tokio::test]
async fn topic_admin_and_start_positions_through_the_client() {
    let server = TestServer::default().await;
    let client = connect(&server).await;
    client
        .create_topic(
            "orders",
            TopicConfig {
                partitions: 2,
                ..Default::default()
            },
            false,
        )
        .await
        .unwrap();
    let error = client
        .create_topic("orders", TopicConfig::default(), false)
        .await
        .unwrap_err();
    assert_eq!(error.code(), Some(ferrymq_client::ErrorCode::TopicExists));
    client
        .create_topic("orders", TopicConfig::default(), true)
        .await
        .unwrap();
    let topics = client.list_topics().await.unwrap();
    assert_eq!(
        topics.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["orders"]
    );
    let id = client
        .publish("orders", Message::new("first").with_key("7"))
        .await
        .unwrap();
    assert_eq!(id.to_string(), "1-0", "key 7 mod 2 partitions");
    let mut late = client
        .subscribe(
            SubscribeOptions::new("orders")
                .subscription("late")
                .start(StartPosition::Earliest),
        )
        .await
        .unwrap();
    assert_eq!(body(&take(&mut late, 1, true).await[0]), "first");
    let info = client.describe_topic("orders").await.unwrap();
    assert_eq!(
        (info.config.partitions, info.subscriptions.clone()),
        (2, vec!["late".to_owned()])
    );
    late.close().await.unwrap();
    client.delete_subscription("orders", "late").await.unwrap();
    client.delete_topic("orders").await.unwrap();
    let error = client.describe_topic("orders").await.unwrap_err();
    assert_eq!(error.code(), Some(ferrymq_client::ErrorCode::UnknownTopic));
    server.shutdown().await;
}

#[tokio::test]
async fn a_consumer_dead_letters_a_message_through_the_client_with_its_reason() {
    let server = TestServer::default().await;
    let client = connect(&server).await;
    let mut sub = client
        .subscribe(SubscribeOptions::new("t").subscription("s"))
        .await
        .unwrap();
    let mut dlq = client
        .subscribe(
            SubscribeOptions::new("t.dlq")
                .subscription("ops")
                .start(StartPosition::Earliest),
        )
        .await
        .unwrap();
    client.publish("t", Message::new("bad")).await.unwrap();
    let d = take(&mut sub, 1, false).await.remove(0);
    sub.dead_letter(
        &[ferrymq_client::OffsetRange::single(d.partition, d.offset)],
        "schema v3 expected",
    )
    .await
    .unwrap();
    let dead = take(&mut dlq, 1, true).await.remove(0);
    assert_eq!(dead.message.body.as_ref(), b"bad");
    assert!(dead
        .message
        .headers
        .iter()
        .any(|(k, v)| k == "x-ferrymq-dead-reason" && v == "schema v3 expected"));
    // Refused clearly: a reason over the limit.
    let long = "x".repeat(2000);
    assert!(sub.dead_letter(&[], &long).await.is_err());
    server.shutdown().await;
}
