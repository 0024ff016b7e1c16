//! Requeueing dead letters to the topic and partition they came from, for the subscription that
//! gave them up: by offset range or all at once, each once only (across restarts on disk).

use std::path::{Path, PathBuf};
use std::time::Duration;

use ferrymq_broker::{
    Broker, BrokerConfig, BrokerError, Consumer, DiskConfig, RequeueOutcome, HEADER_REQUEUED_FROM,
    HEADER_REQUEUE_FOR,
};
use ferrymq_protocol::{
    Delivery, FsyncPolicy, Message, OffsetRange, OverflowPolicy, RecordBatch, Storage,
    SubscribeRequest, TopicConfig,
};

fn sub(topic: &str, name: &str) -> SubscribeRequest {
    SubscribeRequest::earliest(topic, name)
}

fn topic_config(partitions: u32, storage: Storage) -> TopicConfig {
    TopicConfig {
        partitions,
        storage,
        fsync: match storage {
            Storage::Disk => FsyncPolicy::Always,
            _ => FsyncPolicy::Default,
        },
        ..TopicConfig::default()
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ferrymq-broker-requeue-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn open_durable(dir: &Path) -> Broker {
    Broker::open_durable(BrokerConfig::default(), DiskConfig::new(dir)).unwrap()
}

fn outcome(requeued: u64, skipped: u64) -> RequeueOutcome {
    RequeueOutcome { requeued, skipped }
}

fn body(delivery: &Delivery) -> String {
    String::from_utf8(delivery.message.body.to_vec()).unwrap()
}

fn header<'a>(message: &'a Message, name: &str) -> Option<&'a str> {
    message
        .headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Receives until `n` messages arrived (bounded in time).
async fn recv_n(consumer: &Consumer, n: usize) -> Vec<Delivery> {
    let mut out = Vec::new();
    while out.len() < n {
        let got = tokio::time::timeout(
            Duration::from_secs(10),
            consumer.recv((n - out.len()) as u32),
        )
        .await
        .unwrap_or_else(|_| panic!("{n} messages within 10 s, got {}", out.len()))
        .unwrap();
        out.extend(got);
    }
    out
}

/// Bounds a wait.
async fn timeout<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("done within 10 s")
}

/// Nothing more arrives for a while.
async fn assert_idle(consumer: &Consumer) {
    if let Ok(got) = tokio::time::timeout(Duration::from_millis(300), consumer.recv(10)).await {
        panic!("expected nothing, got {:?}", got.unwrap());
    }
}

fn ack(consumer: &Consumer, deliveries: &[Delivery]) {
    let ranges = OffsetRange::coalesce(deliveries.iter().map(|d| (d.partition, d.offset)));
    assert_eq!(consumer.ack(&ranges).unwrap(), deliveries.len() as u64);
}

