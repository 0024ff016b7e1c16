//! Topics and their partitions.
//!
//! Lock order: a topic's `subscriptions` lock may be taken before partition locks, never after;
//! partition locks are taken in ascending index order; no partition lock is held across an await
//! or while taking the broker's topic map.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use bytes::Bytes;
use ferrymq_protocol::{
    Durability, OffsetRange, OverflowPolicy, RecordBatch, RecordSpan, SubscriptionStats,
    TopicConfig, TopicInfo, TopicStats,
};
use parking_lot::{Mutex, RwLock};

use crate::config::MESSAGE_OVERHEAD_BYTES;
use crate::cursor::Cursor;
use crate::error::BrokerError;
use crate::log::MemoryLog;
use crate::subscription::Subscription;

pub(crate) struct PartitionState {
    pub log: MemoryLog,
    /// One cursor per subscription of the topic.
    pub cursors: Vec<Cursor>,
}

impl PartitionState {
    pub fn cursor_mut(&mut self, sub_id: u64) -> Option<&mut Cursor> {
        self.cursors.iter_mut().find(|c| c.sub_id == sub_id)
    }

    pub fn cursor(&self, sub_id: u64) -> Option<&Cursor> {
        self.cursors.iter().find(|c| c.sub_id == sub_id)
    }

    /// Frees every message all subscriptions have settled. Without subscriptions the log keeps
    /// messages up to the topic's limits, for a later subscription that starts at `earliest`.
    pub fn trim_settled(&mut self) {
        if let Some(min_floor) = self.cursors.iter().map(Cursor::floor).min() {
            self.log.trim_to(min_floor);
        }
    }
}

pub(crate) struct Partition {
    pub index: u32,
    pub state: Mutex<PartitionState>,
    /// Set while some cursor has pending timers, so the timer task skips idle partitions cheaply.
    pub timers_pending: AtomicBool,
}

#[derive(Default)]
pub(crate) struct TopicCounters {
    pub messages_in: AtomicU64,
    pub bytes_in: AtomicU64,
    pub messages_out: AtomicU64,
    pub bytes_out: AtomicU64,
    pub dropped: AtomicU64,
    pub publishers: AtomicU32,
    pub subscribers: AtomicU32,
}

/// A named stream of messages split into partitions.
pub struct Topic {
    pub(crate) name: String,
    pub(crate) config: TopicConfig,
    pub(crate) partitions: Box<[Partition]>,
    /// Per-partition limits derived from the topic's limits.
    max_messages_per_partition: u64,
    max_bytes_per_partition: u64,
    round_robin: AtomicU32,
    pub(crate) subscriptions: RwLock<HashMap<String, Arc<Subscription>>>,
    pub(crate) counters: TopicCounters,
    pub(crate) deleted: AtomicBool,
}

/// What a successful publish returns: the offsets given to the messages, in message order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishReceipt {
    pub durability: Durability,
    pub ranges: Vec<OffsetRange>,
}

impl PublishReceipt {
    /// The `(partition, offset)` of each message, in publish order.
    pub fn ids(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.ranges
            .iter()
            .flat_map(|r| (r.offset..r.end()).map(move |o| (r.partition, o)))
    }
}

/// Milliseconds since the Unix epoch, for message timestamps.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// FNV-1a, 64-bit: stable across versions and platforms, so a key keeps its partition.
pub fn key_hash(key: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        hash ^= b as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// The partition a key goes to: an ASCII decimal integer key modulo the partition count, any other
/// key by its stable hash.
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    let as_int = (!key.is_empty() && key.len() <= 20 && key.iter().all(u8::is_ascii_digit))
        .then(|| std::str::from_utf8(key).ok()?.parse::<u64>().ok())
        .flatten();
    (as_int.unwrap_or_else(|| key_hash(key)) % partitions as u64) as u32
}

impl Topic {
    pub(crate) fn new(name: String, config: TopicConfig) -> Topic {
        assert!(config.partitions >= 1 && config.max_messages >= 1 && config.max_bytes >= 1);
        let partitions = (0..config.partitions)
            .map(|index| Partition {
                index,
                state: Mutex::new(PartitionState {
                    log: MemoryLog::default(),
                    cursors: Vec::new(),
                }),
                timers_pending: AtomicBool::new(false),
            })
            .collect();
        let n = config.partitions as u64;
        Topic {
            name,
            max_messages_per_partition: config.max_messages.div_ceil(n),
            max_bytes_per_partition: config.max_bytes.div_ceil(n),
            config,
            partitions,
            round_robin: AtomicU32::new(0),
            subscriptions: RwLock::new(HashMap::new()),
            counters: TopicCounters::default(),
            deleted: AtomicBool::new(false),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn config(&self) -> &TopicConfig {
        &self.config
    }

    pub fn partition_count(&self) -> u32 {
        self.partitions.len() as u32
    }

    /// True once the topic was deleted; a handle to it accepts nothing more.
    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Relaxed)
    }

