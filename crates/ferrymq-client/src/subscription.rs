//! Subscriptions: a stream of deliveries under credit-based flow control.
//!
//! Invariants:
//! - The server may send at most `credit` messages before it hears of more. The subscription
//!   grants more only as the application takes messages (`next`, `next_batch`), in steps of half
//!   the window, so messages buffered in this client never exceed the window: the server's frames
//!   wait in the channel, taken ones belong to the application.
//! - Acks and nacks are fire-and-forget frames (request id 0) queued with everything else the
//!   connection writes; a refusal arrives as an ERROR with request id 0 and, when this is the only
//!   subscription on the connection, as an `Err` item of this stream. The exceptions are
//!   [`Subscription::ack_confirmed`], the acks with a result and [`Subscription::dead_letter`]:
//!   requests with their own ids that wait for the server's answer.
//! - Frames leave in the order they were queued, so a confirmed ack is written after every ack
//!   queued before it, and the server applies them in that order.
//! - The stream ends (`None`) after the subscription is closed; when the connection dies it first
//!   yields one `Err` with the reason.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrymq_protocol::limits::{
    ACK_RESULT_BYTES_MAX, ACK_TIMEOUT_MS_MAX, CONSUMER_CREDIT_MAX, RANGES_COUNT_MAX,
};
use ferrymq_protocol::{
    Delivery, DeliveryBatch, Frame, OffsetRange, StartPosition, SubscribeRequest,
};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::client::Client;
use crate::config::{check_subscription, check_topic};
use crate::conn::{SubEvent, SubRoute, SubShared};
use crate::error::{Error, Result};
use crate::offsets::push_offset;
use crate::view::DeliveryBatchExt;
use crate::write_queue::WriteQueue;

/// Default credit window: enough messages in flight to hide a round trip at millions of messages
/// per second in batches, small enough that a slow consumer pins little memory.
pub const CREDIT_WINDOW_DEFAULT: u32 = 1024;

/// Room in the delivery channel beyond the credit window, for errors reported on the stream.
const ERROR_EVENTS_SLACK: usize = 16;

/// What to subscribe to and how. Built with [`SubscribeOptions::new`] and chained setters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscribeOptions {
    pub topic: String,
    /// Empty for an ephemeral subscription that lives as long as this consumer.
    pub subscription: String,
    pub start: StartPosition,
    /// `None` for the server's default.
    pub ack_timeout: Option<Duration>,
    /// 0 for the server's default.
    pub max_attempts: u32,
    /// Credit window: most messages the server sends before the client grants more.
    pub credit: u32,
    /// Messages count as acked when sent (at most once).
    pub auto_ack: bool,
    /// Partitions to take messages from, as inclusive ranges; empty for all.
    pub partitions: Vec<(u32, u32)>,
    /// At most one message per key in flight across the subscription's consumers.
    pub ordered: bool,
    /// Where messages given up go; empty for `<topic>.dlq`.
    pub dead_letter_topic: String,
    /// Most messages this consumer will take: credit beyond it is never asked for, so a
    /// consumer that wants N messages holds none it will not process. `None`: no limit.
    pub limit: Option<u64>,
}

impl SubscribeOptions {
    /// An ephemeral subscription to `topic` from the latest message, acked by the application.
    pub fn new(topic: impl Into<String>) -> Self {
        SubscribeOptions {
            topic: topic.into(),
            subscription: String::new(),
            start: StartPosition::Latest,
            ack_timeout: None,
            max_attempts: 0,
            credit: CREDIT_WINDOW_DEFAULT,
            auto_ack: false,
            partitions: Vec::new(),
            ordered: false,
            dead_letter_topic: String::new(),
            limit: None,
        }
    }

    /// Joins (or creates) the named, durable subscription; consumers of one name share messages.
    pub fn subscription(mut self, name: impl Into<String>) -> Self {
        self.subscription = name.into();
        self
    }

    /// A private subscription removed when this consumer leaves.
    pub fn ephemeral(mut self) -> Self {
        self.subscription.clear();
        self
    }

