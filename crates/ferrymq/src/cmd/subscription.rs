//! `ferrymq subscription list | pause | resume | delete`: a subscription's messages by state, a page at a time.

use std::io::{self, Write};

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::{Args, Subcommand};
use ferrymq_client::protocol::limits::{LIST_LIMIT_MAX, LIST_PAGE_BYTES_MAX};
use ferrymq_client::{Client, ListKind, MessageEntry};
use serde_json::{json, Value};

use super::connect::{runtime, ConnectArgs};
use super::output::{bytes_text, entry_json, from_hex, time_text, to_hex};

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
    /// Pause deliveries of a subscription to every consumer (kept across restarts); messages
    /// wait in its backlog. Needs the pause action (or manage).
    #[command(after_help = "Example:\n  ferrymq subscription pause orders billing")]
    Pause {
        /// Topic of the subscription.
        topic: String,
        /// Subscription name.
        subscription: String,
    },
    /// Resume deliveries of a paused subscription.
    #[command(after_help = "Example:\n  ferrymq subscription resume orders billing")]
    Resume {
        /// Topic of the subscription.
        topic: String,
        /// Subscription name.
        subscription: String,
    },
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
        SubscriptionCommand::Pause {
            topic,
            subscription,
        } => pause(&client, &topic, &subscription, true).await,
        SubscriptionCommand::Resume {
            topic,
            subscription,
        } => pause(&client, &topic, &subscription, false).await,
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

async fn pause(
    client: &Client,
    topic: &str,
    subscription: &str,
    paused: bool,
) -> anyhow::Result<()> {
    let what = if paused { "pause" } else { "resume" };
    client
        .pause_subscription(topic, subscription, paused)
        .await
        .with_context(|| format!("cannot {what} subscription {subscription} of {topic}"))?;
    let mut out = io::stdout().lock();
    writeln!(out, "subscription {subscription} of {topic} {what}d")?;
    out.flush()?;
    Ok(())
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
