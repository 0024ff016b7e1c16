//! The consumers HTTP clients receive messages through, kept between requests so that what they
//! were given stays theirs to ack until it times out.
//!
//! HTTP is stateless, but a delivery is owned by the consumer it went to: dropping a consumer
//! gives its in-flight messages back at once. So the registry keeps consumers by token:
//!
//! - A long-poll consumer exists once per (topic, subscription, options): the first poll creates
//!   it, later polls with the same options share it (and its token), acks and nacks name it. It is
//!   dropped once it has been idle (no request naming it) for [`IDLE_MIN`] with nothing in
//!   flight: messages in flight keep it until they are acked, nacked or time out, so a consumer
//!   lives at least max(ack_timeout, 60 s) after its last use and an ack within the ack timeout
//!   always finds it. A background sweep (one tokio task, started with the first consumer, holding
//!   only a weak reference) does that every second.
//! - A streaming (Server-Sent Events) consumer is registered while its stream lives and removed
//!   (and dropped, giving its in-flight messages back) when the client goes away.
//!
//! The registry is bounded ([`CONSUMERS_MAX`]): beyond it a new consumer is refused with
//! `limit_exceeded` (429).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use ferrymq_broker::{BrokerError, Consumer};
use ferrymq_protocol::limits::ACK_TIMEOUT_MS_MAX;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::error::{ApiError, ApiResult};

/// Consumers the registry holds at most, long-poll and streaming together.
pub const CONSUMERS_MAX: usize = 10_000;
/// How long a long-poll consumer with nothing in flight survives without a request.
pub const IDLE_MIN: Duration = Duration::from_secs(60);
/// How often idle consumers are looked for.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The `ferrymq_http_consumers` gauge: consumers registered now (every registry of the process).
fn consumers_gauge() -> &'static metrics::Gauge {
    static GAUGE: std::sync::OnceLock<metrics::Gauge> = std::sync::OnceLock::new();
    GAUGE.get_or_init(|| metrics::gauge!("ferrymq_http_consumers"))
}

/// What makes two polls share a consumer: the same subscription with the same options.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PollKey {
    pub topic: String,
    pub subscription: String,
    pub ack_timeout_ms: u32,
    pub max_attempts: u32,
    pub ordered: bool,
    pub auto_ack: bool,
    pub dead_letter_topic: String,
    pub partitions: Vec<(u32, u32)>,
}

enum Kind {
    Poll(PollKey),
    Stream,
}

/// One registered consumer.
pub(crate) struct Entry {
    pub token: String,
    pub topic: String,
    /// The subscription's name as paths name it: `-` for a stream's ephemeral subscription.
    pub subscription: String,
    /// Shared only with the broker's connection listing, which holds it weakly: dropping the
    /// entry still drops the consumer and gives its in-flight messages back.
    pub consumer: Arc<Consumer>,
    kind: Kind,
    last_used: Mutex<Instant>,
    /// Requests using it right now: never idle while one runs.
    active: AtomicU32,
    /// Woken after acks and nacks through this consumer (a stream waiting for room).
    pub settled: Notify,
}

impl Entry {
    fn touch(&self) {
        *self.last_used.lock() = Instant::now();
    }

    /// True when the path `topic`/`subscription` names this consumer's subscription.
    pub fn serves(&self, topic: &str, subscription: &str) -> bool {
        self.topic == topic
            && (self.subscription == subscription
                || self.consumer.subscription().name() == subscription)
    }
}

/// A request's hold on a consumer: it is not swept while held, and counts as used until dropped.
pub(crate) struct InUse {
    pub entry: Arc<Entry>,
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.entry.touch();
        self.entry.active.fetch_sub(1, Relaxed);
    }
}

/// A live stream's registration: removed from the registry when dropped.
pub(crate) struct StreamRegistration {
    pub entry: Arc<Entry>,
    registry: Weak<Registry>,
}

impl Drop for StreamRegistration {
    fn drop(&mut self) {
        if let Some(registry) = self.registry.upgrade() {
            let removed = registry.state.lock().by_token.remove(&self.entry.token);
            if removed.is_some() {
                consumers_gauge().decrement(1.0);
            }
            drop(removed);
        }
    }
}

