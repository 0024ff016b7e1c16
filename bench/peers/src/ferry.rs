//! FerryMQ through `ferrymq-client`, the same client `ferrymq bench` uses.
//!
//! - transient: a memory topic, publishes without receipts (request id 0) in batches, one
//!   ephemeral fan-out subscription with auto-ack;
//! - durable: a disk topic with fsync=always, batches with receipts (each receipt is sent after an
//!   fsync that covers the batch), `pipeline` batches in flight;
//! - work queue: a disk topic pre-loaded through the durable path into a named subscription, then
//!   drained by one consumer (credit `window`) acking every delivered frame as ranges; the run
//!   ends when the last ack is confirmed;
//! - latency: a memory topic, one message per unconfirmed publish, auto-ack subscription.
//!
//! Against a cluster (`--ferry-cluster`, `addr` listing every node): topics are created and
//! deleted through the metadata leader and are replicated (3 replicas in a cluster of three);
//! publishes, the work queue's subscription and its consumer go to partition 0's leader, the only
//! node that acknowledges its publishes and delivers its messages.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use ferrymq_client::{
    push_offset, Client, ClientConfig, DeliveryBatchExt, FsyncPolicy, OffsetRange, OverflowPolicy,
    PendingPublish, StartPosition, Storage, SubscribeOptions, TopicConfig,
};

use crate::harness::{
    join, now_ns, own_thread, settle, stamp_of, window, Counters, LatencyRecorder, LatencyRun,
    Pacer, Params, Throughput, STAMP_BYTES,
};

#[derive(Clone)]
pub struct Ferry {
    /// host:port, or every node's, comma-separated, for a cluster.
    pub addr: String,
    /// The nodes form a cluster: find the metadata leader and each partition's leader.
    pub cluster: bool,
}

/// How long a cluster may take to elect the leader a run needs.
const LEADER_WAIT: Duration = Duration::from_secs(30);

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), now_ns())
}

impl Ferry {
    pub(crate) fn config(&self, name: &str) -> ClientConfig {
        ClientConfig::new(self.addr.clone())
            .client_name(format!("ferrymq-peers-{name}"))
            .request_timeout(Some(Duration::from_secs(30)))
    }

    async fn connect(&self, name: &str) -> anyhow::Result<Client> {
        Client::connect_with(self.config(name))
            .await
            .with_context(|| format!("cannot connect to FerryMQ at {}", self.addr))
    }

