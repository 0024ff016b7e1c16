//! `ferrymq bench`: producers and consumers against a running broker, reporting throughput and
//! publish-to-deliver latency.
//!
//! Each message body starts with its send time: 8 bytes, little-endian nanoseconds since an
//! `Instant` shared by the whole process, so consumers in this process can compute latency
//! without clock synchronisation. Consumers subscribe before producers start, record latency in
//! an HDR histogram (nanosecond values, 3 significant digits) and ack each received frame with
//! one ACK of ranges.
//!
//! Hot paths: producers encode bodies straight into a PUBLISH frame (`push_body`, one stamp per
//! batch) and keep `--pipeline` batches in flight; consumers take whole DELIVER frames and touch
//! shared counters once per frame. No per-message allocation, lock or syscall.
//!
//! Bounds: the run ends when every expected message has arrived, or `--grace` after the
//! producers finished (reporting the missing ones), or on Ctrl-C. Each publish waits at most the
//! client's request timeout.
//!
//! With `--rate`, each producer follows a fixed schedule (batch k is due at start + k × interval)
//! and stamps each batch with its *scheduled* time, so a producer that falls behind shows up as
//! latency instead of hiding it (no coordinated omission).

use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use clap::{Args, ValueEnum};
use ferrymq_client::protocol::limits::{
    BATCH_COUNT_MAX, CONSUMER_CREDIT_MAX, FRAME_HEADER_BYTES, NAME_BYTES_MAX,
};
use ferrymq_client::protocol::RECORD_PREFIX_BYTES;
use ferrymq_client::{
    push_offset, DeliveryBatchExt, OverflowPolicy, PendingPublish, StartPosition, SubscribeOptions,
    TopicConfig,
};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use tokio::sync::{oneshot, watch};

use crate::client_cmds::{parse_duration, ConnectArgs, StorageArg};

/// Bytes of the send timestamp at the start of every body.
const STAMP_BYTES: usize = 8;
/// Messages per producer when neither --count nor --duration is given.
const COUNT_DEFAULT: u64 = 1_000_000;
/// Highest latency the histogram holds: an hour, in nanoseconds; larger values are clamped.
const LATENCY_NS_MAX: u64 = 3_600_000_000_000;
/// How often the main task checks whether consumers are done, and the progress bar redraws.
const POLL_INTERVAL: Duration = Duration::from_millis(5);
const PROGRESS_INTERVAL: Duration = Duration::from_millis(200);

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Consumers share one subscription (a work queue): each message is delivered once.
    Queue,
    /// Each consumer has its own subscription: each message is delivered to every consumer.
    Fanout,
}

