//! The consumers of a connection: SUBSCRIBE attaches one with its delivery task, acks settle
//! its messages.

use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Duration;

use ferrymq_broker::{Access, Action, BrokerError};
use ferrymq_protocol::limits::CONSUMER_CREDIT_MAX;
use ferrymq_protocol::{Frame, OffsetRange, SubscribeRequest};
use tokio::sync::Notify;

use super::delivery::{deliver_loop, ConsumerEntry, Credit};
use super::outbound::reply_to;
use super::Session;

/// What a NACK asks for its messages.
pub(super) enum Settle<'a> {
    /// Delivered again after the delay, counting as a failed attempt; the reason goes with a
    /// message this gives up.
    Nack(Duration, &'a str),
    /// Delivered again after the delay without counting an attempt.
    Release(Duration),
    /// Moved to the dead-letter topic with the reason.
    DeadLetter(&'a str),
}

impl<'a> Settle<'a> {
    /// The NACK frame's flags; dead-lettering wins over releasing, as it always has.
    pub(super) fn from_nack(
        delay_ms: u32,
        dead_letter: bool,
        release: bool,
        reason: &'a str,
    ) -> Self {
        let delay = Duration::from_millis(delay_ms as u64);
        match (dead_letter, release) {
            (true, _) => Settle::DeadLetter(reason),
            (false, true) => Settle::Release(delay),
            (false, false) => Settle::Nack(delay, reason),
        }
    }
}

impl Session {
    /// SUBSCRIBE after the checks that the connection may consume from the topic and, when it
    /// names one, publish to the dead-letter topic.
    pub(super) fn subscribe_checked(&mut self, id: u32, request: &SubscribeRequest) {
        let result = self.allow(Action::Consume, &request.topic).and_then(|_| {
            // Dead letters are published to the topic the subscription names.
            match request.dead_letter_topic.is_empty() {
                true => Ok(()),
                false => self.allow(Action::Publish, &request.dead_letter_topic),
            }
        });
        let result = result.and_then(|_| self.subscribe(id, request));
        if let Err(error) = result {
            self.reply(id, Err(error));
        }
    }

    /// Dropping the entry ends the delivery task; the consumer's in-flight messages go back to
    /// the subscription.
    pub(super) fn unsubscribe(&mut self, id: u32, consumer_id: u32) {
        let result = self
            .consumers
            .remove(&consumer_id)
            .map(|_| Frame::Ok)
            .ok_or(BrokerError::UnknownConsumer(consumer_id as u64));
        self.reply(id, result)
    }

    pub(super) fn add_credit(&mut self, id: u32, consumer_id: u32, credit: u32) {
        let result = self.consumer(consumer_id).map(|entry| {
            entry.credit.grant(credit);
            Frame::Ok
        });
        self.reply(id, result)
    }

    pub(super) fn nack(
        &mut self,
        id: u32,
        consumer_id: u32,
        ranges: &[OffsetRange],
        settle: Settle<'_>,
    ) {
        let result = self
            .consumer_allowed(consumer_id)
            .map(|_| ())
            .and_then(|_| self.consumer(consumer_id))
            .and_then(|entry| match settle {
                Settle::DeadLetter(reason) => entry.consumer.dead_letter(ranges, reason),
                Settle::Release(delay) => entry.consumer.release(ranges, delay),
                Settle::Nack(delay, reason) => {
                    entry.consumer.nack_with_reason(ranges, delay, reason)
                }
            })
            .map(|_| Frame::Ok);
        self.reply(id, result)
    }

    /// ACK and ACK_RESULT: `result` is kept with each message acked.
    pub(super) async fn ack(
        &mut self,
        id: u32,
        consumer_id: u32,
        ranges: &[OffsetRange],
        result: Option<&[u8]>,
    ) {
        if let Err(error) = self.consumer_allowed(consumer_id) {
            return self.reply(id, Err(error));
        }
        let applying = std::time::Instant::now();
        let acked = self.consumer(consumer_id).and_then(|entry| {
            entry
                .consumer
                .ack_with_result(ranges, result)
                .map(|_| entry)
        });
        ferrymq_broker::stages::record_since(ferrymq_broker::stages::Stage::Ack, applying);
        match acked {
            // A confirmed ack on a disk topic is answered once it is saved, so that a consumer
            // told OK is never sent that message again, even after a crash.
            Ok(entry) if id != 0 && entry.consumer.acks_are_durable() => {
                let (out, consumer) = (self.out.clone(), entry.consumer.clone());
                let permit = self.waiting.clone().acquire_owned().await;
                tokio::spawn(async move {
                    let result = consumer.acks_saved().await.map(|_| Frame::Ok);
                    reply_to(&out, id, result);
                    out.flush();
                    drop(permit);
                });
            }
            other => self.reply(id, other.map(|_| Frame::Ok)),
        }
    }

    pub(super) fn subscribe(
        &mut self,
        id: u32,
        request: &SubscribeRequest,
    ) -> Result<(), BrokerError> {
        if self.consumers.len() >= self.config.consumers_per_connection_max {
            return Err(BrokerError::LimitExceeded(format!(
                "a connection may attach at most {} consumers",
                self.config.consumers_per_connection_max
            )));
        }
        let consumer = Arc::new(self.broker.subscribe(request)?);
        let consumer_id = self.next_consumer_id;
        self.next_consumer_id = self.next_consumer_id.wrapping_add(1).max(1);
        // SUBSCRIBED goes into the buffer before the delivery task can queue any DELIVER.
        self.reply(
            id,
            Ok(Frame::Subscribed {
                consumer_id,
                subscription: consumer.subscription().name().to_owned(),
                partitions: consumer.partition_count(),
            }),
        );
        let credit = Arc::new(Credit {
            available: AtomicU32::new(request.credit.min(CONSUMER_CREDIT_MAX)),
            added: Notify::new(),
        });
        self.registered
            .add_consumer(consumer_id, &consumer, credit.clone());
        let access = Access::new(self.broker.auth().clone(), self.access().identity().clone());
        let task = tokio::spawn(deliver_loop(
            consumer.clone(),
            consumer_id,
            credit.clone(),
            self.out.clone(),
            self.config.clone(),
            access,
        ));
        self.consumers.insert(
            consumer_id,
            ConsumerEntry {
                consumer,
                credit,
                task,
                listed: (Arc::clone(&self.registered), consumer_id),
            },
        );
        Ok(())
    }
}
