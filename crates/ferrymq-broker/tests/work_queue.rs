//! Work-queue rules through the broker's API: priorities, ordered subscriptions, a chosen
//! dead-letter topic, message status by id and the paged listings, and the races between acks,
//! timeouts, consumers leaving and restarts.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use ferrymq_broker::{Broker, BrokerConfig, BrokerError, Consumer, DiskConfig};
use ferrymq_protocol::{
    Delivery, ListKind, Message, MessageState, OffsetRange, Storage, SubscribeRequest, TopicConfig,
};
use tokio::time::timeout;

fn sub(topic: &str, name: &str) -> SubscribeRequest {
    SubscribeRequest::earliest(topic, name)
}

fn ordered(topic: &str, name: &str) -> SubscribeRequest {
    SubscribeRequest {
        ordered: true,
        ..sub(topic, name)
    }
}

fn body(d: &Delivery) -> String {
    String::from_utf8(d.message.body.to_vec()).unwrap()
}

fn keyed(key: &str, body: &str) -> Message {
    Message {
        key: Some(Bytes::copy_from_slice(key.as_bytes())),
        ..Message::new(body.to_string())
    }
}

fn one(d: &Delivery) -> [OffsetRange; 1] {
    [OffsetRange::single(d.partition, d.offset)]
}

/// Receives within two seconds.
async fn recv(consumer: &Consumer, max: u32) -> Vec<Delivery> {
    timeout(Duration::from_secs(2), consumer.recv(max))
        .await
        .expect("a delivery within 2 s")
        .unwrap()
}

/// Nothing arrives within 100 ms.
async fn assert_idle(consumer: &Consumer) {
    let got = timeout(Duration::from_millis(100), consumer.recv(10)).await;
    assert!(
        got.is_err(),
        "expected nothing, got {:?}",
        got.map(|r| r.map(|v| v.len()))
    );
}

fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("ferrymq-work-queue-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn higher_priority_is_delivered_first_on_memory_and_disk_topics() {
    let dir = temp_dir("priority");
    let broker = Broker::open_durable(BrokerConfig::default(), DiskConfig::new(&dir)).unwrap();
    for storage in [Storage::Memory, Storage::Disk] {
        let topic = format!("jobs-{storage:?}");
        let config = TopicConfig {
            storage,
            ..TopicConfig::default()
        };
        broker.create_topic(&topic, config, false).unwrap();
        let c = broker.subscribe(&sub(&topic, "w")).unwrap();
        let messages: Vec<Message> = [(0, "low-a"), (9, "urgent"), (0, "low-b"), (5, "mid")]
            .into_iter()
            .map(|(p, b)| Message::new(b).with_priority(p))
            .collect();
        broker.publish_messages(&topic, &messages).await.unwrap();
        let got = recv(&c, 10).await;
        let order: Vec<String> = got.iter().map(body).collect();
        assert_eq!(order, ["urgent", "mid", "low-a", "low-b"], "{storage:?}");
        // A nacked high-priority message comes back before the others.
        c.nack(&one(&got[2]), Duration::ZERO).unwrap();
        c.nack(&one(&got[0]), Duration::ZERO).unwrap();
        let again: Vec<String> = recv(&c, 10).await.iter().map(body).collect();
        assert_eq!(again, ["urgent", "low-a"]);
    }
}