    /// Where a new subscription starts; ignored when joining an existing one.
    pub fn start(mut self, start: StartPosition) -> Self {
        self.start = start;
        self
    }

    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = Some(timeout);
        self
    }

    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    pub fn credit(mut self, window: u32) -> Self {
        self.credit = window;
        self
    }

    pub fn auto_ack(mut self, auto_ack: bool) -> Self {
        self.auto_ack = auto_ack;
        self
    }

    /// Takes messages from these partitions only, as inclusive ranges `(first, last)`; other
    /// consumers of the subscription serve the rest. `ferrymq_protocol::parse_partition_list`
    /// reads the `1,2,4-7` form.
    pub fn partitions(mut self, ranges: Vec<(u32, u32)>) -> Self {
        self.partitions = ranges;
        self
    }

    /// Delivers at most one message per key at a time across the subscription's consumers (and
    /// key-less messages one at a time per partition): each key is processed strictly in order,
    /// redeliveries included, while other keys flow. Needs acks (not with `auto_ack`).
    pub fn ordered(mut self, ordered: bool) -> Self {
        self.ordered = ordered;
        self
    }

    /// Sends messages given up to this topic instead of `<topic>.dlq`.
    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Self {
        self.dead_letter_topic = topic.into();
        self
    }

    /// Takes at most `messages` messages in all: the credit window shrinks to what is left, and
    /// the server is never asked for more. Meant for a consumer that stops after N messages.
    pub fn limit(mut self, messages: u64) -> Self {
        self.limit = Some(messages);
        self
    }

    pub(crate) fn to_request(&self) -> Result<SubscribeRequest> {
        check_topic(&self.topic)?;
        check_subscription(&self.subscription, true)?;
        if self.credit == 0 || self.credit > CONSUMER_CREDIT_MAX {
            return Err(Error::InvalidArgument(format!(
                "credit window must be 1..={CONSUMER_CREDIT_MAX}, got {}",
                self.credit
            )));
        }
        if self.limit == Some(0) {
            return Err(Error::InvalidArgument(
                "a limit of 0 messages would never receive one".into(),
            ));
        }
        let ack_timeout_ms = match self.ack_timeout {
            None => 0,
            Some(timeout) => match u32::try_from(timeout.as_millis()) {
                Ok(ms) if (1..=ACK_TIMEOUT_MS_MAX).contains(&ms) => ms,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "ack timeout must be 1..={ACK_TIMEOUT_MS_MAX} ms, got {timeout:?}"
                    )))
                }
            },
        };
        Ok(SubscribeRequest {
            topic: self.topic.clone(),
            subscription: self.subscription.clone(),
            start: self.start,
            ack_timeout_ms,
            max_attempts: self.max_attempts,
            credit: self
                .limit
                .map_or(self.credit, |limit| limit.min(self.credit as u64) as u32),
            auto_ack: self.auto_ack,
            ordered: self.ordered,
            partitions: self.partitions.clone(),
            dead_letter_topic: self.dead_letter_topic.clone(),
        })
    }
}

/// A consumer attached to a subscription. Take messages with [`Subscription::next`] or, faster,
/// whole frames with [`Subscription::next_batch`]; ack what you processed. Dropping it
/// unsubscribes (its unacked messages go back to the subscription).
pub struct Subscription {
    client: Client,
    topic: String,
    name: String,
    consumer_id: u32,
    partitions: u32,
    auto_ack: bool,
    /// An ordered subscription's next message of a key waits for the ack of the one before: its
    /// acks are written at once rather than after the ack flush delay.
    ordered: bool,
    window: u32,
    /// Credit is granted back once this many messages have been taken.
    credit_step: u32,
    /// Credit that may still be granted under [`SubscribeOptions::limit`] (`u64::MAX`: no
    /// limit); 0 once the subscription is closing.
    credit_left: u64,
    taken_since_credit: u32,
    events: mpsc::Receiver<SubEvent>,
    shared: Arc<SubShared>,
    /// Deliveries of a frame being handed out one by one by `next`.
    buffered: VecDeque<Delivery>,
    /// The end of the stream was reported.
    finished: bool,
    /// UNSUBSCRIBE was sent (by `close`).
    unsubscribed: bool,
}

