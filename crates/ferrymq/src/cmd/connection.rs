//! `ferrymq connection list | close`: who is connected to the broker, and closing one.

use std::io::{self, Write};

use anyhow::Context;
use clap::{Args, Subcommand};
use ferrymq_client::protocol::limits::LIST_LIMIT_MAX;
use ferrymq_client::protocol::ConnectionEntry;
use serde_json::{json, Value};

use super::connect::{runtime, ConnectArgs};
use super::output::time_text;

/// Pages `connection list --all` walks at most: 1 000 pages of 1 000 is far above any broker's
/// connection limit, and bounds the loop.
const PAGES_MAX: u32 = 1000;

#[derive(Args, Debug)]
pub struct ConnectionArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(subcommand)]
    pub command: ConnectionCommand,
}

#[derive(Subcommand, Debug)]
pub enum ConnectionCommand {
    /// List client connections (monitor or admin role): id, peer, user, client, TLS, since,
    /// subscriptions and consumers, messages and bytes in and out, credit and unacked.
    #[command(
        after_help = "Examples:\n  ferrymq connection list\n  ferrymq connection list --all --json"
    )]
    List {
        /// Connections per page (1 to 1000).
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=LIST_LIMIT_MAX as i64))]
        limit: u32,
        /// Start after this connection id (as printed after a page).
        #[arg(long, default_value_t = 0, conflicts_with = "all")]
        after: u64,
        /// Walk every page.
        #[arg(long)]
        all: bool,
        /// Print JSON: {"connections": [...], "total": n, "next_after": id or null}.
        #[arg(long)]
        json: bool,
    },
    /// Close a client connection (admin role); the client is told why.
    #[command(after_help = "Example:\n  ferrymq connection close 42")]
    Close {
        /// Connection id, as `connection list` prints it.
        id: u64,
    },
}

pub fn run_connection(args: ConnectionArgs) -> anyhow::Result<()> {
    runtime()?.block_on(connection(args))
}

async fn connection(args: ConnectionArgs) -> anyhow::Result<()> {
    let client = args.connect.connect("connection").await?;
    let result = match args.command {
        ConnectionCommand::List {
            limit,
            after,
            all,
            json,
        } => list(&client, limit, after, all, json).await,
        ConnectionCommand::Close { id } => {
            client
                .connection_close(id)
                .await
                .with_context(|| format!("cannot close connection {id}"))?;
            let mut out = io::stdout().lock();
            writeln!(out, "connection {id} closed")?;
            out.flush()?;
            Ok(())
        }
    };
    let _ = client.close().await;
    result
}

async fn list(
    client: &ferrymq_client::Client,
    limit: u32,
    mut after: u64,
    all: bool,
    json: bool,
) -> anyhow::Result<()> {
    let mut out = io::BufWriter::new(io::stdout().lock());
    let mut listed = Vec::new();
    let (mut total, mut next) = (0, 0);
    for _ in 0..PAGES_MAX {
        let page = client
            .connection_list(after, limit)
            .await
            .context("cannot list connections")?;
        (total, next) = (page.total, page.next_after);
        listed.extend(page.connections);
        if !all || next == 0 {
            break;
        }
        after = next;
    }
    if json {
        let value = json!({
            "connections": listed.iter().map(entry_json).collect::<Vec<Value>>(),
            "total": total,
            "next_after": if next == 0 { Value::Null } else { json!(next) },
        });
        writeln!(out, "{value}")?;
    } else {
        writeln!(
            out,
            "{:>6}  {:<22}  {:<12}  {:<22}  {:<3}  {:<24}  {:>4}  {:>4}  {:>10}  {:>10}  {:>8}  {:>8}",
            "ID", "PEER", "USER", "CLIENT", "TLS", "SINCE", "SUBS", "CONS", "MSGS IN", "MSGS OUT", "CREDIT", "UNACKED"
        )?;
        for c in &listed {
            writeln!(
                out,
                "{:>6}  {:<22}  {:<12}  {:<22}  {:<3}  {:<24}  {:>4}  {:>4}  {:>10}  {:>10}  {:>8}  {:>8}",
                c.id,
                c.peer,
                if c.user.is_empty() { "-" } else { &c.user },
                if c.client_name.is_empty() { "-" } else { &c.client_name },
                if c.tls { "yes" } else { "no" },
                time_text(c.connected_ms),
                c.subscriptions,
                c.consumers,
                c.messages_in,
                c.messages_out,
                c.credit,
                c.unacked,
            )?;
        }
        writeln!(out, "{} of {total} connections", listed.len())?;
        if next != 0 {
            writeln!(out, "more: --after {next}")?;
        }
    }
    out.flush()?;
    Ok(())
}

fn entry_json(c: &ConnectionEntry) -> Value {
    json!({
        "id": c.id,
        "listener": if c.listener == 0 { "binary" } else { "http" },
        "peer": c.peer,
        "user": c.user,
        "client_name": c.client_name,
        "tls": c.tls,
        "connected_ms": c.connected_ms,
        "subscriptions": c.subscriptions,
        "consumers": c.consumers,
        "messages_in": c.messages_in,
        "bytes_in": c.bytes_in,
        "messages_out": c.messages_out,
        "bytes_out": c.bytes_out,
        "credit": c.credit,
        "unacked": c.unacked,
    })
}