#[derive(Args, Debug, Clone)]
#[command(
    after_help = "Examples:\n  ferrymq bench --count 1000000\n  ferrymq bench --producers 2 --consumers 2 --mode fanout --duration 10s --json\n  ferrymq bench --rate 10000 --batch 1 --duration 10s    # latency at 10 k msg/s"
)]
pub struct BenchArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Producer connections.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub producers: u32,
    /// Consumer connections (0: publish only).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=1024))]
    pub consumers: u32,
    /// Message body size in bytes (at least 8: the body carries its send time).
    #[arg(long, default_value_t = 100)]
    pub size: usize,
    /// Messages per producer [default: 1000000 when --duration is not given].
    #[arg(long, conflicts_with = "duration")]
    pub count: Option<u64>,
    /// Publish for this long instead of a fixed count (e.g. 10s, 1m).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Messages per PUBLISH frame.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=BATCH_COUNT_MAX as i64))]
    pub batch: u32,
    /// PUBLISH frames in flight per producer (awaiting their receipt).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub pipeline: u32,
    /// Partitions of the topic the bench creates.
    #[arg(long, default_value_t = 1)]
    pub partitions: u32,
    /// Total publish rate in messages per second across producers; 0 publishes flat out.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Storage of the topic the bench creates.
    #[arg(long, value_enum, default_value_t = StorageArg::Memory)]
    pub storage: StorageArg,
    /// Fsync policy of a disk topic the bench creates (always, interval:<ms>, never). Default:
    /// the server's.
    #[arg(long)]
    pub fsync: Option<ferrymq_protocol::FsyncPolicy>,
    /// How consumers share messages.
    #[arg(long, value_enum, default_value_t = Mode::Queue)]
    pub mode: Mode,
    /// Credit window per consumer.
    #[arg(long, default_value_t = 32_768, value_parser = clap::value_parser!(u32).range(1..=CONSUMER_CREDIT_MAX as i64))]
    pub credit: u32,
    /// Subscribe with auto-ack instead of acking each received frame.
    #[arg(long)]
    pub no_ack: bool,
    /// Publish without receipts (request id 0, at-most-once like a NATS core publish): producers
    /// await nothing; refusals still come back as errors and fail the run.
    #[arg(long)]
    pub no_confirm: bool,
    /// How long consumers let acks wait for other frames before writing them (0: at once).
    #[arg(long, default_value = "1ms", value_parser = parse_duration)]
    pub ack_flush_delay: Duration,
    /// Topic to use [default: a fresh name, deleted afterwards].
    #[arg(long)]
    pub topic: Option<String>,
    /// Spread the producers' batches over this many topics (`<topic>-0` ... `<topic>-N-1`),
    /// to compare publishing to many topics with publishing to one; publish only (--consumers 0).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub topics: u32,
    /// Bound the topics the bench creates to this many messages in total, split evenly across
    /// --topics (drop-oldest beyond it), so runs with 1 and with many topics hold the same
    /// backlog [default: the server's per-topic default].
    #[arg(long)]
    pub max_messages_total: Option<u64>,
    /// Messages the producers may be ahead of the consumers before they wait
    /// [default: 1 000 000, or 128 MiB of messages if less]. Keeps a flat-out run at the rate the
    /// consumers sustain instead of filling the topic until its overflow policy drops messages.
    #[arg(long)]
    pub max_lead: Option<u64>,
    /// How long to wait for outstanding deliveries after the producers finish.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub grace: Duration,
    /// Print exactly one JSON object on stdout and no progress bar.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.size < STAMP_BYTES {
        bail!("--size must be at least {STAMP_BYTES} bytes: every body carries its send time");
    }
    if args.duration.is_some_and(|d| d.is_zero()) || args.count == Some(0) {
        bail!("--count and --duration must be above zero");
    }
    if args.topics > 1 && args.consumers > 0 {
        bail!("--topics measures publishing only: add --consumers 0");
    }
    if args
        .topic
        .as_ref()
        .is_some_and(|t| t.is_empty() || t.len() > NAME_BYTES_MAX)
    {
        bail!("--topic must be 1..={NAME_BYTES_MAX} bytes");
    }
    // Producers and consumers run on threads of their own (see `Role`); this runtime only
    // orchestrates and draws progress.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let report = runtime.block_on(bench(args.clone()))?;
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string(&report.to_json(&args))?)?;
    } else {
        report.write_text(&args, &mut out)?;
    }
    out.flush()?;
    // The numbers are printed either way; the exit status tells scripts the run was not clean.
    if let Some(error) = report.first_error {
        bail!("the run did not complete cleanly: {error}");
    }
    Ok(())
}

