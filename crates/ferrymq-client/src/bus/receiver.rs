//! The receiving side of the bus: handlers, concurrency, retries, reconnection and drain.
//!
//! Invariants:
//! - Only the run loop touches the subscription: handlers run as tasks that return what became
//!   of their message, and the loop acks, nacks or dead-letters it. A message is taken from the
//!   subscription only when a handler slot is free, so what is prefetched but not taken was
//!   never started, and a drain gives it back with NACK's `release` flag (no attempt counted).
//! - At most `concurrency` handlers run at once and at most `prefetch` messages are delivered
//!   ahead of them (the subscription's credit window).
//! - Each connection is a generation. When the connection is lost, the broker gives back every
//!   message in flight to it; the outcome of a handler started under an older generation is
//!   therefore dropped, never applied to the new subscription.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{Id, JoinError, JoinSet};

use super::retry::{bounded, RetryPolicy, REASON_BYTES_MAX};
use super::{
    deserialize, ensure_topic, from_values, now_ms, BusError, BusMessage, Schema, Serializer,
    Settings, HEADER_PREPARED, HEADER_SENDER, HEADER_SENT, HEADER_SERIALIZER, HEADER_SHARD,
    HEADER_TYPE,
};
use crate::{Client, Delivery, OffsetRange, StartPosition, SubscribeOptions, Subscription};

/// Most handlers of one receiver at once: each holds a message and a task.
pub const CONCURRENCY_MAX: usize = 10_000;
/// Released messages are ready again only after this pause, so that the broker does not send
/// them again to the consumer that is leaving before its unsubscribe is through.
pub const RELEASE_DELAY_MS: u32 = 100;
/// The first pause before connecting again after the connection was lost; it doubles up to
/// [`ReceiverOptions::reconnect_delay_max`].
const RECONNECT_DELAY_FIRST: Duration = Duration::from_millis(50);

/// What a handler knows about the message it handles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    pub partition: u32,
    pub offset: u64,
    pub attempt: u16,
    pub type_name: String,
    pub sender: String,
    pub shard: Option<u32>,
    pub serializer: String,
    pub prepared_ms: Option<u64>,
    pub sent_ms: Option<u64>,
    pub received_ms: u64,
}

/// One message's outcome for the statistics hook: handled, refused, failed, dead_lettered or
/// skipped; its body size; and the UTC milliseconds it was prepared, sent, received and handled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageStats {
    pub type_name: String,
    pub outcome: &'static str,
    pub size: usize,
    pub prepared_ms: Option<u64>,
    pub sent_ms: Option<u64>,
    pub received_ms: u64,
    pub handled_ms: u64,
    pub shard: Option<u32>,
    pub sender: Option<String>,
    pub error: Option<String>,
}

/// Handles one message type. Up to [`ReceiverOptions::concurrency`] calls run at once, so a
/// handler keeps its state behind `&self` (a mutex or atomics).
pub trait Handler<T: BusMessage>: Send + Sync + 'static {
    /// False refuses the message: it is acked without handling.
    fn before_handle(
        &self,
        _message: &T,
        _context: &Context,
    ) -> impl std::future::Future<Output = bool> + Send {
        async { true }
    }

    /// An `Err` nacks the message with the error as its reason (bounded to 1024 bytes) and the
    /// retry policy's delay; on its last attempt it is dead-lettered with that reason.
    fn handle(
        &self,
        message: &T,
        context: &Context,
    ) -> impl std::future::Future<Output = Result<(), String>> + Send;

    fn after_handle(
        &self,
        _message: &T,
        _context: &Context,
    ) -> impl std::future::Future<Output = ()> + Send {
        async {}
    }

    /// This handler's retry policy instead of the receiver's.
    fn retry(&self) -> Option<RetryPolicy> {
        None
    }
}

