//! The broker used as a library, without sockets: the same calls the server makes.

use std::time::Duration;

use bytes::Bytes;
use ferrymq_broker::{Broker, BrokerConfig, BrokerError};
use ferrymq_protocol::{
    Message, OffsetRange, OverflowPolicy, RecordBatch, SubscribeRequest, TopicConfig,
};

fn sub(topic: &str, name: &str) -> SubscribeRequest {
    SubscribeRequest::earliest(topic, name)
}

fn bodies(n: usize) -> Vec<Message> {
    (0..n).map(|i| Message::new(format!("m{i}"))).collect()
}

fn body_strings(deliveries: &[ferrymq_protocol::Delivery]) -> Vec<String> {
    deliveries
        .iter()
        .map(|d| String::from_utf8(d.message.body.to_vec()).unwrap())
        .collect()
}

fn ack_all(consumer: &ferrymq_broker::Consumer, deliveries: &[ferrymq_protocol::Delivery]) -> u64 {
    let ranges = OffsetRange::coalesce(deliveries.iter().map(|d| (d.partition, d.offset)));
    consumer.ack(&ranges).unwrap()
}

#[tokio::test]
async fn every_subscription_gets_every_message() {
    let broker = Broker::open(BrokerConfig::default());
    let a = broker.subscribe(&sub("events", "a")).unwrap();
    let b = broker.subscribe(&sub("events", "b")).unwrap();
    broker.publish_messages("events", &bodies(3)).await.unwrap();
    for consumer in [&a, &b] {
        let got = consumer.recv(10).await.unwrap();
        assert_eq!(body_strings(&got), ["m0", "m1", "m2"]);
        assert_eq!(ack_all(consumer, &got), 3);
    }
}

#[tokio::test]
async fn consumers_of_one_subscription_share_its_messages() {
    let broker = Broker::open(BrokerConfig::default());
    let c1 = broker.subscribe(&sub("jobs", "workers")).unwrap();
    let c2 = broker.subscribe(&sub("jobs", "workers")).unwrap();
    broker.publish_messages("jobs", &bodies(10)).await.unwrap();
    let first = c1.recv(4).await.unwrap();
    let second = c2.recv(100).await.unwrap();
    assert_eq!(first.len(), 4);
    assert_eq!(second.len(), 6);
    let mut all: Vec<String> = body_strings(&first);
    all.extend(body_strings(&second));
    all.sort_by_key(|s| s[1..].parse::<u32>().unwrap());
    assert_eq!(
        all,
        body_strings(
            &bodies(10)
                .into_iter()
                .enumerate()
                .map(|(i, m)| ferrymq_protocol::Delivery {
                    partition: 0,
                    offset: i as u64,
                    timestamp_ms: 0,
                    attempt: 1,
                    message: m
                })
                .collect::<Vec<_>>()
        )
    );
    // Each consumer can ack only what it holds.
    assert_eq!(ack_all(&c2, &first), 0);
    assert_eq!(ack_all(&c1, &first), 4);
    assert_eq!(ack_all(&c2, &second), 6);
}

#[tokio::test(start_paused = true)]
async fn unacked_messages_are_redelivered_after_the_ack_timeout() {
    let broker = Broker::open(BrokerConfig::default());
    let mut request = sub("t", "s");
    request.ack_timeout_ms = 1000;
    let consumer = broker.subscribe(&request).unwrap();
    broker.publish_messages("t", &bodies(2)).await.unwrap();
    let first = consumer.recv(10).await.unwrap();
    assert_eq!(first.len(), 2);
    consumer
        .ack(&[OffsetRange::single(0, first[1].offset)])
        .unwrap();

    // Before the deadline nothing comes back.
    let early = tokio::time::timeout(Duration::from_millis(900), consumer.recv(10)).await;
    assert!(early.is_err(), "redelivered before the ack timeout");
    let again = tokio::time::timeout(Duration::from_millis(500), consumer.recv(10))
        .await
        .expect("redelivery")
        .unwrap();
    assert_eq!(body_strings(&again), ["m0"]);
    assert_eq!(again[0].attempt, 2);
    let stats = &broker.stats(Some("t")).unwrap()[0].subscriptions[0];
    assert_eq!(stats.redelivered, 1);
    assert_eq!(stats.in_flight, 1);
}

