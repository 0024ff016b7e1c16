//! The consumers attached to a subscription.
//!
//! A consumer pulls: [`Consumer::poll`] hands it what is ready under the limits it passes, and
//! [`Consumer::recv_with`] waits until something is.
//!
//! Lock order: topic `subscriptions` → partition state → subscription `consumers` (a leaf).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferrymq_protocol::{Delivery, OffsetRange};
use tokio::time::Instant;

use crate::cursor::{DeliverClock, DeliverLimits, Delivered, Released};
use crate::error::BrokerError;
use crate::log::{Stored, TailAndFetched};
use crate::partition::Partition;
use crate::state_writer::StateWriter;
use crate::subscription::{ConsumerShared, Subscription};
use crate::topic::Topic;

/// One consumer attached to a subscription. Dropping it gives its in-flight messages back to the
/// subscription at once and, for an ephemeral subscription, removes the subscription.
pub struct Consumer {
    pub(crate) id: u64,
    pub(crate) topic: Arc<Topic>,
    pub(crate) subscription: Arc<Subscription>,
    pub(crate) shared: Arc<ConsumerShared>,
    pub(crate) in_flight_max: u32,
    next_partition: AtomicU32,
    /// For a named subscription of a disk topic: where its cursor changes are saved.
    state: Option<Arc<StateWriter>>,
    /// The generation of this consumer's last saved-state mark.
    last_mark: AtomicU64,
    /// Replicated partitions whose cursor this consumer changed since its acks were last
    /// confirmed, with the serving term they were changed in.
    marked_terms: parking_lot::Mutex<Vec<(u32, u64)>>,
    /// The partitions this consumer takes messages from, ascending; `None`: all.
    partitions: Option<Vec<u32>>,
}

/// Most delivery passes one poll of a partition makes while they move past settled runs
/// without delivering anything.
const PASSES_PER_POLL_MAX: u32 = 16;

impl Consumer {
    pub(crate) fn new(
        id: u64,
        topic: Arc<Topic>,
        subscription: Arc<Subscription>,
        in_flight_max: u32,
        state: Option<Arc<StateWriter>>,
    ) -> Consumer {
        let shared = Arc::new(ConsumerShared {
            in_flight: AtomicU32::new(0),
        });
        subscription.consumers.lock().insert(id, shared.clone());
        topic.counters.subscribers.fetch_add(1, Relaxed);
        Consumer {
            id,
            topic,
            subscription,
            shared,
            in_flight_max,
            next_partition: AtomicU32::new(0),
            state,
            last_mark: AtomicU64::new(0),
            marked_terms: parking_lot::Mutex::new(Vec::new()),
            partitions: None,
        }
    }

    /// Restricts the consumer to `partitions` (ascending, each below the partition count).
    pub(crate) fn with_partitions(mut self, partitions: Option<Vec<u32>>) -> Self {
        self.partitions = partitions;
        self
    }

    /// The partitions this consumer takes messages from.
    pub fn partitions(&self) -> Vec<u32> {
        match &self.partitions {
            Some(list) => list.clone(),
            None => (0..self.topic.partition_count()).collect(),
        }
    }

    /// Records that this subscription's cursor on `partition` changed, for the state writer.
    fn mark(&self, partition: u32) {
        if let Some(state) = &self.state {
            let generation = state.mark(&self.topic, &self.subscription, partition);
            self.last_mark.fetch_max(generation, Relaxed);
            let p = &self.topic.partitions[partition as usize];
            if p.serving_replicated() {
                let term = p.serving.load(Relaxed);
                let mut marked = self.marked_terms.lock();
                if !marked.contains(&(partition, term)) {
                    marked.push((partition, term));
                }
            }
        }
    }

    /// Waits until every ack (and nack that gave a message up) this consumer made so far is
    /// saved: after a restart they are not delivered again. At once for memory topics.
    pub async fn acks_saved(&self) -> Result<(), BrokerError> {
        match &self.state {
            Some(state) => state.wait(self.last_mark.load(Relaxed)).await?,
            None => return Ok(()),
        }
        // A replicated partition that this node stopped serving after the acks were made may
        // have left before they were replicated: their fate is unknown here.
        let marked = std::mem::take(&mut *self.marked_terms.lock());
        for (partition, term) in marked {
            let now = self.topic.partitions[partition as usize]
                .serving
                .load(Relaxed);
            if now != term {
                return Err(BrokerError::NotLeader(format!(
                    "this node stopped serving partition {partition} of '{}' before the acks \
                     were confirmed: their outcome is unknown, and the leader may deliver those \
                     messages again",
                    self.topic.name
                )));
            }
        }
        Ok(())
    }

