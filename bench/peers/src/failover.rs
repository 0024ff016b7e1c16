//! Failover: kill -9 of the leader under load, and the time until the first publish the cluster
//! acknowledges afterwards.
//!
//! Each system gets the same load and the same kill: one replicated queue (a FerryMQ topic with
//! 3 replicas, a JetStream R3 file stream, a RabbitMQ quorum queue), one publisher sending 100 B
//! messages one at a time, each awaiting its acknowledgement (after replication to a majority),
//! for `warmup`; then the process that leads the queue gets SIGKILL, and the publisher goes on
//! (reconnecting, and retrying every publish that fails or is not acknowledged in time) until one
//! publish is acknowledged. The figure is the time from the kill to that acknowledgement.
//!
//! The leader, and so the pid to kill, is each system's own answer: FerryMQ's cluster info
//! (partition 0's leader, by node id), JetStream's stream info (by server name); for RabbitMQ
//! the node the queue was declared on (`queue_leader_locator` client-local, RabbitMQ's default),
//! the first of `--addr`.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use async_nats::jetstream::{self, stream};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::BasicProperties;
use serde::{Deserialize, Serialize};

use ferrymq_client::{Client, Message, Storage};

use crate::{ferry, nats, rabbit};

/// Longest a failover may take before the run gives up.
const FAILOVER_MAX: Duration = Duration::from_secs(60);
/// How long one publish may wait for its acknowledgement before it is sent again.
const ATTEMPT: Duration = Duration::from_millis(500);
/// Pause between attempts that failed at once (no connection, no leader).
const RETRY: Duration = Duration::from_millis(20);

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FailoverRun {
    pub system: String,
    /// The leader killed (its name in the `--pids` list).
    pub leader: String,
    /// Publishes acknowledged before the kill.
    pub acked_before: u64,
    /// From the kill to the first publish acknowledged afterwards.
    pub secs: f64,
    /// Publish attempts between the kill and that acknowledgement.
    pub attempts: u64,
}

/// kill -9 of `pid`, the instant just before.
fn kill(pid: u32) -> anyhow::Result<Instant> {
    let at = Instant::now();
    let status = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .context("cannot run kill")?;
    if !status.success() {
        bail!("kill -9 {pid} failed");
    }
    Ok(at)
}

fn pid_of(pids: &[(String, u32)], name: &str) -> anyhow::Result<u32> {
    pids.iter()
        .find(|(n, _)| n == name)
        .map(|(_, p)| *p)
        .with_context(|| format!("no pid given for the leader {name} (--pids {pids:?})"))
}

/// Publishes for `warmup`, one message at a time: how many were acknowledged.
async fn warm<F, Fut>(warmup: Duration, mut publish: F) -> anyhow::Result<u64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let end = Instant::now() + warmup;
    let mut acked = 0;
    while Instant::now() < end {
        publish().await?;
        acked += 1;
    }
    Ok(acked)
}

pub async fn ferrymq(
    d: &ferry::Ferry,
    pids: &[(String, u32)],
    warmup: Duration,
) -> anyhow::Result<FailoverRun> {
    let topic = format!("failover-{}", std::process::id());
    let admin = d.admin().await?;
    d.create(&admin, &topic, Storage::Disk).await?;
    let _ = admin.close().await;
    let client = d.leader_of("failover", &topic).await?;
    let body = vec![b'x'; 100];
    let acked_before = warm(warmup, || {
        let (client, topic, body) = (&client, &topic, body.clone());
        async move {
            client.publish(topic, Message::new(body)).await?;
            Ok(())
        }
    })
    .await?;
    let info = client.cluster_info().await?;
    let leader = info
        .partitions
        .iter()
        .find(|p| p.topic == topic && p.partition == 0)
        .map(|p| p.leader)
        .context("no partition 0 in the cluster info")?
        .to_string();
    let killed = kill(pid_of(pids, &leader)?)?;
    drop(client);
    let mut client: Option<Client> = None;
    let mut attempts = 0u64;
    loop {
        if killed.elapsed() > FAILOVER_MAX {
            bail!("ferrymq: no publish acknowledged {FAILOVER_MAX:?} after the kill");
        }
        attempts += 1;
        if client.as_ref().is_none_or(|c| c.is_closed()) {
            client = Client::connect_leader(d.config("failover"), Some(&topic), 0)
                .await
                .ok();
        }
        let Some(c) = client.as_ref() else {
            tokio::time::sleep(RETRY).await;
            continue;
        };
        match tokio::time::timeout(ATTEMPT, c.publish(&topic, Message::new(body.clone()))).await {
            Ok(Ok(_)) => break,
            Ok(Err(_)) | Err(_) => {
                client = None;
                tokio::time::sleep(RETRY).await;
            }
        }
    }
    Ok(FailoverRun {
        system: String::new(),
        leader,
        acked_before,
        secs: killed.elapsed().as_secs_f64(),
        attempts,
    })
}

