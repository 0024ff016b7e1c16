//! One delivery task per consumer: moves ready messages into the outbound buffer while the
//! consumer has credit.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use ferrymq_broker::connections::{ConnectionEntry, HeldCredit};
use ferrymq_broker::stages::{self, Stage};
use ferrymq_broker::{Access, Action, BrokerError, Consumer};
use ferrymq_protocol::limits::CONSUMER_CREDIT_MAX;
use ferrymq_protocol::{DeliverEncoder, ErrorCode, Frame};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::outbound::Outbound;
use crate::config::ServerConfig;

/// Credit a consumer has: how many more messages the server may send it.
pub(super) struct Credit {
    pub(super) available: AtomicU32,
    pub(super) added: Notify,
}

impl Credit {
    /// Adds a grant, up to the most a consumer may hold. One atomic update: the delivery task
    /// takes credit at the same time, and a grant that read the count and then stored a sum
    /// would give back what was taken in between, so the server would send more than the client
    /// allowed (a client that counts, as the Rust client does, then ends the subscription).
    pub(super) fn grant(&self, credit: u32) {
        let _ = self.available.fetch_update(Relaxed, Relaxed, |now| {
            Some(now.saturating_add(credit).min(CONSUMER_CREDIT_MAX))
        });
        self.added.notify_one();
    }
}

impl HeldCredit for Credit {
    fn credit(&self) -> u32 {
        self.available.load(Relaxed)
    }
}

pub(super) struct ConsumerEntry {
    pub(super) consumer: Arc<Consumer>,
    pub(super) credit: Arc<Credit>,
    pub(super) task: JoinHandle<()>,
    /// Its connection's registry entry, which lists it until it drops.
    pub(super) listed: (Arc<ConnectionEntry>, u32),
}

impl Drop for ConsumerEntry {
    fn drop(&mut self) {
        self.listed.0.remove_consumer(self.listed.1);
        // The task holds the other reference to the consumer; once it is gone the consumer drops
        // and its in-flight messages go back to the subscription.
        self.task.abort();
    }
}

/// Moves ready messages of one consumer into the outbound buffer while it has credit.
/// Cancel-safe at every await: messages are only taken from the broker inside `poll`, which does
/// not await, and written straight into the outbound buffer.
pub(super) async fn deliver_loop(
    consumer: Arc<Consumer>,
    consumer_id: u32,
    credit: Arc<Credit>,
    out: Arc<Outbound>,
    config: Arc<ServerConfig>,
    mut access: Access,
) {
    let mut auth_changes = access.auth().watch_changes();
    loop {
        if out.closing.load(Relaxed) {
            return;
        }
        // A consumer whose user lost `consume` on the topic (or was removed) ends with the
        // reason; nothing more is delivered to it.
        if let Err(error) = access.check(Action::Consume, consumer.topic().name()) {
            out.send(&Frame::error(error.code(), ends(consumer_id, &error)), 0);
            return;
        }
        let added = credit.added.notified();
        tokio::pin!(added);
        added.as_mut().enable();
        let available = credit.available.load(Relaxed);
        if available == 0 {
            tokio::select! {
                _ = added => {}
                _ = auth_changes.changed() => {}
            }
            continue;
        }
        out.wait_for_room().await;
        if out.closing.load(Relaxed) {
            return;
        }
        let ready = consumer.ready_notification();
        tokio::pin!(ready);
        ready.as_mut().enable();
        let encoding = Instant::now();
        match encode_ready(&consumer, consumer_id, &out, &config, available) {
            Ok(0) => {
                if consumer.is_closed() {
                    let reason = topic_deleted(&consumer, consumer_id);
                    out.send(&Frame::error(ErrorCode::UnknownTopic, reason), 0);
                    return;
                }
                tokio::select! {
                    _ = ready => consumer.note_woken(),
                    _ = auth_changes.changed() => {}
                }
            }
            Ok(n) => {
                credit.available.fetch_sub(n, Relaxed);
                out.counters.messages_out.fetch_add(u64::from(n), Relaxed);
                out.flush();
                consumer.clear_woken();
                stages::record_since(Stage::DeliverWrite, encoding);
            }
            Err(error) => {
                let message = if consumer.is_closed() {
                    topic_deleted(&consumer, consumer_id)
                } else {
                    ends(consumer_id, &error)
                };
                out.send(&Frame::error(error.code(), message), 0);
                return;
            }
        }
    }
}

/// Takes up to `available` ready messages (within the batch limits) from the broker and encodes
/// them as one DELIVER straight into the outbound buffer; how many it took. The buffer's lock is
/// held across the poll, as the lock order allows.
fn encode_ready(
    consumer: &Consumer,
    consumer_id: u32,
    out: &Outbound,
    config: &ServerConfig,
    available: u32,
) -> Result<u32, BrokerError> {
    let mut pending = out.pending.lock();
    let mut encoder = DeliverEncoder::begin(&mut pending.bytes, consumer_id);
    let polled = consumer.poll(
        available.min(config.deliver_batch_count_max),
        config.deliver_batch_bytes_max,
        |p, o, ts, a, r| encoder.push(p, o, ts, a, r),
    );
    encoder.finish();
    polled
}

/// Why a consumer ends when its topic is gone.
fn topic_deleted(consumer: &Consumer, consumer_id: u32) -> String {
    format!(
        "topic '{}' was deleted; consumer {consumer_id} ends",
        consumer.topic().name()
    )
}

/// Why a consumer ends on an error of the broker's.
fn ends(consumer_id: u32, error: &BrokerError) -> String {
    format!("consumer {consumer_id} ends: {error}")
}
