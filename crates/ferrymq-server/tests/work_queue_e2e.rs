//! Work queues end to end over real sockets with the Rust client: ordered subscriptions across
//! two consumers, acks with a result and the message's status, paged listings, dead letters
//! requeued once to the subscription they died in, and the refusals. Every wait is bounded.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{error_code, Raw, TestServer, STEP};
use ferrymq_client::{
    Client, Delivery, Error, ErrorCode, ListKind, Message, MessageState, OffsetRange,
    RequeueSelection, StartPosition, SubscribeOptions, Subscription,
};
use ferrymq_protocol::limits::ACK_RESULT_BYTES_MAX;
use ferrymq_protocol::{Frame, SubscribeRequest};

/// How long a subscription must stay silent for "nothing more is delivered".
const QUIET: Duration = Duration::from_millis(300);

async fn connect(server: &TestServer) -> Client {
    Client::connect(server.addr.to_string())
        .await
        .expect("connect")
}

fn body(d: &Delivery) -> String {
    String::from_utf8(d.message.body.to_vec()).unwrap()
}

fn one(d: &Delivery) -> [OffsetRange; 1] {
    [OffsetRange::single(d.partition, d.offset)]
}

/// Everything the two subscriptions deliver until both have been quiet for [`QUIET`], tagged
/// with the index of the subscription that got it. Bounded by STEP.
async fn drain_both(subs: &mut [Subscription; 2]) -> Vec<(usize, Delivery)> {
    let mut got = Vec::new();
    tokio::time::timeout(STEP, async {
        loop {
            let [s0, s1] = &mut *subs;
            let next = tokio::time::timeout(QUIET, async {
                tokio::select! {
                    Some(d) = s0.next() => (0, d.expect("delivery")),
                    Some(d) = s1.next() => (1, d.expect("delivery")),
                }
            })
            .await;
            match next {
                Ok(item) => got.push(item),
                Err(_) => return,
            }
        }
    })
    .await
    .expect("deliveries stop in time");
    got
}

/// The next delivery of one subscription, bounded by STEP.
async fn next(sub: &mut Subscription) -> Delivery {
    tokio::time::timeout(STEP, sub.next())
        .await
        .expect("a delivery in time")
        .expect("stream open")
        .expect("delivery")
}

/// Asserts that nothing arrives for [`QUIET`].
async fn assert_quiet(sub: &mut Subscription) {
    if let Ok(Some(d)) = tokio::time::timeout(QUIET, sub.next()).await {
        panic!("nothing more expected, got {:?}", d.map(|d| body(&d)));
    }
}

#[tokio::test]
async fn an_ordered_subscriptions_acks_do_not_wait_for_the_ack_flush_delay() {
    // The next message of a key waits for the ack of the one before, so acks that waited for
    // company would pace a hot key at one message per flush delay: with a 300 ms delay, 8
    // messages of one key would take over 2 s.
    let server = TestServer::default().await;
    let delay = Duration::from_millis(300);
    let config = ferrymq_client::ClientConfig::new(server.addr.to_string()).ack_flush_delay(delay);
    let consumer = Client::connect_with(config).await.unwrap();
    let producer = connect(&server).await;
    let subscribe = |name: &str, ordered: bool| {
        consumer.subscribe(
            SubscribeOptions::new("hot")
                .subscription(name)
                .ordered(ordered),
        )
    };
    let mut in_order = subscribe("in-order", true).await.unwrap();
    let mut any_order = subscribe("any-order", false).await.unwrap();
    let messages: Vec<Message> = (0..8)
        .map(|i| Message::new(format!("m{i}")).with_key("hot"))
        .collect();
    producer
        .publish_batch("hot", None, &messages)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    for i in 0..8 {
        let d = next(&mut in_order).await;
        assert_eq!(body(&d), format!("m{i}"));
        in_order.ack(&d).await.unwrap();
    }
    let took = started.elapsed();
    assert!(took < delay * 3, "8 messages of one key took {took:?}");

    // The unordered subscription got the same messages, unpaced by any ack.
    for i in 0..8 {
        assert_eq!(body(&next(&mut any_order).await), format!("m{i}"));
    }
}

