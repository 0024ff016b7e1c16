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
    pub addr: String,
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), now_ns())
}

impl Ferry {
    async fn connect(&self, name: &str) -> anyhow::Result<Client> {
        Client::connect_with(
            ClientConfig::new(self.addr.clone())
                .client_name(format!("ferrymq-peers-{name}"))
                .request_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .with_context(|| format!("cannot connect to FerryMQ at {}", self.addr))
    }

    async fn create(&self, admin: &Client, name: &str, storage: Storage) -> anyhow::Result<()> {
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
        "transient: memory topic, unconfirmed batches of 1000, auto-ack; durable: disk topic, \
         fsync=always, batches of 1000 with receipts, 8 in flight; work queue: credit 1000, one \
         ack of ranges per delivered frame"
            .into()
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
        let admin = self.connect("admin").await?;
        let topic = unique("durable");
        self.create(&admin, &topic, Storage::Disk).await?;
        let counters = Counters::new();
        let producer = self.connect("pub").await?;
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
        let admin = self.connect("admin").await?;
        let topic = unique("queue");
        let name = "workers".to_string();
        self.create(&admin, &topic, Storage::Disk).await?;
        // The subscription exists before the preload and keeps what arrives while it has no
        // consumer.
        admin
            .subscribe(
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
            let admin = admin.clone();
            async move { Self::publish_durable(&admin, &topic, 100, &p, &counters, preload_max).await }
        });
        let deadline = Instant::now() + preload_time;
        while !preload.is_finished() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        counters.stop.store(true, Ordering::Relaxed);
        join(preload, "preload").await?;
        let total = counters.sent();

        let consumer = self.connect("worker").await?;
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
        let _ = admin.delete_subscription(&topic, &name).await;
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
