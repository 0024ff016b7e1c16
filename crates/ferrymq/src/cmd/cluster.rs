//! `ferrymq cluster status`: the cluster's nodes, the metadata leader, and each replicated
//! partition's leader and replicas, as the node reached sees them. `add-node` and `remove-node`
//! change the members over the HTTP API (`POST /cluster/nodes`, `DELETE /cluster/nodes/{id}`)
//! and wait, bounded, until the Raft groups have moved their voters (`GET /cluster`).

use std::io::{self, Write};

use clap::{Args, Subcommand};
use ferrymq_client::ClusterInfo;

use super::connect::{runtime, ConnectArgs};
use super::http::http_json;
use super::output::write_table;

#[derive(Args, Debug)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub connect: ConnectArgs,
    #[command(subcommand)]
    pub command: ClusterCommand,
}

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Nodes, the metadata leader, and each replicated partition's leader and replicas.
    Status {
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Admit a node started with `--join`: new partitions are placed on it, and it votes in the
    /// metadata group once it has caught up.
    AddNode {
        /// Its `--node-id`.
        id: u64,
        /// Where its peers reach it: its `--cluster-addr`, HOST:PORT.
        #[arg(long)]
        cluster_addr: String,
        #[command(flatten)]
        wait: MoveArgs,
    },
    /// Remove a node: each of its replicas moves to another member, which catches up first;
    /// stop the node's process once this returns.
    RemoveNode {
        /// Its `--node-id`.
        id: u64,
        #[command(flatten)]
        wait: MoveArgs,
    },
}

#[derive(Args, Debug)]
pub struct MoveArgs {
    /// Address of the HTTP API of any member, host:port.
    #[arg(long, env = "FERRYMQ_HTTP_ADDR", default_value = "127.0.0.1:7080")]
    pub http_addr: String,
    /// How long to wait for the groups to move their voters, in seconds (0: do not wait).
    #[arg(long, default_value_t = 300)]
    pub wait_secs: u64,
}

pub fn run_cluster(args: ClusterArgs) -> anyhow::Result<()> {
    runtime()?.block_on(cluster(args))
}

async fn cluster(args: ClusterArgs) -> anyhow::Result<()> {
    let json = match args.command {
        ClusterCommand::Status { json } => json,
        ClusterCommand::AddNode {
            id,
            cluster_addr,
            wait,
        } => {
            let body = serde_json::json!({ "node": id, "cluster_addr": cluster_addr });
            change(&args.connect, &wait, "POST", "/cluster/nodes", Some(&body)).await?;
            println!("node {id} admitted");
            let done = |c: &serde_json::Value| voters(&c["metadata_voters"]).contains(&id);
            return await_moves(&args.connect, &wait, &format!("node {id} votes"), done).await;
        }
        ClusterCommand::RemoveNode { id, wait } => {
            let path = format!("/cluster/nodes/{id}");
            change(&args.connect, &wait, "DELETE", &path, None).await?;
            println!("node {id} removed; its replicas move");
            let done = |c: &serde_json::Value| moved_off(c, id);
            let what = format!("node {id} holds no replica");
            return await_moves(&args.connect, &wait, &what, done).await;
        }
    };
    let client = args.connect.connect("cluster").await?;
    let info = client.cluster_info().await?;
    let _ = client.close().await;
    let mut out = io::stdout().lock();
    match json {
        true => writeln!(out, "{}", serde_json::to_string_pretty(&as_json(&info))?)?,
        false => write_status(&mut out, &info)?,
    }
    Ok(())
}