impl Client {
    /// Attaches a consumer to a subscription.
    pub async fn subscribe(&self, options: SubscribeOptions) -> Result<Subscription> {
        Subscription::open(self.clone(), options).await
    }
}

impl Subscription {
    /// Sends SUBSCRIBE and waits for SUBSCRIBED.
    pub(crate) async fn open(client: Client, options: SubscribeOptions) -> Result<Subscription> {
        let request = options.to_request()?;
        let window = request.credit;
        let (sender, events) = mpsc::channel(window as usize + ERROR_EVENTS_SLACK);
        let shared = Arc::new(SubShared {
            credit_available: AtomicI64::new(window as i64),
            end: Mutex::new(None),
            ended_by_client: Mutex::new(None),
        });
        let route = SubRoute {
            events: sender,
            shared: shared.clone(),
        };
        let connection = client.connection();
        let request_id = connection.next_request_id();
        let frame = Frame::Subscribe(request);
        let answer = connection
            .request_with_id(request_id, "SUBSCRIBE", Some(route), |queue| {
                queue.push_frame(&frame, request_id)
            })
            .await?
            .await?;
        let Frame::Subscribed {
            consumer_id,
            subscription,
            partitions,
        } = answer
        else {
            return Err(Error::UnexpectedResponse(format!(
                "{} frame in answer to SUBSCRIBE",
                answer.name()
            )));
        };
        Ok(Subscription {
            client,
            topic: options.topic,
            name: subscription,
            consumer_id,
            partitions,
            auto_ack: options.auto_ack,
            ordered: options.ordered,
            window,
            credit_step: (window / 2).max(1),
            credit_left: options
                .limit
                .map_or(u64::MAX, |limit| limit - window as u64),
            taken_since_credit: 0,
            events,
            shared,
            buffered: VecDeque::new(),
            finished: false,
            unsubscribed: false,
        })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The subscription's name as the server reports it (generated for an ephemeral one).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn consumer_id(&self) -> u32 {
        self.consumer_id
    }

    pub fn partitions(&self) -> u32 {
        self.partitions
    }

    pub fn auto_ack(&self) -> bool {
        self.auto_ack
    }

    pub fn credit_window(&self) -> u32 {
        self.window
    }

    /// The next delivery; `None` once the stream has ended. Cancel-safe.
    pub async fn next(&mut self) -> Option<Result<Delivery>> {
        // Bounded: each turn hands out a delivery, returns, or takes one non-empty batch.
        loop {
            if let Some(delivery) = self.buffered.pop_front() {
                self.taken(1);
                return Some(Ok(delivery));
            }
            match self.next_event().await? {
                Ok(batch) => self.buffered.extend(batch.iter()),
                Err(error) => return Some(Err(error)),
            }
        }
    }

    /// All deliveries of the next DELIVER frame, still in wire form (iterate with `.iter()`, or
    /// without allocating with [`DeliveryBatchExt::views`]);
    /// `None` once the stream has ended. Cancel-safe.
    pub async fn next_batch(&mut self) -> Option<Result<DeliveryBatch>> {
        if !self.buffered.is_empty() {
            // Left over from `next`: rare, so re-encoding is fine.
            let rest: Vec<Delivery> = self.buffered.drain(..).collect();
            self.taken(rest.len() as u32);
            return Some(DeliveryBatch::from_deliveries(&rest).map_err(Error::from));
        }
        match self.next_event().await? {
            Ok(batch) => {
                self.taken(batch.count());
                Some(Ok(batch))
            }
            Err(error) => Some(Err(error)),
        }
    }

