//! `ferrymq pub | sub | topic | stats`: thin commands over the Rust client.
//!
//! Each command builds a small single-threaded runtime, connects, does its work and closes the
//! connection. Output meant for people goes to stdout as text or tables; `--json` (or
//! `--format json`) prints machine-readable JSON instead. Every wait is bounded: requests by the
//! client's request timeout, `sub` by `--count`, `--timeout` or Ctrl-C.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use ferrymq_client::{
    push_offset, Client, ClientConfig, Delivery, FsyncPolicy, Message, OverflowPolicy,
    PendingPublish, StartPosition, Storage, SubscribeOptions, TopicConfig, TopicInfo, TopicStats,
    ADDR_DEFAULT,
};
use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, BufReader};

/// Batches `pub` keeps in flight while it reads more lines.
const PUB_PIPELINE_BATCHES: usize = 8;

/// Where the broker is and who we are. Shared by every client command and the bench.
#[derive(Args, Debug, Clone)]
pub struct ConnectArgs {
    /// Broker address (binary protocol), host:port.
    #[arg(long, env = "FERRYMQ_ADDR", default_value = ADDR_DEFAULT, global = true)]
    pub addr: String,
    /// User name; empty for anonymous access.
    #[arg(long, env = "FERRYMQ_USER", default_value = "", global = true)]
    pub user: String,
    /// Password for --user.
    #[arg(
        long,
        env = "FERRYMQ_PASSWORD",
        default_value = "",
        hide_env_values = true,
        global = true
    )]
    pub password: String,
}

impl ConnectArgs {
    pub fn config(&self, purpose: &str) -> ClientConfig {
        ClientConfig::new(self.addr.clone())
            .client_name(format!("ferrymq-{purpose}/{}", env!("CARGO_PKG_VERSION")))
            .credentials(self.user.clone(), self.password.clone())
    }

    pub async fn connect(&self, purpose: &str) -> anyhow::Result<Client> {
        Client::connect_with(self.config(purpose))
            .await
            .with_context(|| {
                format!(
                    "cannot connect to FerryMQ at {} (set --addr or FERRYMQ_ADDR)",
                    self.addr
                )
            })
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

// ---------------------------------------------------------------------------------------------
// pub

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  ferrymq pub orders 'hello'\n  seq 1000 | ferrymq pub orders --batch 100 --quiet\n  ferrymq pub orders --file events.txt --key customer-7 --header source=import"
)]
pub struct PubArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Topic to publish to (created on first publish when the server allows it).
    pub topic: String,
    /// Message body. Without it, each line of --file (or of stdin) is one message.
    pub message: Option<String>,
    /// Publish each line of this file as one message.
    #[arg(long, value_name = "PATH", conflicts_with = "message")]
    pub file: Option<PathBuf>,
    /// Message key: picks the partition (integer keys modulo partitions, others by hash).
    #[arg(long)]
    pub key: Option<String>,
    /// Header as name=value; repeat for more.
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
    /// Priority 0 (default, lowest) to 9.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=9))]
    pub priority: u8,
    /// Publish to this partition instead of letting the broker choose.
    #[arg(long)]
    pub partition: Option<u32>,
    /// Lines per publish batch when reading lines; batches are pipelined.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub batch: u32,
    /// Print a one-line summary instead of one id per message.
    #[arg(long, short)]
    pub quiet: bool,
}

fn parse_header(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
        _ => Err(format!("header {text:?} is not NAME=VALUE")),
    }
}

pub fn run_pub(args: PubArgs) -> anyhow::Result<()> {
    runtime()?.block_on(publish(args))
}

/// Counts what `pub` has published and prints ids as receipts arrive, in publish order.
struct PubOutput {
    out: io::BufWriter<io::Stdout>,
    quiet: bool,
    published: u64,
    first: Option<String>,
    last: Option<String>,
}

impl PubOutput {
    async fn settle(&mut self, pending: PendingPublish) -> anyhow::Result<()> {
        let receipt = pending.await.context("publish failed")?;
        for id in receipt.ids() {
            if self.first.is_none() {
                self.first = Some(id.to_string());
            }
            if !self.quiet {
                writeln!(self.out, "{id}")?;
            }
        }
        self.last = receipt
            .ids()
            .last()
            .map(|id| id.to_string())
            .or(self.last.take());
        self.published += receipt.len() as u64;
        self.out.flush()?;
        Ok(())
    }
}

