//! `ferrymq sub`: subscribe and print messages as they arrive, acking each batch once it is
//! printed and flushed.

use std::io::{self, Write};
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use ferrymq_client::protocol::limits::ACK_RESULT_BYTES_MAX;
use ferrymq_client::{
    push_offset, Client, ClusterSubscription, Delivery, DeliveryBatch, ErrorCode, OffsetRange,
    StartPosition, SubscribeOptions, Subscription,
};
use serde_json::{json, Value};

use super::args::parse_duration;
use super::connect::{runtime, unknown_topic_hint, ConnectArgs};
use super::output::to_hex;

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
    let options = subscribe_options(&args);
    let ack_result = ack_result(&args)?;
    let mut subscription = AnySubscription::open(&client, &args, options)
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
        let batch = match batch_or_end(next, &args, received)? {
            Ok(batch) => batch,
            Err(end) => break end,
        };
        let output_closed = print_batch(
            &mut out,
            &batch,
            &args,
            &mut received,
            (&mut ranges, &mut unprinted),
        )?;
        // Acked only once printed and flushed; what was not printed is released on exit.
        if !args.no_ack && !output_closed && !ranges.is_empty() {
            let last = args.count.is_some_and(|count| received >= count);
            ack_printed(&subscription, &ranges, ack_result.as_ref(), last).await?;
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
    end_result(end, &args, received)
}

/// What `next_batch` gave, within `--timeout`: a batch to print, or how `sub` ends.
fn batch_or_end(
    next: Option<Option<ferrymq_client::Result<DeliveryBatch>>>,
    args: &SubArgs,
    received: u64,
) -> anyhow::Result<Result<DeliveryBatch, SubEnd>> {
    match next {
        None => Ok(Err(SubEnd::Idle)),
        Some(None) => bail!("the subscription was closed by the server"),
        Some(Some(Err(error))) if error.is_connection_error() => {
            Err(error).context("connection to the broker lost")
        }
        // The only subscription of this connection: a server error (its topic deleted, an
        // ack refused) is about it, and whatever it printed may not be settled.
        Some(Some(Err(error))) if error.code() == Some(ErrorCode::UnknownTopic) => Ok(Err(
            SubEnd::Failed(anyhow::Error::new(error).context(format!(
                "topic {} was deleted: the subscription ended after {received} messages",
                args.topic
            ))),
        )),
        Some(Some(Err(error))) => Ok(Err(SubEnd::Failed(anyhow::Error::new(error).context(
            format!(
                "the broker ended the subscription to {} after {received} messages",
                args.topic
            ),
        )))),
        Some(Some(Ok(batch))) => Ok(Ok(batch)),
    }
}

/// Prints a batch's deliveries up to --count and flushes them: the offsets printed go to the
/// first list, the others (past the count, or once the output is closed) to the second.
/// Returns whether the output was closed; then the whole batch is in the second list.
fn print_batch(
    out: &mut impl Write,
    batch: &DeliveryBatch,
    args: &SubArgs,
    received: &mut u64,
    (ranges, unprinted): (&mut Vec<OffsetRange>, &mut Vec<OffsetRange>),
) -> anyhow::Result<bool> {
    let mut output_closed = false;
    for delivery in batch.iter() {
        if output_closed || args.count.is_some_and(|count| *received >= count) {
            push_offset(unprinted, delivery.partition, delivery.offset);
            continue;
        }
        if let Err(error) = print_delivery(out, &delivery, args.format) {
            if error.kind() == io::ErrorKind::BrokenPipe {
                output_closed = true;
                push_offset(unprinted, delivery.partition, delivery.offset);
                continue;
            }
            return Err(error.into());
        }
        push_offset(ranges, delivery.partition, delivery.offset);
        *received += 1;
    }
    match out.flush() {
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => output_closed = true,
        other => other?,
    }
    if output_closed {
        // Whether the reader saw them is unknown: given back, as if never printed.
        unprinted.append(ranges);
    }
    Ok(output_closed)
}

