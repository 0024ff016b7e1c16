//! A consumer: takes whole DELIVER frames, records latency once per run of equal stamps and acks
//! each frame with one ACK of ranges.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ferrymq_client::{
    push_offset, Client, DeliveryBatchExt, OffsetRange, SubscribeOptions, Subscription,
};
use hdrhistogram::Histogram;
use tokio::sync::{oneshot, watch};

use crate::cmd::ConnectArgs;

use super::{new_histogram, Shared, STAMP_BYTES};

pub(super) struct ConsumerJob {
    pub(super) options: SubscribeOptions,
    /// Messages this consumer received.
    pub(super) count: Arc<AtomicU64>,
    pub(super) stop: watch::Receiver<bool>,
    /// With --preload: connect, then subscribe when this turns true.
    pub(super) go: Option<watch::Receiver<bool>>,
    /// With --preload: the number of first deliveries that completes the run, and the signal
    /// that stops every consumer; on stopping, the consumer confirms its acks.
    pub(super) finish: Option<(u64, Arc<watch::Sender<bool>>)>,
    pub(super) ack_flush_delay: Duration,
    pub(super) ack_each: bool,
    pub(super) record_latency: bool,
}

// The receive loop stays whole: its state (the ranges to ack, the last ack, the run of equal
// stamps) lives in locals on the hot path that docs/benchmarks.md measures.
pub(super) async fn consume(
    connect: ConnectArgs,
    job: ConsumerJob,
    shared: Arc<Shared>,
    ready: oneshot::Sender<()>,
) -> anyhow::Result<Histogram<u64>> {
    let ConsumerJob {
        options,
        count,
        mut stop,
        go,
        finish,
        ack_flush_delay,
        ack_each,
        record_latency,
    } = job;
    let Some((client, mut subscription)) =
        join(&connect, options, ack_flush_delay, &mut stop, go, ready).await?
    else {
        return new_histogram();
    };
    let mut latency = new_histogram()?;
    let mut ranges = Vec::with_capacity(64);
    let auto_ack = subscription.auto_ack();
    // The last range this consumer acked, confirmed at the end with --preload.
    let mut last_acked: Option<OffsetRange> = None;
    // Bounded by the stop signal, which the main task sends at the latest after the grace period.
    loop {
        let next = tokio::select! {
            biased;
            _ = stop.wait_for(|stopped| *stopped) => break,
            next = subscription.next_batch() => next,
        };
        let batch = match next {
            None => break,
            Some(Ok(batch)) => batch,
            Some(Err(error)) if error.is_connection_error() => {
                return Err(error).context("connection lost while consuming")
            }
            Some(Err(error)) => {
                shared.record_error(format!("consumer: {error}"));
                continue;
            }
        };
        let now_ns = shared.now_ns();
        let mut redelivered = 0u64;
        // Borrowed views: no per-message allocation or reference counting. Messages of one
        // publish frame share a stamp, so latency is recorded once per run of equal stamps.
        let mut run: Option<(u64, u64)> = None;
        for delivery in batch.views() {
            if record_latency {
                if let Some(stamp) = delivery.body.first_chunk::<STAMP_BYTES>() {
                    let sent = u64::from_le_bytes(*stamp);
                    run = match run {
                        Some((stamp, count)) if stamp == sent => Some((stamp, count + 1)),
                        Some((stamp, count)) => {
                            latency.saturating_record_n(now_ns.saturating_sub(stamp).max(1), count);
                            Some((sent, 1))
                        }
                        None => Some((sent, 1)),
                    };
                }
            }
            if delivery.attempt > 1 {
                redelivered += 1;
            }
            if auto_ack {
                continue;
            }
            if ack_each {
                let one = OffsetRange::single(delivery.partition, delivery.offset);
                subscription.ack_ranges(&[one]).await?;
                last_acked = Some(one);
            } else {
                push_offset(&mut ranges, delivery.partition, delivery.offset);
            }
        }
        if let Some((stamp, count)) = run {
            latency.saturating_record_n(now_ns.saturating_sub(stamp).max(1), count);
        }
        if !ranges.is_empty() {
            subscription.ack_ranges(&ranges).await?;
            last_acked = ranges.last().copied();
            ranges.clear();
        }
        let first = count_frame(&shared, &count, batch.count() as u64, redelivered, now_ns);
        if let Some((expected, stop_all)) = &finish {
            if first >= *expected {
                stop_all.send_replace(true);
            }
        }
    }
    if let (Some(_), Some(last)) = (&finish, last_acked) {
        confirm_acks(&subscription, last, &shared).await;
    }
    let _ = subscription.close().await;
    let _ = client.close().await;
    Ok(latency)
}

/// Connects and subscribes, then tells the run it is `ready`. With --preload (`go`) it is ready
/// once connected and subscribes when `go` turns true; `None` when the run stopped first.
async fn join(
    connect: &ConnectArgs,
    options: SubscribeOptions,
    ack_flush_delay: Duration,
    stop: &mut watch::Receiver<bool>,
    go: Option<watch::Receiver<bool>>,
    ready: oneshot::Sender<()>,
) -> anyhow::Result<Option<(Client, Subscription)>> {
    let client = Client::connect_with(
        connect
            .config("bench-consumer")?
            .ack_flush_delay(ack_flush_delay),
    )
    .await
    .with_context(|| format!("cannot connect to FerryMQ at {}", connect.addr))?;
    let mut ready = Some(ready);
    if let Some(mut go) = go {
        if let Some(ready) = ready.take() {
            let _ = ready.send(());
        }
        let start = tokio::select! {
            biased;
            _ = stop.wait_for(|stopped| *stopped) => false,
            go = go.wait_for(|go| *go) => go.is_ok(),
        };
        if !start {
            let _ = client.close().await;
            return Ok(None);
        }
    }
    let topic = options.topic.clone();
    let subscription = client
        .subscribe(options)
        .await
        .with_context(|| format!("cannot subscribe to {topic}"))?;
    if let Some(ready) = ready.take() {
        let _ = ready.send(());
    }
    Ok(Some((client, subscription)))
}

/// Adds one DELIVER frame of `n` messages to the counters; returns the run's first deliveries
/// so far, this frame's included.
fn count_frame(shared: &Shared, count: &AtomicU64, n: u64, redelivered: u64, now_ns: u64) -> u64 {
    count.fetch_add(n, Ordering::Relaxed);
    shared.delivered.fetch_add(n, Ordering::Relaxed);
    let first = shared
        .first_delivered
        .fetch_add(n - redelivered, Ordering::Relaxed)
        + (n - redelivered);
    shared.last_delivery_ns.fetch_max(now_ns, Ordering::Relaxed);
    if redelivered > 0 {
        shared.redelivered.fetch_add(redelivered, Ordering::Relaxed);
    }
    first
}

/// Confirms this consumer's acks by confirming its last one: answered once the acks queued
/// before it on this connection are applied (and, on a disk topic, saved); a range already acked
/// is ignored by the broker.
async fn confirm_acks(subscription: &Subscription, last: OffsetRange, shared: &Shared) {
    match subscription.ack_confirmed(&[last]).await {
        Ok(()) => {
            shared
                .acks_confirmed_ns
                .fetch_max(shared.now_ns(), Ordering::Relaxed);
        }
        Err(error) => {
            shared.ack_confirm_failures.fetch_add(1, Ordering::Relaxed);
            shared.record_error(format!("consumer: confirming acks: {error}"))
        }
    }
}
