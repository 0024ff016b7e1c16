//! What every driver shares: the scenarios, their settings, the measurement windows, paced
//! publishing for the latency scenario, and the results written as JSON lines.
//!
//! Every load loop is bounded: producers stop at a stop flag that the harness sets when the
//! measurement window ends (or at a message count), consumers stop when everything arrived or a
//! grace period passed, and each run as a whole is cut off after [`RUN_MAX`].

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Bytes of the send stamp at the start of every body (nanoseconds since [`clock`]).
pub const STAMP_BYTES: usize = 8;
/// Longest a single run may take, whatever happens.
pub const RUN_MAX: Duration = Duration::from_secs(180);
/// How long consumers may take to receive what was sent once the producers stopped.
pub const GRACE: Duration = Duration::from_secs(10);
/// Highest latency the histograms hold (one minute in nanoseconds); larger values are clamped.
const LATENCY_NS_MAX: u64 = 60_000_000_000;

#[derive(
    Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum Scenario {
    /// Transient fan-out, 100 B, one publisher and one subscriber, nothing persisted or acked.
    Transient,
    /// Durable publish, 100 B: a publish counts once the broker confirmed it (after fsync).
    Durable100,
    /// Durable publish, 1 KiB.
    Durable1k,
    /// Work queue: a pre-loaded durable queue drained by one consumer that acks every message.
    WorkQueue,
    /// Latency at a fixed publish rate, transient, 100 B, one message per publish.
    Latency,
}

impl Scenario {
    pub const ALL: [Scenario; 5] = [
        Scenario::Transient,
        Scenario::Durable100,
        Scenario::Durable1k,
        Scenario::WorkQueue,
        Scenario::Latency,
    ];
}

/// Settings shared by every system, so that each runs the same scenarios.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Params {
    /// Measured runs per scenario; the table shows their median.
    pub runs: usize,
    /// Load before the measurement window of each throughput run (not counted).
    pub warmup: Duration,
    /// The measurement window of each throughput run.
    pub measure: Duration,
    /// Most messages a transient publisher may be ahead of its subscriber.
    pub lead: u64,
    /// Messages per publish batch or pipeline, where the system batches.
    pub batch: usize,
    /// Publish batches (or single confirmed publishes, for systems without batches) in flight.
    pub pipeline: usize,
    /// Work queue: messages pre-loaded at most, and for at most this long.
    pub preload_max: u64,
    pub preload_time: Duration,
    /// Work queue: deliveries unacked at most per consumer (credit, prefetch, COUNT, batch).
    pub window: usize,
    /// Latency scenario: messages per second, and for how long (after the warm-up).
    pub rate: u64,
    pub latency_time: Duration,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            runs: 3,
            warmup: Duration::from_secs(1),
            measure: Duration::from_secs(3),
            lead: 50_000,
            batch: 1000,
            pipeline: 8,
            preload_max: 1_000_000,
            preload_time: Duration::from_secs(3),
            window: 1000,
            rate: 10_000,
            latency_time: Duration::from_secs(5),
        }
    }
}

/// One throughput run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Throughput {
    pub msgs_per_s: f64,
    /// Messages counted in the window, and the window's length.
    pub counted: u64,
    pub secs: f64,
    /// Sent and never received (transient), or not confirmed (durable).
    pub lost: u64,
}

/// One latency run, in microseconds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LatencyRun {
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub count: u64,
    pub lost: u64,
}

impl LatencyRun {
    pub fn from_histogram(h: &Histogram<u64>, lost: u64) -> LatencyRun {
        let us = |ns: u64| ns as f64 / 1000.0;
        LatencyRun {
            p50_us: us(h.value_at_quantile(0.50)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
            count: h.len(),
            lost,
        }
    }
}

/// What one system did in one scenario: the line written to the results file.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ScenarioResult {
    /// Column key, e.g. `ferrymq`, `nats`, `redis-always`.
    pub system: String,
    pub scenario: Scenario,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// How the system was set up for this scenario (shown under the table).
    pub setup: String,
    /// Where the figure means less than the row says (e.g. acknowledged before fsync).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caveat: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    Throughput {
        runs: Vec<Throughput>,
    },
    Latency {
        runs: Vec<LatencyRun>,
    },
    /// The system cannot do the scenario, or every run failed; the reason is printed.
    NotApplicable {
        reason: String,
    },
}

pub fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

impl Outcome {
    /// The median throughput, if this is a throughput outcome with runs.
    pub fn median_rate(&self) -> Option<f64> {
        match self {
            Outcome::Throughput { runs } => {
                median(&mut runs.iter().map(|r| r.msgs_per_s).collect::<Vec<_>>())
            }
            _ => None,
        }
    }