    async fn next_event(&mut self) -> Option<Result<DeliveryBatch>> {
        if self.finished {
            return None;
        }
        match self.events.recv().await {
            Some(SubEvent::Batch(batch)) => Some(Ok(batch)),
            Some(SubEvent::Error(error)) => Some(Err(error)),
            None => {
                self.finished = true;
                self.shared.end.lock().take().map(Err)
            }
        }
    }

    /// Counts messages handed to the application and grants the credit back in steps.
    fn taken(&mut self, count: u32) {
        self.taken_since_credit += count;
        if self.taken_since_credit < self.credit_step
            || self.finished
            || self.shared.ended_by_client.lock().is_some()
        {
            return;
        }
        let credit = std::mem::take(&mut self.taken_since_credit)
            .min(u32::try_from(self.credit_left).unwrap_or(u32::MAX));
        if credit == 0 {
            return;
        }
        self.credit_left = self.credit_left.saturating_sub(credit as u64);
        // Counted before the frame is queued, so the reader never sees more deliveries than this.
        self.shared
            .credit_available
            .fetch_add(credit as i64, Ordering::AcqRel);
        let consumer_id = self.consumer_id;
        let granted = self.client.connection().enqueue_now(|queue| {
            queue.push_frame(
                &Frame::Credit {
                    consumer_id,
                    credit,
                },
                0,
            )
        });
        if let Err(error) = granted {
            // The connection is gone; the stream reports that when the channel drains.
            tracing::debug!(%error, consumer_id, "credit not granted");
        }
    }

    /// Acks one delivery.
    pub async fn ack(&self, delivery: &Delivery) -> Result<()> {
        self.ack_ranges(&[OffsetRange::single(delivery.partition, delivery.offset)])
            .await
    }

    /// Acks runs of offsets (see [`push_offset`] to build them while iterating a batch).
    pub async fn ack_ranges(&self, ranges: &[OffsetRange]) -> Result<()> {
        self.send_ranges(None, ranges).await
    }

    /// Acks runs of offsets and waits for the server's answer: `Ok` once the server has applied
    /// the ack, its refusal (an ERROR frame) as [`Error::Server`], or a connection error or
    /// timeout when no answer came.
    ///
    /// On a disk topic (a named subscription of a `storage=disk` topic), the server answers OK only
    /// after the subscription's ack state is saved durably: an acked message is then never
    /// delivered to this subscription again, not even after the broker crashes and restarts. On
    /// a memory topic OK only means the ack was applied. Without an answer (an error, a timeout,
    /// a dropped future) the ack may or may not have been applied: the message may come again.
    ///
    /// Acks queued before by [`Subscription::ack`], [`Subscription::ack_ranges`] and
    /// [`Subscription::ack_batch`] (which send lazily and wait for nothing) are written before this
    /// one, on the same connection, so the server has applied them too when it answers; on a disk
    /// topic they are saved along with it. More than
    /// [`RANGES_COUNT_MAX`](ferrymq_protocol::limits::RANGES_COUNT_MAX) ranges go out as several
    /// ACK frames, all of which must succeed. An empty `ranges` sends nothing and returns `Ok`.
    pub async fn ack_confirmed(&self, ranges: &[OffsetRange]) -> Result<()> {
        let consumer_id = self.consumer_id;
        self.confirmed("ACK", ranges, |chunk| Frame::Ack {
            consumer_id,
            ranges: chunk.to_vec(),
        })
        .await
    }

    /// Acks one delivery with a result attached (see [`Subscription::ack_ranges_with_result`]).
    pub async fn ack_with_result(
        &self,
        delivery: &Delivery,
        result: impl Into<Bytes>,
    ) -> Result<()> {
        self.ack_ranges_with_result(
            &[OffsetRange::single(delivery.partition, delivery.offset)],
            result,
        )
        .await
    }

