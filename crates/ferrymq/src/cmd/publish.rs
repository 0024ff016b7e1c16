//! `ferrymq pub`: one message from an argument, or one per line of a file or stdin, in
//! pipelined batches. Ids are printed in publish order as the receipts arrive.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use ferrymq_client::{Client, Message, PendingPublish};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, BufReader};

use super::args::parse_duration;
use super::connect::{runtime, unknown_topic_hint, ConnectArgs};

/// Batches `pub` keeps in flight while it reads more lines.
const PUB_PIPELINE_BATCHES: usize = 8;

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

/// What every message of this `pub` carries: priority, key, headers and delay.
fn message_template(args: &PubArgs) -> anyhow::Result<Message> {
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
    Ok(template)
}

async fn publish(args: PubArgs) -> anyhow::Result<()> {
    let template = message_template(&args)?;
    let partition = args.partition.unwrap_or(0);
    let client = args
        .connect
        .connect_leader("pub", Some(&args.topic), partition)
        .await?;
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