/// Waits until `topic` exists and holds `n` messages.
async fn wait_for_messages(broker: &Broker, topic: &str, n: u64) {
    let wait = async {
        while !broker.describe_topic(topic).is_ok_and(|t| t.messages == n) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap_or_else(|_| panic!("{topic} holds {n} messages within 10 s"));
}

/// Publishes `keys.len()` keyed messages to `topic`, receives them with `consumer` and
/// dead-letters them one by one, so that the dead-letter topic holds them in this order; returns
/// once they can be read there.
async fn dead_letter_in_order(broker: &Broker, consumer: &Consumer, topic: &str, keys: &[&str]) {
    let messages: Vec<Message> = keys
        .iter()
        .map(|k| {
            Message {
                priority: 3,
                headers: vec![("trace".into(), format!("t-{k}"))],
                ..Message::new(format!("body-{k}"))
            }
            .with_key(k.to_string())
        })
        .collect();
    broker.publish_messages(topic, &messages).await.unwrap();
    let mut got = recv_n(consumer, keys.len()).await;
    got.sort_by_key(|d| keys.iter().position(|k| body(d) == format!("body-{k}")));
    let dlq = ferrymq_broker::dead_letter_topic(topic);
    for (i, d) in got.iter().enumerate() {
        let range = OffsetRange::single(d.partition, d.offset);
        assert_eq!(consumer.dead_letter(&[range], "bad input").unwrap(), 1);
        wait_for_messages(broker, &dlq, i as u64 + 1).await;
    }
    // Counted once written; on disk they are readable once synced: wait for that, with a
    // subscription that goes again (not acking, so that a memory topic keeps them).
    let total = broker.describe_topic(&dlq).unwrap().messages as usize;
    let watcher = broker.subscribe(&sub(&dlq, "watch")).unwrap();
    recv_n(&watcher, total).await;
    drop(watcher);
    broker.delete_subscription(&dlq, "watch").unwrap();
}

/// Checks a requeued delivery against the message it was.
fn assert_requeued(delivery: &Delivery, key: &str, partition: u32, from: &str) {
    let m = &delivery.message;
    assert_eq!(body(delivery), format!("body-{key}"));
    assert_eq!(m.key.as_deref(), Some(key.as_bytes()));
    assert_eq!(m.priority, 3);
    assert_eq!(delivery.partition, partition, "back in its partition");
    assert_eq!(delivery.attempt, 1);
    assert_eq!(header(m, "trace"), Some(format!("t-{key}").as_str()));
    assert_eq!(header(m, HEADER_REQUEUE_FOR), Some("workers"));
    assert_eq!(header(m, HEADER_REQUEUED_FROM), Some(from));
    assert!(
        !m.headers
            .iter()
            .any(|(k, _)| k.starts_with("x-ferrymq-dead-")),
        "{:?}",
        m.headers
    );
    assert_eq!(m.deliver_after_ms, None);
}

#[tokio::test]
async fn memory_dead_letters_are_requeued_once_each_to_their_subscription() {
    let broker = Broker::open(BrokerConfig::default());
    broker
        .create_topic("jobs", topic_config(4, Storage::Memory), false)
        .unwrap();
    let consumer = broker.subscribe(&sub("jobs", "workers")).unwrap();
    let keys = ["a", "b", "c"];
    dead_letter_in_order(&broker, &consumer, "jobs", &keys).await;
    // Another subscription of the source, caught up: requeued messages are not for it.
    let audit = broker
        .subscribe(&SubscribeRequest {
            start: ferrymq_protocol::StartPosition::Latest,
            ..sub("jobs", "audit")
        })
        .unwrap();
    let partition_of = |k: &str| ferrymq_broker::partition_for_key(k.as_bytes(), 4);

    // One by its offset.
    assert_eq!(
        broker
            .requeue_dead_letters("jobs.dlq", Some((0, 1, 1)))
            .await
            .unwrap(),
        outcome(1, 0)
    );
    let got = recv_n(&consumer, 1).await;
    assert_requeued(&got[0], "b", partition_of("b"), "jobs.dlq/0-1");
    // For the other subscription it is neither pending nor listed.
    let pending = broker
        .list_messages(
            "jobs",
            "audit",
            ferrymq_protocol::ListKind::Pending,
            &[],
            10,
        )
        .unwrap();
    assert!(pending.entries.is_empty(), "{:?}", pending.entries);
    let status = broker
        .message_status("jobs", got[0].partition, got[0].offset)
        .unwrap();
    let audit_state = status
        .subscriptions
        .iter()
        .find(|s| s.subscription == "audit")
        .unwrap()
        .entry
        .state;
    assert_eq!(audit_state, ferrymq_protocol::MessageState::Settled);
    ack(&consumer, &got);

    // The rest, passing the one requeued before.
    assert_eq!(
        broker.requeue_dead_letters("jobs.dlq", None).await.unwrap(),
        outcome(2, 1)
    );
    let mut got = recv_n(&consumer, 2).await;
    got.sort_by_key(body);
    assert_requeued(&got[0], "a", partition_of("a"), "jobs.dlq/0-0");
    assert_requeued(&got[1], "c", partition_of("c"), "jobs.dlq/0-2");
    ack(&consumer, &got);

    // Nothing twice.
    assert_eq!(
        broker.requeue_dead_letters("jobs.dlq", None).await.unwrap(),
        outcome(0, 3)
    );
    assert_eq!(
        broker
            .requeue_dead_letters("jobs.dlq", Some((0, 0, 2)))
            .await
            .unwrap(),
        outcome(0, 3)
    );
    assert_idle(&consumer).await;
    assert_idle(&audit).await;
    assert_eq!(
        broker.stats(Some("jobs")).unwrap()[0].subscriptions.len(),
        2
    );
}

#[tokio::test]
async fn a_dead_letter_of_a_removed_subscription_is_skipped() {
    let broker = Broker::open(BrokerConfig::default());
    broker
        .create_topic("jobs", topic_config(1, Storage::Memory), false)
        .unwrap();
    let consumer = broker.subscribe(&sub("jobs", "workers")).unwrap();
    dead_letter_in_order(&broker, &consumer, "jobs", &["a"]).await;
    drop(consumer);
    broker.delete_subscription("jobs", "workers").unwrap();
    assert_eq!(
        broker.requeue_dead_letters("jobs.dlq", None).await.unwrap(),
        outcome(0, 1)
    );
}

#[tokio::test]
async fn records_that_are_not_dead_letters_or_lost_their_source_are_skipped() {
    let broker = Broker::open(BrokerConfig::default());
    broker
        .create_topic("gone", topic_config(1, Storage::Memory), false)
        .unwrap();
    let consumer = broker.subscribe(&sub("gone", "workers")).unwrap();
    dead_letter_in_order(&broker, &consumer, "gone", &["a"]).await;
    drop(consumer);
    broker.delete_topic("gone").unwrap();
    // Published to the dead-letter topic by hand: no dead-letter headers.
    broker
        .publish_messages("gone.dlq", &[Message::new("by hand")])
        .await
        .unwrap();
    for _ in 0..2 {
        assert_eq!(
            broker.requeue_dead_letters("gone.dlq", None).await.unwrap(),
            outcome(0, 2)
        );
    }
    assert_eq!(
        broker
            .requeue_dead_letters("gone.dlq", Some((0, 1, 1)))
            .await
            .unwrap(),
        outcome(0, 1)
    );
    // Offsets past the end select nothing.
    assert_eq!(
        broker
            .requeue_dead_letters("gone.dlq", Some((0, 2, 100)))
            .await
            .unwrap(),
        outcome(0, 0)
    );
}

#[tokio::test]
async fn a_failed_publish_stops_the_requeue_and_keeps_what_went_before() {
    let broker = Broker::open(BrokerConfig::default());
    // One message per partition, refusing more.
    broker
        .create_topic(
            "jobs",
            TopicConfig {
                overflow: OverflowPolicy::Reject,
                max_messages: 2,
                ..topic_config(2, Storage::Memory)
            },
            false,
        )
        .unwrap();
    let consumer = broker.subscribe(&sub("jobs", "workers")).unwrap();
    for p in 0..2u32 {
        let batch = RecordBatch::from_messages(&[Message::new(format!("m{p}"))]).unwrap();
        broker.publish("jobs", Some(p), batch).await.unwrap();
        let got = recv_n(&consumer, 1).await;
        assert_eq!(got[0].partition, p);
        consumer
            .dead_letter(&[OffsetRange::single(p, got[0].offset)], "bad")
            .unwrap();
        wait_for_messages(&broker, "jobs.dlq", p as u64 + 1).await;
    }
    wait_for_messages(&broker, "jobs", 0).await;
    // Partition 1 is full: the second dead letter cannot go back.
    let filler = RecordBatch::from_messages(&[Message::new("filler")]).unwrap();
    broker.publish("jobs", Some(1), filler).await.unwrap();
    let error = broker
        .requeue_dead_letters("jobs.dlq", None)
        .await
        .unwrap_err();
    assert!(matches!(error, BrokerError::TopicFull { .. }), "{error}");
    let got = recv_n(&consumer, 2).await;
    let mut bodies: Vec<String> = got.iter().map(body).collect();
    bodies.sort();
    assert_eq!(bodies, ["filler", "m0"]);
    ack(&consumer, &got);
    wait_for_messages(&broker, "jobs", 0).await;

    assert_eq!(
        broker.requeue_dead_letters("jobs.dlq", None).await.unwrap(),
        outcome(1, 1)
    );
    let got = recv_n(&consumer, 1).await;
    assert_eq!((body(&got[0]).as_str(), got[0].partition), ("m1", 1));
}

#[tokio::test]
async fn disk_dead_letters_stay_requeued_across_restarts_and_a_deleted_dlq_starts_afresh() {
    let dir = temp_dir("disk");
    let keys = ["a", "b", "c"];
    {
        let broker = open_durable(&dir);
        broker
            .create_topic("jobs", topic_config(2, Storage::Disk), false)
            .unwrap();
        let consumer = broker.subscribe(&sub("jobs", "workers")).unwrap();
        dead_letter_in_order(&broker, &consumer, "jobs", &keys).await;
        assert_eq!(
            broker.describe_topic("jobs.dlq").unwrap().config.storage,
            Storage::Disk
        );
        assert_eq!(
            broker
                .requeue_dead_letters("jobs.dlq", Some((0, 1, 1)))
                .await
                .unwrap(),
            outcome(1, 0)
        );
        let got = recv_n(&consumer, 1).await;
        assert_requeued(
            &got[0],
            "b",
            ferrymq_broker::partition_for_key(b"b", 2),
            "jobs.dlq/0-1",
        );
        ack(&consumer, &got);
        timeout(consumer.acks_saved()).await.unwrap();
        drop(consumer);
        broker.shutdown();
    }
    {
        let broker = open_durable(&dir);
        let consumer = broker.subscribe(&sub("jobs", "workers")).unwrap();
        assert_idle(&consumer).await;
        assert_eq!(
            broker.requeue_dead_letters("jobs.dlq", None).await.unwrap(),
            outcome(2, 1)
        );
        let mut got = recv_n(&consumer, 2).await;
        got.sort_by_key(body);
        assert_eq!(
            got.iter().map(body).collect::<Vec<_>>(),
            ["body-a", "body-c"]
        );
        assert_eq!(
            header(&got[1].message, HEADER_REQUEUED_FROM),
            Some("jobs.dlq/0-2")
        );
        ack(&consumer, &got);
        timeout(consumer.acks_saved()).await.unwrap();
        assert_eq!(
            broker.requeue_dead_letters("jobs.dlq", None).await.unwrap(),
            outcome(0, 3)
        );
        drop(consumer);
        broker.shutdown();
    }
    {
        let broker = open_durable(&dir);
        let consumer = broker.subscribe(&sub("jobs", "workers")).unwrap();
        assert_eq!(
            broker.requeue_dead_letters("jobs.dlq", None).await.unwrap(),
            outcome(0, 3)
        );
        assert_idle(&consumer).await;

        // A new dead-letter topic of the same name has nothing requeued yet.
        broker.delete_topic("jobs.dlq").unwrap();
        dead_letter_in_order(&broker, &consumer, "jobs", &["d"]).await;
        assert_eq!(
            broker.requeue_dead_letters("jobs.dlq", None).await.unwrap(),
            outcome(1, 0)
        );
        let got = recv_n(&consumer, 1).await;
        assert_eq!(body(&got[0]), "body-d");
        drop(consumer);
        broker.shutdown();
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn requeue_refuses_an_unknown_topic_and_bad_ranges() {
    let broker = Broker::open(BrokerConfig::default());
    assert_eq!(
        broker
            .requeue_dead_letters("nope.dlq", None)
            .await
            .unwrap_err(),
        BrokerError::UnknownTopic("nope.dlq".into())
    );
    broker
        .create_topic("jobs.dlq", topic_config(2, Storage::Memory), false)
        .unwrap();
    let field = |error: BrokerError| match error {
        BrokerError::InvalidArgument { field, .. } => field,
        other => panic!("{other}"),
    };
    let error = broker
        .requeue_dead_letters("jobs.dlq", Some((2, 0, 0)))
        .await
        .unwrap_err();
    assert_eq!(field(error), "partition");
    let error = broker
        .requeue_dead_letters("jobs.dlq", Some((1, 3, 2)))
        .await
        .unwrap_err();
    assert_eq!(field(error), "last_offset");
    assert_eq!(
        broker
            .requeue_dead_letters("jobs.dlq", Some((1, 0, u64::MAX)))
            .await
            .unwrap(),
        outcome(0, 0)
    );
}