#[tokio::test]
async fn an_ordered_subscription_keeps_one_message_per_key_in_flight_across_consumers() {
    let broker = Broker::open(BrokerConfig::default());
    let c1 = broker.subscribe(&ordered("orders", "o")).unwrap();
    let c2 = broker.subscribe(&ordered("orders", "o")).unwrap();
    let messages = vec![
        keyed("a", "a1"),
        keyed("a", "a2"),
        keyed("b", "b1"),
        keyed("a", "a3"),
        keyed("b", "b2"),
    ];
    broker.publish_messages("orders", &messages).await.unwrap();
    let first = recv(&c1, 10).await;
    assert_eq!(first.iter().map(body).collect::<Vec<_>>(), ["a1", "b1"]);
    // The second consumer gets nothing: both keys are in flight.
    assert_idle(&c2).await;
    // b1 acked: b2 goes to whoever polls, and is not blocked by key a.
    c1.ack(&one(&first[1])).unwrap();
    let b2 = recv(&c2, 10).await;
    assert_eq!(b2.iter().map(body).collect::<Vec<_>>(), ["b2"]);
    // a1 given back: it comes again before a2, to any consumer.
    c1.nack(&one(&first[0]), Duration::ZERO).unwrap();
    let a1 = recv(&c2, 10).await;
    assert_eq!((body(&a1[0]), a1[0].attempt), ("a1".to_string(), 2));
    c2.ack(&one(&a1[0])).unwrap();
    let a2 = recv(&c1, 10).await;
    assert_eq!(a2.iter().map(body).collect::<Vec<_>>(), ["a2"]);
    // Ordered delivery needs acks.
    let refused = broker.subscribe(&SubscribeRequest {
        auto_ack: true,
        ..ordered("orders", "")
    });
    assert!(matches!(
        refused,
        Err(BrokerError::InvalidArgument {
            field: "ordered",
            ..
        })
    ));
    let conflict = broker.subscribe(&sub("orders", "o"));
    assert!(matches!(conflict, Err(BrokerError::Conflict(_))));
}

#[tokio::test]
async fn an_ack_that_arrives_after_its_timeout_fired_settles_nothing() {
    let broker = Broker::open(BrokerConfig::default());
    // Long enough that the redelivery does not time out again while the test looks at it.
    let request = SubscribeRequest {
        ack_timeout_ms: 400,
        ..ordered("slow", "s")
    };
    let c1 = broker.subscribe(&request).unwrap();
    broker
        .publish_messages("slow", &[keyed("k", "first"), keyed("k", "second")])
        .await
        .unwrap();
    let got = recv(&c1, 10).await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["first"]);
    let c2 = broker.subscribe(&request).unwrap();
    // The timeout fires; the redelivery goes to c2 (c1 holds nothing now but may poll too).
    let again = recv(&c2, 10).await;
    assert_eq!(
        (body(&again[0]), again[0].attempt),
        ("first".to_string(), 2)
    );
    // c1's late ack is ignored: the message stays in flight to c2, "second" stays blocked.
    assert_eq!(c1.ack(&one(&got[0])).unwrap(), 0);
    assert_idle(&c1).await;
    let status = broker.message_status("slow", 0, got[0].offset).unwrap();
    let entry = &status.subscriptions[0].entry;
    assert_eq!((entry.state, entry.attempts), (MessageState::InFlight, 2));
    assert_eq!(c2.ack(&one(&again[0])).unwrap(), 1);
    let second = recv(&c1, 10).await;
    assert_eq!(second.iter().map(body).collect::<Vec<_>>(), ["second"]);
}

#[tokio::test]
async fn a_consumer_that_leaves_in_the_middle_of_a_batch_gives_the_rest_back_in_order() {
    let broker = Broker::open(BrokerConfig::default());
    let c1 = broker.subscribe(&ordered("batch", "b")).unwrap();
    let c2 = broker.subscribe(&ordered("batch", "b")).unwrap();
    let messages: Vec<Message> = (0..20)
        .map(|i| keyed(&format!("k{}", i % 4), &format!("m{i}")))
        .collect();
    broker.publish_messages("batch", &messages).await.unwrap();
    let got = recv(&c1, 4).await;
    assert_eq!(got.len(), 4, "one per key");
    // Half of the batch is acked, then the consumer is gone.
    c1.ack(&one(&got[0])).unwrap();
    c1.ack(&one(&got[1])).unwrap();
    drop(c1);
    // c2 sees every remaining message exactly in per-key publish order.
    let mut seen: HashMap<String, Vec<usize>> = HashMap::new();
    let mut received = 0;
    while received < 18 {
        let batch = recv(&c2, 100).await;
        for d in &batch {
            let key = String::from_utf8(d.message.key.clone().unwrap().to_vec()).unwrap();
            let n: usize = body(d)[1..].parse().unwrap();
            seen.entry(key).or_default().push(n);
            c2.ack(&one(d)).unwrap();
        }
        received += batch.len();
    }
    for (key, ns) in &seen {
        let mut sorted = ns.clone();
        sorted.sort_unstable();
        assert_eq!(ns, &sorted, "key {key} kept its order");
    }
    assert_eq!(received, 18);
}