async fn publish(args: PubArgs) -> anyhow::Result<()> {
    let mut template = Message::default().with_priority(args.priority);
    if let Some(key) = &args.key {
        template = template.with_key(key.clone().into_bytes());
    }
    for (name, value) in &args.headers {
        template = template.with_header(name.clone(), value.clone());
    }
    let client = args.connect.connect("pub").await?;
    let mut output = PubOutput {
        out: io::BufWriter::new(io::stdout()),
        quiet: args.quiet,
        published: 0,
        first: None,
        last: None,
    };

    if let Some(text) = &args.message {
        let message = Message {
            body: text.clone().into_bytes().into(),
            ..template
        };
        let pending = client
            .send_batch(&args.topic, args.partition, &[message])
            .await?;
        output.settle(pending).await?;
    } else {
        let input: Box<dyn AsyncBufRead + Unpin> = match &args.file {
            Some(path) => {
                let file = tokio::fs::File::open(path)
                    .await
                    .with_context(|| format!("cannot open {}", path.display()))?;
                Box::new(BufReader::with_capacity(64 * 1024, file))
            }
            None => Box::new(BufReader::with_capacity(64 * 1024, tokio::io::stdin())),
        };
        publish_lines(&client, &args, template, input, &mut output).await?;
    }
    if args.quiet {
        match (&output.first, &output.last) {
            (Some(first), Some(last)) if output.published > 1 => writeln!(
                output.out,
                "published {} messages to {} ({first} .. {last})",
                output.published, args.topic
            )?,
            (Some(first), _) => writeln!(
                output.out,
                "published 1 message to {} ({first})",
                args.topic
            )?,
            _ => writeln!(output.out, "published 0 messages to {}", args.topic)?,
        }
        output.out.flush()?;
    }
    let _ = client.close().await;
    Ok(())
}

async fn publish_lines(
    client: &Client,
    args: &PubArgs,
    template: Message,
    mut input: Box<dyn AsyncBufRead + Unpin>,
    output: &mut PubOutput,
) -> anyhow::Result<()> {
    let line_bytes_max = client.server_info().message_bytes_max as usize;
    let mut in_flight: VecDeque<PendingPublish> = VecDeque::with_capacity(PUB_PIPELINE_BATCHES);
    let mut batch: Vec<Message> = Vec::with_capacity(args.batch as usize);
    let mut line = Vec::new();
    let mut line_number = 0u64;
    // Bounded by the input: one turn per line.
    loop {
        let more = read_line_bounded(&mut input, &mut line, line_bytes_max)
            .await
            .with_context(|| format!("line {}", line_number + 1))?;
        if more {
            line_number += 1;
            batch.push(Message {
                body: line.clone().into(),
                ..template.clone()
            });
        }
        if batch.len() == args.batch as usize || (!more && !batch.is_empty()) {
            if in_flight.len() == PUB_PIPELINE_BATCHES {
                if let Some(oldest) = in_flight.pop_front() {
                    output.settle(oldest).await?;
                }
            }
            in_flight.push_back(
                client
                    .send_batch(&args.topic, args.partition, &batch)
                    .await?,
            );
            batch.clear();
        }
        if !more {
            break;
        }
    }
    while let Some(pending) = in_flight.pop_front() {
        output.settle(pending).await?;
    }
    Ok(())
}

/// Reads one line (without its `\n` or `\r\n`) into `line`, refusing lines longer than
/// `bytes_max` before buffering more of them. Returns false at the end of input.
async fn read_line_bounded(
    input: &mut (impl AsyncBufRead + Unpin + ?Sized),
    line: &mut Vec<u8>,
    bytes_max: usize,
) -> anyhow::Result<bool> {
    line.clear();
    let mut seen_any = false;
    loop {
        let available = input.fill_buf().await?;
        if available.is_empty() {
            break;
        }
        seen_any = true;
        let (used, done) = match available.iter().position(|&b| b == b'\n') {
            Some(end) => {
                line.extend_from_slice(&available[..end]);
                (end + 1, true)
            }
            None => {
                line.extend_from_slice(available);
                (available.len(), false)
            }
        };
        input.consume(used);
        // One byte of slack for a `\r` that is stripped below.
        if line.len() > bytes_max + 1 {
            bail!("longer than the server's message limit of {bytes_max} bytes");
        }
        if done {
            break;
        }
    }
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    if line.len() > bytes_max {
        bail!("longer than the server's message limit of {bytes_max} bytes");
    }
    Ok(seen_any)
}

