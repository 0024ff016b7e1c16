//! The broker: the registry of topics and the entry points every transport calls.
//!
//! Lock order: broker `topics` → topic `subscriptions` → partition state → subscription
//! `consumers`. The timer task walks topics under the `topics` read lock and takes partition locks
//! one at a time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use ferrymq_protocol::limits::{ACK_TIMEOUT_MS_MAX, ACK_TIMEOUT_MS_MIN, PARTITIONS_MAX};
use ferrymq_protocol::{
    FsyncPolicy, Message, OverflowPolicy, RecordBatch, RetentionPolicy, StartPosition, Storage,
    SubscribeRequest, TopicConfig, TopicInfo, TopicStats,
};
use ferrymq_storage::PartitionLog;
use parking_lot::RwLock;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::auth::Auth;
use crate::clock::unix_ms;
use crate::config::{BrokerConfig, TopicDefaults};
use crate::consumer::Consumer;
use crate::cursor::{Cursor, CursorOptions, Released};
use crate::disk::{log_recovery, AppliedFsync, DiskConfig, DiskShared, FileLog};
use crate::error::BrokerError;
use crate::headers::dead_letter_topic;
use crate::health::{Fault, FaultKind};
use crate::meta::{CursorRecord, Loaded, MetaStore, SubscriptionRecord, TopicRecord};
use crate::names::{validate_name, ValidName};
use crate::partition::PartitionState;
use crate::state_writer::StateWriter;
use crate::subscription::Subscription;
use crate::topic::DeadLetter;
use crate::topic::{PublishPending, PublishReceipt, PublisherGuard, Topic, TopicDisk};

/// How often disk maintenance runs: retention, and reopening failed partition logs.
const MAINTENANCE_INTERVAL: Duration = Duration::from_secs(1);

/// A handle to a running broker; cheap to clone. Open it inside a tokio runtime: it runs one
/// background task for ack deadlines and delayed redeliveries, stopped by [`Broker::shutdown`] or
/// when the last handle is dropped.
#[derive(Clone)]
pub struct Broker {
    pub(crate) inner: Arc<BrokerInner>,
}

pub(crate) struct BrokerInner {
    pub(crate) config: BrokerConfig,
    topics: RwLock<HashMap<String, Arc<Topic>>>,
    next_id: AtomicU64,
    closed: AtomicBool,
    /// Stops the timer task; shared with it so that the task holds no strong reference to the
    /// broker while it waits (dropping the last handle closes the broker at once).
    stop_timers: Arc<Notify>,
    /// Present when the broker has a data dir: disk topics and durable subscription state.
    pub(crate) durable: Option<Durable>,
    /// Where topics send the messages their subscriptions gave up.
    dead_letters: tokio::sync::mpsc::UnboundedSender<DeadLetter>,
    /// Users, grants and tokens: in the metadata store when the broker has a data dir.
    auth: Arc<Auth>,
    /// Client connections of every transport, for operators.
    connections: Arc<crate::connections::Connections>,
}

pub(crate) struct Durable {
    disk: Arc<DiskShared>,
    pub(crate) state: Arc<StateWriter>,
}

impl Drop for BrokerInner {
    fn drop(&mut self) {
        self.stop_timers.notify_one();
        if let Some(durable) = &self.durable {
            durable.disk.stop();
            durable.state.stop();
        }
    }
}

impl Broker {
    /// Opens a broker without a data dir: memory topics only (a disk topic is refused with a
    /// clear error). Must be called within a tokio runtime.
    pub fn open(config: BrokerConfig) -> Broker {
        let auth = Auth::open(None).expect("users without a store always open");
        Self::start(config, None, Vec::new(), auth)
    }

    /// Opens a broker over a data dir: its disk topics, their subscriptions and where each
    /// subscription was are loaded, every partition log is checked (a torn tail is cut, stale
    /// indexes rebuilt, and the broker's log says so), and directories of topics that no longer
    /// exist are removed. Must be called within a tokio runtime.
    pub fn open_durable(config: BrokerConfig, disk: DiskConfig) -> Result<Broker, BrokerError> {
        let store = open_meta_store(&disk)?;
        let loaded = store.load()?;
        let auth = Auth::open(Some(store.clone()))?;
        // Where priorities end is known only as of a clean shutdown: from now on it is not.
        store.clear_shutdown_marks()?;
        let shared = DiskShared::start(disk);
        let state = StateWriter::start(store);
        let durable = Durable {
            disk: shared.clone(),
            state: state.clone(),
        };
        let mut topics = Vec::new();
        let next_id = match load_disk_topics(&shared, &loaded, &config, &mut topics) {
            Ok(next_id) => next_id,
            Err(error) => {
                shared.stop();
                state.stop();
                return Err(error);
            }
        };
        let broker = Self::start(config, Some(durable), topics, auth);
        broker.inner.next_id.store(next_id + 1, Relaxed);
        Ok(broker)
    }