/// Counters shared by the tasks of one run. Touched once per frame, never per message.
struct Shared {
    clock: Instant,
    published: AtomicU64,
    publish_failed: AtomicU64,
    delivered: AtomicU64,
    redelivered: AtomicU64,
    /// Nanoseconds since `clock` of the latest delivery seen by any consumer.
    last_delivery_ns: AtomicU64,
    stop_producers: AtomicBool,
    /// The first error of the run, for the report; later ones add nothing a user can act on.
    first_error: Mutex<Option<String>>,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.clock.elapsed().as_nanos() as u64
    }

    fn record_error(&self, text: String) {
        self.first_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get_or_insert(text);
    }

    fn first_error(&self) -> Option<String> {
        self.first_error
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

struct Report {
    topic: String,
    published: u64,
    publish_failed: u64,
    expected: u64,
    delivered: u64,
    redelivered: u64,
    producer_elapsed: Duration,
    consumer_elapsed: Duration,
    latency: Histogram<u64>,
    interrupted: bool,
    first_error: Option<String>,
}

async fn bench(args: BenchArgs) -> anyhow::Result<Report> {
    let shared = Arc::new(Shared {
        clock: Instant::now(),
        published: AtomicU64::new(0),
        publish_failed: AtomicU64::new(0),
        delivered: AtomicU64::new(0),
        redelivered: AtomicU64::new(0),
        last_delivery_ns: AtomicU64::new(0),
        stop_producers: AtomicBool::new(false),
        first_error: Mutex::new(None),
    });
    let run_id = format!(
        "{}-{}",
        std::process::id(),
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0)
    );
    let fresh_topic = args.topic.is_none();
    let topic = args
        .topic
        .clone()
        .unwrap_or_else(|| format!("bench-{run_id}"));

    let admin = args.connect.connect("bench").await?;
    let frame_bytes = FRAME_HEADER_BYTES
        + 2
        + topic.len()
        + 8
        + args.batch as usize * (RECORD_PREFIX_BYTES + args.size);
    let frame_bytes_max = admin.server_info().frame_bytes_max as usize;
    if frame_bytes > frame_bytes_max {
        bail!(
            "a batch of {} messages of {} B is {frame_bytes} bytes, above the server's frame limit of \
             {frame_bytes_max}: lower --batch or --size",
            args.batch,
            args.size
        );
    }
    if args.size > admin.server_info().message_bytes_max as usize {
        bail!(
            "--size {} is above the server's message limit of {} bytes",
            args.size,
            admin.server_info().message_bytes_max
        );
    }
    let config = TopicConfig {
        partitions: args.partitions,
        storage: args.storage.into(),
        overflow: OverflowPolicy::DropOldest,
        max_messages: args.max_messages_total.map_or(0, |total| {
            (total / args.topics as u64).max(args.partitions as u64)
        }),
        max_bytes: 0,
        fsync: args.fsync.unwrap_or_default(),
        retention_ms: 0,
    };
    let topics: Arc<Vec<String>> = Arc::new(match args.topics {
        1 => vec![topic.clone()],
        n => (0..n).map(|i| format!("{topic}-{i}")).collect(),
    });
    for name in topics.iter() {
        admin
            .create_topic(name, config.clone(), true)
            .await
            .with_context(|| format!("cannot create topic {name}"))?;
    }

    let subscription_name = match args.mode {
        Mode::Queue => format!("bench-{run_id}"),
        Mode::Fanout => String::new(),
    };
    let outcome = run_roles(&args, &topics, &subscription_name, &shared).await;

    // Leave the broker as we found it, whatever happened.
    if !subscription_name.is_empty() && args.consumers > 0 {
        let _ = admin.delete_subscription(&topic, &subscription_name).await;
    }
    if fresh_topic {
        for name in topics.iter() {
            let _ = admin.delete_topic(name).await;
        }
    }
    let _ = admin.close().await;
    let outcome = outcome?;

    let published = shared.published.load(Ordering::Relaxed);
    let last_ns = shared.last_delivery_ns.load(Ordering::Relaxed);
    Ok(Report {
        topic,
        published,
        publish_failed: shared.publish_failed.load(Ordering::Relaxed),
        expected: outcome.expected,
        delivered: shared.delivered.load(Ordering::Relaxed),
        redelivered: shared.redelivered.load(Ordering::Relaxed),
        producer_elapsed: outcome.producer_elapsed,
        consumer_elapsed: Duration::from_nanos(last_ns.saturating_sub(outcome.start_ns)),
        latency: outcome.latency,
        interrupted: outcome.interrupted,
        first_error: shared.first_error(),
    })
}

struct RunOutcome {
    start_ns: u64,
    producer_elapsed: Duration,
    expected: u64,
    latency: Histogram<u64>,
    interrupted: bool,
}