    /// Acks runs of offsets and attaches `result` (at most
    /// [`ACK_RESULT_BYTES_MAX`](ferrymq_protocol::limits::ACK_RESULT_BYTES_MAX) bytes, any bytes:
    /// an outcome, a short JSON document) to every message it acks; the broker keeps it with the
    /// acked message, for [`Client::message_status`] and [`Client::list_messages`] (acked
    /// messages are remembered in a bounded history). Waits for the server's answer like
    /// [`Subscription::ack_confirmed`], with the same guarantees: on a disk topic the ack is saved
    /// when this returns `Ok`. A result over the limit is refused before anything is sent.
    pub async fn ack_ranges_with_result(
        &self,
        ranges: &[OffsetRange],
        result: impl Into<Bytes>,
    ) -> Result<()> {
        let result = result.into();
        if result.len() > ACK_RESULT_BYTES_MAX {
            return Err(Error::InvalidArgument(format!(
                "an ack result is at most {ACK_RESULT_BYTES_MAX} bytes, got {}",
                result.len()
            )));
        }
        let consumer_id = self.consumer_id;
        self.confirmed("ACK_RESULT", ranges, |chunk| Frame::AckResult {
            consumer_id,
            result: result.clone(),
            ranges: chunk.to_vec(),
        })
        .await
    }

    /// Moves deliveries to the subscription's dead-letter topic (`<topic>.dlq` unless
    /// [`SubscribeOptions::dead_letter_topic`] named another) now, with `reason`
    /// (at most 1024 bytes) in its `x-ferrymq-dead-reason` header, instead of delivering them
    /// again; returns once the server confirmed it took them. Lazily queued acks go first.
    pub async fn dead_letter(&self, ranges: &[OffsetRange], reason: &str) -> Result<()> {
        check_reason(reason)?;
        let consumer_id = self.consumer_id;
        self.confirmed("NACK", ranges, |chunk| Frame::Nack {
            consumer_id,
            delay_ms: 0,
            dead_letter: true,
            release: false,
            reason: reason.to_string(),
            ranges: chunk.to_vec(),
        })
        .await
    }

    /// Gives deliveries back unprocessed, ready again at once, without counting their delivery
    /// as an attempt (a consumer that stops early has not failed them); returns once the server
    /// confirmed it. Use [`Subscription::nack_ranges`] for messages that failed.
    pub async fn release_ranges(&self, ranges: &[OffsetRange]) -> Result<()> {
        self.release_ranges_after(ranges, 0).await
    }

    /// [`Subscription::release_ranges`], ready again only after `delay_ms`.
    pub async fn release_ranges_after(&self, ranges: &[OffsetRange], delay_ms: u32) -> Result<()> {
        let consumer_id = self.consumer_id;
        self.confirmed("NACK", ranges, |chunk| Frame::Nack {
            consumer_id,
            delay_ms,
            dead_letter: false,
            release: true,
            reason: String::new(),
            ranges: chunk.to_vec(),
        })
        .await
    }

    /// Unsubscribes like [`Subscription::close`], first releasing (see
    /// [`Subscription::release_ranges`]) `unprocessed` and every delivery that arrived but was
    /// never taken, so that stopping early costs no message an attempt. No credit is granted
    /// once this is called. Returns how many messages were released. (A delivery still on its
    /// way when the server unsubscribes goes back as after any unsubscribe, counted.)
    pub async fn close_releasing(self, unprocessed: &[OffsetRange]) -> Result<u64> {
        self.close_releasing_after(unprocessed, 0).await
    }

    /// [`Subscription::close_releasing`] with the released messages ready again only after
    /// `delay_ms`: a consumer that is leaving should not be sent them again before its
    /// unsubscribe is through (that unsubscribe would give them back counted).
    pub async fn close_releasing_after(
        mut self,
        unprocessed: &[OffsetRange],
        delay_ms: u32,
    ) -> Result<u64> {
        self.credit_left = 0;
        let mut ranges = unprocessed.to_vec();
        for delivery in self.buffered.drain(..) {
            push_offset(&mut ranges, delivery.partition, delivery.offset);
        }
        // Bounded by the channel's capacity, the credit window.
        while let Ok(event) = self.events.try_recv() {
            if let SubEvent::Batch(batch) = event {
                for delivery in batch.iter() {
                    push_offset(&mut ranges, delivery.partition, delivery.offset);
                }
            }
        }
        // An auto-ack subscription's messages were settled when sent: nothing to give back.
        if self.auto_ack {
            ranges.clear();
        }
        if !ranges.is_empty() {
            self.release_ranges_after(&ranges, delay_ms).await?;
        }
        self.close().await?;
        Ok(ranges.iter().map(|range| range.count as u64).sum())
    }

