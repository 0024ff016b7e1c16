//! A producer: batches encoded straight into PUBLISH frames, `--pipeline` of them in flight,
//! paced by `--rate` when given.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ferrymq_client::{Client, PendingPublish, PublishEncoder};
use tokio::sync::{oneshot, watch};

use crate::cmd::ConnectArgs;

use super::{Shared, STAMP_BYTES};

/// Room for the key `k<u64>`.
#[derive(Default)]
struct KeyBuf([u8; 21]);

impl KeyBuf {
    /// Writes `k<index>` and returns it: no allocation or formatting machinery per message.
    fn set(&mut self, mut index: u64) -> &[u8] {
        let mut at = self.0.len();
        loop {
            at -= 1;
            self.0[at] = b'0' + (index % 10) as u8;
            index /= 10;
            if index == 0 {
                break;
            }
        }
        at -= 1;
        self.0[at] = b'k';
        &self.0[at..]
    }
}

/// Bytes of the key `k<index>`.
pub(super) fn key_len(index: u64) -> usize {
    1 + index.checked_ilog10().unwrap_or(0) as usize + 1
}

pub(super) struct ProducerJob {
    /// Topics to publish to, one batch each in turn (starting at an offset per producer).
    pub(super) topics: Arc<Vec<String>>,
    pub(super) first_topic: usize,
    /// Most messages this run may have published and not yet delivered (per subscription).
    pub(super) max_lead: Option<u64>,
    pub(super) fanout: u64,
    /// With `--rate`: time between this producer's batches.
    pub(super) batch_interval: Option<Duration>,
    /// Publish with request id 0 and await no receipts.
    pub(super) unconfirmed: bool,
    /// Messages to send, or `None` to send for `duration`.
    pub(super) count: Option<u64>,
    pub(super) duration: Option<Duration>,
    pub(super) batch: u32,
    pub(super) pipeline: usize,
    pub(super) size: usize,
    /// --keys: give messages the keys k0 .. k{N-1} in turn.
    pub(super) keys: Option<u64>,
}

// The send loop stays whole: its state (the batches in flight, the count sent, the next key)
// lives in locals on the hot path that docs/benchmarks.md measures.
pub(super) async fn produce(
    connect: ConnectArgs,
    job: ProducerJob,
    shared: Arc<Shared>,
    ready: oneshot::Sender<()>,
    mut go: watch::Receiver<Option<Instant>>,
) -> anyhow::Result<()> {
    let client = connect.connect("bench-producer").await?;
    let _ = ready.send(());
    let start = match go.wait_for(|start| start.is_some()).await {
        Ok(start) => start.unwrap_or_else(Instant::now),
        Err(_) => return Ok(()), // the run was abandoned before it started
    };
    let end = job.duration.map(|d| start + d);
    let mut body = vec![b'x'; job.size];
    let mut in_flight: VecDeque<PendingPublish> = VecDeque::with_capacity(job.pipeline);
    let mut sent = 0u64;
    let mut batches = 0usize;
    let mut next_key = 0u64;
    let sending = async {
        // Bounded by --count or --duration (or Ctrl-C); every await below is bounded in time.
        loop {
            let n = match job.count {
                Some(count) if sent >= count => break,
                Some(count) => (count - sent).min(job.batch as u64) as u32,
                None => job.batch,
            };
            if end.is_some_and(|end| Instant::now() >= end)
                || shared.stop_producers.load(Ordering::Relaxed)
            {
                break;
            }
            if in_flight.len() >= job.pipeline {
                if let Some(oldest) = in_flight.pop_front() {
                    settle(oldest, &shared).await?;
                }
            }
            if let Some(max_lead) = job.max_lead {
                wait_for_consumers(&shared, job.fanout, max_lead, end).await;
            }
            // The stamp is the batch's scheduled time when paced, else the moment it is built.
            let stamp_ns = match job.batch_interval {
                Some(interval) => {
                    let due = start + interval.mul_f64(batches as f64);
                    if !wait_until(due, end).await {
                        break;
                    }
                    due.saturating_duration_since(shared.clock).as_nanos() as u64
                }
                None => shared.now_ns(),
            };
            let topic = &job.topics[(job.first_topic + batches) % job.topics.len()];
            batches += 1;
            let mut encoder = if job.unconfirmed {
                client.unconfirmed_encoder(topic, None)?
            } else {
                client.publish_encoder(topic, None)?
            };
            body[..STAMP_BYTES].copy_from_slice(&stamp_ns.to_le_bytes());
            fill_batch(&mut encoder, &body, n, job.keys, &mut next_key);
            if job.unconfirmed {
                if let Err(error) = client.send_unconfirmed(encoder.finish()).await {
                    shared.publish_failed.fetch_add(n as u64, Ordering::Relaxed);
                    return Err(error).context("publishing");
                }
                shared.published.fetch_add(n as u64, Ordering::Relaxed);
                sent += n as u64;
                continue;
            }
            let pending = match client.send_encoded(encoder.finish()).await {
                Ok(pending) => pending,
                Err(error) => {
                    shared.publish_failed.fetch_add(n as u64, Ordering::Relaxed);
                    return Err(error).context("publishing");
                }
            };
            in_flight.push_back(pending);
            sent += n as u64;
        }
        while let Some(pending) = in_flight.pop_front() {
            settle(pending, &shared).await?;
        }
        Ok::<(), anyhow::Error>(())
    }
    .await;
    if sending.is_err() {
        // Sent but never confirmed: whether the broker stored them is unknown, so they count
        // as failed rather than vanish from the report.
        let unconfirmed: u64 = in_flight.drain(..).map(|p| p.count() as u64).sum();
        shared
            .publish_failed
            .fetch_add(unconfirmed, Ordering::Relaxed);
    }
    sending?;
    if job.unconfirmed {
        check_unconfirmed(&client, &shared).await?;
    }
    let _ = client.close().await;
    Ok(())
}