/// Starts consumers (subscribed before anything is published), then producers, waits for the
/// producers, then for the deliveries, and collects the consumers' histograms.
async fn run_roles(
    args: &BenchArgs,
    topics: &Arc<Vec<String>>,
    subscription_name: &str,
    shared: &Arc<Shared>,
) -> anyhow::Result<RunOutcome> {
    let (stop_consumers, stop_rx) = watch::channel(false);
    // Stops whatever was started when this function returns early.
    let _stop_on_exit = StopOnDrop(&stop_consumers, shared);
    let mut consumer_counts = Vec::new();
    let mut consumers = Vec::new();
    for index in 0..args.consumers {
        let options = SubscribeOptions::new(topics[0].clone())
            .subscription(subscription_name.to_string())
            .start(StartPosition::Latest)
            .credit(args.credit)
            .auto_ack(args.no_ack);
        let count = Arc::new(AtomicU64::new(0));
        consumer_counts.push(count.clone());
        let (ready, is_ready) = oneshot::channel();
        let role = Role::spawn(format!("bench-consumer-{index}"), {
            let connect = args.connect.clone();
            let shared = shared.clone();
            let stop = stop_rx.clone();
            let ack_flush_delay = args.ack_flush_delay;
            move || {
                consume(
                    connect,
                    options,
                    shared,
                    count,
                    stop,
                    ready,
                    ack_flush_delay,
                )
            }
        })?;
        if is_ready.await.is_err() {
            return Err(role
                .finish()
                .await
                .err()
                .unwrap_or_else(|| anyhow!("a consumer stopped before subscribing")));
        }
        consumers.push(role);
    }

    let count_per_producer = args
        .duration
        .is_none()
        .then(|| args.count.unwrap_or(COUNT_DEFAULT));
    let (go, go_rx) = watch::channel(None::<Instant>);
    let mut producers = Vec::new();
    for index in 0..args.producers {
        let job = ProducerJob {
            topics: topics.clone(),
            first_topic: index as usize,
            max_lead: (args.consumers > 0).then(|| {
                args.max_lead.unwrap_or_else(|| {
                    let per_message = (args.size + RECORD_PREFIX_BYTES + 64) as u64;
                    (128 * 1024 * 1024 / per_message).clamp(1, 1_000_000)
                })
            }),
            fanout: match args.mode {
                Mode::Queue => 1,
                Mode::Fanout => args.consumers as u64,
            },
            unconfirmed: args.no_confirm,
            batch_interval: (args.rate > 0).then(|| {
                Duration::from_secs_f64(
                    args.batch as f64 * args.producers as f64 / args.rate as f64,
                )
            }),
            count: count_per_producer,
            duration: args.duration,
            batch: args.batch,
            pipeline: args.pipeline as usize,
            size: args.size,
        };
        let (ready, is_ready) = oneshot::channel();
        let role = Role::spawn(format!("bench-producer-{index}"), {
            let connect = args.connect.clone();
            let shared = shared.clone();
            let go = go_rx.clone();
            move || produce(connect, job, shared, ready, go)
        })?;
        if is_ready.await.is_err() {
            return Err(role
                .finish()
                .await
                .err()
                .unwrap_or_else(|| anyhow!("a producer stopped before connecting")));
        }
        producers.push(role);
    }

    let fanout = match args.mode {
        Mode::Queue => 1,
        Mode::Fanout => args.consumers as u64,
    };
    let to_publish = count_per_producer.map(|n| n * args.producers as u64);
    let progress = Progress::start(
        args,
        to_publish.map(|n| if args.consumers > 0 { n * fanout } else { n }),
        shared.clone(),
    );

    let start = Instant::now();
    let start_ns = shared.now_ns();
    go.send_replace(Some(start));

    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(interrupt);
    let mut interrupted = false;
    // Bounded: producers stop by count or duration, each publish within the request timeout.
    for producer in producers {
        let finished = producer.finish();
        tokio::pin!(finished);
        let result = tokio::select! {
            result = &mut finished => result,
            _ = &mut interrupt, if !interrupted => {
                interrupted = true;
                shared.stop_producers.store(true, Ordering::Relaxed);
                finished.await
            }
        };
        if let Err(error) = result {
            shared.record_error(format!("producer: {error:#}"));
        }
    }
    let producer_elapsed = start.elapsed();

    // Wait for the deliveries: until everything published has arrived, or the grace period ends.
    let published = shared.published.load(Ordering::Relaxed);
    let expected = if args.consumers == 0 {
        0
    } else {
        published * fanout
    };
    let grace_end = Instant::now() + args.grace;
    // Bounded by the grace period.
    while !interrupted && Instant::now() < grace_end {
        let done = match args.mode {
            Mode::Queue => shared.delivered.load(Ordering::Relaxed) >= expected,
            Mode::Fanout => consumer_counts
                .iter()
                .all(|count| count.load(Ordering::Relaxed) >= published),
        };
        if done {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL_INTERVAL) => {}
            _ = &mut interrupt => interrupted = true,
        }
    }
    stop_consumers.send_replace(true);
    let mut latency = new_histogram()?;
    for consumer in consumers {
        match consumer.finish().await {
            Ok(histogram) => latency
                .add(histogram)
                .context("merging latency histograms")?,
            Err(error) => shared.record_error(format!("consumer: {error:#}")),
        }
    }
    progress.finish();
    Ok(RunOutcome {
        start_ns,
        producer_elapsed,
        expected,
        latency,
        interrupted,
    })
}

/// Tells consumers and producers to stop when the run ends early (an error or `?`).
struct StopOnDrop<'a>(&'a watch::Sender<bool>, &'a Shared);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.send_replace(true);
        self.1.stop_producers.store(true, Ordering::Relaxed);
    }
}

/// One producer or consumer: an OS thread running a single-threaded runtime, so that a client's
/// tasks and the loop using them share one thread (no cross-thread wake-ups on the hot path),
/// like a single-threaded application would.
struct Role<T> {
    thread: std::thread::JoinHandle<()>,
    done: oneshot::Receiver<anyhow::Result<T>>,
}

