//! The broker: the registry of topics and the entry points every transport calls.
//!
//! Lock order: broker `topics` → topic `subscriptions` → partition state → subscription
//! `consumers`. The timer task walks topics under the `topics` read lock and takes partition locks
//! one at a time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use ferrymq_protocol::limits::{
    ACK_TIMEOUT_MS_MAX, ACK_TIMEOUT_MS_MIN, NAME_BYTES_MAX, PARTITIONS_MAX,
};
use ferrymq_protocol::{
    Message, RecordBatch, StartPosition, Storage, SubscribeRequest, TopicConfig, TopicInfo,
    TopicStats,
};
use parking_lot::RwLock;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::BrokerConfig;
use crate::cursor::{Cursor, Released};
use crate::error::BrokerError;
use crate::subscription::{Consumer, Subscription};
use crate::topic::{PublishReceipt, PublisherGuard, Topic};

/// A handle to a running broker; cheap to clone. Open it inside a tokio runtime: it runs one
/// background task for ack deadlines and delayed redeliveries, stopped by [`Broker::shutdown`] or
/// when the last handle is dropped.
#[derive(Clone)]
pub struct Broker {
    inner: Arc<BrokerInner>,
}

struct BrokerInner {
    config: BrokerConfig,
    topics: RwLock<HashMap<String, Arc<Topic>>>,
    next_id: AtomicU64,
    closed: AtomicBool,
    stop_timers: Notify,
}

impl Drop for BrokerInner {
    fn drop(&mut self) {
        self.stop_timers.notify_one();
    }
}

/// Topic and subscription names: 1 to 255 bytes of ASCII letters, digits, `.`, `_` and `-`, so
/// they are safe in file names, URLs and metric labels alike.
pub fn validate_name(field: &'static str, name: &str) -> Result<(), BrokerError> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(BrokerError::invalid(
            field,
            format!("must be 1 to {NAME_BYTES_MAX} bytes long"),
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(BrokerError::invalid(
            field,
            format!("'{name}' contains '{c}': use letters, digits, '.', '_' and '-'"),
        ));
    }
    Ok(())
}