#[derive(Default)]
struct State {
    by_token: HashMap<String, Arc<Entry>>,
    by_key: HashMap<PollKey, String>,
}

/// HTTP consumers by token.
pub struct Registry {
    state: Mutex<State>,
    consumers_max: usize,
    idle_min: Duration,
    sweep_interval: Duration,
    sweeper_started: AtomicBool,
    next: AtomicU64,
    random: RandomState,
    /// Set by [`Registry::close`]: the server is stopping.
    closing: AtomicBool,
    closed: Notify,
    /// The polls other nodes passed on, stoppable by id.
    pub(crate) stops: Stops,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::with_limits(CONSUMERS_MAX, IDLE_MIN, SWEEP_INTERVAL)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        consumers_gauge().decrement(self.state.get_mut().by_token.len() as f64);
    }
}

impl Registry {
    pub(crate) fn with_limits(
        consumers_max: usize,
        idle_min: Duration,
        sweep_interval: Duration,
    ) -> Registry {
        Registry {
            state: Default::default(),
            consumers_max,
            idle_min,
            sweep_interval,
            sweeper_started: AtomicBool::new(false),
            next: AtomicU64::new(1),
            random: RandomState::new(),
            closing: AtomicBool::new(false),
            closed: Notify::new(),
            stops: Default::default(),
        }
    }

    /// The server is stopping: long polls answer now with what they have, streams send
    /// `event: error` (`shutting_down`) and end (giving their unacked messages back), and no new
    /// consumer is made. Acks and nacks still work. Call it when shutdown begins, so that a
    /// graceful shutdown does not wait for streams that would never end by themselves.
    pub fn close(&self) {
        self.closing.store(true, Relaxed);
        self.closed.notify_waiters();
    }

    pub fn is_closing(&self) -> bool {
        self.closing.load(Relaxed)
    }

    /// Completes once [`Registry::close`] was called.
    pub(crate) async fn wait_closed(&self) {
        loop {
            let closed = self.closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if self.is_closing() {
                return;
            }
            closed.await;
        }
    }

    fn check_open(&self) -> ApiResult<()> {
        if self.is_closing() {
            return Err(BrokerError::ShuttingDown.into());
        }
        Ok(())
    }

    /// Consumers registered now.
    pub fn len(&self) -> usize {
        self.state.lock().by_token.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How long a long-poll consumer with nothing in flight is kept without requests.
    pub fn idle_min(&self) -> Duration {
        self.idle_min
    }

    /// An unguessable token: 128 bits from keyed SipHash (random keys per process) over a counter.
    fn new_token(&self) -> String {
        let n = self.next.fetch_add(1, Relaxed);
        let mut words = [0u64; 2];
        for (i, word) in words.iter_mut().enumerate() {
            let mut h = self.random.build_hasher();
            h.write_u64(n);
            h.write_usize(i);
            h.write_u128(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos()),
            );
            *word = h.finish();
        }
        format!("c{:016x}{:016x}", words[0], words[1])
    }

    fn full(&self) -> ApiError {
        BrokerError::LimitExceeded(format!(
            "the HTTP API holds its maximum of {} consumers: ack what you hold, or retry once idle ones expire",
            self.consumers_max
        ))
        .into()
    }

    fn hold(entry: &Arc<Entry>) -> InUse {
        entry.active.fetch_add(1, Relaxed);
        entry.touch();
        InUse {
            entry: entry.clone(),
        }
    }

