//! `ferrymq pub | sub | topic | stats | status | subscription | dead`: thin commands over the
//! Rust client.
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
use bytes::Bytes;
use clap::{Args, Subcommand, ValueEnum};
use ferrymq_client::protocol::limits::{ACK_RESULT_BYTES_MAX, LIST_LIMIT_MAX, LIST_PAGE_BYTES_MAX};
use ferrymq_client::{
    push_offset, Client, ClientConfig, Delivery, ErrorCode, FsyncPolicy, ListKind, Message,
    MessageEntry, MessageId, MessageState, MessageStatus, OverflowPolicy, PendingPublish,
    RequeueSelection, RetentionPolicy, StartPosition, Storage, SubscribeOptions, TlsOptions,
    TopicConfig, TopicInfo, TopicStats, ADDR_DEFAULT,
};
use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, BufReader};

/// Batches `pub` keeps in flight while it reads more lines.
const PUB_PIPELINE_BATCHES: usize = 8;

/// TLS to the broker: shared by every client command, the bench and the health check.
#[derive(Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// Connect with TLS (implied by --ca-file and --client-cert)
    #[arg(long, env = "FERRYMQ_TLS", global = true)]
    pub tls: bool,
    /// PEM certificates of the authorities to trust [default: the system's]
    #[arg(long, env = "FERRYMQ_CA_FILE", value_name = "PATH", global = true)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate, for a broker that logs client certificates in (mutual TLS)
    #[arg(long, env = "FERRYMQ_CLIENT_CERT", value_name = "PATH", global = true)]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert
    #[arg(long, env = "FERRYMQ_CLIENT_KEY", value_name = "PATH", global = true)]
    pub client_key: Option<PathBuf>,
    /// The name the broker's certificate must carry [default: the host of the address]
    #[arg(
        long,
        env = "FERRYMQ_TLS_SERVER_NAME",
        value_name = "NAME",
        global = true
    )]
    pub tls_server_name: Option<String>,
}

impl TlsArgs {
    /// `None` for plaintext.
    pub fn options(&self) -> Option<TlsOptions> {
        let wanted = self.tls || self.ca_file.is_some() || self.client_cert.is_some();
        wanted.then(|| TlsOptions {
            ca_file: self.ca_file.clone(),
            client_cert: self.client_cert.clone(),
            client_key: self.client_key.clone(),
            server_name: self.tls_server_name.clone(),
        })
    }
}

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
    /// File whose first line is the password for --user (a container secret, say); used when
    /// --password is not given.
    #[arg(
        long = "password-from",
        env = "FERRYMQ_PASSWORD_FILE",
        value_name = "PATH",
        global = true
    )]
    pub password_from: Option<PathBuf>,
    /// API token, used instead of --user and --password.
    #[arg(
        long,
        env = "FERRYMQ_TOKEN",
        default_value = "",
        hide_env_values = true,
        global = true
    )]
    pub token: String,
    #[command(flatten)]
    pub tls: TlsArgs,
}

impl ConnectArgs {
    pub fn config(&self, purpose: &str) -> anyhow::Result<ClientConfig> {
        let mut config = ClientConfig::new(self.addr.clone())
            .client_name(format!("ferrymq-{purpose}/{}", env!("CARGO_PKG_VERSION")));
        if let Some(tls) = self.tls.options() {
            config = config.tls(tls);
        }
        if !self.token.is_empty() {
            return Ok(config.token(self.token.clone()));
        }
        let password = match (&self.password_from, self.password.is_empty()) {
            (Some(path), true) => std::fs::read_to_string(path)
                .with_context(|| format!("cannot read the password file {}", path.display()))?
                .lines()
                .next()
                .unwrap_or("")
                .to_owned(),
            _ => self.password.clone(),
        };
        Ok(config.credentials(self.user.clone(), password))
    }

    /// The `Authorization` header for the HTTP API: the token as Bearer, else the user and
    /// password as Basic; `None` without credentials.
    pub fn authorization(&self) -> anyhow::Result<Option<String>> {
        use base64::Engine as _;
        let config = self.config("http")?;
        Ok(match (config.user.is_empty(), config.password.is_empty()) {
            (true, true) => None,
            (true, false) => Some(format!("Bearer {}", config.password)),
            (false, _) => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD
                    .encode(format!("{}:{}", config.user, config.password))
            )),
        })
    }

    pub async fn connect(&self, purpose: &str) -> anyhow::Result<Client> {
        Client::connect_with(self.config(purpose)?)
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
    /// Deliver no earlier than this long after publishing (e.g. 500ms, 30s, 2h, 1d; at most 30
    /// days).
    #[arg(long, value_parser = parse_duration)]
    pub delay: Option<Duration>,
    /// Lines per publish batch when reading lines; batches are pipelined.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub batch: u32,
    /// Print a one-line summary instead of one id per message.
    #[arg(long, short)]
    pub quiet: bool,
    /// Deduplication id (1 to 256 bytes): run again within the topic's window (2 minutes by
    /// default), the publish stores nothing and prints the first run's ids. Reading lines, line
    /// n gets ID-n, so a re-run of a whole import stores each line once.
    #[arg(long, value_name = "ID")]
    pub dedup_id: Option<String>,
}

fn parse_header(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
        _ => Err(format!("header {text:?} is not NAME=VALUE")),
    }
}

pub fn run_pub(args: PubArgs) -> anyhow::Result<()> {
    let topic = args.topic.clone();
    runtime()?
        .block_on(publish(args))
        .map_err(|error| unknown_topic_hint(error, &topic))
}

/// The broker's error code somewhere in `error`'s chain.
fn server_code(error: &anyhow::Error) -> Option<ErrorCode> {
    error
        .chain()
        .find_map(|cause| cause.downcast_ref::<ferrymq_client::Error>()?.code())
}