    fn start(
        config: BrokerConfig,
        durable: Option<Durable>,
        topics: Vec<(String, Arc<Topic>)>,
        auth: Auth,
    ) -> Broker {
        let (dead_letters, mut dead_rx) = tokio::sync::mpsc::unbounded_channel();
        for (_, topic) in &topics {
            let _ = topic.dead_letters.set(dead_letters.clone());
        }
        let inner = Arc::new(BrokerInner {
            config,
            topics: RwLock::new(topics.into_iter().collect()),
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            stop_timers: Arc::new(Notify::new()),
            durable,
            dead_letters,
            auth: Arc::new(auth),
            connections: Arc::default(),
        });
        let weak_dead = Arc::downgrade(&inner);
        tokio::spawn(async move {
            while let Some(letter) = dead_rx.recv().await {
                let Some(inner) = weak_dead.upgrade() else {
                    return;
                };
                Broker { inner }.dead_letter(letter).await;
            }
        });
        let weak = Arc::downgrade(&inner);
        let stop_timers = inner.stop_timers.clone();
        let tick = Duration::from_millis(inner.config.timer_tick_ms.max(1));
        tokio::spawn(async move {
            let mut last_maintenance = Instant::now();
            let mut interval = tokio::time::interval(tick);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = interval.tick() => {}
                    _ = stop_timers.notified() => return,
                }
                let Some(inner) = weak.upgrade() else { return };
                if inner.closed.load(Relaxed) {
                    return;
                }
                let now = Instant::now();
                inner.fire_timers(now);
                if inner.durable.is_some() {
                    inner.sync_due_intervals();
                    if now.duration_since(last_maintenance) >= MAINTENANCE_INTERVAL {
                        last_maintenance = now;
                        inner.maintain_disk();
                    }
                }
            }
        });
        Broker { inner }
    }

    /// Users, grants and tokens, and the decisions over them.
    pub fn auth(&self) -> &Arc<Auth> {
        &self.inner.auth
    }

    /// The client connections of every transport.
    pub fn connections(&self) -> &Arc<crate::connections::Connections> {
        &self.inner.connections
    }

    /// True when the broker has a data dir (disk topics are available).
    pub fn is_durable(&self) -> bool {
        self.inner.durable.is_some()
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.inner.config
    }

    /// Stops the timer task and refuses new work. Existing handles stay valid for reads. A
    /// durable broker syncs every partition log (whatever its fsync policy) and saves every
    /// subscription's state first, so a clean stop loses nothing.
    pub fn shutdown(&self) {
        self.inner.closed.store(true, Relaxed);
        self.inner.stop_timers.notify_one();
        if let Some(durable) = &self.inner.durable {
            let topics: Vec<Arc<Topic>> = self.inner.topics.read().values().cloned().collect();
            let mut priority_ends = Vec::new();
            let mut synced_ends = Vec::new();
            let mut histories = Vec::new();
            for topic in topics {
                let names: HashMap<u64, String> = topic
                    .subscriptions
                    .read()
                    .values()
                    .filter(|s| !s.ephemeral)
                    .map(|s| (s.id, s.name.clone()))
                    .collect();
                for partition in topic.partitions.iter() {
                    let mut state = partition.state.lock();
                    let Some(disk) = state.disk.as_mut() else {
                        continue;
                    };
                    if disk.is_failed() {
                        continue;
                    }
                    if let Some(log) = disk.open_log_mut() {
                        if let Err(error) = log.sync() {
                            tracing::error!(topic = %topic.name, partition = partition.index, %error, "sync at shutdown failed");
                            continue;
                        }
                        synced_ends.push((topic.name.clone(), partition.index, log.next_offset()));
                        priority_ends.push((
                            topic.name.clone(),
                            partition.index,
                            state.log.priority_end(),
                        ));
                        for cursor in &state.cursors {
                            if let Some(name) = names.get(&cursor.sub_id) {
                                histories.push((
                                    topic.name.clone(),
                                    name.clone(),
                                    partition.index,
                                    cursor.encode_history(),
                                ));
                            }
                        }
                    }
                }
            }
            if let Err(error) =
                durable
                    .state
                    .store()
                    .put_shutdown_state(&priority_ends, &synced_ends, &histories)
            {
                tracing::warn!(%error, "could not save where priorities end and the status histories; the next start looks ahead once and has no history");
            }
            durable.state.flush();
            durable.disk.stop();
            durable.state.stop();
        }
    }

    fn check_open(&self) -> Result<(), BrokerError> {
        if self.inner.closed.load(Relaxed) {
            return Err(BrokerError::ShuttingDown);
        }
        Ok(())
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Relaxed)
    }

    /// Fills defaults into a requested topic configuration and checks it.
    /// `config` with every field left to the server filled in from this broker's defaults, and
    /// checked: what a topic created with it would get.
    pub fn resolve_config(&self, mut config: TopicConfig) -> Result<TopicConfig, BrokerError> {
        let defaults = &self.inner.config.topic_defaults;
        if config.partitions == 0 {
            config.partitions = defaults.partitions;
        }
        if config.partitions > PARTITIONS_MAX {
            return Err(BrokerError::invalid(
                "partitions",
                format!(
                    "{} is above the limit of {PARTITIONS_MAX}",
                    config.partitions
                ),
            ));
        }
        if config.storage == Storage::Default {
            config.storage = self.default_topic_config().storage;
        }
        if config.overflow == OverflowPolicy::Default {
            config.overflow = defaults.overflow;
        }
        let disk = config.storage == Storage::Disk;
        if disk && self.inner.durable.is_none() {
            return Err(BrokerError::invalid(
                "storage",
                "this broker has no data dir, so it holds memory topics only",
            ));
        }
        fill_storage_defaults(&mut config, defaults, disk);
        if config.dedup_window_ms == 0 {
            config.dedup_window_ms = defaults.dedup_window_ms;
        }
        if config.dedup_window_ms > crate::dedup::DEDUP_WINDOW_MS_MAX {
            return Err(BrokerError::invalid(
                "dedup_window_ms",
                format!(
                    "{} is above the limit of {} (a day)",
                    config.dedup_window_ms,
                    crate::dedup::DEDUP_WINDOW_MS_MAX
                ),
            ));
        }
        if config.max_messages < config.partitions as u64 {
            return Err(BrokerError::invalid(
                "max_messages",
                "must allow at least one message per partition",
            ));
        }
        Ok(config)
    }

    fn default_topic_config(&self) -> TopicConfig {
        let d = &self.inner.config.topic_defaults;
        // Disk by default when there is a data dir to keep it in.
        let storage = if d.storage == Storage::Disk && self.inner.durable.is_none() {
            Storage::Memory
        } else {
            d.storage
        };
        TopicConfig {
            partitions: d.partitions,
            storage,
            overflow: d.overflow,
            ..TopicConfig::default()
        }
    }

    pub fn create_topic(
        &self,
        name: &str,
        config: TopicConfig,
        if_not_exists: bool,
    ) -> Result<Arc<Topic>, BrokerError> {
        self.check_open()?;
        let valid = validate_name("topic", name)?;
        let config = self.resolve_config(config)?;
        let mut topics = self.inner.topics.write();
        if let Some(existing) = topics.get(name) {
            if if_not_exists {
                return Ok(existing.clone());
            }
            return Err(BrokerError::TopicExists(name.to_owned()));
        }
        if topics.len() >= self.inner.config.topics_max {
            return Err(BrokerError::LimitExceeded(format!(
                "the broker holds its maximum of {} topics",
                self.inner.config.topics_max
            )));
        }
        let topic = match (&self.inner.durable, config.storage) {
            (Some(durable), Storage::Disk) => {
                let (topic, to_sync) =
                    open_disk_topic(&durable.disk, valid, config.clone(), true, |_| None)?;
                // A new log has nothing written to sync.
                debug_assert!(to_sync.is_empty());
                if let Err(error) = durable
                    .state
                    .store()
                    .put_topic(name, &TopicRecord::of(&config))
                {
                    remove_topic_dir(&durable.disk.config, valid);
                    return Err(error);
                }
                topic
            }
            _ => Topic::new(name.to_owned(), config),
        };
        let _ = topic.dead_letters.set(self.inner.dead_letters.clone());
        // A topic just made has no ids in its logs to read back.
        topic.dedup.lock().rebuilt = true;
        topics.insert(name.to_owned(), topic.clone());
        tracing::info!(
            topic = name,
            partitions = topic.partition_count(),
            "topic created"
        );
        Ok(topic)
    }

    pub fn delete_topic(&self, name: &str) -> Result<(), BrokerError> {
        let topic = self
            .inner
            .topics
            .write()
            .remove(name)
            .ok_or_else(|| BrokerError::UnknownTopic(name.to_owned()))?;
        topic.deleted.store(true, Relaxed);
        if let Some(durable) = &self.inner.durable {
            if topic.is_disk() {
                for partition in topic.partitions.iter() {
                    let mut state = partition.state.lock();
                    if let Some(disk) = state.disk.as_mut() {
                        disk.close(format!("topic '{name}' was deleted"));
                    }
                }
                if let Err(error) = durable.state.store().remove_topic(name) {
                    tracing::error!(topic = name, %error, "could not remove the deleted topic from the metadata store; its files stay until the next start");
                } else if let Ok(valid) = validate_name("topic", name) {
                    remove_topic_dir(&durable.disk.config, valid);
                }
            }
        }
        // Handles of the topic may outlive it (a connection keeps the one it publishes to):
        // its messages go now, not when the last handle does. A publish through such a handle
        // checks `deleted` under the partition lock, so nothing is stored after this.
        for partition in topic.partitions.iter() {
            let mut state = partition.state.lock();
            let end = state.log.next_offset();
            state.trim_log_to(end);
        }
        // Wake waiting consumers so they notice the topic is gone.
        topic.notify_subscriptions();
        tracing::info!(topic = name, "topic deleted");
        Ok(())
    }

    pub fn topic(&self, name: &str) -> Result<Arc<Topic>, BrokerError> {
        self.inner
            .topics
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| BrokerError::UnknownTopic(name.to_owned()))
    }

    /// Whether `name` is where some subscription sends what it gives up: `<topic>.dlq` of an
    /// existing topic, or a subscription's own dead-letter topic.
    pub(crate) fn is_dead_letter_topic(&self, name: &str) -> bool {
        let topics: Vec<Arc<Topic>> = self.inner.topics.read().values().cloned().collect();
        topics.iter().any(|topic| {
            dead_letter_topic(&topic.name) == name
                || topic
                    .subscriptions
                    .read()
                    .values()
                    .any(|s| s.dead_letter_topic(&topic.name) == name)
        })
    }

    /// The topic, created with defaults if it is missing and the broker auto-creates topics.
    pub fn topic_or_create(&self, name: &str) -> Result<Arc<Topic>, BrokerError> {
        match self.topic(name) {
            Err(BrokerError::UnknownTopic(_)) if self.inner.config.auto_create_topics => {
                self.create_topic(name, self.default_topic_config(), true)
            }
            other => other,
        }
    }

    pub fn list_topics(&self) -> Vec<TopicInfo> {
        let topics: Vec<Arc<Topic>> = self.inner.topics.read().values().cloned().collect();
        let mut out: Vec<TopicInfo> = topics.iter().map(|t| t.info()).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The partitions that refuse writes now or failed their last one, by topic and partition:
    /// what a health check reports.
    pub fn faults(&self) -> Vec<crate::PartitionFault> {
        let topics: Vec<Arc<Topic>> = self.inner.topics.read().values().cloned().collect();
        let mut out: Vec<crate::PartitionFault> = topics.iter().flat_map(|t| t.faults()).collect();
        out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        out
    }

    /// Every fault the broker has now, each with what to do: what `/status` reports. Empty
    /// while all is well.
    pub fn health(&self) -> Vec<crate::Fault> {
        let mut out = Vec::new();
        if let Some(durable) = &self.inner.durable {
            data_dir_faults(durable, &mut out);
        }
        let topics: Vec<Arc<Topic>> = self.inner.topics.read().values().cloned().collect();
        for topic in &topics {
            unreadable_ranges(topic, &mut out);
        }
        out.extend(self.faults().into_iter().map(partition_fault));
        out
    }

    /// Skips the damaged ranges reads found in one partition (see [`Broker::health`]): every
    /// subscription settles those offsets without delivering them, as if acked, durably, and
    /// moves on; the faults are cleared. What can be read is never skipped: only the offsets
    /// [`ferrymq_storage::PartitionLog::damage_at`] located. Returns the ranges skipped and how
    /// many messages that settled, over all subscriptions.
    pub fn skip_damaged(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<(Vec<ferrymq_storage::Damage>, u64), BrokerError> {
        let topic = self.topic(topic)?;
        let part = topic.partitions.get(partition as usize).ok_or_else(|| {
            BrokerError::invalid(
                "partition",
                format!(
                    "topic '{}' has partitions 0..{}",
                    topic.name,
                    topic.partition_count()
                ),
            )
        })?;
        let subscriptions: Vec<Arc<Subscription>> =
            topic.subscriptions.read().values().cloned().collect();
        let (ranges, settled, touched) = {
            let mut state = part.state.lock();
            let ranges = match state.disk.as_mut() {
                Some(disk) => disk.take_damage(),
                None => Vec::new(),
            };
            let mut settled = 0;
            let mut touched = Vec::new();
            for cursor in state.cursors.iter_mut() {
                let mut n = 0;
                for d in &ranges {
                    n += cursor.skip(d.first_offset, d.end_offset);
                }
                settled += n;
                touched.push(cursor.sub_id);
            }
            state.trim_settled();
            (ranges, settled, touched)
        };
        for d in &ranges {
            tracing::warn!(topic = %topic.name, partition, file = %d.file.display(), position = d.position,
                first_offset = d.first_offset, end_offset = d.end_offset, "skipped a damaged range for every subscription, by request");
        }
        if let Some(durable) = &self.inner.durable {
            for sub in subscriptions.iter().filter(|s| touched.contains(&s.id)) {
                durable.state.mark(&topic, sub, partition);
            }
        }
        topic.notify_subscriptions();
        Ok((ranges, settled))
    }

    pub fn describe_topic(&self, name: &str) -> Result<TopicInfo, BrokerError> {
        Ok(self.topic(name)?.info())
    }

    /// Publishes a validated batch. The receipt lists the offsets given, in message order.
    pub async fn publish(
        &self,
        topic: &str,
        partition: Option<u32>,
        records: RecordBatch,
    ) -> Result<PublishReceipt, BrokerError> {
        self.check_open()?;
        let topic = self.topic_or_create(topic)?;
        self.publish_to(&topic, partition, records).await
    }

    /// Publishes to a topic already resolved (transports cache the handle per connection), and
    /// returns once the records are durable under the topic's fsync policy.
    pub async fn publish_to(
        &self,
        topic: &Topic,
        partition: Option<u32>,
        records: RecordBatch,
    ) -> Result<PublishReceipt, BrokerError> {
        self.publish_start(topic, partition, records)?
            .durable()
            .await
    }

    /// Stores a publish and returns at once; the result says what is still awaited before the
    /// publisher may be told (a sync, under `fsync=always`). Transports use this to keep reading
    /// while syncs run, so that many publishes share one fsync.
    ///
    /// A batch that holds its own, exactly sized bytes ([`RecordBatch::into_exact_bytes`]) is
    /// stored as it is; any other (a slice of a frame) is copied, so that what is stored keeps
    /// only itself alive.
    pub fn publish_start(
        &self,
        topic: &Topic,
        partition: Option<u32>,
        records: RecordBatch,
    ) -> Result<PublishPending, BrokerError> {
        self.check_open()?;
        if topic.deleted.load(Relaxed) {
            return Err(BrokerError::UnknownTopic(topic.name.clone()));
        }
        let began = std::time::Instant::now();
        let mut pending =
            topic.publish(partition, records, self.inner.config.message_body_bytes_max)?;
        let appended = std::time::Instant::now();
        crate::stages::record(crate::stages::Stage::Append, appended - began);
        pending.appended = Some(appended);
        Ok(pending)
    }

    /// Replication seam: `records` split by the partition each goes to, as a publish would route
    /// them (the one asked for, its key's, or the next in turn), in partition order. A cluster
    /// hands each part to the replication group of its partition.
    pub fn split_by_partition(
        &self,
        topic: &Topic,
        partition: Option<u32>,
        records: &RecordBatch,
    ) -> Result<Vec<(u32, RecordBatch)>, BrokerError> {
        self.check_open()?;
        topic.split(partition, records, self.inner.config.message_body_bytes_max)
    }

    /// Replication seam: stores a batch that `partition`'s replication group committed, exactly
    /// as it is (no routing and no deduplication: both were decided before it was proposed), so
    /// that every replica gives it the same offsets. The group's log is what makes it durable;
    /// waiting for the returned sync is the caller's choice.
    pub fn append_replicated(
        &self,
        topic: &Topic,
        partition: u32,
        records: RecordBatch,
    ) -> Result<PublishPending, BrokerError> {
        self.check_open()?;
        if topic.deleted.load(Relaxed) {
            return Err(BrokerError::UnknownTopic(topic.name.clone()));
        }
        topic.publish_exact(partition, records)
    }

    /// Replication seam: the messages of `records` (one partition's part of a publish) that
    /// repeat a deduplication id this node's window holds; every replica's window holds the ids
    /// of every batch it applied.
    pub fn replicated_duplicates(
        &self,
        topic: &Topic,
        records: &RecordBatch,
    ) -> Result<Option<crate::topic::DedupCheck>, BrokerError> {
        topic.replicated_duplicates(records)
    }

    /// Replication seam: the offset the next message stored in `partition` of `topic` gets.
    pub fn next_offset(&self, topic: &Topic, partition: u32) -> Result<u64, BrokerError> {
        topic
            .next_offset(partition)
            .ok_or_else(|| BrokerError::invalid("partition", format!("{partition} does not exist")))
    }

    /// In-process convenience: validates and publishes messages.
    pub async fn publish_messages(
        &self,
        topic: &str,
        messages: &[Message],
    ) -> Result<PublishReceipt, BrokerError> {
        let batch = RecordBatch::from_messages(messages)
            .map_err(|e| BrokerError::invalid("message", e.to_string()))?;
        self.publish(topic, None, batch).await
    }

    /// Counts a publisher on `topic` while the guard lives (for the `publishers` statistic).
    pub fn register_publisher(&self, topic: &Arc<Topic>) -> PublisherGuard {
        PublisherGuard::new(topic.clone())
    }

    /// Attaches a consumer, creating its subscription if needed.
    pub fn subscribe(&self, request: &SubscribeRequest) -> Result<Consumer, BrokerError> {
        self.check_open()?;
        let config = &self.inner.config;
        let topic = self.topic_or_create(&request.topic)?;
        let settings = subscribe_settings(request, config)?;
        let partitions = chosen_partitions(&request.partitions, topic.partition_count())?;

        let consumer_id = self.next_id();
        let mut created = false;
        let mut subscriptions = topic.subscriptions.write();
        let subscription = match subscriptions.get(&request.subscription) {
            Some(existing) if !settings.ephemeral => {
                join_subscription(existing, request, &settings, &topic, config)?;
                existing.clone()
            }
            _ => {
                if subscriptions.len() >= config.subscriptions_per_topic_max {
                    return Err(BrokerError::LimitExceeded(format!(
                        "topic '{}' has its maximum of {} subscriptions",
                        topic.name, config.subscriptions_per_topic_max
                    )));
                }
                let name = if settings.ephemeral {
                    format!("ephemeral#{consumer_id}")
                } else {
                    request.subscription.clone()
                };
                let subscription = self.create_subscription(&topic, &name, request, settings)?;
                topic.insert_subscription(&mut subscriptions, name, subscription.clone());
                created = true;
                subscription
            }
        };
        drop(subscriptions);
        if let (Some(durable), true) = (&self.inner.durable, created && topic.is_disk()) {
            // The replicas of a replicated partition served here learn of the subscription at
            // once, with its start, rather than with its first ack.
            for partition in topic.partitions.iter().filter(|p| p.serving_replicated()) {
                if !subscription.ephemeral {
                    durable.state.mark(&topic, &subscription, partition.index);
                }
            }
        }
        let state = match (
            &self.inner.durable,
            topic.is_disk() && !subscription.ephemeral,
        ) {
            (Some(durable), true) => Some(durable.state.clone()),
            _ => None,
        };
        Ok(Consumer::new(
            consumer_id,
            topic,
            subscription,
            config.consumer_in_flight_max,
            state,
        )
        .with_partitions(partitions))
    }

    /// A new subscription of `topic` (whose subscriptions' write lock the caller holds): its
    /// start in each partition, saved first for a named subscription of a disk topic, then a
    /// cursor per partition.
    fn create_subscription(
        &self,
        topic: &Topic,
        name: &str,
        request: &SubscribeRequest,
        settings: SubscribeSettings,
    ) -> Result<Arc<Subscription>, BrokerError> {
        let config = &self.inner.config;
        let mut record = SubscriptionRecord {
            auto_ack: request.auto_ack,
            ack_timeout_ms: settings.ack_timeout_ms as u64,
            max_attempts: settings.max_attempts,
            ordered: request.ordered,
            dead_letter_topic: settings.dead_letter_topic,
            start_offsets: Vec::new(),
            paused: false,
        };
        let subscription = Arc::new(Subscription::new(
            self.next_id(),
            name.to_string(),
            settings.ephemeral,
            &record,
        ));
        let starts = start_offsets(topic, request.start)?;
        record.start_offsets = starts.clone();
        if let (Some(durable), true) = (&self.inner.durable, topic.is_disk() && !settings.ephemeral)
        {
            let cursors: Vec<(u32, CursorRecord)> = starts
                .iter()
                .enumerate()
                .map(|(p, &floor)| {
                    (
                        p as u32,
                        CursorRecord {
                            floor,
                            settled: Vec::new(),
                        },
                    )
                })
                .collect();
            durable
                .state
                .store()
                .put_subscription(&topic.name, name, &record, &cursors)?;
        }
        for (partition, start) in topic.partitions.iter().zip(starts) {
            partition.state.lock().cursors.push(Cursor::new(
                subscription.id,
                subscription.cursor_options(config.status_history),
                start,
            ));
        }
        Ok(subscription)
    }

    /// Deletes a named subscription that has no consumers attached.
    /// Drops every message `name` retains, a dead-letter topic's too. Consumers stay attached
    /// and get what is published next; their in-flight messages leave flight (an ack for one
    /// is answered as for any message no longer in flight). Returns how many messages went.
    pub fn purge_topic(&self, name: &str) -> Result<u64, BrokerError> {
        let topic = self.topic(name)?;
        let mut purged = 0;
        let mut failure = None;
        for partition in topic.partitions.iter() {
            let mut released = Vec::new();
            let result = topic.purge_partition(&mut partition.state.lock(), &mut released);
            topic.release_consumers(&released);
            match result {
                Ok((retained, moved)) => {
                    purged += retained;
                    self.mark_subscriptions(&topic, &moved, partition.index);
                }
                Err(error) => failure = Some(error),
            }
        }
        tracing::info!(topic = name, messages = purged, "topic purged");
        match failure {
            Some(error) => Err(error),
            None => Ok(purged),
        }
    }

    /// Saves the cursors of the listed subscriptions of a disk topic in one partition.
    fn mark_subscriptions(&self, topic: &Arc<Topic>, subscription_ids: &[u64], partition: u32) {
        let (Some(durable), true) = (&self.inner.durable, topic.is_disk()) else {
            return;
        };
        for s in topic.subscriptions.read().values() {
            if subscription_ids.contains(&s.id) && !s.ephemeral {
                durable.state.mark(topic, s, partition);
            }
        }
    }

    /// Pauses (or resumes) deliveries of a subscription to all of its consumers; what is
    /// published meanwhile waits in its backlog. Kept across restarts for a durable subscription.
    pub fn pause_subscription(
        &self,
        topic: &str,
        name: &str,
        paused: bool,
    ) -> Result<(), BrokerError> {
        let topic = self.topic(topic)?;
        let subscription = topic
            .subscriptions
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| BrokerError::UnknownSubscription {
                topic: topic.name.clone(),
                subscription: name.to_owned(),
            })?;
        if let (Some(durable), true) = (&self.inner.durable, topic.is_disk()) {
            if !subscription.ephemeral {
                durable
                    .state
                    .store()
                    .set_subscription_paused(&topic.name, name, paused)?;
            }
        }
        subscription.paused.store(paused, Relaxed);
        if !paused {
            subscription.notify.notify_waiters();
        }
        let what = if paused { "paused" } else { "resumed" };
        tracing::info!(topic = %topic.name, subscription = name, "subscription {what}");
        Ok(())
    }

    /// Where a subscription sends the messages it gives up.
    pub fn subscription_dead_letter_topic(
        &self,
        topic: &str,
        name: &str,
    ) -> Result<String, BrokerError> {
        let topic = self.topic(topic)?;
        let subscriptions = topic.subscriptions.read();
        subscriptions
            .get(name)
            .map(|s| s.dead_letter_topic(&topic.name))
            .ok_or_else(|| BrokerError::UnknownSubscription {
                topic: topic.name.clone(),
                subscription: name.to_owned(),
            })
    }

    /// Whether an operator paused the subscription's deliveries.
    pub fn subscription_paused(&self, topic: &str, name: &str) -> Result<bool, BrokerError> {
        let topic = self.topic(topic)?;
        let subscriptions = topic.subscriptions.read();
        subscriptions
            .get(name)
            .map(|s| s.is_paused())
            .ok_or_else(|| BrokerError::UnknownSubscription {
                topic: topic.name.clone(),
                subscription: name.to_owned(),
            })
    }

    pub fn delete_subscription(&self, topic: &str, name: &str) -> Result<(), BrokerError> {
        let topic = self.topic(topic)?;
        let subscription = topic
            .subscriptions
            .read()
            .get(name)
            .cloned()
            .ok_or_else(|| BrokerError::UnknownSubscription {
                topic: topic.name.clone(),
                subscription: name.to_owned(),
            })?;
        let consumers = subscription.consumers.lock().len();
        if consumers > 0 {
            return Err(BrokerError::Conflict(format!(
                "subscription '{name}' still has {consumers} consumers attached"
            )));
        }
        if let (Some(durable), true) = (&self.inner.durable, topic.is_disk()) {
            durable
                .state
                .store()
                .remove_subscription(&topic.name, name)?;
        }
        topic.remove_subscription(subscription.id, name);
        tracing::info!(topic = %topic.name, subscription = name, "subscription deleted");
        Ok(())
    }

    /// Moves a message given up to its topic's dead-letter topic (created on first use, with
    /// the source's storage), then settles it in the subscription that gave it up. If storing
    /// it fails, it is retried a second later; the message stays unsettled meanwhile.
    async fn dead_letter(&self, letter: DeadLetter) {
        let source = letter.topic.clone();
        if source.is_deleted() {
            return;
        }
        let subscription = source
            .subscriptions
            .read()
            .values()
            .find(|s| s.id == letter.sub_id)
            .cloned();
        let (name, max_attempts) = subscription
            .as_ref()
            .map_or(("(removed)".to_string(), 0), |s| {
                (s.name.clone(), s.max_attempts)
            });
        let dlq_name = subscription.as_ref().map_or_else(
            || dead_letter_topic(&source.name),
            |s| s.dead_letter_topic(&source.name),
        );
        let reason = letter.reason_text(max_attempts);
        let stored = match validate_name("topic", &dlq_name) {
            Err(error) => {
                tracing::error!(topic = %source.name, %error, "no dead-letter topic for this name; the message given up is dropped");
                Ok(None)
            }
            Ok(_) => {
                self.store_dead_letter(&dlq_name, &letter, &name, max_attempts)
                    .await
            }
        };
        match stored {
            Ok(position) => {
                log_dead_letter(&source.name, &name, &letter, max_attempts, &dlq_name);
                let partition = &source.partitions[letter.partition as usize];
                {
                    let mut state = partition.state.lock();
                    if let Some(cursor) = state.cursor_mut(letter.sub_id) {
                        cursor.settle_dead(letter.offset, unix_ms(), &reason, position);
                    }
                    state.trim_settled();
                }
                if let (Some(durable), Some(s)) = (&self.inner.durable, &subscription) {
                    if source.is_disk() && !s.ephemeral {
                        durable.state.mark(&source, s, letter.partition);
                    }
                }
            }
            Err(BrokerError::ShuttingDown) => {}
            Err(error) => {
                static SITE: std::sync::OnceLock<crate::throttle::LogThrottle> =
                    std::sync::OnceLock::new();
                if let Some(skipped) = crate::throttle::throttled(&SITE) {
                    tracing::warn!(topic = %source.name, %error, skipped, "could not store a dead letter; retrying in a second");
                }
                let tx = self.inner.dead_letters.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    let _ = tx.send(letter);
                });
            }
        }
    }

    /// Publishes a dead letter, given up by subscription `name`, to `dlq_name` (created on
    /// first use, with the source's storage). Returns where it was stored.
    async fn store_dead_letter(
        &self,
        dlq_name: &str,
        letter: &DeadLetter,
        name: &str,
        max_attempts: u32,
    ) -> Result<Option<(u32, u64)>, BrokerError> {
        let config = TopicConfig {
            partitions: 1,
            storage: letter.topic.config.storage,
            ..TopicConfig::default()
        };
        let dlq = match self.topic(dlq_name) {
            Ok(topic) => Ok(topic),
            Err(_) => self.create_topic(dlq_name, config, true),
        };
        let message = letter.message(name, max_attempts);
        match (dlq, RecordBatch::from_messages(&[message])) {
            (Ok(dlq), Ok(batch)) => self
                .publish_to(&dlq, None, batch)
                .await
                .map(|receipt| receipt.ids().next()),
            (Err(error), _) => Err(error),
            (_, Err(error)) => Err(BrokerError::invalid("message", error.to_string())),
        }
    }

    /// Statistics of one topic, or of all topics when `topic` is `None`.
    pub fn stats(&self, topic: Option<&str>) -> Result<Vec<TopicStats>, BrokerError> {
        match topic {
            Some(name) => Ok(vec![self.topic(name)?.stats()]),
            None => {
                let topics: Vec<Arc<Topic>> = self.inner.topics.read().values().cloned().collect();
                let mut out: Vec<TopicStats> = topics.iter().map(|t| t.stats()).collect();
                out.sort_by(|a, b| a.name.cmp(&b.name));
                Ok(out)
            }
        }
    }

    /// The metadata store, when the broker has a data dir.
    pub(crate) fn meta_store(&self) -> Option<&MetaStore> {
        self.inner.durable.as_ref().map(|d| d.state.store())
    }
}
/// Fills the defaults that depend on where a topic is stored (`disk`, or memory) into its
/// requested configuration: limits, fsync, retention.
fn fill_storage_defaults(config: &mut TopicConfig, defaults: &TopicDefaults, disk: bool) {
    if config.max_messages == 0 {
        config.max_messages = if disk {
            defaults.disk_max_messages
        } else {
            defaults.max_messages
        };
    }
    if config.max_bytes == 0 {
        config.max_bytes = if disk {
            defaults.disk_max_bytes
        } else {
            defaults.max_bytes
        };
    }
    if disk {
        if config.fsync == FsyncPolicy::Default {
            config.fsync = defaults.fsync;
        }
        if config.fsync == FsyncPolicy::Default {
            config.fsync = FsyncPolicy::Always;
        }
        if config.retention_ms == 0 {
            config.retention_ms = defaults.retention_ms;
        }
    } else {
        config.fsync = FsyncPolicy::Default;
        config.retention_ms = 0;
    }
    if config.retention_policy == RetentionPolicy::Default {
        // A disk topic is a log to replay: a subscription added later with `earliest` finds
        // what others acked (Kafka, JetStream's `limits`). A memory topic is a buffer bounded
        // by RAM that a restart empties anyway: what every subscription settled goes at once.
        config.retention_policy = if disk {
            RetentionPolicy::Stream
        } else {
            RetentionPolicy::WorkQueue
        };
    }
}

