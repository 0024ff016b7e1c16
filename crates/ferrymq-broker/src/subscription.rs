//! Subscriptions: named cursors over a topic, with their settings and counters (the consumers
//! attached to them are in `consumer`).
//!
//! Every subscription receives every message of its topic; the consumers of one subscription
//! share its messages.
//!
//! Lock order: topic `subscriptions` → partition state → subscription `consumers` (a leaf).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use ferrymq_protocol::SubscriptionStats;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::cursor::{CursorOptions, Released};
use crate::meta::SubscriptionRecord;

#[derive(Default)]
pub(crate) struct SubscriptionCounters {
    pub messages_out: AtomicU64,
    pub bytes_out: AtomicU64,
    pub acked: AtomicU64,
    pub redelivered: AtomicU64,
    pub gave_up: AtomicU64,
}

pub(crate) struct ConsumerShared {
    /// Messages delivered to this consumer and not yet settled or released.
    pub in_flight: AtomicU32,
}

pub struct Subscription {
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) ephemeral: bool,
    pub(crate) auto_ack: bool,
    pub(crate) ack_timeout: Duration,
    pub(crate) max_attempts: u32,
    /// At most one message per key in flight.
    pub(crate) ordered: bool,
    /// Where messages given up go; `None`: `<topic>.dlq`.
    pub(crate) dead_letter_topic: Option<String>,
    /// Woken when messages may have become ready: publish, nack, expiry, a consumer leaving.
    pub(crate) notify: Notify,
    /// When `notify` was last woken for new messages (`stages::now_us`, 0: not since the last
    /// delivery), for the wake-up stage's histogram.
    pub(crate) woken_at_us: AtomicU64,
    pub(crate) consumers: Mutex<HashMap<u64, Arc<ConsumerShared>>>,
    pub(crate) counters: SubscriptionCounters,
    /// Deliveries paused by an operator: consumers stay attached and get nothing until resumed.
    pub(crate) paused: AtomicBool,
}

impl Subscription {
    pub(crate) fn new(
        id: u64,
        name: String,
        ephemeral: bool,
        settings: &SubscriptionRecord,
    ) -> Self {
        Subscription {
            id,
            name,
            ephemeral,
            auto_ack: settings.auto_ack,
            ack_timeout: Duration::from_millis(settings.ack_timeout_ms),
            max_attempts: settings.max_attempts.max(1),
            ordered: settings.ordered && !settings.auto_ack,
            dead_letter_topic: settings.dead_letter_topic.clone(),
            notify: Notify::new(),
            woken_at_us: AtomicU64::new(0),
            consumers: Default::default(),
            counters: Default::default(),
            paused: AtomicBool::new(settings.paused),
        }
    }

    /// Its settings as stored, with `start` as its start in `partition` (the others unknown).
    pub(crate) fn record(&self, partition: u32, start: u64) -> SubscriptionRecord {
        let mut start_offsets = vec![0; partition as usize];
        start_offsets.push(start);
        SubscriptionRecord {
            auto_ack: self.auto_ack,
            ack_timeout_ms: self.ack_timeout.as_millis() as u64,
            max_attempts: self.max_attempts,
            ordered: self.ordered,
            dead_letter_topic: self.dead_letter_topic.clone(),
            start_offsets,
            paused: self.is_paused(),
        }
    }

    /// Whether an operator paused its deliveries.
    pub fn is_paused(&self) -> bool {
        self.paused.load(Relaxed)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn is_ordered(&self) -> bool {
        self.ordered
    }

    /// The topic its messages go to when given up.
    pub fn dead_letter_topic(&self, topic: &str) -> String {
        self.dead_letter_topic
            .clone()
            .unwrap_or_else(|| crate::headers::dead_letter_topic(topic))
    }

    /// How its cursors deliver, each remembering `history` settled messages.
    pub(crate) fn cursor_options(&self, history: usize) -> CursorOptions {
        CursorOptions {
            name: self.name.as_str().into(),
            auto_ack: self.auto_ack,
            max_attempts: self.max_attempts,
            ordered: self.ordered,
            history,
        }
    }

    pub(crate) fn consumer_released(&self, consumer: u64, n: u32) {
        if let Some(c) = self.consumers.lock().get(&consumer) {
            c.in_flight.fetch_sub(n, Relaxed);
        }
    }

    pub(crate) fn stats_counters(&self) -> SubscriptionStats {
        let c = &self.counters;
        SubscriptionStats {
            name: self.name.clone(),
            ephemeral: self.ephemeral,
            consumers: self.consumers.lock().len() as u32,
            messages_out: c.messages_out.load(Relaxed),
            bytes_out: c.bytes_out.load(Relaxed),
            acked: c.acked.load(Relaxed),
            redelivered: c.redelivered.load(Relaxed),
            backlog: 0,
            in_flight: 0,
            gave_up: c.gave_up.load(Relaxed),
            deliver_latency: Default::default(),
            ack_latency: Default::default(),
            paused: self.is_paused(),
        }
    }

    pub(crate) fn count_released(&self, released: Released) {
        if released.gave_up > 0 {
            // Each is logged once, with why, when it reaches the dead-letter topic.
            self.counters.gave_up.fetch_add(released.gave_up, Relaxed);
        }
        if released.requeued > 0 {
            self.notify.notify_waiters();
        }
    }
}
