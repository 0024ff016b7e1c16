//! The consumers of a connection: SUBSCRIBE attaches one with its delivery task, acks settle
//! its messages.

use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use ferrymq_broker::{Access, BrokerError};
use ferrymq_protocol::limits::CONSUMER_CREDIT_MAX;
use ferrymq_protocol::{Frame, OffsetRange};
use tokio::sync::Notify;

use super::delivery::{deliver_loop, ConsumerEntry, Credit};
use super::outbound::reply_to;
use super::Session;

impl Session {
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
        let acked = self.consumer(consumer_id).and_then(|entry| {
            entry
                .consumer
                .ack_with_result(ranges, result)
                .map(|_| entry)
        });
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
        request: &ferrymq_protocol::SubscribeRequest,
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
            },
        );
        Ok(())
    }
}