/// The faults of a durable broker's data dir and metadata store.
fn data_dir_faults(durable: &Durable, out: &mut Vec<Fault>) {
    let data_dir = &durable.disk.config.data_dir;
    if !data_dir.join("topics").is_dir() {
        out.push(Fault {
            file: Some(data_dir.clone()),
            ..Fault::broker_wide(
                FaultKind::DataDir,
                format!(
                    "the data dir {} (or its topics/ directory) is gone or unreadable",
                    data_dir.display()
                ),
                "restore the data dir from a backup, or stop the broker and start it \
                 on an empty one; writes to disk topics fail until then"
                    .to_string(),
            )
        });
    }
    if let Some(fault) = durable.state.store().fault() {
        out.push(Fault {
            file: Some(data_dir.join("meta.redb")),
            ..Fault::broker_wide(
                FaultKind::MetadataStore,
                format!(
                    "the metadata store has failed for {} s: {}",
                    fault.since.elapsed().as_secs(),
                    fault.reason
                ),
                format!(
                    "free space in {} (or make it writable): acks, topic and \
                     subscription changes fail until then; the store is reopened every \
                     second and recovers by itself",
                    data_dir.display()
                ),
            )
        });
    }
}

/// The ranges of a disk topic's partitions that reads found damaged.
fn unreadable_ranges(topic: &Topic, out: &mut Vec<Fault>) {
    for partition in topic.partitions.iter() {
        let state = partition.state.lock();
        let Some(disk) = &state.disk else {
            continue;
        };
        for d in disk.damage() {
            out.push(Fault {
                kind: FaultKind::UnreadableRange,
                topic: Some(topic.name.clone()),
                partition: Some(partition.index),
                file: Some(d.file.clone()),
                position: Some(d.position),
                offsets: Some((d.first_offset, d.end_offset)),
                reason: format!(
                    "messages {}..{} cannot be read: {}",
                    d.first_offset, d.end_offset, d.reason
                ),
                action: format!(
                    "restore the file from a backup and restart, or skip these messages \
                     for every subscription with `ferrymq topic skip-damaged {} \
                     --partition {}` (POST /topics/{}/partitions/{}/skip-damaged)",
                    topic.name, partition.index, topic.name, partition.index
                ),
            });
        }
    }
}

