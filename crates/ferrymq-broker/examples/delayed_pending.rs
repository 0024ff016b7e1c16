//! What pending delayed messages cost: publishes N messages of 100 B with an hour's delay to a
//! memory topic with one subscription, lets a consumer reach them (so every one is a delayed slot
//! with a timer), then reports the process's RSS growth and its CPU time over an idle stretch.
//!
//!     cargo run --release -p ferrymq-broker --example delayed_pending -- [messages] [idle_seconds]

use std::time::{Duration, Instant};

use ferrymq_broker::{Broker, BrokerConfig};
use ferrymq_protocol::{Message, SubscribeRequest};

/// Resident set size and CPU time (user + system) of this process, from /proc.
fn rss_kb_and_cpu() -> (u64, Duration) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    // Fields 14 and 15 of stat (utime, stime) are at 11 and 12 after the command name.
    let ticks: u64 = fields
        .get(11..13)
        .map_or(0, |f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum());
    (rss, Duration::from_millis(ticks * 10))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numbers"))
        .collect();
    let total = *args.first().unwrap_or(&1_000_000);
    let idle = Duration::from_secs(*args.get(1).unwrap_or(&5));

    let mut config = BrokerConfig::default();
    config.topic_defaults.max_messages = total.max(1);
    config.topic_defaults.max_bytes = 1 << 40;
    let broker = Broker::open(config);
    let consumer = broker
        .subscribe(&SubscribeRequest::earliest("later", "workers"))
        .expect("subscribe");
    let (rss_before, _) = rss_kb_and_cpu();
    let message = Message {
        deliver_after_ms: Some(3_600_000),
        ..Message::new(vec![b'x'; 100])
    };
    let batch: Vec<Message> = vec![message; 1000];
    let started = Instant::now();
    for _ in 0..total.div_ceil(1000) {
        broker
            .publish_messages("later", &batch)
            .await
            .expect("publish");
    }
    // The consumer reaches every message and sets each aside as delayed (a pass sets aside at
    // most 4096).
    let mut delivered = 0;
    for _ in 0..total / 4096 + 2 {
        consumer
            .poll(1000, usize::MAX, |_, _, _, _, _| delivered += 1)
            .expect("poll");
    }
    let stats = broker.stats(Some("later")).expect("stats");
    let (rss_after, cpu_before) = rss_kb_and_cpu();
    tokio::time::sleep(idle).await;
    let (_, cpu_after) = rss_kb_and_cpu();
    println!(
        "{total} delayed messages pending (backlog {}, delivered {delivered}) after {:.1} s: RSS +{} MB ({} kB -> {} kB); CPU over {} s idle: {} ms",
        stats[0].subscriptions[0].backlog,
        started.elapsed().as_secs_f64(),
        (rss_after.saturating_sub(rss_before)) / 1024,
        rss_before,
        rss_after,
        idle.as_secs(),
        (cpu_after - cpu_before).as_millis()
    );
    drop(consumer);
}
