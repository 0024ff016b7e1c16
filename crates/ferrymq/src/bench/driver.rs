//! One run: create the topic, start consumers and producers, wait for them within the run's
//! bounds, collect the histograms, and leave the broker as it was found.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context};
use ferrymq_client::protocol::limits::FRAME_HEADER_BYTES;
use ferrymq_client::protocol::RECORD_PREFIX_BYTES;
use ferrymq_client::{Client, OverflowPolicy, StartPosition, SubscribeOptions, TopicConfig};
use hdrhistogram::Histogram;
use tokio::sync::{oneshot, watch};

use super::args::{BenchArgs, Mode};
use super::consume::{consume, ConsumerJob};
use super::produce::{key_len, produce, ProducerJob};
use super::progress::Progress;
use super::report::Report;
use super::role::Role;
use super::{breakdown, floor};
use super::{new_histogram, Shared, CONSUME_PHASE_MAX, COUNT_DEFAULT, POLL_INTERVAL};

pub(super) async fn bench(args: BenchArgs) -> anyhow::Result<Report> {
    let shared = Arc::new(Shared::new());
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

    let fsync_floor = fsync_floor(&args).await?;
    let admin = args.connect.connect("bench").await?;
    check_sizes(&args, &admin, &topic)?;
    let stages_before = match args.breakdown {
        true => Some(breakdown::scrape(&args.http_addr, &args.connect).await?),
        false => None,
    };
    let config = topic_config(&args);
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
        Some(_) => preload_run(&args, &admin, &topic, &topics, &subscription_name, &shared).await,
        None => run_roles(&args, &topics, &subscription_name, &shared).await,
    };
    let stages = match (&stages_before, &outcome) {
        (Some(before), Ok(_)) => Some(stages_since(&args, before).await),
        _ => None,
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
    let mut report = report(topic, outcome?, &shared);
    report.stages = stages.transpose()?;
    report.fsync_floor = fsync_floor;
    Ok(report)
}

/// With --fsync-floor: the disk's own floor, measured before the load.
async fn fsync_floor(args: &BenchArgs) -> anyhow::Result<Option<floor::Floor>> {
    let Some(dir) = args.fsync_floor.clone() else {
        return Ok(None);
    };
    let write_bytes = publish_log_bytes(args);
    let measured = tokio::task::spawn_blocking(move || floor::measure(&dir, write_bytes));
    Ok(Some(
        measured
            .await
            .context("the fsync floor's thread failed")??,
    ))
}

/// With --breakdown: each stage's share of the run just finished.
async fn stages_since(
    args: &BenchArgs,
    before: &breakdown::StageCounts,
) -> anyhow::Result<Vec<breakdown::StageSummary>> {
    // Acks reach the cursor store a few milliseconds after they are applied.
    tokio::time::sleep(CURSOR_COMMIT_SETTLE).await;
    let after = breakdown::scrape(&args.http_addr, &args.connect).await?;
    Ok(breakdown::between(before, &after))
}

/// How long `--breakdown` waits after a run before it reads the stage histograms again: longer
/// than the state writer lets unconfirmed acks wait for their commit (20 ms).
const CURSOR_COMMIT_SETTLE: Duration = Duration::from_millis(100);

/// The log bytes one PUBLISH frame becomes: one entry per message.
fn publish_log_bytes(args: &BenchArgs) -> usize {
    let key = args.keys.map_or(0, |n| key_len(n - 1));
    args.batch as usize
        * (ferrymq_storage::ENTRY_HEADER_BYTES + RECORD_PREFIX_BYTES + args.size + key)
}

/// Refuses a batch the server's frame limit, or a body its message limit, would refuse.
fn check_sizes(args: &BenchArgs, admin: &Client, topic: &str) -> anyhow::Result<()> {
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
    Ok(())
}

fn topic_config(args: &BenchArgs) -> TopicConfig {
    TopicConfig {
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
        replicas: 0,
    }
}

/// The queue's subscription exists before the preload (from its latest offset, so a --topic
/// that already holds messages is fine) and keeps what is published into it while it has no
/// consumer.
async fn preload_run(
    args: &BenchArgs,
    admin: &Client,
    topic: &str,
    topics: &Arc<Vec<String>>,
    subscription_name: &str,
    shared: &Arc<Shared>,
) -> anyhow::Result<RunOutcome> {
    match admin
        .subscribe(
            SubscribeOptions::new(topic.to_string())
                .subscription(subscription_name.to_string())
                .start(StartPosition::Latest)
                .credit(1)
                .ordered(args.ordered),
        )
        .await
    {
        Ok(subscription) => match subscription.close().await {
            Ok(()) => run_roles(args, topics, subscription_name, shared).await,
            Err(error) => Err(anyhow::Error::from(error)
                .context(format!("cannot leave subscription {subscription_name}"))),
        },
        Err(error) => Err(anyhow::Error::from(error).context(format!(
            "cannot create subscription {subscription_name} on {topic}"
        ))),
    }
}

