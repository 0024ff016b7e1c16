//! RabbitMQ through `lapin` (AMQP 0-9-1).
//!
//! - transient: a non-durable fan-out exchange bound to a non-durable queue, publishes without
//!   confirms, a consumer with automatic ack, on separate connections;
//! - durable: a durable (classic) queue, persistent messages (delivery mode 2) with publisher
//!   confirms, `batch × pipeline` confirms outstanding; RabbitMQ confirms a persistent message
//!   once its queue has written it to disk and fsynced;
//! - work queue: the durable queue pre-loaded that way, drained by one consumer with prefetch
//!   `window` and a manual ack per message;
//! - latency: the transient setup, one publish per message.
//!
//! With `--rabbit-quorum` the durable and work queues are quorum queues (`x-queue-type:
//! quorum`, Raft-replicated on every node of the cluster): a confirm comes once a majority of
//! the queue's members has the message on disk. `addr` may list every node of a cluster
//! (comma-separated): the driver connects to the first, where the queue is declared and so
//! led (RabbitMQ's default `queue_leader_locator`, client-local).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures_util::future::try_join_all;
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::PublisherConfirm;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};

use crate::harness::{
    join, now_ns, own_thread, settle, stamp_of, window, Counters, LatencyRecorder, LatencyRun,
    Pacer, Params, Throughput, GRACE, STAMP_BYTES,
};

#[derive(Clone)]
pub struct Rabbit {
    /// host:port, or every node's, comma-separated, for a cluster (the first is used).
    pub addr: String,
    /// Durable and work queues are quorum queues.
    pub quorum: bool,
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), now_ns())
}

impl Rabbit {
    /// The nodes of `addr`, the first being the one the drivers use.
    pub fn nodes(&self) -> Vec<String> {
        self.addr.split(',').map(str::to_string).collect()
    }

    async fn connect(&self) -> anyhow::Result<Connection> {
        Self::connect_to(&self.nodes()[0]).await
    }

    pub async fn connect_to(addr: &str) -> anyhow::Result<Connection> {
        Connection::connect(
            &format!("amqp://guest:guest@{addr}/%2f"),
            ConnectionProperties::default(),
        )
        .await
        .with_context(|| format!("cannot connect to RabbitMQ at {addr}"))
    }

    pub fn setup(&self) -> String {
        let queue = if self.quorum {
            format!(
                "quorum queue on {} node(s), led by the node the client declared it on (a \
                 confirm once a majority of its members has the message on disk)",
                self.nodes().len()
            )
        } else {
            "durable classic queue".to_string()
        };
        format!(
            "transient: non-durable fan-out exchange and queue, no confirms, auto-ack; durable: \
             {queue}, persistent messages, publisher confirms, 8000 outstanding; work queue: \
             prefetch 1000, manual ack per message"
        )
    }