/// The options `sub` subscribes with, from its flags.
fn subscribe_options(args: &SubArgs) -> SubscribeOptions {
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
    options
}

/// --ack-result as bytes, refused above the broker's limit.
fn ack_result(args: &SubArgs) -> anyhow::Result<Option<Bytes>> {
    let ack_result = args.ack_result.clone().map(Bytes::from);
    if let Some(result) = &ack_result {
        if result.len() > ACK_RESULT_BYTES_MAX {
            bail!(
                "--ack-result is {} bytes; an ack result is at most {ACK_RESULT_BYTES_MAX} bytes",
                result.len()
            );
        }
    }
    Ok(ack_result)
}

/// The subscription `sub` reads: on one node, or on every node of a cluster (only a
/// partition's leader delivers it).
enum AnySubscription {
    One(Subscription),
    Cluster(ClusterSubscription),
}

impl AnySubscription {
    async fn open(
        client: &Client,
        args: &SubArgs,
        options: SubscribeOptions,
    ) -> ferrymq_client::Result<AnySubscription> {
        if client.cluster_info().await?.node_id == 0 {
            return Ok(AnySubscription::One(client.subscribe(options).await?));
        }
        let config = args
            .connect
            .config("sub")
            .map_err(|e| ferrymq_client::Error::InvalidArgument(e.to_string()))?;
        Ok(AnySubscription::Cluster(
            Client::subscribe_cluster(config, options).await?,
        ))
    }

    async fn next_batch(&mut self) -> Option<ferrymq_client::Result<DeliveryBatch>> {
        match self {
            AnySubscription::One(s) => s.next_batch().await,
            AnySubscription::Cluster(s) => s.next_batch().await,
        }
    }

    async fn ack_ranges_with_result(
        &self,
        ranges: &[OffsetRange],
        result: Bytes,
    ) -> ferrymq_client::Result<()> {
        match self {
            AnySubscription::One(s) => s.ack_ranges_with_result(ranges, result).await,
            AnySubscription::Cluster(s) => s.ack_ranges_with_result(ranges, result).await,
        }
    }

    async fn ack_confirmed(&self, ranges: &[OffsetRange]) -> ferrymq_client::Result<()> {
        match self {
            AnySubscription::One(s) => s.ack_confirmed(ranges).await,
            AnySubscription::Cluster(s) => s.ack_confirmed(ranges).await,
        }
    }

    async fn ack_ranges(&self, ranges: &[OffsetRange]) -> ferrymq_client::Result<()> {
        match self {
            AnySubscription::One(s) => s.ack_ranges(ranges).await,
            AnySubscription::Cluster(s) => s.ack_ranges(ranges).await,
        }
    }

    async fn close_releasing(self, unprinted: &[OffsetRange]) -> ferrymq_client::Result<u64> {
        match self {
            AnySubscription::One(s) => s.close_releasing(unprinted).await,
            AnySubscription::Cluster(s) => s.close_releasing(unprinted).await,
        }
    }
}

/// Acks what was printed and flushed. `last`: the batch that completes --count.
async fn ack_printed(
    subscription: &AnySubscription,
    ranges: &[OffsetRange],
    ack_result: Option<&Bytes>,
    last: bool,
) -> anyhow::Result<()> {
    match ack_result {
        Some(result) => subscription
            .ack_ranges_with_result(ranges, result.clone())
            .await
            .context("acking with a result failed")?,
        // The batch that completes --count is the last: its ack is confirmed (saved, on a disk
        // topic) before `sub` exits, so a crash right after cannot hand the messages it printed
        // to this subscription again. Earlier batches go unconfirmed: the confirmed one is
        // written after them on the same connection.
        None if last => subscription.ack_confirmed(ranges).await?,
        None => subscription.ack_ranges(ranges).await?,
    }
    Ok(())
}

/// How `sub` ends: an idle end before --count is an error, as is the broker ending it.
fn end_result(end: SubEnd, args: &SubArgs, received: u64) -> anyhow::Result<()> {
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
}
