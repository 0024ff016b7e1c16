//! The broker's side of replication: which replica serves a partition (the gate every delivery
//! and ack passes), and the cursors another replica committed, applied here (see `replication`
//! for the update itself).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::broker::Broker;
use crate::cursor::Cursor;
use crate::error::BrokerError;
use crate::partition::{SERVING_LOCAL, SERVING_NONE};
use crate::replication::{decode, CursorReplicator, CursorState};
use crate::subscription::Subscription;
use crate::topic::Topic;

impl Broker {
    /// Opens or closes `partition` of `topic` here. `Some(term)`: this node serves it from now
    /// on, in leadership term `term`; `None`: another replica does, and this node neither
    /// delivers its messages nor takes acks for them. Consumers waiting here are woken when it
    /// opens.
    pub fn set_serving(&self, topic: &Topic, partition: u32, term: Option<u64>) {
        let Some(p) = topic.partitions.get(partition as usize) else {
            return;
        };
        let value = term.map_or(SERVING_NONE, |t| t.clamp(1, SERVING_LOCAL - 1));
        let before = p.serving.swap(value, Relaxed);
        if before != value && value != SERVING_NONE {
            for subscription in topic.subscriptions.read().values() {
                subscription.notify.notify_waiters();
            }
        }
    }

    /// The term in which this node serves `partition` of `topic`: `None` while another replica
    /// does; `Some(u64::MAX)` for a partition of this node alone.
    pub fn serving_term(&self, topic: &Topic, partition: u32) -> Option<u64> {
        let value = topic
            .partitions
            .get(partition as usize)?
            .serving
            .load(Relaxed);
        (value != SERVING_NONE).then_some(value)
    }

    /// Hands cursor updates of replicated partitions to `replicator` from now on.
    pub fn set_cursor_replicator(&self, replicator: Arc<dyn CursorReplicator>) {
        if let Some(durable) = &self.inner.durable {
            durable.state.set_replicator(replicator);
        }
    }

    /// Applies the cursors another replica serving `partition` of `topic` committed: each
    /// replaces this node's cursor of its subscription (created, with the settings it carries,
    /// where missing). Kept in memory: the replication log holds them and applies them again
    /// after a restart.
    pub fn apply_replicated_cursors(
        &self,
        topic: &Arc<Topic>,
        partition: u32,
        payload: &[u8],
    ) -> Result<(), BrokerError> {
        if topic.is_deleted() {
            return Ok(());
        }
        let Some(p) = topic.partitions.get(partition as usize) else {
            return Err(BrokerError::invalid(
                "partition",
                format!("{partition} does not exist"),
            ));
        };
        let history = self.inner.config.status_history;
        for state in decode(payload)? {
            let subscription = self.replicated_subscription(topic, &state)?;
            let options = subscription.cursor_options(history);
            let mut guard = p.state.lock();
            let start = guard.first_offset();
            let end = guard.log.next_offset();
            let mut cursor = Cursor::restore(
                subscription.id,
                options,
                state.floor,
                &state.settled,
                start,
                end,
            );
            if let Some(&s) = state.settings.start_offsets.get(partition as usize) {
                cursor.set_start(s);
            }
            cursor.restore_delivery(&state.delivery);
            let old = match guard.cursor_mut(subscription.id) {
                Some(slot) => Some(std::mem::replace(slot, cursor)),
                None => {
                    guard.cursors.push(cursor);
                    None
                }
            };
            drop(guard);
            if let Some(mut old) = old {
                // Messages delivered from here before are void: their consumers' room comes back.
                let consumers: Vec<u64> = subscription.consumers.lock().keys().copied().collect();
                for consumer in consumers {
                    let released = old.release_consumer(consumer);
                    let n = released.requeued + released.gave_up;
                    if n > 0 {
                        subscription.consumer_released(consumer, n as u32);
                    }
                }
            }
        }
        Ok(())
    }

    /// The subscription a replicated cursor belongs to, created here if missing.
    fn replicated_subscription(
        &self,
        topic: &Arc<Topic>,
        state: &CursorState,
    ) -> Result<Arc<Subscription>, BrokerError> {
        let mut subscriptions = topic.subscriptions.write();
        if let Some(existing) = subscriptions.get(&state.subscription) {
            return Ok(existing.clone());
        }
        let subscription = Arc::new(Subscription::new(
            self.next_id(),
            state.subscription.clone(),
            false,
            &state.settings,
        ));
        let history = self.inner.config.status_history;
        for (index, partition) in topic.partitions.iter().enumerate() {
            let start = state
                .settings
                .start_offsets
                .get(index)
                .copied()
                .unwrap_or(0);
            let mut guard = partition.state.lock();
            let first = guard.first_offset();
            guard.cursors.push(Cursor::new(
                subscription.id,
                subscription.cursor_options(history),
                start.max(first),
            ));
        }
        topic.insert_subscription(
            &mut subscriptions,
            state.subscription.clone(),
            subscription.clone(),
        );
        Ok(subscription)
    }
}