    /// The long-poll consumer for `key`, created with `create` if there is none (or its topic was
    /// deleted).
    pub(crate) fn poll_consumer(
        self: &Arc<Self>,
        key: PollKey,
        create: impl FnOnce() -> Result<Consumer, BrokerError>,
    ) -> ApiResult<InUse> {
        self.check_open()?;
        {
            let state = self.state.lock();
            if let Some(entry) = state
                .by_key
                .get(&key)
                .and_then(|token| state.by_token.get(token))
            {
                if !entry.consumer.is_closed() {
                    return Ok(Self::hold(entry));
                }
            }
            if state.by_token.len() >= self.consumers_max {
                return Err(self.full());
            }
        }
        // Subscribing may write to disk: not under the registry's lock. Two first polls racing
        // may both subscribe; the loser's consumer is dropped before it received anything.
        let consumer = create()?;
        let entry = Arc::new(Entry {
            token: self.new_token(),
            topic: key.topic.clone(),
            subscription: key.subscription.clone(),
            consumer: Arc::new(consumer),
            kind: Kind::Poll(key.clone()),
            last_used: Mutex::new(Instant::now()),
            active: AtomicU32::new(0),
            settled: Notify::new(),
        });
        let mut state = self.state.lock();
        if let Some(existing) = state
            .by_key
            .get(&key)
            .and_then(|token| state.by_token.get(token))
        {
            if !existing.consumer.is_closed() {
                let held = Self::hold(existing);
                drop(state);
                drop(entry);
                return Ok(held);
            }
        }
        if state.by_token.len() >= self.consumers_max {
            drop(state);
            return Err(self.full());
        }
        let held = Self::hold(&entry);
        if let Some(old) = state.by_key.insert(key, entry.token.clone()) {
            if let Some(old) = state.by_token.remove(&old) {
                consumers_gauge().decrement(1.0);
                drop(old);
            }
        }
        state.by_token.insert(entry.token.clone(), entry);
        consumers_gauge().increment(1.0);
        drop(state);
        self.start_sweeper();
        Ok(held)
    }

    /// Registers a stream's consumer while the returned registration lives.
    pub(crate) fn register_stream(
        self: &Arc<Self>,
        topic: &str,
        subscription: &str,
        consumer: Consumer,
    ) -> ApiResult<StreamRegistration> {
        self.check_open()?;
        let entry = Arc::new(Entry {
            token: self.new_token(),
            topic: topic.to_string(),
            subscription: subscription.to_string(),
            consumer: Arc::new(consumer),
            kind: Kind::Stream,
            last_used: Mutex::new(Instant::now()),
            active: AtomicU32::new(0),
            settled: Notify::new(),
        });
        let mut state = self.state.lock();
        if state.by_token.len() >= self.consumers_max {
            drop(state);
            return Err(self.full());
        }
        state.by_token.insert(entry.token.clone(), entry.clone());
        consumers_gauge().increment(1.0);
        Ok(StreamRegistration {
            entry,
            registry: Arc::downgrade(self),
        })
    }

    /// The consumer with `token`, held for the request.
    pub(crate) fn get(&self, token: &str) -> Option<InUse> {
        self.state.lock().by_token.get(token).map(Self::hold)
    }

    /// Drops long-poll consumers idle for `idle_min` with nothing in flight, or whose topic was
    /// deleted. Returns how many.
    pub(crate) fn sweep(&self) -> usize {
        let now = Instant::now();
        // In flight or not, nothing is held longer than the longest ack timeout.
        let idle_max = self.idle_min + Duration::from_millis(ACK_TIMEOUT_MS_MAX as u64);
        let n = self.remove_polls(|_, entry| {
            let idle = now.saturating_duration_since(*entry.last_used.lock());
            entry.consumer.is_closed()
                || (idle >= self.idle_min && entry.consumer.in_flight() == 0)
                || idle >= idle_max
        });
        if n > 0 {
            tracing::debug!(consumers = n, "idle HTTP consumers dropped");
        }
        n
    }

    /// Drops the long-poll consumers of `topic`/`subscription` that no request is using now,
    /// giving back what is in flight to them, and returns how many. For deleting a subscription:
    /// the broker refuses while consumers are attached, and an HTTP client's consumer would
    /// otherwise stay attached until it expires. Streams are left alone: they are clients that
    /// are still connected.
    pub fn release(&self, topic: &str, subscription: &str) -> usize {
        self.remove_polls(|key, _| key.topic == topic && key.subscription == subscription)
    }