    /// Sends `frame_of(chunk)` with a request id per `RANGES_COUNT_MAX` ranges and waits for an
    /// OK to each.
    async fn confirmed(
        &self,
        what: &'static str,
        ranges: &[OffsetRange],
        frame_of: impl Fn(&[OffsetRange]) -> Frame,
    ) -> Result<()> {
        self.check_not_ended()?;
        let connection = self.client.connection();
        // Every frame is queued before any answer is awaited, so they pipeline; the answers are
        // then awaited in order. Bounded: one request per RANGES_COUNT_MAX ranges.
        let mut answers = Vec::with_capacity(ranges.len().div_ceil(RANGES_COUNT_MAX as usize));
        for chunk in ranges.chunks(RANGES_COUNT_MAX as usize) {
            let request_id = connection.next_request_id();
            let frame = frame_of(chunk);
            let answer = connection
                .request_with_id(request_id, what, None, |queue| {
                    queue.push_frame(&frame, request_id)
                })
                .await?;
            answers.push(answer);
        }
        for answer in answers {
            match answer.await? {
                Frame::Ok => {}
                other => {
                    return Err(Error::UnexpectedResponse(format!(
                        "{} frame in answer to {what}",
                        other.name()
                    )))
                }
            }
        }
        Ok(())
    }

    /// Acks every delivery of a batch.
    pub async fn ack_batch(&self, batch: &DeliveryBatch) -> Result<()> {
        let mut ranges = Vec::new();
        batch.extend_ranges(&mut ranges);
        self.ack_ranges(&ranges).await
    }

    /// Gives a delivery back for redelivery after `delay` (zero: at once).
    pub async fn nack(&self, delivery: &Delivery, delay: Duration) -> Result<()> {
        self.nack_ranges(
            &[OffsetRange::single(delivery.partition, delivery.offset)],
            delay,
        )
        .await
    }

    pub async fn nack_ranges(&self, ranges: &[OffsetRange], delay: Duration) -> Result<()> {
        let delay_ms = u32::try_from(delay.as_millis()).map_err(|_| {
            Error::InvalidArgument(format!(
                "nack delay {delay:?} does not fit in u32 milliseconds"
            ))
        })?;
        self.send_ranges(Some(delay_ms), ranges).await
    }

    /// Gives deliveries back for redelivery after `delay`, saying why they failed: `reason` (at
    /// most 1024 bytes) is kept by the broker, and a message it gives up after its last attempt
    /// carries the last reason in its dead letter's `x-ferrymq-dead-reason` header.
    pub async fn nack_with_reason(
        &self,
        ranges: &[OffsetRange],
        delay: Duration,
        reason: &str,
    ) -> Result<()> {
        if reason.is_empty() {
            return self.nack_ranges(ranges, delay).await;
        }
        check_reason(reason)?;
        let delay_ms = u32::try_from(delay.as_millis()).map_err(|_| {
            Error::InvalidArgument(format!(
                "nack delay {delay:?} does not fit in u32 milliseconds"
            ))
        })?;
        self.check_not_ended()?;
        let consumer_id = self.consumer_id;
        // Bounded: one frame per RANGES_COUNT_MAX ranges.
        for chunk in ranges.chunks(RANGES_COUNT_MAX as usize) {
            let frame = Frame::Nack {
                consumer_id,
                delay_ms,
                dead_letter: false,
                release: false,
                reason: reason.to_string(),
                ranges: chunk.to_vec(),
            };
            // Written at once, after every ack queued before it (frames leave in order).
            self.client
                .connection()
                .enqueue(|queue| queue.push_frame(&frame, 0))
                .await?;
        }
        Ok(())
    }