    /// True when acks are saved in the background and [`Consumer::acks_saved`] may wait.
    pub fn acks_are_durable(&self) -> bool {
        self.state.is_some()
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn topic(&self) -> &Topic {
        &self.topic
    }

    pub fn subscription(&self) -> &Subscription {
        &self.subscription
    }

    pub fn partition_count(&self) -> u32 {
        self.topic.partition_count()
    }

    /// Messages delivered to this consumer and not yet acked.
    pub fn in_flight(&self) -> u32 {
        self.shared.in_flight.load(Relaxed)
    }

    fn check_topic(&self) -> Result<(), BrokerError> {
        if self.topic.deleted.load(Relaxed) {
            return Err(BrokerError::UnknownTopic(self.topic.name.clone()));
        }
        Ok(())
    }

    /// Refuses to settle messages of a replicated partition that another replica serves now:
    /// their delivery from here is void, and the serving replica delivers them again.
    fn check_serving(&self, ranges: &[OffsetRange]) -> Result<(), BrokerError> {
        for range in ranges {
            let Some(partition) = self.topic.partitions.get(range.partition as usize) else {
                continue;
            };
            if !partition.is_serving() {
                return Err(BrokerError::NotLeader(format!(
                    "partition {} of '{}' is served by its leader now, not by this node: \
                     messages delivered from here before are delivered again by the leader",
                    range.partition, self.topic.name
                )));
            }
        }
        Ok(())
    }

    /// Hands over up to `count_max` ready messages (and roughly `bytes_max` bytes; one message
    /// always goes), visiting partitions round-robin. `emit(partition, offset, timestamp_ms,
    /// attempt, record)` is called for each, under the partition's lock: it must only copy.
    pub fn poll(
        &self,
        count_max: u32,
        bytes_max: usize,
        mut emit: impl FnMut(u32, u64, u64, u16, &Bytes),
    ) -> Result<u32, BrokerError> {
        self.check_topic()?;
        let sub = &*self.subscription;
        if sub.is_paused() {
            return Ok(0);
        }
        let room = self
            .in_flight_max
            .saturating_sub(self.shared.in_flight.load(Relaxed));
        if count_max == 0 || (room == 0 && !sub.auto_ack) {
            return Ok(0);
        }
        let partitions = &self.topic.partitions;
        let n = self.partitions.as_ref().map_or(partitions.len(), Vec::len);
        let first = self.next_partition.fetch_add(1, Relaxed) as usize % n;
        let now = Instant::now();
        let clock = DeliverClock {
            now,
            unix_us: crate::clock::unix_us(),
            deadline: now + sub.ack_timeout,
        };
        let mut total = Delivered::default();
        let mut failure = None;
        for i in 0..n {
            let remaining = count_max - total.count;
            if remaining == 0 || (!sub.auto_ack && total.count >= room) {
                break;
            }
            let index = match &self.partitions {
                Some(list) => list[(first + i) % n] as usize,
                None => (first + i) % n,
            };
            let partition = &partitions[index];
            let limits = DeliverLimits {
                count_max: remaining,
                bytes_max: bytes_max.saturating_sub(total.bytes as usize),
                in_flight_room: room - total.count.min(room),
            };
            let d = match self.poll_partition(partition, &limits, &clock, &mut emit) {
                Polled::Delivered(d) => d,
                Polled::Nothing => continue,
                Polled::Failed(error) => {
                    failure.get_or_insert(error);
                    continue;
                }
            };
            total.count += d.count;
            total.bytes += d.bytes;
            total.redelivered += d.redelivered;
        }
        if total.count > 0 {
            self.count_delivered(&total);
        }
        match failure {
            Some(error) if total.count == 0 => Err(error),
            _ => Ok(total.count),
        }
    }

    /// One partition's part of a poll, under its lock: what its cursor has ready, read from the
    /// in-memory tail or below it from the files.
    // Over 70 lines on purpose: the passes, their disk reads and the accounting after them share
    // one lock guard and the borrows of one cursor beside the partition's log; split, each part
    // would look the cursor up again under the lock.
    fn poll_partition(
        &self,
        partition: &Partition,
        limits: &DeliverLimits,
        clock: &DeliverClock,
        emit: &mut impl FnMut(u32, u64, u64, u16, &Bytes),
    ) -> Polled {
        let sub = &*self.subscription;
        if !partition.is_serving() {
            // Another replica delivers it.
            return Polled::Nothing;
        }
        let mut guard = partition.state.lock();
        let state = &mut *guard;
        let Some(cursor) = state.cursors.iter_mut().find(|c| c.sub_id == sub.id) else {
            return Polled::Nothing;
        };
        if !cursor.has_ready(state.log.next_offset()) {
            return Polled::Nothing;
        }
        let index = partition.index;
        let mut emit_one =
            |offset, ts, attempt, record: &Bytes| emit(index, offset, ts, attempt, record);
        // A disk pass reads no record of a settled run (one may be unreadable), so it stops at
        // the first such run it meets: a pass that moved past settled messages without
        // delivering any runs again, reading on from there, rather than leaving the messages
        // behind the run until something else wakes the subscription (after a restart,
        // perhaps a nack's delay of hours). Bounded: each pass moves past at least one run.
        let mut passes = 0;
        let d = loop {
            let next_before = cursor.next_offset();
            // What this pass would read below the in-memory tail (disk partitions only).
            let wanted = state.disk.as_ref().map(|_| {
                cursor.wanted(
                    limits.count_max,
                    state.log.head(),
                    state.log.next_offset(),
                    crate::log::RecordSource::priority_end(&state.log),
                )
            });
            let d = match (&state.disk, wanted) {
                (Some(disk), Some((ready, new))) if !ready.is_empty() || !new.is_empty() => {
                    // A log closed for a reopen has nothing to give until it is back (the
                    // reopen wakes the subscriptions); damage is an error for the caller, but
                    // only once nothing else was delivered in this pass, so that what was
                    // delivered is accounted for below.
                    let fetched = match disk.open_log() {
                        None if !disk.is_damaged() => return Polled::Nothing,
                        None => Err(FetchError::Broker(
                            disk.log().err().expect("a closed log's error"),
                        )),
                        Some(log) => fetch(log, ready, new, limits),
                    };
                    let fetched = match fetched {
                        Ok(fetched) => fetched,
                        Err(FetchError::Broker(error)) => return Polled::Failed(error),
                        Err(FetchError::Log(error, offset)) => {
                            let disk = state.disk.as_mut().expect("a disk partition");
                            let error = disk.note_damage(&self.topic.name, index, offset, error);
                            return Polled::Failed(error);
                        }
                    };
                    let source = TailAndFetched {
                        tail: &state.log,
                        fetched: &fetched,
                    };
                    cursor.deliver(&source, self.id, limits, clock, &mut emit_one)
                }
                _ => cursor.deliver(&state.log, self.id, limits, clock, &mut emit_one),
            };
            passes += 1;
            let stuck = cursor.next_offset() == next_before;
            if d.count > 0
                || stuck
                || passes == PASSES_PER_POLL_MAX
                || !cursor.has_ready(state.log.next_offset())
            {
                break d;
            }
        };
        if cursor.has_timers() {
            partition.timers_pending.store(true, Relaxed);
        }
        if sub.auto_ack {
            state.trim_settled();
            if d.count > 0 {
                drop(guard);
                self.mark(index);
            }
        }
        Polled::Delivered(d)
    }

    /// Counts what a poll delivered, in the consumer's, the subscription's and the topic's
    /// counters.
    fn count_delivered(&self, total: &Delivered) {
        let sub = &*self.subscription;
        if !sub.auto_ack {
            self.shared.in_flight.fetch_add(total.count, Relaxed);
        }
        sub.counters
            .messages_out
            .fetch_add(total.count as u64, Relaxed);
        sub.counters.bytes_out.fetch_add(total.bytes, Relaxed);
        sub.counters
            .redelivered
            .fetch_add(total.redelivered as u64, Relaxed);
        self.topic
            .counters
            .messages_out
            .fetch_add(total.count as u64, Relaxed);
        self.topic
            .counters
            .bytes_out
            .fetch_add(total.bytes, Relaxed);
    }

    /// A notification that fires when messages may have become ready. Create it and `enable` it
    /// before polling, then await it if the poll found nothing: no wake-up is lost in between.
    pub fn ready_notification(&self) -> tokio::sync::futures::Notified<'_> {
        self.subscription.notify.notified()
    }

