//! `ferrymq bench`: producers and consumers against a running broker, reporting throughput and
//! publish-to-deliver latency.
//!
//! Each message body starts with its send time: 8 bytes, little-endian nanoseconds since an
//! `Instant` shared by the whole process, so consumers in this process can compute latency
//! without clock synchronisation. Consumers subscribe before producers start, record latency in
//! an HDR histogram (nanosecond values, 3 significant digits) and ack each received frame with
//! one ACK of ranges (or, with `--ack-each`, make one ack call per message, which the client
//! merges into the ACK frame it has open).
//!
//! With `--preload N` the run has two phases: the producers publish N messages into a queue
//! subscription that exists but has no consumer (the bench creates it and leaves it), and wait
//! for every receipt; then the consumers connect, start together, and drain it. The consume phase
//! ends when every preloaded message has been delivered and each consumer's last ack has been
//! confirmed by the broker (a confirmed ACK, answered after the acks before it on the connection
//! were applied, and on a disk topic saved), so its rate counts receiving *and* acking.
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
    push_offset, DeliveryBatchExt, OffsetRange, OverflowPolicy, PendingPublish, StartPosition,
    SubscribeOptions, TopicConfig,
};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use tokio::sync::{oneshot, watch};

use crate::cmd::{parse_duration, ConnectArgs, StorageArg};