impl<T: Send + 'static> Role<T> {
    fn spawn<F, Fut>(name: String, make: F) -> anyhow::Result<Role<T>>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = anyhow::Result<T>>,
    {
        let (done_tx, done) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                precise_sleeps();
                let result = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(make()),
                    Err(error) => Err(anyhow::Error::from(error).context("cannot start a runtime")),
                };
                let _ = done_tx.send(result);
            })
            .with_context(|| format!("cannot start thread {name}"))?;
        Ok(Role { thread, done })
    }

    async fn finish(self) -> anyhow::Result<T> {
        let result = self
            .done
            .await
            .unwrap_or_else(|_| Err(anyhow!("the thread ended without a result (panic)")));
        // The thread has sent its result and only drops its runtime now.
        let thread = self.thread;
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        result
    }
}

fn new_histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).context("creating the latency histogram")
}

struct ProducerJob {
    /// Topics to publish to, one batch each in turn (starting at an offset per producer).
    topics: Arc<Vec<String>>,
    first_topic: usize,
    /// Most messages this run may have published and not yet delivered (per subscription).
    max_lead: Option<u64>,
    fanout: u64,
    /// With `--rate`: time between this producer's batches.
    batch_interval: Option<Duration>,
    /// Publish with request id 0 and await no receipts.
    unconfirmed: bool,
    /// Messages to send, or `None` to send for `duration`.
    count: Option<u64>,
    duration: Option<Duration>,
    batch: u32,
    pipeline: usize,
    size: usize,
}