    /// After the ready notification fired: counts the time since new messages woke the
    /// subscription in the wake-up stage's histogram (nothing when the wake had another cause).
    pub fn note_woken(&self) {
        let at = self.subscription.woken_at_us.swap(0, Relaxed);
        if at != 0 {
            let stage = crate::stages::Stage::Wake;
            crate::stages::record_us(stage, crate::stages::now_us().saturating_sub(at));
        }
    }

    /// After a delivery: a wake-up for messages already delivered is not counted later.
    pub fn clear_woken(&self) {
        if self.subscription.woken_at_us.load(Relaxed) != 0 {
            self.subscription.woken_at_us.store(0, Relaxed);
        }
    }

    /// True once the topic was deleted: the consumer will get nothing more.
    pub fn is_closed(&self) -> bool {
        self.topic.deleted.load(Relaxed)
    }

    /// Waits until at least one message is delivered through `emit`, then returns how many.
    ///
    /// Cancel-safe: the only await point is the wait for a notification, before any delivery of
    /// that round, so dropping the future never loses a message.
    pub async fn recv_with(
        &self,
        count_max: u32,
        bytes_max: usize,
        mut emit: impl FnMut(u32, u64, u64, u16, &Bytes),
    ) -> Result<u32, BrokerError> {
        loop {
            let notified = self.subscription.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let n = self.poll(count_max, bytes_max, &mut emit)?;
            if n > 0 {
                return Ok(n);
            }
            notified.await;
        }
    }