/// How a receiver takes and handles messages; the same settings as the Python and TypeScript
/// buses' receivers.
#[derive(Debug, Clone)]
pub struct ReceiverOptions {
    /// Handlers running at once (1: one message at a time).
    pub concurrency: usize,
    /// Messages delivered ahead of the handlers; `None`: 4 × `concurrency`. Small, so that
    /// workers of one service share a backlog instead of one taking it all.
    pub prefetch: Option<u32>,
    /// At most one message per key in flight, across retries and every instance of the
    /// service (the broker's ordered subscription): a retry never overtakes later messages of
    /// its key.
    pub ordered: bool,
    /// The policy of handlers without their own ([`Handler::retry`]).
    pub retry: RetryPolicy,
    /// How long a drain waits for the handlers in flight.
    pub drain_timeout: Duration,
    /// Create the topic when missing (needs the `manage` right); false only subscribes.
    pub create_topics: bool,
    /// The longest pause between attempts to connect again after the connection was lost.
    pub reconnect_delay_max: Duration,
}

impl Default for ReceiverOptions {
    fn default() -> Self {
        ReceiverOptions {
            concurrency: 1,
            prefetch: None,
            ordered: false,
            retry: RetryPolicy::default(),
            drain_timeout: Duration::from_secs(30),
            create_topics: true,
            reconnect_delay_max: Duration::from_secs(5),
        }
    }
}

impl ReceiverOptions {
    /// The credit window: `prefetch`, or 4 × `concurrency`.
    pub fn prefetch(&self) -> u32 {
        self.prefetch.unwrap_or_else(|| {
            u32::try_from(self.concurrency.saturating_mul(4)).unwrap_or(u32::MAX)
        })
    }

    pub fn check(&self) -> Result<(), BusError> {
        if !(1..=CONCURRENCY_MAX).contains(&self.concurrency) {
            return Err(BusError::Config(format!(
                "concurrency is 1..={CONCURRENCY_MAX}, got {}",
                self.concurrency
            )));
        }
        let limit = ferrymq_protocol::limits::CONSUMER_CREDIT_MAX;
        if !(1..=limit).contains(&self.prefetch()) {
            return Err(BusError::Config(format!(
                "prefetch is 1..={limit}, got {}",
                self.prefetch()
            )));
        }
        self.retry.check()
    }
}

/// Starts a receiver's drain from anywhere (a signal handler, another task); cloneable.
#[derive(Debug, Clone)]
pub struct DrainHandle {
    signal: Arc<watch::Sender<bool>>,
}

impl DrainHandle {
    /// Asks the receiver to drain: [`Receiver::run`] takes no new message, waits for the
    /// handlers in flight, gives back what no handler started, unsubscribes and returns.
    pub fn drain(&self) {
        self.signal.send_replace(true);
    }

    pub fn is_draining(&self) -> bool {
        *self.signal.borrow()
    }
}

/// What a run did, counted by outcome, once it has drained.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    pub handled: u64,
    pub refused: u64,
    pub failed: u64,
    pub dead_lettered: u64,
    pub skipped: u64,
    /// Prefetched messages given back unstarted at the drain (no attempt counted).
    pub released: u64,
    /// Handlers still running at the drain timeout: their messages are delivered again.
    pub abandoned: u64,
    /// Times the connection was lost and made again.
    pub reconnects: u64,
}

impl RunSummary {
    fn count(&mut self, outcome: &str) {
        match outcome {
            "handled" => self.handled += 1,
            "refused" => self.refused += 1,
            "failed" => self.failed += 1,
            "dead_lettered" => self.dead_lettered += 1,
            _ => self.skipped += 1,
        }
    }
}

/// What a handler task made of its message.
enum Outcome {
    Handled,
    Refused,
    Failed(String),
}

/// A message a handler task holds, for settling it when the task ends.
struct Started {
    generation: u64,
    range: OffsetRange,
    attempt: u16,
    stats: MessageStats,
}

