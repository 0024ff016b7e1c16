//! `ferrymq dead requeue`: send dead letters back to the subscription they died in.

use std::io::{self, Write};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use ferrymq_client::{Client, RequeueSelection};
use serde_json::json;

use super::args::{is_decimal, parse_duration, parse_message_id};
use super::connect::{runtime, ConnectArgs};

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
    use ferrymq_client::MessageId;

    use super::*;

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
}