impl Broker {
    /// Opens a broker with `config`. Must be called within a tokio runtime.
    pub fn open(config: BrokerConfig) -> Broker {
        let inner = Arc::new(BrokerInner {
            config,
            topics: RwLock::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            stop_timers: Notify::new(),
        });
        let weak = Arc::downgrade(&inner);
        let tick = Duration::from_millis(inner.config.timer_tick_ms.max(1));
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(tick);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let stop = {
                    let Some(inner) = weak.upgrade() else { return };
                    let stopped = inner.stop_timers.notified();
                    tokio::select! {
                        _ = interval.tick() => false,
                        _ = stopped => true,
                    }
                };
                let Some(inner) = weak.upgrade() else { return };
                if stop || inner.closed.load(Relaxed) {
                    return;
                }
                inner.fire_timers(Instant::now());
            }
        });
        Broker { inner }
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.inner.config
    }

    /// Stops the timer task and refuses new work. Existing handles stay valid for reads.
    pub fn shutdown(&self) {
        self.inner.closed.store(true, Relaxed);
        self.inner.stop_timers.notify_one();
    }

    fn check_open(&self) -> Result<(), BrokerError> {
        if self.inner.closed.load(Relaxed) {
            return Err(BrokerError::ShuttingDown);
        }
        Ok(())
    }

    fn next_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Relaxed)
    }

    /// Fills defaults into a requested topic configuration and checks it.
    fn resolve_config(&self, mut config: TopicConfig) -> Result<TopicConfig, BrokerError> {
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
        if config.storage == Storage::Disk {
            return Err(BrokerError::invalid(
                "storage",
                "disk topics are not available in this build; use memory",
            ));
        }
        if config.max_messages == 0 {
            config.max_messages = defaults.max_messages;
        }
        if config.max_bytes == 0 {
            config.max_bytes = defaults.max_bytes;
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
        TopicConfig {
            partitions: d.partitions,
            storage: d.storage,
            overflow: d.overflow,
            max_messages: 0,
            max_bytes: 0,
        }
    }

    pub fn create_topic(
        &self,
        name: &str,
        config: TopicConfig,
        if_not_exists: bool,
    ) -> Result<Arc<Topic>, BrokerError> {
        self.check_open()?;
        validate_name("topic", name)?;
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
        let topic = Arc::new(Topic::new(name.to_owned(), config));
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

    pub fn describe_topic(&self, name: &str) -> Result<TopicInfo, BrokerError> {
        Ok(self.topic(name)?.info())
    }

    /// Publishes a validated batch. The receipt lists the offsets given, in message order.
    pub async fn publish(
        &self,
        topic: &str,
        partition: Option<u32>,
        records: &RecordBatch,
    ) -> Result<PublishReceipt, BrokerError> {
        self.check_open()?;
        let topic = self.topic_or_create(topic)?;
        self.publish_to(&topic, partition, records).await
    }

    /// Publishes to a topic already resolved (transports cache the handle per connection).
    pub async fn publish_to(
        &self,
        topic: &Topic,
        partition: Option<u32>,
        records: &RecordBatch,
    ) -> Result<PublishReceipt, BrokerError> {
        if topic.deleted.load(Relaxed) {
            return Err(BrokerError::UnknownTopic(topic.name.clone()));
        }
        topic.publish(partition, records, self.inner.config.message_body_bytes_max)
    }

    /// In-process convenience: validates and publishes messages.
    pub async fn publish_messages(
        &self,
        topic: &str,
        messages: &[Message],
    ) -> Result<PublishReceipt, BrokerError> {
        let batch = RecordBatch::from_messages(messages)
            .map_err(|e| BrokerError::invalid("message", e.to_string()))?;
        self.publish(topic, None, &batch).await
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

        let consumer_id = self.next_id();
        let mut subscriptions = topic.subscriptions.write();
        let subscription = match subscriptions.get(&request.subscription) {
            Some(existing) if !ephemeral => {
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
                existing.clone()
            }
            _ => {
                if subscriptions.len() >= config.subscriptions_per_topic_max {
                    return Err(BrokerError::LimitExceeded(format!(
                        "topic '{}' has its maximum of {} subscriptions",
                        topic.name, config.subscriptions_per_topic_max
                    )));
                }
                let name = if ephemeral {
                    format!("ephemeral#{consumer_id}")
                } else {
                    request.subscription.clone()
                };
                let subscription = Arc::new(Subscription {
                    id: self.next_id(),
                    name: name.clone(),
                    ephemeral,
                    auto_ack: request.auto_ack,
                    ack_timeout: Duration::from_millis(ack_timeout_ms as u64),
                    max_attempts,
                    notify: Notify::new(),
                    consumers: Default::default(),
                    counters: Default::default(),
                });
                for partition in topic.partitions.iter() {
                    let mut state = partition.state.lock();
                    let log = &state.log;
                    let start = match request.start {
                        StartPosition::Latest => log.next_offset(),
                        StartPosition::Earliest => log.head(),
                        StartPosition::Offset(o) => o.clamp(log.head(), log.next_offset()),
                        StartPosition::TimeMs(t) => log.offset_for_time(t),
                    };
                    state.cursors.push(Cursor::new(
                        subscription.id,
                        request.auto_ack,
                        max_attempts,
                        start,
                    ));
                }
                subscriptions.insert(name, subscription.clone());
                subscription
            }
        };
        drop(subscriptions);
        Ok(Consumer::new(
            consumer_id,
            topic,
            subscription,
            config.consumer_in_flight_max,
        ))
    }

    /// Deletes a named subscription that has no consumers attached.
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
        topic.remove_subscription(subscription.id, name);
        Ok(())
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
}

impl BrokerInner {
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
                    state.trim_settled();
                    partition.timers_pending.store(pending, Relaxed);
                }
                topic.release_consumers(&released);
                if !outcomes.is_empty() {
                    let subscriptions = topic.subscriptions.read();
                    for (sub_id, r) in outcomes {
                        if let Some(s) = subscriptions.values().find(|s| s.id == sub_id) {
                            s.count_released(&topic.name, r);
                        }
                    }
                }
            }
        }
    }
}