    /// In-process convenience: waits for up to `count_max` messages and returns them decoded.
    pub async fn recv(&self, count_max: u32) -> Result<Vec<Delivery>, BrokerError> {
        let mut out = Vec::new();
        self.recv_with(
            count_max,
            usize::MAX,
            |partition, offset, timestamp_ms, attempt, record| {
                out.push((partition, offset, timestamp_ms, attempt, record.clone()));
            },
        )
        .await?;
        Ok(out
            .into_iter()
            .map(
                |(partition, offset, timestamp_ms, attempt, record)| Delivery {
                    partition,
                    offset,
                    timestamp_ms,
                    attempt,
                    message: crate::log::decode_stored(record),
                },
            )
            .collect())
    }

    /// Acks the given ranges; anything not in flight to this consumer is ignored. Returns how many
    /// messages were settled.
    pub fn ack(&self, ranges: &[OffsetRange]) -> Result<u64, BrokerError> {
        self.ack_with_result(ranges, None)
    }

    /// Acks the given ranges, keeping `result` with each acked message for status queries (at
    /// most [`ferrymq_protocol::limits::ACK_RESULT_BYTES_MAX`] bytes).
    pub fn ack_with_result(
        &self,
        ranges: &[OffsetRange],
        result: Option<&[u8]>,
    ) -> Result<u64, BrokerError> {
        self.check_topic()?;
        self.check_serving(ranges)?;
        if let Some(result) = result {
            let max = ferrymq_protocol::limits::ACK_RESULT_BYTES_MAX;
            if result.len() > max {
                return Err(BrokerError::invalid(
                    "result",
                    format!("{} bytes is above the limit of {max}", result.len()),
                ));
            }
        }
        let now_us = crate::clock::unix_us();
        let mut promoted = 0;
        let mut acked = 0;
        for range in ranges {
            let Some(partition) = self.topic.partitions.get(range.partition as usize) else {
                continue;
            };
            let mut state = partition.state.lock();
            let Some(cursor) = state.cursor_mut(self.subscription.id) else {
                continue;
            };
            let n = cursor.ack(self.id, range.offset, range.end(), now_us, result);
            promoted += cursor.take_promoted();
            state.trim_settled();
            drop(state);
            if n > 0 {
                self.mark(range.partition);
            }
            acked += n;
        }
        if acked > 0 {
            self.shared.in_flight.fetch_sub(acked as u32, Relaxed);
            self.subscription.counters.acked.fetch_add(acked, Relaxed);
        }
        if promoted > 0 {
            // Messages of an ordered subscription whose key's turn came.
            self.subscription.notify.notify_waiters();
        }
        Ok(acked)
    }