// ---------------------------------------------------------------------------------------------
// sub

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// The body of each message, one per line.
    Text,
    /// One JSON object per line: id, partition, offset, attempt, timestamp, key, headers, body.
    Json,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  ferrymq sub orders\n  ferrymq sub orders --subscription billing --from earliest --count 10 --format json\n  ferrymq sub orders --count 1 --timeout 5s"
)]
pub struct SubArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Topic to subscribe to.
    pub topic: String,
    /// Join this named subscription (consumers of one name share its messages); without it, a
    /// private ephemeral subscription is used and removed on exit.
    #[arg(long, value_name = "NAME")]
    pub subscription: Option<String>,
    /// Where a new subscription starts: earliest, latest, offset:N or time:UNIX_MS. Ignored when
    /// joining an existing subscription.
    #[arg(long, default_value = "latest", value_parser = parse_start)]
    pub from: StartPosition,
    /// Exit after this many messages.
    #[arg(long, short = 'n')]
    pub count: Option<u64>,
    /// Exit when no message arrives for this long (e.g. 500ms, 5s, 2m; a bare number is seconds).
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Let the server count messages as acked when sent (at most once); by default each message
    /// is acked after it is printed.
    #[arg(long)]
    pub no_ack: bool,
    /// Credit window: messages the server may send ahead of what has been printed.
    #[arg(long, default_value_t = ferrymq_client::CREDIT_WINDOW_DEFAULT)]
    pub credit: u32,
    /// Take messages from these partitions only, e.g. 1,2,4-7 (other consumers of the
    /// subscription serve the rest). Default: all.
    #[arg(long, value_parser = parse_partitions)]
    pub partitions: Option<PartitionList>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
}

/// Partitions as inclusive ranges, parsed from `1,2,4-7`.
#[derive(Debug, Clone)]
pub struct PartitionList(pub Vec<(u32, u32)>);

fn parse_partitions(text: &str) -> Result<PartitionList, String> {
    ferrymq_protocol::parse_partition_list(text).map(PartitionList)
}

pub fn parse_start(text: &str) -> Result<StartPosition, String> {
    let bad = || format!("{text:?} is not earliest, latest, offset:N or time:UNIX_MS");
    match text {
        "earliest" => Ok(StartPosition::Earliest),
        "latest" => Ok(StartPosition::Latest),
        _ => match text.split_once(':') {
            Some(("offset", n)) => n.parse().map(StartPosition::Offset).map_err(|_| bad()),
            Some(("time", ms)) => ms.parse().map(StartPosition::TimeMs).map_err(|_| bad()),
            _ => Err(bad()),
        },
    }
}

/// `500ms`, `5s`, `2m`, or a bare number of seconds (fractions allowed).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration like 500ms, 5s, 2m or 1.5");
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = text.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (text, 1.0)
    };
    let value: f64 = number.trim().parse().map_err(|_| bad())?;
    if !value.is_finite() || value < 0.0 {
        return Err(bad());
    }
    Duration::try_from_secs_f64(value * scale).map_err(|_| bad())
}

pub fn run_sub(args: SubArgs) -> anyhow::Result<()> {
    runtime()?.block_on(subscribe(args))
}

enum SubEnd {
    Count,
    Idle,
    Interrupted,
    OutputClosed,
}

