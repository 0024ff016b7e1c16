//! `ferrymq cluster status`: the cluster's nodes, the metadata leader, and each replicated
//! partition's leader and replicas, as the node reached sees them.

use std::io::{self, Write};

use clap::{Args, Subcommand};
use ferrymq_client::ClusterInfo;

use super::connect::{runtime, ConnectArgs};
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
}

pub fn run_cluster(args: ClusterArgs) -> anyhow::Result<()> {
    runtime()?.block_on(cluster(args))
}

async fn cluster(args: ClusterArgs) -> anyhow::Result<()> {
    let client = args.connect.connect("cluster").await?;
    let ClusterCommand::Status { json } = args.command;
    let info = client.cluster_info().await?;
    let _ = client.close().await;
    let mut out = io::stdout().lock();
    match json {
        true => writeln!(out, "{}", serde_json::to_string_pretty(&as_json(&info))?)?,
        false => write_status(&mut out, &info)?,
    }
    Ok(())
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