    /// A non-durable fan-out exchange and a non-durable queue bound to it, declared on `channel`.
    async fn transient_topology(channel: &Channel, name: &str) -> anyhow::Result<()> {
        channel
            .exchange_declare(
                name.into(),
                ExchangeKind::Fanout,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_declare(
                name.into(),
                QueueDeclareOptions {
                    auto_delete: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_bind(
                name.into(),
                name.into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(())
    }

    async fn cleanup(channel: &Channel, name: &str, exchange: bool) {
        let _ = channel
            .queue_delete(name.into(), QueueDeleteOptions::default())
            .await;
        if exchange {
            let _ = channel
                .exchange_delete(name.into(), ExchangeDeleteOptions::default())
                .await;
        }
    }

    pub async fn transient(&self, p: &Params) -> anyhow::Result<Throughput> {
        let name = unique("transient");
        let counters = Counters::new();
        let sub_conn = self.connect().await?;
        let sub_channel = sub_conn.create_channel().await?;
        Self::transient_topology(&sub_channel, &name).await?;
        let mut consumer = sub_channel
            .basic_consume(
                name.as_str().into(),
                "sub".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        let sub_task = tokio::spawn({
            let counters = counters.clone();
            async move {
                while !counters.finished() {
                    match tokio::time::timeout(Duration::from_millis(50), consumer.next()).await {
                        Ok(Some(delivery)) => {
                            delivery?;
                            counters.received.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(None) => break,
                        Err(_) => {}
                    }
                }
                anyhow::Ok(())
            }
        });
        let pub_conn = self.connect().await?;
        let channel = pub_conn.create_channel().await?;
        let pub_task = tokio::spawn({
            let (counters, name, batch, lead) = (counters.clone(), name.clone(), p.batch, p.lead);
            async move {
                let body = vec![b'x'; 100];
                while !counters.stopped() {
                    counters.hold_lead(lead).await;
                    // lapin answers a publish once its I/O loop wrote it: a batch of publishes
                    // awaited together is written together.
                    try_join_all((0..batch).map(|_| {
                        channel.basic_publish(
                            name.as_str().into(),
                            "".into(),
                            BasicPublishOptions::default(),
                            &body,
                            BasicProperties::default(),
                        )
                    }))
                    .await?;
                    counters.sent.fetch_add(batch as u64, Ordering::Relaxed);
                }
                anyhow::Ok(())
            }
        });
        let mut result = window(&counters, p, || counters.received()).await;
        join(pub_task, "publisher").await?;
        ((), result.lost) = settle(&counters, true, sub_task).await?;
        Self::cleanup(&sub_channel, &name, true).await;
        let _ = pub_conn.close(200, "done".into()).await;
        let _ = sub_conn.close(200, "done".into()).await;
        Ok(result)
    }

    /// A durable queue: classic, or a quorum queue with `quorum`.
    pub async fn durable_queue(channel: &Channel, name: &str, quorum: bool) -> anyhow::Result<()> {
        let mut arguments = FieldTable::default();
        if quorum {
            arguments.insert(
                "x-queue-type".into(),
                AMQPValue::LongString("quorum".into()),
            );
        }
        channel
            .queue_declare(
                name.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                arguments,
            )
            .await?;
        Ok(())
    }

    /// Publishes persistent messages with confirms until told to stop or `max` were sent;
    /// `counters.sent` counts confirmed messages.
    async fn publish_durable(
        channel: &Channel,
        queue: &str,
        size: usize,
        (batch, in_flight_max): (usize, usize),
        counters: &Counters,
        max: u64,
    ) -> anyhow::Result<()> {
        let body = vec![b'x'; size];
        let properties = BasicProperties::default().with_delivery_mode(2);
        let mut in_flight: VecDeque<PublisherConfirm> = VecDeque::with_capacity(in_flight_max);
        let mut issued = 0u64;
        async fn settle(confirm: PublisherConfirm, counters: &Counters) -> anyhow::Result<()> {
            let confirmation = confirm.await?;
            if !confirmation.is_ack() {
                bail!("publish not confirmed: {confirmation:?}");
            }
            counters.sent.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        while !counters.stopped() && issued < max {
            let n = (max - issued).min(batch as u64) as usize;
            while in_flight.len() + n > in_flight_max.max(n) {
                match in_flight.pop_front() {
                    Some(oldest) => settle(oldest, counters).await?,
                    None => break,
                }
            }
            // Written together (see `transient`); each confirm is awaited in order.
            let confirms = try_join_all((0..n).map(|_| {
                channel.basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    &body,
                    properties.clone(),
                )
            }))
            .await?;
            in_flight.extend(confirms);
            issued += n as u64;
        }
        while let Some(pending) = in_flight.pop_front() {
            settle(pending, counters).await?;
        }
        Ok(())
    }

    pub async fn durable(&self, p: &Params, size: usize) -> anyhow::Result<Throughput> {
        let name = unique("durable");
        let conn = self.connect().await?;
        let channel = conn.create_channel().await?;
        Self::durable_queue(&channel, &name, self.quorum).await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let counters = Counters::new();
        let task = tokio::spawn({
            let (channel, counters, name) = (channel.clone(), counters.clone(), name.clone());
            let window = (p.batch, p.batch * p.pipeline);
            async move {
                Self::publish_durable(&channel, &name, size, window, &counters, u64::MAX).await
            }
        });
        let result = window(&counters, p, || counters.sent()).await;
        join(task, "publisher").await?;
        Self::cleanup(&channel, &name, false).await;
        let _ = conn.close(200, "done".into()).await;
        Ok(result)
    }

    pub async fn work_queue(
        &self,
        p: &Params,
        preload_max: u64,
        preload_time: Duration,
    ) -> anyhow::Result<Throughput> {
        let name = unique("queue");
        let conn = self.connect().await?;
        let channel = conn.create_channel().await?;
        Self::durable_queue(&channel, &name, self.quorum).await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let counters = Counters::new();
        let preload = tokio::spawn({
            let (channel, counters, name) = (channel.clone(), counters.clone(), name.clone());
            let window = (p.batch, p.batch * p.pipeline);
            async move {
                Self::publish_durable(&channel, &name, 100, window, &counters, preload_max).await
            }
        });
        let deadline = Instant::now() + preload_time;
        while !preload.is_finished() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        counters.stop.store(true, Ordering::Relaxed);
        join(preload, "preload").await?;
        let total = counters.sent();

        let worker = self.connect().await?;
        let start = Instant::now();
        let wchannel = worker.create_channel().await?;
        wchannel
            .basic_qos(
                p.window.min(u16::MAX as usize) as u16,
                BasicQosOptions::default(),
            )
            .await?;
        let mut consumer = wchannel
            .basic_consume(
                name.as_str().into(),
                "worker".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let mut received = 0u64;
        let mut last_progress = Instant::now();
        // One ack per message; acks are not awaited one by one (lapin answers each once its I/O
        // loop wrote it), only bounded in number.
        let mut acks = FuturesUnordered::new();
        while received < total && last_progress.elapsed() < GRACE {
            while acks.len() >= p.window {
                if let Some(done) = acks.next().await {
                    done?;
                }
            }
            tokio::select! {
                Some(done) = acks.next(), if !acks.is_empty() => {
                    done?;
                }
                next = tokio::time::timeout(Duration::from_millis(100), consumer.next()) => {
                    match next {
                        Ok(Some(delivery)) => {
                            let delivery = delivery?;
                            acks.push(async move {
                                delivery.ack(BasicAckOptions::default()).await
                            });
                            received += 1;
                            last_progress = Instant::now();
                        }
                        Ok(None) => break,
                        Err(_) => {}
                    }
                }
            }
        }
        while let Some(done) = acks.next().await {
            done?;
        }
        let secs = start.elapsed().as_secs_f64();
        Self::cleanup(&channel, &name, false).await;
        let _ = worker.close(200, "done".into()).await;
        let _ = conn.close(200, "done".into()).await;
        Ok(Throughput {
            msgs_per_s: received as f64 / secs,
            counted: received,
            secs,
            lost: total.saturating_sub(received),
        })
    }

    pub async fn latency(&self, p: &Params) -> anyhow::Result<LatencyRun> {
        let name = unique("latency");
        let counters = Counters::new();
        let sub_conn = self.connect().await?;
        let sub_channel = sub_conn.create_channel().await?;
        Self::transient_topology(&sub_channel, &name).await?;
        let mut consumer = sub_channel
            .basic_consume(
                name.as_str().into(),
                "sub".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        let measure_from = Instant::now() + p.warmup;
        let sub_task = tokio::spawn({
            let counters = counters.clone();
            async move {
                let mut recorder = LatencyRecorder::new(measure_from);
                while !counters.finished() {
                    match tokio::time::timeout(Duration::from_millis(50), consumer.next()).await {
                        Ok(Some(delivery)) => {
                            recorder.record(&delivery?.data);
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
            let (this, name, p, counters) =
                (self.clone(), name.clone(), p.clone(), counters.clone());
            move || async move {
                let pub_conn = this.connect().await?;
                let channel = pub_conn.create_channel().await?;
                let mut pacer = Pacer::new(p.rate, p.warmup + p.latency_time);
                let mut body = vec![b'x'; 100];
                let mut written = tokio::task::JoinSet::new();
                while let Some(due) = pacer.tick().await {
                    body[..STAMP_BYTES].copy_from_slice(&stamp_of(due).to_le_bytes());
                    // Not awaited here: lapin answers a publish once its I/O thread wrote it,
                    // and the next publish may be due before that.
                    let (channel, name, body) = (channel.clone(), name.clone(), body.clone());
                    written.spawn(async move {
                        channel
                            .basic_publish(
                                name.as_str().into(),
                                "".into(),
                                BasicPublishOptions::default(),
                                &body,
                                BasicProperties::default(),
                            )
                            .await
                            .map(drop)
                    });
                    counters.sent.fetch_add(1, Ordering::Relaxed);
                    while let Some(done) = written.try_join_next() {
                        done??;
                    }
                }
                while let Some(done) = written.join_next().await {
                    done??;
                }
                let _ = pub_conn.close(200, "done".into()).await;
                anyhow::Ok(())
            }
        })
        .await;
        let (histogram, lost) = settle(&counters, produced.is_ok(), sub_task).await?;
        produced?;
        Self::cleanup(&sub_channel, &name, true).await;
        let _ = sub_conn.close(200, "done".into()).await;
        Ok(LatencyRun::from_histogram(&histogram, lost))
    }
}