/// Holds the producer while it is `max_lead` messages ahead of the consumers.
async fn wait_for_consumers(shared: &Shared, fanout: u64, max_lead: u64, end: Option<Instant>) {
    // Bounded: consumers either catch up or the run is stopped (duration, Ctrl-C).
    while shared.published.load(Ordering::Relaxed)
        > shared.delivered.load(Ordering::Relaxed) / fanout + max_lead
        && !shared.stop_producers.load(Ordering::Relaxed)
        && end.is_none_or(|end| Instant::now() < end)
    {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Appends `n` copies of `body` to the batch, keyed k0 .. k{keys-1} in turn from `next_key`
/// when --keys is given.
fn fill_batch(
    encoder: &mut PublishEncoder,
    body: &[u8],
    n: u32,
    keys: Option<u64>,
    next_key: &mut u64,
) {
    match keys {
        None => {
            for _ in 0..n {
                encoder.push_body(None, 0, body);
            }
        }
        Some(keys) => {
            let mut key = KeyBuf::default();
            for _ in 0..n {
                encoder.push_body(Some(key.set(*next_key)), 0, body);
                *next_key += 1;
                if *next_key == keys {
                    *next_key = 0;
                }
            }
        }
    }
}

/// Unconfirmed publishes are refused asynchronously: one round trip makes sure the server has
/// read every one of them before the refusals are counted.
async fn check_unconfirmed(client: &Client, shared: &Shared) -> anyhow::Result<()> {
    client
        .ping()
        .await
        .context("confirming unconfirmed publishes")?;
    if let Some(error) = client.last_async_error() {
        shared.record_error(format!(
            "{} unconfirmed publish(es) refused, last: {error}",
            client.async_error_count()
        ));
    }
    Ok(())
}

/// Waits for one receipt; a refused batch is counted and the run goes on, a lost connection
/// ends this producer (its batch counted as failed too: its outcome is unknown).
async fn settle(pending: PendingPublish, shared: &Shared) -> anyhow::Result<()> {
    let count = pending.count() as u64;
    match pending.await {
        Ok(receipt) => {
            shared
                .published
                .fetch_add(receipt.len() as u64, Ordering::Relaxed);
            Ok(())
        }
        Err(error) if error.is_connection_error() => {
            shared.publish_failed.fetch_add(count, Ordering::Relaxed);
            Err(error).context("connection lost while publishing")
        }
        Err(error) => {
            shared.publish_failed.fetch_add(count, Ordering::Relaxed);
            shared.record_error(format!("publish refused: {error}"));
            Ok(())
        }
    }
}

/// Waits until `due` (or returns false at `end`). The wait first yields, so the client's writer
/// sends what was just queued; then sleeps on tokio's millisecond timer for the bulk and on the OS
/// thread for the rest: this runtime is the producer's own, and tokio's timer alone is too coarse
/// for one message every 100 µs.
async fn wait_until(due: Instant, end: Option<Instant>) -> bool {
    tokio::task::yield_now().await;
    if end.is_some_and(|end| due >= end) {
        return false;
    }
    let now = Instant::now();
    if due <= now {
        return true;
    }
    let wait = due - now;
    if wait > Duration::from_millis(2) {
        tokio::time::sleep(wait - Duration::from_millis(1)).await;
    }
    let now = Instant::now();
    if due > now {
        std::thread::sleep(due - now);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wait_until_keeps_a_schedule_and_stops_at_the_end() {
        let start = Instant::now();
        let interval = Duration::from_micros(500);
        for k in 0..200u32 {
            assert!(wait_until(start + interval * k, None).await);
        }
        let elapsed = start.elapsed();
        // 200 slots of 0.5 ms: at least 99.5 ms, and not far behind on a slow machine.
        assert!(
            elapsed >= interval * 199 && elapsed < Duration::from_millis(400),
            "{elapsed:?}"
        );
        let end = Instant::now() + Duration::from_millis(5);
        assert!(!wait_until(end + Duration::from_millis(1), Some(end)).await);
    }

    #[test]
    fn keys_are_k_and_the_index() {
        let mut key = KeyBuf::default();
        for index in [0, 7, 10, 9_999, 10_000, u64::MAX] {
            let expected = format!("k{index}");
            assert_eq!(key.set(index), expected.as_bytes());
            assert_eq!(key_len(index), expected.len(), "{index}");
        }
    }
}