    /// Moves messages in flight to this consumer to the dead-letter topic now, with `reason`,
    /// instead of delivering them again. Returns how many.
    pub fn dead_letter(&self, ranges: &[OffsetRange], reason: &str) -> Result<u64, BrokerError> {
        self.check_topic()?;
        self.check_serving(ranges)?;
        let mut dead = Vec::new();
        let mut n = 0;
        for range in ranges {
            let Some(partition) = self.topic.partitions.get(range.partition as usize) else {
                continue;
            };
            let mut state = partition.state.lock();
            let Some(cursor) = state.cursor_mut(self.subscription.id) else {
                continue;
            };
            n += cursor.give_up(self.id, range.offset, range.end());
            if cursor.take_promoted() > 0 {
                self.subscription.notify.notify_waiters();
            }
            self.topic
                .take_dead_letters(&mut state, range.partition, Some(reason), &mut dead);
        }
        self.topic.send_dead_letters(dead);
        if n > 0 {
            self.shared.in_flight.fetch_sub(n as u32, Relaxed);
            self.subscription.count_released(Released {
                requeued: 0,
                gave_up: n,
            });
        }
        Ok(n)
    }

    /// Gives messages back: ready again at once, or after `delay`. Returns how many.
    pub fn nack(&self, ranges: &[OffsetRange], delay: Duration) -> Result<u64, BrokerError> {
        self.give_back(ranges, delay, true, "")
    }

    /// [`Consumer::nack`] saying why the messages failed: a message this nack gives up (its
    /// last attempt failed) carries `reason` in its dead letter after `max_attempts (N)
    /// reached: `.
    pub fn nack_with_reason(
        &self,
        ranges: &[OffsetRange],
        delay: Duration,
        reason: &str,
    ) -> Result<u64, BrokerError> {
        self.give_back(ranges, delay, true, reason)
    }

    /// Gives messages back unprocessed (this consumer stopped before it got to them): ready
    /// again at once, or after `delay`, with their delivery not counted as an attempt, so a
    /// consumer that stops early never brings them closer to the dead-letter topic. Returns
    /// how many.
    pub fn release(&self, ranges: &[OffsetRange], delay: Duration) -> Result<u64, BrokerError> {
        self.give_back(ranges, delay, false, "")
    }

    fn give_back(
        &self,
        ranges: &[OffsetRange],
        delay: Duration,
        count_attempt: bool,
        reason: &str,
    ) -> Result<u64, BrokerError> {
        self.check_topic()?;
        self.check_serving(ranges)?;
        let due = (!delay.is_zero()).then(|| {
            (
                Instant::now() + delay,
                crate::clock::unix_ms() + delay.as_millis() as u64,
            )
        });
        let mut total = Released::default();
        let mut dead = Vec::new();
        for range in ranges {
            let Some(partition) = self.topic.partitions.get(range.partition as usize) else {
                continue;
            };
            let mut state = partition.state.lock();
            let Some(cursor) = state.cursor_mut(self.subscription.id) else {
                continue;
            };
            let r = cursor.nack(self.id, range.offset, range.end(), due, count_attempt);
            if cursor.has_timers() {
                partition.timers_pending.store(true, Relaxed);
            }
            let taken = dead.len();
            self.topic
                .take_dead_letters(&mut state, range.partition, None, &mut dead);
            if !reason.is_empty() {
                // Only this subscription's messages were given up by this nack.
                for letter in &mut dead[taken..] {
                    if letter.sub_id == self.subscription.id {
                        letter.nack_reason = Some(reason.to_string());
                    }
                }
            }
            state.trim_settled();
            drop(state);
            // Attempts and delays are saved too, so that a restart keeps counting.
            if r.gave_up > 0 || r.requeued > 0 {
                self.mark(range.partition);
            }
            total.requeued += r.requeued;
            total.gave_up += r.gave_up;
        }
        self.topic.send_dead_letters(dead);
        let n = total.requeued + total.gave_up;
        if n > 0 {
            self.shared.in_flight.fetch_sub(n as u32, Relaxed);
            self.subscription.count_released(total);
        }
        Ok(n)
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let sub = &self.subscription;
        sub.consumers.lock().remove(&self.id);
        self.topic.counters.subscribers.fetch_sub(1, Relaxed);
        let mut total = Released::default();
        let mut dead = Vec::new();
        for partition in self.topic.partitions.iter() {
            let mut state = partition.state.lock();
            let mut changed = false;
            if let Some(cursor) = state.cursor_mut(sub.id) {
                let r = cursor.release_consumer(self.id);
                total.requeued += r.requeued;
                total.gave_up += r.gave_up;
                changed = r.requeued > 0 || r.gave_up > 0;
            }
            self.topic
                .take_dead_letters(&mut state, partition.index, None, &mut dead);
            state.trim_settled();
            drop(state);
            if changed {
                self.mark(partition.index);
            }
        }
        self.topic.send_dead_letters(dead);
        sub.count_released(total);
        if sub.ephemeral {
            self.topic.remove_subscription(sub.id, &sub.name);
        }
    }
}