/// A handler's failure, as [`Receiver::on_error`] gets it: the Rust twin of the Python and
/// TypeScript buses' `HandlerError`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerError {
    /// The handler's error, bounded to [`REASON_BYTES_MAX`] bytes: the nack's reason.
    pub reason: String,
    pub partition: u32,
    pub offset: u64,
    pub type_name: String,
    pub attempt: u16,
    /// True when this was the last attempt and the message was dead-lettered; false when it
    /// is delivered again after `delay_ms`.
    pub dead_lettered: bool,
    pub delay_ms: u32,
}

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "message {}-{} ({}, attempt {}) failed: {}",
            self.partition, self.offset, self.type_name, self.attempt, self.reason
        )
    }
}

impl std::error::Error for HandlerError {}

/// The hook that gets every handler failure.
type ErrorHook = Arc<dyn Fn(&HandlerError) + Send + Sync>;

/// What the run loop waits for.
enum Event {
    Drain,
    Joined(Result<(Id, Outcome), JoinError>),
    Next(Option<crate::Result<Delivery>>),
}

/// Nothing to report when the connection is gone (the run loop sees it and connects again);
/// any other error ends the run.
fn lost_or(error: crate::Error) -> Result<Option<MessageStats>, BusError> {
    if error.is_connection_error() {
        Ok(None)
    } else {
        Err(error.into())
    }
}

/// Receives one message type from the listened shards and services with one handler.
pub struct Receiver<T: BusMessage, H: Handler<T>> {
    client: Client,
    settings: Settings,
    schema: Schema,
    topic: String,
    options: ReceiverOptions,
    handler: Arc<H>,
    subscription: Option<Subscription>,
    drain: DrainHandle,
    on_error: Option<ErrorHook>,
    _type: PhantomData<fn() -> T>,
}

