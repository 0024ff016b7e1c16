//! Arbitrary bytes as the `page` token of a subscription's listing (`GET
//! /topics/{topic}/subscriptions/{s}/messages?page=...`, the binary protocol's LIST): the token
//! comes back from clients, so it is untrusted. A listing must never panic; a token it cannot
//! read is an `invalid_argument` about `page`; whatever it answers holds at most `limit` entries
//! in the listing's order, and the token it hands out for the next page is always accepted.
#![no_main]

use std::sync::OnceLock;

use bytes::Bytes;
use ferrymq_broker::{Broker, BrokerConfig, BrokerError, Consumer};
use ferrymq_protocol::{ListKind, Message, OffsetRange, SubscribeRequest, TopicConfig};
use libfuzzer_sys::fuzz_target;

struct Fixture {
    // The broker's own tasks (timers, dead letters) run on it.
    _runtime: tokio::runtime::Runtime,
    broker: Broker,
    // Kept so that its deliveries stay in flight.
    _consumer: Consumer,
}

/// A memory topic of 3 partitions with 40 messages, one subscription holding some acked, some
/// in flight and the rest pending.
fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let broker = {
            let _inside = runtime.enter();
            Broker::open(BrokerConfig::default())
        };
        let config = TopicConfig {
            partitions: 3,
            ..TopicConfig::default()
        };
        broker.create_topic("orders", config, false).unwrap();
        let consumer = broker
            .subscribe(&SubscribeRequest::earliest("orders", "billing"))
            .unwrap();
        let messages: Vec<Message> = (0..40)
            .map(|i| Message {
                key: Some(Bytes::from(format!("customer-{i}"))),
                ..Message::new(format!("order {i}"))
            })
            .collect();
        runtime.block_on(async {
            broker.publish_messages("orders", &messages).await.unwrap();
            let got = consumer.recv(12).await.unwrap();
            for d in got.iter().take(5) {
                consumer
                    .ack_with_result(&[OffsetRange::single(d.partition, d.offset)], Some(b"done"))
                    .unwrap();
            }
        });
        Fixture {
            _runtime: runtime,
            broker,
            _consumer: consumer,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&choice, page)) = data.split_first() else {
        return;
    };
    let kind = [
        ListKind::Pending,
        ListKind::InFlight,
        ListKind::Acked,
        ListKind::DeadLettered,
    ][choice as usize % 4];
    let limit = (choice as u32 >> 2) % 8 + 1;
    let broker = &fixture().broker;
    match broker.list_messages("orders", "billing", kind, page, limit) {
        Ok(listed) => {
            assert!(listed.entries.len() <= limit as usize);
            if matches!(kind, ListKind::Pending | ListKind::InFlight) {
                let positions: Vec<(u32, u64)> = listed
                    .entries
                    .iter()
                    .map(|e| (e.partition, e.offset))
                    .collect();
                assert!(
                    positions.windows(2).all(|w| w[0] < w[1]),
                    "{kind:?} is listed in partition, then offset order: {positions:?}"
                );
            }
            if !listed.next_page.is_empty() {
                broker
                    .list_messages("orders", "billing", kind, &listed.next_page, limit)
                    .expect("a token the listing handed out is accepted");
            }
        }
        Err(BrokerError::InvalidArgument { field, .. }) => assert_eq!(field, "page"),
        Err(other) => panic!("a bad page token gave {other:?}"),
    }
});