/// Sends a membership change; an error names what the broker answered.
async fn change(
    connect: &ConnectArgs,
    wait: &MoveArgs,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> anyhow::Result<()> {
    let (status, reply) = http_json(method, &wait.http_addr, path, connect, body).await?;
    if status == 202 {
        return Ok(());
    }
    let message = serde_json::from_str::<serde_json::Value>(&reply)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or(reply);
    anyhow::bail!("the cluster refused ({status}): {message}")
}

fn voters(value: &serde_json::Value) -> Vec<u64> {
    value
        .as_array()
        .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
        .unwrap_or_default()
}

/// Whether `node` is out of every group: no metadata voter, and each partition's voters are its
/// replicas, without it.
fn moved_off(cluster: &serde_json::Value, node: u64) -> bool {
    let metadata = cluster["metadata_voters"].is_array()
        && !voters(&cluster["metadata_voters"]).contains(&node);
    let partitions = cluster["partitions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    metadata
        && partitions.iter().all(|p| {
            let mut replicas = voters(&p["replicas"]);
            let mut voting = voters(&p["voters"]);
            replicas.sort_unstable();
            voting.sort_unstable();
            p["voters"].is_array() && replicas == voting && !voting.contains(&node)
        })
}

/// Polls `GET /cluster` until `done` holds, for at most `--wait-secs`.
async fn await_moves(
    connect: &ConnectArgs,
    wait: &MoveArgs,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(wait.wait_secs);
    loop {
        if wait.wait_secs == 0 {
            return Ok(());
        }
        if let Ok((200, body)) = http_json("GET", &wait.http_addr, "/cluster", connect, None).await
        {
            if serde_json::from_str(&body).is_ok_and(|c| done(&c)) {
                println!("done: {what}");
                return Ok(());
            }
        }
        if std::time::Instant::now() >= deadline {
            anyhow::bail!(
                "not done within {} s: {what} (GET /cluster shows each group's voters; the \
                 move goes on)",
                wait.wait_secs
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

fn node_name(id: u64) -> String {
    match id {
        0 => "-".to_owned(),
        id => id.to_string(),
    }
}

fn write_status(out: &mut impl Write, info: &ClusterInfo) -> anyhow::Result<()> {
    if info.node_id == 0 {
        writeln!(out, "not a cluster: this broker runs alone")?;
        return Ok(());
    }
    writeln!(
        out,
        "node {} answering; metadata leader {}",
        info.node_id,
        node_name(info.metadata_leader)
    )?;
    writeln!(out)?;
    let nodes: Vec<Vec<String>> = info
        .nodes
        .iter()
        .map(|n| {
            let addr = if n.addr.is_empty() {
                "(not known yet)".to_owned()
            } else {
                n.addr.clone()
            };
            let leads = info.partitions.iter().filter(|p| p.leader == n.id).count();
            vec![n.id.to_string(), addr, leads.to_string()]
        })
        .collect();
    write_table(
        out,
        &["NODE", "ADDRESS", "LEADS"],
        &[true, false, true],
        &nodes,
    )?;
    if info.partitions.is_empty() {
        writeln!(out, "\nno replicated topics")?;
        return Ok(());
    }
    writeln!(out)?;
    let partitions: Vec<Vec<String>> = info
        .partitions
        .iter()
        .map(|p| {
            let replicas: Vec<String> = p.replicas.iter().map(u64::to_string).collect();
            vec![
                p.topic.clone(),
                p.partition.to_string(),
                node_name(p.leader),
                replicas.join(","),
            ]
        })
        .collect();
    write_table(
        out,
        &["TOPIC", "PARTITION", "LEADER", "REPLICAS"],
        &[false, true, true, false],
        &partitions,
    )?;
    Ok(())
}

fn as_json(info: &ClusterInfo) -> serde_json::Value {
    serde_json::json!({
        "node_id": info.node_id,
        "metadata_leader": (info.metadata_leader != 0).then_some(info.metadata_leader),
        "nodes": info.nodes.iter().map(|n| serde_json::json!({
            "id": n.id,
            "addr": (!n.addr.is_empty()).then_some(&n.addr),
        })).collect::<Vec<_>>(),
        "partitions": info.partitions.iter().map(|p| serde_json::json!({
            "topic": p.topic,
            "partition": p.partition,
            "leader": (p.leader != 0).then_some(p.leader),
            "replicas": p.replicas,
        })).collect::<Vec<_>>(),
    })
}