async fn produce(
    connect: ConnectArgs,
    job: ProducerJob,
    shared: Arc<Shared>,
    ready: oneshot::Sender<()>,
    mut go: watch::Receiver<Option<Instant>>,
) -> anyhow::Result<()> {
    let client = connect.connect("bench-producer").await?;
    let _ = ready.send(());
    let start = match go.wait_for(|start| start.is_some()).await {
        Ok(start) => start.unwrap_or_else(Instant::now),
        Err(_) => return Ok(()), // the run was abandoned before it started
    };
    let end = job.duration.map(|d| start + d);
    let mut body = vec![b'x'; job.size];
    let mut in_flight: VecDeque<PendingPublish> = VecDeque::with_capacity(job.pipeline);
    let mut sent = 0u64;
    let mut batches = 0usize;
    // Bounded by --count or --duration (or Ctrl-C); every await below is bounded in time.
    loop {
        let n = match job.count {
            Some(count) if sent >= count => break,
            Some(count) => (count - sent).min(job.batch as u64) as u32,
            None => job.batch,
        };
        if end.is_some_and(|end| Instant::now() >= end)
            || shared.stop_producers.load(Ordering::Relaxed)
        {
            break;
        }
        if in_flight.len() >= job.pipeline {
            if let Some(oldest) = in_flight.pop_front() {
                settle(oldest, &shared).await?;
            }
        }
        if let Some(max_lead) = job.max_lead {
            // Bounded: consumers either catch up or the run is stopped (duration, Ctrl-C).
            while shared.published.load(Ordering::Relaxed)
                > shared.delivered.load(Ordering::Relaxed) / job.fanout + max_lead
                && !shared.stop_producers.load(Ordering::Relaxed)
                && end.is_none_or(|end| Instant::now() < end)
            {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        // The stamp is the batch's scheduled time when paced, else the moment it is built.
        let stamp_ns = match job.batch_interval {
            Some(interval) => {
                let due = start + interval.mul_f64(batches as f64);
                if !wait_until(due, end).await {
                    break;
                }
                due.saturating_duration_since(shared.clock).as_nanos() as u64
            }
            None => shared.now_ns(),
        };
        let topic = &job.topics[(job.first_topic + batches) % job.topics.len()];
        batches += 1;
        let mut encoder = if job.unconfirmed {
            client.unconfirmed_encoder(topic, None)?
        } else {
            client.publish_encoder(topic, None)?
        };
        body[..STAMP_BYTES].copy_from_slice(&stamp_ns.to_le_bytes());
        for _ in 0..n {
            encoder.push_body(None, 0, &body);
        }
        if job.unconfirmed {
            client
                .send_unconfirmed(encoder.finish())
                .await
                .context("publishing")?;
            shared.published.fetch_add(n as u64, Ordering::Relaxed);
            sent += n as u64;
            continue;
        }
        let pending = client
            .send_encoded(encoder.finish())
            .await
            .context("publishing")?;
        in_flight.push_back(pending);
        sent += n as u64;
    }
    while let Some(pending) = in_flight.pop_front() {
        settle(pending, &shared).await?;
    }
    if job.unconfirmed {
        // A round trip makes sure the server has read every unconfirmed publish before we look
        // for refusals.
        client
            .ping()
            .await
            .context("confirming unconfirmed publishes")?;
        if let Some(error) = client.last_async_error() {
            shared.record_error(format!(
                "{} unconfirmed publish(es) refused, last: {error}",
                client.async_error_count()
            ));
        }
    }
    let _ = client.close().await;
    Ok(())
}

/// Waits for one receipt; a refused batch is counted and the run goes on, a lost connection
/// ends this producer.
async fn settle(pending: PendingPublish, shared: &Shared) -> anyhow::Result<()> {
    let count = pending.count() as u64;
    match pending.await {
        Ok(receipt) => {
            shared
                .published
                .fetch_add(receipt.len() as u64, Ordering::Relaxed);
            Ok(())
        }
        Err(error) if error.is_connection_error() => {
            Err(error).context("connection lost while publishing")
        }
        Err(error) => {
            shared.publish_failed.fetch_add(count, Ordering::Relaxed);
            shared.record_error(format!("publish refused: {error}"));
            Ok(())
        }
    }
}

async fn consume(
    connect: ConnectArgs,
    options: SubscribeOptions,
    shared: Arc<Shared>,
    count: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
    ready: oneshot::Sender<()>,
    ack_flush_delay: Duration,
) -> anyhow::Result<Histogram<u64>> {
    let client = ferrymq_client::Client::connect_with(
        connect
            .config("bench-consumer")
            .ack_flush_delay(ack_flush_delay),
    )
    .await
    .with_context(|| format!("cannot connect to FerryMQ at {}", connect.addr))?;
    let topic = options.topic.clone();
    let mut subscription = client
        .subscribe(options)
        .await
        .with_context(|| format!("cannot subscribe to {topic}"))?;
    let _ = ready.send(());
    let mut latency = new_histogram()?;
    let mut ranges = Vec::with_capacity(64);
    let auto_ack = subscription.auto_ack();
    // Bounded by the stop signal, which the main task sends at the latest after the grace period.
    loop {
        let next = tokio::select! {
            biased;
            _ = stop.wait_for(|stopped| *stopped) => break,
            next = subscription.next_batch() => next,
        };
        let batch = match next {
            None => break,
            Some(Ok(batch)) => batch,
            Some(Err(error)) if error.is_connection_error() => {
                return Err(error).context("connection lost while consuming")
            }
            Some(Err(error)) => {
                shared.record_error(format!("consumer: {error}"));
                continue;
            }
        };
        let now_ns = shared.now_ns();
        let mut redelivered = 0u64;
        // Borrowed views: no per-message allocation or reference counting. Messages of one
        // publish frame share a stamp, so latency is recorded once per run of equal stamps.
        let mut run: Option<(u64, u64)> = None;
        for delivery in batch.views() {
            if let Some(stamp) = delivery.body.first_chunk::<STAMP_BYTES>() {
                let sent = u64::from_le_bytes(*stamp);
                run = match run {
                    Some((stamp, count)) if stamp == sent => Some((stamp, count + 1)),
                    Some((stamp, count)) => {
                        latency.saturating_record_n(now_ns.saturating_sub(stamp).max(1), count);
                        Some((sent, 1))
                    }
                    None => Some((sent, 1)),
                };
            }
            if delivery.attempt > 1 {
                redelivered += 1;
            }
            if !auto_ack {
                push_offset(&mut ranges, delivery.partition, delivery.offset);
            }
        }
        if let Some((stamp, count)) = run {
            latency.saturating_record_n(now_ns.saturating_sub(stamp).max(1), count);
        }
        if !ranges.is_empty() {
            subscription.ack_ranges(&ranges).await?;
            ranges.clear();
        }
        let n = batch.count() as u64;
        count.fetch_add(n, Ordering::Relaxed);
        shared.delivered.fetch_add(n, Ordering::Relaxed);
        shared.last_delivery_ns.fetch_max(now_ns, Ordering::Relaxed);
        if redelivered > 0 {
            shared.redelivered.fetch_add(redelivered, Ordering::Relaxed);
        }
    }
    let _ = subscription.close().await;
    let _ = client.close().await;
    Ok(latency)
}

/// Lets this thread's sleeps end when asked: Linux otherwise rounds a sleep up by the 50 µs
/// default timer slack, which a 10 k msg/s schedule would count as latency.
fn precise_sleeps() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and only affects the calling thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
}

/// Waits until `due` (or returns false at `end`). The wait first yields, so the client's writer
/// sends what was just queued; then sleeps on tokio's millisecond timer for the bulk and on the OS
/// thread for the rest: this runtime is the producer's own, and tokio's timer alone is too coarse
/// for one message every 100 µs.
async fn wait_until(due: Instant, end: Option<Instant>) -> bool {
    tokio::task::yield_now().await;
    if end.is_some_and(|end| due >= end) {
        return false;
    }
    let now = Instant::now();
    if due <= now {
        return true;
    }
    let wait = due - now;
    if wait > Duration::from_millis(2) {
        tokio::time::sleep(wait - Duration::from_millis(1)).await;
    }
    let now = Instant::now();
    if due > now {
        std::thread::sleep(due - now);
    }
    true
}

/// The progress bar on stderr, redrawn from the shared counters by its own task.
struct Progress {
    bar: ProgressBar,
    done: Arc<AtomicBool>,
}

impl Progress {
    fn start(args: &BenchArgs, total: Option<u64>, shared: Arc<Shared>) -> Progress {
        let hidden = args.json || !std::io::stderr().is_terminal();
        let done = Arc::new(AtomicBool::new(false));
        if hidden {
            return Progress {
                bar: ProgressBar::hidden(),
                done,
            };
        }
        let length = match (total, args.duration) {
            (Some(total), _) => total,
            (None, Some(duration)) => duration.as_millis() as u64,
            (None, None) => 0,
        };
        let bar =
            ProgressBar::with_draw_target(Some(length), ProgressDrawTarget::stderr_with_hz(5));
        if let Ok(style) =
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {msg}")
        {
            bar.set_style(style);
        }
        let by_count = total.is_some();
        let consumers = args.consumers > 0;
        let started = Instant::now();
        tokio::spawn({
            let bar = bar.clone();
            let done = done.clone();
            async move {
                let mut last = (Instant::now(), 0u64, 0u64);
                // Bounded by `done`, set when the run ends.
                while !done.load(Ordering::Relaxed) {
                    tokio::time::sleep(PROGRESS_INTERVAL).await;
                    let published = shared.published.load(Ordering::Relaxed);
                    let delivered = shared.delivered.load(Ordering::Relaxed);
                    let seconds = last.0.elapsed().as_secs_f64().max(1e-3);
                    let publish_rate = (published - last.1) as f64 / seconds;
                    let deliver_rate = (delivered - last.2) as f64 / seconds;
                    last = (Instant::now(), published, delivered);
                    bar.set_position(match (by_count, consumers) {
                        (true, true) => delivered,
                        (true, false) => published,
                        (false, _) => started.elapsed().as_millis() as u64,
                    });
                    bar.set_message(format!(
                        "published {published} ({}/s)  delivered {delivered} ({}/s)",
                        human_count(publish_rate),
                        human_count(deliver_rate)
                    ));
                }
            }
        });
        Progress { bar, done }
    }

    fn finish(self) {
        self.done.store(true, Ordering::Relaxed);
        self.bar.finish_and_clear();
    }
}

fn human_count(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.2} M", value / 1e6)
    } else if value >= 1e3 {
        format!("{:.1} k", value / 1e3)
    } else {
        format!("{value:.0}")
    }
}