/// `pub` and `sub` create a missing topic when the broker allows it: meeting `unknown_topic`
/// means this broker does not, so the way out is to create it.
fn unknown_topic_hint(error: anyhow::Error, topic: &str) -> anyhow::Error {
    if server_code(&error) == Some(ErrorCode::UnknownTopic) {
        anyhow::anyhow!(
            "{error:#} (this broker does not create topics on first use: create it with \
             `ferrymq topic create {topic}`)"
        )
    } else {
        error
    }
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
    if let Some(delay) = args.delay {
        let ms = delay.as_millis();
        if ms > ferrymq_protocol::limits::DELAY_MS_MAX as u128 {
            anyhow::bail!("--delay {delay:?} is above the limit of 30 days");
        }
        template.deliver_after_ms = Some(ms as u64);
    }
    let client = args.connect.connect("pub").await?;
    let mut output = PubOutput {
        out: io::BufWriter::new(io::stdout()),
        quiet: args.quiet,
        published: 0,
        first: None,
        last: None,
    };

    if let Some(id) = &args.dedup_id {
        if id.is_empty() || id.len() > ferrymq_broker::DEDUP_ID_BYTES_MAX {
            anyhow::bail!(
                "--dedup-id must be 1 to {} bytes",
                ferrymq_broker::DEDUP_ID_BYTES_MAX
            );
        }
    }
    if let Some(text) = &args.message {
        let mut message = Message {
            body: text.clone().into_bytes().into(),
            ..template
        };
        if let Some(id) = &args.dedup_id {
            message = message.with_dedup_id(id.clone());
        }
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
            let mut message = Message {
                body: line.clone().into(),
                ..template.clone()
            };
            if let Some(id) = &args.dedup_id {
                message = message.with_dedup_id(format!("{id}-{line_number}"));
            }
            batch.push(message);
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
    after_help = "Examples:\n  ferrymq sub orders\n  ferrymq sub orders --subscription billing --from earliest --count 10 --format json\n  ferrymq sub orders --count 1 --timeout 5s\n  ferrymq sub orders --subscription shipping --ordered --dead-letter-topic orders.failed\n  ferrymq sub jobs --subscription workers --count 1 --ack-result 'done in 12 ms'"
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
    /// Exit after this many messages. The broker is asked for no more than that; anything taken
    /// but not printed goes back without counting an attempt.
    #[arg(long, short = 'n')]
    pub count: Option<u64>,
    /// Exit when no message arrives for this long (e.g. 500ms, 5s, 2m; a bare number is
    /// seconds); with --count, an exit before the count is an error.
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
    /// Ordered subscription: at most one message per key in flight across the subscription's
    /// consumers (key-less messages one at a time per partition), so each key is processed in
    /// order, redeliveries included. Set when the subscription is created; joining it with a
    /// different setting is refused.
    #[arg(long, conflicts_with = "no_ack")]
    pub ordered: bool,
    /// Where messages this subscription gives up go (default: <topic>.dlq). Set when the
    /// subscription is created.
    #[arg(long, value_name = "TOPIC")]
    pub dead_letter_topic: Option<String>,
    /// Attach this text to every ack (kept by the broker with the acked message, shown by
    /// `ferrymq status` and `ferrymq subscription list --kind acked`); each batch's ack then
    /// waits for the broker's confirmation. At most 4096 bytes.
    #[arg(long, value_name = "TEXT", conflicts_with = "no_ack")]
    pub ack_result: Option<String>,
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

/// Every duration the CLI takes (`--delay`, `--timeout`, `--retention`, the bench's): `500ms`,
/// `5s`, `2m`, `12h`, `7d`, or a bare number of seconds; fractions allowed (`1.5h`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration like 500ms, 5s, 2m, 12h, 7d or 1.5");
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = text.strip_suffix('h') {
        (n, 3600.0)
    } else if let Some(n) = text.strip_suffix('d') {
        (n, 86_400.0)
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
    /// The broker refused or ended the subscription: reported once what was printed is acked.
    Failed(anyhow::Error),
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
        .partitions(args.partitions.clone().map_or(Vec::new(), |list| list.0))
        .ordered(args.ordered);
    if let Some(name) = &args.subscription {
        options = options.subscription(name.clone());
    }
    if let Some(topic) = &args.dead_letter_topic {
        options = options.dead_letter_topic(topic.clone());
    }
    // Asks only for what it will print: a message taken and never printed would come back
    // to the subscription later, and nothing else should wait on it meanwhile.
    if let Some(count) = args.count {
        options = options.limit(count);
    }
    let ack_result = args.ack_result.clone().map(Bytes::from);
    if let Some(result) = &ack_result {
        if result.len() > ACK_RESULT_BYTES_MAX {
            bail!(
                "--ack-result is {} bytes; an ack result is at most {ACK_RESULT_BYTES_MAX} bytes",
                result.len()
            );
        }
    }
    let mut subscription = client
        .subscribe(options)
        .await
        .with_context(|| format!("cannot subscribe to {}", args.topic))
        .map_err(|error| unknown_topic_hint(error, &args.topic))?;
    let mut out = io::BufWriter::new(io::stdout());
    let mut ranges = Vec::new();
    // Delivered but not printed (the count was reached, or the output closed): released on
    // exit, their delivery not counted as an attempt.
    let mut unprinted = Vec::new();
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
            // The only subscription of this connection: a server error (its topic deleted, an
            // ack refused) is about it, and whatever it printed may not be settled.
            Some(Some(Err(error))) if error.code() == Some(ErrorCode::UnknownTopic) => {
                break SubEnd::Failed(anyhow::Error::new(error).context(format!(
                    "topic {} was deleted: the subscription ended after {received} messages",
                    args.topic
                )))
            }
            Some(Some(Err(error))) => {
                break SubEnd::Failed(anyhow::Error::new(error).context(format!(
                    "the broker ended the subscription to {} after {received} messages",
                    args.topic
                )))
            }
            Some(Some(Ok(batch))) => batch,
        };
        let mut output_closed = false;
        for delivery in batch.iter() {
            if output_closed || args.count.is_some_and(|count| received >= count) {
                push_offset(&mut unprinted, delivery.partition, delivery.offset);
                continue;
            }
            if let Err(error) = print_delivery(&mut out, &delivery, args.format) {
                if error.kind() == io::ErrorKind::BrokenPipe {
                    output_closed = true;
                    push_offset(&mut unprinted, delivery.partition, delivery.offset);
                    continue;
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
        if output_closed {
            // Whether the reader saw them is unknown: given back, as if never printed.
            unprinted.append(&mut ranges);
        }
        // Acked only once printed and flushed; what was not printed is released on exit.
        if !args.no_ack && !output_closed && !ranges.is_empty() {
            match &ack_result {
                Some(result) => subscription
                    .ack_ranges_with_result(&ranges, result.clone())
                    .await
                    .context("acking with a result failed")?,
                // The batch that completes --count is the last: its ack is confirmed (saved,
                // on a disk topic) before `sub` exits, so a crash right after cannot hand the
                // messages it printed to this subscription again. Earlier batches go unconfirmed:
                // the confirmed one is written after them on the same connection.
                None if args.count.is_some_and(|count| received >= count) => {
                    subscription.ack_confirmed(&ranges).await?
                }
                None => subscription.ack_ranges(&ranges).await?,
            }
        }
        ranges.clear();
        if output_closed {
            break SubEnd::OutputClosed;
        }
    };
    // Closing also sends the acks still queued, so what was printed is not delivered again.
    if let Err(error) = subscription.close_releasing(&unprinted).await {
        // After the broker ended the subscription, its refusal to unsubscribe says nothing new.
        if !matches!(end, SubEnd::Failed(_)) {
            eprintln!("warning: unsubscribing failed: {error}");
        }
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
        SubEnd::Failed(error) => Err(error),
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
pub enum RetentionPolicyArg {
    /// Keep messages until the age and size limits, acked or not: a subscription created later
    /// with --from earliest reads them (the default for disk topics).
    Stream,
    /// Delete messages once every subscription settled them (the default for memory topics).
    WorkQueue,
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
    /// Skip the damaged ranges that reads found in a partition (GET /status lists them as
    /// `unreadable_range`): every subscription settles those offsets without delivering them and
    /// moves on. Restore the segment file from a backup instead if the messages matter. Goes
    /// through the HTTP API.
    SkipDamaged {
        /// Topic name.
        name: String,
        /// The partition whose damaged ranges are skipped.
        #[arg(long)]
        partition: u32,
        /// Address of the broker's HTTP API, host:port.
        #[arg(long, env = "FERRYMQ_HTTP_ADDR", default_value = "127.0.0.1:7080")]
        http_addr: String,
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
    /// Number of partitions, 1 to 1024; order is kept within a partition. Default: the
    /// server's.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=ferrymq_protocol::limits::PARTITIONS_MAX as i64))]
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
    /// Whether messages every subscription settled stay until the limits (stream) or go at once
    /// (work-queue). Default: stream for disk topics, work-queue for memory topics.
    #[arg(long, value_enum)]
    pub retention_policy: Option<RetentionPolicyArg>,
    /// How long deduplication ids are remembered (e.g. 2m, 30s; at most 1d). Default: the
    /// server's (2 minutes).
    #[arg(long, value_parser = parse_duration)]
    pub dedup_window: Option<Duration>,
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

/// A retention age in milliseconds: a duration as [`parse_duration`] reads it (`7d`, `12h`),
/// at least 1 ms, or `forever`.
fn parse_retention(text: &str) -> Result<u64, String> {
    if text == "forever" {
        return Ok(u64::MAX);
    }
    let ms = parse_duration(text)?.as_millis();
    match u64::try_from(ms) {
        Ok(0) => Err(format!(
            "{text:?} keeps nothing: give a retention of at least 1ms, or forever"
        )),
        // u64::MAX means forever on the wire.
        Ok(ms) if ms < u64::MAX => Ok(ms),
        _ => Err(format!(
            "{text:?} is longer than any retention: use forever"
        )),
    }
}

pub fn run_topic(args: TopicArgs) -> anyhow::Result<()> {
    runtime()?.block_on(topic(args))
}

/// Bounds on the one HTTP exchange `topic skip-damaged` makes: the reply is a small JSON
/// document, and a broker that does not answer in time is reported rather than waited for.
const HTTP_REPLY_BYTES_MAX: u64 = 1 << 20;
const HTTP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// POSTs an empty body to `path` on the HTTP API at `addr` and returns the status code and body.
/// HTTP/1.1 with `Connection: close`, so the reply ends with the connection.
async fn http_post(addr: &str, path: &str, connect: &ConnectArgs) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authorization = connect
        .authorization()?
        .map(|value| format!("Authorization: {value}\r\n"))
        .unwrap_or_default();
    let tls = match connect.tls.options() {
        Some(options) => Some((
            tokio_rustls::TlsConnector::from(options.client_config()?),
            options.server_name(addr)?,
        )),
        None => None,
    };
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(addr).await.with_context(|| {
            format!("cannot connect to the HTTP API at {addr} (set --http-addr or FERRYMQ_HTTP_ADDR)")
        })?;
        let host = addr;
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {host}\r\n{authorization}Content-Length: 0\r\nConnection: close\r\n\r\n"
        );
        let mut reply = Vec::new();
        match tls {
            None => {
                let mut stream = stream;
                stream.write_all(request.as_bytes()).await?;
                (&mut stream)
                    .take(HTTP_REPLY_BYTES_MAX)
                    .read_to_end(&mut reply)
                    .await?;
            }
            Some((connector, name)) => {
                let mut stream = connector
                    .connect(name, stream)
                    .await
                    .with_context(|| format!("TLS handshake with the HTTP API at {addr} failed"))?;
                stream.write_all(request.as_bytes()).await?;
                stream.flush().await?;
                let read = (&mut stream)
                    .take(HTTP_REPLY_BYTES_MAX)
                    .read_to_end(&mut reply)
                    .await;
                // A server that closes without TLS's close_notify has still answered in full.
                if let Err(error) = read {
                    if error.kind() != io::ErrorKind::UnexpectedEof || reply.is_empty() {
                        return Err(error.into());
                    }
                }
            }
        }
        anyhow::Ok(reply)
    };
    let reply = tokio::time::timeout(HTTP_TIMEOUT, exchange)
        .await
        .map_err(|_| anyhow::anyhow!("the HTTP API at {addr} did not answer within 30 s"))??;
    let text = String::from_utf8_lossy(&reply);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("the HTTP API at {addr} sent an incomplete reply"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| anyhow::anyhow!("the HTTP API at {addr} sent no status line"))?;
    // Small replies are sent with a length; a chunked one is unwrapped (one chunk, then the end).
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body.split("\r\n")
            .skip(1)
            .step_by(2)
            .collect::<Vec<_>>()
            .join("")
    } else {
        body.to_string()
    };
    Ok((status, body))
}

async fn skip_damaged(
    out: &mut impl Write,
    name: &str,
    partition: u32,
    http_addr: &str,
    connect: &ConnectArgs,
) -> anyhow::Result<()> {
    let path = format!("/topics/{name}/partitions/{partition}/skip-damaged");
    let (status, body) = http_post(http_addr, &path, connect).await?;
    let json: serde_json::Value = serde_json::from_str(&body)
        .with_context(|| format!("the HTTP API answered {status} with: {body}"))?;
    if status != 200 {
        let message = json["error"]["message"].as_str().unwrap_or(&body);
        anyhow::bail!("cannot skip damaged ranges of {name} partition {partition}: {message}");
    }
    let skipped = json["skipped"].as_array().cloned().unwrap_or_default();
    if skipped.is_empty() {
        writeln!(
            out,
            "no damaged range known in {name} partition {partition}"
        )?;
    }
    for range in &skipped {
        writeln!(
            out,
            "skipped offsets {}..{} of {name} partition {partition}: {} at byte {} ({})",
            range["first_offset"],
            range["end_offset"],
            range["file"].as_str().unwrap_or("?"),
            range["position"],
            range["reason"].as_str().unwrap_or("")
        )?;
    }
    writeln!(
        out,
        "{} messages settled over all subscriptions",
        json["settled"]
    )?;
    Ok(())
}

async fn topic(args: TopicArgs) -> anyhow::Result<()> {
    if let TopicCommand::SkipDamaged {
        name,
        partition,
        http_addr,
    } = &args.command
    {
        let mut out = io::stdout().lock();
        return skip_damaged(&mut out, name, *partition, http_addr, &args.connect).await;
    }
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
                retention_policy: match create.retention_policy {
                    None => RetentionPolicy::Default,
                    Some(RetentionPolicyArg::Stream) => RetentionPolicy::Stream,
                    Some(RetentionPolicyArg::WorkQueue) => RetentionPolicy::WorkQueue,
                },
                dedup_window_ms: match create.dedup_window.map(|d| d.as_millis()) {
                    None => 0,
                    Some(0) => anyhow::bail!("--dedup-window must be at least 1ms"),
                    Some(ms) => u64::try_from(ms).unwrap_or(u64::MAX),
                },
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
        TopicCommand::SkipDamaged { .. } => {
            unreachable!("skip-damaged goes through the HTTP API, before connecting")
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
                    ("retention policy", info.config.retention_policy.to_string()),
                    (
                        "dedup window",
                        format!("{} ms", info.config.dedup_window_ms),
                    ),
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
        "retention_policy": info.config.retention_policy.to_string(),
        "dedup_window_ms": info.config.dedup_window_ms,
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
    let topics = match client.stats(args.topic.as_deref()).await {
        // Every topic's statistics do not fit one frame: one topic at a time.
        Err(error) if args.topic.is_none() && error.code() == Some(ErrorCode::FrameTooLarge) => {
            let mut all = Vec::new();
            for topic in client.list_topics().await.context("cannot list topics")? {
                match client.stats(Some(&topic.name)).await {
                    Ok(stats) => all.extend(stats),
                    // Deleted in the meantime.
                    Err(e) if e.code() == Some(ErrorCode::UnknownTopic) => {}
                    Err(e) => {
                        return Err(e).context(format!("cannot read statistics of {}", topic.name))
                    }
                }
            }
            all
        }
        result => result.context("cannot read statistics")?,
    };
    let _ = client.close().await;
    let mut out = io::stdout().lock();
    if args.json {
        // The same document as the HTTP API's `GET /stats`.
        let list = ferrymq_http::StatsList {
            topics: topics.into_iter().map(Into::into).collect(),
        };
        writeln!(out, "{}", serde_json::to_string_pretty(&list)?)?;
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
        let latency_rows: Vec<Vec<String>> = topics
            .iter()
            .flat_map(|t| {
                t.subscriptions.iter().map(move |s| {
                    let (d, a) = (s.deliver_latency.summary(), s.ack_latency.summary());
                    vec![
                        t.name.clone(),
                        s.name.clone(),
                        d.count.to_string(),
                        duration_us(d.p50),
                        duration_us(d.p99),
                        duration_us(d.max),
                        a.count.to_string(),
                        duration_us(a.p50),
                        duration_us(a.p99),
                        duration_us(a.max),
                    ]
                })
            })
            .collect();
        writeln!(out)?;
        write_table(
            out,
            &[
                "TOPIC",
                "SUBSCRIPTION",
                "DELIVERED",
                "TO DELIVER p50",
                "p99",
                "max",
                "ACKED",
                "TO ACK p50",
                "p99",
                "max",
            ],
            &[false, false, true, true, true, true, true, true, true, true],
            &latency_rows,
        )?;
    }
    Ok(())
}

/// A latency for people: `-` when there is none, else µs, ms or s with 2–3 significant digits.
fn duration_us(us: Option<u64>) -> String {
    match us {
        None => "-".into(),
        Some(us) if us < 1_000 => format!("{us}µs"),
        Some(us) if us < 1_000_000 => trim_unit(us as f64 / 1e3, "ms"),
        Some(us) => trim_unit(us as f64 / 1e6, "s"),
    }
}

fn trim_unit(value: f64, unit: &str) -> String {
    if value < 10.0 {
        format!("{value:.2}{unit}")
    } else if value < 100.0 {
        format!("{value:.1}{unit}")
    } else {
        format!("{value:.0}{unit}")
    }
}

// ---------------------------------------------------------------------------------------------
// status

#[derive(Args, Debug)]
#[command(
    after_help = "The id is <partition>-<offset>, as `ferrymq pub` prints it.\n\nExamples:\n  ferrymq status orders 0-17\n  ferrymq status orders 3-1041 --json"
)]
pub struct StatusArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    /// Topic of the message.
    pub topic: String,
    /// Message id: <partition>-<offset>, e.g. 0-17.
    #[arg(value_parser = parse_message_id)]
    pub id: MessageId,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

fn parse_message_id(text: &str) -> Result<MessageId, String> {
    let bad = || format!("{text:?} is not a message id: use <partition>-<offset>, e.g. 0-17");
    let (partition, offset) = text.split_once('-').ok_or_else(bad)?;
    if !is_decimal(partition) || !is_decimal(offset) {
        return Err(bad());
    }
    Ok(MessageId::new(
        partition.parse().map_err(|_| bad())?,
        offset.parse().map_err(|_| bad())?,
    ))
}

fn is_decimal(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

pub fn run_status(args: StatusArgs) -> anyhow::Result<()> {
    runtime()?.block_on(status(args))
}

async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let client = args.connect.connect("status").await?;
    let status = client
        .message_status(&args.topic, args.id.partition, args.id.offset)
        .await
        .with_context(|| format!("cannot read the status of {} in {}", args.id, args.topic))?;
    let _ = client.close().await;
    let mut out = io::stdout().lock();
    if args.json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&message_status_json(&args.topic, &status))?
        )?;
    } else {
        write_message_status(&mut out, &args.topic, &status)?;
    }
    out.flush()?;
    Ok(())
}