/// A partition that refuses writes or was found damaged, as a fault with what to do about it.
fn partition_fault(f: crate::PartitionFault) -> Fault {
    let (kind, action) = if f.damaged {
        (
            FaultKind::PartitionDamaged,
            "run `ferrymq verify` on the data dir to see the damage; restore the \
             partition's files from a backup or delete its damaged segments, then \
             restart the broker",
        )
    } else {
        (
            FaultKind::PartitionWrites,
            "free space in the data dir (delete topics or wait for retention) or make it \
             writable; the partition retries by itself and takes writes again",
        )
    };
    Fault {
        topic: Some(f.topic),
        partition: Some(f.partition),
        ..Fault::broker_wide(kind, f.reason, action.to_string())
    }
}

/// Opens the metadata store of a data dir, creating the dir if needed.
fn open_meta_store(disk: &DiskConfig) -> Result<Arc<MetaStore>, BrokerError> {
    std::fs::create_dir_all(disk.data_dir.join("topics")).map_err(|e| {
        BrokerError::Storage(format!(
            "cannot create the data dir {}: {e}",
            disk.data_dir.display()
        ))
    })?;
    Ok(Arc::new(match disk.storage.meta_backend() {
        Some(_) => {
            let storage = disk.storage.clone();
            MetaStore::open_with_backend(move || storage.meta_backend())?
        }
        None => MetaStore::open(&disk.data_dir.join("meta.redb"))?,
    }))
}