fn per_second(count: u64, elapsed: Duration) -> f64 {
    let seconds = elapsed.as_secs_f64();
    if seconds > 0.0 {
        count as f64 / seconds
    } else {
        0.0
    }
}

const QUANTILES: [(&str, f64); 6] = [
    ("p50", 0.50),
    ("p90", 0.90),
    ("p95", 0.95),
    ("p99", 0.99),
    ("p99.9", 0.999),
    ("p99.99", 0.9999),
];

impl Report {
    fn missing(&self) -> u64 {
        self.expected
            .saturating_sub(self.delivered.saturating_sub(self.redelivered))
    }

    fn latency_us(&self, quantile: f64) -> f64 {
        self.latency.value_at_quantile(quantile) as f64 / 1000.0
    }

    fn to_json(&self, args: &BenchArgs) -> serde_json::Value {
        let size = args.size as f64;
        let producer_rate = per_second(self.published, self.producer_elapsed);
        let consumer_rate = per_second(self.delivered, self.consumer_elapsed);
        let mut latency = serde_json::Map::new();
        latency.insert("samples".into(), json!(self.latency.len()));
        if !self.latency.is_empty() {
            latency.insert("min".into(), json!(self.latency.min() as f64 / 1000.0));
            latency.insert("mean".into(), json!(self.latency.mean() / 1000.0));
            for (name, quantile) in QUANTILES {
                latency.insert(name.replace('.', "_"), json!(self.latency_us(quantile)));
            }
            latency.insert("max".into(), json!(self.latency.max() as f64 / 1000.0));
        }
        json!({
            "topic": self.topic,
            "topics": args.topics,
            "mode": match args.mode { Mode::Queue => "queue", Mode::Fanout => "fanout" },
            "storage": match args.storage { StorageArg::Memory => "memory", StorageArg::Disk => "disk" },
            "producers": args.producers,
            "consumers": args.consumers,
            "size": args.size,
            "batch": args.batch,
            "pipeline": args.pipeline,
            "partitions": args.partitions,
            "rate": args.rate,
            "credit": args.credit,
            "auto_ack": args.no_ack,
            "published": self.published,
            "publish_failed": self.publish_failed,
            "expected": self.expected,
            "delivered": self.delivered,
            "redelivered": self.redelivered,
            "missing": self.missing(),
            "interrupted": self.interrupted,
            "error": self.first_error,
            "producer": {
                "elapsed_s": self.producer_elapsed.as_secs_f64(),
                "msgs_per_s": producer_rate,
                "mb_per_s": producer_rate * size / 1e6,
            },
            "consumer": {
                "elapsed_s": self.consumer_elapsed.as_secs_f64(),
                "msgs_per_s": consumer_rate,
                "mb_per_s": consumer_rate * size / 1e6,
            },
            "latency_us": latency,
        })
    }