    /// Fails with the reason the client ended this subscription, if it did.
    fn check_not_ended(&self) -> Result<()> {
        match &*self.shared.ended_by_client.lock() {
            Some(reason) => Err(reason.clone()),
            None => Ok(()),
        }
    }

    async fn send_ranges(&self, nack_delay_ms: Option<u32>, ranges: &[OffsetRange]) -> Result<()> {
        self.check_not_ended()?;
        let consumer_id = self.consumer_id;
        // Bounded: one frame per RANGES_COUNT_MAX ranges.
        for chunk in ranges.chunks(RANGES_COUNT_MAX as usize) {
            let connection = self.client.connection();
            let encode = |queue: &mut WriteQueue| queue.push_ack(consumer_id, nack_delay_ms, chunk);
            if self.ordered {
                connection.enqueue(encode).await?;
            } else {
                connection.enqueue_lazy(encode).await?;
            }
        }
        Ok(())
    }

    /// Unsubscribes and waits for the server's OK. Messages delivered but not acked go back to the
    /// subscription.
    pub async fn close(mut self) -> Result<()> {
        self.unsubscribed = true;
        if self.shared.ended_by_client.lock().is_some() {
            // Unsubscribed when the client ended it.
            return Ok(());
        }
        let connection = self.client.connection().clone();
        connection.remove_route(self.consumer_id);
        match connection
            .request(Frame::Unsubscribe {
                consumer_id: self.consumer_id,
            })
            .await?
        {
            Frame::Ok => Ok(()),
            other => Err(Error::UnexpectedResponse(format!(
                "{} frame in answer to UNSUBSCRIBE",
                other.name()
            ))),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // A subscription the client ended was unsubscribed then.
        if !self.unsubscribed && self.shared.ended_by_client.lock().is_none() {
            let connection = self.client.connection();
            connection.remove_route(self.consumer_id);
            connection.unsubscribe_quietly(self.consumer_id);
        }
    }
}

/// A nack or dead-letter reason fits the protocol's limit.
fn check_reason(reason: &str) -> Result<()> {
    if reason.len() > ferrymq_protocol::limits::ERROR_MESSAGE_BYTES_MAX {
        return Err(Error::InvalidArgument(format!(
            "a nack or dead-letter reason is at most {} bytes, got {}",
            ferrymq_protocol::limits::ERROR_MESSAGE_BYTES_MAX,
            reason.len()
        )));
    }
    Ok(())
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("topic", &self.topic)
            .field("name", &self.name)
            .field("consumer_id", &self.consumer_id)
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_build_the_request_and_refuse_bad_values() {
        let request = SubscribeOptions::new("orders")
            .subscription("billing")
            .start(StartPosition::Earliest)
            .ack_timeout(Duration::from_secs(2))
            .max_attempts(3)
            .credit(64)
            .auto_ack(true)
            .to_request()
            .unwrap();
        assert_eq!(request.topic, "orders");
        assert_eq!(request.subscription, "billing");
        assert_eq!(request.start, StartPosition::Earliest);
        assert_eq!(
            (
                request.ack_timeout_ms,
                request.max_attempts,
                request.credit,
                request.auto_ack
            ),
            (2000, 3, 64, true)
        );
        assert_eq!(
            SubscribeOptions::new("t")
                .to_request()
                .unwrap()
                .ack_timeout_ms,
            0
        );
        assert!(SubscribeOptions::new("t").credit(0).to_request().is_err());
        assert!(SubscribeOptions::new("t")
            .credit(CONSUMER_CREDIT_MAX + 1)
            .to_request()
            .is_err());
        assert!(SubscribeOptions::new("t")
            .ack_timeout(Duration::from_micros(10))
            .to_request()
            .is_err());
        assert!(SubscribeOptions::new("").to_request().is_err());
    }
}
