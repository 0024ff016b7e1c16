//! `ferrymq topic create | delete | list | describe | skip-damaged`.

use std::io::{self, Write};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use ferrymq_client::{
    Client, FsyncPolicy, OverflowPolicy, RetentionPolicy, Storage, TopicConfig, TopicInfo,
};
use ferrymq_json::{overflow_name, storage_name};
use serde_json::{json, Value};

use super::args::parse_duration;
use super::connect::{runtime, ConnectArgs};
use super::http::http_post;
use super::output::write_table;

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
    /// Drop every message a topic retains (a dead-letter topic's too); its subscriptions and
    /// consumers stay and get what is published next. Needs the purge action (or manage).
    #[command(after_help = "Example:\n  ferrymq topic purge orders --yes")]
    Purge {
        /// Topic name.
        name: String,
        /// Confirm: without it nothing is dropped.
        #[arg(long)]
        yes: bool,
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
    /// Where messages are kept: disk (durable) or memory (lost on restart). Default: the
    /// server's (disk, unless it runs with --default-storage memory or without a data dir).
    #[arg(long, value_enum)]
    pub storage: Option<StorageArg>,
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
    /// In a cluster, on how many nodes the topic's partitions are kept: 1, 3 or 5. Default: the
    /// server's (3 in a cluster of three nodes or more; a single node keeps one copy).
    #[arg(long, value_parser = parse_replicas)]
    pub replicas: Option<u8>,
    /// Most messages retained. Default: the server's.
    #[arg(long)]
    pub max_messages: Option<u64>,
    /// Most bytes retained. Default: the server's.
    #[arg(long)]
    pub max_bytes: Option<u64>,
    /// What a full topic does: drop-oldest or reject. Default: the server's (drop-oldest unless
    /// it runs with --topic-overflow reject).
    #[arg(long, value_enum)]
    pub overflow: Option<OverflowArg>,
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
    let changes = matches!(
        args.command,
        TopicCommand::Create(_) | TopicCommand::Delete { .. }
    );
    let client = match changes {
        true => args.connect.connect_leader("topic", None, 0).await?,
        false => args.connect.connect("topic").await?,
    };
    let mut out = io::stdout().lock();
    match args.command {
        TopicCommand::Create(create) => create_topic(&client, create, &mut out).await?,
        TopicCommand::Delete { name } => {
            client
                .delete_topic(&name)
                .await
                .with_context(|| format!("cannot delete topic {name}"))?;
            writeln!(out, "topic {name} deleted")?;
        }
        TopicCommand::Purge { name, yes } => {
            if !yes {
                anyhow::bail!(
                    "purging drops every message topic {name} retains, for every subscription; \
                     run again with --yes to confirm"
                );
            }
            let purged = client
                .purge_topic(&name)
                .await
                .with_context(|| format!("cannot purge topic {name}"))?;
            writeln!(out, "topic {name} purged: {purged} messages dropped")?;
        }
        TopicCommand::List { json } => list_topics(&client, json, &mut out).await?,
        TopicCommand::SkipDamaged { .. } => {
            unreachable!("skip-damaged goes through the HTTP API, before connecting")
        }
        TopicCommand::Describe { name, json } => {
            describe_topic(&client, &name, json, &mut out).await?
        }
    }
    out.flush()?;
    drop(out);
    let _ = client.close().await;
    Ok(())
}

/// `--replicas`: 1, 3 or 5.
fn parse_replicas(text: &str) -> Result<u8, String> {
    match text.parse::<u8>() {
        Ok(n @ (1 | 3 | 5)) => Ok(n),
        _ => Err(format!(
            "'{text}': give 1, 3 or 5 (a majority of 3 or 5 survives a node or two)"
        )),
    }
}

async fn create_topic(
    client: &Client,
    create: TopicCreateArgs,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let config = TopicConfig {
        partitions: create.partitions.unwrap_or(0),
        storage: create.storage.map_or(Storage::Default, Storage::from),
        overflow: match create.overflow {
            None => OverflowPolicy::Default,
            Some(OverflowArg::DropOldest) => OverflowPolicy::DropOldest,
            Some(OverflowArg::Reject) => OverflowPolicy::Reject,
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
        replicas: create.replicas.unwrap_or(0),
    };
    client
        .create_topic(&create.name, config, create.if_not_exists)
        .await
        .with_context(|| format!("cannot create topic {}", create.name))?;
    writeln!(out, "topic {} ready", create.name)?;
    Ok(())
}

async fn list_topics(client: &Client, json: bool, out: &mut impl Write) -> anyhow::Result<()> {
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
            out,
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
    Ok(())
}

async fn describe_topic(
    client: &Client,
    name: &str,
    json: bool,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let info = client
        .describe_topic(name)
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
            ("replicas", info.config.replicas.to_string()),
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
    Ok(())
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
        "replicas": info.config.replicas,
        "messages": info.messages,
        "bytes": info.bytes,
        "subscriptions": info.subscriptions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_reads_durations_like_every_other_flag() {
        assert_eq!(parse_retention("7d"), Ok(7 * 86_400_000));
        assert_eq!(parse_retention("12h"), Ok(12 * 3_600_000));
        assert_eq!(parse_retention("500ms"), Ok(500));
        assert_eq!(parse_retention("forever"), Ok(u64::MAX));
        assert!(parse_retention("0s").unwrap_err().contains("keeps nothing"));
        assert!(parse_retention("soon").is_err());
    }
}