fn write_message_status(
    out: &mut impl Write,
    topic: &str,
    status: &MessageStatus,
) -> io::Result<()> {
    let key = match &status.key {
        None => "-".to_string(),
        Some(key) => bytes_text(key),
    };
    let rows = [
        (
            "message",
            format!("{topic} {}-{}", status.partition, status.offset),
        ),
        ("published", time_text(status.published_ms)),
        ("priority", status.priority.to_string()),
        ("key", key),
        ("body", format!("{} bytes", status.body_bytes)),
    ];
    for (label, value) in rows {
        writeln!(out, "{label:<18} {value}")?;
    }
    if status.subscriptions.is_empty() {
        writeln!(out, "\nno subscriptions")?;
    }
    for sub in &status.subscriptions {
        let e = &sub.entry;
        writeln!(out, "\nsubscription {}", sub.subscription)?;
        if e.state == MessageState::BeforeStart {
            writeln!(
                out,
                "  {:<16} before_start (published before the subscription started: never its own)",
                "state"
            )?;
            continue;
        }
        let mut rows = vec![
            ("state", e.state.to_string()),
            ("attempts", e.attempts.to_string()),
            ("first delivered", time_text(e.first_delivered_ms)),
            ("settled", time_text(e.settled_ms)),
        ];
        if e.due_ms != 0 {
            rows.push(("due", time_text(e.due_ms)));
        }
        if !e.result.is_empty() {
            rows.push(("result", bytes_text(&e.result)));
        }
        if !e.reason.is_empty() {
            rows.push(("reason", e.reason.clone()));
        }
        if let Some((partition, offset)) = e.dead_letter {
            rows.push(("dead letter", format!("{partition}-{offset}")));
        }
        for (label, value) in rows {
            writeln!(out, "  {label:<16} {value}")?;
        }
    }
    Ok(())
}