async fn subscribe(args: SubArgs) -> anyhow::Result<()> {
    if args.count == Some(0) {
        return Ok(());
    }
    let client = args.connect.connect("sub").await?;
    let mut options = SubscribeOptions::new(args.topic.clone())
        .start(args.from)
        .credit(args.credit)
        .auto_ack(args.no_ack)
        .partitions(args.partitions.clone().map_or(Vec::new(), |list| list.0));
    if let Some(name) = &args.subscription {
        options = options.subscription(name.clone());
    }
    let mut subscription = client
        .subscribe(options)
        .await
        .with_context(|| format!("cannot subscribe to {}", args.topic))?;
    let mut out = io::BufWriter::new(io::stdout());
    let mut ranges = Vec::new();
    let mut received = 0u64;
    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(interrupt);

    // Bounded by --count, --timeout, Ctrl-C, or the end of the stream.
    let end = loop {
        if args.count.is_some_and(|count| received >= count) {
            break SubEnd::Count;
        }
        let next = async {
            match args.timeout {
                Some(limit) => tokio::time::timeout(limit, subscription.next_batch())
                    .await
                    .ok(),
                None => Some(subscription.next_batch().await),
            }
        };
        let next = tokio::select! {
            next = next => next,
            _ = &mut interrupt => break SubEnd::Interrupted,
        };
        let batch = match next {
            None => break SubEnd::Idle,
            Some(None) => bail!("the subscription was closed by the server"),
            Some(Some(Err(error))) if error.is_connection_error() => {
                return Err(error).context("connection to the broker lost")
            }
            Some(Some(Err(error))) => {
                eprintln!("warning: {error}");
                continue;
            }
            Some(Some(Ok(batch))) => batch,
        };
        let mut output_closed = false;
        for delivery in batch.iter() {
            if args.count.is_some_and(|count| received >= count) {
                break;
            }
            if let Err(error) = print_delivery(&mut out, &delivery, args.format) {
                if error.kind() == io::ErrorKind::BrokenPipe {
                    output_closed = true;
                    break;
                }
                return Err(error.into());
            }
            push_offset(&mut ranges, delivery.partition, delivery.offset);
            received += 1;
        }
        match out.flush() {
            Err(error) if error.kind() == io::ErrorKind::BrokenPipe => output_closed = true,
            other => other?,
        }
        // Acked only once printed and flushed; what was not printed goes back on unsubscribe.
        if !args.no_ack && !output_closed && !ranges.is_empty() {
            subscription.ack_ranges(&ranges).await?;
        }
        ranges.clear();
        if output_closed {
            break SubEnd::OutputClosed;
        }
    };
    if let Err(error) = subscription.close().await {
        eprintln!("warning: unsubscribing failed: {error}");
    }
    let _ = client.close().await;
    match end {
        SubEnd::Idle => {
            if let Some(count) = args.count {
                bail!(
                    "received {received} of {count} messages: none arrived for {:?}",
                    args.timeout.unwrap_or_default()
                );
            }
            Ok(())
        }
        SubEnd::Count | SubEnd::Interrupted | SubEnd::OutputClosed => Ok(()),
    }
}

fn print_delivery(
    out: &mut impl Write,
    delivery: &Delivery,
    format: OutputFormat,
) -> io::Result<()> {
    match format {
        OutputFormat::Text => {
            out.write_all(&delivery.message.body)?;
            out.write_all(b"\n")
        }
        OutputFormat::Json => {
            serde_json::to_writer(&mut *out, &delivery_json(delivery))?;
            out.write_all(b"\n")
        }
    }
}

/// Lowercase hex, for keys and bodies that are not UTF-8.
fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        text.push(DIGITS[(b >> 4) as usize] as char);
        text.push(DIGITS[(b & 0xf) as usize] as char);
    }
    text
}