#[tokio::test]
async fn an_ordered_subscription_keeps_one_message_per_key_in_flight_across_two_consumers() {
    let server = TestServer::default().await;
    let (c1, c2, producer) = (
        connect(&server).await,
        connect(&server).await,
        connect(&server).await,
    );
    let options = SubscribeOptions::new("orders")
        .subscription("shipping")
        .ordered(true)
        .credit(16);
    let mut subs = [
        c1.subscribe(options.clone()).await.unwrap(),
        c2.subscribe(options).await.unwrap(),
    ];
    let messages: Vec<Message> = [
        ("a", "a1"),
        ("a", "a2"),
        ("b", "b1"),
        ("a", "a3"),
        ("b", "b2"),
    ]
    .iter()
    .map(|(key, body)| Message::new(*body).with_key(*key))
    .collect();
    producer
        .publish_batch("orders", None, &messages)
        .await
        .unwrap();

    let bodies = |got: &[(usize, Delivery)]| {
        let mut b: Vec<String> = got.iter().map(|(_, d)| body(d)).collect();
        b.sort();
        b
    };
    // The first of each key is out, across both consumers; nothing else.
    let first = drain_both(&mut subs).await;
    assert_eq!(bodies(&first), ["a1", "b1"]);
    let holder = |got: &[(usize, Delivery)], b: &str| {
        got.iter()
            .find(|(_, d)| body(d) == b)
            .map(|(i, d)| (*i, d.clone()))
            .unwrap()
    };
    // Key b flows once b1 is acked, while a1 still holds key a back.
    let (i, b1) = holder(&first, "b1");
    subs[i].ack_confirmed(&one(&b1)).await.unwrap();
    let second = drain_both(&mut subs).await;
    assert_eq!(bodies(&second), ["b2"]);
    // a1 given back: it comes again, before a2, to either consumer.
    let (i, a1) = holder(&first, "a1");
    subs[i].nack(&a1, Duration::ZERO).await.unwrap();
    let again = drain_both(&mut subs).await;
    assert_eq!(bodies(&again), ["a1"]);
    assert_eq!(again[0].1.attempt, 2);
    let (i, a1) = holder(&again, "a1");
    subs[i].ack_confirmed(&one(&a1)).await.unwrap();
    let third = drain_both(&mut subs).await;
    assert_eq!(bodies(&third), ["a2"]);
    let (i, a2) = holder(&third, "a2");
    subs[i].ack_confirmed(&one(&a2)).await.unwrap();
    let fourth = drain_both(&mut subs).await;
    assert_eq!(bodies(&fourth), ["a3"]);

    // Ordered delivery needs acks: refused by the server with its reason.
    let refused = c1
        .subscribe(SubscribeOptions::new("orders").ordered(true).auto_ack(true))
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused.code(),
            Some(ErrorCode::MalformedFrame | ErrorCode::InvalidArgument)
        ),
        "{refused}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn an_ack_with_a_result_shows_in_the_message_status() {
    let server = TestServer::default().await;
    let client = connect(&server).await;
    let mut sub = client
        .subscribe(SubscribeOptions::new("jobs").subscription("workers"))
        .await
        .unwrap();
    let audit = client
        .subscribe(SubscribeOptions::new("jobs").subscription("audit"))
        .await
        .unwrap();
    audit.close().await.unwrap();
    let id = client
        .publish(
            "jobs",
            Message::new("resize 42")
                .with_key("customer-7")
                .with_priority(3),
        )
        .await
        .unwrap();
    let d = next(&mut sub).await;

    let status = client
        .message_status("jobs", id.partition, id.offset)
        .await
        .unwrap();
    let entry = |status: &ferrymq_client::MessageStatus, name: &str| {
        status
            .subscriptions
            .iter()
            .find(|s| s.subscription == name)
            .unwrap_or_else(|| panic!("subscription {name} in {status:?}"))
            .entry
            .clone()
    };
    let flying = entry(&status, "workers");
    assert_eq!((flying.state, flying.attempts), (MessageState::InFlight, 1));
    assert!(flying.due_ms > flying.first_delivered_ms, "{flying:?}");

    // Too large: refused before anything is sent, and the message is still in flight.
    let error = sub
        .ack_with_result(&d, vec![b'x'; ACK_RESULT_BYTES_MAX + 1])
        .await
        .unwrap_err();
    assert!(
        matches!(error, Error::InvalidArgument(ref text) if text.contains("4096")),
        "{error}"
    );
    sub.ack_with_result(&d, "done: 42").await.unwrap();

    let status = client
        .message_status("jobs", id.partition, id.offset)
        .await
        .unwrap();
    assert_eq!(status.key.as_deref(), Some(&b"customer-7"[..]));
    assert_eq!((status.priority, status.body_bytes), (3, 9));
    assert!(status.published_ms > 0);
    let acked = entry(&status, "workers");
    assert_eq!(acked.state, MessageState::Acked);
    assert_eq!(&acked.result[..], b"done: 42");
    assert_eq!(acked.attempts, 1);
    assert!(acked.settled_ms >= acked.first_delivered_ms && acked.first_delivered_ms > 0);
    assert_eq!(entry(&status, "audit").state, MessageState::Pending);

    // The acked listing carries the result too.
    let (listed, next_page) = client
        .list_messages("jobs", "workers", ListKind::Acked, Bytes::new(), 10)
        .await
        .unwrap();
    assert!(next_page.is_empty());
    assert_eq!(listed.len(), 1);
    assert_eq!(&listed[0].result[..], b"done: 42");

    // Unknown ids and topics are refused with their codes.
    let error = client
        .message_status("jobs", id.partition, id.offset + 100)
        .await
        .unwrap_err();
    assert_eq!(error.code(), Some(ErrorCode::UnknownMessage), "{error}");
    let error = client.message_status("nowhere", 0, 0).await.unwrap_err();
    assert_eq!(error.code(), Some(ErrorCode::UnknownTopic), "{error}");
    let error = client.message_status("jobs", 9, 0).await.unwrap_err();
    assert_eq!(error.code(), Some(ErrorCode::InvalidArgument), "{error}");
    // The connection serves on after those refusals.
    client.ping().await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn an_oversized_ack_result_is_refused_by_the_server_too() {
    let server = TestServer::default().await;
    let mut raw = Raw::hello(server.addr).await;
    let request = SubscribeRequest {
        topic: "t".into(),
        subscription: "s".into(),
        start: StartPosition::Latest,
        ack_timeout_ms: 0,
        max_attempts: 0,
        credit: 10,
        auto_ack: false,
        ordered: false,
        partitions: Vec::new(),
        dead_letter_topic: String::new(),
    };
    let (_, reply) = raw.request(2, &Frame::Subscribe(request)).await;
    let Frame::Subscribed { consumer_id, .. } = reply else {
        panic!("{reply:?}")
    };
    // A valid ACK_RESULT for nothing in flight is answered OK (acks of nothing are ignored).
    let (_, reply) = raw
        .request(
            3,
            &Frame::AckResult {
                consumer_id,
                result: Bytes::from_static(b"ok"),
                ranges: vec![OffsetRange::single(0, 0)],
            },
        )
        .await;
    assert_eq!(reply, Frame::Ok);
    let (_, reply) = raw
        .request(
            4,
            &Frame::AckResult {
                consumer_id: consumer_id + 7,
                result: Bytes::from_static(b"ok"),
                ranges: vec![OffsetRange::single(0, 0)],
            },
        )
        .await;
    assert_eq!(error_code(&reply), Some(ErrorCode::UnknownConsumer));
    let (_, reply) = raw
        .request(
            5,
            &Frame::AckResult {
                consumer_id,
                result: Bytes::from(vec![b'x'; ACK_RESULT_BYTES_MAX + 1]),
                ranges: vec![OffsetRange::single(0, 0)],
            },
        )
        .await;
    assert_eq!(error_code(&reply), Some(ErrorCode::MalformedFrame));
    let Frame::Error { message, .. } = &reply else {
        unreachable!()
    };
    assert!(message.contains("4096"), "{message}");
    assert!(raw.closed().await);
    server.shutdown().await;
}