fn message_status_json(topic: &str, status: &MessageStatus) -> Value {
    let mut object = serde_json::Map::new();
    object.insert("topic".into(), json!(topic));
    object.insert(
        "id".into(),
        json!(format!("{}-{}", status.partition, status.offset)),
    );
    object.insert("partition".into(), json!(status.partition));
    object.insert("offset".into(), json!(status.offset));
    object.insert("published_ms".into(), json!(status.published_ms));
    object.insert("priority".into(), json!(status.priority));
    insert_bytes(&mut object, "key", status.key.as_deref());
    object.insert("body_bytes".into(), json!(status.body_bytes));
    let subscriptions: Vec<Value> = status
        .subscriptions
        .iter()
        .map(|s| {
            let mut entry = entry_json(&s.entry);
            if let Value::Object(map) = &mut entry {
                map.insert("subscription".into(), json!(s.subscription));
            }
            entry
        })
        .collect();
    object.insert("subscriptions".into(), json!(subscriptions));
    Value::Object(object)
}

/// A message entry as JSON: times in Unix ms (`null` when not known or not applicable), the
/// result as `result` when UTF-8, else as `result_hex`.
fn entry_json(e: &MessageEntry) -> Value {
    let time = |ms: u64| if ms == 0 { Value::Null } else { json!(ms) };
    let mut object = serde_json::Map::new();
    object.insert("id".into(), json!(format!("{}-{}", e.partition, e.offset)));
    object.insert("partition".into(), json!(e.partition));
    object.insert("offset".into(), json!(e.offset));
    object.insert("state".into(), json!(e.state.as_str()));
    object.insert("attempts".into(), json!(e.attempts));
    object.insert("published_ms".into(), time(e.published_ms));
    object.insert("first_delivered_ms".into(), time(e.first_delivered_ms));
    object.insert("settled_ms".into(), time(e.settled_ms));
    object.insert("due_ms".into(), time(e.due_ms));
    insert_bytes(
        &mut object,
        "result",
        (!e.result.is_empty()).then_some(&e.result[..]),
    );
    object.insert(
        "reason".into(),
        if e.reason.is_empty() {
            Value::Null
        } else {
            json!(e.reason)
        },
    );
    object.insert(
        "dead_letter".into(),
        match e.dead_letter {
            None => Value::Null,
            Some((partition, offset)) => json!({
                "id": format!("{partition}-{offset}"),
                "partition": partition,
                "offset": offset,
            }),
        },
    );
    Value::Object(object)
}