impl<T: BusMessage + 'static, H: Handler<T>> Receiver<T, H> {
    /// Subscribes under the settings' identity to the type's topic (one per listened service
    /// with a `{sender}` template: then use one receiver per service and topic).
    pub async fn subscribe(
        client: &Client,
        settings: Settings,
        handler: Arc<H>,
        options: ReceiverOptions,
    ) -> Result<Receiver<T, H>, BusError> {
        settings.check()?;
        options.check()?;
        let schema = T::schema()?;
        let sender = settings
            .listen_services
            .first()
            .map(String::as_str)
            .unwrap_or("");
        if settings.topic_template.contains("{sender}")
            && settings.listen_services.len() != 1
            && T::TOPIC.is_none()
        {
            return Err(BusError::Config(
                "a {sender} topic template needs exactly one listened service per receiver".into(),
            ));
        }
        let topic = settings.topic(&schema.name, T::TOPIC, sender);
        if options.create_topics {
            ensure_topic(client, &topic, settings.shard_count).await?;
        }
        let (signal, _) = watch::channel(false);
        let mut receiver = Receiver {
            client: client.clone(),
            settings,
            schema,
            topic,
            options,
            handler,
            subscription: None,
            drain: DrainHandle {
                signal: Arc::new(signal),
            },
            on_error: None,
            _type: PhantomData,
        };
        receiver.subscription = Some(receiver.open().await?);
        Ok(receiver)
    }

    /// Calls `hook` with each handler failure (after the message was nacked or
    /// dead-lettered), as the Python and TypeScript buses' `on_error` / `onError` do; failures
    /// are logged (`tracing`) either way.
    pub fn on_error(mut self, hook: impl Fn(&HandlerError) + Send + Sync + 'static) -> Self {
        self.on_error = Some(Arc::new(hook));
        self
    }

    /// The handle that starts this receiver's drain.
    pub fn drain_handle(&self) -> DrainHandle {
        self.drain.clone()
    }

    fn policy(&self) -> RetryPolicy {
        self.handler.retry().unwrap_or(self.options.retry)
    }

    async fn open(&self) -> Result<Subscription, BusError> {
        let options = SubscribeOptions::new(self.topic.clone())
            .subscription(self.settings.identity.clone())
            .start(StartPosition::Earliest)
            .max_attempts(self.policy().max_attempts.unwrap_or(0))
            .credit(self.options.prefetch())
            .ordered(self.options.ordered)
            .partitions(self.settings.listen_shards.clone());
        let subscription = self.client.subscribe(options).await?;
        if subscription.partitions() != self.settings.shard_count {
            let partitions = subscription.partitions();
            subscription.close().await.ok();
            return Err(BusError::Config(format!(
                "topic {:?} has {partitions} partitions but the bus has {} shards: every service must use the same shard count",
                self.topic, self.settings.shard_count
            )));
        }
        Ok(subscription)
    }

    /// Handles messages until drained (see [`Receiver::drain_handle`]), connecting again and
    /// resubscribing whenever the connection is lost (a broker restart). `stats` sees every
    /// outcome. Returns what the run did, or the error that ended it: a refusal by the broker,
    /// such as missing rights.
    pub async fn run(
        &mut self,
        mut stats: impl FnMut(MessageStats) + Send,
    ) -> Result<RunSummary, BusError> {
        let mut tasks: JoinSet<Outcome> = JoinSet::new();
        let mut started: HashMap<Id, Started> = HashMap::new();
        let mut summary = RunSummary::default();
        let mut generation = 0u64;
        let mut drain = self.drain.signal.subscribe();
        // Each turn takes a message, settles one, reconnects or ends: bounded by the drain.
        loop {
            if *drain.borrow_and_update() {
                break;
            }
            let Some(subscription) = self.subscription.as_mut() else {
                if self.reconnect(&mut drain).await? {
                    summary.reconnects += 1;
                }
                continue;
            };
            let free = tasks.len() < self.options.concurrency;
            let event = tokio::select! {
                biased;
                _ = drain.changed() => Event::Drain,
                Some(joined) = tasks.join_next_with_id(), if !tasks.is_empty() => Event::Joined(joined),
                next = subscription.next(), if free => Event::Next(next),
            };
            match event {
                Event::Drain => {}
                Event::Joined(joined) => {
                    let s = self.settle(joined, &mut started, generation).await?;
                    if let Some(s) = s {
                        summary.count(s.outcome);
                        stats(s);
                    }
                }
                Event::Next(Some(Ok(delivery))) => {
                    let done = self.take(delivery, &mut tasks, &mut started, generation);
                    if let Some(s) = done.await? {
                        summary.count(s.outcome);
                        stats(s);
                    }
                }
                Event::Next(Some(Err(error))) if !error.is_connection_error() => {
                    return Err(error.into())
                }
                Event::Next(_) => {
                    tracing::warn!(topic = %self.topic, "the bus lost its connection; connecting again");
                    // The broker gives back what was in flight: those outcomes are dropped.
                    self.subscription = None;
                    generation += 1;
                }
            }
        }
        self.finish(tasks, started, generation, &mut summary, &mut stats)
            .await?;
        Ok(summary)
    }

    /// Connects and subscribes again, pausing longer after each failure; false when a drain
    /// came first. A refusal (credentials, rights, a topic that changed) ends the run.
    async fn reconnect(&mut self, drain: &mut watch::Receiver<bool>) -> Result<bool, BusError> {
        let mut delay = RECONNECT_DELAY_FIRST;
        // Bounded by the drain: each turn waits for the pause or the drain.
        loop {
            let attempt = async {
                let client = Client::connect_with(self.client.config().clone()).await?;
                self.client = client;
                self.open().await
            };
            match attempt.await {
                Ok(subscription) => {
                    tracing::info!(topic = %self.topic, "the bus is connected and subscribed again");
                    self.subscription = Some(subscription);
                    return Ok(true);
                }
                Err(BusError::Client(error)) if error.code().is_none() => {
                    tracing::debug!(%error, ?delay, "connecting again failed; trying again");
                }
                Err(error) => return Err(error),
            }
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = drain.changed() => return Ok(false),
            }
            delay = (delay * 2).min(self.options.reconnect_delay_max);
        }
    }

    /// Takes a delivery: skips, dead-letters or starts a handler task. The stats of a message
    /// settled at once, `None` when a handler took it.
    async fn take(
        &self,
        d: Delivery,
        tasks: &mut JoinSet<Outcome>,
        started: &mut HashMap<Id, Started>,
        generation: u64,
    ) -> Result<Option<MessageStats>, BusError> {
        let subscription = self.subscription.as_ref().expect("taken from it");
        let (context, mut stats) = self.context_of(&d);
        let range = OffsetRange::single(d.partition, d.offset);
        let listened = self.settings.listen_services.is_empty()
            || stats
                .sender
                .as_ref()
                .is_some_and(|s| self.settings.listen_services.contains(s));
        if !listened {
            if let Err(error) = subscription.ack(&d).await {
                return lost_or(error);
            }
            stats.outcome = "skipped";
            stats.handled_ms = now_ms();
            return Ok(Some(stats));
        }
        let message = match self.decode(&d, &context) {
            Ok(message) => message,
            Err(reason) => {
                let reason = bounded(&reason, REASON_BYTES_MAX);
                tracing::warn!(topic = %self.topic, partition = d.partition, offset = d.offset, %reason, "an unreadable message is dead-lettered");
                if let Err(error) = subscription.dead_letter(&[range], &reason).await {
                    return lost_or(error);
                }
                stats.outcome = "dead_lettered";
                stats.error = Some(reason);
                stats.handled_ms = now_ms();
                return Ok(Some(stats));
            }
        };
        let handler = self.handler.clone();
        let task = tasks.spawn(async move {
            if !handler.before_handle(&message, &context).await {
                return Outcome::Refused;
            }
            match handler.handle(&message, &context).await {
                Ok(()) => {
                    handler.after_handle(&message, &context).await;
                    Outcome::Handled
                }
                Err(error) => Outcome::Failed(error),
            }
        });
        started.insert(
            task.id(),
            Started {
                generation,
                range,
                attempt: d.attempt,
                stats,
            },
        );
        Ok(None)
    }

    fn decode(&self, d: &Delivery, context: &Context) -> Result<T, String> {
        if context.type_name != self.schema.name {
            return Err(format!(
                "no handler for message type {:?} in receiver {:?}",
                context.type_name, self.settings.identity
            ));
        }
        Serializer::from_name(&context.serializer)
            .and_then(|s| deserialize(&self.schema, &d.message.body, s))
            .and_then(|values| from_values::<T>(&self.schema, values))
            .map_err(|e| e.to_string())
    }

    fn context_of(&self, d: &Delivery) -> (Context, MessageStats) {
        let received_ms = now_ms();
        let header = |name: &str| {
            d.message
                .headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        let sender = header(HEADER_SENDER);
        let context = Context {
            partition: d.partition,
            offset: d.offset,
            attempt: d.attempt,
            type_name: header(HEADER_TYPE).unwrap_or_default(),
            sender: sender.clone().unwrap_or_default(),
            shard: header(HEADER_SHARD).and_then(|s| s.parse().ok()),
            serializer: header(HEADER_SERIALIZER).unwrap_or_default(),
            prepared_ms: header(HEADER_PREPARED).and_then(|s| s.parse().ok()),
            sent_ms: header(HEADER_SENT).and_then(|s| s.parse().ok()),
            received_ms,
        };
        let stats = MessageStats {
            type_name: context.type_name.clone(),
            outcome: "handled",
            size: d.message.body.len(),
            prepared_ms: context.prepared_ms,
            sent_ms: context.sent_ms,
            received_ms,
            handled_ms: received_ms,
            shard: context.shard,
            sender,
            error: None,
        };
        (context, stats)
    }

    /// Acks, nacks or dead-letters the message of a finished handler task; `None` when its
    /// connection is gone (the broker took the message back).
    async fn settle(
        &self,
        joined: Result<(Id, Outcome), JoinError>,
        started: &mut HashMap<Id, Started>,
        generation: u64,
    ) -> Result<Option<MessageStats>, BusError> {
        let (id, outcome) = match joined {
            Ok((id, outcome)) => (id, outcome),
            Err(error) => {
                let why = if error.is_panic() {
                    "the handler panicked"
                } else {
                    "the handler was cancelled"
                };
                (error.id(), Outcome::Failed(why.to_string()))
            }
        };
        let Some(mut s) = started.remove(&id) else {
            return Ok(None);
        };
        let Some(subscription) = self.subscription.as_ref() else {
            return Ok(None);
        };
        if s.generation != generation {
            return Ok(None);
        }
        s.stats.handled_ms = now_ms();
        let settled = match outcome {
            Outcome::Handled => subscription.ack_ranges(&[s.range]).await,
            Outcome::Refused => {
                s.stats.outcome = "refused";
                subscription.ack_ranges(&[s.range]).await
            }
            Outcome::Failed(error) => self.settle_failed(subscription, &mut s, &error).await,
        };
        match settled {
            Ok(()) => Ok(Some(s.stats)),
            // The run loop sees the loss on the stream and connects again.
            Err(error) if error.is_connection_error() => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Nacks a failed message with the handler's error and the policy's delay, or
    /// dead-letters it on its last attempt; then tells the `on_error` hook.
    async fn settle_failed(
        &self,
        subscription: &Subscription,
        s: &mut Started,
        error: &str,
    ) -> crate::Result<()> {
        let reason = bounded(error, REASON_BYTES_MAX);
        let policy = self.policy();
        s.stats.outcome = "failed";
        let last = policy.is_last(s.attempt);
        let delay_ms = if last { 0 } else { policy.delay_ms(s.attempt) };
        let settled = if last {
            tracing::warn!(topic = %self.topic, partition = s.range.partition, offset = s.range.offset, attempt = s.attempt, %reason, "a message failed on its last attempt and is dead-lettered");
            subscription.dead_letter(&[s.range], &reason).await
        } else {
            tracing::warn!(topic = %self.topic, partition = s.range.partition, offset = s.range.offset, attempt = s.attempt, delay_ms, %reason, "a message failed and is retried");
            let delay = Duration::from_millis(delay_ms.into());
            subscription
                .nack_with_reason(&[s.range], delay, &reason)
                .await
        };
        if let Some(hook) = &self.on_error {
            hook(&HandlerError {
                reason: reason.clone(),
                partition: s.range.partition,
                offset: s.range.offset,
                type_name: s.stats.type_name.clone(),
                attempt: s.attempt,
                dead_lettered: last,
                delay_ms,
            });
        }
        s.stats.error = Some(reason);
        settled
    }

    /// The end of a drain: waits up to the drain timeout for the handlers in flight and settles
    /// them, gives back what no handler started, and unsubscribes.
    async fn finish(
        &mut self,
        mut tasks: JoinSet<Outcome>,
        mut started: HashMap<Id, Started>,
        generation: u64,
        summary: &mut RunSummary,
        stats: &mut (impl FnMut(MessageStats) + Send),
    ) -> Result<(), BusError> {
        let deadline = tokio::time::Instant::now() + self.options.drain_timeout;
        // Bounded: one turn per task, and the deadline.
        while !tasks.is_empty() {
            match tokio::time::timeout_at(deadline, tasks.join_next_with_id()).await {
                Ok(Some(joined)) => {
                    if let Some(s) = self.settle(joined, &mut started, generation).await? {
                        summary.count(s.outcome);
                        stats(s);
                    }
                }
                Ok(None) => break,
                Err(_) => {
                    summary.abandoned = tasks.len() as u64;
                    tracing::warn!(handlers = tasks.len(), "handlers still ran at the drain timeout; their messages will be delivered again");
                    tasks.abort_all();
                    break;
                }
            }
        }
        if let Some(subscription) = self.subscription.take() {
            summary.released = subscription
                .close_releasing_after(&[], RELEASE_DELAY_MS)
                .await?;
        }
        Ok(())
    }
}