/// What one partition gave a poll.
enum Polled {
    Delivered(Delivered),
    /// Nothing ready, or nothing to give until a closed log is back.
    Nothing,
    /// Reading the files failed: the caller's error if nothing else is delivered.
    Failed(BrokerError),
}

/// Why a fetch from the files failed: a closed log, or a read (from the offset given) that
/// failed, which may be damage to locate and report.
enum FetchError {
    Broker(BrokerError),
    Log(ferrymq_storage::LogError, u64),
}

/// Ready offsets at most this far apart are read together.
const READ_SPAN_MAX: u64 = 256;

/// Reads from the partition's files what the next delivery pass wants below the tail: the new
/// messages in one sequential read, ready ones in runs of nearby offsets. A damaged entry is an
/// error, never data.
fn fetch(
    log: &crate::disk::FileLog,
    ready: Vec<u64>,
    new: std::ops::Range<u64>,
    limits: &DeliverLimits,
) -> Result<Vec<(u64, Stored)>, FetchError> {
    let mut out: Vec<(u64, Stored)> =
        Vec::with_capacity(ready.len() + (new.end - new.start) as usize);
    let mut bytes = 0usize;
    let ready: Vec<u64> = ready
        .into_iter()
        .filter(|&o| o >= log.start_offset())
        .collect();
    // Offsets close together (an ordered or prioritised subscription's scattered ready ones) are
    // read in one go and the ones not wanted dropped: one read instead of one per message.
    let mut i = 0;
    while i < ready.len() && bytes < limits.bytes_max {
        let first = ready[i];
        let mut j = i;
        while j + 1 < ready.len() && ready[j + 1] - first < READ_SPAN_MAX {
            j += 1;
        }
        let wanted = &ready[i..=j];
        let span = (ready[j] - first + 1) as usize;
        let read = log.read(first, 1 << 20, span);
        for e in read.map_err(|e| FetchError::Log(e, first))? {
            if wanted.binary_search(&e.offset).is_err() {
                continue;
            }
            bytes += e.record.len();
            out.push((
                e.offset,
                Stored {
                    timestamp_us: e.timestamp_ms.saturating_mul(1000),
                    record: e.record,
                },
            ));
        }
        i = j + 1;
    }
    if !new.is_empty() && bytes < limits.bytes_max {
        let count = (new.end - new.start) as usize;
        let budget = limits.bytes_max.saturating_sub(bytes).min(1 << 20);
        let from = new.start.max(log.start_offset());
        for e in log
            .read(from, budget, count)
            .map_err(|e| FetchError::Log(e, from))?
        {
            if e.offset >= new.end {
                break;
            }
            out.push((
                e.offset,
                Stored {
                    timestamp_us: e.timestamp_ms.saturating_mul(1000),
                    record: e.record,
                },
            ));
        }
    }
    // Ready offsets lie below the cursor's next and ascend, the new ones follow from it.
    debug_assert!(out.windows(2).all(|w| w[0].0 < w[1].0));
    Ok(out)
}