/// Bytes of the send timestamp at the start of every body.
const STAMP_BYTES: usize = 8;
/// Messages per producer when neither --count nor --duration is given.
const COUNT_DEFAULT: u64 = 1_000_000;
/// Highest latency the histogram holds: an hour, in nanoseconds; larger values are clamped.
const LATENCY_NS_MAX: u64 = 3_600_000_000_000;
/// How often the main task checks whether consumers are done, and the progress bar redraws.
const POLL_INTERVAL: Duration = Duration::from_millis(5);
const PROGRESS_INTERVAL: Duration = Duration::from_millis(200);
/// Longest consume phase of a --preload run, whatever the progress.
const CONSUME_PHASE_MAX: Duration = Duration::from_secs(3600);

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
    /// Subscribe with auto-ack (messages count as acked when sent) instead of acking. By default
    /// consumers ack each received DELIVER frame with one ACK call listing its offsets as ranges.
    #[arg(long)]
    pub no_ack: bool,
    /// Ack with one call per message (`ack_ranges` of one offset) instead of one call per received
    /// DELIVER frame listing its offsets as ranges. Either way acks are fire-and-forget and the
    /// client merges consecutive ones into the ACK frame it has open, so they are pipelined; this
    /// measures the per-message ack API an application would use.
    #[arg(long, conflicts_with = "no_ack")]
    pub ack_each: bool,
    /// Consumers subscribe with an ordered subscription: at most one message per key in flight
    /// across them (key-less messages: one per partition). Needs acks (not with --no-ack).
    #[arg(long, conflicts_with = "no_ack")]
    pub ordered: bool,
    /// Give messages the keys k0, k1, ... k{N-1}, in turn (each producer from k0), so that with
    /// several partitions they spread by key hash and --ordered has N keys to order.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub keys: Option<u64>,
    /// Pre-load the queue: producers publish N messages in total (confirmed) before any consumer
    /// starts, and the run waits for every receipt; then the consumers drain the queue. Reports
    /// the preload phase's publish rate and the consume phase's rate separately (the consume
    /// phase ends when all N were delivered and the consumers' acks confirmed). Queue mode only;
    /// not with --count, --duration, --rate or --no-confirm.
    #[arg(long, conflicts_with_all = ["count", "duration"], value_parser = clap::value_parser!(u64).range(1..))]
    pub preload: Option<u64>,
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
    /// How long to wait for outstanding deliveries after the producers finish (with --preload:
    /// how long the consume phase may go without a delivery before it is given up).
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
    if args.preload.is_some() {
        if args.consumers == 0 {
            bail!(
                "--preload measures consuming a pre-loaded queue: it needs --consumers 1 or more"
            );
        }
        if args.mode != Mode::Queue {
            bail!("--preload fills one shared subscription: use it with --mode queue");
        }
        if args.rate > 0 {
            bail!("--preload publishes flat out before consumers start: drop --rate");
        }
        if args.no_confirm {
            bail!("--preload waits for every publish to be acknowledged: drop --no-confirm");
        }
    }
    if args.ordered && args.no_ack {
        bail!("--ordered needs acks (a key's next message waits for the ack): drop --no-ack");
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
    /// Deliveries that were a message's first attempt.
    first_delivered: AtomicU64,
    redelivered: AtomicU64,
    /// Nanoseconds since `clock` of the latest delivery seen by any consumer.
    last_delivery_ns: AtomicU64,
    /// With --preload: nanoseconds since `clock` when the last consumer's final confirmed ack
    /// was answered (0: none was sent).
    acks_confirmed_ns: AtomicU64,
    /// With --preload: consumers whose final confirmed ack failed.
    ack_confirm_failures: AtomicU64,
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
    /// Until the last delivery; with --preload, from the consumers' start until the last
    /// delivery and the confirmation of the consumers' acks, whichever came later.
    consumer_elapsed: Duration,
    /// With --preload: from the consumers' start until the last delivery.
    consume_received: Option<Duration>,
    /// With --preload: every consumer that acked got its final confirmed ack answered.
    acks_confirmed: bool,
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
        first_delivered: AtomicU64::new(0),
        redelivered: AtomicU64::new(0),
        last_delivery_ns: AtomicU64::new(0),
        acks_confirmed_ns: AtomicU64::new(0),
        ack_confirm_failures: AtomicU64::new(0),
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
        + args.batch as usize
            * (RECORD_PREFIX_BYTES + args.size + args.keys.map_or(0, |n| key_len(n - 1)));
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
        retention_policy: Default::default(),
        dedup_window_ms: 0,
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
    let outcome = match args.preload {
        // The queue's subscription exists before the preload (from its latest offset, so a
        // --topic that already holds messages is fine) and keeps what is published into it while
        // it has no consumer.
        Some(_) => match admin
            .subscribe(
                SubscribeOptions::new(topic.clone())
                    .subscription(subscription_name.clone())
                    .start(StartPosition::Latest)
                    .credit(1)
                    .ordered(args.ordered),
            )
            .await
        {
            Ok(subscription) => match subscription.close().await {
                Ok(()) => run_roles(&args, &topics, &subscription_name, &shared).await,
                Err(error) => Err(anyhow::Error::from(error)
                    .context(format!("cannot leave subscription {subscription_name}"))),
            },
            Err(error) => Err(anyhow::Error::from(error).context(format!(
                "cannot create subscription {subscription_name} on {topic}"
            ))),
        },
        None => run_roles(&args, &topics, &subscription_name, &shared).await,
    };

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
    let consume_received = outcome
        .consume_start_ns
        .map(|start| Duration::from_nanos(last_ns.saturating_sub(start)));
    let consumer_elapsed = match outcome.consume_start_ns {
        Some(start) => Duration::from_nanos(
            last_ns
                .max(shared.acks_confirmed_ns.load(Ordering::Relaxed))
                .saturating_sub(start),
        ),
        None => Duration::from_nanos(last_ns.saturating_sub(outcome.start_ns)),
    };
    Ok(Report {
        topic,
        published,
        publish_failed: shared.publish_failed.load(Ordering::Relaxed),
        expected: outcome.expected,
        delivered: shared.delivered.load(Ordering::Relaxed),
        redelivered: shared.redelivered.load(Ordering::Relaxed),
        producer_elapsed: outcome.producer_elapsed,
        consumer_elapsed,
        consume_received,
        acks_confirmed: outcome.consume_start_ns.is_some()
            && shared.acks_confirmed_ns.load(Ordering::Relaxed) > 0
            && shared.ack_confirm_failures.load(Ordering::Relaxed) == 0,
        latency: outcome.latency,
        interrupted: outcome.interrupted,
        first_error: shared.first_error(),
    })
}