    /// Appends a validated batch. All of it is stored or none: partitions are locked in index
    /// order and limits checked for every one before anything is appended.
    pub(crate) fn publish(
        &self,
        partition: Option<u32>,
        records: &RecordBatch,
        body_bytes_max: u32,
    ) -> Result<PublishReceipt, BrokerError> {
        let n = self.partition_count();
        if let Some(p) = partition {
            if p >= n {
                return Err(BrokerError::invalid(
                    "partition",
                    format!("{p} does not exist: topic '{}' has {n}", self.name),
                ));
            }
        }
        if records.is_empty() {
            return Ok(PublishReceipt {
                durability: Durability::Memory,
                ranges: Vec::new(),
            });
        }
        let bytes = records.bytes();
        let mut routed: Vec<(u32, RecordSpan)> = Vec::with_capacity(records.count() as usize);
        // Messages and bytes per partition, indexed by partition.
        let mut totals: Vec<(u64, u64)> = vec![(0, 0); n as usize];
        for (index, span) in records.spans().enumerate() {
            if span.body_len > body_bytes_max {
                return Err(BrokerError::MessageTooLarge {
                    index,
                    size: span.body_len,
                    max: body_bytes_max,
                });
            }
            let p = match (partition, span.key) {
                (Some(p), _) => p,
                (None, Some((start, end))) => partition_for_key(&bytes[start..end], n),
                (None, None) if n == 1 => 0,
                (None, None) => self.round_robin.fetch_add(1, Relaxed) % n,
            };
            let total = &mut totals[p as usize];
            total.0 += 1;
            total.1 += (span.end - span.start) as u64 + MESSAGE_OVERHEAD_BYTES;
            routed.push((p, span));
        }

        let touched: Vec<u32> = (0..n).filter(|&p| totals[p as usize].0 > 0).collect();
        let mut guards: Vec<_> = touched
            .iter()
            .map(|&p| (p, self.partitions[p as usize].state.lock()))
            .collect();

        // Check limits for every partition first so a refusal stores nothing.
        let reject = self.config.overflow == OverflowPolicy::Reject;
        for (p, state) in guards.iter() {
            let (count, bytes) = totals[*p as usize];
            if reject
                && (count > self.max_messages_per_partition || bytes > self.max_bytes_per_partition)
            {
                return Err(BrokerError::LimitExceeded(format!(
                    "batch of {count} messages / {bytes} bytes exceeds the per-partition limits of topic '{}' ({} messages, {} bytes)",
                    self.name, self.max_messages_per_partition, self.max_bytes_per_partition
                )));
            }
            let over_messages =
                (state.log.len() + count).saturating_sub(self.max_messages_per_partition);
            let over_bytes =
                (state.log.bytes() + bytes).saturating_sub(self.max_bytes_per_partition);
            if (over_messages > 0 || over_bytes > 0) && reject {
                return Err(BrokerError::TopicFull {
                    topic: self.name.clone(),
                    reason: format!(
                        "partition {p} holds {} messages, {} bytes",
                        state.log.len(),
                        state.log.bytes()
                    ),
                });
            }
        }

        // One copy per batch: the stored records then pin exactly this allocation, not the
        // connection's read buffer they arrived in.
        let owned = Bytes::copy_from_slice(bytes);
        let now = unix_ms();
        let mut ids: Vec<(u32, u64)> = Vec::with_capacity(routed.len());
        let mut bytes_in = 0u64;
        // Position of each partition's guard in `guards`.
        let mut slot_of = vec![usize::MAX; n as usize];
        for (i, (p, _)) in guards.iter().enumerate() {
            slot_of[*p as usize] = i;
        }
        for (p, span) in routed {
            let state = &mut guards[slot_of[p as usize]].1;
            bytes_in += (span.end - span.start) as u64;
            let ts = now.max(state.log.last_timestamp_ms());
            ids.push((p, state.log.append(ts, owned.slice(span.start..span.end))));
        }
        let mut released = Vec::new();
        for (_, state) in guards.iter_mut() {
            self.enforce_limits(state, &mut released);
        }
        drop(guards);
        self.release_consumers(&released);

        self.counters
            .messages_in
            .fetch_add(ids.len() as u64, Relaxed);
        self.counters.bytes_in.fetch_add(bytes_in, Relaxed);
        self.notify_subscriptions();
        Ok(PublishReceipt {
            durability: Durability::Memory,
            ranges: OffsetRange::coalesce(ids),
        })
    }