/// Opens the disk topics the metadata store lists, with their subscriptions and cursors, into
/// `topics`, and syncs what was written but not known synced before anything is served. Returns
/// the last subscription id given.
fn load_disk_topics(
    shared: &Arc<DiskShared>,
    loaded: &Loaded,
    config: &BrokerConfig,
    topics: &mut Vec<(String, Arc<Topic>)>,
) -> Result<u64, BrokerError> {
    let mut next_id = 1u64;
    let mut unsynced: Vec<(Arc<Topic>, u32)> = Vec::new();
    for (name, record) in &loaded.topics {
        let valid = match validate_name("topic", name) {
            Ok(valid) => valid,
            // Stored by a version that let path-like names through: its directory is not
            // its own (`..` is the data dir), so nothing of it is opened or removed.
            Err(error) => {
                tracing::error!(topic = ?name, %error,
                    "a stored topic has a name that is no longer valid; it is not served and no file is touched for it: delete it with a version that accepted it, or remove it from the metadata store");
                continue;
            }
        };
        let mut topic_config = record.config().map_err(|e| {
            BrokerError::Storage(format!("topic '{name}' has invalid settings: {e}"))
        })?;
        if topic_config.dedup_window_ms == 0 {
            topic_config.dedup_window_ms = config.topic_defaults.dedup_window_ms;
        }
        let (topic, to_sync) = open_disk_topic(shared, valid, topic_config, false, |p| {
            loaded.synced_ends.get(&(name.clone(), p)).copied()
        })?;
        unsynced.extend(to_sync.into_iter().map(|p| (topic.clone(), p)));
        for p in 0..topic.partition_count() {
            if let Some(&end) = loaded.priority_ends.get(&(name.clone(), p)) {
                topic.partitions[p as usize]
                    .state
                    .lock()
                    .log
                    .know_priority_end(end);
            }
        }
        restore_subscriptions(&topic, loaded, config.status_history, &mut next_id);
        // One line per topic only at debug: a start with thousands of topics would
        // otherwise bury everything else; the summary below says what was loaded.
        tracing::debug!(topic = %name, partitions = topic.partition_count(), subscriptions = topic.subscriptions.read().len(), "disk topic loaded");
        topics.push((name.clone(), topic));
    }
    let partitions: u64 = topics
        .iter()
        .map(|(_, topic)| u64::from(topic.partition_count()))
        .sum();
    tracing::info!(
        topics = topics.len(),
        partitions,
        subscriptions = loaded.subscriptions.len(),
        "disk topics loaded"
    );
    // Before anything is served.
    sync_at_start(unsynced);
    remove_orphan_dirs(&shared.config, &loaded.topics);
    Ok(next_id)
}