/// Inserts `name` as a string when the bytes are UTF-8, `<name>_hex` otherwise, `null` for none.
fn insert_bytes(object: &mut serde_json::Map<String, Value>, name: &str, bytes: Option<&[u8]>) {
    match bytes {
        None => {
            object.insert(name.into(), Value::Null);
        }
        Some(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => {
                object.insert(name.into(), json!(text));
            }
            Err(_) => {
                object.insert(format!("{name}_hex"), json!(to_hex(bytes)));
            }
        },
    }
}

/// Bytes for people: the text when it is UTF-8 without control characters, else `hex:...`.
fn bytes_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_string(),
        _ => format!("hex:{}", to_hex(bytes)),
    }
}

/// A Unix time in ms as UTC, `2026-11-21T12:00:00.123Z`; `-` for 0 (never, or unknown).
pub(crate) fn time_text(ms: u64) -> String {
    if ms == 0 {
        return "-".to_string();
    }
    let (secs, millis) = (ms / 1000, ms % 1000);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm), proleptic Gregorian.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// subscription

#[derive(Args, Debug)]
pub struct SubscriptionArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(subcommand)]
    pub command: SubscriptionCommand,
}

#[derive(Subcommand, Debug)]
pub enum SubscriptionCommand {
    /// List a subscription's messages of one kind, a page at a time.
    List(SubscriptionListArgs),
    /// Delete a named subscription and its position (refused while consumers are attached).
    #[command(after_help = "Example:\n  ferrymq subscription delete orders billing")]
    Delete {
        /// Topic of the subscription.
        topic: String,
        /// Subscription name.
        subscription: String,
    },
}