    fn write_text(&self, args: &BenchArgs, out: &mut impl Write) -> std::io::Result<()> {
        let size = args.size as f64;
        writeln!(
            out,
            "topic {} ({}, {} partition{}), {} mode, {} producer{}, {} consumer{}, {} B messages, batch {}, pipeline {}{}",
            self.topic,
            match args.storage {
                StorageArg::Memory => "memory",
                StorageArg::Disk => "disk",
            },
            args.partitions,
            if args.partitions == 1 { "" } else { "s" },
            match args.mode {
                Mode::Queue => "queue",
                Mode::Fanout => "fanout",
            },
            args.producers,
            if args.producers == 1 { "" } else { "s" },
            args.consumers,
            if args.consumers == 1 { "" } else { "s" },
            args.size,
            args.batch,
            args.pipeline,
            if args.rate > 0 { format!(", rate {} msg/s", args.rate) } else { String::new() },
        )?;
        let mut rate_line = |label: &str, count: u64, elapsed: Duration| {
            let rate = per_second(count, elapsed);
            writeln!(
                out,
                "{label:<9} {count:>12} msgs in {:>8.3} s  {rate:>12.0} msg/s  {:>9.1} MB/s",
                elapsed.as_secs_f64(),
                rate * size / 1e6
            )
        };
        rate_line("published", self.published, self.producer_elapsed)?;
        if args.consumers > 0 {
            rate_line("delivered", self.delivered, self.consumer_elapsed)?;
        }
        if self.publish_failed > 0 {
            writeln!(out, "refused   {:>12} msgs", self.publish_failed)?;
        }
        if self.missing() > 0 {
            writeln!(
                out,
                "missing   {:>12} of {} expected deliveries (not delivered within the {:?} grace period)",
                self.missing(),
                self.expected,
                args.grace
            )?;
        }
        if self.redelivered > 0 {
            writeln!(out, "redelivered {:>10} msgs", self.redelivered)?;
        }
        if !self.latency.is_empty() {
            let mut line = String::from("latency µs");
            for (name, quantile) in QUANTILES {
                line.push_str(&format!("  {name} {:.1}", self.latency_us(quantile)));
            }
            line.push_str(&format!("  max {:.1}", self.latency.max() as f64 / 1000.0));
            writeln!(out, "{line}")?;
        }
        if self.interrupted {
            writeln!(out, "interrupted: the numbers cover the run until Ctrl-C")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wait_until_keeps_a_schedule_and_stops_at_the_end() {
        let start = Instant::now();
        let interval = Duration::from_micros(500);
        for k in 0..200u32 {
            assert!(wait_until(start + interval * k, None).await);
        }
        let elapsed = start.elapsed();
        // 200 slots of 0.5 ms: at least 99.5 ms, and not far behind on a slow machine.
        assert!(
            elapsed >= interval * 199 && elapsed < Duration::from_millis(400),
            "{elapsed:?}"
        );
        let end = Instant::now() + Duration::from_millis(5);
        assert!(!wait_until(end + Duration::from_millis(1), Some(end)).await);
    }

    #[test]
    fn missing_counts_first_deliveries_only() {
        let report = Report {
            topic: "t".into(),
            published: 10,
            publish_failed: 0,
            expected: 10,
            delivered: 9,
            redelivered: 2,
            producer_elapsed: Duration::from_secs(1),
            consumer_elapsed: Duration::from_secs(1),
            latency: new_histogram().unwrap(),
            interrupted: false,
            first_error: None,
        };
        assert_eq!(report.missing(), 3);
    }
}
