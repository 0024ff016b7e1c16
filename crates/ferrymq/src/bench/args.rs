//! The bench's flags.

use std::time::Duration;

use clap::{Args, ValueEnum};
use ferrymq_client::protocol::limits::{BATCH_COUNT_MAX, CONSUMER_CREDIT_MAX};

use crate::cmd::{parse_duration, ConnectArgs, StorageArg};

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
    /// Read the broker's per-stage latency histograms from its `/metrics` (at --http-addr)
    /// before and after the run, and print where this run's time went: decode, append, sync
    /// wait (sync queue, fsync), wake-up, delivery write, ack, cursor commit.
    #[arg(long)]
    pub breakdown: bool,
    /// The broker's HTTP API, host:port (for --breakdown).
    #[arg(long, env = "FERRYMQ_HTTP_ADDR", default_value = "127.0.0.1:7080")]
    pub http_addr: String,
    /// Before the load, measure the disk's own floor in this directory (put it on the broker's
    /// data directory's file system): appends of one publish's log bytes, each followed by
    /// fdatasync, for 3 s; print it beside FerryMQ's latency.
    #[arg(long, value_name = "DIR")]
    pub fsync_floor: Option<std::path::PathBuf>,
    /// Print exactly one JSON object on stdout and no progress bar.
    #[arg(long)]
    pub json: bool,
}