#[derive(Args, Debug)]
#[command(
    after_help = "Pending and in-flight messages list in partition, then offset order (pending includes delayed ones); acked and dead-lettered ones newest first, from the broker's bounded history. Without --all one page is printed, followed by the token of the next page when there is one: pass it to --page.\n\nExamples:\n  ferrymq subscription list orders billing --kind pending\n  ferrymq subscription list orders billing --kind pending --limit 50 --page 000000006400000000000000\n  ferrymq subscription list orders billing --kind dead_lettered --all --json"
)]
pub struct SubscriptionListArgs {
    /// Topic of the subscription.
    pub topic: String,
    /// Subscription name.
    pub subscription: String,
    /// Which messages: pending, in_flight, acked or dead_lettered.
    #[arg(long)]
    pub kind: ListKind,
    /// Messages per page (1 to 1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=LIST_LIMIT_MAX as i64))]
    pub limit: u32,
    /// Continue from this page token (hex, as printed after a page).
    #[arg(long, value_name = "TOKEN", value_parser = parse_page_token, conflicts_with = "all")]
    pub page: Option<Bytes>,
    /// Walk every page (a listing of the moment; messages that change state meanwhile may be
    /// missed or seen twice).
    #[arg(long)]
    pub all: bool,
    /// Print JSON: {"entries": [...], "next_page": "hex" or null}.
    #[arg(long)]
    pub json: bool,
}

fn parse_page_token(text: &str) -> Result<Bytes, String> {
    match from_hex(text) {
        Some(bytes) if bytes.len() <= LIST_PAGE_BYTES_MAX => Ok(bytes.into()),
        Some(bytes) => Err(format!(
            "a page token is at most {LIST_PAGE_BYTES_MAX} bytes, this one has {}",
            bytes.len()
        )),
        None => Err(format!(
            "{text:?} is not a page token: pass the hex token a listing printed"
        )),
    }
}

pub fn run_subscription(args: SubscriptionArgs) -> anyhow::Result<()> {
    runtime()?.block_on(subscription(args))
}

async fn subscription(args: SubscriptionArgs) -> anyhow::Result<()> {
    let client = args.connect.connect("subscription").await?;
    let result = match args.command {
        SubscriptionCommand::List(list) => list_subscription(&client, list).await,
        SubscriptionCommand::Delete {
            topic,
            subscription,
        } => {
            client
                .delete_subscription(&topic, &subscription)
                .await
                .with_context(|| format!("cannot delete subscription {subscription} of {topic}"))?;
            let mut out = io::stdout().lock();
            writeln!(out, "subscription {subscription} of {topic} deleted")?;
            out.flush()?;
            Ok(())
        }
    };
    let _ = client.close().await;
    result
}

/// Column widths of `subscription list` lines: id, state, attempts, then times.
const LIST_HEADER: [&str; 7] = [
    "ID",
    "STATE",
    "ATTEMPTS",
    "PUBLISHED",
    "FIRST DELIVERED",
    "SETTLED",
    "DUE",
];

fn list_line(e: &MessageEntry) -> String {
    let mut line = format!(
        "{:<14}  {:<13}  {:>8}  {:<24}  {:<24}  {:<24}  {:<24}",
        format!("{}-{}", e.partition, e.offset),
        e.state.as_str(),
        e.attempts,
        time_text(e.published_ms),
        time_text(e.first_delivered_ms),
        time_text(e.settled_ms),
        time_text(e.due_ms),
    );
    if !e.result.is_empty() {
        line.push_str(&format!("  result={}", bytes_text(&e.result)));
    }
    if !e.reason.is_empty() {
        line.push_str(&format!("  reason={}", e.reason));
    }
    if let Some((partition, offset)) = e.dead_letter {
        line.push_str(&format!("  dead-letter={partition}-{offset}"));
    }
    line.trim_end().to_string()
}

