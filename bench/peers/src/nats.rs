//! NATS through `async-nats`.
//!
//! - transient: core NATS publish/subscribe on one subject, separate publisher and subscriber
//!   connections (no persistence, no acks: at-most-once);
//! - durable: a JetStream stream with file storage; each publish awaits its PubAck, with
//!   `batch × pipeline` publishes in flight; whether the server fsyncs before the PubAck depends on
//!   its `sync_interval` (see `--nats-sync` and the notes under the table);
//! - work queue: a file-storage stream with work-queue retention, pre-loaded through the durable
//!   path, drained by one durable pull consumer (explicit ack, `window` acks pending, batches of
//!   `window`), acking each message;
//! - latency: core NATS, one publish per message.
//!
//! Against a JetStream cluster (`--nats-replicas 3`, `--nats-servers n1=host:port,...`): streams
//! have that many replicas, and the durable publisher and the work queue's worker connect to the
//! server that leads the stream (JetStream's own answer, by server name), as FerryMQ's go to
//! the partition's leader; the stream is created through the first server.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures_util::StreamExt;

use crate::harness::{
    join, now_ns, own_thread, settle, stamp_of, window, Counters, LatencyRecorder, LatencyRun,
    Pacer, Params, Throughput, GRACE, STAMP_BYTES,
};

#[derive(Clone)]
pub struct Nats {
    pub addr: String,
    /// The `sync_interval` the server runs with, as the script configured it.
    pub sync: String,
    /// Replicas of every stream (1: a single server).
    pub replicas: usize,
    /// A cluster's servers by server name (`n1=127.0.0.1:4222`), to reach a stream's leader.
    pub servers: Vec<(String, String)>,
}

fn unique(prefix: &str) -> String {
    format!("{prefix}_{}_{}", std::process::id(), now_ns())
}

impl Nats {
    async fn connect(&self) -> anyhow::Result<async_nats::Client> {
        Self::connect_to(&self.addr).await
    }

    async fn connect_to(addr: &str) -> anyhow::Result<async_nats::Client> {
        async_nats::ConnectOptions::new()
            .subscription_capacity(1 << 20)
            .client_capacity(1 << 16)
            .connect(format!("nats://{addr}"))
            .await
            .with_context(|| format!("cannot connect to NATS at {addr}"))
    }

