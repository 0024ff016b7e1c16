//! `ferrymq stats`: per-topic and per-subscription statistics as tables, or as the HTTP API's
//! `GET /stats` document.

use std::io::{self, Write};

use anyhow::Context;
use clap::Args;
use ferrymq_client::{ErrorCode, TopicStats};

use super::connect::{runtime, ConnectArgs};
use super::output::write_table;

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
        let list = ferrymq_json::StatsList {
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
    write_topic_table(out, topics)?;
    if topics.iter().any(|t| !t.subscriptions.is_empty()) {
        writeln!(out)?;
        write_subscription_table(out, topics)?;
        writeln!(out)?;
        write_latency_table(out, topics)?;
    }
    Ok(())
}

fn write_topic_table(out: &mut impl Write, topics: &[TopicStats]) -> io::Result<()> {
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
    Ok(())
}

fn write_subscription_table(out: &mut impl Write, topics: &[TopicStats]) -> io::Result<()> {
    let subscription_rows: Vec<Vec<String>> = topics
        .iter()
        .flat_map(|t| {
            t.subscriptions.iter().map(move |s| {
                vec![
                    t.name.clone(),
                    subscription_label(s),
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
    Ok(())
}

/// A subscription's name with what sets it apart: `billing (paused)`, `ephemeral#3 (ephemeral)`.
fn subscription_label(s: &ferrymq_protocol::SubscriptionStats) -> String {
    match (s.ephemeral, s.paused) {
        (false, false) => s.name.clone(),
        (true, false) => format!("{} (ephemeral)", s.name),
        (false, true) => format!("{} (paused)", s.name),
        (true, true) => format!("{} (ephemeral, paused)", s.name),
    }
}

fn write_latency_table(out: &mut impl Write, topics: &[TopicStats]) -> io::Result<()> {
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