async fn list_subscription(client: &Client, args: SubscriptionListArgs) -> anyhow::Result<()> {
    let mut out = io::BufWriter::new(io::stdout().lock());
    let mut page = args.page.clone().unwrap_or_default();
    let mut listed = 0u64;
    if args.json {
        write!(out, "{{\"entries\":[")?;
    }
    // Bounded by the listing: each turn takes a page; a token handed back unchanged ends it.
    let next_page = loop {
        let (entries, next) = client
            .list_messages(
                &args.topic,
                &args.subscription,
                args.kind,
                page.clone(),
                args.limit,
            )
            .await
            .with_context(|| {
                format!(
                    "cannot list {} messages of subscription {} of {}",
                    args.kind, args.subscription, args.topic
                )
            })?;
        for entry in &entries {
            if args.json {
                if listed > 0 {
                    write!(out, ",")?;
                }
                serde_json::to_writer(&mut out, &entry_json(entry))?;
            } else {
                if listed == 0 {
                    writeln!(out, "{}", list_line_header())?;
                }
                writeln!(out, "{}", list_line(entry))?;
            }
            listed += 1;
        }
        if !args.all || next.is_empty() {
            break next;
        }
        if next == page {
            bail!("the broker handed back the same page token twice; listing stopped");
        }
        page = next;
    };
    if args.json {
        let next = if next_page.is_empty() {
            Value::Null
        } else {
            json!(to_hex(&next_page))
        };
        writeln!(out, "],\"next_page\":{next}}}")?;
    } else {
        if listed == 0 {
            writeln!(
                out,
                "no {} messages in subscription {} of {}",
                args.kind, args.subscription, args.topic
            )?;
        }
        if !next_page.is_empty() {
            writeln!(out, "next page: {}", to_hex(&next_page))?;
        }
    }
    out.flush()?;
    Ok(())
}

fn list_line_header() -> String {
    let h = LIST_HEADER;
    format!(
        "{:<14}  {:<13}  {:>8}  {:<24}  {:<24}  {:<24}  {}",
        h[0], h[1], h[2], h[3], h[4], h[5], h[6]
    )
}

// ---------------------------------------------------------------------------------------------
// dead

#[derive(Args, Debug)]
pub struct DeadArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(subcommand)]
    pub command: DeadCommand,
}

#[derive(Subcommand, Debug)]
pub enum DeadCommand {
    /// Publish dead letters again to their source topic, for the subscription each one died in.
    Requeue(DeadRequeueArgs),
}

#[derive(Args, Debug)]
#[command(
    after_help = "Each dead letter is requeued at most once: a second requeue of the same ones skips them. Other subscriptions of the source topic do not see a requeued message again.\n\nSelections (ids in the dead-letter topic, as `ferrymq sub <dlq> --format json` or `ferrymq status` show):\n  --all            every dead letter of the topic\n  0-17             the dead letter at partition 0, offset 17\n  0-10..19         offsets 10 to 19 of partition 0, inclusive (also 0-10..0-19)\n\nExamples:\n  ferrymq dead requeue orders.dlq --all\n  ferrymq dead requeue orders.dlq 0-17\n  ferrymq dead requeue orders.dlq 0-10..0-19\n  ferrymq dead requeue --topic orders --all      # the default dead-letter topic of orders"
)]
pub struct DeadRequeueArgs {
    /// The dead-letter topic, e.g. orders.dlq (or give --topic).
    #[arg(value_name = "DEAD_LETTER_TOPIC")]
    pub dead_letter_topic: Option<String>,
    /// Which dead letters: <partition>-<offset> or <partition>-<first>..<last>.
    #[arg(value_name = "SELECTION")]
    pub selection: Option<String>,
    /// The source topic: requeue from its default dead-letter topic, <TOPIC>.dlq.
    #[arg(long, value_name = "TOPIC")]
    pub topic: Option<String>,
    /// Requeue every dead letter of the topic.
    #[arg(long)]
    pub all: bool,
    /// How long to wait for the broker (each dead letter is published again).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Print JSON: {"requeued": N, "skipped": M}.
    #[arg(long)]
    pub json: bool,
}

/// `0-17`, `0-10..19` or `0-10..0-19`: inclusive offsets of one partition.
fn parse_requeue_range(text: &str) -> Result<RequeueSelection, String> {
    let bad = || {
        format!("{text:?} is not a selection: use <partition>-<offset> (0-17) or <partition>-<first>..<last> (0-10..19)")
    };
    let (start, end) = match text.split_once("..") {
        Some((start, end)) => (start, Some(end)),
        None => (text, None),
    };
    let first = parse_message_id(start).map_err(|_| bad())?;
    let last = match end {
        None => first.offset,
        Some(end) => match end.split_once('-') {
            Some(_) => {
                let last = parse_message_id(end).map_err(|_| bad())?;
                if last.partition != first.partition {
                    return Err(format!(
                        "{text:?} spans partitions {} and {}: a range stays within one partition",
                        first.partition, last.partition
                    ));
                }
                last.offset
            }
            None if is_decimal(end) => end.parse().map_err(|_| bad())?,
            None => return Err(bad()),
        },
    };
    if last < first.offset {
        return Err(format!(
            "{text:?} ends before it starts: the last offset must not be below the first"
        ));
    }
    Ok(RequeueSelection::Range {
        partition: first.partition,
        first: first.offset,
        last,
    })
}

