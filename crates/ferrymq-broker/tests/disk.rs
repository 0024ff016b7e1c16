//! Disk topics used in-process: acknowledgement after sync, restarts, durable subscription
//! state, reads from the files, retention, and disk faults (injected behind the storage trait).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrymq_broker::{
    Broker, BrokerConfig, BrokerError, Consumer, DiskConfig, PublishReceipt, StorageFactory,
};
use ferrymq_protocol::{
    Delivery, Durability, ErrorCode, FsyncPolicy, Message, MessageState, OffsetRange, Storage,
    SubscribeRequest, TopicConfig,
};
use ferrymq_storage::{AppendFn, FileStorage, LogStorage, SyncFn};

fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("ferrymq-broker-disk-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn disk_config(dir: &Path) -> DiskConfig {
    DiskConfig::new(dir)
}

fn open(dir: &Path) -> Broker {
    Broker::open_durable(BrokerConfig::default(), disk_config(dir)).unwrap()
}

fn disk_topic(partitions: u32, fsync: FsyncPolicy) -> TopicConfig {
    TopicConfig {
        partitions,
        storage: Storage::Disk,
        fsync,
        ..TopicConfig::default()
    }
}

fn sub(topic: &str, name: &str) -> SubscribeRequest {
    SubscribeRequest::earliest(topic, name)
}

fn messages(range: std::ops::Range<usize>) -> Vec<Message> {
    range.map(|i| Message::new(format!("m{i}"))).collect()
}

fn bodies(deliveries: &[Delivery]) -> Vec<String> {
    deliveries
        .iter()
        .map(|d| String::from_utf8(d.message.body.to_vec()).unwrap())
        .collect()
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
        .expect("messages within 10 s")
        .unwrap();
        out.extend(got);
    }
    out
}

