//! Broker core cost per message, without sockets: publish batches, poll them out, ack them.
//!
//!     cargo run --release -p ferrymq-broker --example inprocess_throughput -- [messages] [batch] [size] [priority_every]
//!
//! With `priority_every` N above 0, every Nth message has priority 5 (the rest 0): the cost of
//! scheduling by priority.

use std::time::Instant;

use bytes::BytesMut;
use ferrymq_broker::{Broker, BrokerConfig};
use ferrymq_protocol::{Frame, FrameDecoder};
use ferrymq_protocol::{OffsetRange, PublishEncoder, SubscribeRequest};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers"))
        .collect();
    let total = *args.first().unwrap_or(&5_000_000);
    let batch = *args.get(1).unwrap_or(&1000) as u32;
    let size = *args.get(2).unwrap_or(&100) as usize;
    let priority_every = *args.get(3).unwrap_or(&0) as u32;

    let broker = Broker::open(BrokerConfig::default());
    let consumer = broker
        .subscribe(&SubscribeRequest::earliest("bench", "s"))
        .expect("subscribe");
    let topic = broker.topic("bench").expect("topic");

    // One PUBLISH frame, decoded the way the server decodes it.
    let mut encoder = PublishEncoder::new("bench", None, 1);
    let body = vec![b'x'; size];
    for i in 0..batch {
        let priority = if priority_every > 0 && i % priority_every == 0 {
            5
        } else {
            0
        };
        encoder.push_body(None, priority, &body);
    }
    let frame = encoder.finish();
    let decoder = FrameDecoder::new(64 << 20);

    let mut out = BytesMut::with_capacity(4 << 20);
    let started = Instant::now();
    let mut published = 0u64;
    let mut delivered = 0u64;
    while published < total {
        let mut buf = BytesMut::from(&frame[..]);
        let Some((_, Frame::Publish { records, .. })) = decoder.decode(&mut buf).expect("valid")
        else {
            panic!()
        };
        broker
            .publish_to(&topic, None, records)
            .await
            .expect("publish");
        published += batch as u64;
        let mut ranges: Vec<OffsetRange> = Vec::new();
        loop {
            out.clear();
            let mut enc = ferrymq_protocol::DeliverEncoder::begin(&mut out, 1);
            let n = consumer
                .poll(4096, 1 << 20, |p, o, ts, a, r| {
                    enc.push(p, o, ts, a, r);
                    match ranges.last_mut() {
                        Some(last) if last.partition == p && last.end() == o => last.count += 1,
                        _ => ranges.push(OffsetRange::single(p, o)),
                    }
                })
                .expect("poll");
            enc.finish();
            if n == 0 {
                break;
            }
            delivered += n as u64;
        }
        consumer.ack(&ranges).expect("ack");
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{} messages of {} B in batches of {}{}: {:.2} M msg/s through publish + deliver + ack on one core ({:.0} ns/msg)",
        delivered,
        size,
        batch,
        if priority_every > 0 {
            format!(", every {priority_every}th with priority 5")
        } else {
            String::new()
        },
        delivered as f64 / secs / 1e6,
        secs * 1e9 / delivered as f64
    );
}