/// The report of a finished run, from its outcome and the shared counters.
fn report(topic: String, outcome: RunOutcome, shared: &Shared) -> Report {
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
    Report {
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
        stages: None,
        fsync_floor: None,
    }
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
// The run's phases in order, sharing the stop and go channels and Ctrl-C: each wait is its own
// function, and what stays here is the sequence a reader checks against the module doc.
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
    let (go, go_rx) = watch::channel(None::<Instant>);
    let producers = start_producers(args, topics, shared, &go_rx).await?;

    let fanout = match args.mode {
        Mode::Queue => 1,
        Mode::Fanout => args.consumers as u64,
    };
    let to_publish = match preload {
        Some(total) => Some(total),
        None => count_per_producer(args, 0).map(|n| n * args.producers as u64),
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
    wait_for_producers(producers, shared, &mut interrupt, &mut interrupted).await;
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
        let waits = (&mut interrupt, &mut interrupted);
        wait_for_drain(args, &started, shared, &stop_rx, waits).await;
    } else {
        let waits = (&mut interrupt, &mut interrupted);
        wait_for_deliveries(args, &started, shared, expected, published, waits).await;
    }
    stop_consumers.send_replace(true);
    let latency = collect_latency(started.roles, shared).await?;
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

/// Ctrl-C, and whether it was pressed: the run's waits share them.
type Interrupt<'a, F> = (&'a mut F, &'a mut bool);

/// Messages producer `index` publishes: a share of --preload, --count, or `None` for --duration.
fn count_per_producer(args: &BenchArgs, index: u32) -> Option<u64> {
    match args.preload {
        Some(total) => Some(
            total / args.producers as u64
                + u64::from((index as u64) < total % args.producers as u64),
        ),
        None => args
            .duration
            .is_none()
            .then(|| args.count.unwrap_or(COUNT_DEFAULT)),
    }
}

fn producer_job(args: &BenchArgs, topics: &Arc<Vec<String>>, index: u32) -> ProducerJob {
    ProducerJob {
        topics: topics.clone(),
        first_topic: index as usize,
        max_lead: (args.consumers > 0 && args.preload.is_none()).then(|| {
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
            Duration::from_secs_f64(args.batch as f64 * args.producers as f64 / args.rate as f64)
        }),
        count: count_per_producer(args, index),
        duration: args.duration,
        batch: args.batch,
        pipeline: args.pipeline as usize,
        size: args.size,
        keys: args.keys,
    }
}

/// Starts --producers producers and returns once each has connected; they publish when `go`
/// holds the start time.
async fn start_producers(
    args: &BenchArgs,
    topics: &Arc<Vec<String>>,
    shared: &Arc<Shared>,
    go_rx: &watch::Receiver<Option<Instant>>,
) -> anyhow::Result<Vec<Role<()>>> {
    let mut producers = Vec::new();
    for index in 0..args.producers {
        let job = producer_job(args, topics, index);
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
    Ok(producers)
}

/// Waits for every producer; Ctrl-C tells them to stop and is remembered.
async fn wait_for_producers<F: Future + Unpin>(
    producers: Vec<Role<()>>,
    shared: &Shared,
    interrupt: &mut F,
    interrupted: &mut bool,
) {
    // Bounded: producers stop by count or duration, each publish within the request timeout.
    for producer in producers {
        let finished = producer.finish();
        tokio::pin!(finished);
        let result = tokio::select! {
            result = &mut finished => result,
            _ = &mut *interrupt, if !*interrupted => {
                *interrupted = true;
                shared.stop_producers.store(true, Ordering::Relaxed);
                finished.await
            }
        };
        if let Err(error) = result {
            shared.record_error(format!("producer: {error:#}"));
        }
    }
}

/// The consume phase of a --preload run: until the consumers stopped on the count, or none
/// delivered for --grace, or CONSUME_PHASE_MAX, or Ctrl-C.
async fn wait_for_drain<F: Future + Unpin>(
    args: &BenchArgs,
    started: &Consumers,
    shared: &Shared,
    stop_rx: &watch::Receiver<bool>,
    (interrupt, interrupted): Interrupt<'_, F>,
) {
    let phase_end = Instant::now() + CONSUME_PHASE_MAX;
    let mut last_progress = (Instant::now(), 0u64);
    // Bounded: by the count, the --grace without a delivery, CONSUME_PHASE_MAX and Ctrl-C.
    while !*interrupted && !*stop_rx.borrow() {
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
            _ = &mut *interrupt => *interrupted = true,
        }
    }
}

/// Waits until every consumer has what was published, within --grace, or Ctrl-C.
async fn wait_for_deliveries<F: Future + Unpin>(
    args: &BenchArgs,
    started: &Consumers,
    shared: &Shared,
    expected: u64,
    published: u64,
    (interrupt, interrupted): Interrupt<'_, F>,
) {
    let grace_end = Instant::now() + args.grace;
    // Bounded by the grace period.
    while !*interrupted && Instant::now() < grace_end {
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
            _ = &mut *interrupt => *interrupted = true,
        }
    }
}

/// The consumers' latency histograms added up; a consumer that failed is recorded instead.
async fn collect_latency(
    roles: Vec<Role<Histogram<u64>>>,
    shared: &Shared,
) -> anyhow::Result<Histogram<u64>> {
    let mut latency = new_histogram()?;
    for consumer in roles {
        match consumer.finish().await {
            Ok(histogram) => latency
                .add(histogram)
                .context("merging latency histograms")?,
            Err(error) => shared.record_error(format!("consumer: {error:#}")),
        }
    }
    Ok(latency)
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