    /// Where topics are created and deleted: the node, or the cluster's metadata leader (asked
    /// again, bounded, while it is elected).
    pub(crate) async fn admin(&self) -> anyhow::Result<Client> {
        if !self.cluster {
            return self.connect("admin").await;
        }
        let deadline = Instant::now() + LEADER_WAIT;
        loop {
            let client = Client::connect_leader(self.config("admin"), None, 0).await?;
            let info = client.cluster_info().await?;
            if info.metadata_leader != 0 && info.metadata_leader == info.node_id {
                return Ok(client);
            }
            let _ = client.close().await;
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "no metadata leader among {} after {LEADER_WAIT:?}",
                    self.addr
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A connection to the node that leads partition 0 of `topic` (the node itself when it runs
    /// alone), asked again (bounded) until a node names itself its leader.
    pub(crate) async fn leader_of(&self, name: &str, topic: &str) -> anyhow::Result<Client> {
        if !self.cluster {
            return self.connect(name).await;
        }
        let deadline = Instant::now() + LEADER_WAIT;
        loop {
            let client = Client::connect_leader(self.config(name), Some(topic), 0).await?;
            let info = client.cluster_info().await?;
            let leads = info
                .partitions
                .iter()
                .any(|p| p.topic == topic && p.partition == 0 && p.leader == info.node_id);
            if leads {
                return Ok(client);
            }
            let _ = client.close().await;
            if Instant::now() >= deadline {
                anyhow::bail!(
                    "no leader for {topic}/0 among {} after {LEADER_WAIT:?}",
                    self.addr
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) async fn create(
        &self,
        admin: &Client,
        name: &str,
        storage: Storage,
    ) -> anyhow::Result<()> {
        let config = TopicConfig {
            partitions: 1,
            storage,
            overflow: OverflowPolicy::DropOldest,
            max_messages: 0,
            max_bytes: 0,
            fsync: match storage {
                Storage::Disk => FsyncPolicy::Always,
                Storage::Memory | Storage::Default => FsyncPolicy::Default,
            },
            retention_ms: 0,
            ..TopicConfig::default()
        };
        admin
            .create_topic(name, config, true)
            .await
            .with_context(|| format!("cannot create topic {name}"))
    }

    pub fn setup(&self) -> String {
        let cluster = if self.cluster {
            "cluster of the nodes given, topics replicated on 3 (a publish is acknowledged once a \
             majority has its Raft entry fsynced), publisher and consumer on partition 0's leader; "
        } else {
            ""
        };
        cluster.to_string()
            + "transient: memory topic, unconfirmed batches of 1000, auto-ack; durable: disk topic, \
         fsync=always, batches of 1000 with receipts, 8 in flight; work queue: credit 1000, one \
         ack of ranges per delivered frame"
    }

    pub async fn transient(&self, p: &Params) -> anyhow::Result<Throughput> {
        let admin = self.connect("admin").await?;
        let topic = unique("transient");
        self.create(&admin, &topic, Storage::Memory).await?;
        let counters = Counters::new();
        let consumer = self.connect("sub").await?;
        let mut sub = consumer
            .subscribe(
                SubscribeOptions::new(topic.clone())
                    .ephemeral()
                    .start(StartPosition::Latest)
                    .auto_ack(true)
                    .credit(32_768),
            )
            .await?;
        let sub_task = tokio::spawn({
            let counters = counters.clone();
            async move {
                while !counters.finished() {
                    let next = tokio::time::timeout(Duration::from_millis(50), sub.next_batch());
                    match next.await {
                        Ok(Some(batch)) => {
                            let batch = batch?;
                            counters
                                .received
                                .fetch_add(batch.count() as u64, Ordering::Relaxed);
                        }
                        Ok(None) => break,
                        Err(_) => {}
                    }
                }
                let _ = sub.close().await;
                anyhow::Ok(())
            }
        });
        let producer = self.connect("pub").await?;
        let pub_task = tokio::spawn({
            let counters = counters.clone();
            let (topic, batch, lead) = (topic.clone(), p.batch, p.lead);
            async move {
                let body = vec![b'x'; 100];
                while !counters.stopped() {
                    counters.hold_lead(lead).await;
                    let mut encoder = producer.unconfirmed_encoder(&topic, None)?;
                    for _ in 0..batch {
                        encoder.push_body(None, 0, &body);
                    }
                    producer.send_unconfirmed(encoder.finish()).await?;
                    counters.sent.fetch_add(batch as u64, Ordering::Relaxed);
                }
                producer.ping().await?;
                let _ = producer.close().await;
                anyhow::Ok(())
            }
        });
        let mut result = window(&counters, p, || counters.received()).await;
        join(pub_task, "publisher").await?;
        ((), result.lost) = settle(&counters, true, sub_task).await?;
        let _ = admin.delete_topic(&topic).await;
        let _ = consumer.close().await;
        let _ = admin.close().await;
        Ok(result)
    }

    /// Publishes `size`-byte messages with receipts until the counters say stop or `max` were
    /// sent; `counters.sent` counts confirmed messages.
    async fn publish_durable(
        client: &Client,
        topic: &str,
        size: usize,
        p: &Params,
        counters: &Counters,
        max: u64,
    ) -> anyhow::Result<()> {
        let body = vec![b'x'; size];
        let mut in_flight: VecDeque<PendingPublish> = VecDeque::with_capacity(p.pipeline);
        let mut issued = 0u64;
        while !counters.stopped() && issued < max {
            if in_flight.len() >= p.pipeline {
                if let Some(oldest) = in_flight.pop_front() {
                    let receipt = oldest.await?;
                    counters
                        .sent
                        .fetch_add(receipt.len() as u64, Ordering::Relaxed);
                }
            }
            let n = (max - issued).min(p.batch as u64);
            let mut encoder = client.publish_encoder(topic, None)?;
            for _ in 0..n {
                encoder.push_body(None, 0, &body);
            }
            in_flight.push_back(client.send_encoded(encoder.finish()).await?);
            issued += n;
        }
        while let Some(pending) = in_flight.pop_front() {
            let receipt = pending.await?;
            counters
                .sent
                .fetch_add(receipt.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    pub async fn durable(&self, p: &Params, size: usize) -> anyhow::Result<Throughput> {
        let admin = self.admin().await?;
        let topic = unique("durable");
        self.create(&admin, &topic, Storage::Disk).await?;
        let counters = Counters::new();
        let producer = self.leader_of("pub", &topic).await?;
        let task = tokio::spawn({
            let (counters, topic, p) = (counters.clone(), topic.clone(), p.clone());
            async move {
                Self::publish_durable(&producer, &topic, size, &p, &counters, u64::MAX).await?;
                let _ = producer.close().await;
                anyhow::Ok(())
            }
        });
        let result = window(&counters, p, || counters.sent()).await;
        join(task, "publisher").await?;
        let _ = admin.delete_topic(&topic).await;
        let _ = admin.close().await;
        Ok(result)
    }

    pub async fn work_queue(
        &self,
        p: &Params,
        preload_max: u64,
        preload_time: Duration,
    ) -> anyhow::Result<Throughput> {
        let admin = self.admin().await?;
        let topic = unique("queue");
        let name = "workers".to_string();
        self.create(&admin, &topic, Storage::Disk).await?;
        // Publishes and the subscription go to the partition's leader (the node itself alone).
        let lead = self.leader_of("lead", &topic).await?;
        // The subscription exists before the preload and keeps what arrives while it has no
        // consumer.
        lead.subscribe(
            SubscribeOptions::new(topic.clone())
                .subscription(name.clone())
                .start(StartPosition::Latest)
                .credit(1),
        )
        .await?
        .close()
        .await?;
        let counters = Counters::new();
        let preload = tokio::spawn({
            let (counters, topic, p) = (counters.clone(), topic.clone(), p.clone());
            let lead = lead.clone();
            async move { Self::publish_durable(&lead, &topic, 100, &p, &counters, preload_max).await }
        });
        let deadline = Instant::now() + preload_time;
        while !preload.is_finished() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        counters.stop.store(true, Ordering::Relaxed);
        join(preload, "preload").await?;
        let total = counters.sent();

        let consumer = self.leader_of("worker", &topic).await?;
        let start = Instant::now();
        let mut sub = consumer
            .subscribe(
                SubscribeOptions::new(topic.clone())
                    .subscription(name.clone())
                    .credit(p.window as u32),
            )
            .await?;
        let mut ranges: Vec<OffsetRange> = Vec::with_capacity(64);
        let mut last: Option<OffsetRange> = None;
        let mut received = 0u64;
        let mut last_progress = Instant::now();
        while received < total && last_progress.elapsed() < crate::harness::GRACE {
            let batch =
                match tokio::time::timeout(Duration::from_millis(100), sub.next_batch()).await {
                    Ok(Some(batch)) => batch?,
                    Ok(None) => break,
                    Err(_) => continue,
                };
            last_progress = Instant::now();
            for delivery in batch.views() {
                push_offset(&mut ranges, delivery.partition, delivery.offset);
            }
            sub.ack_ranges(&ranges).await?;
            last = ranges.last().copied();
            ranges.clear();
            received += batch.count() as u64;
        }
        if let Some(last) = last {
            // Answered once every ack before it on this connection was applied and saved.
            sub.ack_confirmed(&[last]).await?;
        }
        let secs = start.elapsed().as_secs_f64();
        let _ = sub.close().await;
        let _ = consumer.close().await;
        let _ = lead.delete_subscription(&topic, &name).await;
        let _ = lead.close().await;
        let _ = admin.delete_topic(&topic).await;
        let _ = admin.close().await;
        Ok(Throughput {
            msgs_per_s: received as f64 / secs,
            counted: received,
            secs,
            lost: total.saturating_sub(received),
        })
    }

    pub async fn latency(&self, p: &Params) -> anyhow::Result<LatencyRun> {
        let admin = self.connect("admin").await?;
        let topic = unique("latency");
        self.create(&admin, &topic, Storage::Memory).await?;
        let counters = Counters::new();
        let consumer = self.connect("sub").await?;
        let mut sub = consumer
            .subscribe(
                SubscribeOptions::new(topic.clone())
                    .ephemeral()
                    .start(StartPosition::Latest)
                    .auto_ack(true)
                    .credit(32_768),
            )
            .await?;
        let measure_from = Instant::now() + p.warmup;
        let sub_task = tokio::spawn({
            let counters = counters.clone();
            async move {
                let mut recorder = LatencyRecorder::new(measure_from);
                while !counters.finished() {
                    match tokio::time::timeout(Duration::from_millis(50), sub.next_batch()).await {
                        Ok(Some(batch)) => {
                            let batch = batch?;
                            for delivery in batch.views() {
                                recorder.record(delivery.body);
                            }
                            counters
                                .received
                                .fetch_add(batch.count() as u64, Ordering::Relaxed);
                        }
                        Ok(None) => break,
                        Err(_) => {}
                    }
                }
                let _ = sub.close().await;
                anyhow::Ok(recorder.histogram)
            }
        });
        let produced = own_thread("paced-publisher", {
            let (this, topic, p, counters) =
                (self.clone(), topic.clone(), p.clone(), counters.clone());
            move || async move {
                let producer = this.connect("pub").await?;
                let mut pacer = Pacer::new(p.rate, p.warmup + p.latency_time);
                let mut body = vec![b'x'; 100];
                while let Some(due) = pacer.tick().await {
                    body[..STAMP_BYTES].copy_from_slice(&stamp_of(due).to_le_bytes());
                    let mut encoder = producer.unconfirmed_encoder(&topic, None)?;
                    encoder.push_body(None, 0, &body);
                    producer.send_unconfirmed(encoder.finish()).await?;
                    counters.sent.fetch_add(1, Ordering::Relaxed);
                }
                producer.ping().await?;
                let _ = producer.close().await;
                anyhow::Ok(())
            }
        })
        .await;
        let (histogram, lost) = settle(&counters, produced.is_ok(), sub_task).await?;
        produced?;
        let _ = consumer.close().await;
        let _ = admin.delete_topic(&topic).await;
        let _ = admin.close().await;
        Ok(LatencyRun::from_histogram(&histogram, lost))
    }
}