    /// Drop-oldest: discard from the head until the partition is within its limits again. Messages
    /// a subscription had not yet received are lost to it (counted in `dropped`).
    fn enforce_limits(&self, state: &mut PartitionState, released: &mut Vec<(u64, u64)>) {
        let new_head = state.log.head_to_fit(
            self.max_messages_per_partition,
            self.max_bytes_per_partition,
        );
        if new_head == state.log.head() {
            return;
        }
        let mut dropped = 0;
        for cursor in state.cursors.iter_mut() {
            let sub_id = cursor.sub_id;
            dropped += cursor.drop_below(new_head, |consumer| released.push((sub_id, consumer)));
        }
        state.log.trim_to(new_head);
        if dropped > 0 {
            self.counters.dropped.fetch_add(dropped, Relaxed);
        }
    }

    /// Lowers the in-flight counts of consumers whose messages left flight under a partition
    /// lock; called after that lock is released (lock order).
    pub(crate) fn release_consumers(&self, released: &[(u64, u64)]) {
        if released.is_empty() {
            return;
        }
        let subscriptions = self.subscriptions.read();
        for &(sub_id, consumer) in released {
            if let Some(s) = subscriptions.values().find(|s| s.id == sub_id) {
                s.consumer_released(consumer, 1);
            }
        }
    }

    pub(crate) fn notify_subscriptions(&self) {
        for s in self.subscriptions.read().values() {
            s.notify.notify_waiters();
        }
    }

    pub fn info(&self) -> TopicInfo {
        let (messages, bytes) = self.partitions.iter().fold((0, 0), |(m, b), p| {
            let s = p.state.lock();
            (m + s.log.len(), b + s.log.bytes())
        });
        let mut subscriptions: Vec<String> = self.subscriptions.read().keys().cloned().collect();
        subscriptions.sort();
        TopicInfo {
            name: self.name.clone(),
            config: self.config.clone(),
            messages,
            bytes,
            subscriptions,
        }
    }

    pub fn stats(&self) -> TopicStats {
        let c = &self.counters;
        let mut stats = TopicStats {
            name: self.name.clone(),
            messages_in: c.messages_in.load(Relaxed),
            bytes_in: c.bytes_in.load(Relaxed),
            messages_out: c.messages_out.load(Relaxed),
            bytes_out: c.bytes_out.load(Relaxed),
            dropped: c.dropped.load(Relaxed),
            publishers: c.publishers.load(Relaxed),
            subscribers: c.subscribers.load(Relaxed),
            ..Default::default()
        };
        let subs: Vec<Arc<Subscription>> = self.subscriptions.read().values().cloned().collect();
        let mut per_sub: Vec<SubscriptionStats> = subs.iter().map(|s| s.stats_counters()).collect();
        for p in self.partitions.iter() {
            let state = p.state.lock();
            stats.depth += state.log.len();
            stats.depth_bytes += state.log.bytes();
            let log_next = state.log.next_offset();
            for (s, out) in subs.iter().zip(per_sub.iter_mut()) {
                if let Some(cursor) = state.cursor(s.id) {
                    out.backlog += cursor.backlog(log_next);
                    out.in_flight += cursor.in_flight();
                }
            }
        }
        per_sub.sort_by(|a, b| a.name.cmp(&b.name));
        stats.subscriptions = per_sub;
        stats
    }
}

/// Counts a publisher as connected to a topic while it lives.
pub struct PublisherGuard {
    topic: Arc<Topic>,
}

impl PublisherGuard {
    pub(crate) fn new(topic: Arc<Topic>) -> Self {
        topic.counters.publishers.fetch_add(1, Relaxed);
        PublisherGuard { topic }
    }
}

impl Drop for PublisherGuard {
    fn drop(&mut self) {
        self.topic.counters.publishers.fetch_sub(1, Relaxed);
    }
}

impl Topic {
    /// Removes a subscription and its cursors, then frees what no remaining subscription needs.
    pub(crate) fn remove_subscription(&self, sub_id: u64, name: &str) {
        let mut subscriptions = self.subscriptions.write();
        if subscriptions.get(name).is_some_and(|s| s.id == sub_id) {
            subscriptions.remove(name);
        }
        for partition in self.partitions.iter() {
            let mut state = partition.state.lock();
            state.cursors.retain(|c| c.sub_id != sub_id);
            state.trim_settled();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_keys_go_modulo_and_other_keys_by_stable_hash() {
        assert_eq!(partition_for_key(b"7", 4), 3);
        assert_eq!(partition_for_key(b"12", 4), 0);
        assert_eq!(partition_for_key(b"18446744073709551615", 10), 5);
        // A 21-digit or signed key is not an integer key: hashed.
        assert_eq!(
            partition_for_key(b"-1", 1000),
            (key_hash(b"-1") % 1000) as u32
        );
        // FNV-1a 64 reference values.
        assert_eq!(key_hash(b""), 0xcbf29ce484222325);
        assert_eq!(key_hash(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(
            partition_for_key(b"user-42", 8),
            partition_for_key(b"user-42", 8)
        );
    }
}