/// Restores the saved subscriptions of a disk topic, each with a cursor per partition, giving
/// them ids after `next_id`.
fn restore_subscriptions(topic: &Topic, loaded: &Loaded, history: usize, next_id: &mut u64) {
    let name = &topic.name;
    for (topic_name, sub_name, sub) in &loaded.subscriptions {
        if topic_name != name {
            continue;
        }
        *next_id += 1;
        let subscription = Arc::new(Subscription::new(*next_id, sub_name.clone(), false, sub));
        let options = subscription.cursor_options(history);
        for p in 0..topic.partition_count() {
            let mut state = topic.partitions[p as usize].state.lock();
            let key = (name.clone(), sub_name.clone(), p);
            let subscription_start = sub.start_offsets.get(p as usize).copied();
            let cursor = restore_cursor(
                &state,
                (subscription.id, options.clone(), subscription_start),
                loaded,
                &key,
            );
            state.cursors.push(cursor);
        }
        topic.insert_subscription(
            &mut topic.subscriptions.write(),
            sub_name.clone(),
            subscription,
        );
    }
}

/// The saved cursor of (topic, subscription, partition) `key`, over the partition as opened,
/// for the subscription of that id and options that started at `subscription_start`.
fn restore_cursor(
    state: &PartitionState,
    (sub_id, options, subscription_start): (u64, CursorOptions, Option<u64>),
    loaded: &Loaded,
    key: &(String, String, u32),
) -> Cursor {
    let start = state.first_offset();
    let end = state.log.next_offset();
    let record = loaded.cursors.get(key).cloned().unwrap_or(CursorRecord {
        floor: start,
        settled: Vec::new(),
    });
    let mut cursor = Cursor::restore(sub_id, options, record.floor, &record.settled, start, end);
    if let Some(subscription_start) = subscription_start {
        cursor.set_start(subscription_start);
    }
    if let Some(saved) = loaded.delivery.get(key) {
        cursor.restore_delivery(saved);
    }
    if let Some(saved) = loaded.histories.get(key) {
        if !cursor.restore_history(saved) {
            let (topic, subscription, partition) = key;
            tracing::warn!(topic = %topic, subscription = %subscription, partition = *partition,
                "the saved status history is unreadable; starting without it");
        }
    }
    cursor
}

/// A subscribe request's settings, validated, with the broker's defaults filled in.
struct SubscribeSettings {
    ack_timeout_ms: u32,
    max_attempts: u32,
    /// No name given: the subscription lives as long as its one consumer.
    ephemeral: bool,
    dead_letter_topic: Option<String>,
}

/// Validates a subscribe request's settings, in the order a user reads them.
fn subscribe_settings(
    request: &SubscribeRequest,
    config: &BrokerConfig,
) -> Result<SubscribeSettings, BrokerError> {
    let ack_timeout_ms = match request.ack_timeout_ms {
        0 => config.ack_timeout_ms_default,
        t if !(ACK_TIMEOUT_MS_MIN..=ACK_TIMEOUT_MS_MAX).contains(&t) => {
            return Err(BrokerError::invalid(
                "ack_timeout_ms",
                format!("{t} is outside {ACK_TIMEOUT_MS_MIN}..={ACK_TIMEOUT_MS_MAX}"),
            ))
        }
        t => t,
    };
    let max_attempts = match request.max_attempts {
        0 => config.max_attempts_default,
        n => n,
    };
    let ephemeral = request.subscription.is_empty();
    if !ephemeral {
        validate_name("subscription", &request.subscription)?;
    }
    if request.ordered && request.auto_ack {
        return Err(BrokerError::invalid(
            "ordered",
            "ordered delivery needs acks: it cannot be combined with auto_ack",
        ));
    }
    let dead_letter_topic = match request.dead_letter_topic.as_str() {
        "" => None,
        name => {
            validate_name("dead_letter_topic", name)?;
            if name == request.topic {
                return Err(BrokerError::invalid(
                    "dead_letter_topic",
                    "must differ from the topic itself",
                ));
            }
            Some(name.to_string())
        }
    };
    Ok(SubscribeSettings {
        ack_timeout_ms,
        max_attempts,
        ephemeral,
        dead_letter_topic,
    })
}