impl DeadRequeueArgs {
    /// The dead-letter topic and the selection, from the positionals, --topic and --all.
    fn resolve(&self) -> anyhow::Result<(String, RequeueSelection)> {
        let (topic, selection) = match (&self.topic, &self.dead_letter_topic, &self.selection) {
            (Some(_), _, Some(_)) => {
                bail!("give either a dead-letter topic or --topic, not both")
            }
            // With --topic, the one positional is the selection.
            (Some(source), selection, None) => {
                (format!("{source}.dlq"), selection.clone())
            }
            (None, Some(dlq), selection) => (dlq.clone(), selection.clone()),
            (None, None, _) => bail!(
                "name the dead-letter topic (e.g. ferrymq dead requeue orders.dlq --all) or its source with --topic"
            ),
        };
        let selection = match (self.all, selection) {
            (true, None) => RequeueSelection::All,
            (false, Some(text)) => parse_requeue_range(&text).map_err(anyhow::Error::msg)?,
            (true, Some(text)) => bail!("give either --all or a selection ({text}), not both"),
            (false, None) => {
                bail!("say which dead letters: --all, an id like 0-17, or a range like 0-10..19")
            }
        };
        Ok((topic, selection))
    }
}

pub fn run_dead(args: DeadArgs) -> anyhow::Result<()> {
    runtime()?.block_on(dead(args))
}

async fn dead(args: DeadArgs) -> anyhow::Result<()> {
    match args.command {
        DeadCommand::Requeue(requeue) => {
            let (topic, selection) = requeue.resolve()?;
            let config = args
                .connect
                .config("dead")?
                .request_timeout(Some(requeue.timeout));
            let client = Client::connect_with(config).await.with_context(|| {
                format!(
                    "cannot connect to FerryMQ at {} (set --addr or FERRYMQ_ADDR)",
                    args.connect.addr
                )
            })?;
            let result = client.requeue_dead_letters(&topic, selection).await;
            let _ = client.close().await;
            let (requeued, skipped) =
                result.with_context(|| format!("cannot requeue dead letters of {topic}"))?;
            let mut out = io::stdout().lock();
            if requeue.json {
                writeln!(
                    out,
                    "{}",
                    json!({ "requeued": requeued, "skipped": skipped })
                )?;
            } else {
                writeln!(out, "requeued {requeued}, skipped {skipped}")?;
            }
            out.flush()?;
            Ok(())
        }
    }
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
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("d").is_err());
        assert!(parse_duration("1w").is_err());
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn partition_lists_parse_and_say_what_is_wrong() {
        assert_eq!(parse_partitions("0,2-3").unwrap().0, vec![(0, 0), (2, 3)]);
        let reversed = parse_partitions("3-1").unwrap_err();
        assert!(
            reversed.contains("reversed") && reversed.contains("1-3"),
            "{reversed}"
        );
        assert!(parse_partitions("a-1").is_err());
        assert!(parse_partitions("").is_err());
    }

    #[test]
    fn retention_reads_durations_like_every_other_flag() {
        assert_eq!(parse_retention("7d"), Ok(7 * 86_400_000));
        assert_eq!(parse_retention("12h"), Ok(12 * 3_600_000));
        assert_eq!(parse_retention("500ms"), Ok(500));
        assert_eq!(parse_retention("forever"), Ok(u64::MAX));
        assert!(parse_retention("0s").unwrap_err().contains("keeps nothing"));
        assert!(parse_retention("soon").is_err());
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
    fn message_ids_and_requeue_selections_parse() {
        assert_eq!(parse_message_id("3-1041"), Ok(MessageId::new(3, 1041)));
        for bad in ["3", "-1", "3-", "a-1", "+3-1", "3-1-2", " 3-1"] {
            assert!(parse_message_id(bad).is_err(), "{bad}");
        }
        let range = |partition, first, last| RequeueSelection::Range {
            partition,
            first,
            last,
        };
        assert_eq!(parse_requeue_range("0-17"), Ok(range(0, 17, 17)));
        assert_eq!(parse_requeue_range("2-10..19"), Ok(range(2, 10, 19)));
        assert_eq!(parse_requeue_range("2-10..2-19"), Ok(range(2, 10, 19)));
        assert_eq!(parse_requeue_range("2-10..10"), Ok(range(2, 10, 10)));
        assert!(parse_requeue_range("2-10..1-19")
            .unwrap_err()
            .contains("one partition"));
        assert!(parse_requeue_range("2-10..9")
            .unwrap_err()
            .contains("ends before it starts"));
        for bad in ["all", "2-10..", "2-10..x", "..5", "2-10...12"] {
            assert!(parse_requeue_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn requeue_arguments_resolve_to_a_topic_and_a_selection() {
        let args = |dlq: Option<&str>, selection: Option<&str>, topic: Option<&str>, all| {
            DeadRequeueArgs {
                dead_letter_topic: dlq.map(String::from),
                selection: selection.map(String::from),
                topic: topic.map(String::from),
                all,
                timeout: Duration::from_secs(1),
                json: false,
            }
            .resolve()
        };
        assert_eq!(
            args(Some("orders.dlq"), None, None, true).unwrap(),
            ("orders.dlq".to_string(), RequeueSelection::All)
        );
        assert_eq!(
            args(Some("0-4"), None, Some("orders"), false).unwrap(),
            (
                "orders.dlq".to_string(),
                RequeueSelection::Range {
                    partition: 0,
                    first: 4,
                    last: 4
                }
            )
        );
        assert!(args(None, None, None, true).is_err());
        assert!(args(Some("orders.dlq"), None, None, false).is_err());
        assert!(args(Some("orders.dlq"), Some("0-1"), None, true).is_err());
        assert!(args(Some("x.dlq"), Some("0-1"), Some("orders"), false).is_err());
    }

    #[test]
    fn times_hex_and_bytes_print_for_people() {
        assert_eq!(time_text(0), "-");
        assert_eq!(time_text(1), "1970-01-01T00:00:00.001Z");
        assert_eq!(time_text(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(time_text(1_763_726_645_123), "2025-11-21T12:04:05.123Z");
        assert_eq!(from_hex("00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(from_hex("0"), None);
        assert_eq!(from_hex("zz"), None);
        assert_eq!(from_hex("é0"), None);
        assert_eq!(bytes_text(b"done"), "done");
        assert_eq!(bytes_text(&[0xff, 0x01]), "hex:ff01");
        assert_eq!(bytes_text(b"a\nb"), "hex:610a62");
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