pub async fn nats(
    d: &nats::Nats,
    pids: &[(String, u32)],
    warmup: Duration,
) -> anyhow::Result<FailoverRun> {
    let name = format!("failover_{}", std::process::id());
    let subject = format!("{name}.in");
    let urls: Vec<String> = d
        .servers
        .iter()
        .map(|(_, a)| format!("nats://{a}"))
        .collect();
    if urls.is_empty() {
        bail!("nats failover needs --nats-servers");
    }
    // Connected to every server: the client moves to another when its server dies.
    let client = async_nats::ConnectOptions::new()
        .connect(urls.clone())
        .await
        .with_context(|| format!("cannot connect to NATS at {urls:?}"))?;
    let js = jetstream::context::ContextBuilder::new()
        .timeout(ATTEMPT)
        .build(client.clone());
    js.create_stream(stream::Config {
        name: name.clone(),
        subjects: vec![subject.clone()],
        storage: stream::StorageType::File,
        num_replicas: d.replicas.max(1),
        ..Default::default()
    })
    .await
    .with_context(|| format!("cannot create stream {name}"))?;
    let body = bytes::Bytes::from(vec![b'x'; 100]);
    let publish = |js: &jetstream::Context| {
        let (js, subject, body) = (js.clone(), subject.clone(), body.clone());
        async move {
            js.publish(subject, body).await?.await?;
            anyhow::Ok(())
        }
    };
    // The stream's first leader may take a moment: the warm-up starts once a publish is acked.
    let ready = Instant::now() + Duration::from_secs(30);
    while publish(&js).await.is_err() {
        if Instant::now() > ready {
            bail!("stream {name}: no publish acknowledged in 30 s");
        }
        tokio::time::sleep(RETRY).await;
    }
    let acked_before = warm(warmup, || publish(&js)).await?;
    let leader = js
        .get_stream(&name)
        .await?
        .info()
        .await?
        .cluster
        .as_ref()
        .and_then(|c| c.leader.clone())
        .context("the stream names no leader")?;
    let killed = kill(pid_of(pids, &leader)?)?;
    let mut attempts = 0u64;
    loop {
        if killed.elapsed() > FAILOVER_MAX {
            bail!("nats: no publish acknowledged {FAILOVER_MAX:?} after the kill");
        }
        attempts += 1;
        let start = Instant::now();
        match publish(&js).await {
            Ok(()) => break,
            Err(_) => {
                // A publish refused at once (no responders while the group elects) is retried
                // after a pause; one that timed out, at once.
                if start.elapsed() < ATTEMPT {
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    }
    let _ = d; // the stream stays: the cluster is stopped after the run
    Ok(FailoverRun {
        system: String::new(),
        leader,
        acked_before,
        secs: killed.elapsed().as_secs_f64(),
        attempts,
    })
}

pub async fn rabbitmq(
    d: &rabbit::Rabbit,
    pids: &[(String, u32)],
    warmup: Duration,
) -> anyhow::Result<FailoverRun> {
    let nodes = d.nodes();
    if nodes.len() < 2 {
        bail!("rabbitmq failover needs a cluster: --addr lists one node");
    }
    let name = format!("failover-{}", std::process::id());
    let body = vec![b'x'; 100];
    let properties = BasicProperties::default().with_delivery_mode(2);
    async fn open(addr: &str) -> anyhow::Result<(lapin::Connection, lapin::Channel)> {
        let conn = rabbit::Rabbit::connect_to(addr).await?;
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok((conn, channel))
    }
    async fn publish(
        channel: &lapin::Channel,
        queue: &str,
        body: &[u8],
        properties: &BasicProperties,
    ) -> anyhow::Result<()> {
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                body,
                properties.clone(),
            )
            .await?
            .await?;
        if !confirm.is_ack() {
            bail!("publish not confirmed: {confirm:?}");
        }
        Ok(())
    }
    let (conn, channel) = open(&nodes[0]).await?;
    rabbit::Rabbit::durable_queue(&channel, &name, d.quorum).await?;
    let acked_before = warm(warmup, || publish(&channel, &name, &body, &properties)).await?;
    // Declared on the first node: that node leads the queue (client-local).
    let leader = "1".to_string();
    let killed = kill(pid_of(pids, &leader)?)?;
    drop((channel, conn));
    let mut open_channel: Option<(lapin::Connection, lapin::Channel)> = None;
    let mut attempts = 0u64;
    let mut next_node = 1usize;
    loop {
        if killed.elapsed() > FAILOVER_MAX {
            bail!("rabbitmq: no publish acknowledged {FAILOVER_MAX:?} after the kill");
        }
        attempts += 1;
        if open_channel.is_none() {
            // The nodes left, in turn.
            let addr = &nodes[1 + (next_node - 1) % (nodes.len() - 1).max(1)];
            next_node += 1;
            match tokio::time::timeout(ATTEMPT, open(addr)).await {
                Ok(Ok(opened)) => open_channel = Some(opened),
                _ => {
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            }
        }
        let (_, channel) = open_channel.as_ref().unwrap();
        match tokio::time::timeout(ATTEMPT, publish(channel, &name, &body, &properties)).await {
            Ok(Ok(())) => break,
            Ok(Err(_)) => {
                open_channel = None;
                tokio::time::sleep(RETRY).await;
            }
            // Not confirmed in time: sent again on the same channel (the queue may be electing).
            Err(_) => {}
        }
    }
    if let Some((conn, _)) = open_channel {
        let _ = conn.close(200, "done".into()).await;
    }
    Ok(FailoverRun {
        system: String::new(),
        leader,
        acked_before,
        secs: killed.elapsed().as_secs_f64(),
        attempts,
    })
}
