//! `ferrymq status`: where one message stands in every subscription of its topic.

use std::io::{self, Write};

use anyhow::Context;
use clap::Args;
use ferrymq_client::{MessageId, MessageState, MessageStatus};
use serde_json::{json, Value};

use super::args::parse_message_id;
use super::connect::{runtime, ConnectArgs};
use super::output::{bytes_text, entry_json, insert_bytes, time_text};

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