struct RunOutcome {
    start_ns: u64,
    /// With --preload: when the consumers were told to subscribe.
    consume_start_ns: Option<u64>,
    producer_elapsed: Duration,
    expected: u64,
    latency: Histogram<u64>,
    interrupted: bool,
}

/// Starts consumers (subscribed before anything is published), then producers, waits for the
/// producers, then for the deliveries, and collects the consumers' histograms. With --preload the
/// consumers start only once the producers are done, all at one signal.
async fn run_roles(
    args: &BenchArgs,
    topics: &Arc<Vec<String>>,
    subscription_name: &str,
    shared: &Arc<Shared>,
) -> anyhow::Result<RunOutcome> {
    let (stop_consumers, stop_rx) = watch::channel(false);
    let stop_consumers = Arc::new(stop_consumers);
    // Stops whatever was started when this function returns early.
    let _stop_on_exit = StopOnDrop(&stop_consumers, shared);
    let (consumers_go, consumers_go_rx) = watch::channel(false);
    let preload = args.preload;
    let mut started = Consumers::default();
    if preload.is_none() {
        started = start_consumers(
            args,
            topics,
            subscription_name,
            shared,
            &stop_rx,
            None,
            None,
        )
        .await?;
    }

    let count_per_producer = |index: u32| match preload {
        Some(total) => Some(
            total / args.producers as u64
                + u64::from((index as u64) < total % args.producers as u64),
        ),
        None => args
            .duration
            .is_none()
            .then(|| args.count.unwrap_or(COUNT_DEFAULT)),
    };
    let (go, go_rx) = watch::channel(None::<Instant>);
    let mut producers = Vec::new();
    for index in 0..args.producers {
        let job = ProducerJob {
            topics: topics.clone(),
            first_topic: index as usize,
            max_lead: (args.consumers > 0 && preload.is_none()).then(|| {
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
            count: count_per_producer(index),
            duration: args.duration,
            batch: args.batch,
            pipeline: args.pipeline as usize,
            size: args.size,
            keys: args.keys,
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
    let to_publish = match preload {
        Some(total) => Some(total),
        None => count_per_producer(0).map(|n| n * args.producers as u64),
    };
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
    let mut consume_start_ns = None;
    if preload.is_some() && !interrupted {
        // Every consumer connects first; then all subscribe at one signal, which starts the
        // consume phase. The consumer whose delivery completes the count stops them all.
        started = start_consumers(
            args,
            topics,
            subscription_name,
            shared,
            &stop_rx,
            Some(&consumers_go_rx),
            Some((expected, stop_consumers.clone())),
        )
        .await?;
        consume_start_ns = Some(shared.now_ns());
        consumers_go.send_replace(true);
        let phase_end = Instant::now() + CONSUME_PHASE_MAX;
        let mut last_progress = (Instant::now(), 0u64);
        // Bounded: by the count, the --grace without a delivery, CONSUME_PHASE_MAX and Ctrl-C.
        while !interrupted && !*stop_rx.borrow() {
            let delivered = shared.delivered.load(Ordering::Relaxed);
            if delivered != last_progress.1 {
                last_progress = (Instant::now(), delivered);
            }
            if last_progress.0.elapsed() >= args.grace
                || Instant::now() >= phase_end
                || started.roles.iter().all(|role| role.is_finished())
            {
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL_INTERVAL) => {}
                _ = &mut interrupt => interrupted = true,
            }
        }
    } else {
        let grace_end = Instant::now() + args.grace;
        // Bounded by the grace period.
        while !interrupted && Instant::now() < grace_end {
            let done = match args.mode {
                Mode::Queue => shared.delivered.load(Ordering::Relaxed) >= expected,
                Mode::Fanout => started
                    .counts
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
    }
    stop_consumers.send_replace(true);
    let mut latency = new_histogram()?;
    for consumer in started.roles {
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
        consume_start_ns,
        producer_elapsed,
        expected,
        latency,
        interrupted,
    })
}

#[derive(Default)]
struct Consumers {
    roles: Vec<Role<Histogram<u64>>>,
    /// Messages each consumer received.
    counts: Vec<Arc<AtomicU64>>,
}

/// Starts --consumers consumers and returns once each has subscribed, or with `go` (--preload)
/// once each has connected: they subscribe when `go` turns true. With `finish`, the consumer
/// that sees the `expected`-th first delivery stops them all, and each then confirms its acks.
async fn start_consumers(
    args: &BenchArgs,
    topics: &Arc<Vec<String>>,
    subscription_name: &str,
    shared: &Arc<Shared>,
    stop: &watch::Receiver<bool>,
    go: Option<&watch::Receiver<bool>>,
    finish: Option<(u64, Arc<watch::Sender<bool>>)>,
) -> anyhow::Result<Consumers> {
    let mut started = Consumers::default();
    for index in 0..args.consumers {
        let options = SubscribeOptions::new(topics[0].clone())
            .subscription(subscription_name.to_string())
            .start(StartPosition::Latest)
            .credit(args.credit)
            .auto_ack(args.no_ack)
            .ordered(args.ordered);
        let count = Arc::new(AtomicU64::new(0));
        started.counts.push(count.clone());
        let (ready, is_ready) = oneshot::channel();
        let job = ConsumerJob {
            options,
            count,
            stop: stop.clone(),
            go: go.cloned(),
            finish: finish.clone(),
            ack_flush_delay: args.ack_flush_delay,
            ack_each: args.ack_each,
            // Time spent waiting in a pre-loaded queue is not delivery latency.
            record_latency: args.preload.is_none(),
        };
        let role = Role::spawn(format!("bench-consumer-{index}"), {
            let connect = args.connect.clone();
            let shared = shared.clone();
            move || consume(connect, job, shared, ready)
        })?;
        if is_ready.await.is_err() {
            return Err(role.finish().await.err().unwrap_or_else(|| {
                anyhow!("a consumer stopped before connecting or subscribing")
            }));
        }
        started.roles.push(role);
    }
    Ok(started)
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

    fn is_finished(&self) -> bool {
        self.thread.is_finished()
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

/// Room for the key `k<u64>`.
#[derive(Default)]
struct KeyBuf([u8; 21]);

impl KeyBuf {
    /// Writes `k<index>` and returns it: no allocation or formatting machinery per message.
    fn set(&mut self, mut index: u64) -> &[u8] {
        let mut at = self.0.len();
        loop {
            at -= 1;
            self.0[at] = b'0' + (index % 10) as u8;
            index /= 10;
            if index == 0 {
                break;
            }
        }
        at -= 1;
        self.0[at] = b'k';
        &self.0[at..]
    }
}

/// Bytes of the key `k<index>`.
fn key_len(index: u64) -> usize {
    1 + index.checked_ilog10().unwrap_or(0) as usize + 1
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
    /// --keys: give messages the keys k0 .. k{N-1} in turn.
    keys: Option<u64>,
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
    let mut next_key = 0u64;
    let sending = async {
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
            match job.keys {
                None => {
                    for _ in 0..n {
                        encoder.push_body(None, 0, &body);
                    }
                }
                Some(keys) => {
                    let mut key = KeyBuf::default();
                    for _ in 0..n {
                        encoder.push_body(Some(key.set(next_key)), 0, &body);
                        next_key += 1;
                        if next_key == keys {
                            next_key = 0;
                        }
                    }
                }
            }
            if job.unconfirmed {
                if let Err(error) = client.send_unconfirmed(encoder.finish()).await {
                    shared.publish_failed.fetch_add(n as u64, Ordering::Relaxed);
                    return Err(error).context("publishing");
                }
                shared.published.fetch_add(n as u64, Ordering::Relaxed);
                sent += n as u64;
                continue;
            }
            let pending = match client.send_encoded(encoder.finish()).await {
                Ok(pending) => pending,
                Err(error) => {
                    shared.publish_failed.fetch_add(n as u64, Ordering::Relaxed);
                    return Err(error).context("publishing");
                }
            };
            in_flight.push_back(pending);
            sent += n as u64;
        }
        while let Some(pending) = in_flight.pop_front() {
            settle(pending, &shared).await?;
        }
        Ok::<(), anyhow::Error>(())
    }
    .await;
    if sending.is_err() {
        // Sent but never confirmed: whether the broker stored them is unknown, so they count
        // as failed rather than vanish from the report.
        let unconfirmed: u64 = in_flight.drain(..).map(|p| p.count() as u64).sum();
        shared
            .publish_failed
            .fetch_add(unconfirmed, Ordering::Relaxed);
    }
    sending?;
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
/// ends this producer (its batch counted as failed too: its outcome is unknown).
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
            shared.publish_failed.fetch_add(count, Ordering::Relaxed);
            Err(error).context("connection lost while publishing")
        }
        Err(error) => {
            shared.publish_failed.fetch_add(count, Ordering::Relaxed);
            shared.record_error(format!("publish refused: {error}"));
            Ok(())
        }
    }
}

struct ConsumerJob {
    options: SubscribeOptions,
    /// Messages this consumer received.
    count: Arc<AtomicU64>,
    stop: watch::Receiver<bool>,
    /// With --preload: connect, then subscribe when this turns true.
    go: Option<watch::Receiver<bool>>,
    /// With --preload: the number of first deliveries that completes the run, and the signal
    /// that stops every consumer; on stopping, the consumer confirms its acks.
    finish: Option<(u64, Arc<watch::Sender<bool>>)>,
    ack_flush_delay: Duration,
    ack_each: bool,
    record_latency: bool,
}

async fn consume(
    connect: ConnectArgs,
    job: ConsumerJob,
    shared: Arc<Shared>,
    ready: oneshot::Sender<()>,
) -> anyhow::Result<Histogram<u64>> {
    let ConsumerJob {
        options,
        count,
        mut stop,
        go,
        finish,
        ack_flush_delay,
        ack_each,
        record_latency,
    } = job;
    let client = ferrymq_client::Client::connect_with(
        connect
            .config("bench-consumer")?
            .ack_flush_delay(ack_flush_delay),
    )
    .await
    .with_context(|| format!("cannot connect to FerryMQ at {}", connect.addr))?;
    let mut latency = new_histogram()?;
    let mut ready = Some(ready);
    if let Some(mut go) = go {
        if let Some(ready) = ready.take() {
            let _ = ready.send(());
        }
        let start = tokio::select! {
            biased;
            _ = stop.wait_for(|stopped| *stopped) => false,
            go = go.wait_for(|go| *go) => go.is_ok(),
        };
        if !start {
            let _ = client.close().await;
            return Ok(latency);
        }
    }
    let topic = options.topic.clone();
    let mut subscription = client
        .subscribe(options)
        .await
        .with_context(|| format!("cannot subscribe to {topic}"))?;
    if let Some(ready) = ready.take() {
        let _ = ready.send(());
    }
    let mut ranges = Vec::with_capacity(64);
    let auto_ack = subscription.auto_ack();
    // The last range this consumer acked, confirmed at the end with --preload.
    let mut last_acked: Option<OffsetRange> = None;
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
            if record_latency {
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
            }
            if delivery.attempt > 1 {
                redelivered += 1;
            }
            if auto_ack {
                continue;
            }
            if ack_each {
                let one = OffsetRange::single(delivery.partition, delivery.offset);
                subscription.ack_ranges(&[one]).await?;
                last_acked = Some(one);
            } else {
                push_offset(&mut ranges, delivery.partition, delivery.offset);
            }
        }
        if let Some((stamp, count)) = run {
            latency.saturating_record_n(now_ns.saturating_sub(stamp).max(1), count);
        }
        if !ranges.is_empty() {
            subscription.ack_ranges(&ranges).await?;
            last_acked = ranges.last().copied();
            ranges.clear();
        }
        let n = batch.count() as u64;
        count.fetch_add(n, Ordering::Relaxed);
        shared.delivered.fetch_add(n, Ordering::Relaxed);
        let first = shared
            .first_delivered
            .fetch_add(n - redelivered, Ordering::Relaxed)
            + (n - redelivered);
        shared.last_delivery_ns.fetch_max(now_ns, Ordering::Relaxed);
        if redelivered > 0 {
            shared.redelivered.fetch_add(redelivered, Ordering::Relaxed);
        }
        if let Some((expected, stop_all)) = &finish {
            if first >= *expected {
                stop_all.send_replace(true);
            }
        }
    }
    if finish.is_some() {
        if let Some(last) = last_acked {
            // Answered once the acks queued before it on this connection are applied (and, on a
            // disk topic, saved); a range already acked is ignored by the broker.
            match subscription.ack_confirmed(&[last]).await {
                Ok(()) => {
                    shared
                        .acks_confirmed_ns
                        .fetch_max(shared.now_ns(), Ordering::Relaxed);
                }
                Err(error) => {
                    shared.ack_confirm_failures.fetch_add(1, Ordering::Relaxed);
                    shared.record_error(format!("consumer: confirming acks: {error}"))
                }
            }
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
        let mut report = json!({
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
        });
        report["keys"] = json!(args.keys);
        report["ordered"] = json!(args.ordered);
        report["ack"] = json!(if args.no_ack {
            "auto"
        } else if args.ack_each {
            "per message"
        } else {
            "per frame"
        });
        report["preload"] = json!(args.preload);
        if let Some(received) = self.consume_received {
            // "producer" and "consumer" above are these two phases; named here as well.
            report["phases"] = json!({
                "preload": {
                    "messages": self.published,
                    "elapsed_s": self.producer_elapsed.as_secs_f64(),
                    "msgs_per_s": producer_rate,
                    "mb_per_s": producer_rate * size / 1e6,
                },
                "consume": {
                    "messages": self.delivered,
                    "elapsed_s": self.consumer_elapsed.as_secs_f64(),
                    "msgs_per_s": consumer_rate,
                    "mb_per_s": consumer_rate * size / 1e6,
                    "last_delivery_s": received.as_secs_f64(),
                    "acks_confirmed": self.acks_confirmed,
                },
            });
        }
        report
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
            [
                (args.rate > 0).then(|| format!(", rate {} msg/s", args.rate)),
                args.keys.map(|n| format!(", {n} keys")),
                args.ordered.then(|| ", ordered".to_string()),
                (args.ack_each && !args.no_ack).then(|| ", ack per message".to_string()),
                args.no_ack.then(|| ", auto-ack".to_string()),
                args.preload.map(|n| format!(", preload {n}")),
            ]
            .into_iter()
            .flatten()
            .collect::<String>(),
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
        match self.consume_received {
            Some(received) => {
                rate_line("preloaded", self.published, self.producer_elapsed)?;
                rate_line("consumed", self.delivered, self.consumer_elapsed)?;
                writeln!(
                    out,
                    "          (consume phase: from the consumers' start; last delivery at {:.3} s, {})",
                    received.as_secs_f64(),
                    if args.no_ack {
                        "auto-ack"
                    } else if self.acks_confirmed {
                        "acks confirmed by the broker at the end"
                    } else {
                        "acks NOT confirmed"
                    }
                )?;
            }
            None => {
                rate_line("published", self.published, self.producer_elapsed)?;
                if args.consumers > 0 {
                    rate_line("delivered", self.delivered, self.consumer_elapsed)?;
                }
            }
        }
        if self.publish_failed > 0 {
            writeln!(
                out,
                "failed    {:>12} msgs (refused, or unconfirmed when a connection was lost)",
                self.publish_failed
            )?;
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
    fn keys_are_k_and_the_index() {
        let mut key = KeyBuf::default();
        for index in [0, 7, 10, 9_999, 10_000, u64::MAX] {
            let expected = format!("k{index}");
            assert_eq!(key.set(index), expected.as_bytes());
            assert_eq!(key_len(index), expected.len(), "{index}");
        }
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
            consume_received: None,
            acks_confirmed: false,
            latency: new_histogram().unwrap(),
            interrupted: false,
            first_error: None,
        };
        assert_eq!(report.missing(), 3);
    }
}