/// Publishes as soon as the broker accepts writes again (retrying for at most 10 s); the receipt
/// must say the messages were synced.
async fn publish_once_writable(broker: &Broker, topic: &str, batch: &[Message]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match broker.publish_messages(topic, batch).await {
            Ok(receipt) => {
                assert_eq!(receipt.durability, Durability::Synced);
                return;
            }
            Err(error) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "still failing: {error}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Asserts nothing more arrives for a while.
async fn assert_idle(consumer: &Consumer) {
    let got = tokio::time::timeout(Duration::from_millis(300), consumer.recv(100)).await;
    if let Ok(got) = got {
        panic!("expected nothing, got {:?}", bodies(&got.unwrap()));
    }
}

#[tokio::test]
async fn publishes_are_acknowledged_after_sync_and_survive_a_restart() {
    let dir = temp_dir("restart");
    {
        let broker = open(&dir);
        broker
            .create_topic("orders", disk_topic(2, FsyncPolicy::Default), false)
            .unwrap();
        let receipt = broker
            .publish_messages("orders", &messages(0..10))
            .await
            .unwrap();
        assert_eq!(receipt.durability, Durability::Synced);
        assert_eq!(receipt.ids().count(), 10);
        // Stopped without a clean shutdown: only what was synced counts.
        drop(broker);
    }
    let broker = open(&dir);
    let info = broker.describe_topic("orders").unwrap();
    assert_eq!(info.config.storage, Storage::Disk);
    assert_eq!(info.config.fsync, FsyncPolicy::Always);
    assert_eq!(info.messages, 10);
    let consumer = broker.subscribe(&sub("orders", "all")).unwrap();
    let mut got = bodies(&recv_n(&consumer, 10).await);
    got.sort();
    let mut want: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    want.sort();
    assert_eq!(got, want);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn the_acknowledgement_says_which_fsync_policy_applied() {
    let dir = temp_dir("policies");
    let broker = open(&dir);
    for (name, fsync, durability) in [
        ("always", FsyncPolicy::Always, Durability::Synced),
        (
            "interval",
            FsyncPolicy::IntervalMs(20),
            Durability::SyncedInterval,
        ),
        ("never", FsyncPolicy::Never, Durability::Written),
    ] {
        broker
            .create_topic(name, disk_topic(1, fsync), false)
            .unwrap();
        let receipt = broker
            .publish_messages(name, &messages(0..3))
            .await
            .unwrap();
        assert_eq!(receipt.durability, durability, "{name}");
        let consumer = broker.subscribe(&sub(name, "s")).unwrap();
        assert_eq!(bodies(&recv_n(&consumer, 3).await), ["m0", "m1", "m2"]);
    }
    let memory = broker
        .publish_messages("auto-memory", &messages(0..1))
        .await
        .unwrap();
    assert_eq!(memory.durability, Durability::Memory);
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn acked_messages_stay_acked_across_restarts_and_in_flight_ones_come_again() {
    let dir = temp_dir("cursors");
    {
        let broker = open(&dir);
        broker
            .create_topic("jobs", disk_topic(1, FsyncPolicy::Always), false)
            .unwrap();
        broker
            .publish_messages("jobs", &messages(0..10))
            .await
            .unwrap();
        let consumer = broker.subscribe(&sub("jobs", "workers")).unwrap();
        let got = recv_n(&consumer, 6).await;
        // Ack 0, 1, 2 and 4: 3 and 5 stay in flight, 6.. were never delivered.
        let acked: Vec<(u32, u64)> = got
            .iter()
            .filter(|d| d.offset != 3 && d.offset != 5)
            .map(|d| (d.partition, d.offset))
            .collect();
        assert_eq!(consumer.ack(&OffsetRange::coalesce(acked)).unwrap(), 4);
        consumer.acks_saved().await.unwrap();
        // A crash: no clean shutdown. (Dropping the consumer returns its in-flight messages in
        // memory only; in-flight state is never saved.)
        drop(consumer);
        drop(broker);
    }
    let broker = open(&dir);
    let consumer = broker.subscribe(&sub("jobs", "workers")).unwrap();
    let got = recv_n(&consumer, 6).await;
    let mut offsets: Vec<u64> = got.iter().map(|d| d.offset).collect();
    offsets.sort_unstable();
    assert_eq!(offsets, [3, 5, 6, 7, 8, 9]);
    assert_idle(&consumer).await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_backlog_beyond_the_memory_tail_is_read_from_the_files() {
    let dir = temp_dir("backlog");
    let mut config = disk_config(&dir);
    config.tail_cache_bytes = 1024;
    config.tail_cache_bytes_min = 512;
    config.segment_bytes = 64 * 1024;
    let broker = Broker::open_durable(BrokerConfig::default(), config).unwrap();
    broker
        .create_topic("big", disk_topic(1, FsyncPolicy::Always), false)
        .unwrap();
    for chunk in 0..20 {
        broker
            .publish_messages("big", &messages(chunk * 500..(chunk + 1) * 500))
            .await
            .unwrap();
    }
    let consumer = broker.subscribe(&sub("big", "reader")).unwrap();
    let got = recv_n(&consumer, 10_000).await;
    let want: Vec<String> = (0..10_000).map(|i| format!("m{i}")).collect();
    assert_eq!(bodies(&got), want);
    // Give some back: redeliveries far below the tail come from the files too.
    let back = OffsetRange::coalesce([(0, 10), (0, 11), (0, 5000)]);
    assert_eq!(consumer.nack(&back, Duration::ZERO).unwrap(), 3);
    let again = recv_n(&consumer, 3).await;
    assert_eq!(bodies(&again), ["m10", "m11", "m5000"]);
    assert!(again.iter().all(|d| d.attempt == 2));
    drop(consumer);
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn segments_every_subscription_acked_are_deleted() {
    let dir = temp_dir("retention");
    let mut config = disk_config(&dir);
    config.segment_bytes = 4096;
    let broker = Broker::open_durable(BrokerConfig::default(), config).unwrap();
    // A work queue: what every subscription acked goes (a stream, the default, keeps it).
    let config = TopicConfig {
        retention_policy: ferrymq_protocol::RetentionPolicy::WorkQueue,
        ..disk_topic(1, FsyncPolicy::Always)
    };
    broker.create_topic("queue", config, false).unwrap();
    let consumer = broker.subscribe(&sub("queue", "workers")).unwrap();
    for chunk in 0..10 {
        broker
            .publish_messages("queue", &messages(chunk * 100..(chunk + 1) * 100))
            .await
            .unwrap();
    }
    let segments = || {
        std::fs::read_dir(dir.join("topics/queue/0"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".log")
            })
            .count()
    };
    let before = segments();
    assert!(before > 3, "{before} segments");
    let got = recv_n(&consumer, 1000).await;
    let ranges = OffsetRange::coalesce(got.iter().map(|d| (d.partition, d.offset)));
    assert_eq!(consumer.ack(&ranges).unwrap(), 1000);
    // Retention runs every second.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while segments() > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} segments left",
            segments()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // What is left is the active segment, which is never deleted: the last batch, whole.
    assert!(broker.describe_topic("queue").unwrap().messages <= 100);
    drop(consumer);
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn deleted_topics_lose_their_files_and_settings() {
    let dir = temp_dir("delete");
    let broker = open(&dir);
    broker
        .create_topic("gone", disk_topic(2, FsyncPolicy::Always), false)
        .unwrap();
    drop(broker.subscribe(&sub("gone", "s")).unwrap());
    broker
        .publish_messages("gone", &messages(0..5))
        .await
        .unwrap();
    assert!(dir.join("topics/gone/1").exists());
    broker.delete_topic("gone").unwrap();
    assert!(!dir.join("topics/gone").exists());
    drop(broker);
    let broker = open(&dir);
    assert!(matches!(
        broker.describe_topic("gone"),
        Err(BrokerError::UnknownTopic(_))
    ));
    // The name is free again, with nothing of the old topic.
    broker
        .create_topic("gone", disk_topic(1, FsyncPolicy::Always), false)
        .unwrap();
    assert_eq!(broker.describe_topic("gone").unwrap().messages, 0);
    assert!(broker
        .describe_topic("gone")
        .unwrap()
        .subscriptions
        .is_empty());
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_broker_without_a_data_dir_refuses_disk_topics_clearly() {
    let broker = Broker::open(BrokerConfig::default());
    let Err(error) = broker.create_topic("d", disk_topic(1, FsyncPolicy::Always), false) else {
        panic!("a disk topic without a data dir");
    };
    assert_eq!(error.code(), ErrorCode::InvalidArgument);
    assert!(error.to_string().contains("no data dir"), "{error}");
}

#[tokio::test]
async fn auto_created_topics_are_disk_topics_when_disk_is_the_default() {
    let dir = temp_dir("auto");
    let mut config = BrokerConfig::default();
    config.topic_defaults.storage = Storage::Disk;
    let broker = Broker::open_durable(config, disk_config(&dir)).unwrap();
    let receipt = broker
        .publish_messages("auto", &messages(0..1))
        .await
        .unwrap();
    assert_eq!(receipt.durability, Durability::Synced);
    assert_eq!(
        broker.describe_topic("auto").unwrap().config.storage,
        Storage::Disk
    );
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Real files, with switches that make appends fail as on a full disk and syncs fail as on a
/// failing one.
#[derive(Default)]
struct Faults {
    full: AtomicBool,
    /// Removing a file frees the full disk.
    freed_by_remove: AtomicBool,
    read_only: AtomicBool,
    sync_fails: AtomicBool,
    /// Syncs wait while this is set (bounded: 10 s), as on a slow disk.
    sync_held: AtomicBool,
    /// When set, only syncs of files under this directory are held.
    sync_held_under: std::sync::Mutex<Option<PathBuf>>,
    /// Syncs that found `sync_held` set.
    syncs_held: AtomicUsize,
    /// Deferred appends run so far (fsync=always partitions write through them).
    deferred_appends: AtomicUsize,
    /// Syncs of files and directories asked for so far (at once or deferred).
    syncs: AtomicUsize,
}

impl Faults {
    /// Waits while syncs (of `path`) are held, at most 10 s.
    fn hold_sync(&self, path: &Path) {
        if !self.sync_held.load(Relaxed) {
            return;
        }
        if let Some(under) = &*self.sync_held_under.lock().unwrap() {
            if !path.starts_with(under) {
                return;
            }
        }
        self.syncs_held.fetch_add(1, Relaxed);
        let since = std::time::Instant::now();
        while self.sync_held.load(Relaxed) && since.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The error a write meets now, if any.
    fn write_error(&self, path: &Path) -> Option<io::Error> {
        if self.full.load(Relaxed) {
            return Some(no_space(path));
        }
        if self.read_only.load(Relaxed) {
            return Some(io::Error::new(
                io::ErrorKind::ReadOnlyFilesystem,
                format!("append to {}: Read-only file system", path.display()),
            ));
        }
        None
    }
}

struct FaultyFactory(Arc<Faults>);

impl StorageFactory for FaultyFactory {
    fn storage(&self) -> Box<dyn LogStorage + Send> {
        Box::new(Faulty {
            inner: FileStorage::new(),
            faults: self.0.clone(),
        })
    }
}

struct Faulty {
    inner: FileStorage,
    faults: Arc<Faults>,
}

fn no_space(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::StorageFull,
        format!("append to {}: No space left on device", path.display()),
    )
}

impl LogStorage for Faulty {
    fn create_dir_all(&mut self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn create(&mut self, path: &Path) -> io::Result<()> {
        if let Some(error) = self.faults.write_error(path) {
            return Err(error);
        }
        self.inner.create(path)
    }
    fn len(&self, path: &Path) -> io::Result<u64> {
        self.inner.len(path)
    }
    fn append(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        if let Some(error) = self.faults.write_error(path) {
            return Err(error);
        }
        self.inner.append(path, bytes)
    }
    fn read_at(&self, path: &Path, position: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(path, position, buf)
    }
    fn sync(&mut self, path: &Path) -> io::Result<()> {
        self.faults.syncs.fetch_add(1, Relaxed);
        self.faults.hold_sync(path);
        if self.faults.sync_fails.load(Relaxed) {
            return Err(io::Error::other(format!(
                "sync {}: Input/output error",
                path.display()
            )));
        }
        self.inner.sync(path)
    }
    fn sync_dir(&mut self, dir: &Path) -> io::Result<()> {
        self.faults.syncs.fetch_add(1, Relaxed);
        self.inner.sync_dir(dir)
    }
    fn truncate(&mut self, path: &Path, len: u64) -> io::Result<()> {
        self.inner.truncate(path, len)
    }
    fn remove(&mut self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)?;
        if self.faults.freed_by_remove.load(Relaxed) {
            self.faults.full.store(false, Relaxed);
        }
        Ok(())
    }
    fn sync_later(&mut self, path: &Path) -> io::Result<SyncFn> {
        self.faults.syncs.fetch_add(1, Relaxed);
        let faults = self.faults.clone();
        let path = path.to_path_buf();
        let sync = self.inner.sync_later(&path)?;
        Ok(Box::new(move || {
            faults.hold_sync(&path);
            if faults.sync_fails.load(Relaxed) {
                return Err(io::Error::other(format!(
                    "sync {}: Input/output error",
                    path.display()
                )));
            }
            sync()
        }))
    }
    fn sync_dir_later(&mut self, dir: &Path) -> io::Result<SyncFn> {
        self.faults.syncs.fetch_add(1, Relaxed);
        self.inner.sync_dir_later(dir)
    }
    /// Deferred appends meet the faults when they run, as `append` and `sync_later` would: a
    /// write fault refuses the write (nothing is written; a call with nothing to write only
    /// syncs, which a full or read-only disk does not refuse), a sync fault fails the sync after
    /// the bytes were written.
    fn append_later(&mut self, path: &Path) -> Option<io::Result<AppendFn>> {
        let append = match self.inner.append_later(path)? {
            Ok(append) => append,
            Err(error) => return Some(Err(error)),
        };
        let faults = self.faults.clone();
        let path = path.to_path_buf();
        Some(Ok(Box::new(move |chunks: &[Bytes], sync: bool| {
            faults.deferred_appends.fetch_add(1, Relaxed);
            if chunks.iter().any(|c| !c.is_empty()) {
                if let Some(error) = faults.write_error(&path) {
                    return Err(error);
                }
            }
            if sync {
                faults.hold_sync(&path);
            }
            let sync_fails = sync && faults.sync_fails.load(Relaxed);
            append(chunks, sync && !sync_fails)?;
            if sync_fails {
                return Err(io::Error::other(format!(
                    "sync {}: Input/output error",
                    path.display()
                )));
            }
            Ok(())
        })))
    }
}

fn faulty_broker(dir: &Path) -> (Broker, Arc<Faults>) {
    let faults = Arc::new(Faults::default());
    let mut config = disk_config(dir);
    config.storage = Arc::new(FaultyFactory(faults.clone()));
    let broker = Broker::open_durable(BrokerConfig::default(), config).unwrap();
    (broker, faults)
}

/// Turns a write fault on, checks publishers get a clear error while reads go on, turns it off
/// and checks writes resume without a restart.
async fn refused_while_faulty_then_resumed(
    name: &str,
    switch: fn(&Faults) -> &AtomicBool,
    expected: &str,
) {
    let dir = temp_dir(name);
    let (broker, faults) = faulty_broker(&dir);
    broker
        .create_topic("t", disk_topic(1, FsyncPolicy::Always), false)
        .unwrap();
    broker.publish_messages("t", &messages(0..3)).await.unwrap();
    // fsync=always: the sync thread writes the records, through deferred appends.
    let deferred = faults.deferred_appends.load(Relaxed);
    assert!(deferred > 0, "no deferred appends under fsync=always");
    switch(&faults).store(true, Relaxed);
    let error = broker
        .publish_messages("t", &messages(3..4))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::StorageUnavailable);
    assert!(error.to_string().contains(expected), "{error}");
    assert!(faults.deferred_appends.load(Relaxed) > deferred);
    assert!(error.to_string().contains("topics/t/0"), "{error}");
    // Reads go on.
    let consumer = broker.subscribe(&sub("t", "s")).unwrap();
    assert_eq!(bodies(&recv_n(&consumer, 3).await), ["m0", "m1", "m2"]);
    // The cause goes away: the next publish works, without a restart, and nothing was
    // half-written.
    switch(&faults).store(false, Relaxed);
    broker.publish_messages("t", &messages(4..5)).await.unwrap();
    let got = recv_n(&consumer, 1).await;
    assert_eq!(bodies(&got), ["m4"]);
    assert_eq!(got[0].offset, 3);
    drop(consumer);
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_full_disk_refuses_publishes_clearly_keeps_serving_reads_and_recovers_by_itself() {
    refused_while_faulty_then_resumed("full", |f| &f.full, "No space left").await;
}

#[tokio::test]
async fn a_read_only_data_dir_refuses_publishes_clearly_keeps_serving_reads_and_recovers() {
    refused_while_faulty_then_resumed("readonly", |f| &f.read_only, "Read-only file system").await;
}

#[tokio::test]
async fn a_failed_sync_is_reported_to_the_publisher_and_the_log_reopens_by_itself() {
    let dir = temp_dir("syncfail");
    let (broker, faults) = faulty_broker(&dir);
    broker
        .create_topic("t", disk_topic(1, FsyncPolicy::Always), false)
        .unwrap();
    broker.publish_messages("t", &messages(0..2)).await.unwrap();
    let deferred = faults.deferred_appends.load(Relaxed);
    assert!(deferred > 0, "no deferred appends under fsync=always");
    faults.sync_fails.store(true, Relaxed);
    let error = broker
        .publish_messages("t", &messages(2..3))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::StorageUnavailable);
    assert!(error.to_string().contains("Input/output error"), "{error}");
    // The failed sync was the one a deferred append makes after writing.
    assert!(faults.deferred_appends.load(Relaxed) > deferred);
    // Until the disk is healthy again, writes are refused with the reason.
    let error = broker
        .publish_messages("t", &messages(3..4))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::StorageUnavailable);
    faults.sync_fails.store(false, Relaxed);
    // Recovery reopens the log within a few maintenance rounds.
    publish_once_writable(&broker, "t", &messages(4..5)).await;
    let consumer = broker.subscribe(&sub("t", "s")).unwrap();
    // m2 was written, but its sync failed: the sync job cut its writes back, so the reopened log
    // does not hold it, as its publisher was told. m3 was refused.
    assert_eq!(bodies(&recv_n(&consumer, 3).await), ["m0", "m1", "m4"]);
    assert_idle(&consumer).await;
    drop(consumer);
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn retention_frees_a_full_disk_for_a_log_that_cannot_reopen_until_then() {
    let dir = temp_dir("closedretention");
    let faults = Arc::new(Faults::default());
    let mut config = disk_config(&dir);
    config.storage = Arc::new(FaultyFactory(faults.clone()));
    config.segment_bytes = 4096;
    let broker = Broker::open_durable(BrokerConfig::default(), config).unwrap();
    broker
        .create_topic("t", disk_topic(1, FsyncPolicy::Always), false)
        .unwrap();
    let consumer = broker.subscribe(&sub("t", "s")).unwrap();
    for batch in 0..10 {
        broker
            .publish_messages("t", &messages(batch * 50..(batch + 1) * 50))
            .await
            .unwrap();
    }
    let got = recv_n(&consumer, 500).await;
    let partition = dir.join("topics/t/0");
    let segments = || {
        let mut bases: Vec<String> = std::fs::read_dir(&partition)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".log"))
            .collect();
        bases.sort();
        bases
    };
    let before = segments();
    assert!(before.len() > 3, "{before:?}");
    // As after a crash, the active segment's time index is gone: reopening the log has to write
    // it again. Then the disk fills up, and stays full until a file is deleted.
    let active = before.last().unwrap().trim_end_matches(".log").to_string();
    std::fs::remove_file(partition.join(format!("{active}.timeindex"))).unwrap();
    faults.freed_by_remove.store(true, Relaxed);
    faults.full.store(true, Relaxed);
    let error = broker
        .publish_messages("t", &messages(500..501))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::StorageUnavailable);
    assert!(error.to_string().contains("No space left"), "{error}");
    // The reopen fails for want of space, and nothing else frees any.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let error = broker
        .publish_messages("t", &messages(501..502))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::StorageUnavailable);
    assert!(faults.full.load(Relaxed));
    assert_eq!(segments(), before);
    // Every message is settled: retention deletes the closed segments from the directory, which
    // frees the disk, and the log reopens without waiting out its back-off.
    let ranges = OffsetRange::coalesce(got.iter().map(|d| (d.partition, d.offset)));
    assert_eq!(consumer.ack(&ranges).unwrap(), 500);
    publish_once_writable(&broker, "t", &messages(502..503)).await;
    assert_eq!(segments(), [format!("{active}.log")]);
    assert_eq!(bodies(&recv_n(&consumer, 1).await), ["m502"]);
    assert_idle(&consumer).await;
    drop(consumer);
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_segment_deleted_under_the_broker_stops_writes_with_a_clear_error_then_writes_resume() {
    let dir = temp_dir("deleted");
    let broker = open(&dir);
    broker
        .create_topic("t", disk_topic(1, FsyncPolicy::Always), false)
        .unwrap();
    broker.publish_messages("t", &messages(0..2)).await.unwrap();
    let segment = dir.join("topics/t/0/00000000000000000000.log");
    assert!(segment.exists());
    std::fs::remove_file(&segment).unwrap();
    let error = broker
        .publish_messages("t", &messages(2..3))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::StorageUnavailable);
    assert!(error.to_string().contains("was deleted"), "{error}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while broker.publish_messages("t", &messages(3..4)).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "writes did not resume"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_damaged_partition_is_reported_and_kept_out_of_service_while_the_rest_runs() {
    let dir = temp_dir("damaged");
    {
        let broker = open(&dir);
        broker
            .create_topic("t", disk_topic(2, FsyncPolicy::Always), false)
            .unwrap();
        for p in 0..2 {
            let batch = ferrymq_protocol::RecordBatch::from_messages(&messages(0..5)).unwrap();
            broker.publish("t", Some(p), batch).await.unwrap();
        }
        broker.shutdown();
    }
    // Rot in the middle of partition 0's segment: the first entry's body, followed by good ones.
    let segment = dir.join("topics/t/0/00000000000000000000.log");
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[30] ^= 0x40;
    std::fs::write(&segment, bytes).unwrap();

    let broker = open(&dir);
    let batch = ferrymq_protocol::RecordBatch::from_messages(&messages(5..6)).unwrap();
    let error = broker
        .publish("t", Some(0), batch.clone())
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::StorageUnavailable);
    let text = error.to_string();
    assert!(
        text.contains("damaged") && text.contains("00000000000000000000.log"),
        "{text}"
    );
    // The damaged data is never served; the other partition works as before.
    broker.publish("t", Some(1), batch).await.unwrap();
    let consumer = broker.subscribe(&sub("t", "s")).unwrap();
    let got = recv_n(&consumer, 6).await;
    assert!(got.iter().all(|d| d.partition == 1));
    drop(consumer);
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

fn segment_count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".log")
        })
        .count()
}