#[tokio::test]
async fn a_dropped_consumer_returns_its_messages_at_once() {
    let broker = Broker::open(BrokerConfig::default());
    let c1 = broker.subscribe(&sub("t", "s")).unwrap();
    let c2 = broker.subscribe(&sub("t", "s")).unwrap();
    broker.publish_messages("t", &bodies(3)).await.unwrap();
    assert_eq!(c1.recv(10).await.unwrap().len(), 3);
    drop(c1);
    let got = tokio::time::timeout(Duration::from_secs(1), c2.recv(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(body_strings(&got), ["m0", "m1", "m2"]);
    assert!(got.iter().all(|d| d.attempt == 2));
}

#[tokio::test]
async fn nack_with_delay_holds_the_message_back() {
    let broker = Broker::open(BrokerConfig {
        timer_tick_ms: 5,
        ..Default::default()
    });
    let consumer = broker.subscribe(&sub("t", "s")).unwrap();
    broker.publish_messages("t", &bodies(1)).await.unwrap();
    let got = consumer.recv(1).await.unwrap();
    consumer
        .nack(
            &[OffsetRange::single(0, got[0].offset)],
            Duration::from_millis(150),
        )
        .unwrap();
    let start = tokio::time::Instant::now();
    let again = tokio::time::timeout(Duration::from_secs(2), consumer.recv(1))
        .await
        .unwrap()
        .unwrap();
    assert!(start.elapsed() >= Duration::from_millis(150));
    assert_eq!(again[0].attempt, 2);
}

#[tokio::test]
async fn ephemeral_subscriptions_start_at_latest_and_vanish_with_their_consumer() {
    let broker = Broker::open(BrokerConfig::default());
    broker.publish_messages("t", &bodies(2)).await.unwrap();
    let mut request = sub("t", "");
    request.start = ferrymq_protocol::StartPosition::Latest;
    request.auto_ack = true;
    let consumer = broker.subscribe(&request).unwrap();
    assert_eq!(broker.describe_topic("t").unwrap().subscriptions.len(), 1);
    broker
        .publish_messages("t", &[Message::new("new")])
        .await
        .unwrap();
    assert_eq!(body_strings(&consumer.recv(10).await.unwrap()), ["new"]);
    drop(consumer);
    assert!(broker.describe_topic("t").unwrap().subscriptions.is_empty());
}

#[tokio::test]
async fn reject_policy_refuses_whole_batches_when_full() {
    let broker = Broker::open(BrokerConfig::default());
    let config = TopicConfig {
        max_messages: 3,
        overflow: OverflowPolicy::Reject,
        ..Default::default()
    };
    broker.create_topic("bounded", config, false).unwrap();
    let _consumer = broker.subscribe(&sub("bounded", "s")).unwrap();
    broker
        .publish_messages("bounded", &bodies(2))
        .await
        .unwrap();
    let error = broker
        .publish_messages("bounded", &bodies(2))
        .await
        .unwrap_err();
    assert!(matches!(error, BrokerError::TopicFull { .. }), "{error}");
    assert_eq!(
        broker.describe_topic("bounded").unwrap().messages,
        2,
        "nothing of the refused batch was stored"
    );
}

#[tokio::test]
async fn drop_oldest_policy_keeps_the_newest_and_counts_the_dropped() {
    let broker = Broker::open(BrokerConfig::default());
    let config = TopicConfig {
        max_messages: 3,
        overflow: OverflowPolicy::DropOldest,
        ..Default::default()
    };
    broker.create_topic("ring", config, false).unwrap();
    let consumer = broker.subscribe(&sub("ring", "s")).unwrap();
    broker.publish_messages("ring", &bodies(5)).await.unwrap();
    assert_eq!(
        body_strings(&consumer.recv(10).await.unwrap()),
        ["m2", "m3", "m4"]
    );
    let stats = &broker.stats(Some("ring")).unwrap()[0];
    assert_eq!(stats.dropped, 2);
    assert_eq!(stats.depth, 3);
}

#[tokio::test]
async fn a_batch_larger_than_its_partitions_keeps_the_newest_of_each() {
    let broker = Broker::open(BrokerConfig::default());
    let config = TopicConfig {
        partitions: 2,
        max_messages: 6, // 3 per partition
        overflow: OverflowPolicy::DropOldest,
        ..Default::default()
    };
    broker.create_topic("ring2", config, false).unwrap();
    let consumer = broker.subscribe(&sub("ring2", "s")).unwrap();
    // Keys 0 and 1 go to partitions 0 and 1; 10 messages each, alternating, in one batch, after
    // two messages that were there before.
    broker.publish_messages("ring2", &bodies(2)).await.unwrap();
    let batch: Vec<Message> = (0..20)
        .map(|i| Message {
            key: Some(Bytes::from((i % 2).to_string())),
            ..Message::new(format!("b{i}"))
        })
        .collect();
    let receipt = broker.publish_messages("ring2", &batch).await.unwrap();
    assert_eq!(receipt.ranges.iter().map(|r| r.count).sum::<u32>(), 20);
    let mut got = Vec::new();
    while got.len() < 6 {
        got.extend(consumer.recv(100).await.unwrap());
    }
    let mut kept: Vec<(u32, String)> = got
        .iter()
        .map(|d| {
            (
                d.partition,
                String::from_utf8(d.message.body.to_vec()).unwrap(),
            )
        })
        .collect();
    kept.sort();
    let expected: Vec<(u32, String)> = [(0, "b14"), (0, "b16"), (0, "b18")]
        .into_iter()
        .chain([(1, "b15"), (1, "b17"), (1, "b19")])
        .map(|(p, b)| (p, b.to_string()))
        .collect();
    assert_eq!(kept, expected);
    let stats = &broker.stats(Some("ring2")).unwrap()[0];
    assert_eq!((stats.messages_in, stats.depth, stats.dropped), (22, 6, 16));
    let body_bytes: u64 = batch.iter().map(|m| m.body.len() as u64).sum();
    assert!(stats.bytes_in > body_bytes, "every record is counted in");
    assert!(
        consumer.poll(100, usize::MAX, |_, _, _, _, _| {}).unwrap() == 0,
        "nothing else, no empty record"
    );
}

#[tokio::test]
async fn messages_larger_than_a_partition_are_dropped_and_their_offsets_never_reused() {
    let broker = Broker::open(BrokerConfig::default());
    let config = TopicConfig {
        max_bytes: 10, // below any message's own overhead: nothing stays
        overflow: OverflowPolicy::DropOldest,
        ..Default::default()
    };
    broker.create_topic("tiny", config, false).unwrap();
    let consumer = broker.subscribe(&sub("tiny", "s")).unwrap();
    let offsets = |r: &ferrymq_broker::PublishReceipt| -> Vec<u64> {
        r.ranges
            .iter()
            .flat_map(|r| r.offset..r.offset + r.count as u64)
            .collect()
    };
    let first = broker.publish_messages("tiny", &bodies(3)).await.unwrap();
    assert_eq!(offsets(&first), [0, 1, 2]);
    let second = broker.publish_messages("tiny", &bodies(2)).await.unwrap();
    assert_eq!(
        offsets(&second),
        [3, 4],
        "offsets move on though nothing was kept"
    );
    assert_eq!(
        consumer.poll(10, usize::MAX, |_, _, _, _, _| {}).unwrap(),
        0
    );
    let stats = &broker.stats(Some("tiny")).unwrap()[0];
    assert_eq!((stats.messages_in, stats.depth, stats.dropped), (5, 0, 5));
}

#[tokio::test]
async fn byte_bound_holds_and_acked_messages_are_freed() {
    let broker = Broker::open(BrokerConfig::default());
    let config = TopicConfig {
        max_bytes: 10_000,
        ..Default::default()
    };
    broker.create_topic("t", config, false).unwrap();
    let consumer = broker.subscribe(&sub("t", "s")).unwrap();
    let big: Vec<Message> = (0..100).map(|_| Message::new(vec![7u8; 500])).collect();
    broker.publish_messages("t", &big).await.unwrap();
    let info = broker.describe_topic("t").unwrap();
    assert!(info.bytes <= 10_000, "{} bytes retained", info.bytes);
    let got = consumer.recv(1000).await.unwrap();
    ack_all(&consumer, &got);
    assert_eq!(
        broker.describe_topic("t").unwrap().messages,
        0,
        "acked by every subscription, so freed"
    );
}

#[tokio::test]
async fn oversize_message_is_refused_with_its_index() {
    let broker = Broker::open(BrokerConfig {
        message_body_bytes_max: 100,
        ..Default::default()
    });
    let batch = vec![Message::new(vec![0u8; 10]), Message::new(vec![0u8; 101])];
    let error = broker.publish_messages("t", &batch).await.unwrap_err();
    assert_eq!(
        error,
        BrokerError::MessageTooLarge {
            index: 1,
            size: 101,
            max: 100
        }
    );
    assert_eq!(broker.describe_topic("t").unwrap().messages, 0);
}

#[tokio::test]
async fn keys_pick_partitions_and_order_holds_within_one() {
    let broker = Broker::open(BrokerConfig::default());
    broker
        .create_topic(
            "p",
            TopicConfig {
                partitions: 4,
                ..Default::default()
            },
            false,
        )
        .unwrap();
    let consumer = broker.subscribe(&sub("p", "s")).unwrap();
    let messages: Vec<Message> = (0..40)
        .map(|i| Message::new(format!("{i}")).with_key(format!("{}", i % 4)))
        .collect();
    let receipt = broker.publish_messages("p", &messages).await.unwrap();
    for (i, (partition, _)) in receipt.ids().enumerate() {
        assert_eq!(partition, (i % 4) as u32);
    }
    let mut got = Vec::new();
    while got.len() < 40 {
        got.extend(consumer.recv(100).await.unwrap());
    }
    for p in 0..4u32 {
        let in_partition: Vec<u32> = got
            .iter()
            .filter(|d| d.partition == p)
            .map(|d| {
                std::str::from_utf8(&d.message.body)
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        let mut sorted = in_partition.clone();
        sorted.sort();
        assert_eq!(in_partition, sorted, "partition {p} out of order");
        assert_eq!(in_partition.len(), 10);
    }
    let explicit = RecordBatch::from_messages(&[Message::new("x")]).unwrap();
    let error = broker.publish("p", Some(9), explicit).await.unwrap_err();
    assert!(matches!(
        error,
        BrokerError::InvalidArgument {
            field: "partition",
            ..
        }
    ));
}

#[tokio::test]
async fn topics_admin_and_names() {
    let broker = Broker::open(BrokerConfig {
        auto_create_topics: false,
        ..Default::default()
    });
    assert!(matches!(
        broker.publish_messages("missing", &bodies(1)).await,
        Err(BrokerError::UnknownTopic(_))
    ));
    assert!(matches!(
        broker.create_topic("bad name", TopicConfig::default(), false),
        Err(BrokerError::InvalidArgument { .. })
    ));
    broker
        .create_topic("a", TopicConfig::default(), false)
        .unwrap();
    assert!(matches!(
        broker.create_topic("a", TopicConfig::default(), false),
        Err(BrokerError::TopicExists(_))
    ));
    broker
        .create_topic("a", TopicConfig::default(), true)
        .unwrap();
    broker
        .create_topic(
            "b",
            TopicConfig {
                partitions: 3,
                ..Default::default()
            },
            false,
        )
        .unwrap();
    let names: Vec<String> = broker.list_topics().into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(broker.describe_topic("b").unwrap().config.partitions, 3);
    let consumer = broker.subscribe(&sub("b", "s")).unwrap();
    broker.delete_topic("b").unwrap();
    assert!(matches!(
        consumer.recv(1).await,
        Err(BrokerError::UnknownTopic(_))
    ));
    assert!(matches!(
        broker.describe_topic("b"),
        Err(BrokerError::UnknownTopic(_))
    ));
}

#[tokio::test]
async fn a_deleted_topic_lets_go_of_its_messages_while_a_handle_to_it_lives_on() {
    let broker = Broker::open(BrokerConfig::default());
    let config = TopicConfig {
        partitions: 2,
        ..Default::default()
    };
    broker.create_topic("t", config, false).unwrap();
    // A transport keeps a handle to the topic it publishes to, across requests.
    let handle = broker.topic("t").unwrap();
    broker.publish_messages("t", &bodies(100)).await.unwrap();
    let held = handle.info();
    assert_eq!((held.messages, held.bytes > 0), (100, true));

    broker.delete_topic("t").unwrap();
    let held = handle.info();
    assert_eq!((held.messages, held.bytes), (0, 0));
    let batch = RecordBatch::from_messages(&bodies(3)).unwrap();
    assert!(matches!(
        broker.publish_start(&handle, None, batch),
        Err(BrokerError::UnknownTopic(_))
    ));
    assert_eq!(handle.info().messages, 0);

    // The name is free again, and the new topic starts empty.
    broker
        .create_topic("t", TopicConfig::default(), false)
        .unwrap();
    broker.publish_messages("t", &bodies(1)).await.unwrap();
    assert_eq!(broker.describe_topic("t").unwrap().messages, 1);
}

#[tokio::test]
async fn consumer_in_flight_limit_holds_back_further_deliveries() {
    let broker = Broker::open(BrokerConfig {
        consumer_in_flight_max: 5,
        ..Default::default()
    });
    let consumer = broker.subscribe(&sub("t", "s")).unwrap();
    broker.publish_messages("t", &bodies(20)).await.unwrap();
    let first = consumer.recv(100).await.unwrap();
    assert_eq!(first.len(), 5);
    assert_eq!(
        consumer.poll(100, usize::MAX, |_, _, _, _, _| {}).unwrap(),
        0
    );
    ack_all(&consumer, &first[..2]);
    assert_eq!(consumer.recv(100).await.unwrap().len(), 2);
}

#[tokio::test]
async fn start_positions() {
    let broker = Broker::open(BrokerConfig::default());
    broker.publish_messages("t", &bodies(5)).await.unwrap();
    let mut request = sub("t", "from-offset");
    request.start = ferrymq_protocol::StartPosition::Offset(3);
    let consumer = broker.subscribe(&request).unwrap();
    assert_eq!(
        body_strings(&consumer.recv(10).await.unwrap()),
        ["m3", "m4"]
    );
    let mut request = sub("t", "from-time");
    request.start = ferrymq_protocol::StartPosition::TimeMs(u64::MAX);
    let consumer = broker.subscribe(&request).unwrap();
    assert_eq!(
        consumer.poll(10, usize::MAX, |_, _, _, _, _| {}).unwrap(),
        0
    );
    let conflict = broker.subscribe(&SubscribeRequest {
        ack_timeout_ms: 1234,
        ..sub("t", "from-offset")
    });
    assert!(matches!(conflict, Err(BrokerError::Conflict(_))));
}

#[tokio::test]
async fn stats_count_traffic() {
    let broker = Broker::open(BrokerConfig::default());
    let consumer = broker.subscribe(&sub("t", "s")).unwrap();
    broker
        .publish_messages("t", &[Message::new(Bytes::from_static(b"hello"))])
        .await
        .unwrap();
    let got = consumer.recv(10).await.unwrap();
    let before_ack = &broker.stats(Some("t")).unwrap()[0];
    assert_eq!(
        (
            before_ack.messages_in,
            before_ack.messages_out,
            before_ack.subscribers
        ),
        (1, 1, 1)
    );
    assert!(before_ack.bytes_in > 5 && before_ack.bytes_in == before_ack.bytes_out);
    assert_eq!(before_ack.subscriptions[0].in_flight, 1);
    ack_all(&consumer, &got);
    let after = &broker.stats(Some("t")).unwrap()[0];
    assert_eq!(
        (
            after.depth,
            after.subscriptions[0].acked,
            after.subscriptions[0].backlog
        ),
        (0, 1, 0)
    );
}

#[tokio::test]
async fn latencies_measure_the_wait_for_delivery_and_for_the_ack_over_every_partition() {
    let broker = Broker::open(BrokerConfig::default());
    let config = TopicConfig {
        partitions: 2,
        ..Default::default()
    };
    broker.create_topic("lat", config, false).unwrap();
    let consumer = broker.subscribe(&sub("lat", "slow")).unwrap();
    let _idle = broker.subscribe(&sub("lat", "idle")).unwrap();
    let messages: Vec<Message> = (0..4)
        .map(|i| Message {
            key: Some(Bytes::from(format!("k{i}"))),
            ..Message::new(format!("m{i}"))
        })
        .collect();
    let started = std::time::Instant::now();
    broker.publish_messages("lat", &messages).await.unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    let mut got = Vec::new();
    while got.len() < 4 {
        got.extend(consumer.recv(10).await.unwrap());
    }
    let partitions: std::collections::BTreeSet<u32> = got.iter().map(|d| d.partition).collect();
    assert_eq!(partitions.len(), 2, "the keys spread over both partitions");
    let waited_to_deliver = started.elapsed().as_micros() as u64;
    // (idle, slow), by name.
    let subscriptions = || {
        let mut subs = broker.stats(Some("lat")).unwrap().remove(0).subscriptions;
        subs.sort_by(|a, b| a.name.cmp(&b.name));
        let slow = subs.pop().unwrap();
        (subs.pop().unwrap(), slow)
    };
    let (idle, slow) = subscriptions();
    assert_eq!((idle.name.as_str(), slow.name.as_str()), ("idle", "slow"));
    let deliver = slow.deliver_latency.summary();
    assert_eq!(deliver.count, 4, "{deliver:?}");
    // Every value is at least the 60 ms the messages waited, and at most the time elapsed since
    // before the publish (plus a bucket's width, as values are reported by bucket).
    assert!(
        slow.deliver_latency.quantile(0.0).unwrap() >= 60_000,
        "{deliver:?}"
    );
    assert!(
        deliver.max.unwrap() <= waited_to_deliver + waited_to_deliver / 8,
        "{deliver:?}"
    );
    assert_eq!(slow.ack_latency.count(), 0, "nothing acked yet");
    assert_eq!(idle.deliver_latency.summary().p50, None);

    tokio::time::sleep(Duration::from_millis(40)).await;
    assert_eq!(ack_all(&consumer, &got), 4);
    let waited_to_ack = started.elapsed().as_micros() as u64;
    let (idle, slow) = subscriptions();
    let ack = slow.ack_latency.summary();
    assert_eq!(ack.count, 4, "{ack:?}");
    assert!(
        slow.ack_latency.quantile(0.0).unwrap() >= 100_000,
        "{ack:?}"
    );
    assert!(
        ack.max.unwrap() <= waited_to_ack + waited_to_ack / 8,
        "{ack:?}"
    );
    assert!(ack.mean.unwrap() >= 100_000 && ack.mean.unwrap() <= waited_to_ack);
    assert_eq!(slow.deliver_latency.count(), 4, "acks add no deliveries");
    assert_eq!(idle.ack_latency.count(), 0);
}

#[tokio::test]
async fn messages_given_up_after_max_attempts_are_counted() {
    let broker = Broker::open(BrokerConfig::default());
    let mut request = sub("t", "s");
    request.max_attempts = 2;
    let consumer = broker.subscribe(&request).unwrap();
    broker.publish_messages("t", &bodies(1)).await.unwrap();
    for attempt in 1..=2u16 {
        let got = consumer.recv(1).await.unwrap();
        assert_eq!(got[0].attempt, attempt);
        consumer
            .nack(&[OffsetRange::single(0, got[0].offset)], Duration::ZERO)
            .unwrap();
    }
    let stats = &broker.stats(Some("t")).unwrap()[0].subscriptions[0];
    assert_eq!((stats.gave_up, stats.backlog, stats.in_flight), (1, 0, 0));
    assert_eq!(
        consumer.poll(10, usize::MAX, |_, _, _, _, _| {}).unwrap(),
        0
    );
}

#[tokio::test]
async fn consumers_can_take_chosen_partitions_only() {
    let broker = Broker::open(BrokerConfig::default());
    let config = TopicConfig {
        partitions: 4,
        ..TopicConfig::default()
    };
    broker.create_topic("sharded", config, false).unwrap();
    let low = broker
        .subscribe(&SubscribeRequest {
            partitions: ferrymq_protocol::parse_partition_list("0-1").unwrap(),
            ..sub("sharded", "workers")
        })
        .unwrap();
    let high = broker
        .subscribe(&SubscribeRequest {
            partitions: ferrymq_protocol::parse_partition_list("3,2").unwrap(),
            ..sub("sharded", "workers")
        })
        .unwrap();
    assert_eq!(low.partitions(), [0, 1]);
    assert_eq!(high.partitions(), [2, 3]);
    // Integer keys pick partition key mod 4.
    let keyed: Vec<Message> = (0..8)
        .map(|k| Message::new(format!("k{k}")).with_key(k.to_string()))
        .collect();
    broker.publish_messages("sharded", &keyed).await.unwrap();
    let mut got_low = Vec::new();
    while got_low.len() < 4 {
        got_low.extend(low.recv(10).await.unwrap());
    }
    let mut got_high = Vec::new();
    while got_high.len() < 4 {
        got_high.extend(high.recv(10).await.unwrap());
    }
    assert!(got_low.iter().all(|d| d.partition <= 1), "{got_low:?}");
    assert!(got_high.iter().all(|d| d.partition >= 2), "{got_high:?}");
    let error = broker
        .subscribe(&SubscribeRequest {
            partitions: vec![(2, 9)],
            ..sub("sharded", "workers")
        })
        .map(|_| ())
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("2-9 is not within the topic's partitions 0-3"),
        "{error}"
    );
}

#[tokio::test]
async fn a_delayed_publish_is_delivered_after_its_delay_without_holding_back_the_rest() {
    let broker = Broker::open(BrokerConfig::default());
    let consumer = broker.subscribe(&sub("later", "workers")).unwrap();
    let delayed = Message {
        deliver_after_ms: Some(400),
        ..Message::new("in 400 ms")
    };
    let started = std::time::Instant::now();
    broker
        .publish_messages("later", &[delayed, Message::new("now")])
        .await
        .unwrap();
    let first = consumer.recv(10).await.unwrap();
    assert_eq!(body_strings(&first), ["now"]);
    let second = tokio::time::timeout(Duration::from_secs(5), consumer.recv(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(body_strings(&second), ["in 400 ms"]);
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "delivered after {:?}",
        started.elapsed()
    );
}

fn header<'a>(message: &'a Message, name: &str) -> &'a str {
    message
        .headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no header {name} in {:?}", message.headers))
}

#[tokio::test]
async fn a_message_given_up_moves_to_the_dead_letter_topic_with_where_it_came_from() {
    let broker = Broker::open(BrokerConfig::default());
    let consumer = broker
        .subscribe(&SubscribeRequest {
            max_attempts: 2,
            ..sub("jobs", "workers")
        })
        .unwrap();
    let poisoned = Message {
        headers: vec![("trace".into(), "abc".into())],
        ..Message::new("poison")
    };
    broker
        .publish_messages("jobs", &[poisoned, Message::new("fine")])
        .await
        .unwrap();
    for attempt in 1..=2u16 {
        let got = consumer.recv(1).await.unwrap();
        assert_eq!(
            (body_strings(&got)[0].as_str(), got[0].attempt),
            ("poison", attempt)
        );
        consumer
            .nack(&[OffsetRange::single(0, 0)], Duration::ZERO)
            .unwrap();
    }
    // Never delivered a third time: the next message comes instead.
    let next = consumer.recv(10).await.unwrap();
    assert_eq!(body_strings(&next), ["fine"]);
    ack_all(&consumer, &next);

    let dlq = broker
        .subscribe(&sub(&ferrymq_broker::dead_letter_topic("jobs"), "ops"))
        .unwrap();
    let dead = tokio::time::timeout(Duration::from_secs(5), dlq.recv(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(body_strings(&dead), ["poison"]);
    let m = &dead[0].message;
    assert_eq!(header(m, "trace"), "abc");
    assert_eq!(header(m, ferrymq_broker::HEADER_TOPIC), "jobs");
    assert_eq!(header(m, ferrymq_broker::HEADER_PARTITION), "0");
    assert_eq!(header(m, ferrymq_broker::HEADER_OFFSET), "0");
    assert_eq!(header(m, ferrymq_broker::HEADER_SUBSCRIPTION), "workers");
    assert_eq!(header(m, ferrymq_broker::HEADER_ATTEMPTS), "2");
    assert_eq!(
        header(m, ferrymq_broker::HEADER_REASON),
        "max_attempts (2) reached"
    );
    // Settled in the source once stored: the source retains nothing for this subscription.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let stats = broker.stats(Some("jobs")).unwrap();
        let s = &stats[0].subscriptions[0];
        if s.backlog == 0 && s.in_flight == 0 && stats[0].depth == 0 {
            assert_eq!(s.gave_up, 1);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{stats:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The dead letter of a message whose last attempt was nacked with a reason says why it
/// failed, not only that the attempts ran out; a long reason is cut to the reason limit.
#[tokio::test]
async fn a_dead_letter_keeps_the_reason_of_the_last_nack() {
    let broker = Broker::open(BrokerConfig::default());
    let consumer = broker
        .subscribe(&SubscribeRequest {
            max_attempts: 3,
            ..sub("jobs", "workers")
        })
        .unwrap();
    broker
        .publish_messages("jobs", &[Message::new("bad"), Message::new("long")])
        .await
        .unwrap();
    let long_reason = "é".repeat(600);
    for attempt in 1..=3u16 {
        let got = consumer.recv(10).await.unwrap();
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|d| d.attempt == attempt));
        let reason = format!("ValueError: bad total (attempt {attempt})");
        consumer
            .nack_with_reason(&[OffsetRange::single(0, 0)], Duration::ZERO, &reason)
            .unwrap();
        consumer
            .nack_with_reason(&[OffsetRange::single(0, 1)], Duration::ZERO, &long_reason)
            .unwrap();
    }
    let dlq = broker
        .subscribe(&sub(&ferrymq_broker::dead_letter_topic("jobs"), "ops"))
        .unwrap();
    let mut dead = Vec::new();
    while dead.len() < 2 {
        let got = tokio::time::timeout(Duration::from_secs(5), dlq.recv(10))
            .await
            .unwrap()
            .unwrap();
        dead.extend(got);
    }
    assert_eq!(
        header(&dead[0].message, ferrymq_broker::HEADER_REASON),
        "max_attempts (3) reached: ValueError: bad total (attempt 3)"
    );
    let cut = header(&dead[1].message, ferrymq_broker::HEADER_REASON);
    assert!(cut.starts_with("max_attempts (3) reached: éé"), "{cut}");
    assert!(
        cut.ends_with("...") && cut.len() <= 1024,
        "{} bytes",
        cut.len()
    );
}

#[tokio::test]
async fn a_consumer_can_dead_letter_a_message_at_once_with_its_reason() {
    let broker = Broker::open(BrokerConfig::default());
    let consumer = broker.subscribe(&sub("orders", "billing")).unwrap();
    broker.publish_messages("orders", &bodies(2)).await.unwrap();
    let got = consumer.recv(10).await.unwrap();
    assert_eq!(got.len(), 2);
    let first = OffsetRange::single(got[0].partition, got[0].offset);
    assert_eq!(
        consumer
            .dead_letter(&[first], "unparseable: missing field 'id'")
            .unwrap(),
        1
    );
    assert_eq!(consumer.in_flight(), 1);
    // Not delivered again, not even after the rest is given back.
    let second = OffsetRange::single(got[1].partition, got[1].offset);
    consumer.nack(&[second], Duration::ZERO).unwrap();
    let again = consumer.recv(10).await.unwrap();
    assert_eq!(body_strings(&again), ["m1"]);

    let dlq = broker.subscribe(&sub("orders.dlq", "ops")).unwrap();
    let dead = tokio::time::timeout(Duration::from_secs(5), dlq.recv(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(body_strings(&dead), ["m0"]);
    let m = &dead[0].message;
    assert_eq!(
        header(m, ferrymq_broker::HEADER_REASON),
        "unparseable: missing field 'id'"
    );
    assert_eq!(header(m, ferrymq_broker::HEADER_ATTEMPTS), "1");
}

#[tokio::test]
async fn drop_oldest_counts_each_discarded_message_once_with_or_without_subscriptions() {
    let broker = Broker::open(BrokerConfig::default());
    let config = TopicConfig {
        max_messages: 3,
        overflow: OverflowPolicy::DropOldest,
        ..Default::default()
    };
    // No subscription: the messages are lost all the same.
    broker.create_topic("alone", config.clone(), false).unwrap();
    broker.publish_messages("alone", &bodies(5)).await.unwrap();
    let stats = &broker.stats(Some("alone")).unwrap()[0];
    assert_eq!((stats.depth, stats.dropped), (3, 2));
    // Two subscriptions that both miss them: still one count per message.
    broker.create_topic("shared", config, false).unwrap();
    let _a = broker.subscribe(&sub("shared", "a")).unwrap();
    let _b = broker.subscribe(&sub("shared", "b")).unwrap();
    broker.publish_messages("shared", &bodies(5)).await.unwrap();
    let stats = &broker.stats(Some("shared")).unwrap()[0];
    assert_eq!((stats.depth, stats.dropped), (3, 2));
}