    /// Removes the long-poll consumers no request is using now for which `remove` says so;
    /// returns how many. Dropping a consumer gives its in-flight messages back, which happens
    /// outside the registry's lock.
    fn remove_polls(&self, mut remove: impl FnMut(&PollKey, &Entry) -> bool) -> usize {
        let mut removed = Vec::new();
        {
            let mut state = self.state.lock();
            let State { by_token, by_key } = &mut *state;
            by_token.retain(|_, entry| {
                let Kind::Poll(key) = &entry.kind else {
                    return true;
                };
                if entry.active.load(Relaxed) > 0 || !remove(key, entry) {
                    return true;
                }
                if by_key.get(key) == Some(&entry.token) {
                    by_key.remove(key);
                }
                removed.push(entry.clone());
                false
            });
        }
        let n = removed.len();
        if n > 0 {
            consumers_gauge().decrement(n as f64);
        }
        drop(removed);
        n
    }

    fn start_sweeper(self: &Arc<Self>) {
        if self.sweeper_started.swap(true, Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.sweeper_started.store(false, Relaxed);
            return;
        };
        let weak = Arc::downgrade(self);
        let interval = self.sweep_interval;
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match weak.upgrade() {
                    Some(registry) => {
                        registry.sweep();
                    }
                    None => break,
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrymq_broker::{Broker, BrokerConfig};
    use ferrymq_protocol::{Message, SubscribeRequest};

    fn key(topic: &str, subscription: &str) -> PollKey {
        PollKey {
            topic: topic.into(),
            subscription: subscription.into(),
            ack_timeout_ms: 0,
            max_attempts: 0,
            ordered: false,
            auto_ack: false,
            dead_letter_topic: String::new(),
            partitions: Vec::new(),
        }
    }

    #[tokio::test]
    async fn same_key_shares_a_consumer_kept_while_in_flight_then_swept_once_idle() {
        let broker = Broker::open(BrokerConfig::default());
        let registry = Arc::new(Registry::with_limits(
            10,
            Duration::from_millis(50),
            Duration::from_millis(10),
        ));
        let subscribe = || broker.subscribe(&SubscribeRequest::earliest("t", "work"));
        let first = registry.poll_consumer(key("t", "work"), subscribe).unwrap();
        let token = first.entry.token.clone();
        let again = registry.poll_consumer(key("t", "work"), subscribe).unwrap();
        assert_eq!(again.entry.token, token);
        assert_eq!(registry.len(), 1);

        broker
            .publish_messages("t", &[Message::new("a")])
            .await
            .unwrap();
        let got = first.entry.consumer.recv(10).await.unwrap();
        assert_eq!(got.len(), 1);
        drop(first);
        drop(again);

        // In flight: kept past idle_min (the ack timeout is 30 s by default).
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(registry.sweep(), 0);
        assert!(registry.get(&token).is_some());

        // Acked: swept once idle.
        let held = registry.get(&token).unwrap();
        held.entry
            .consumer
            .ack(&[ferrymq_protocol::OffsetRange::single(0, 0)])
            .unwrap();
        drop(held);
        let deadline = Instant::now() + Duration::from_secs(5);
        // (Looking it up by token would use it: watch the count instead.)
        while !registry.is_empty() {
            assert!(Instant::now() < deadline, "idle consumer not swept");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(registry.get(&token).is_none());
    }

    #[tokio::test]
    async fn an_idle_consumer_whose_messages_timed_out_is_swept() {
        let broker = Broker::open(BrokerConfig::default());
        let registry = Arc::new(Registry::with_limits(
            10,
            Duration::from_millis(20),
            Duration::from_secs(3600),
        ));
        let mut request = SubscribeRequest::earliest("t", "work");
        request.ack_timeout_ms = 100;
        let held = registry
            .poll_consumer(key("t", "work"), || broker.subscribe(&request))
            .unwrap();
        broker
            .publish_messages("t", &[Message::new("a")])
            .await
            .unwrap();
        assert_eq!(held.entry.consumer.recv(10).await.unwrap().len(), 1);
        let token = held.entry.token.clone();
        drop(held);
        // The ack timeout passes: nothing in flight any more, so the sweep drops it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(registry.sweep(), 1);
        assert!(registry.get(&token).is_none());
        let other = broker
            .subscribe(&SubscribeRequest::earliest("t", "work"))
            .unwrap();
        let again = tokio::time::timeout(Duration::from_secs(5), other.recv(10))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(again[0].attempt, 2);
    }

    #[tokio::test]
    async fn release_lets_a_subscription_be_deleted() {
        let broker = Broker::open(BrokerConfig::default());
        let registry = Arc::new(Registry::default());
        // Two consumers of "work" (one on partition 0 only), one of "other".
        for (name, partitions) in [("work", vec![]), ("work", vec![(0, 0)]), ("other", vec![])] {
            let mut k = key("t", name);
            k.partitions = partitions.clone();
            let mut request = SubscribeRequest::earliest("t", name);
            request.partitions = partitions;
            registry
                .poll_consumer(k, || broker.subscribe(&request))
                .unwrap();
        }
        assert_eq!(registry.len(), 3);
        assert!(broker.delete_subscription("t", "work").is_err());
        let busy = registry.get(&{
            let state = registry.state.lock();
            state.by_key[&key("t", "other")].clone()
        });
        assert_eq!(registry.release("t", "work"), 2);
        assert_eq!(registry.release("t", "other"), 0, "in use by a request");
        drop(busy);
        broker.delete_subscription("t", "work").unwrap();
        assert_eq!(registry.len(), 1);
    }

    #[tokio::test]
    async fn the_registry_is_bounded() {
        let broker = Broker::open(BrokerConfig::default());
        let registry = Arc::new(Registry::with_limits(
            2,
            Duration::from_secs(60),
            Duration::from_secs(60),
        ));
        for name in ["a", "b"] {
            registry
                .poll_consumer(key("t", name), || {
                    broker.subscribe(&SubscribeRequest::earliest("t", name))
                })
                .unwrap();
        }
        let error = registry
            .poll_consumer(key("t", "c"), || {
                broker.subscribe(&SubscribeRequest::earliest("t", "c"))
            })
            .err()
            .unwrap();
        assert_eq!(error.status, axum::http::StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(error.code, "limit_exceeded");
        let stream = broker
            .subscribe(&SubscribeRequest::earliest("t", ""))
            .unwrap();
        assert!(registry.register_stream("t", "-", stream).is_err());
    }

    #[tokio::test]
    async fn a_stream_is_registered_while_it_lives() {
        let broker = Broker::open(BrokerConfig::default());
        let registry = Arc::new(Registry::default());
        let consumer = broker
            .subscribe(&SubscribeRequest::earliest("t", ""))
            .unwrap();
        let registration = registry.register_stream("t", "-", consumer).unwrap();
        let token = registration.entry.token.clone();
        assert!(registry.get(&token).unwrap().entry.serves("t", "-"));
        assert_eq!(registry.sweep(), 0);
        drop(registration);
        assert!(registry.get(&token).is_none());
        assert!(broker.describe_topic("t").unwrap().subscriptions.is_empty());
    }
}

/// How long a stop that came for a poll no longer running is kept (it may also have come before
/// the poll started).
const STOP_KEPT: Duration = Duration::from_secs(90);

/// The stops of the polls other nodes passed on, by id.
#[derive(Default)]
pub(crate) struct Stops(Mutex<HashMap<u64, (Instant, Arc<Notify>)>>);

impl Stops {
    pub(crate) fn handle(&self, id: u64) -> Arc<Notify> {
        let mut stops = self.0.lock();
        let now = Instant::now();
        if stops.len() >= 64 {
            stops.retain(|_, (at, _)| now.duration_since(*at) < STOP_KEPT);
        }
        let (_, stop) = stops
            .entry(id)
            .or_insert_with(|| (now, Arc::new(Notify::new())));
        stop.clone()
    }

    pub(crate) fn forget(&self, id: u64) {
        self.0.lock().remove(&id);
    }
}