/// A delivery as JSON. Body and key are strings when they are UTF-8; otherwise they appear as
/// `body_hex` / `key_hex`.
fn delivery_json(delivery: &Delivery) -> Value {
    let message = &delivery.message;
    let mut object = serde_json::Map::new();
    object.insert(
        "id".into(),
        json!(format!("{}-{}", delivery.partition, delivery.offset)),
    );
    object.insert("partition".into(), json!(delivery.partition));
    object.insert("offset".into(), json!(delivery.offset));
    object.insert("attempt".into(), json!(delivery.attempt));
    object.insert("timestamp".into(), json!(delivery.timestamp_ms));
    object.insert("priority".into(), json!(message.priority));
    match &message.key {
        None => {
            object.insert("key".into(), Value::Null);
        }
        Some(key) => match std::str::from_utf8(key) {
            Ok(text) => {
                object.insert("key".into(), json!(text));
            }
            Err(_) => {
                object.insert("key_hex".into(), json!(to_hex(key)));
            }
        },
    }
    let headers: serde_json::Map<String, Value> = message
        .headers
        .iter()
        .map(|(name, value)| (name.clone(), json!(value)))
        .collect();
    object.insert("headers".into(), Value::Object(headers));
    match std::str::from_utf8(&message.body) {
        Ok(text) => object.insert("body".into(), json!(text)),
        Err(_) => object.insert("body_hex".into(), json!(to_hex(&message.body))),
    };
    Value::Object(object)
}

// ---------------------------------------------------------------------------------------------
// topic

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum StorageArg {
    /// Transient: held in memory, lost on restart.
    Memory,
    /// Durable: written to the log and synced before publishes are acknowledged.
    Disk,
}