    /// The median of each latency figure over the runs: p50, p99, p99.9, max (µs).
    pub fn median_latency(&self) -> Option<[f64; 4]> {
        match self {
            Outcome::Latency { runs } if !runs.is_empty() => {
                let pick = |f: fn(&LatencyRun) -> f64| {
                    median(&mut runs.iter().map(f).collect::<Vec<_>>()).unwrap_or(f64::NAN)
                };
                Some([
                    pick(|r| r.p50_us),
                    pick(|r| r.p99_us),
                    pick(|r| r.p999_us),
                    pick(|r| r.max_us),
                ])
            }
            _ => None,
        }
    }
}

/// The process-wide clock that send stamps count from.
pub fn clock() -> Instant {
    static CLOCK: OnceLock<Instant> = OnceLock::new();
    *CLOCK.get_or_init(Instant::now)
}

pub fn now_ns() -> u64 {
    clock().elapsed().as_nanos() as u64
}

pub fn stamp_of(at: Instant) -> u64 {
    at.saturating_duration_since(clock()).as_nanos() as u64
}

/// A body of `size` bytes whose first 8 bytes are `stamp_ns`.
#[cfg(test)]
pub fn stamped_body(size: usize, stamp_ns: u64) -> Vec<u8> {
    let mut body = vec![b'x'; size.max(STAMP_BYTES)];
    body[..STAMP_BYTES].copy_from_slice(&stamp_ns.to_le_bytes());
    body
}

pub fn read_stamp(body: &[u8]) -> Option<u64> {
    body.first_chunk::<STAMP_BYTES>()
        .map(|b| u64::from_le_bytes(*b))
}

pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).expect("valid histogram bounds")
}

/// Counters shared by the tasks of one run.
#[derive(Default)]
pub struct Counters {
    /// Messages sent (transient) or confirmed (durable).
    pub sent: AtomicU64,
    pub received: AtomicU64,
    /// Producers stop.
    pub stop: AtomicBool,
    /// Consumers stop (after the drain).
    pub done: AtomicBool,
}