/// Refuses a consumer that asks an existing subscription for other settings than it has, or
/// that would pass its limit of consumers.
fn join_subscription(
    existing: &Subscription,
    request: &SubscribeRequest,
    settings: &SubscribeSettings,
    topic: &Topic,
    config: &BrokerConfig,
) -> Result<(), BrokerError> {
    let (ack_timeout_ms, max_attempts) = (settings.ack_timeout_ms, settings.max_attempts);
    if request.ack_timeout_ms != 0
        && existing.ack_timeout != Duration::from_millis(ack_timeout_ms as u64)
    {
        return Err(BrokerError::Conflict(format!(
            "subscription '{}' has ack_timeout_ms {}, not {ack_timeout_ms}",
            existing.name,
            existing.ack_timeout.as_millis()
        )));
    }
    if request.max_attempts != 0 && existing.max_attempts != max_attempts {
        return Err(BrokerError::Conflict(format!(
            "subscription '{}' has max_attempts {}, not {max_attempts}",
            existing.name, existing.max_attempts
        )));
    }
    if existing.ordered != request.ordered {
        return Err(BrokerError::Conflict(format!(
            "subscription '{}' was created with ordered={}",
            existing.name, existing.ordered
        )));
    }
    if settings.dead_letter_topic.is_some()
        && existing.dead_letter_topic != settings.dead_letter_topic
    {
        return Err(BrokerError::Conflict(format!(
            "subscription '{}' sends dead letters to '{}'",
            existing.name,
            existing.dead_letter_topic(&topic.name)
        )));
    }
    if existing.auto_ack != request.auto_ack {
        return Err(BrokerError::Conflict(format!(
            "subscription '{}' was created with auto_ack={}",
            existing.name, existing.auto_ack
        )));
    }
    if existing.consumers.lock().len() >= config.consumers_per_subscription_max {
        return Err(BrokerError::LimitExceeded(format!(
            "subscription '{}' has its maximum of {} consumers",
            existing.name, config.consumers_per_subscription_max
        )));
    }
    Ok(())
}

/// Where a new subscription starts in each partition of `topic`.
fn start_offsets(topic: &Topic, start: StartPosition) -> Result<Vec<u64>, BrokerError> {
    let mut starts = Vec::with_capacity(topic.partitions.len());
    for partition in topic.partitions.iter() {
        let state = partition.state.lock();
        let (first, end) = (state.first_offset(), state.log.next_offset());
        starts.push(match start {
            StartPosition::Latest => end,
            StartPosition::Earliest => first,
            StartPosition::Offset(o) => o.clamp(first, end),
            StartPosition::TimeMs(t) => state.offset_for_time(t)?.max(first),
        });
    }
    Ok(starts)
}

/// The partitions a consumer asked for, ascending and without repeats; `None` for all.
fn chosen_partitions(ranges: &[(u32, u32)], count: u32) -> Result<Option<Vec<u32>>, BrokerError> {
    if ranges.is_empty() {
        return Ok(None);
    }
    let mut list = Vec::new();
    for &(first, last) in ranges {
        if first > last || last >= count {
            return Err(BrokerError::invalid(
                "partitions",
                format!(
                    "{first}-{last} is not within the topic's partitions 0-{}",
                    count - 1
                ),
            ));
        }
        list.extend(first..=last);
    }
    list.sort_unstable();
    list.dedup();
    Ok(Some(list))
}

/// Opens (creating if needed) the partition logs of a disk topic. `synced_end(p)` is where
/// partition `p`'s log ended when a clean shutdown had synced it, if it did. Returns the topic
/// and the partitions whose logs must be synced before anything is served from them
/// ([`sync_at_start`]); a new topic has none.
fn open_disk_topic(
    shared: &Arc<DiskShared>,
    name: ValidName<'_>,
    config: TopicConfig,
    is_new: bool,
    synced_end: impl Fn(u32) -> Option<u64>,
) -> Result<(Arc<Topic>, Vec<u32>), BrokerError> {
    let mut logs: Vec<(Result<FileLog, String>, std::path::PathBuf)> =
        Vec::with_capacity(config.partitions as usize);
    let mut to_sync = Vec::new();
    for p in 0..config.partitions {
        let dir = shared.config.partition_dir(name, p);
        let opened = PartitionLog::open(
            shared.config.storage.storage(),
            &dir,
            shared.config.log_config(),
        )
        .map(|(log, report)| {
            log_recovery(&dir, &report);
            // What a crashed process wrote may be in the page cache only: it is delivered from
            // now on, so it must be on disk first (or a power loss could take back a message a
            // consumer already acked, and hand its offset to another): `sync_at_start` syncs
            // it before anything is served. A log that ends where a clean shutdown synced it is
            // on disk already: skipping its fsyncs (three per partition, each a disk cache
            // flush) is most of a start with thousands of topics.
            let synced = synced_end(p) == Some(log.next_offset());
            if !synced && log.durable_offset() < log.next_offset() {
                to_sync.push(p);
            }
            log
        });
        match opened {
            Ok(log) => logs.push((Ok(log), dir)),
            // No descriptor left says nothing about the files: the partition is not damaged,
            // and the error says which limit to raise.
            Err(error) if error.is_out_of_open_files() => {
                return Err(BrokerError::Storage(format!(
                    "cannot open topic '{name}' partition {p}: {error}"
                )))
            }
            Err(error) if is_new => {
                return Err(BrokerError::Storage(format!(
                    "cannot create topic '{name}' partition {p}: {error}"
                )))
            }
            Err(error) => {
                tracing::error!(topic = %name, partition = p, %error,
                    "partition log is damaged; it stays out of service (reads and writes get this error) until it is repaired and the broker restarted; `ferrymq verify` lists every damaged spot");
                logs.push((Err(error.to_string()), dir));
            }
        }
    }
    let disk = topic_disk(shared, &config);
    let topic = Topic::new_disk(name.as_str().to_owned(), config, disk, logs);
    Ok((topic, to_sync))
}

/// The disk side of a topic: the policies its configuration asks for, applied.
fn topic_disk(shared: &Arc<DiskShared>, config: &TopicConfig) -> TopicDisk {
    let fsync = match config.fsync {
        FsyncPolicy::Always | FsyncPolicy::Default => AppliedFsync::Always,
        FsyncPolicy::IntervalMs(ms) => AppliedFsync::Interval(Duration::from_millis(ms as u64)),
        FsyncPolicy::Never => AppliedFsync::Never,
    };
    let retention_ms = (config.retention_ms != u64::MAX && config.retention_ms != 0)
        .then_some(config.retention_ms);
    TopicDisk {
        shared: shared.clone(),
        fsync,
        retention_ms,
    }
}

/// Threads that run the syncs of a start after a crash: enough for the file system to put many
/// fsyncs in one journal commit, few enough to be cheap to spawn once.
const START_SYNC_THREADS: usize = 32;