impl From<StorageArg> for Storage {
    fn from(storage: StorageArg) -> Storage {
        match storage {
            StorageArg::Memory => Storage::Memory,
            StorageArg::Disk => Storage::Disk,
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum OverflowArg {
    /// Discard the oldest messages to make room.
    DropOldest,
    /// Refuse publishes while the topic is full.
    Reject,
}

#[derive(Args, Debug)]
pub struct TopicArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(subcommand)]
    pub command: TopicCommand,
}

#[derive(Subcommand, Debug)]
pub enum TopicCommand {
    /// Create a topic.
    Create(TopicCreateArgs),
    /// Delete a topic and everything it holds.
    Delete {
        /// Topic name.
        name: String,
    },
    /// List topics.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show a topic's settings, size and subscriptions.
    Describe {
        /// Topic name.
        name: String,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Debug)]
pub struct TopicCreateArgs {
    /// Topic name (1 to 255 bytes).
    pub name: String,
    /// Number of partitions; order is kept within a partition. Default: the server's.
    #[arg(long)]
    pub partitions: Option<u32>,
    /// Where messages are kept: disk (durable, the default) or memory (lost on restart).
    #[arg(long, value_enum, default_value_t = StorageArg::Disk)]
    pub storage: StorageArg,
    /// Disk topics: when the log is synced: always (each publish acknowledged after an fsync,
    /// shared by concurrent publishes), interval:<ms>, or never. Default: the server's.
    #[arg(long)]
    pub fsync: Option<FsyncPolicy>,
    /// Disk topics: delete messages older than this (e.g. 7d, 12h, 30m); "forever" keeps them.
    /// Default: the server's.
    #[arg(long, value_parser = parse_retention)]
    pub retention: Option<u64>,
    /// Most messages retained. Default: the server's.
    #[arg(long)]
    pub max_messages: Option<u64>,
    /// Most bytes retained. Default: the server's.
    #[arg(long)]
    pub max_bytes: Option<u64>,
    /// What a full topic does.
    #[arg(long, value_enum, default_value_t = OverflowArg::DropOldest)]
    pub overflow: OverflowArg,
    /// Succeed without changes when the topic already exists.
    #[arg(long)]
    pub if_not_exists: bool,
}

/// A retention age in milliseconds: a duration like `7d`, `12h`, `30m`, `90s`, or `forever`.
fn parse_retention(s: &str) -> Result<u64, String> {
    if s == "forever" {
        return Ok(u64::MAX);
    }
    let (number, unit_ms) = match s.char_indices().last() {
        Some((i, 'd')) => (&s[..i], 86_400_000),
        Some((i, 'h')) => (&s[..i], 3_600_000),
        Some((i, 'm')) => (&s[..i], 60_000),
        Some((i, 's')) => (&s[..i], 1_000),
        _ => (s, 0),
    };
    match (number.parse::<u64>(), unit_ms) {
        (Ok(n), unit) if n > 0 && unit > 0 => Ok(n.saturating_mul(unit)),
        _ => Err(format!(
            "'{s}' is not a retention: use a positive number with d, h, m or s (7d, 12h), or forever"
        )),
    }
}

pub fn run_topic(args: TopicArgs) -> anyhow::Result<()> {
    runtime()?.block_on(topic(args))
}

async fn topic(args: TopicArgs) -> anyhow::Result<()> {
    let client = args.connect.connect("topic").await?;
    let mut out = io::stdout().lock();
    match args.command {
        TopicCommand::Create(create) => {
            let config = TopicConfig {
                partitions: create.partitions.unwrap_or(0),
                storage: create.storage.into(),
                overflow: match create.overflow {
                    OverflowArg::DropOldest => OverflowPolicy::DropOldest,
                    OverflowArg::Reject => OverflowPolicy::Reject,
                },
                max_messages: create.max_messages.unwrap_or(0),
                max_bytes: create.max_bytes.unwrap_or(0),
                fsync: create.fsync.unwrap_or_default(),
                retention_ms: create.retention.unwrap_or(0),
            };
            client
                .create_topic(&create.name, config, create.if_not_exists)
                .await
                .with_context(|| format!("cannot create topic {}", create.name))?;
            writeln!(out, "topic {} ready", create.name)?;
        }
        TopicCommand::Delete { name } => {
            client
                .delete_topic(&name)
                .await
                .with_context(|| format!("cannot delete topic {name}"))?;
            writeln!(out, "topic {name} deleted")?;
        }
        TopicCommand::List { json } => {
            let topics = client.list_topics().await.context("cannot list topics")?;
            if json {
                let list: Vec<Value> = topics.iter().map(topic_info_json).collect();
                writeln!(out, "{}", serde_json::to_string_pretty(&list)?)?;
            } else if topics.is_empty() {
                writeln!(out, "no topics")?;
            } else {
                let rows: Vec<Vec<String>> = topics
                    .iter()
                    .map(|t| {
                        vec![
                            t.name.clone(),
                            t.config.partitions.to_string(),
                            storage_name(t.config.storage).to_string(),
                            t.messages.to_string(),
                            t.bytes.to_string(),
                            t.subscriptions.join(","),
                        ]
                    })
                    .collect();
                write_table(
                    &mut out,
                    &[
                        "TOPIC",
                        "PARTITIONS",
                        "STORAGE",
                        "MESSAGES",
                        "BYTES",
                        "SUBSCRIPTIONS",
                    ],
                    &[false, true, false, true, true, false],
                    &rows,
                )?;
            }
        }
        TopicCommand::Describe { name, json } => {
            let info = client
                .describe_topic(&name)
                .await
                .with_context(|| format!("cannot describe topic {name}"))?;
            if json {
                writeln!(
                    out,
                    "{}",
                    serde_json::to_string_pretty(&topic_info_json(&info))?
                )?;
            } else {
                let rows = [
                    ("topic", info.name.clone()),
                    ("partitions", info.config.partitions.to_string()),
                    ("storage", storage_name(info.config.storage).to_string()),
                    ("overflow", overflow_name(info.config.overflow).to_string()),
                    ("max messages", unlimited_or(info.config.max_messages)),
                    ("max bytes", unlimited_or(info.config.max_bytes)),
                    ("fsync", info.config.fsync.to_string()),
                    ("retention", retention_text(info.config.retention_ms)),
                    ("messages", info.messages.to_string()),
                    ("bytes", info.bytes.to_string()),
                    (
                        "subscriptions",
                        if info.subscriptions.is_empty() {
                            "-".to_string()
                        } else {
                            info.subscriptions.join(", ")
                        },
                    ),
                ];
                for (label, value) in rows {
                    writeln!(out, "{label:<14} {value}")?;
                }
            }
        }
    }
    out.flush()?;
    drop(out);
    let _ = client.close().await;
    Ok(())
}

fn storage_name(storage: Storage) -> &'static str {
    match storage {
        Storage::Memory => "memory",
        Storage::Disk => "disk",
    }
}

fn overflow_name(overflow: OverflowPolicy) -> &'static str {
    match overflow {
        OverflowPolicy::DropOldest => "drop-oldest",
        OverflowPolicy::Reject => "reject",
    }
}

