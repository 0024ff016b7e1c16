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
//!
//! The flags are in `args`; one run's phases in `driver`; the producer and consumer loops in
//! `produce` and `consume`, each on a thread of its own (`role`); `progress` draws the bar and
//! `report` prints the result as text or JSON.

mod args;
mod breakdown;
mod consume;
mod driver;
mod floor;
mod produce;
mod progress;
mod report;
mod role;

pub use args::BenchArgs;

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ferrymq_client::protocol::limits::NAME_BYTES_MAX;
use hdrhistogram::Histogram;

use args::Mode;
use driver::bench;

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
    fn new() -> Shared {
        Shared {
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
        }
    }

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

fn new_histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).context("creating the latency histogram")
}