/// Waits (bounded) until `done` holds, for effects of the once-a-second retention pass.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn segments_older_than_the_retention_age_are_deleted() {
    let dir = temp_dir("retention-age");
    let mut config = disk_config(&dir);
    config.segment_bytes = 4096;
    let broker = Broker::open_durable(BrokerConfig::default(), config).unwrap();
    let topic = TopicConfig {
        retention_ms: 1000,
        ..disk_topic(1, FsyncPolicy::Always)
    };
    broker.create_topic("aging", topic, false).unwrap();
    // A subscription that never acks: only age deletes here.
    drop(broker.subscribe(&sub("aging", "idle")).unwrap());
    // Batches never span segments: five batches of 100 fill several.
    for chunk in 0..5 {
        broker
            .publish_messages("aging", &messages(chunk * 100..(chunk + 1) * 100))
            .await
            .unwrap();
    }
    let partition = dir.join("topics/aging/0");
    assert!(segment_count(&partition) > 3);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // A fresh message starts a new segment later than the old ones' age; then they go.
    broker
        .publish_messages("aging", &messages(500..501))
        .await
        .unwrap();
    eventually("old segments deleted by age", || {
        segment_count(&partition) <= 2
    })
    .await;
    let stats = broker.stats(Some("aging")).unwrap();
    assert!(
        stats[0].dropped > 0,
        "the idle subscription lost them: counted as dropped"
    );
    let consumer = broker.subscribe(&sub("aging", "idle")).unwrap();
    let got = recv_n(&consumer, 1).await;
    assert!(got[0].offset > 0, "the oldest messages are gone");
    drop(consumer);
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_drop_oldest_topic_keeps_its_files_within_max_bytes() {
    let dir = temp_dir("retention-size");
    let mut config = disk_config(&dir);
    config.segment_bytes = 4096;
    let broker = Broker::open_durable(BrokerConfig::default(), config).unwrap();
    let topic = TopicConfig {
        max_bytes: 16 * 1024,
        ..disk_topic(1, FsyncPolicy::Always)
    };
    broker.create_topic("bounded", topic, false).unwrap();
    for chunk in 0..10 {
        broker
            .publish_messages("bounded", &messages(chunk * 200..(chunk + 1) * 200))
            .await
            .unwrap();
    }
    eventually("the log shrinks to its limit", || {
        broker.describe_topic("bounded").unwrap().bytes <= 16 * 1024
    })
    .await;
    let info = broker.describe_topic("bounded").unwrap();
    assert!(info.messages > 0 && info.messages < 2000, "{info:?}");
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_reject_topic_refuses_publishes_past_its_limit_on_disk() {
    let dir = temp_dir("retention-reject");
    let broker = open(&dir);
    let topic = TopicConfig {
        max_messages: 5,
        overflow: ferrymq_protocol::OverflowPolicy::Reject,
        ..disk_topic(1, FsyncPolicy::Always)
    };
    broker.create_topic("capped", topic, false).unwrap();
    broker
        .publish_messages("capped", &messages(0..5))
        .await
        .unwrap();
    let error = broker
        .publish_messages("capped", &messages(5..6))
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::TopicFull);
    assert_eq!(broker.describe_topic("capped").unwrap().messages, 5);
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_delay_survives_a_restart_of_a_disk_topic() {
    let dir = temp_dir("delay-restart");
    let started = std::time::Instant::now();
    {
        let broker = open(&dir);
        broker
            .create_topic("later", disk_topic(1, FsyncPolicy::Always), false)
            .unwrap();
        let consumer = broker.subscribe(&sub("later", "workers")).unwrap();
        let delayed = Message {
            deliver_after_ms: Some(1500),
            ..Message::new("in 1.5 s")
        };
        broker
            .publish_messages("later", &[delayed, Message::new("now")])
            .await
            .unwrap();
        let now = recv_n(&consumer, 1).await;
        assert_eq!(bodies(&now), ["now"]);
        consumer.ack(&[OffsetRange::single(0, 1)]).unwrap();
        consumer.acks_saved().await.unwrap();
        drop(consumer);
        drop(broker);
    }
    let broker = open(&dir);
    let consumer = broker.subscribe(&sub("later", "workers")).unwrap();
    let got = recv_n(&consumer, 1).await;
    assert_eq!(bodies(&got), ["in 1.5 s"]);
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "delivered {:?} after publishing",
        started.elapsed()
    );
    drop(consumer);
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_dead_letter_of_a_disk_topic_is_durable_and_its_source_settled_across_a_restart() {
    let dir = temp_dir("dead-letter");
    {
        let broker = open(&dir);
        broker
            .create_topic("jobs", disk_topic(1, FsyncPolicy::Always), false)
            .unwrap();
        let consumer = broker
            .subscribe(&SubscribeRequest {
                max_attempts: 1,
                ..sub("jobs", "workers")
            })
            .unwrap();
        broker
            .publish_messages("jobs", &messages(0..1))
            .await
            .unwrap();
        recv_n(&consumer, 1).await;
        consumer
            .nack(&[OffsetRange::single(0, 0)], Duration::ZERO)
            .unwrap();
        eventually("the dead-letter topic exists", || {
            broker
                .describe_topic("jobs.dlq")
                .is_ok_and(|t| t.messages == 1)
        })
        .await;
        assert_eq!(
            broker.describe_topic("jobs.dlq").unwrap().config.storage,
            Storage::Disk
        );
        // The source's settle is saved by the state writer (within 20 ms); give it that.
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(consumer);
        broker.shutdown();
    }
    let broker = open(&dir);
    let consumer = broker.subscribe(&sub("jobs", "workers")).unwrap();
    assert_idle(&consumer).await;
    let dlq = broker.subscribe(&sub("jobs.dlq", "ops")).unwrap();
    assert_eq!(bodies(&recv_n(&dlq, 1).await), ["m0"]);
    drop((consumer, dlq));
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Attempt counts and a nack's delay survive a restart, clean or not: a message delivered twice
/// comes back as attempt 3 and is given up at `max_attempts` counted across the restart, and a
/// message nacked with a delay waits out the rest of it.
#[tokio::test]
async fn attempts_and_nack_delays_survive_a_restart() {
    for clean in [true, false] {
        let dir = temp_dir(if clean {
            "delivery-state-clean"
        } else {
            "delivery-state-crash"
        });
        let delay = Duration::from_secs(3);
        let workers = SubscribeRequest {
            max_attempts: 3,
            ..sub("jobs", "workers")
        };
        let nacked_at;
        {
            let broker = open(&dir);
            broker
                .create_topic("jobs", disk_topic(1, FsyncPolicy::Always), false)
                .unwrap();
            let consumer = broker.subscribe(&workers).unwrap();
            broker
                .publish_messages("jobs", &messages(0..2))
                .await
                .unwrap();
            let first = recv_n(&consumer, 2).await;
            assert_eq!(first.iter().map(|d| d.attempt).collect::<Vec<_>>(), [1, 1]);
            consumer
                .nack(&[OffsetRange::single(0, 0)], Duration::ZERO)
                .unwrap();
            consumer.nack(&[OffsetRange::single(0, 1)], delay).unwrap();
            nacked_at = std::time::Instant::now();
            let again = recv_n(&consumer, 1).await;
            assert_eq!((again[0].offset, again[0].attempt), (0, 2));
            consumer
                .nack(&[OffsetRange::single(0, 0)], Duration::ZERO)
                .unwrap();
            consumer.acks_saved().await.unwrap();
            drop(consumer);
            if clean {
                broker.shutdown();
            }
            // Without shutdown: a crash, as far as saved state goes (nothing more is written).
            drop(broker);
        }
        let broker = open(&dir);
        let consumer = broker.subscribe(&workers).unwrap();
        let back = recv_n(&consumer, 1).await;
        assert_eq!(
            (back[0].offset, back[0].attempt),
            (0, 3),
            "clean={clean}: attempts go on counting"
        );
        // The delayed one is not due yet.
        let left = delay
            .saturating_sub(nacked_at.elapsed())
            .saturating_sub(Duration::from_millis(500));
        assert!(
            tokio::time::timeout(left, consumer.recv(1)).await.is_err(),
            "clean={clean}: a nack's delay was cut short by the restart"
        );
        let delayed = recv_n(&consumer, 1).await;
        assert_eq!((delayed[0].offset, delayed[0].attempt), (1, 2));
        assert!(nacked_at.elapsed() >= delay - Duration::from_millis(100));
        consumer.ack(&[OffsetRange::single(0, 1)]).unwrap();
        // The third attempt was the last: a nack gives it up.
        consumer
            .nack(&[OffsetRange::single(0, 0)], Duration::ZERO)
            .unwrap();
        eventually("the message given up is a dead letter", || {
            broker
                .describe_topic("jobs.dlq")
                .is_ok_and(|t| t.messages == 1)
        })
        .await;
        drop(consumer);
        broker.shutdown();
        drop(broker);
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// A start after a clean shutdown syncs nothing: every log ends where the shutdown synced it (a
/// sync per partition was most of a start with thousands of topics). After a crash every log
/// with entries is synced before it is served, as before.
#[tokio::test]
async fn a_start_after_a_clean_shutdown_syncs_nothing_and_one_after_a_crash_syncs() {
    const TOPICS: usize = 8;
    let dir = temp_dir("start-syncs");
    {
        let (broker, _) = faulty_broker(&dir);
        for i in 0..TOPICS {
            let name = format!("t{i}");
            broker
                .create_topic(&name, disk_topic(1, FsyncPolicy::Always), false)
                .unwrap();
            broker
                .publish_messages(&name, &messages(0..3))
                .await
                .unwrap();
        }
        broker.shutdown();
    }
    {
        let (broker, faults) = faulty_broker(&dir);
        assert_eq!(
            faults.syncs.load(Relaxed),
            0,
            "a start after a clean shutdown synced"
        );
        // Served as before, and written to.
        let consumer = broker.subscribe(&sub("t0", "s")).unwrap();
        assert_eq!(bodies(&recv_n(&consumer, 3).await), ["m0", "m1", "m2"]);
        broker
            .publish_messages("t0", &messages(3..4))
            .await
            .unwrap();
        assert_eq!(bodies(&recv_n(&consumer, 1).await), ["m3"]);
        drop(consumer);
        // A crash: no shutdown, so nothing says the logs were synced.
        drop(broker);
    }
    let (broker, faults) = faulty_broker(&dir);
    assert!(
        faults.syncs.load(Relaxed) >= TOPICS,
        "a start after a crash synced only {} times for {TOPICS} logs with entries",
        faults.syncs.load(Relaxed)
    );
    let consumer = broker.subscribe(&sub("t0", "s2")).unwrap();
    assert_eq!(recv_n(&consumer, 4).await.len(), 4);
    drop(consumer);
    broker.shutdown();
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}
/// The metadata store on a real file whose writes fail with ENOSPC while `full` is set.
struct MetaFullFactory {
    dir: PathBuf,
    full: Arc<AtomicBool>,
}

impl StorageFactory for MetaFullFactory {
    fn storage(&self) -> Box<dyn LogStorage + Send> {
        Box::new(FileStorage::new())
    }

    fn meta_backend(&self) -> Option<Box<dyn redb::StorageBackend>> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.dir.join("meta.redb"))
            .ok()?;
        let inner = redb::backends::FileBackend::new(file).ok()?;
        Some(Box::new(FullableBackend {
            inner,
            full: self.full.clone(),
        }))
    }
}

#[derive(Debug)]
struct FullableBackend {
    inner: redb::backends::FileBackend,
    full: Arc<AtomicBool>,
}

impl FullableBackend {
    fn check(&self) -> io::Result<()> {
        if self.full.load(Relaxed) {
            return Err(no_space(Path::new("meta.redb")));
        }
        Ok(())
    }
}

impl redb::StorageBackend for FullableBackend {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.check()?;
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.check()?;
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.check()?;
        self.inner.write(offset, data)
    }
    fn close(&self) -> io::Result<()> {
        self.inner.close()
    }
}

#[tokio::test]
async fn a_metadata_store_that_failed_on_a_full_disk_recovers_without_a_restart() {
    let dir = temp_dir("meta-full");
    let full = Arc::new(AtomicBool::new(false));
    let mut config = disk_config(&dir);
    config.storage = Arc::new(MetaFullFactory {
        dir: dir.clone(),
        full: full.clone(),
    });
    let broker = Broker::open_durable(BrokerConfig::default(), config).unwrap();
    broker
        .create_topic("t", disk_topic(1, FsyncPolicy::Always), false)
        .unwrap();
    broker.publish_messages("t", &messages(0..6)).await.unwrap();
    let consumer = broker.subscribe(&sub("t", "s")).unwrap();
    let got = recv_n(&consumer, 6).await;
    consumer
        .ack(&[OffsetRange::single(0, 0), OffsetRange::single(0, 1)])
        .unwrap();
    consumer.acks_saved().await.unwrap();
    assert!(broker.health().is_empty(), "{:?}", broker.health());

    // The disk fills: a commit fails, and so does everything that needs the store.
    full.store(true, Relaxed);
    consumer.ack(&[OffsetRange::single(0, 2)]).unwrap();
    let error = consumer.acks_saved().await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::StorageUnavailable, "{error}");
    let Err(error) = broker.create_topic("u", disk_topic(1, FsyncPolicy::Always), false) else {
        panic!("a topic was created while the metadata store fails");
    };
    assert_eq!(error.code(), ErrorCode::StorageUnavailable, "{error}");
    let health = broker.health();
    let fault = health
        .iter()
        .find(|f| f.kind == ferrymq_broker::FaultKind::MetadataStore)
        .unwrap_or_else(|| panic!("no metadata store fault in {health:?}"));
    assert!(fault.reason.contains("No space left"), "{fault:?}");
    assert!(fault.action.contains("free space"), "{fault:?}");

    // Space comes back: the store is reopened by itself, with no traffic needed to notice.
    full.store(false, Relaxed);
    eventually("the store is reopened", || broker.health().is_empty()).await;
    broker
        .create_topic("u", disk_topic(1, FsyncPolicy::Always), false)
        .unwrap();
    consumer.ack(&[OffsetRange::single(0, 3)]).unwrap();
    consumer.acks_saved().await.unwrap();
    drop(got);
    drop(consumer);
    broker.shutdown();
    drop(broker);

    // What was committed after the recovery survives a restart; the unsaved ack of offset 2 is
    // either there or redelivered, never lost for good.
    let broker = open(&dir);
    assert!(broker.describe_topic("u").is_ok());
    let consumer = broker.subscribe(&sub("t", "s")).unwrap();
    let again: Vec<u64> = recv_n(&consumer, 2)
        .await
        .iter()
        .map(|d| d.offset)
        .collect();
    assert!(
        again == [4, 5] || again == [2, 4],
        "redelivered after the restart: {again:?}"
    );
    drop(consumer);
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Flips one byte of the first occurrence of `needle` in the partition's segment files; returns
/// the file.
fn flip_byte_of(partition_dir: &Path, needle: &[u8]) -> PathBuf {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(partition_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    for path in logs {
        let mut bytes = std::fs::read(&path).unwrap();
        if let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) {
            bytes[at + 1] ^= 0x20;
            std::fs::write(&path, bytes).unwrap();
            return path;
        }
    }
    panic!("{} not found", String::from_utf8_lossy(needle));
}

#[tokio::test]
async fn damage_found_by_a_read_is_reported_and_an_operator_can_skip_it() {
    let dir = temp_dir("read-damage");
    let mut config = disk_config(&dir);
    config.segment_bytes = 8192;
    let broker = Broker::open_durable(BrokerConfig::default(), config.clone()).unwrap();
    broker
        .create_topic("t", disk_topic(1, FsyncPolicy::Always), false)
        .unwrap();
    drop(broker.subscribe(&sub("t", "s")).unwrap());
    for chunk in 0..20 {
        let batch: Vec<Message> = (chunk * 30..(chunk + 1) * 30)
            .map(|i| Message::new(format!("message-{i:04}")))
            .collect();
        broker.publish_messages("t", &batch).await.unwrap();
    }
    broker.shutdown();
    drop(broker);
    // Bit rot in the middle of a closed segment, before its last index point: open checks
    // only tails, so a read finds it.
    let damaged_file = flip_byte_of(&dir.join("topics/t/0"), b"message-0040");

    let broker = Broker::open_durable(BrokerConfig::default(), config.clone()).unwrap();
    assert!(broker.health().is_empty(), "{:?}", broker.health());
    let consumer = broker.subscribe(&sub("t", "s")).unwrap();
    let before = recv_n(&consumer, 40).await;
    assert_eq!(before.last().unwrap().offset, 39);
    let error = tokio::time::timeout(Duration::from_secs(10), consumer.recv(10))
        .await
        .expect("an answer")
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::StorageUnavailable);
    assert!(error.to_string().contains("messages 40..41"), "{error}");
    assert!(error.to_string().contains("skip-damaged"), "{error}");
    // Health names the file, the position and the offsets, and what to do.
    let health = broker.health();
    assert_eq!(health.len(), 1, "{health:?}");
    let fault = &health[0];
    assert_eq!(fault.kind, ferrymq_broker::FaultKind::UnreadableRange);
    assert_eq!(fault.file.as_deref(), Some(damaged_file.as_path()));
    assert!(fault.position.is_some());
    assert_eq!(fault.offsets, Some((40, 41)));
    assert!(fault.action.contains("skip-damaged"), "{fault:?}");
    // A status lookup names the damage rather than calling the message gone.
    let error = broker.message_status("t", 0, 40).unwrap_err();
    assert_eq!(error.code(), ErrorCode::StorageUnavailable, "{error}");
    assert!(error.to_string().contains("damaged"), "{error}");
    assert!(broker.message_status("t", 0, 41).is_ok());

    // The operator skips it: the subscription moves on past it, and health is ok again.
    let (ranges, settled) = broker.skip_damaged("t", 0).unwrap();
    assert_eq!(ranges.len(), 1);
    assert_eq!(settled, 1);
    assert!(broker.health().is_empty(), "{:?}", broker.health());
    let after = recv_n(&consumer, 559).await;
    assert_eq!(after.first().unwrap().offset, 41);
    assert_eq!(after.last().unwrap().offset, 599);
    let ranges =
        OffsetRange::coalesce(before.iter().chain(&after).map(|d| (d.partition, d.offset)));
    consumer.ack(&ranges).unwrap();
    consumer.acks_saved().await.unwrap();
    drop(consumer);
    broker.shutdown();
    drop(broker);

    // The skip is durable: after a restart the subscription has nothing left.
    let broker = Broker::open_durable(BrokerConfig::default(), config).unwrap();
    let consumer = broker.subscribe(&sub("t", "s")).unwrap();
    assert_idle(&consumer).await;
    drop(consumer);
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_data_dir_removed_under_the_broker_is_a_fault_with_what_to_do() {
    let dir = temp_dir("data-dir-gone");
    let broker = open(&dir);
    assert!(broker.health().is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
    let health = broker.health();
    let fault = health
        .iter()
        .find(|f| f.kind == ferrymq_broker::FaultKind::DataDir)
        .unwrap_or_else(|| panic!("no data dir fault in {health:?}"));
    assert_eq!(fault.file.as_deref(), Some(dir.as_path()));
    assert!(fault.action.contains("restore the data dir"), "{fault:?}");
    drop(broker);
}

/// A publish whose sync fails was not stored durably: its retry with the same deduplication id
/// must be stored, not answered with the lost message's id, and from then on the id is held.
/// Publishes as a publisher does after a failed sync: again while the partition still recovers
/// (`storage_unavailable`), for at most 10 s.
async fn publish_while_recovering(broker: &Broker, messages: &[Message]) -> PublishReceipt {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match broker.publish_messages("t", messages).await {
            Ok(receipt) => return receipt,
            Err(error) if error.code() == ErrorCode::StorageUnavailable => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "still refused: {error}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("{error}"),
        }
    }
}

/// Publishes `order-7` while syncs are held, then its retry; returns both publishes' tasks once
/// the retry is known to be waiting.
async fn retry_while_first_waits_for_its_sync(
    broker: &Broker,
    faults: &Faults,
) -> (
    tokio::task::JoinHandle<Result<PublishReceipt, BrokerError>>,
    tokio::task::JoinHandle<Result<PublishReceipt, BrokerError>>,
) {
    broker
        .create_topic("t", disk_topic(1, FsyncPolicy::Always), false)
        .unwrap();
    let order = || vec![Message::new("order 7").with_dedup_id("order-7")];
    faults.sync_held.store(true, Relaxed);
    let first = tokio::spawn({
        let broker = broker.clone();
        async move { broker.publish_messages("t", &order()).await }
    });
    // Bounded: the sync thread starts the first publish's sync at once.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while faults.syncs_held.load(Relaxed) == 0 {
        assert!(std::time::Instant::now() < deadline, "no sync started");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let retry = tokio::spawn({
        let broker = broker.clone();
        async move { broker.publish_messages("t", &order()).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    if retry.is_finished() {
        panic!(
            "the retry was answered before the message it repeats was synced: {:?}",
            retry.await.unwrap()
        );
    }
    assert!(!first.is_finished());
    (first, retry)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_waits_for_the_sync_of_the_message_it_repeats() {
    let dir = temp_dir("dedup-retry-waits");
    let (broker, faults) = faulty_broker(&dir);
    let (first, retry) = retry_while_first_waits_for_its_sync(&broker, &faults).await;
    faults.sync_held.store(false, Relaxed);
    let first = first.await.unwrap().unwrap();
    let retry = retry.await.unwrap().unwrap();
    assert!(first.duplicates.is_empty());
    assert_eq!(retry.duplicates, [0]);
    assert_eq!(
        retry.ids().collect::<Vec<_>>(),
        first.ids().collect::<Vec<_>>()
    );
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_waiting_for_a_sync_that_fails_fails_and_the_next_is_stored() {
    let dir = temp_dir("dedup-retry-sync-fails");
    let (broker, faults) = faulty_broker(&dir);
    let (first, retry) = retry_while_first_waits_for_its_sync(&broker, &faults).await;
    faults.sync_fails.store(true, Relaxed);
    faults.sync_held.store(false, Relaxed);
    for (who, publish) in [("first", first), ("retry", retry)] {
        let error = publish.await.unwrap().unwrap_err();
        assert_eq!(
            error.code(),
            ErrorCode::StorageUnavailable,
            "{who}: {error}"
        );
    }
    faults.sync_fails.store(false, Relaxed);
    let order = [Message::new("order 7").with_dedup_id("order-7")];
    let stored = publish_while_recovering(&broker, &order).await;
    assert!(
        stored.duplicates.is_empty(),
        "answered as a duplicate of a message that never reached the disk"
    );
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test]
async fn a_dedup_id_whose_publish_failed_to_sync_is_stored_by_the_retry() {
    let dir = temp_dir("dedup-sync-fails");
    let (broker, faults) = faulty_broker(&dir);
    broker
        .create_topic("t", disk_topic(1, FsyncPolicy::Always), false)
        .unwrap();
    let order = || vec![Message::new("order 7").with_dedup_id("order-7")];
    faults.sync_fails.store(true, Relaxed);
    let error = broker.publish_messages("t", &order()).await.unwrap_err();
    assert_eq!(error.code(), ErrorCode::StorageUnavailable, "{error}");
    faults.sync_fails.store(false, Relaxed);

    let retried = publish_while_recovering(&broker, &order()).await;
    assert!(
        retried.duplicates.is_empty(),
        "the retry was answered as a duplicate of a message that never reached the disk"
    );
    let again = broker.publish_messages("t", &order()).await.unwrap();
    assert_eq!(again.duplicates, [0], "once stored, the id is held");
    assert_eq!(
        again.ids().collect::<Vec<_>>(),
        retried.ids().collect::<Vec<_>>()
    );
    let consumer = broker.subscribe(&sub("t", "s")).unwrap();
    let got = recv_n(&consumer, 1).await;
    assert_eq!(bodies(&got), ["order 7"]);
    assert_eq!(got[0].offset, retried.ids().next().unwrap().1);
    drop(consumer);
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Opens `dir` again once the dropped broker's background tasks have ended (bounded).
async fn reopen_after_crash(dir: &Path) -> Broker {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match Broker::open_durable(BrokerConfig::default(), disk_config(dir)) {
            Ok(broker) => return broker,
            Err(error) if std::time::Instant::now() < deadline => {
                assert!(error.to_string().contains("already open"), "{error}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => panic!("the data dir stays locked: {error}"),
        }
    }
}

/// The state of each of a subscription's messages, by offset, as `message_status` tells it.
fn states(
    broker: &Broker,
    topic: &str,
    offsets: std::ops::Range<u64>,
) -> Vec<(MessageState, u16, u64)> {
    offsets
        .map(|offset| {
            let status = broker.message_status(topic, 0, offset).unwrap();
            let entry = &status.subscriptions[0].entry;
            (entry.state, entry.attempts, entry.due_ms)
        })
        .collect()
}

#[tokio::test]
async fn message_status_tells_what_the_broker_will_do_before_and_after_a_crash() {
    use ferrymq_protocol::MessageState::*;
    let dir = temp_dir("status-restart");
    let before;
    {
        let broker = open(&dir);
        broker
            .create_topic("jobs", disk_topic(1, FsyncPolicy::Always), false)
            .unwrap();
        broker
            .publish_messages("jobs", &messages(0..6))
            .await
            .unwrap();
        let consumer = broker.subscribe(&sub("jobs", "workers")).unwrap();
        let got = recv_n(&consumer, 5).await;
        assert_eq!(got.len(), 5);
        let one = |offset| {
            [OffsetRange {
                partition: 0,
                offset,
                count: 1,
            }]
        };
        consumer.ack(&one(0)).unwrap();
        consumer.nack(&one(1), Duration::from_secs(20)).unwrap();
        consumer.dead_letter(&one(2), "unreadable").unwrap();
        // 3 and 4 stay in flight; 5 was never delivered. The dead letter is settled once its
        // copy is stored in jobs.dlq; then every settlement is saved.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while broker.message_status("jobs.dlq", 0, 0).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the dead letter is stored"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        consumer.acks_saved().await.unwrap();
        before = states(&broker, "jobs", 0..6);
        assert_eq!(
            before.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>(),
            [
                (Acked, 1),
                (Delayed, 1),
                (DeadLettered, 1),
                (InFlight, 1),
                (InFlight, 1),
                (Pending, 0)
            ]
        );
        // A crash: no clean shutdown.
        drop(consumer);
        drop(broker);
    }
    // The crashed broker's tasks let go of its metadata store when they next wake.
    let broker = reopen_after_crash(&dir).await;
    let after = states(&broker, "jobs", 0..6);
    // The delayed nack is still delayed until the same moment, with its attempt; 5 is next in
    // line, never delivered. The dead letter is settled, unless the crash came before its
    // settlement was saved: then it is pending again with its attempt, and comes again.
    assert_eq!((after[1].0, after[1].1), (Delayed, 1), "{after:?}");
    assert_eq!(after[1].2, before[1].2, "the same due time");
    assert!(
        matches!(after[2], (DeadLettered | Settled, _, _) | (Pending, 1, 0)),
        "{after:?}"
    );
    for offset in 3..6 {
        assert_eq!(after[offset].0, Pending, "{after:?}");
    }
    assert_eq!(after[5].1, 0, "never delivered");
    // And the broker does what the status said: every pending message comes now, each with the
    // attempt after the ones the status counted (a delivery in flight at the crash counts if
    // the consumer's end was saved before it, as the status says); 1 waits for its delay.
    let told: Vec<(u64, u16)> = (0..6u64)
        .filter(|&o| after[o as usize].0 == Pending)
        .map(|o| (o, after[o as usize].1 + 1))
        .collect();
    let consumer = broker.subscribe(&sub("jobs", "workers")).unwrap();
    let got = recv_n(&consumer, told.len()).await;
    let mut seen: Vec<(u64, u16)> = got.iter().map(|d| (d.offset, d.attempt)).collect();
    seen.sort_unstable();
    assert_eq!(seen, told);
    assert_idle(&consumer).await;
    std::fs::remove_dir_all(dir).unwrap();
}

/// The broker's log lines at INFO and above, as text, from every test of this file (each test
/// picks its own lines by its data dir).
fn captured_log() -> &'static std::sync::Mutex<Vec<u8>> {
    static LOG: std::sync::OnceLock<&'static std::sync::Mutex<Vec<u8>>> =
        std::sync::OnceLock::new();
    LOG.get_or_init(|| {
        let log: &'static std::sync::Mutex<Vec<u8>> =
            Box::leak(Box::new(std::sync::Mutex::new(Vec::new())));
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || LogWriter(log))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one subscriber");
        log
    })
}

struct LogWriter(&'static std::sync::Mutex<Vec<u8>>);

impl io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The captured lines that mention `needle`.
fn log_lines(needle: &str) -> Vec<String> {
    let log = captured_log().lock().unwrap();
    String::from_utf8_lossy(&log)
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn a_full_disk_logs_one_line_per_partition_when_it_stops_and_one_when_it_recovers() {
    captured_log();
    let dir = temp_dir("quietfull");
    let (broker, faults) = faulty_broker(&dir);
    broker
        .create_topic("t", disk_topic(2, FsyncPolicy::Always), false)
        .unwrap();
    broker.publish_messages("t", &messages(0..4)).await.unwrap();
    faults.full.store(true, Relaxed);
    // Publishers retry for a while: every partition fails again and again, and is reopened in
    // between (the disk is full, not broken), as it would be for as long as the disk stays full.
    let retrying = std::time::Instant::now();
    let mut refused = 0;
    while retrying.elapsed() < Duration::from_millis(1500) {
        if broker.publish_messages("t", &messages(0..4)).await.is_err() {
            refused += 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(refused > 20, "only {refused} publishes were refused");
    let needle = dir.display().to_string();
    let lines = log_lines(&needle);
    for partition in ["t/0", "t/1"] {
        let stops = lines
            .iter()
            .filter(|l| l.contains("partition log stopped") && l.contains(partition))
            .count();
        assert_eq!(stops, 1, "partition {partition}: {lines:#?}");
    }
    // One line per partition, whatever the number of failures.
    assert!(lines.len() <= 2, "{} lines: {lines:#?}", lines.len());
    // The disk is freed: each partition says once that it takes writes again.
    faults.full.store(false, Relaxed);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while log_lines(&needle)
        .iter()
        .filter(|l| l.contains("writes are accepted again"))
        .count()
        < 2
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{:#?}",
            log_lines(&needle)
        );
        let _ = broker.publish_messages("t", &messages(0..4)).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lines = log_lines(&needle);
    assert_eq!(lines.len(), 4, "{lines:#?}");
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}

/// A disk whose fsync stalls for one partition stalls no one else: a memory topic and another
/// disk partition publish and deliver while it hangs, the stalled publisher is answered once the
/// sync ends, and what it was told is stored survives a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_sync_stalls_neither_memory_topics_nor_other_partitions() {
    let dir = temp_dir("stalled-sync");
    let (broker, faults) = faulty_broker(&dir);
    let always = disk_topic(1, FsyncPolicy::Always);
    broker
        .create_topic("stalled", always.clone(), false)
        .unwrap();
    broker.create_topic("other", always, false).unwrap();
    let memory = TopicConfig {
        storage: Storage::Memory,
        ..TopicConfig::default()
    };
    broker.create_topic("fast", memory, false).unwrap();
    *faults.sync_held_under.lock().unwrap() = Some(dir.join("topics").join("stalled"));
    faults.sync_held.store(true, Relaxed);
    let stalled = tokio::spawn({
        let broker = broker.clone();
        async move { broker.publish_messages("stalled", &messages(0..1)).await }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while faults.syncs_held.load(Relaxed) == 0 {
        assert!(std::time::Instant::now() < deadline, "no sync started");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // While that sync hangs, the others are answered (bounded: well before the 10 s hold ends).
    let bound = Duration::from_secs(3);
    let fast = broker.subscribe(&sub("fast", "s")).unwrap();
    let other = broker.subscribe(&sub("other", "s")).unwrap();
    let batch = messages(0..10);
    for topic in ["fast", "other", "fast", "other"] {
        let publish = broker.publish_messages(topic, &batch);
        let receipt = tokio::time::timeout(bound, publish).await;
        assert!(matches!(receipt, Ok(Ok(_))), "{topic}: {receipt:?}");
    }
    for consumer in [&fast, &other] {
        let got = tokio::time::timeout(bound, recv_n(consumer, 20)).await;
        assert_eq!(got.map(|d| d.len()).ok(), Some(20));
    }
    assert!(!stalled.is_finished(), "answered before its sync ended");
    faults.sync_held.store(false, Relaxed);
    let receipt = tokio::time::timeout(Duration::from_secs(10), stalled).await;
    let receipt = receipt.unwrap().unwrap().unwrap();
    assert_eq!(receipt.durability, Durability::Synced);
    drop((fast, other));
    drop(broker);
    let broker = open(&dir);
    let consumer = broker.subscribe(&sub("stalled", "after")).unwrap();
    assert_eq!(bodies(&recv_n(&consumer, 1).await), ["m0"]);
    drop(consumer);
    drop(broker);
    std::fs::remove_dir_all(dir).unwrap();
}