fn unlimited_or(n: u64) -> String {
    match n {
        u64::MAX => "unlimited".to_string(),
        n => n.to_string(),
    }
}

/// A retention age for people: "forever", or the largest whole unit (7d, 12h, 30m, 90s, 250ms).
fn retention_text(ms: u64) -> String {
    match ms {
        0 => "-".to_string(),
        u64::MAX => "forever".to_string(),
        ms => [
            (86_400_000, "d"),
            (3_600_000, "h"),
            (60_000, "m"),
            (1_000, "s"),
        ]
        .iter()
        .find(|(unit, _)| ms % unit == 0)
        .map_or(format!("{ms}ms"), |(unit, name)| {
            format!("{}{name}", ms / unit)
        }),
    }
}

fn topic_info_json(info: &TopicInfo) -> Value {
    json!({
        "name": info.name,
        "partitions": info.config.partitions,
        "storage": storage_name(info.config.storage),
        "overflow": overflow_name(info.config.overflow),
        "max_messages": info.config.max_messages,
        "max_bytes": info.config.max_bytes,
        "fsync": info.config.fsync.to_string(),
        "retention_ms": info.config.retention_ms,
        "messages": info.messages,
        "bytes": info.bytes,
        "subscriptions": info.subscriptions,
    })
}

/// Writes a plain table: a header row and columns padded to their widest cell, numbers aligned
/// right.
fn write_table(
    out: &mut impl Write,
    headers: &[&str],
    right: &[bool],
    rows: &[Vec<String>],
) -> io::Result<()> {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header_cells: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header_cells).chain(rows) {
        let mut line = String::new();
        for (index, cell) in row.iter().enumerate() {
            let width = widths[index];
            if index > 0 {
                line.push_str("  ");
            }
            if right.get(index).copied().unwrap_or(false) {
                line.push_str(&format!("{cell:>width$}"));
            } else {
                line.push_str(&format!("{cell:<width$}"));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// stats

#[derive(Args, Debug)]
pub struct StatsArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Only this topic (default: every topic).
    pub topic: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

pub fn run_stats(args: StatsArgs) -> anyhow::Result<()> {
    runtime()?.block_on(stats(args))
}

async fn stats(args: StatsArgs) -> anyhow::Result<()> {
    let client = args.connect.connect("stats").await?;
    let topics = client
        .stats(args.topic.as_deref())
        .await
        .context("cannot read statistics")?;
    let _ = client.close().await;
    let mut out = io::stdout().lock();
    if args.json {
        let list: Vec<Value> = topics.iter().map(topic_stats_json).collect();
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&json!({ "topics": list }))?
        )?;
        return Ok(());
    }
    if topics.is_empty() {
        writeln!(out, "no topics")?;
        return Ok(());
    }
    write_stats_tables(&mut out, &topics)?;
    Ok(())
}

fn write_stats_tables(out: &mut impl Write, topics: &[TopicStats]) -> io::Result<()> {
    let rows: Vec<Vec<String>> = topics
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.messages_in.to_string(),
                t.messages_out.to_string(),
                t.bytes_in.to_string(),
                t.bytes_out.to_string(),
                t.depth.to_string(),
                t.dropped.to_string(),
                t.publishers.to_string(),
                t.subscribers.to_string(),
            ]
        })
        .collect();
    write_table(
        out,
        &[
            "TOPIC",
            "MSGS IN",
            "MSGS OUT",
            "BYTES IN",
            "BYTES OUT",
            "DEPTH",
            "DROPPED",
            "PUBLISHERS",
            "SUBSCRIBERS",
        ],
        &[false, true, true, true, true, true, true, true, true],
        &rows,
    )?;
    let subscription_rows: Vec<Vec<String>> = topics
        .iter()
        .flat_map(|t| {
            t.subscriptions.iter().map(move |s| {
                vec![
                    t.name.clone(),
                    if s.ephemeral {
                        format!("{} (ephemeral)", s.name)
                    } else {
                        s.name.clone()
                    },
                    s.consumers.to_string(),
                    s.messages_out.to_string(),
                    s.bytes_out.to_string(),
                    s.backlog.to_string(),
                    s.in_flight.to_string(),
                    s.acked.to_string(),
                    s.redelivered.to_string(),
                    s.gave_up.to_string(),
                ]
            })
        })
        .collect();
    if !subscription_rows.is_empty() {
        writeln!(out)?;
        write_table(
            out,
            &[
                "TOPIC",
                "SUBSCRIPTION",
                "CONSUMERS",
                "MSGS OUT",
                "BYTES OUT",
                "BACKLOG",
                "IN FLIGHT",
                "ACKED",
                "REDELIVERED",
                "GAVE UP",
            ],
            &[false, false, true, true, true, true, true, true, true, true],
            &subscription_rows,
        )?;
    }
    Ok(())
}

