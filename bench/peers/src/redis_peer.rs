//! Redis through the `redis` crate (multiplexed async connections).
//!
//! - transient: Pub/Sub; the publisher pipelines `batch` PUBLISH commands per round trip with
//!   `pipeline` pipelines in flight, the subscriber is a separate connection;
//! - durable: Streams, XADD pipelined the same way; a reply comes after the AOF write and, with
//!   `appendfsync always`, its fsync (the server is restarted between `always` and `everysec`);
//! - work queue: a consumer group created before the pre-load (XADD), drained by one consumer
//!   whose XREADGROUP (COUNT `window`) carries the XACK of the previous batch in the same
//!   pipeline;
//! - latency: Pub/Sub, one PUBLISH per message, sent without waiting for the previous reply.
//!
//! The client's sockets keep Nagle's algorithm on, as redis-rs does by default, unless
//! `nodelay` is set. On a request/reply protocol Nagle costs Redis little (every reply carries
//! the ACK that releases the next small write) and saves it sends in a burst; a comparison of
//! latency tails with the other clients, which all set `TCP_NODELAY`, runs both ways
//! (`bench/peers/tail`).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::io::tcp::TcpSettings;
use redis::streams::StreamReadReply;
use redis::{AsyncConnectionConfig, IntoConnectionInfo};

use crate::harness::{
    join, now_ns, own_thread, settle, stamp_of, window, Counters, LatencyRecorder, LatencyRun,
    Pacer, Params, Throughput, GRACE, STAMP_BYTES,
};

#[derive(Clone)]
pub struct Redis {
    pub addr: String,
    /// The server's `appendfsync`, as the script started it.
    pub appendfsync: String,
    /// Set `TCP_NODELAY` on the client's sockets. redis-rs leaves Nagle's algorithm on unless
    /// asked; every other client here (FerryMQ's, async-nats, lapin) turns it off.
    pub nodelay: bool,
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), now_ns())
}

impl Redis {
    fn client(&self) -> anyhow::Result<redis::Client> {
        let info = format!("redis://{}/", self.addr)
            .into_connection_info()
            .context("redis address")?
            .set_tcp_settings(TcpSettings::default().set_nodelay(self.nodelay));
        redis::Client::open(info).context("redis address")
    }