impl Counters {
    pub fn new() -> Arc<Counters> {
        Arc::new(Counters::default())
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub fn finish(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.done.store(true, Ordering::Relaxed);
    }

    pub fn finished(&self) -> bool {
        self.done.load(Ordering::Relaxed)
    }

    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Waits while the publisher is more than `lead` messages ahead of the subscriber (bounded by
    /// the stop flag).
    pub async fn hold_lead(&self, lead: u64) {
        while self.sent() > self.received() + lead && !self.stopped() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Waits until the subscriber received everything sent, or `GRACE` passed.
    pub async fn drain(&self) {
        let end = Instant::now() + GRACE;
        while self.received() < self.sent() && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Lets the load run for the warm-up, then counts `counted()` over the measurement window, then
/// sets the stop flag. Returns the rate over the window.
pub async fn window(counters: &Counters, params: &Params, counted: impl Fn() -> u64) -> Throughput {
    tokio::time::sleep(params.warmup).await;
    let (c0, t0) = (counted(), Instant::now());
    tokio::time::sleep(params.measure).await;
    let (c1, t1) = (counted(), Instant::now());
    counters.stop.store(true, Ordering::Relaxed);
    let secs = (t1 - t0).as_secs_f64();
    Throughput {
        msgs_per_s: (c1 - c0) as f64 / secs,
        counted: c1 - c0,
        secs,
        lost: 0,
    }
}

/// Awaits a task the run spawned, within `GRACE`; its error becomes the run's.
pub async fn join<T>(
    task: tokio::task::JoinHandle<anyhow::Result<T>>,
    what: &str,
) -> anyhow::Result<T> {
    match tokio::time::timeout(GRACE + Duration::from_secs(5), task).await {
        Ok(Ok(result)) => result.with_context(|| what.to_string()),
        Ok(Err(join_error)) => bail!("{what}: task failed: {join_error}"),
        Err(_) => bail!("{what}: did not finish in time"),
    }
}

/// Ends a run whose publishing is over: lets the subscriber catch up (only if the publisher
/// finished well), stops it, and returns what it returned with the count of messages sent but
/// never received.
pub async fn settle<T>(
    counters: &Counters,
    published: bool,
    sub_task: tokio::task::JoinHandle<anyhow::Result<T>>,
) -> anyhow::Result<(T, u64)> {
    if published {
        counters.drain().await;
    }
    counters.finish();
    let received = join(sub_task, "subscriber").await?;
    Ok((
        received,
        counters.sent().saturating_sub(counters.received()),
    ))
}

/// A fixed publish schedule: message k is due at start + k / rate. Send stamps are the
/// scheduled times, so a publisher that falls behind shows as latency (no coordinated omission).
pub struct Pacer {
    start: Instant,
    interval: Duration,
    next: u64,
    end: Instant,
}

impl Pacer {
    pub fn new(rate: u64, duration: Duration) -> Pacer {
        let start = Instant::now() + Duration::from_millis(5);
        Pacer {
            start,
            interval: Duration::from_secs_f64(1.0 / rate.max(1) as f64),
            next: 0,
            end: start + duration,
        }
    }

    /// Waits until the next message is due and returns its scheduled time, or `None` once the
    /// schedule is over. Yields first (so a client's writer task sends what was just queued),
    /// sleeps on tokio's timer for the bulk and on the thread for the rest: tokio's timer alone
    /// has a resolution of a millisecond, ten messages at 10 k msg/s.
    pub async fn tick(&mut self) -> Option<Instant> {
        let due = self.start + self.interval.mul_f64(self.next as f64);
        if due >= self.end {
            return None;
        }
        self.next += 1;
        tokio::task::yield_now().await;
        let now = Instant::now();
        if due > now + Duration::from_millis(2) {
            tokio::time::sleep_until((due - Duration::from_millis(1)).into()).await;
        }
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        Some(due)
    }
}

/// Latency of everything a subscriber receives, from send stamps; stamps before `from_ns` (the
/// warm-up) are not recorded.
pub struct LatencyRecorder {
    pub histogram: Histogram<u64>,
    pub from_ns: u64,
}

impl LatencyRecorder {
    pub fn new(from: Instant) -> LatencyRecorder {
        LatencyRecorder {
            histogram: new_histogram(),
            from_ns: stamp_of(from),
        }
    }

    pub fn record(&mut self, body: &[u8]) {
        if let Some(stamp) = read_stamp(body) {
            if stamp >= self.from_ns {
                self.histogram
                    .saturating_record(now_ns().saturating_sub(stamp).max(1));
            }
        }
    }
}

/// Runs `make()` on an OS thread of its own, in a single-threaded runtime whose sleeps end when
/// asked: the paced publisher, its client's tasks and its sleeps share that thread, like a
/// single-threaded application, and its sleeps never hold up the subscriber's runtime.
pub async fn own_thread<F, Fut, T>(name: &str, make: F) -> anyhow::Result<T>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = anyhow::Result<T>>,
    T: Send + 'static,
{
    let (done_tx, done) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            precise_sleeps();
            let result = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => {
                    let result = runtime.block_on(make());
                    // Give the client's tasks their end (closing frames) before the runtime goes.
                    runtime.shutdown_timeout(Duration::from_secs(1));
                    result
                }
                Err(error) => Err(anyhow::Error::from(error).context("cannot start a runtime")),
            };
            let _ = done_tx.send(result);
        })
        .with_context(|| format!("cannot start thread {name}"))?;
    let result = match tokio::time::timeout(RUN_MAX, done).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(anyhow::anyhow!("{name}: the thread ended without a result")),
        Err(_) => bail!("{name}: gave up after {} s", RUN_MAX.as_secs()),
    };
    if thread.is_finished() {
        let _ = thread.join();
    }
    result
}

/// Runs `f` at most [`RUN_MAX`].
pub async fn bounded<T>(
    what: &str,
    f: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(RUN_MAX, f).await {
        Ok(result) => result,
        Err(_) => bail!("{what}: gave up after {} s", RUN_MAX.as_secs()),
    }
}

/// Lets this thread's sleeps end when asked: Linux otherwise rounds a sleep up by the 50 µs
/// default timer slack, which a 10 k msg/s schedule would count as latency.
pub fn precise_sleeps() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and only affects the calling thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn stamps_round_trip() {
        let body = stamped_body(100, 123_456_789);
        assert_eq!(body.len(), 100);
        assert_eq!(read_stamp(&body), Some(123_456_789));
        assert_eq!(read_stamp(b"short"), None);
    }

    #[test]
    fn latency_medians_are_taken_per_figure() {
        let run = |p50, max| LatencyRun {
            p50_us: p50,
            p99_us: p50 * 2.0,
            p999_us: p50 * 3.0,
            max_us: max,
            count: 1,
            lost: 0,
        };
        let outcome = Outcome::Latency {
            runs: vec![run(10.0, 900.0), run(30.0, 100.0), run(20.0, 500.0)],
        };
        assert_eq!(outcome.median_latency(), Some([20.0, 40.0, 60.0, 500.0]));
        assert_eq!(outcome.median_rate(), None);
    }

    #[test]
    fn results_serialize_with_their_kind() {
        let result = ScenarioResult {
            system: "nats".into(),
            scenario: Scenario::Durable1k,
            outcome: Outcome::NotApplicable {
                reason: "why".into(),
            },
            setup: String::new(),
            caveat: None,
        };
        let line = serde_json::to_string(&result).unwrap();
        assert!(line.contains(r#""kind":"not_applicable""#), "{line}");
        assert!(line.contains(r#""scenario":"durable1k""#), "{line}");
        assert_eq!(
            serde_json::from_str::<ScenarioResult>(&line).unwrap(),
            result
        );
    }
}