fn topic_stats_json(t: &TopicStats) -> Value {
    let subscriptions: Vec<Value> = t
        .subscriptions
        .iter()
        .map(|s| {
            json!({
                "name": s.name,
                "ephemeral": s.ephemeral,
                "consumers": s.consumers,
                "messages_out": s.messages_out,
                "bytes_out": s.bytes_out,
                "backlog": s.backlog,
                "in_flight": s.in_flight,
                "acked": s.acked,
                "redelivered": s.redelivered,
                "gave_up": s.gave_up,
            })
        })
        .collect();
    json!({
        "name": t.name,
        "messages_in": t.messages_in,
        "messages_out": t.messages_out,
        "bytes_in": t.bytes_in,
        "bytes_out": t.bytes_out,
        "depth": t.depth,
        "depth_bytes": t.depth_bytes,
        "dropped": t.dropped,
        "publishers": t.publishers,
        "subscribers": t.subscribers,
        "subscriptions": subscriptions,
    })
}

#[cfg(test)]
mod tests {
    use ferrymq_client::Message;

    use super::*;

    #[test]
    fn start_positions_parse() {
        assert_eq!(parse_start("earliest"), Ok(StartPosition::Earliest));
        assert_eq!(parse_start("latest"), Ok(StartPosition::Latest));
        assert_eq!(parse_start("offset:42"), Ok(StartPosition::Offset(42)));
        assert_eq!(
            parse_start("time:1700000000000"),
            Ok(StartPosition::TimeMs(1_700_000_000_000))
        );
        assert!(parse_start("offset:x").is_err());
        assert!(parse_start("first").is_err());
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn headers_parse() {
        assert_eq!(parse_header("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert_eq!(parse_header("a="), Ok(("a".into(), String::new())));
        assert!(parse_header("=b").is_err());
        assert!(parse_header("ab").is_err());
    }

    #[tokio::test]
    async fn lines_are_read_without_terminators_and_bounded() {
        let mut input = BufReader::new(&b"one\r\ntwo\n\nlast"[..]);
        let mut line = Vec::new();
        let mut lines = Vec::new();
        while read_line_bounded(&mut input, &mut line, 10).await.unwrap() {
            lines.push(String::from_utf8(line.clone()).unwrap());
        }
        assert_eq!(lines, ["one", "two", "", "last"]);

        let mut long = BufReader::new(&b"0123456789abc\n"[..]);
        assert!(read_line_bounded(&mut long, &mut line, 10).await.is_err());
    }

    #[test]
    fn json_delivery_uses_hex_for_binary() {
        let delivery = Delivery {
            partition: 1,
            offset: 9,
            timestamp_ms: 5,
            attempt: 2,
            message: Message::new(vec![0xff, 0x00])
                .with_key("k")
                .with_header("h", "v"),
        };
        let value = delivery_json(&delivery);
        assert_eq!(value["id"], "1-9");
        assert_eq!(value["body_hex"], "ff00");
        assert!(value.get("body").is_none());
        assert_eq!(value["key"], "k");
        assert_eq!(value["headers"]["h"], "v");
        assert_eq!(value["attempt"], 2);
    }

    #[test]
    fn tables_align_columns() {
        let mut out = Vec::new();
        let rows = vec![
            vec!["a".to_string(), "1".to_string()],
            vec!["long-name".to_string(), "12345".to_string()],
        ];
        write_table(&mut out, &["NAME", "N"], &[false, true], &rows).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "NAME           N\na              1\nlong-name  12345\n"
        );
    }
}