    async fn connect(&self) -> anyhow::Result<MultiplexedConnection> {
        self.client()?
            .get_multiplexed_async_connection_with_config(
                &AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30))),
            )
            .await
            .with_context(|| format!("cannot connect to Redis at {}", self.addr))
    }

    pub fn setup(&self) -> String {
        format!(
            "appendonly yes, appendfsync {}; client TCP_NODELAY {}; transient: Pub/Sub, PUBLISH pipelined 1000 per round \
             trip, 8 connections with one pipeline each; durable: XADD pipelined the same way; work queue: \
             XREADGROUP COUNT 1000 with the previous batch's XACK in the same pipeline",
            self.appendfsync,
            if self.nodelay {
                "on"
            } else {
                "off (Nagle on: the redis-rs default)"
            }
        )
    }

    pub async fn transient(&self, p: &Params) -> anyhow::Result<Throughput> {
        let channel = unique("transient");
        let counters = Counters::new();
        let mut pubsub = self.client()?.get_async_pubsub().await?;
        pubsub.subscribe(&channel).await?;
        let mut messages = pubsub.into_on_message();
        let sub_task = tokio::spawn({
            let counters = counters.clone();
            async move {
                while !counters.finished() {
                    match tokio::time::timeout(Duration::from_millis(50), messages.next()).await {
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
        let mut tasks = Vec::new();
        for _ in 0..p.pipeline {
            let mut conn = self.connect().await?;
            let (counters, channel) = (counters.clone(), channel.clone());
            let (batch, lead) = (p.batch, p.lead);
            tasks.push(tokio::spawn(async move {
                let body = [b'x'; 100];
                while !counters.stopped() {
                    counters.hold_lead(lead).await;
                    let mut pipe = redis::pipe();
                    for _ in 0..batch {
                        pipe.cmd("PUBLISH").arg(&channel).arg(&body[..]).ignore();
                    }
                    pipe.query_async::<()>(&mut conn).await?;
                    counters.sent.fetch_add(batch as u64, Ordering::Relaxed);
                }
                anyhow::Ok(())
            }));
        }
        let mut result = window(&counters, p, || counters.received()).await;
        for task in tasks {
            join(task, "publisher").await?;
        }
        ((), result.lost) = settle(&counters, true, sub_task).await?;
        Ok(result)
    }

    /// XADDs until told to stop or about `max` were sent; `counters.sent` counts replies.
    /// One connection per pipeline: Redis reads at most 16 KiB of a client's commands per event
    /// loop turn, and with `appendfsync always` every turn ends in an fsync, so one connection
    /// would give it 16 KiB per fsync.
    async fn spawn_xadds(
        &self,
        key: &str,
        size: usize,
        p: &Params,
        counters: &std::sync::Arc<Counters>,
        max: u64,
    ) -> anyhow::Result<Vec<tokio::task::JoinHandle<anyhow::Result<()>>>> {
        let issued = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..p.pipeline {
            let mut conn = self.connect().await?;
            let (counters, key) = (counters.clone(), key.to_string());
            let (issued, batch) = (issued.clone(), p.batch as u64);
            tasks.push(tokio::spawn(async move {
                let body = vec![b'x'; size];
                while !counters.stopped() {
                    let first = issued.fetch_add(batch, Ordering::Relaxed);
                    if first >= max {
                        break;
                    }
                    let n = (max - first).min(batch);
                    let mut pipe = redis::pipe();
                    for _ in 0..n {
                        pipe.cmd("XADD")
                            .arg(&key)
                            .arg("*")
                            .arg("d")
                            .arg(&body[..])
                            .ignore();
                    }
                    pipe.query_async::<()>(&mut conn).await?;
                    counters.sent.fetch_add(n, Ordering::Relaxed);
                }
                anyhow::Ok(())
            }));
        }
        Ok(tasks)
    }

    pub async fn durable(&self, p: &Params, size: usize) -> anyhow::Result<Throughput> {
        let key = unique("durable");
        let counters = Counters::new();
        let mut conn = self.connect().await?;
        let tasks = self.spawn_xadds(&key, size, p, &counters, u64::MAX).await?;
        let result = window(&counters, p, || counters.sent()).await;
        for task in tasks {
            join(task, "publisher").await?;
        }
        let _: () = redis::cmd("UNLINK")
            .arg(&key)
            .query_async(&mut conn)
            .await?;
        Ok(result)
    }

    pub async fn work_queue(
        &self,
        p: &Params,
        preload_max: u64,
        preload_time: Duration,
    ) -> anyhow::Result<Throughput> {
        let key = unique("queue");
        let group = "workers";
        let mut conn = self.connect().await?;
        let _: () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&key)
            .arg(group)
            .arg("$")
            .arg("MKSTREAM")
            .query_async(&mut conn)
            .await?;
        let counters = Counters::new();
        let tasks = self
            .spawn_xadds(&key, 100, p, &counters, preload_max)
            .await?;
        let deadline = Instant::now() + preload_time;
        while !tasks.iter().all(|t| t.is_finished()) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        counters.stop.store(true, Ordering::Relaxed);
        for task in tasks {
            join(task, "preload").await?;
        }
        let total = counters.sent();

        let mut worker = self.connect().await?;
        let start = Instant::now();
        let mut to_ack: Vec<String> = Vec::with_capacity(p.window);
        let mut received = 0u64;
        let mut last_progress = Instant::now();
        while received < total && last_progress.elapsed() < GRACE {
            let mut read = redis::cmd("XREADGROUP");
            read.arg("GROUP")
                .arg(group)
                .arg("worker-1")
                .arg("COUNT")
                .arg(p.window)
                .arg("STREAMS")
                .arg(&key)
                .arg(">");
            let reply: Option<StreamReadReply> = if to_ack.is_empty() {
                read.query_async(&mut worker).await?
            } else {
                let mut pipe = redis::pipe();
                pipe.cmd("XACK")
                    .arg(&key)
                    .arg(group)
                    .arg(&to_ack[..])
                    .ignore();
                pipe.add_command(read);
                let (reply,): (Option<StreamReadReply>,) = pipe.query_async(&mut worker).await?;
                reply
            };
            to_ack.clear();
            for stream in reply.map(|r| r.keys).unwrap_or_default() {
                for entry in stream.ids {
                    to_ack.push(entry.id);
                }
            }
            if !to_ack.is_empty() {
                received += to_ack.len() as u64;
                last_progress = Instant::now();
            }
        }
        if !to_ack.is_empty() {
            let _: i64 = redis::cmd("XACK")
                .arg(&key)
                .arg(group)
                .arg(&to_ack[..])
                .query_async(&mut worker)
                .await?;
        }
        let secs = start.elapsed().as_secs_f64();
        let _: () = redis::cmd("UNLINK")
            .arg(&key)
            .query_async(&mut conn)
            .await?;
        Ok(Throughput {
            msgs_per_s: received as f64 / secs,
            counted: received,
            secs,
            lost: total.saturating_sub(received),
        })
    }

    pub async fn latency(&self, p: &Params) -> anyhow::Result<LatencyRun> {
        let channel = unique("latency");
        let counters = Counters::new();
        let mut pubsub = self.client()?.get_async_pubsub().await?;
        pubsub.subscribe(&channel).await?;
        let mut messages = pubsub.into_on_message();
        let measure_from = Instant::now() + p.warmup;
        let sub_task = tokio::spawn({
            let counters = counters.clone();
            async move {
                let mut recorder = LatencyRecorder::new(measure_from);
                while !counters.finished() {
                    match tokio::time::timeout(Duration::from_millis(50), messages.next()).await {
                        Ok(Some(message)) => {
                            recorder.record(message.get_payload_bytes());
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
            let (this, channel, p, counters) =
                (self.clone(), channel.clone(), p.clone(), counters.clone());
            move || async move {
                let conn = this.connect().await?;
                let mut pacer = Pacer::new(p.rate, p.warmup + p.latency_time);
                let mut body = vec![b'x'; 100];
                let mut replies = tokio::task::JoinSet::new();
                while let Some(due) = pacer.tick().await {
                    body[..STAMP_BYTES].copy_from_slice(&stamp_of(due).to_le_bytes());
                    let (mut conn, channel, body) = (conn.clone(), channel.clone(), body.clone());
                    // The publisher does not wait for one reply before the next publish is due.
                    replies.spawn(async move {
                        redis::cmd("PUBLISH")
                            .arg(&channel)
                            .arg(&body[..])
                            .query_async::<i64>(&mut conn)
                            .await
                    });
                    counters.sent.fetch_add(1, Ordering::Relaxed);
                    while let Some(done) = replies.try_join_next() {
                        done??;
                    }
                }
                while let Some(done) = replies.join_next().await {
                    done??;
                }
                anyhow::Ok(())
            }
        })
        .await;
        let (histogram, lost) = settle(&counters, produced.is_ok(), sub_task).await?;
        produced?;
        Ok(LatencyRun::from_histogram(&histogram, lost))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redis(nodelay: bool) -> Redis {
        Redis {
            addr: "127.0.0.1:6379".into(),
            appendfsync: "everysec".into(),
            nodelay,
        }
    }

    #[test]
    fn tcp_nodelay_is_set_only_when_asked() {
        for nodelay in [false, true] {
            let client = redis(nodelay).client().unwrap();
            assert_eq!(
                client.get_connection_info().tcp_settings().nodelay(),
                nodelay
            );
            assert!(redis(nodelay).setup().contains(if nodelay {
                "client TCP_NODELAY on"
            } else {
                "client TCP_NODELAY off"
            }));
        }
    }
}