    /// A connection to the server that leads stream `name` (the one server without a cluster),
    /// asked again (bounded) while the stream's group elects its leader.
    async fn connect_stream_leader(
        &self,
        js: &jetstream::Context,
        name: &str,
    ) -> anyhow::Result<async_nats::Client> {
        if self.servers.is_empty() {
            return self.connect().await;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut stream = js.get_stream(name).await?;
            let info = stream.info().await?;
            let leader = info.cluster.as_ref().and_then(|c| c.leader.clone());
            let addr = leader
                .as_ref()
                .and_then(|l| self.servers.iter().find(|(n, _)| n == l))
                .map(|(_, a)| a.clone());
            if let Some(addr) = addr {
                return Self::connect_to(&addr).await;
            }
            if Instant::now() >= deadline {
                bail!(
                    "stream {name} has no leader among {:?} (it says {leader:?})",
                    self.servers
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn jetstream(&self, client: async_nats::Client, p: &Params) -> jetstream::Context {
        jetstream::context::ContextBuilder::new()
            .timeout(Duration::from_secs(30))
            .max_ack_inflight(p.batch * p.pipeline)
            .build(client)
    }

    pub fn setup(&self) -> String {
        let cluster = if self.replicas > 1 {
            format!(
                "cluster of {} servers, streams with {} replicas (a PubAck once a majority has \
                 the message), publisher and worker on the stream leader's server; ",
                self.servers.len(),
                self.replicas
            )
        } else {
            String::new()
        };
        format!(
            "{cluster}transient: core pub/sub; durable: JetStream file storage, sync_interval {}, \
             each publish awaits its PubAck, 8000 in flight; work queue: work-queue stream, \
             durable pull consumer, explicit ack per message, 1000 pending",
            self.sync
        )
    }

    pub async fn transient(&self, p: &Params) -> anyhow::Result<Throughput> {
        let subject = unique("transient");
        let counters = Counters::new();
        let consumer = self.connect().await?;
        let mut sub = consumer.subscribe(subject.clone()).await?;
        consumer.flush().await?;
        let sub_task = tokio::spawn({
            let counters = counters.clone();
            async move {
                while !counters.finished() {
                    match tokio::time::timeout(Duration::from_millis(50), sub.next()).await {
                        Ok(Some(_)) => {
                            counters.received.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(None) => break,
                        Err(_) => {}
                    }
                }
                anyhow::Ok(())
            }
        });
        let producer = self.connect().await?;
        let pub_task = tokio::spawn({
            let (counters, subject, batch, lead) =
                (counters.clone(), subject.clone(), p.batch, p.lead);
            let body = Bytes::from(vec![b'x'; 100]);
            async move {
                while !counters.stopped() {
                    counters.hold_lead(lead).await;
                    for _ in 0..batch {
                        producer.publish(subject.clone(), body.clone()).await?;
                    }
                    counters.sent.fetch_add(batch as u64, Ordering::Relaxed);
                }
                producer.flush().await?;
                anyhow::Ok(())
            }
        });
        let mut result = window(&counters, p, || counters.received()).await;
        join(pub_task, "publisher").await?;
        ((), result.lost) = settle(&counters, true, sub_task).await?;
        Ok(result)
    }

    async fn create_stream(
        &self,
        js: &jetstream::Context,
        name: &str,
        subject: &str,
        retention: stream::RetentionPolicy,
    ) -> anyhow::Result<()> {
        js.create_stream(stream::Config {
            name: name.to_string(),
            subjects: vec![subject.to_string()],
            storage: stream::StorageType::File,
            retention,
            num_replicas: self.replicas.max(1),
            ..Default::default()
        })
        .await
        .with_context(|| format!("cannot create stream {name}"))?;
        Ok(())
    }

    /// Publishes to the stream until told to stop or `max` were sent, `in_flight` PubAcks
    /// outstanding; `counters.sent` counts acknowledged messages.
    async fn publish_durable(
        js: &jetstream::Context,
        subject: &str,
        size: usize,
        in_flight_max: usize,
        counters: &Counters,
        max: u64,
    ) -> anyhow::Result<()> {
        let body = Bytes::from(vec![b'x'; size]);
        let mut in_flight = VecDeque::with_capacity(in_flight_max);
        let mut issued = 0u64;
        while !counters.stopped() && issued < max {
            if in_flight.len() >= in_flight_max {
                if let Some(oldest) = in_flight.pop_front() {
                    let _ack: jetstream::publish::PublishAck = oldest.await?;
                    counters.sent.fetch_add(1, Ordering::Relaxed);
                }
            }
            in_flight.push_back(js.publish(subject.to_string(), body.clone()).await?);
            issued += 1;
        }
        while let Some(pending) = in_flight.pop_front() {
            pending.await?;
            counters.sent.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    pub async fn durable(&self, p: &Params, size: usize) -> anyhow::Result<Throughput> {
        let client = self.connect().await?;
        let js = self.jetstream(client, p);
        let name = unique("DURABLE");
        let subject = format!("{name}.x");
        self.create_stream(&js, &name, &subject, stream::RetentionPolicy::Limits)
            .await?;
        let producer = self.connect_stream_leader(&js, &name).await?;
        let pjs = self.jetstream(producer, p);
        let counters = Counters::new();
        let task = tokio::spawn({
            let (js, counters, subject) = (pjs.clone(), counters.clone(), subject.clone());
            let in_flight = p.batch * p.pipeline;
            async move {
                Self::publish_durable(&js, &subject, size, in_flight, &counters, u64::MAX).await
            }
        });
        let result = window(&counters, p, || counters.sent()).await;
        join(task, "publisher").await?;
        let _ = js.delete_stream(&name).await;
        Ok(result)
    }

    pub async fn work_queue(
        &self,
        p: &Params,
        preload_max: u64,
        preload_time: Duration,
    ) -> anyhow::Result<Throughput> {
        let client = self.connect().await?;
        let js = self.jetstream(client.clone(), p);
        let name = unique("QUEUE");
        let subject = format!("{name}.x");
        self.create_stream(&js, &name, &subject, stream::RetentionPolicy::WorkQueue)
            .await?;
        let producer = self.connect_stream_leader(&js, &name).await?;
        let pjs = self.jetstream(producer, p);
        let counters = Counters::new();
        let preload = tokio::spawn({
            let (js, counters, subject) = (pjs.clone(), counters.clone(), subject.clone());
            let in_flight = p.batch * p.pipeline;
            async move {
                Self::publish_durable(&js, &subject, 100, in_flight, &counters, preload_max).await
            }
        });
        let deadline = Instant::now() + preload_time;
        while !preload.is_finished() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        counters.stop.store(true, Ordering::Relaxed);
        join(preload, "preload").await?;
        let total = counters.sent();

        let worker = self.connect_stream_leader(&js, &name).await?;
        let wjs = self.jetstream(worker.clone(), p);
        let start = Instant::now();
        let stream = wjs.get_stream(&name).await?;
        let pull: consumer::PullConsumer = stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some("workers".into()),
                ack_policy: consumer::AckPolicy::Explicit,
                max_ack_pending: p.window as i64,
                ..Default::default()
            })
            .await?;
        let mut messages = pull
            .stream()
            .max_messages_per_batch(p.window)
            .messages()
            .await?;
        let mut received = 0u64;
        let mut last_progress = Instant::now();
        while received < total && last_progress.elapsed() < GRACE {
            match tokio::time::timeout(Duration::from_millis(100), messages.next()).await {
                Ok(Some(message)) => {
                    let message = message.map_err(|e| anyhow::anyhow!("pull: {e}"))?;
                    message
                        .ack()
                        .await
                        .map_err(|e| anyhow::anyhow!("ack: {e}"))?;
                    received += 1;
                    last_progress = Instant::now();
                }
                Ok(None) => break,
                Err(_) => {}
            }
        }
        worker.flush().await?;
        let secs = start.elapsed().as_secs_f64();
        drop(messages);
        let _ = js.delete_stream(&name).await;
        if received == 0 && total > 0 {
            bail!("the pull consumer received nothing");
        }
        Ok(Throughput {
            msgs_per_s: received as f64 / secs,
            counted: received,
            secs,
            lost: total.saturating_sub(received),
        })
    }

    pub async fn latency(&self, p: &Params) -> anyhow::Result<LatencyRun> {
        let subject = unique("latency");
        let counters = Counters::new();
        let consumer = self.connect().await?;
        let mut sub = consumer.subscribe(subject.clone()).await?;
        consumer.flush().await?;
        let measure_from = Instant::now() + p.warmup;
        let sub_task = tokio::spawn({
            let counters = counters.clone();
            async move {
                let mut recorder = LatencyRecorder::new(measure_from);
                while !counters.finished() {
                    match tokio::time::timeout(Duration::from_millis(50), sub.next()).await {
                        Ok(Some(message)) => {
                            recorder.record(&message.payload);
                            counters.received.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(None) => break,
                        Err(_) => {}
                    }
                }
                anyhow::Ok(recorder.histogram)
            }
        });
        let produced = own_thread("paced-publisher", {
            let (this, subject, p, counters) =
                (self.clone(), subject.clone(), p.clone(), counters.clone());
            move || async move {
                let producer = this.connect().await?;
                let mut pacer = Pacer::new(p.rate, p.warmup + p.latency_time);
                let mut body = vec![b'x'; 100];
                while let Some(due) = pacer.tick().await {
                    body[..STAMP_BYTES].copy_from_slice(&stamp_of(due).to_le_bytes());
                    producer
                        .publish(subject.clone(), Bytes::copy_from_slice(&body))
                        .await?;
                    counters.sent.fetch_add(1, Ordering::Relaxed);
                }
                producer.flush().await?;
                anyhow::Ok(())
            }
        })
        .await;
        let (histogram, lost) = settle(&counters, produced.is_ok(), sub_task).await?;
        produced?;
        Ok(LatencyRun::from_histogram(&histogram, lost))
    }
}
