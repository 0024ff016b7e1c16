//! The seams a replicated partition's snapshots use, on a real disk topic: its records read back
//! as batches, a sync of everything written, and a log started again at a later offset, which
//! survives a restart and is where new subscriptions begin.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ferrymq_broker::{Broker, BrokerConfig, DiskConfig};
use ferrymq_protocol::{FsyncPolicy, Message, RecordBatch, Storage, SubscribeRequest, TopicConfig};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ferrymq-broker-replica-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn open(dir: &Path) -> Broker {
    Broker::open_durable(BrokerConfig::default(), DiskConfig::new(dir)).unwrap()
}

fn batch(range: std::ops::Range<usize>) -> RecordBatch {
    let messages: Vec<Message> = range.map(|i| Message::new(format!("m{i}"))).collect();
    RecordBatch::from_messages(&messages).unwrap()
}

fn bodies(batch: &RecordBatch) -> Vec<String> {
    batch
        .messages()
        .map(|m| String::from_utf8(m.body.to_vec()).unwrap())
        .collect()
}

fn names(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("m{i}")).collect()
}

/// Appends `records` as a replica does and waits until a sync covers them.
async fn append_synced(broker: &Broker, topic: &str, records: RecordBatch) -> u64 {
    let topic = broker.topic(topic).unwrap();
    let pending = broker.append_replicated(&topic, 0, records).unwrap();
    let first = pending.receipt().ids().next().unwrap().1;
    if let Some(wait) = broker.sync_written(&topic, 0).unwrap() {
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .expect("synced within 10 s")
            .unwrap()
            .unwrap();
    }
    first
}

async fn a_partition_reads_back_and_starts_again_later(fsync: FsyncPolicy) {
    let dir = temp_dir(&format!("{fsync:?}").to_lowercase());
    let config = TopicConfig {
        partitions: 1,
        storage: Storage::Disk,
        fsync,
        ..TopicConfig::default()
    };
    {
        let broker = open(&dir);
        broker.create_topic("t", config, false).unwrap();
        for part in [0..10, 10..20, 20..30] {
            append_synced(&broker, "t", batch(part)).await;
        }
        let topic = broker.topic("t").unwrap();
        let read = broker.read_batches(&topic, 0, (0, 30), 8).unwrap();
        let firsts: Vec<u64> = read.iter().map(|(first, _)| *first).collect();
        assert_eq!(firsts, [0, 8, 16, 24]);
        let all: Vec<String> = read.iter().flat_map(|(_, b)| bodies(b)).collect();
        assert_eq!(all, names(0..30));
        let middle = broker.read_batches(&topic, 0, (5, 12), 100).unwrap();
        assert_eq!(middle.len(), 1);
        assert_eq!((middle[0].0, bodies(&middle[0].1)), (5, names(5..12)));

        // A replica whose log ends below what the group still holds starts again there.
        broker.skip_to(&topic, 0, 100).unwrap();
        assert_eq!(broker.next_offset(&topic, 0).unwrap(), 100);
        assert_eq!(broker.first_offset(&topic, 0).unwrap(), 100);
        assert!(broker
            .read_batches(&topic, 0, (0, 100), 8)
            .unwrap()
            .is_empty());
        assert_eq!(append_synced(&broker, "t", batch(100..105)).await, 100);
        // Skipping to where the log already is, or below, changes nothing.
        broker.skip_to(&topic, 0, 50).unwrap();
        assert_eq!(broker.next_offset(&topic, 0).unwrap(), 105);
        broker.shutdown();
    }
    let broker = open(&dir);
    let topic = broker.topic("t").unwrap();
    assert_eq!(broker.first_offset(&topic, 0).unwrap(), 100);
    assert_eq!(broker.next_offset(&topic, 0).unwrap(), 105);
    let read = broker.read_batches(&topic, 0, (0, 200), 100).unwrap();
    assert_eq!(read.len(), 1);
    assert_eq!((read[0].0, bodies(&read[0].1)), (100, names(100..105)));
    let consumer = broker
        .subscribe(&SubscribeRequest::earliest("t", "late"))
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), consumer.recv(10))
        .await
        .expect("deliveries within 10 s")
        .unwrap();
    let offsets: Vec<u64> = got.iter().map(|d| d.offset).collect();
    assert_eq!(offsets, [100, 101, 102, 103, 104]);
    broker.shutdown();
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn fsync_always_partition_reads_back_and_starts_again_later() {
    a_partition_reads_back_and_starts_again_later(FsyncPolicy::Always).await;
}

#[tokio::test]
async fn fsync_never_partition_reads_back_and_starts_again_later() {
    a_partition_reads_back_and_starts_again_later(FsyncPolicy::Never).await;
}