#[tokio::test]
async fn status_by_id_and_the_listings_tell_what_became_of_each_message() {
    let config = BrokerConfig {
        status_history: 3,
        ..BrokerConfig::default()
    };
    let broker = Broker::open(config);
    let c = broker
        .subscribe(&SubscribeRequest {
            max_attempts: 1,
            ..sub("tasks", "w")
        })
        .unwrap();
    let other = broker.subscribe(&sub("tasks", "audit")).unwrap();
    let messages: Vec<Message> = (0..6).map(|i| Message::new(format!("t{i}"))).collect();
    broker.publish_messages("tasks", &messages).await.unwrap();
    let got = recv(&c, 3).await;
    c.ack_with_result(&one(&got[0]), Some(b"{\"ok\":true}"))
        .unwrap();
    c.dead_letter(&one(&got[1]), "bad input").unwrap();
    // got[2] stays in flight; 3..6 pending.
    let dead = timeout(Duration::from_secs(2), async {
        loop {
            let status = broker.message_status("tasks", 0, 1).unwrap();
            let w = status
                .subscriptions
                .iter()
                .find(|s| s.subscription == "w")
                .unwrap();
            if w.entry.settled_ms != 0 {
                return w.entry.clone();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    assert_eq!(dead.state, MessageState::DeadLettered);
    assert_eq!(dead.reason, "bad input");
    assert_eq!(dead.dead_letter, Some((0, 0)), "first message of tasks.dlq");

    let status = broker.message_status("tasks", 0, 0).unwrap();
    assert_eq!(status.body_bytes, 2);
    assert!(status.published_ms > 0);
    let by_name: HashMap<&str, _> = status
        .subscriptions
        .iter()
        .map(|s| (s.subscription.as_str(), &s.entry))
        .collect();
    let w = by_name["w"];
    assert_eq!(w.state, MessageState::Acked);
    assert_eq!(&w.result[..], b"{\"ok\":true}");
    assert!(w.first_delivered_ms >= status.published_ms && w.settled_ms >= w.first_delivered_ms);
    assert_eq!(by_name["audit"].state, MessageState::Pending);
    let flying = &broker.message_status("tasks", 0, 2).unwrap().subscriptions;
    let w2 = flying.iter().find(|s| s.subscription == "w").unwrap();
    assert_eq!(w2.entry.state, MessageState::InFlight);
    assert!(w2.entry.due_ms > w2.entry.first_delivered_ms);

    // Pending, two per page.
    let mut offsets = Vec::new();
    let mut page = Bytes::new();
    loop {
        let p = broker
            .list_messages("tasks", "w", ListKind::Pending, &page, 2)
            .unwrap();
        assert!(p.entries.len() <= 2);
        offsets.extend(p.entries.iter().map(|e| e.offset));
        if p.next_page.is_empty() {
            break;
        }
        page = p.next_page;
    }
    assert_eq!(offsets, [3, 4, 5]);
    let in_flight = broker
        .list_messages("tasks", "w", ListKind::InFlight, &[], 10)
        .unwrap();
    assert_eq!(
        in_flight
            .entries
            .iter()
            .map(|e| e.offset)
            .collect::<Vec<_>>(),
        [2]
    );
    let acked = broker
        .list_messages("tasks", "w", ListKind::Acked, &[], 10)
        .unwrap();
    assert_eq!(acked.entries.len(), 1);
    assert_eq!(&acked.entries[0].result[..], b"{\"ok\":true}");
    let dead = broker
        .list_messages("tasks", "w", ListKind::DeadLettered, &[], 10)
        .unwrap();
    assert_eq!(
        dead.entries.iter().map(|e| e.offset).collect::<Vec<_>>(),
        [1]
    );

    // The acked history keeps the newest three, pages newest first.
    c.ack(&one(&got[2])).unwrap();
    for d in recv(&c, 3).await {
        c.ack(&one(&d)).unwrap();
    }
    let first = broker
        .list_messages("tasks", "w", ListKind::Acked, &[], 2)
        .unwrap();
    assert_eq!(
        first.entries.iter().map(|e| e.offset).collect::<Vec<_>>(),
        [5, 4]
    );
    let second = broker
        .list_messages("tasks", "w", ListKind::Acked, &first.next_page, 2)
        .unwrap();
    assert_eq!(
        second.entries.iter().map(|e| e.offset).collect::<Vec<_>>(),
        [3]
    );
    assert!(second.next_page.is_empty());
    let old = broker.message_status("tasks", 0, 0).unwrap();
    let w = old
        .subscriptions
        .iter()
        .find(|s| s.subscription == "w")
        .unwrap();
    assert_eq!(
        w.entry.state,
        MessageState::Settled,
        "older than the history"
    );

    // Bad requests.
    assert!(matches!(
        broker.message_status("tasks", 0, 6),
        Err(BrokerError::UnknownMessage { .. })
    ));
    assert!(matches!(
        broker.message_status("tasks", 3, 0),
        Err(BrokerError::InvalidArgument {
            field: "partition",
            ..
        })
    ));
    assert!(matches!(
        broker.message_status("nope", 0, 0),
        Err(BrokerError::UnknownTopic(_))
    ));
    assert!(matches!(
        broker.list_messages("tasks", "nope", ListKind::Pending, &[], 10),
        Err(BrokerError::UnknownSubscription { .. })
    ));
    assert!(matches!(
        broker.list_messages("tasks", "w", ListKind::Pending, b"junk", 10),
        Err(BrokerError::InvalidArgument { field: "page", .. })
    ));
    assert!(matches!(
        broker.list_messages("tasks", "w", ListKind::Pending, &[], 0),
        Err(BrokerError::InvalidArgument { field: "limit", .. })
    ));
    let too_big = vec![0u8; ferrymq_protocol::limits::ACK_RESULT_BYTES_MAX + 1];
    assert!(matches!(
        c.ack_with_result(&[], Some(&too_big)),
        Err(BrokerError::InvalidArgument {
            field: "result",
            ..
        })
    ));
    drop(other);
}

#[tokio::test]
async fn dead_letters_go_to_the_topic_the_subscription_names() {
    let broker = Broker::open(BrokerConfig::default());
    let c = broker
        .subscribe(&SubscribeRequest {
            dead_letter_topic: "failed-jobs".into(),
            ..sub("jobs", "w")
        })
        .unwrap();
    let dlq = broker.subscribe(&sub("failed-jobs", "inspect")).unwrap();
    broker
        .publish_messages("jobs", &[Message::new("x")])
        .await
        .unwrap();
    let got = recv(&c, 1).await;
    c.dead_letter(&one(&got[0]), "cannot parse").unwrap();
    let dead = recv(&dlq, 1).await;
    assert_eq!(body(&dead[0]), "x");
    let refused = broker.subscribe(&SubscribeRequest {
        dead_letter_topic: "jobs".into(),
        ..sub("jobs", "x")
    });
    assert!(matches!(
        refused,
        Err(BrokerError::InvalidArgument {
            field: "dead_letter_topic",
            ..
        })
    ));
}

#[tokio::test]
async fn a_restart_between_delivery_and_ack_delivers_again_in_key_order_and_priority() {
    let dir = temp_dir("restart");
    let topic = TopicConfig {
        storage: Storage::Disk,
        ..TopicConfig::default()
    };
    {
        let broker = Broker::open_durable(BrokerConfig::default(), DiskConfig::new(&dir)).unwrap();
        broker.create_topic("q", topic, false).unwrap();
        let c = broker.subscribe(&ordered("q", "o")).unwrap();
        let messages = vec![
            keyed("a", "a1"),
            keyed("a", "a2"),
            keyed("b", "b1").with_priority(3),
            keyed("c", "c1"),
        ];
        broker.publish_messages("q", &messages).await.unwrap();
        let got = recv(&c, 10).await;
        assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["b1", "a1", "c1"]);
        c.ack(&one(&got[2])).unwrap();
        c.acks_saved().await.unwrap();
        // a1 and b1 were delivered and not acked when the broker stops.
        broker.shutdown();
    }
    let broker = Broker::open_durable(BrokerConfig::default(), DiskConfig::new(&dir)).unwrap();
    let c = broker.subscribe(&ordered("q", "o")).unwrap();
    let got = recv(&c, 10).await;
    assert_eq!(
        got.iter().map(body).collect::<Vec<_>>(),
        ["b1", "a1"],
        "c1 stays acked, a2 waits for a1, b1 keeps its priority"
    );
    c.ack(&one(&got[1])).unwrap();
    let a2 = recv(&c, 10).await;
    assert_eq!(a2.iter().map(body).collect::<Vec<_>>(), ["a2"]);
    // Acked before the (clean) restart: the saved history still knows it.
    let status = broker.message_status("q", 0, 3).unwrap();
    assert_eq!(status.subscriptions[0].entry.state, MessageState::Acked);
}

#[tokio::test]
async fn an_ordered_backlog_read_from_the_files_keeps_every_key_in_order() {
    let dir = temp_dir("ordered-files");
    let mut disk = DiskConfig::new(&dir);
    // A tiny in-memory tail: nearly everything is read from the files, in scattered runs.
    disk.tail_cache_bytes = 1024;
    disk.tail_cache_bytes_min = 512;
    let broker = Broker::open_durable(BrokerConfig::default(), disk).unwrap();
    let topic = TopicConfig {
        storage: Storage::Disk,
        ..TopicConfig::default()
    };
    broker.create_topic("backlog", topic, false).unwrap();
    let consumers: Vec<Consumer> = (0..3)
        .map(|_| broker.subscribe(&ordered("backlog", "o")).unwrap())
        .collect();
    let messages: Vec<Message> = (0..3000)
        .map(|i| keyed(&format!("k{}", i % 50), &format!("{i}")))
        .collect();
    broker.publish_messages("backlog", &messages).await.unwrap();
    let mut last: HashMap<String, i64> = HashMap::new();
    let mut received = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while received < 3000 {
        assert!(
            std::time::Instant::now() < deadline,
            "only {received} of 3000 arrived"
        );
        for c in &consumers {
            let got = timeout(Duration::from_millis(50), c.recv(64)).await;
            let Ok(got) = got else { continue };
            for d in got.unwrap() {
                let key = String::from_utf8(d.message.key.clone().unwrap().to_vec()).unwrap();
                let n: i64 = body(&d).parse().unwrap();
                let before = last.insert(key.clone(), n).unwrap_or(-1);
                assert!(n > before, "key {key}: {n} after {before}");
                c.ack(&one(&d)).unwrap();
                received += 1;
            }
        }
    }
    assert_eq!(last.len(), 50);
}

#[tokio::test]
async fn priorities_hold_after_a_clean_restart_and_after_a_crash() {
    let dir = temp_dir("priority-restart");
    let topic = TopicConfig {
        storage: Storage::Disk,
        ..TopicConfig::default()
    };
    {
        let broker = Broker::open_durable(BrokerConfig::default(), DiskConfig::new(&dir)).unwrap();
        broker.create_topic("p", topic, false).unwrap();
        // A subscription that exists before the messages, consumed after the restarts.
        drop(broker.subscribe(&sub("p", "w")).unwrap());
        let messages: Vec<Message> = (0..50)
            .map(|i| Message::new(format!("low{i}")))
            .chain([Message::new("urgent").with_priority(9)])
            .chain((0..50).map(|i| Message::new(format!("after{i}"))))
            .collect();
        broker.publish_messages("p", &messages).await.unwrap();
        broker.shutdown();
    }
    // Clean restart: where priorities end was saved.
    {
        let broker = Broker::open_durable(BrokerConfig::default(), DiskConfig::new(&dir)).unwrap();
        let c = broker.subscribe(&sub("p", "w")).unwrap();
        let got = recv(&c, 1).await;
        assert_eq!(body(&got[0]), "urgent");
        c.nack(&one(&got[0]), Duration::ZERO).unwrap();
        drop(c);
        let more: Vec<Message> = (0..50)
            .map(|i| Message::new(format!("later{i}")))
            .chain([Message::new("urgent2").with_priority(9)])
            .collect();
        broker.publish_messages("p", &more).await.unwrap();
        // No shutdown: like a crash, nothing is saved at the end.
    }
    let broker = Broker::open_durable(BrokerConfig::default(), DiskConfig::new(&dir)).unwrap();
    let c = broker.subscribe(&sub("p", "w")).unwrap();
    let got = recv(&c, 2).await;
    let order: Vec<String> = got.iter().map(body).collect();
    assert_eq!(
        order,
        ["urgent", "urgent2"],
        "after a crash the cursor looks ahead again"
    );
    broker.shutdown();
}

#[tokio::test]
async fn ack_results_and_dead_letter_reasons_survive_a_clean_restart() {
    let dir = temp_dir("history-restart");
    let topic = TopicConfig {
        storage: Storage::Disk,
        ..TopicConfig::default()
    };
    {
        let broker = Broker::open_durable(BrokerConfig::default(), DiskConfig::new(&dir)).unwrap();
        broker.create_topic("h", topic, false).unwrap();
        let c = broker.subscribe(&sub("h", "w")).unwrap();
        broker
            .publish_messages("h", &[Message::new("a"), Message::new("b")])
            .await
            .unwrap();
        let got = recv(&c, 2).await;
        c.ack_with_result(&one(&got[0]), Some(b"done: 42")).unwrap();
        c.dead_letter(&one(&got[1]), "unparseable").unwrap();
        c.acks_saved().await.unwrap();
        timeout(Duration::from_secs(2), async {
            while broker.message_status("h", 0, 1).unwrap().subscriptions[0]
                .entry
                .settled_ms
                == 0
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();
        drop(c);
        broker.shutdown();
    }
    let broker = Broker::open_durable(BrokerConfig::default(), DiskConfig::new(&dir)).unwrap();
    let acked = &broker.message_status("h", 0, 0).unwrap().subscriptions[0].entry;
    assert_eq!(acked.state, MessageState::Acked);
    assert_eq!(&acked.result[..], b"done: 42");
    let dead = &broker.message_status("h", 0, 1).unwrap().subscriptions[0].entry;
    assert_eq!(dead.state, MessageState::DeadLettered);
    assert_eq!(dead.reason, "unparseable");
    assert_eq!(dead.dead_letter, Some((0, 0)));
    let listed = broker
        .list_messages("h", "w", ListKind::Acked, &[], 10)
        .unwrap();
    assert_eq!(listed.entries.len(), 1);
    broker.shutdown();
}