#[tokio::test]
async fn pending_messages_are_listed_two_per_page() {
    let server = TestServer::default().await;
    let client = connect(&server).await;
    // The subscription exists (and keeps its position) without a consumer attached.
    client
        .subscribe(SubscribeOptions::new("tasks").subscription("w"))
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    let messages: Vec<Message> = (0..5).map(|i| Message::new(format!("t{i}"))).collect();
    client
        .publish_batch("tasks", None, &messages)
        .await
        .unwrap();

    let mut pages = Vec::new();
    let mut page = Bytes::new();
    // Bounded: 5 messages, 2 per page, and a limit on the turns.
    for _ in 0..10 {
        let (entries, next_page) = client
            .list_messages("tasks", "w", ListKind::Pending, page, 2)
            .await
            .unwrap();
        assert!(entries.iter().all(|e| e.state == MessageState::Pending));
        assert!(entries
            .iter()
            .all(|e| e.published_ms > 0 && e.attempts == 0));
        pages.push(entries.iter().map(|e| e.offset).collect::<Vec<_>>());
        if next_page.is_empty() {
            break;
        }
        page = next_page;
    }
    assert_eq!(pages, [vec![0, 1], vec![2, 3], vec![4]]);
    let (in_flight, _) = client
        .list_messages("tasks", "w", ListKind::InFlight, Bytes::new(), 10)
        .await
        .unwrap();
    assert!(in_flight.is_empty());

    // Refused before sending: a limit outside 1..=1000, a token too long, no subscription name.
    for limit in [0, 1001] {
        let error = client
            .list_messages("tasks", "w", ListKind::Pending, Bytes::new(), limit)
            .await
            .unwrap_err();
        assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
    }
    let error = client
        .list_messages("tasks", "w", ListKind::Pending, Bytes::from(vec![0; 65]), 2)
        .await
        .unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
    assert!(client
        .list_messages("tasks", "", ListKind::Pending, Bytes::new(), 2)
        .await
        .is_err());
    // Refused by the broker: a token it never handed out, a subscription that does not exist.
    let error = client
        .list_messages(
            "tasks",
            "w",
            ListKind::Pending,
            Bytes::from_static(b"xyz"),
            2,
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), Some(ErrorCode::InvalidArgument), "{error}");
    let error = client
        .list_messages("tasks", "nobody", ListKind::Pending, Bytes::new(), 2)
        .await
        .unwrap_err();
    assert_eq!(
        error.code(),
        Some(ErrorCode::UnknownSubscription),
        "{error}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_dead_letter_is_requeued_once_to_the_subscription_it_died_in() {
    let server = TestServer::default().await;
    let client = connect(&server).await;
    let mut sub = client
        .subscribe(
            SubscribeOptions::new("t")
                .subscription("s")
                .dead_letter_topic("t.failed"),
        )
        .await
        .unwrap();
    let mut other = client
        .subscribe(SubscribeOptions::new("t").subscription("other"))
        .await
        .unwrap();
    let id = client.publish("t", Message::new("bad")).await.unwrap();
    let d = next(&mut sub).await;
    // `other` holds its copy in flight, so the message stays retained for the status below (a
    // memory topic lets go of messages every subscription has settled).
    let seen = next(&mut other).await;
    sub.dead_letter(&one(&d), "schema v3 expected")
        .await
        .unwrap();

    // The dead letter is settled in `s` once stored in the topic the subscription names.
    let dead = tokio::time::timeout(STEP, async {
        loop {
            let status = client
                .message_status("t", id.partition, id.offset)
                .await
                .unwrap();
            let s = status
                .subscriptions
                .iter()
                .find(|s| s.subscription == "s")
                .unwrap()
                .entry
                .clone();
            if s.state == MessageState::DeadLettered {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("dead-lettered in time");
    assert_eq!(dead.reason, "schema v3 expected");
    let (dl_partition, dl_offset) = dead.dead_letter.expect("where it went");
    let (listed, _) = client
        .list_messages("t", "s", ListKind::DeadLettered, Bytes::new(), 10)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].dead_letter, Some((dl_partition, dl_offset)));

    let (requeued, skipped) = client
        .requeue_dead_letters("t.failed", RequeueSelection::All)
        .await
        .unwrap();
    assert_eq!((requeued, skipped), (1, 0));
    let again = next(&mut sub).await;
    assert_eq!(body(&again), "bad");
    sub.ack_confirmed(&one(&again)).await.unwrap();
    // Only the subscription it died in sees it again.
    assert_quiet(&mut other).await;
    other.ack_confirmed(&one(&seen)).await.unwrap();

    // Once only: all of them, or that one by its range.
    assert_eq!(
        client
            .requeue_dead_letters("t.failed", RequeueSelection::All)
            .await
            .unwrap(),
        (0, 1)
    );
    assert_eq!(
        client
            .requeue_dead_letters(
                "t.failed",
                RequeueSelection::Range {
                    partition: dl_partition,
                    first: dl_offset,
                    last: dl_offset,
                },
            )
            .await
            .unwrap(),
        (0, 1)
    );
    assert_quiet(&mut sub).await;

    // Refusals: a range that ends before it starts (client side), a partition the topic does
    // not have, a topic that does not exist.
    let error = client
        .requeue_dead_letters(
            "t.failed",
            RequeueSelection::Range {
                partition: 0,
                first: 5,
                last: 4,
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(error, Error::InvalidArgument(_)), "{error}");
    let error = client
        .requeue_dead_letters(
            "t.failed",
            RequeueSelection::Range {
                partition: 7,
                first: 0,
                last: 0,
            },
        )
        .await
        .unwrap_err();
    assert_eq!(error.code(), Some(ErrorCode::InvalidArgument), "{error}");
    let error = client
        .requeue_dead_letters("nowhere.dlq", RequeueSelection::All)
        .await
        .unwrap_err();
    assert_eq!(error.code(), Some(ErrorCode::UnknownTopic), "{error}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_listing_page_too_large_for_the_frame_limit_is_cut_and_goes_on_from_there() {
    // The smallest frame limit the server allows with 1 KiB messages: about 530 KB.
    let mut config = ferrymq_server::ServerConfig {
        frame_bytes_max: 0,
        ..Default::default()
    };
    config.broker.message_body_bytes_max = 1024;
    let frame_bytes_max = config.effective_frame_bytes_max();
    let server = TestServer::start(config).await;
    let client = connect(&server).await;
    let mut sub = client
        .subscribe(SubscribeOptions::new("big").subscription("w").credit(300))
        .await
        .unwrap();
    let messages: Vec<Message> = (0..300).map(|i| Message::new(format!("{i}"))).collect();
    client.publish_batch("big", None, &messages).await.unwrap();
    let mut ranges = Vec::new();
    for _ in 0..300 {
        let d = next(&mut sub).await;
        ferrymq_client::push_offset(&mut ranges, d.partition, d.offset);
    }
    // 300 results of 4000 bytes: about 1.2 MB, more than one frame may carry.
    sub.ack_ranges_with_result(&ranges, vec![b'r'; 4000])
        .await
        .unwrap();

    let mut offsets = std::collections::BTreeSet::new();
    let mut page = Bytes::new();
    let mut pages = 0;
    while pages < 100 {
        pages += 1;
        let (entries, next_page) = client
            .list_messages("big", "w", ListKind::Acked, page, 1000)
            .await
            .unwrap();
        assert!(
            entries.len() * (64 + 4000) < frame_bytes_max,
            "{} entries do not fit {frame_bytes_max} bytes",
            entries.len()
        );
        assert!(entries.iter().all(|e| e.result.len() == 4000));
        offsets.extend(entries.iter().map(|e| e.offset));
        if next_page.is_empty() {
            break;
        }
        page = next_page;
    }
    assert!(pages > 1, "the page was cut");
    assert_eq!(offsets, (0..300).collect());
    server.shutdown().await;
}