/// Syncs the partition logs a start found not known to be on disk (after a crash, what the
/// process wrote may be in the page cache only), before anything is served from them: a power
/// loss could otherwise take back a message a consumer already acked and hand its offset to
/// another. One log at a time, a start after a crash with 10 000 topics spent most of its ~50 s
/// in 10 000 fsyncs in a row; run side by side, the file system commits many in one journal
/// transaction. A log whose sync fails stops taking writes, as after a failed sync at run time.
fn sync_at_start(pending: Vec<(Arc<Topic>, u32)>) {
    if pending.is_empty() {
        return;
    }
    let started = std::time::Instant::now();
    let mut jobs: Vec<_> = pending
        .into_iter()
        .filter_map(|(topic, p)| {
            let mut state = topic.partitions[p as usize].state.lock();
            let disk = state.disk.as_mut()?;
            let log = disk.open_log_mut()?;
            match log.begin_sync() {
                Ok(job) => {
                    drop(state);
                    Some((topic, p, job))
                }
                Err(error) => {
                    disk.fail(format!("cannot sync the log at start: {error}"));
                    None
                }
            }
        })
        .collect();
    let count = jobs.len();
    let threads = START_SYNC_THREADS.min(count).max(1);
    let chunk = count.div_ceil(threads).max(1);
    let mut chunks = Vec::with_capacity(threads);
    while !jobs.is_empty() {
        let rest = jobs.split_off(chunk.min(jobs.len()));
        chunks.push(std::mem::replace(&mut jobs, rest));
    }
    let done: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .into_iter()
                        .map(|(topic, p, job)| (topic, p, job.run()))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|handle| handle.join().expect("a start sync thread does not panic"))
            .collect()
    });
    for (topic, p, result) in done {
        let mut state = topic.partitions[p as usize].state.lock();
        let Some(disk) = state.disk.as_mut() else {
            continue;
        };
        let Some(log) = disk.open_log_mut() else {
            continue;
        };
        if let Err(error) = log.finish_sync(result) {
            disk.fail(format!("cannot sync the log at start: {error}"));
        }
    }
    tracing::info!(
        partitions = count,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "partition logs not known to be on disk synced"
    );
}

fn remove_topic_dir(config: &DiskConfig, name: ValidName<'_>) {
    let dir = config.topic_dir(name);
    if let Err(error) = config.storage.remove_dir_all(&dir) {
        if error.kind() != std::io::ErrorKind::NotFound {
            tracing::error!(dir = %dir.display(), %error, "could not remove a deleted topic's files");
        }
    }
}

/// Topic directories the metadata store does not know: left by a crash between creating a
/// topic's files and recording it, or between forgetting a deleted topic and removing its files.
fn remove_orphan_dirs(config: &DiskConfig, topics: &[(String, TopicRecord)]) {
    let Ok(entries) = std::fs::read_dir(config.data_dir.join("topics")) else {
        return;
    };
    // A set: a linear search per directory is 10^8 comparisons with 10 000 topics.
    let known: std::collections::HashSet<&str> = topics.iter().map(|(t, _)| t.as_str()).collect();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if known.contains(name.as_str()) {
            continue;
        }
        match validate_name("topic", &name) {
            Ok(valid) => {
                tracing::warn!(dir = %entry.path().display(), "removing the files of a topic that does not exist (left by a crash)");
                remove_topic_dir(config, valid);
            }
            // Not a topic's directory: something the broker did not write, left alone.
            Err(_) => {
                tracing::warn!(path = %entry.path().display(), "the topics directory holds something that is no topic's; it is left alone");
            }
        }
    }
}

impl BrokerInner {
    /// Queues a sync for `fsync=interval` partitions whose interval has passed.
    fn sync_due_intervals(&self) {
        let Some(durable) = &self.durable else {
            return;
        };
        let topics = self.topics.read();
        for topic in topics.values() {
            for partition in topic.partitions.iter() {
                if !partition.sync_due.load(Relaxed) {
                    continue;
                }
                let mut state = partition.state.lock();
                let Some(disk) = state.disk.as_mut() else {
                    continue;
                };
                let AppliedFsync::Interval(every) = disk.fsync() else {
                    continue;
                };
                if disk.last_sync().elapsed() < every {
                    continue;
                }
                partition.sync_due.store(false, Relaxed);
                if disk.want_sync() {
                    drop(state);
                    durable.disk.queue_sync(topic, partition.index);
                }
            }
        }
    }

    /// Retention (by age, size, count, and what every subscription has settled) and recovery of
    /// failed partition logs.
    fn maintain_disk(&self) {
        let Some(durable) = &self.durable else {
            return;
        };
        let topics: Vec<Arc<Topic>> = self
            .topics
            .read()
            .values()
            .filter(|t| t.is_disk())
            .cloned()
            .collect();
        let now_ms = unix_ms();
        for topic in topics {
            for partition in topic.partitions.iter() {
                let mut released = Vec::new();
                let mut recover = false;
                let mut changed_subs = Vec::new();
                {
                    let mut guard = partition.state.lock();
                    let state = &mut *guard;
                    if let Some(disk) = state.disk.as_mut() {
                        if disk.is_failed() {
                            disk.retain_while_closed(state.cursors.iter().map(Cursor::floor).min());
                            recover = disk.want_recovery();
                        } else {
                            let start = topic.apply_retention(state, now_ms);
                            if let Some(start) = start {
                                // Each message once: as many as the subscription that lost the
                                // most had not received.
                                let mut dropped = 0;
                                for cursor in state.cursors.iter_mut() {
                                    if cursor.floor() < start {
                                        let sub_id = cursor.sub_id;
                                        dropped =
                                            dropped.max(cursor.drop_below(start, |consumer| {
                                                released.push((sub_id, consumer))
                                            }));
                                        changed_subs.push(sub_id);
                                    }
                                }
                                if dropped > 0 {
                                    topic.counters.dropped.fetch_add(dropped, Relaxed);
                                }
                                state.trim_log_to(start);
                            }
                        }
                    }
                }
                topic.release_consumers(&released);
                if !changed_subs.is_empty() {
                    let subscriptions = topic.subscriptions.read();
                    for s in subscriptions.values() {
                        if changed_subs.contains(&s.id) && !s.ephemeral {
                            durable.state.mark(&topic, s, partition.index);
                        }
                    }
                }
                if recover {
                    durable.disk.queue_recovery(&topic, partition.index);
                }
            }
        }
    }

    fn fire_timers(&self, now: Instant) {
        let topics = self.topics.read();
        for topic in topics.values() {
            for partition in topic.partitions.iter() {
                if !partition.timers_pending.load(Relaxed) {
                    continue;
                }
                let mut released = Vec::new();
                let mut outcomes: Vec<(u64, Released)> = Vec::new();
                let mut pending = false;
                let mut dead = Vec::new();
                {
                    let mut state = partition.state.lock();
                    for cursor in state.cursors.iter_mut() {
                        let sub_id = cursor.sub_id;
                        let r =
                            cursor.fire_timers(now, |consumer| released.push((sub_id, consumer)));
                        if r != Released::default() {
                            outcomes.push((sub_id, r));
                        }
                        pending |= cursor.has_timers();
                    }
                    topic.take_dead_letters(&mut state, partition.index, None, &mut dead);
                    state.trim_settled();
                    partition.timers_pending.store(pending, Relaxed);
                }
                topic.send_dead_letters(dead);
                topic.release_consumers(&released);
                if !outcomes.is_empty() {
                    let subscriptions = topic.subscriptions.read();
                    for (sub_id, r) in outcomes {
                        if let Some(s) = subscriptions.values().find(|s| s.id == sub_id) {
                            s.count_released(r);
                            if let (Some(durable), true) = (
                                &self.durable,
                                (r.gave_up > 0 || r.requeued > 0)
                                    && topic.is_disk()
                                    && !s.ephemeral,
                            ) {
                                durable.state.mark(topic, s, partition.index);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The one log line of a dead letter, saying why it died: a consumer's explicit rejection is
/// the application's decision, at debug level (a consumer that rejects many would fill the log);
/// attempts that ran out mean a message nobody could process, a warning.
fn log_dead_letter(
    topic: &str,
    subscription: &str,
    letter: &crate::topic::DeadLetter,
    max_attempts: u32,
    dead_letter_topic: &str,
) {
    let partition = letter.partition;
    let offset = letter.offset;
    let attempts = letter.attempts;
    match &letter.reason {
        Some(reason) => {
            tracing::debug!(topic, subscription, partition, offset, attempts, %reason, dead_letter_topic,
            "message rejected by its consumer, moved to the dead-letter topic")
        }
        None => tracing::warn!(
            topic,
            subscription,
            partition,
            offset,
            attempts,
            max_attempts,
            dead_letter_topic,
            "message reached max_attempts, moved to the dead-letter topic"
        ),
    }
}
