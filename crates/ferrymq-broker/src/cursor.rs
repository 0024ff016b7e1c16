//! The delivery scheduler of one subscription on one partition.
//!
//! A cursor is plain state, driven under its partition's lock and free of I/O and clocks (callers
//! pass `now`), so every rule can be tested directly.
//!
//! Invariants:
//! - Every offset below `floor` is settled for this subscription (acked, given up, or dropped by
//!   the topic's overflow policy). `next` is the first offset that never entered the window.
//! - `slots[i]` holds the state of offset `floor + i` for every offset in `floor .. next`; the
//!   front slot is never `Settled` after [`Cursor::advance_floor`].
//! - `ready` holds exactly the offsets whose slot is `Ready`, keyed by priority (highest first)
//!   then offset; `in_flight` counts the `InFlight` slots; a `Delayed` slot has one entry in
//!   `delayed`.
//! - `deadlines` holds one entry per delivery, in delivery order, so deadlines never decrease; an
//!   entry whose slot is no longer in flight under the same attempt and ack deadline is stale and
//!   skipped (a release takes its attempt back, so the next delivery can carry the same attempt).
//! - Auto-ack cursors keep slots only while a delayed message is pending (then every later
//!   delivered message is a settled slot); without one, `floor == next`.
//! - A message whose `deliver_after_ms` has not passed is never delivered: when the cursor
//!   reaches it (or finds it ready before its first delivery) it becomes a delayed slot due at
//!   its publish time plus its delay.
//! - Priorities: while the log may hold a message of priority above 0 at or after `next`
//!   ([`RecordSource::priority_end`]), the messages ahead are taken into the window (up to
//!   [`LOOKAHEAD`] slots) before anything is delivered, so `ready` sorts them by priority. Without
//!   priorities nothing is taken early and delivery is in log order.
//! - Ordered cursors: every key (and "no key") with an unsettled message in the window has one
//!   owner, its lowest unsettled offset; only owners are ever `Ready`, `InFlight` or `Delayed`.
//!   The key's later messages are `Blocked` in its queue, in offset order, and the first of them
//!   becomes the owner when the owner is settled or given up. Other keys flow meanwhile.
//! - After a restart (`restore`), `next` starts again at the floor and the saved settled runs
//!   above it (`restored`) are skipped as the cursor passes them, so priorities and keys are
//!   known again for everything it delivers. Saved delivery states (`restore_delivery`: attempts
//!   made, a nack's delay) wait in `restored_delivery` and apply when their offset enters the
//!   window again; only offsets at or above `next` are kept there.
//!
//! The window `floor .. next` is bounded by the partition's retained log, which is bounded by the
//! topic's limits; in-flight slots are further bounded per consumer by the broker, and the slots
//! an ordered cursor blocks by [`ORDERED_WINDOW_MAX`].

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use ferrymq_protocol::limits::PRIORITY_MAX;
use ferrymq_protocol::{MessageEntry, MessageState};
use tokio::time::Instant;

use crate::latency::{decode_lag, encode_lag, Latencies};
use crate::log::RecordSource;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Ready,
    /// An ordered cursor's message waiting for the one before it with the same key.
    Blocked,
    InFlight,
    Delayed,
    /// Given up: on its way to the dead-letter topic, settled once it is stored there (so a
    /// crash in between delivers it again rather than losing it).
    Dead,
    Settled,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    state: SlotState,
    priority: u8,
    /// Deliveries so far.
    attempt: u16,
    /// How long it waited for its first delivery (see [`encode_lag`]), for its ack's latency.
    lag: u32,
    consumer: u64,
    /// First delivery, Unix µs (0: never).
    first_us: u64,
    /// In flight: the ack deadline; delayed: when it is due (Unix ms).
    until_ms: u64,
}

// One per message in a cursor's window: the lag sits in what would be padding.
const _: () = assert!(std::mem::size_of::<Slot>() == 32);

impl Slot {
    fn new(state: SlotState, priority: u8) -> Slot {
        Slot {
            state,
            priority,
            attempt: 0,
            lag: 0,
            consumer: 0,
            first_us: 0,
            until_ms: 0,
        }
    }
}

/// The priority of a (validated) record.
fn record_priority(record: &[u8]) -> u8 {
    record.first().map_or(0, |&p| p.min(PRIORITY_MAX))
}

/// Most delayed or blocked messages one delivery pass sets aside before it returns.
const HOLD_PER_PASS_MAX: u32 = 4096;
/// Most messages one delivery pass takes into the window ahead of delivery, for priorities.
const ADMIT_PER_PASS_MAX: u64 = 4096;
/// How far ahead of the floor a cursor looks for messages of higher priority.
pub(crate) const LOOKAHEAD: u64 = 100_000;
/// How many slots an ordered cursor's window may span before it stops reading ahead of a key
/// that waits (beyond that, a slow key holds the others back).
pub(crate) const ORDERED_WINDOW_MAX: u64 = 1 << 20;

/// The time of a delivery pass.
pub(crate) struct DeliverClock {
    pub now: Instant,
    /// The same moment as Unix microseconds, to compare with publish times.
    pub unix_us: u64,
    /// When what is delivered now must be acked.
    pub deadline: Instant,
}

impl DeliverClock {
    fn unix_ms(&self) -> u64 {
        self.unix_us / 1000
    }

    /// Whether `stored` can go now, reading its delay once: `Ok` with how long it has been
    /// deliverable (since its publish, or the end of its delay), µs; `Err` with when it is due, as
    /// an instant and in Unix ms, while its `deliver_after_ms` has not passed.
    fn check(&self, stored: &crate::log::Stored) -> Result<u64, (Instant, u64)> {
        let Some(delay) = ferrymq_protocol::record_deliver_after_ms(&stored.record) else {
            return Ok(self.unix_us.saturating_sub(stored.timestamp_us));
        };
        let due_ms = stored.timestamp_ms().saturating_add(delay);
        let unix_ms = self.unix_ms();
        if due_ms > unix_ms {
            return Err((
                self.now + std::time::Duration::from_millis(due_ms - unix_ms),
                due_ms,
            ));
        }
        let since = stored
            .timestamp_us
            .saturating_add(delay.saturating_mul(1000));
        Ok(self.unix_us.saturating_sub(since))
    }

    /// A saved due time (Unix ms, 0 for none) as an instant and Unix ms, while it lies ahead.
    fn due(&self, due_ms: u64) -> Option<(Instant, u64)> {
        let unix_ms = self.unix_ms();
        (due_ms > unix_ms).then(|| {
            (
                self.now + std::time::Duration::from_millis(due_ms - unix_ms),
                due_ms,
            )
        })
    }

    fn deadline_ms(&self) -> u64 {
        self.unix_ms()
            + self
                .deadline
                .saturating_duration_since(self.now)
                .as_millis() as u64
    }
}

/// Limits of one delivery pass.
pub(crate) struct DeliverLimits {
    pub count_max: u32,
    pub bytes_max: usize,
    /// How many more messages the consumer may hold unacked.
    pub in_flight_room: u32,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delivered {
    pub count: u32,
    pub bytes: u64,
    pub redelivered: u32,
}

/// What releasing messages (timeout, nack, disconnect) did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Released {
    /// Made ready (or delayed) for another delivery; for timers, also delayed messages that
    /// became due, and messages of an ordered cursor whose turn came.
    pub requeued: u64,
    /// Given up after `max_attempts`.
    pub gave_up: u64,
}

/// How a subscription's cursors deliver.
#[derive(Debug, Clone)]
pub(crate) struct CursorOptions {
    /// The subscription's name: a requeued dead letter is delivered to it alone.
    pub name: Arc<str>,
    pub auto_ack: bool,
    /// Deliveries after which a message is given up instead of made ready again.
    pub max_attempts: u32,
    /// At most one message per key in flight.
    pub ordered: bool,
    /// How many acked and how many dead-lettered messages each cursor remembers for status.
    pub history: usize,
}

/// Which key a message of an ordered cursor belongs to. Keys are told apart by a 64-bit hash: two
/// keys that collide only share their turn, which never breaks either one's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum KeyId {
    None,
    Hash(u64),
}

impl KeyId {
    fn of(record: &[u8]) -> KeyId {
        match ferrymq_protocol::record_key(record) {
            Some(key) => KeyId::Hash(crate::topic::key_hash(key)),
            None => KeyId::None,
        }
    }
}

#[derive(Default)]
struct Ordered {
    /// Per key with an unsettled message: its owner and the blocked offsets behind it.
    keys: HashMap<KeyId, (u64, VecDeque<u64>)>,
    /// The key of every owner.
    owner_of: HashMap<u64, KeyId>,
}

/// An acked message, remembered for status queries.
struct AckedEntry {
    offset: u64,
    attempts: u16,
    first_ms: u64,
    settled_ms: u64,
    result: Option<Box<[u8]>>,
}

/// A dead-lettered message, remembered for status queries.
struct DeadEntry {
    offset: u64,
    attempts: u16,
    first_ms: u64,
    settled_ms: u64,
    reason: Box<str>,
    dead_letter: Option<(u32, u64)>,
}

/// Reads [`Cursor::encode_history`]'s format; `None` if it is not that.
fn decode_history(bytes: &[u8]) -> Option<(Vec<AckedEntry>, Vec<DeadEntry>)> {
    struct Reader<'a>(&'a [u8]);
    impl<'a> Reader<'a> {
        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            if self.0.len() < n {
                return None;
            }
            let (head, rest) = self.0.split_at(n);
            self.0 = rest;
            Some(head)
        }
        fn u8(&mut self) -> Option<u8> {
            Some(self.take(1)?[0])
        }
        fn u16(&mut self) -> Option<u16> {
            Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
        }
        fn u32(&mut self) -> Option<u32> {
            Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
        }
        fn u64(&mut self) -> Option<u64> {
            Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
        }
    }
    let mut r = Reader(bytes);
    let mut acked = Vec::new();
    for _ in 0..r.u32()? {
        let (offset, attempts, first_ms, settled_ms) = (r.u64()?, r.u16()?, r.u64()?, r.u64()?);
        let has_result = r.u8()? == 1;
        let len = r.u32()? as usize;
        let result = r.take(len)?;
        acked.push(AckedEntry {
            offset,
            attempts,
            first_ms,
            settled_ms,
            result: has_result.then(|| Box::from(result)),
        });
    }
    let mut dead = Vec::new();
    for _ in 0..r.u32()? {
        let (offset, attempts, first_ms, settled_ms) = (r.u64()?, r.u16()?, r.u64()?, r.u64()?);
        let len = r.u32()? as usize;
        let reason = std::str::from_utf8(r.take(len)?).ok()?;
        let has_dead_letter = r.u8()? == 1;
        let position = (r.u32()?, r.u64()?);
        dead.push(DeadEntry {
            offset,
            attempts,
            first_ms,
            settled_ms,
            reason: reason.into(),
            dead_letter: has_dead_letter.then_some(position),
        });
    }
    r.0.is_empty().then_some((acked, dead))
}

/// The delivery state of one message that a restart must not forget: `(offset, attempts made,
/// due in Unix ms or 0)`. See [`Cursor::delivery_state`].
pub(crate) type DeliveryState = (u64, u16, u64);

/// A message given up, for the owner to move to the dead-letter topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GivenUp {
    pub offset: u64,
    pub attempts: u16,
}

pub(crate) struct Cursor {
    pub sub_id: u64,
    options: CursorOptions,
    /// Where the subscription started in this partition: offsets below were never its own
    /// (0 when not known, after a restart of a subscription saved before starts were kept).
    start: u64,
    floor: u64,
    next: u64,
    slots: VecDeque<Slot>,
    /// (PRIORITY_MAX - priority, offset).
    ready: BTreeSet<(u8, u64)>,
    /// (deadline, offset, attempt, the slot's `until_ms` for that delivery).
    deadlines: VecDeque<(Instant, u64, u16, u64)>,
    delayed: BinaryHeap<Reverse<(Instant, u64)>>,
    in_flight: u64,
    /// Offsets given up since the owner last took them.
    dead_new: Vec<GivenUp>,
    ordered: Option<Box<Ordered>>,
    /// Settled runs at or above `next` saved before a restart, ascending, and their total size.
    restored: VecDeque<(u64, u64)>,
    restored_left: u64,
    /// Saved delivery states of offsets at or above `next`: attempts, and due Unix ms (0: none).
    restored_delivery: BTreeMap<u64, (u16, u64)>,
    /// Messages of an ordered cursor made ready since last asked (their key's turn came).
    promoted: u64,
    acked: VecDeque<AckedEntry>,
    dead: VecDeque<DeadEntry>,
    latency: Latencies,
}

impl Cursor {
    pub fn new(sub_id: u64, options: CursorOptions, start: u64) -> Self {
        assert!(options.max_attempts >= 1);
        assert!(!(options.ordered && options.auto_ack));
        let ordered = options.ordered.then(Box::default);
        Cursor {
            sub_id,
            start,
            options,
            floor: start,
            next: start,
            slots: VecDeque::new(),
            ready: BTreeSet::new(),
            deadlines: VecDeque::new(),
            delayed: BinaryHeap::new(),
            in_flight: 0,
            dead_new: Vec::new(),
            ordered,
            restored: VecDeque::new(),
            restored_left: 0,
            restored_delivery: BTreeMap::new(),
            promoted: 0,
            acked: VecDeque::new(),
            dead: VecDeque::new(),
            latency: Latencies::default(),
        }
    }

    /// Publish-to-deliver and publish-to-ack latencies of what this cursor delivered.
    pub fn latencies(&self) -> &Latencies {
        &self.latency
    }

    pub fn floor(&self) -> u64 {
        self.floor
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Messages waiting for a consumer: never delivered, ready again, delayed, or blocked
    /// behind their key.
    pub fn backlog(&self, log_next: u64) -> u64 {
        let blocked = self.ordered.as_ref().map_or(0, |o| {
            o.keys.values().map(|(_, q)| q.len() as u64).sum::<u64>()
        });
        log_next
            .saturating_sub(self.next)
            .saturating_sub(self.restored_left)
            + self.ready.len() as u64
            + self.delayed.len() as u64
            + blocked
    }

    /// True when a consumer polling now could get something.
    pub fn has_ready(&self, log_next: u64) -> bool {
        !self.ready.is_empty() || self.next < log_next
    }

    pub fn has_timers(&self) -> bool {
        !self.deadlines.is_empty() || !self.delayed.is_empty()
    }

    /// Messages of an ordered cursor whose turn came since the last call: consumers waiting for
    /// something to poll should be woken.
    pub fn take_promoted(&mut self) -> u64 {
        std::mem::take(&mut self.promoted)
    }

    fn slot_mut(&mut self, offset: u64) -> Option<&mut Slot> {
        offset
            .checked_sub(self.floor)
            .and_then(|i| self.slots.get_mut(i as usize))
    }

    fn slot(&self, offset: u64) -> Option<&Slot> {
        offset
            .checked_sub(self.floor)
            .and_then(|i| self.slots.get(i as usize))
    }

    fn make_ready(&mut self, offset: u64) {
        let slot = self
            .slot_mut(offset)
            .expect("ready offset inside the window");
        slot.state = SlotState::Ready;
        let rank = PRIORITY_MAX - slot.priority;
        self.ready.insert((rank, offset));
    }

    /// True (and the run bookkeeping moved on) when `next` lies in a settled run saved before a
    /// restart.
    fn next_was_settled(&mut self) -> bool {
        while let Some(&(start, end)) = self.restored.front() {
            if self.next >= end {
                self.restored.pop_front();
                continue;
            }
            if self.next >= start {
                self.restored_left -= 1;
                return true;
            }
            return false;
        }
        false
    }

    /// True when `next` lies in a settled run saved before a restart or skipped by an operator
    /// (without moving the run bookkeeping on).
    fn next_in_restored(&self) -> bool {
        self.restored
            .iter()
            .find(|&&(_, end)| end > self.next)
            .is_some_and(|&(start, _)| start <= self.next)
    }

    /// Settles `start .. end` without delivering it: an operator skipped these offsets (a range
    /// of the log that cannot be read). Ready messages in the window are settled now; offsets at
    /// or above `next` are passed when the cursor gets there, without reading them. Messages in
    /// flight, delayed or waiting behind their key are left alone: they were readable. Returns
    /// how many messages this settles.
    pub fn skip(&mut self, start: u64, end: u64) -> u64 {
        let mut settled = 0;
        for offset in start.max(self.floor)..end.min(self.next) {
            let Some(slot) = self.slot_mut(offset) else {
                continue;
            };
            if slot.state != SlotState::Ready {
                continue;
            }
            slot.state = SlotState::Settled;
            let rank = PRIORITY_MAX - slot.priority;
            self.ready.remove(&(rank, offset));
            self.key_done(offset);
            settled += 1;
        }
        let from = start.max(self.next);
        if from < end {
            let before = self.restored_left;
            let mut runs: Vec<(u64, u64)> = self.restored.iter().copied().collect();
            runs.push((from, end));
            runs.sort_unstable();
            let mut merged: VecDeque<(u64, u64)> = VecDeque::with_capacity(runs.len());
            for (s, e) in runs {
                match merged.back_mut() {
                    Some(last) if s <= last.1 => last.1 = last.1.max(e),
                    _ => merged.push_back((s, e)),
                }
            }
            self.restored = merged;
            // The runs' part at or above `next` is what is left to pass.
            let next = self.next;
            self.restored_left = self
                .restored
                .iter()
                .map(|&(s, e)| e.saturating_sub(s.max(next)))
                .sum();
            settled += self.restored_left - before;
        }
        self.advance_floor();
        settled
    }

    /// True when `record` is a requeued dead letter meant for another subscription.
    fn meant_for_another(&self, record: &[u8]) -> bool {
        crate::dead_letter::requeued_for_another(record, &self.options.name)
    }

    /// Passes `next` without delivering it: it counts as settled here.
    fn pass_settled(&mut self, priority: u8) {
        self.restored_delivery.remove(&self.next);
        self.next += 1;
        if self.slots.is_empty() {
            self.floor = self.next;
        } else {
            self.slots
                .push_back(Slot::new(SlotState::Settled, priority));
        }
    }

    /// For an ordered cursor: true when `key` already has an unsettled message in the window.
    fn key_busy(&self, key: KeyId) -> bool {
        self.ordered
            .as_ref()
            .is_some_and(|o| o.keys.contains_key(&key))
    }

    /// Makes `offset` the owner of `key` (which must be free).
    fn own(&mut self, key: KeyId, offset: u64) {
        if let Some(o) = &mut self.ordered {
            o.keys.insert(key, (offset, VecDeque::new()));
            o.owner_of.insert(offset, key);
        }
    }

    /// Takes `next` into the window as a message waiting behind its key.
    fn block_next(&mut self, key: KeyId, priority: u8) {
        let offset = self.next;
        // A delay saved for a blocked message is not kept: only a key's owner can be delayed.
        let attempt = self.restored_delivery.remove(&offset).map_or(0, |(a, _)| a);
        self.next += 1;
        self.slots.push_back(Slot {
            attempt,
            ..Slot::new(SlotState::Blocked, priority)
        });
        if let Some(o) = &mut self.ordered {
            o.keys
                .get_mut(&key)
                .expect("a busy key has a queue")
                .1
                .push_back(offset);
        }
    }

    /// `offset` of an ordered cursor is settled or given up: if it owned its key, the next
    /// message of that key (still waiting in the window) takes its turn.
    fn key_done(&mut self, offset: u64) {
        let Some(o) = &mut self.ordered else {
            return;
        };
        let Some(key) = o.owner_of.remove(&offset) else {
            return;
        };
        loop {
            let queue = &mut o.keys.get_mut(&key).expect("an owner's key has a queue").1;
            let Some(candidate) = queue.pop_front() else {
                o.keys.remove(&key);
                return;
            };
            let is_blocked = candidate
                .checked_sub(self.floor)
                .and_then(|i| self.slots.get(i as usize))
                .is_some_and(|s| s.state == SlotState::Blocked);
            if is_blocked {
                o.keys.get_mut(&key).expect("present").0 = candidate;
                o.owner_of.insert(candidate, key);
                self.promoted += 1;
                self.make_ready(candidate);
                return;
            }
        }
    }

    /// Takes `next` into the window before its delivery (priorities): ready, delayed, blocked
    /// behind its key, or settled.
    fn admit(&mut self, stored: &crate::log::Stored, clock: &DeliverClock) {
        let offset = self.next;
        let priority = record_priority(&stored.record);
        if self.next_was_settled() || self.meant_for_another(&stored.record) {
            self.pass_settled(priority);
            return;
        }
        if self.ordered.is_some() {
            let key = KeyId::of(&stored.record);
            if self.key_busy(key) {
                self.block_next(key, priority);
                return;
            }
            self.own(key, offset);
        }
        self.next += 1;
        if let Some((attempt, due_ms)) = self.restored_delivery.remove(&offset) {
            // Delivered before the restart: its publish delay had passed; a nack's may not have.
            self.slots.push_back(Slot {
                attempt,
                ..Slot::new(SlotState::Ready, priority)
            });
            match clock.due(due_ms) {
                Some(due) => self.hold(offset, due),
                None => self.make_ready(offset),
            }
            return;
        }
        self.slots.push_back(Slot::new(SlotState::Ready, priority));
        match clock.check(stored) {
            Err(due) => self.hold(offset, due),
            Ok(_) => self.make_ready(offset),
        }
    }

    /// Hands messages to `consumer`: ready ones first (highest priority, then lowest offset),
    /// then new ones in log order. `emit(offset, timestamp_ms, attempt, record)` is called for
    /// each.
    pub fn deliver(
        &mut self,
        log: &impl RecordSource,
        consumer: u64,
        limits: &DeliverLimits,
        clock: &DeliverClock,
        mut emit: impl FnMut(u64, u64, u16, &Bytes),
    ) -> Delivered {
        let deadline = clock.deadline;
        let deadline_ms = clock.deadline_ms();
        let auto_ack = self.options.auto_ack;
        let mut out = Delivered::default();
        let count_max = if auto_ack {
            limits.count_max
        } else {
            limits.count_max.min(limits.in_flight_room)
        };
        let fits = |out: &Delivered, len: usize| {
            out.count < count_max
                && (out.count == 0 || out.bytes as usize + len <= limits.bytes_max)
        };

        // Messages of a higher priority may lie ahead: take what is ahead into the window first.
        let mut admitting = false;
        let priority_end = log.priority_end();
        if priority_end > self.next {
            let stop = priority_end
                .min(self.floor.saturating_add(LOOKAHEAD))
                .min(self.next.saturating_add(ADMIT_PER_PASS_MAX));
            while self.next < stop {
                if self.next_in_restored() {
                    self.next_was_settled();
                    self.pass_settled(0);
                    continue;
                }
                let Some(stored) = log.get(self.next) else {
                    break;
                };
                self.admit(stored, clock);
            }
            // Not done: the next pass goes on taking them in before the rest goes in log order.
            admitting = self.next < priority_end.min(self.floor.saturating_add(LOOKAHEAD));
        }

        while let Some(&(rank, offset)) = self.ready.first() {
            let Some(stored) = log.get(offset) else {
                // Below the log head only if the source could not provide it (a disk read
                // stopped early); it stays ready for the next pass.
                return self.finish(out);
            };
            let first_delivery = self.slot(offset).is_some_and(|slot| slot.attempt == 0);
            let checked = first_delivery.then(|| clock.check(stored));
            if let Some(Err(due)) = checked {
                self.ready.pop_first();
                self.hold(offset, due);
                continue;
            }
            if !fits(&out, stored.record.len()) {
                return self.finish(out);
            }
            self.ready.pop_first();
            debug_assert_eq!(rank, PRIORITY_MAX - self.slot(offset).expect("in").priority);
            let slot = self
                .slot_mut(offset)
                .expect("ready offset inside the window");
            assert_eq!(slot.state, SlotState::Ready);
            slot.attempt = slot.attempt.saturating_add(1);
            let first_wait = (slot.first_us == 0).then(|| {
                // Not yet due only when delivered again before its delay ended: no wait.
                let waited = match checked {
                    Some(Ok(waited)) => waited,
                    _ => clock.check(stored).unwrap_or(0),
                };
                slot.first_us = clock.unix_us;
                slot.lag = encode_lag(waited);
                waited
            });
            let attempt = slot.attempt;
            if auto_ack {
                slot.state = SlotState::Settled;
            } else {
                slot.state = SlotState::InFlight;
                slot.consumer = consumer;
                slot.until_ms = deadline_ms;
                self.in_flight += 1;
                self.deadlines
                    .push_back((deadline, offset, attempt, deadline_ms));
            }
            if let Some(waited) = first_wait {
                self.latency.deliver.record(waited);
            }
            emit(offset, stored.timestamp_ms(), attempt, &stored.record);
            out.count += 1;
            out.bytes += stored.record.len() as u64;
            if attempt > 1 {
                out.redelivered += 1;
            }
        }
        if admitting {
            return self.finish(out);
        }

        let mut set_aside = 0;
        loop {
            // Settled runs are passed without their records, which may be unreadable (a
            // skipped damaged range).
            if self.next_in_restored() {
                self.next_was_settled();
                self.pass_settled(0);
                continue;
            }
            let Some(stored) = log.get(self.next) else {
                break;
            };
            let offset = self.next;
            let priority = record_priority(&stored.record);
            if self.meant_for_another(&stored.record) {
                self.pass_settled(priority);
                continue;
            }
            let key = self.ordered.as_ref().map(|_| KeyId::of(&stored.record));
            if let Some(key) = key {
                if self.next - self.floor >= ORDERED_WINDOW_MAX {
                    break;
                }
                if self.key_busy(key) {
                    if set_aside == HOLD_PER_PASS_MAX {
                        break;
                    }
                    set_aside += 1;
                    self.block_next(key, priority);
                    continue;
                }
            }
            let restored = self.restored_delivery.get(&offset).copied();
            let checked = match restored {
                Some((_, due_ms)) => clock.due(due_ms).map_or(Ok(0), Err),
                None => clock.check(stored),
            };
            let waited = match checked {
                Ok(waited) => waited,
                Err(due) => {
                    // Not yet due: held as a delayed slot, and the messages behind it flow on.
                    // A pass holds a bounded number, so a long run of delayed messages is taken
                    // in steps rather than under one long lock.
                    if set_aside == HOLD_PER_PASS_MAX {
                        break;
                    }
                    set_aside += 1;
                    if let Some(key) = key {
                        self.own(key, offset);
                    }
                    self.restored_delivery.remove(&offset);
                    self.next += 1;
                    self.slots.push_back(Slot {
                        attempt: restored.map_or(0, |(a, _)| a),
                        ..Slot::new(SlotState::Ready, priority)
                    });
                    self.hold(offset, due);
                    continue;
                }
            };
            if !fits(&out, stored.record.len()) {
                break;
            }
            if let Some(key) = key {
                self.own(key, offset);
            }
            self.next += 1;
            // A message delivered before a restart goes on counting its attempts; its first
            // delivery's wait was recorded then.
            let attempt = match self.restored_delivery.remove(&offset) {
                Some((attempts, _)) => attempts.saturating_add(1),
                None => {
                    self.latency.deliver.record(waited);
                    1
                }
            };
            if attempt > 1 {
                out.redelivered += 1;
            }
            if auto_ack {
                if self.slots.is_empty() {
                    self.floor = self.next;
                } else {
                    self.slots.push_back(Slot {
                        attempt,
                        consumer,
                        first_us: clock.unix_us,
                        lag: encode_lag(waited),
                        ..Slot::new(SlotState::Settled, priority)
                    });
                }
            } else {
                self.slots.push_back(Slot {
                    attempt,
                    consumer,
                    first_us: clock.unix_us,
                    lag: encode_lag(waited),
                    until_ms: deadline_ms,
                    ..Slot::new(SlotState::InFlight, priority)
                });
                self.in_flight += 1;
                self.deadlines
                    .push_back((deadline, offset, attempt, deadline_ms));
            }
            emit(offset, stored.timestamp_ms(), attempt, &stored.record);
            out.count += 1;
            out.bytes += stored.record.len() as u64;
        }
        self.finish(out)
    }

    fn finish(&mut self, out: Delivered) -> Delivered {
        self.advance_floor();
        out
    }

    /// Gives up the offsets in `start .. end` in flight to `consumer` at once (the consumer asked
    /// for their dead-lettering). Returns how many.
    pub fn give_up(&mut self, consumer: u64, start: u64, end: u64) -> u64 {
        let (from, to) = (start.max(self.floor), end.min(self.next));
        let mut n = 0;
        for offset in from..to {
            let slot = &mut self.slots[(offset - self.floor) as usize];
            if slot.state == SlotState::InFlight && slot.consumer == consumer {
                slot.state = SlotState::Dead;
                let attempts = slot.attempt;
                self.dead_new.push(GivenUp { offset, attempts });
                self.in_flight -= 1;
                self.key_done(offset);
                n += 1;
            }
        }
        n
    }

    /// The offsets given up since the last call: the owner moves them to the dead-letter topic,
    /// then calls [`Cursor::settle_dead`] (or [`Cursor::revive_dead`]).
    pub fn take_dead(&mut self) -> Vec<GivenUp> {
        std::mem::take(&mut self.dead_new)
    }

    /// A dead letter is stored (at `dead_letter` in the dead-letter topic, when known): its
    /// message is settled here and remembered with `reason`. False if it no longer was dead
    /// (dropped by retention meanwhile).
    pub fn settle_dead(
        &mut self,
        offset: u64,
        now_ms: u64,
        reason: &str,
        dead_letter: Option<(u32, u64)>,
    ) -> bool {
        let history = self.options.history;
        let Some(slot) = self.slot_mut(offset) else {
            return false;
        };
        if slot.state != SlotState::Dead {
            return false;
        }
        slot.state = SlotState::Settled;
        let entry = DeadEntry {
            offset,
            attempts: slot.attempt,
            first_ms: slot.first_us / 1000,
            settled_ms: now_ms,
            reason: reason.into(),
            dead_letter,
        };
        if history > 0 {
            if self.dead.len() == history {
                self.dead.pop_front();
            }
            self.dead.push_back(entry);
        }
        self.advance_floor();
        true
    }

    /// A dead letter could not be taken (its record could not be read): the message is made
    /// ready again, and given up again after its next delivery. (An ordered cursor's key moved
    /// on when it was given up; it is delivered out of turn rather than lost.)
    pub fn revive_dead(&mut self, offset: u64) {
        if self
            .slot(offset)
            .is_some_and(|slot| slot.state == SlotState::Dead)
        {
            self.make_ready(offset);
        }
    }

    /// Makes the slot of `offset` a delayed one, due at `due`.
    fn hold(&mut self, offset: u64, (due, due_ms): (Instant, u64)) {
        let slot = self
            .slot_mut(offset)
            .expect("held offset inside the window");
        slot.state = SlotState::Delayed;
        slot.until_ms = due_ms;
        self.delayed.push(Reverse((due, offset)));
    }

    /// Settles the offsets in `start .. end` that are in flight to `consumer`, each remembered
    /// with `result` (acked at `now_us`, Unix µs); anything else in the range (already settled,
    /// redelivered to another consumer) is ignored. Returns how many were acked.
    pub fn ack(
        &mut self,
        consumer: u64,
        start: u64,
        end: u64,
        now_us: u64,
        result: Option<&[u8]>,
    ) -> u64 {
        let (from, to) = (start.max(self.floor), end.min(self.next));
        let history = self.options.history;
        let mut acked = 0;
        for offset in from..to {
            let slot = &mut self.slots[(offset - self.floor) as usize];
            if slot.state == SlotState::InFlight && slot.consumer == consumer {
                slot.state = SlotState::Settled;
                acked += 1;
                // Far from overflowing: a Unix time in µs plus at most 24 days.
                let since_first = now_us.saturating_sub(slot.first_us);
                self.latency.ack.record(since_first + decode_lag(slot.lag));
                if history > 0 {
                    if self.acked.len() == history {
                        self.acked.pop_front();
                    }
                    self.acked.push_back(AckedEntry {
                        offset,
                        attempts: slot.attempt,
                        first_ms: slot.first_us / 1000,
                        settled_ms: now_us / 1000,
                        result: result.map(Box::from),
                    });
                }
                if self.ordered.is_some() {
                    self.key_done(offset);
                }
            }
        }
        self.in_flight -= acked;
        self.advance_floor();
        acked
    }

    /// Gives the offsets in `start .. end` in flight to `consumer` back: ready at once when `due`
    /// is `None`, else at `due` (an instant, and Unix ms). With `count_attempt` false the
    /// consumer did not process them (it stopped early): their delivery is taken back, so it
    /// neither brings them closer to `max_attempts` nor counts as a redelivery next time.
    pub fn nack(
        &mut self,
        consumer: u64,
        start: u64,
        end: u64,
        due: Option<(Instant, u64)>,
        count_attempt: bool,
    ) -> Released {
        let (from, to) = (start.max(self.floor), end.min(self.next));
        let mut out = Released::default();
        for offset in from..to {
            let slot = &mut self.slots[(offset - self.floor) as usize];
            if slot.state == SlotState::InFlight && slot.consumer == consumer {
                if !count_attempt {
                    // At least 1 while in flight; below max_attempts after this, so `release`
                    // never gives it up.
                    slot.attempt -= 1;
                }
                self.release(offset, due, &mut out);
            }
        }
        self.advance_floor();
        out
    }

    /// Returns every message in flight to `consumer` (it left).
    pub fn release_consumer(&mut self, consumer: u64) -> Released {
        let mut out = Released::default();
        for i in 0..self.slots.len() {
            let slot = self.slots[i];
            if slot.state == SlotState::InFlight && slot.consumer == consumer {
                self.release(self.floor + i as u64, None, &mut out);
            }
        }
        self.advance_floor();
        out
    }

    fn release(&mut self, offset: u64, due: Option<(Instant, u64)>, out: &mut Released) {
        let max_attempts = self.options.max_attempts;
        let slot = self
            .slot_mut(offset)
            .expect("released offset inside the window");
        debug_assert_eq!(slot.state, SlotState::InFlight);
        let attempts = slot.attempt;
        self.in_flight -= 1;
        if attempts as u32 >= max_attempts {
            self.slot_mut(offset).expect("checked").state = SlotState::Dead;
            self.dead_new.push(GivenUp { offset, attempts });
            out.gave_up += 1;
            let before = self.promoted;
            self.key_done(offset);
            out.requeued += self.promoted - before;
        } else if let Some(due) = due {
            self.hold(offset, due);
            out.requeued += 1;
        } else {
            self.make_ready(offset);
            out.requeued += 1;
        }
    }

    /// Moves expired deliveries back to ready and due delayed messages to ready. `on_expired`
    /// receives the consumer of each expired delivery so its in-flight count can be lowered.
    pub fn fire_timers(&mut self, now: Instant, mut on_expired: impl FnMut(u64)) -> Released {
        let mut out = Released::default();
        while let Some(&(deadline, offset, attempt, until_ms)) = self.deadlines.front() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_front();
            let Some(slot) = self.slot_mut(offset) else {
                continue;
            };
            if slot.state != SlotState::InFlight
                || slot.attempt != attempt
                || slot.until_ms != until_ms
            {
                continue;
            }
            on_expired(slot.consumer);
            self.release(offset, None, &mut out);
        }
        while let Some(&Reverse((due, offset))) = self.delayed.peek() {
            if due > now {
                break;
            }
            self.delayed.pop();
            if self
                .slot(offset)
                .is_some_and(|slot| slot.state == SlotState::Delayed)
            {
                self.make_ready(offset);
                out.requeued += 1;
            }
        }
        self.advance_floor();
        out
    }

    /// The log dropped everything below `head` (drop-oldest overflow). Returns how many of those
    /// this subscription never received (never delivered, or waiting for redelivery). Messages in
    /// flight were received once; they leave flight (a late ack is ignored, no redelivery) and
    /// `on_in_flight` is called for each so its consumer's count can be lowered.
    pub fn drop_below(&mut self, head: u64, mut on_in_flight: impl FnMut(u64)) -> u64 {
        let mut lost = 0;
        while self.floor < head && !self.slots.is_empty() {
            let offset = self.floor;
            let slot = self.slots.pop_front().expect("checked non-empty");
            self.floor += 1;
            match slot.state {
                SlotState::Settled => {}
                SlotState::InFlight => {
                    on_in_flight(slot.consumer);
                    self.in_flight -= 1;
                }
                SlotState::Ready => {
                    self.ready.remove(&(PRIORITY_MAX - slot.priority, offset));
                    lost += 1;
                }
                // A delayed one's heap entry is skipped as stale; a blocked one leaves its
                // key's queue when its turn would come.
                SlotState::Delayed | SlotState::Blocked => lost += 1,
                // Its record was taken when it was given up; its dead letter goes on.
                SlotState::Dead => {}
            }
            self.key_done(offset);
        }
        if self.next < head {
            lost += (head - self.next).saturating_sub(self.restored_between(self.next, head));
            self.next = head;
        }
        self.floor = self.floor.max(head);
        self.restored_delivery = self.restored_delivery.split_off(&self.next);
        self.clip_restored(self.next, u64::MAX);
        self.advance_floor();
        lost
    }

    /// How many restored settled offsets lie in `from .. to`.
    fn restored_between(&self, from: u64, to: u64) -> u64 {
        self.restored
            .iter()
            .map(|&(s, e)| e.min(to).saturating_sub(s.max(from)))
            .sum()
    }

    /// Keeps only the restored runs' parts within `from .. to`.
    fn clip_restored(&mut self, from: u64, to: u64) {
        let runs: VecDeque<(u64, u64)> = self
            .restored
            .iter()
            .map(|&(s, e)| (s.max(from), e.min(to)))
            .filter(|&(s, e)| s < e)
            .collect();
        self.restored_left = runs.iter().map(|&(s, e)| e - s).sum();
        self.restored = runs;
    }

    /// The offsets the next delivery pass of up to `count_max` messages would read, for sources
    /// that must fetch them first: ready offsets (ascending), then new ones from `next`, below
    /// `below` (where the source's in-memory part begins) and `end` (the visible end).
    /// `priority_end` is the source's [`RecordSource::priority_end`]: while it lies ahead, the
    /// pass takes in what is ahead, so that is read too.
    pub fn wanted(
        &self,
        count_max: u32,
        below: u64,
        end: u64,
        priority_end: u64,
    ) -> (Vec<u64>, std::ops::Range<u64>) {
        let mut ready: Vec<u64> = self
            .ready
            .iter()
            .map(|&(_, o)| o)
            .filter(|&o| o < below)
            .take(count_max as usize)
            .collect();
        ready.sort_unstable();
        // The pass walks past settled runs at `next` without their records: reading starts after.
        let mut start = self.next;
        for &(s, e) in &self.restored {
            if s <= start && e > start {
                start = e;
            }
        }
        let stop = if priority_end > start {
            priority_end
                .min(self.floor.saturating_add(LOOKAHEAD))
                .min(start.saturating_add(ADMIT_PER_PASS_MAX))
        } else {
            let rest = (count_max as u64).saturating_sub(self.ready.len() as u64);
            start.saturating_add(rest)
        };
        // Settled runs are not read (a skipped one may be unreadable): the new offsets stop at
        // the next one.
        let stop = match self.restored.iter().find(|&&(_, e)| e > start) {
            Some(&(s, _)) => stop.min(s),
            None => stop,
        };
        let stop = below.min(end).min(stop);
        (ready, start..stop.max(start))
    }

    /// What a restart must not forget beyond the settled runs, ascending by offset: every
    /// unsettled message delivered and given back (nacked, timed out, its consumer gone) with
    /// its attempts, and its due time while a nack's delay runs. Sparse: a message never
    /// delivered, or in flight on its first delivery, has none (after a crash that first
    /// delivery is not counted; nothing else is lost).
    pub fn delivery_state(&self) -> Vec<DeliveryState> {
        let mut out = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let kept = match slot.state {
                SlotState::Settled => false,
                SlotState::InFlight => slot.attempt > 1,
                _ => slot.attempt > 0,
            };
            if kept {
                let due_ms = if slot.state == SlotState::Delayed {
                    slot.until_ms
                } else {
                    0
                };
                out.push((self.floor + i as u64, slot.attempt, due_ms));
            }
        }
        out.extend(
            self.restored_delivery
                .range(self.next..)
                .map(|(&offset, &(attempts, due_ms))| (offset, attempts, due_ms)),
        );
        out
    }

    /// Takes back delivery states saved before a restart (see [`Cursor::delivery_state`]); call
    /// right after [`Cursor::restore`]. Attempts are capped below `max_attempts`: a message in
    /// flight on its last attempt when the broker stopped gets that attempt again rather than
    /// being given up for a delivery nobody answered.
    pub fn restore_delivery(&mut self, saved: &[DeliveryState]) {
        if self.options.auto_ack {
            return;
        }
        let cap = (self.options.max_attempts - 1).min(u16::MAX as u32) as u16;
        for &(offset, attempts, due_ms) in saved {
            if offset >= self.next {
                self.restored_delivery
                    .insert(offset, (attempts.min(cap), due_ms));
            }
        }
    }

    /// The settled offsets at or above the floor, as `(start, end)` runs: with the floor, the
    /// state a restart needs (everything else is delivered again).
    pub fn settled_runs(&self) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut push = |offset: u64, end: u64| match runs.last_mut() {
            Some(last) if last.1 == offset => last.1 = end,
            _ => runs.push((offset, end)),
        };
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.state == SlotState::Settled {
                let offset = self.floor + i as u64;
                push(offset, offset + 1);
            }
        }
        for &(s, e) in &self.restored {
            let s = s.max(self.next);
            if s < e {
                push(s, e);
            }
        }
        runs
    }

    /// A cursor restored after a restart: everything below `floor` and in `settled` is settled,
    /// everything else is delivered again, from the floor on. `floor` and the runs are clamped to
    /// the log's `start .. end` (a log that lost its unsynced tail, or retention, may have moved
    /// either).
    pub fn restore(
        sub_id: u64,
        options: CursorOptions,
        floor: u64,
        settled: &[(u64, u64)],
        start: u64,
        end: u64,
    ) -> Self {
        let floor = floor.clamp(start, end);
        let auto_ack = options.auto_ack;
        let mut cursor = Cursor::new(sub_id, options, floor);
        // The floor moved since the subscription began: its start is the caller's to give.
        cursor.start = 0;
        if auto_ack {
            return cursor;
        }
        let mut runs: Vec<(u64, u64)> = settled.to_vec();
        runs.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(runs.len());
        for (s, e) in runs {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        cursor.restored = merged.into();
        cursor.clip_restored(floor, end);
        // Settled runs at the floor move it at once.
        while let Some(&(s, e)) = cursor.restored.front() {
            if s > cursor.floor {
                break;
            }
            cursor.restored_left -= e - s;
            cursor.restored.pop_front();
            cursor.floor = e;
            cursor.next = e;
        }
        cursor
    }

    /// Where the subscription started in this partition, as saved when it was created (a
    /// restored cursor knows only its floor).
    pub fn set_start(&mut self, start: u64) {
        self.start = start;
    }

    /// The log lost everything from `end` on (a disk log reopened after a failed sync found less
    /// than was written): forget those offsets. Those that were in flight are reported through
    /// `on_in_flight`, per consumer.
    pub fn truncate_to(&mut self, end: u64, mut on_in_flight: impl FnMut(u64)) {
        while self.next > end.max(self.floor) {
            let slot = self.slots.pop_back().expect("slots cover floor..next");
            self.next -= 1;
            match slot.state {
                SlotState::InFlight => {
                    self.in_flight -= 1;
                    on_in_flight(slot.consumer);
                }
                SlotState::Ready => {
                    self.ready
                        .remove(&(PRIORITY_MAX - slot.priority, self.next));
                }
                _ => {}
            }
        }
        if self.next > end {
            // The floor itself was above the new end: nothing of the window is left.
            self.slots.clear();
            self.ready.clear();
            self.floor = end;
            self.next = end;
        }
        let next = self.next;
        if let Some(o) = &mut self.ordered {
            o.keys.retain(|_, (owner, queue)| {
                queue.retain(|&q| q < next);
                *owner < next
            });
            o.owner_of.retain(|&offset, _| offset < next);
        }
        self.restored_delivery.split_off(&end);
        self.clip_restored(self.next, end);
        self.advance_floor();
    }

    /// Pops settled slots off the front, and deadline entries that can no longer fire.
    fn advance_floor(&mut self) {
        while let Some(slot) = self.slots.front() {
            if slot.state != SlotState::Settled {
                break;
            }
            self.slots.pop_front();
            self.floor += 1;
        }
        if self.slots.is_empty() {
            self.floor = self.next;
        }
        while let Some(&(_, offset, _, _)) = self.deadlines.front() {
            if offset >= self.floor {
                break;
            }
            self.deadlines.pop_front();
        }
        if self.slots.is_empty() {
            self.deadlines.clear();
            self.delayed.clear();
        }
    }

    /// How this subscription sees `offset`, for status queries; `None` at or beyond `log_end`.
    /// Partition and publish time are the caller's to fill in.
    pub fn entry(&self, offset: u64, log_end: u64) -> Option<MessageEntry> {
        if offset >= log_end {
            return None;
        }
        let mut entry = MessageEntry {
            partition: 0,
            offset,
            state: MessageState::Pending,
            attempts: 0,
            published_ms: 0,
            first_delivered_ms: 0,
            settled_ms: 0,
            due_ms: 0,
            result: Bytes::new(),
            reason: String::new(),
            dead_letter: None,
        };
        if offset < self.start {
            entry.state = MessageState::BeforeStart;
            return Some(entry);
        }
        if offset < self.floor || self.restored_between(offset, offset + 1) == 1 {
            self.fill_settled(&mut entry);
            return Some(entry);
        }
        let Some(slot) = self.slot(offset) else {
            return Some(entry); // not yet taken into the window: pending
        };
        entry.attempts = slot.attempt;
        entry.first_delivered_ms = slot.first_us / 1000;
        entry.state = match slot.state {
            SlotState::Ready | SlotState::Blocked => MessageState::Pending,
            SlotState::Delayed => {
                entry.due_ms = slot.until_ms;
                MessageState::Delayed
            }
            SlotState::InFlight => {
                entry.due_ms = slot.until_ms;
                MessageState::InFlight
            }
            SlotState::Dead => MessageState::DeadLettered,
            SlotState::Settled => {
                self.fill_settled(&mut entry);
                entry.state
            }
        };
        Some(entry)
    }

    /// Fills in a settled message's outcome from the history; `Settled` when it is older than
    /// what the history keeps (auto-ack subscriptions: acked when sent).
    fn fill_settled(&self, entry: &mut MessageEntry) {
        let offset = entry.offset;
        if let Some(a) = self.acked.iter().rev().find(|a| a.offset == offset) {
            *entry = self.acked_entry(a);
        } else if let Some(d) = self.dead.iter().rev().find(|d| d.offset == offset) {
            *entry = self.dead_entry(d);
        } else if self.options.auto_ack {
            entry.state = MessageState::Acked;
            entry.attempts = 1;
        } else {
            entry.state = MessageState::Settled;
        }
    }

    fn acked_entry(&self, a: &AckedEntry) -> MessageEntry {
        MessageEntry {
            partition: 0,
            offset: a.offset,
            state: MessageState::Acked,
            attempts: a.attempts,
            published_ms: 0,
            first_delivered_ms: a.first_ms,
            settled_ms: a.settled_ms,
            due_ms: 0,
            result: a
                .result
                .as_deref()
                .map_or_else(Bytes::new, Bytes::copy_from_slice),
            reason: String::new(),
            dead_letter: None,
        }
    }

    fn dead_entry(&self, d: &DeadEntry) -> MessageEntry {
        MessageEntry {
            partition: 0,
            offset: d.offset,
            state: MessageState::DeadLettered,
            attempts: d.attempts,
            published_ms: 0,
            first_delivered_ms: d.first_ms,
            settled_ms: d.settled_ms,
            due_ms: 0,
            result: Bytes::new(),
            reason: d.reason.to_string(),
            dead_letter: d.dead_letter,
        }
    }

    /// Up to `limit` messages at or after `from` that wait for delivery (`in_flight` false) or
    /// are in flight, in offset order, with the offset to continue from when more may follow.
    pub fn list_window(
        &self,
        in_flight: bool,
        from: u64,
        limit: usize,
        log_end: u64,
    ) -> (Vec<MessageEntry>, Option<u64>) {
        let mut out = Vec::new();
        let mut offset = from.max(self.floor);
        let window_end = if in_flight { self.next } else { log_end };
        while offset < window_end {
            if out.len() == limit {
                return (out, Some(offset));
            }
            // Settled and dead slots are skipped without looking at the history.
            let wanted = match self.slot(offset).map(|slot| slot.state) {
                Some(SlotState::InFlight) => in_flight,
                Some(SlotState::Ready | SlotState::Blocked | SlotState::Delayed) => !in_flight,
                Some(SlotState::Settled | SlotState::Dead) => false,
                None => !in_flight && self.restored_between(offset, offset + 1) == 0,
            };
            if wanted {
                out.extend(self.entry(offset, log_end));
            }
            offset += 1;
        }
        (out, None)
    }

    /// The settled messages this cursor remembers, encoded to be saved at a clean shutdown:
    /// `u32` count of acked entries, each `u64 offset, u16 attempts, u64 first_ms,
    /// u64 settled_ms, u8 has_result, u32 len, result`; then `u32` count of dead entries, each
    /// `u64 offset, u16 attempts, u64 first_ms, u64 settled_ms, u32 len, reason, u8 has_dead_letter,
    /// u32 partition, u64 offset` (little-endian).
    pub fn encode_history(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&(self.acked.len() as u32).to_le_bytes());
        for a in &self.acked {
            out.extend_from_slice(&a.offset.to_le_bytes());
            out.extend_from_slice(&a.attempts.to_le_bytes());
            out.extend_from_slice(&a.first_ms.to_le_bytes());
            out.extend_from_slice(&a.settled_ms.to_le_bytes());
            let result = a.result.as_deref();
            out.push(result.is_some() as u8);
            let result = result.unwrap_or_default();
            out.extend_from_slice(&(result.len() as u32).to_le_bytes());
            out.extend_from_slice(result);
        }
        out.extend_from_slice(&(self.dead.len() as u32).to_le_bytes());
        for d in &self.dead {
            out.extend_from_slice(&d.offset.to_le_bytes());
            out.extend_from_slice(&d.attempts.to_le_bytes());
            out.extend_from_slice(&d.first_ms.to_le_bytes());
            out.extend_from_slice(&d.settled_ms.to_le_bytes());
            out.extend_from_slice(&(d.reason.len() as u32).to_le_bytes());
            out.extend_from_slice(d.reason.as_bytes());
            let (p, o) = d.dead_letter.unwrap_or_default();
            out.push(d.dead_letter.is_some() as u8);
            out.extend_from_slice(&p.to_le_bytes());
            out.extend_from_slice(&o.to_le_bytes());
        }
        out
    }

    /// Takes back what [`Cursor::encode_history`] saved (the newest entries, up to the
    /// history's size). False, and nothing taken, when `bytes` is not such an encoding.
    pub fn restore_history(&mut self, bytes: &[u8]) -> bool {
        let Some((acked, dead)) = decode_history(bytes) else {
            return false;
        };
        let keep = self.options.history;
        self.acked = acked.into_iter().rev().take(keep).rev().collect();
        self.dead = dead.into_iter().rev().take(keep).rev().collect();
        true
    }

    /// The acked (or dead-lettered) messages this cursor remembers, newest first.
    pub fn history(&self, dead: bool) -> Vec<MessageEntry> {
        if dead {
            self.dead.iter().rev().map(|d| self.dead_entry(d)).collect()
        } else {
            self.acked
                .iter()
                .rev()
                .map(|a| self.acked_entry(a))
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::log::MemoryLog;

    fn log_of(n: u64) -> MemoryLog {
        let mut log = MemoryLog::default();
        for i in 0..n {
            // Not real records: a first byte of 0 reads as priority 0.
            log.append(i, Bytes::from(format!("\0{i}")));
        }
        log
    }

    fn opts(auto_ack: bool, max_attempts: u32) -> CursorOptions {
        CursorOptions {
            name: "s".into(),
            auto_ack,
            max_attempts,
            ordered: false,
            history: 100,
        }
    }

    fn limits(count_max: u32) -> DeliverLimits {
        DeliverLimits {
            count_max,
            bytes_max: usize::MAX,
            in_flight_room: u32::MAX,
        }
    }

    fn take(
        c: &mut Cursor,
        log: &impl RecordSource,
        consumer: u64,
        n: u32,
        deadline: Instant,
    ) -> Vec<(u64, u16)> {
        let mut got = Vec::new();
        c.deliver(
            log,
            consumer,
            &limits(n),
            &clock_at(deadline),
            |o, _, a, _| got.push((o, a)),
        );
        got
    }

    /// A clock at `t` (Unix time 0 ms: nothing the tests publish at later times is due).
    fn clock_at(t: Instant) -> DeliverClock {
        DeliverClock {
            now: t,
            unix_us: 0,
            deadline: t,
        }
    }

    #[test]
    fn delivers_in_order_and_acks_advance_the_floor() {
        let log = log_of(5);
        let mut c = Cursor::new(1, opts(false, 5), 0);
        let t = Instant::now();
        assert_eq!(take(&mut c, &log, 7, 3, t), vec![(0, 1), (1, 1), (2, 1)]);
        assert_eq!(c.in_flight(), 3);
        assert_eq!(c.backlog(log.next_offset()), 2);
        assert_eq!(c.ack(7, 1, 2, 0, None), 1);
        assert_eq!(c.floor(), 0, "offset 0 still in flight");
        assert_eq!(c.ack(7, 0, 1, 0, None), 1);
        assert_eq!(c.floor(), 2);
        assert_eq!(c.ack(7, 0, 3, 0, None), 1);
        assert_eq!(c.floor(), 3);
        assert_eq!(c.in_flight(), 0);
    }

    #[test]
    fn ack_from_another_consumer_or_twice_is_ignored() {
        let log = log_of(2);
        let mut c = Cursor::new(1, opts(false, 5), 0);
        take(&mut c, &log, 7, 2, Instant::now());
        assert_eq!(c.ack(8, 0, 2, 0, None), 0);
        assert_eq!(c.ack(7, 0, 1, 0, None), 1);
        assert_eq!(c.ack(7, 0, 1, 0, None), 0);
        assert_eq!(c.ack(7, 0, u64::MAX, 0, None), 1);
        assert_eq!(c.in_flight(), 0);
    }

    #[test]
    fn expired_deliveries_come_back_with_the_next_attempt_first() {
        let log = log_of(4);
        let mut c = Cursor::new(1, opts(false, 5), 0);
        let t0 = Instant::now();
        take(&mut c, &log, 7, 2, t0 + Duration::from_millis(100));
        c.ack(7, 1, 2, 0, None);
        let mut expired_from = Vec::new();
        let r = c.fire_timers(t0 + Duration::from_millis(50), |who| expired_from.push(who));
        assert_eq!(r, Released::default());
        let r = c.fire_timers(t0 + Duration::from_millis(100), |who| {
            expired_from.push(who)
        });
        assert_eq!(r.requeued, 1);
        assert_eq!(expired_from, vec![7]);
        assert_eq!(
            take(&mut c, &log, 8, 2, t0 + Duration::from_secs(1)),
            vec![(0, 2), (2, 1)]
        );
        assert_eq!(
            c.ack(7, 0, 1, 0, None),
            0,
            "the old consumer's ack no longer counts"
        );
        assert_eq!(c.ack(8, 0, 1, 0, None), 1);
    }

    #[test]
    fn a_late_ack_after_timeout_and_redelivery_does_not_settle_the_new_delivery() {
        let log = log_of(1);
        let mut c = Cursor::new(1, opts(false, 5), 0);
        let t0 = Instant::now();
        take(&mut c, &log, 7, 1, t0);
        c.fire_timers(t0, |_| {});
        take(&mut c, &log, 7, 1, t0 + Duration::from_secs(1));
        // Same consumer got it again: an ack now settles the current delivery, once.
        assert_eq!(c.ack(7, 0, 1, 0, None), 1);
        assert_eq!(
            c.fire_timers(t0 + Duration::from_secs(5), |_| {}),
            Released::default()
        );
        assert_eq!(c.backlog(log.next_offset()), 0);
    }

    #[test]
    fn gives_up_after_max_attempts() {
        let log = log_of(1);
        let mut c = Cursor::new(1, opts(false, 3), 0);
        let t0 = Instant::now();
        for attempt in 1..=3u16 {
            assert_eq!(take(&mut c, &log, 7, 1, t0), vec![(0, attempt)]);
            let r = c.nack(7, 0, 1, None, true);
            if attempt < 3 {
                assert_eq!(r.requeued, 1);
            } else {
                assert_eq!(r.gave_up, 1);
            }
        }
        // On its way to the dead-letter topic: not delivered again, not yet settled.
        assert!(take(&mut c, &log, 7, 1, t0).is_empty());
        assert_eq!(c.floor(), 0);
        assert_eq!(
            c.take_dead(),
            vec![GivenUp {
                offset: 0,
                attempts: 3
            }]
        );
        assert!(c.take_dead().is_empty());
        assert!(c.settle_dead(0, 0, "max_attempts", None));
        assert_eq!(c.floor(), 1);
        assert!(!c.settle_dead(0, 0, "max_attempts", None));
    }

    #[test]
    fn messages_before_the_start_are_not_the_subscriptions() {
        let log = log_of(8);
        let mut c = Cursor::new(1, opts(false, 5), 5);
        let state = |c: &Cursor, offset| c.entry(offset, log.next_offset()).unwrap().state;
        assert_eq!(state(&c, 4), MessageState::BeforeStart);
        assert_eq!(state(&c, 5), MessageState::Pending);
        // A restored cursor knows only its floor until told where the subscription began.
        c = Cursor::restore(1, opts(false, 5), 6, &[], 0, 8);
        assert_eq!(state(&c, 4), MessageState::Settled);
        c.set_start(5);
        assert_eq!(state(&c, 4), MessageState::BeforeStart);
        assert_eq!(state(&c, 5), MessageState::Settled);
    }

    #[test]
    fn a_release_does_not_count_an_attempt() {
        let log = log_of(2);
        let mut c = Cursor::new(1, opts(false, 1), 0);
        let t0 = Instant::now();
        // With max_attempts 1 a counted nack would give it up at once.
        for _ in 0..3 {
            assert_eq!(take(&mut c, &log, 7, 1, t0), vec![(0, 1)]);
            let r = c.nack(7, 0, 1, None, false);
            assert_eq!(
                r,
                Released {
                    requeued: 1,
                    gave_up: 0
                }
            );
        }
        assert!(c.take_dead().is_empty());
        assert_eq!(take(&mut c, &log, 7, 2, t0), vec![(0, 1), (1, 1)]);
        c.ack(7, 0, 2, 1, None);
        assert_eq!(c.floor(), 2);
    }

    #[test]
    fn a_released_message_delivered_again_keeps_its_new_ack_deadline() {
        let log = log_of(1);
        let mut c = Cursor::new(1, opts(false, 5), 0);
        let t0 = Instant::now();
        let clock = |after_s: u64| DeliverClock {
            now: t0 + Duration::from_secs(after_s),
            unix_us: (1_000 + after_s) * 1_000_000,
            deadline: t0 + Duration::from_secs(after_s + 10),
        };
        let mut got = Vec::new();
        c.deliver(&log, 7, &limits(1), &clock(0), |o, _, a, _| {
            got.push((o, a))
        });
        c.nack(7, 0, 1, None, false);
        c.deliver(&log, 8, &limits(1), &clock(5), |o, _, a, _| {
            got.push((o, a))
        });
        // The same attempt twice: the first delivery's deadline must not expire the second.
        assert_eq!(got, vec![(0, 1), (0, 1)]);
        let mut expired = Vec::new();
        c.fire_timers(t0 + Duration::from_secs(10), |consumer| {
            expired.push(consumer)
        });
        assert!(expired.is_empty());
        assert_eq!(c.in_flight(), 1);
        c.fire_timers(t0 + Duration::from_secs(15), |consumer| {
            expired.push(consumer)
        });
        assert_eq!(expired, vec![8]);
    }

    #[test]
    fn delayed_nack_waits_for_its_due_time() {
        let log = log_of(1);
        let mut c = Cursor::new(1, opts(false, 5), 0);
        let t0 = Instant::now();
        take(&mut c, &log, 7, 1, t0 + Duration::from_secs(60));
        c.nack(7, 0, 1, Some((t0 + Duration::from_secs(2), 0)), true);
        assert!(!c.has_ready(log.next_offset()));
        assert_eq!(c.backlog(log.next_offset()), 1);
        c.fire_timers(t0 + Duration::from_secs(1), |_| {});
        assert!(take(&mut c, &log, 7, 1, t0).is_empty());
        c.fire_timers(t0 + Duration::from_secs(2), |_| {});
        assert_eq!(take(&mut c, &log, 7, 1, t0), vec![(0, 2)]);
    }

    #[test]
    fn a_leaving_consumer_returns_only_its_own_messages() {
        let log = log_of(4);
        let mut c = Cursor::new(1, opts(false, 5), 0);
        let t = Instant::now();
        take(&mut c, &log, 7, 2, t);
        take(&mut c, &log, 8, 2, t);
        let r = c.release_consumer(7);
        assert_eq!(r.requeued, 2);
        assert_eq!(c.in_flight(), 2);
        assert_eq!(take(&mut c, &log, 8, 10, t), vec![(0, 2), (1, 2)]);
    }

    #[test]
    fn respects_count_bytes_and_in_flight_room() {
        let log = log_of(10);
        let mut c = Cursor::new(1, opts(false, 5), 0);
        let t = Instant::now();
        let d = c.deliver(
            &log,
            7,
            &DeliverLimits {
                count_max: 10,
                bytes_max: 4,
                in_flight_room: 10,
            },
            &clock_at(t),
            |_, _, _, _| {},
        );
        assert_eq!(d.count, 2, "two 2-byte records fit in 4 bytes");
        let d = c.deliver(
            &log,
            7,
            &DeliverLimits {
                count_max: 10,
                bytes_max: 1,
                in_flight_room: 10,
            },
            &clock_at(t),
            |_, _, _, _| {},
        );
        assert_eq!(
            d.count, 1,
            "one record always goes even if over the byte budget"
        );
        let d = c.deliver(
            &log,
            7,
            &DeliverLimits {
                count_max: 10,
                bytes_max: 100,
                in_flight_room: 4,
            },
            &clock_at(t),
            |_, _, _, _| {},
        );
        assert_eq!(d.count, 4);
    }

    #[test]
    fn auto_ack_keeps_no_state() {
        let log = log_of(3);
        let mut c = Cursor::new(1, opts(true, 5), 0);
        assert_eq!(take(&mut c, &log, 7, 10, Instant::now()).len(), 3);
        assert_eq!(c.floor(), 3);
        assert_eq!(c.in_flight(), 0);
        assert!(!c.has_timers());
    }

    #[test]
    fn dropping_below_the_floor_loses_unsettled_messages_and_frees_in_flight() {
        let log = log_of(6);
        let mut c = Cursor::new(1, opts(false, 5), 0);
        let t = Instant::now();
        take(&mut c, &log, 7, 2, t);
        c.ack(7, 0, 1, 0, None);
        let mut freed = Vec::new();
        // offsets: 0 settled, 1 in flight, 2..6 never delivered; drop below 4.
        let lost = c.drop_below(4, |who| freed.push(who));
        assert_eq!(lost, 2, "2 and 3 were never received; 1 was");
        assert_eq!(freed, vec![7]);
        assert_eq!(c.floor(), 4);
        assert_eq!(c.in_flight(), 0);
    }

    #[test]
    fn a_restored_cursor_redelivers_exactly_what_was_not_settled() {
        let log = log_of(10);
        let mut c = Cursor::new(1, opts(false, 5), 0);
        let t = Instant::now();
        take(&mut c, &log, 7, 8, t);
        c.ack(7, 0, 2, 0, None);
        c.ack(7, 3, 4, 0, None);
        c.ack(7, 5, 7, 0, None);
        assert_eq!(c.floor(), 2);
        assert_eq!(c.settled_runs(), vec![(3, 4), (5, 7)]);
        let mut r = Cursor::restore(1, opts(false, 5), c.floor(), &c.settled_runs(), 0, 10);
        assert_eq!(r.floor(), 2);
        let got: Vec<u64> = take(&mut r, &log, 9, 100, t).iter().map(|g| g.0).collect();
        assert_eq!(got, vec![2, 4, 7, 8, 9]);
    }

    #[test]
    fn a_restored_cursor_is_clamped_to_what_the_log_holds() {
        // The log lost its tail (8..) and retention moved its start to 3.
        let r = Cursor::restore(1, opts(false, 5), 1, &[(5, 12)], 3, 8);
        assert_eq!(r.floor(), 3);
        assert_eq!(r.backlog(8), 2, "3 and 4 are ready, 5..8 settled");
        let r = Cursor::restore(1, opts(false, 5), 20, &[], 3, 8);
        assert_eq!(r.floor(), 8);
    }

    #[test]
    fn truncating_forgets_offsets_beyond_the_new_end() {
        let log = log_of(10);
        let mut c = Cursor::new(1, opts(false, 5), 0);
        take(&mut c, &log, 7, 10, Instant::now());
        c.ack(7, 0, 3, 0, None);
        let mut released = Vec::new();
        c.truncate_to(6, |consumer| released.push(consumer));
        assert_eq!(released, vec![7; 4]);
        assert_eq!(c.in_flight(), 3);
        assert_eq!(c.backlog(6), 0);
        c.truncate_to(1, |_| {});
        assert_eq!(c.floor(), 1);
        assert_eq!(c.in_flight(), 0);
    }

    /// A log of real records published at Unix ms 1000, with the given delays.
    fn delayed_log(delays: &[Option<u64>]) -> MemoryLog {
        let mut log = MemoryLog::default();
        for (i, delay) in delays.iter().enumerate() {
            let message = ferrymq_protocol::Message {
                deliver_after_ms: *delay,
                ..ferrymq_protocol::Message::new(format!("m{i}"))
            };
            let batch = ferrymq_protocol::RecordBatch::from_messages(&[message]).unwrap();
            log.append(1_000_000, batch.bytes().clone());
        }
        log
    }

    fn deliver_at(c: &mut Cursor, log: &MemoryLog, now: Instant, unix_ms: u64) -> Vec<(u64, u16)> {
        let clock = DeliverClock {
            now,
            unix_us: unix_ms * 1000,
            deadline: now + Duration::from_secs(30),
        };
        let mut got = Vec::new();
        c.deliver(log, 7, &limits(100), &clock, |o, _, a, _| got.push((o, a)));
        got
    }

    #[test]
    fn a_delayed_message_waits_for_its_time_and_the_ones_behind_it_flow() {
        let log = delayed_log(&[Some(100), None, Some(50), None]);
        for auto_ack in [false, true] {
            let mut c = Cursor::new(1, opts(auto_ack, 5), 0);
            let t = Instant::now();
            assert_eq!(deliver_at(&mut c, &log, t, 1000), vec![(1, 1), (3, 1)]);
            assert!(c.has_timers());
            assert_eq!(c.backlog(4), 2, "two delayed messages wait");
            assert_eq!(c.floor(), 0);
            assert!(!c.has_ready(4), "nothing to poll for until a delay passes");
            c.fire_timers(t + Duration::from_millis(49), |_| {});
            assert!(deliver_at(&mut c, &log, t, 1049).is_empty());
            c.fire_timers(t + Duration::from_millis(50), |_| {});
            assert_eq!(deliver_at(&mut c, &log, t, 1050), vec![(2, 1)]);
            c.fire_timers(t + Duration::from_millis(100), |_| {});
            assert_eq!(deliver_at(&mut c, &log, t, 1100), vec![(0, 1)]);
            if auto_ack {
                assert_eq!(c.floor(), 4, "auto-ack settles each as it goes");
            } else {
                assert_eq!(c.in_flight(), 4);
                c.ack(7, 0, 4, 0, None);
                assert_eq!(c.floor(), 4);
            }
            assert!(!c.has_timers());
        }
    }

    #[test]
    fn a_restored_cursor_keeps_a_delay_that_has_not_passed() {
        let log = delayed_log(&[None, Some(1000), None]);
        // Offset 0 was settled, 1 held, 2 settled before the restart.
        let mut c = Cursor::restore(1, opts(false, 5), 0, &[(0, 1), (2, 3)], 0, 3);
        let t = Instant::now();
        assert!(deliver_at(&mut c, &log, t, 1500).is_empty());
        assert!(c.has_timers());
        c.fire_timers(t + Duration::from_millis(500), |_| {});
        assert_eq!(deliver_at(&mut c, &log, t, 2000), vec![(1, 1)]);
    }

    #[test]
    fn latencies_run_from_publish_or_the_end_of_a_delay_to_first_delivery_and_to_ack() {
        use ferrymq_protocol::latency_bucket;
        // Published at Unix µs 1 000 000; the third one is delayed by 100 ms.
        let log = delayed_log(&[None, None, Some(100)]);
        let mut c = Cursor::new(1, opts(false, 5), 0);
        let t = Instant::now();
        let clock = |unix_us| DeliverClock {
            now: t,
            unix_us,
            deadline: t + Duration::from_secs(30),
        };
        let mut got = Vec::new();
        let mut take = |c: &mut Cursor, unix_us| {
            got.clear();
            c.deliver(&log, 7, &limits(10), &clock(unix_us), |o, _, a, _| {
                got.push((o, a))
            });
            got.clone()
        };
        assert_eq!(take(&mut c, 1_000_250), vec![(0, 1), (1, 1)]);
        // A redelivery is not a first delivery: it adds nothing to the deliver latency.
        c.nack(7, 1, 2, None, true);
        assert_eq!(take(&mut c, 1_000_400), vec![(1, 2)]);
        c.fire_timers(t + Duration::from_millis(100), |_| {});
        // Due at 1 100 000 µs, delivered 30 µs later: its 100 ms delay is not latency.
        assert_eq!(take(&mut c, 1_100_030), vec![(2, 1)]);
        let deliver = c.latencies().deliver.to_latency();
        let one = |us: u64| latency_bucket(us) as u16;
        assert_eq!(deliver.buckets, vec![(one(30), 1), (one(250), 2)]);
        assert_eq!(deliver.sum_us, 530);

        assert_eq!(c.ack(7, 0, 3, 1_101_000, None), 3);
        let ack = c.latencies().ack.to_latency();
        // 0 and 1: published 101 ms before the ack (1 redelivered meanwhile); 2: due 1 ms before.
        assert_eq!(ack.buckets, vec![(one(1_000), 1), (one(101_000), 2)]);
        assert_eq!(ack.sum_us, 203_000);
        // An ack of what is no longer in flight records nothing.
        assert_eq!(c.ack(7, 0, 3, 1_200_000, None), 0);
        assert_eq!(c.latencies().ack.to_latency().count(), 3);
    }

    /// A log of records with the given keys and priorities, published at Unix ms 1000.
    fn keyed_log(messages: &[(Option<&str>, u8)]) -> MemoryLog {
        let mut log = MemoryLog::default();
        for (i, (key, priority)) in messages.iter().enumerate() {
            let message = ferrymq_protocol::Message {
                key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
                priority: *priority,
                ..ferrymq_protocol::Message::new(format!("m{i}"))
            };
            let batch = ferrymq_protocol::RecordBatch::from_messages(&[message]).unwrap();
            log.append(1_000_000, batch.bytes().clone());
        }
        log
    }

    fn ordered() -> CursorOptions {
        CursorOptions {
            ordered: true,
            ..opts(false, 5)
        }
    }

    fn offsets(got: Vec<(u64, u16)>) -> Vec<u64> {
        got.into_iter().map(|(o, _)| o).collect()
    }

    #[test]
    fn higher_priority_goes_first_and_equal_priority_keeps_publish_order() {
        let log = keyed_log(&[(None, 0), (None, 5), (None, 0), (None, 9), (None, 5)]);
        for auto_ack in [false, true] {
            let mut c = Cursor::new(1, opts(auto_ack, 5), 0);
            let got = offsets(take(&mut c, &log, 7, 2, Instant::now()));
            assert_eq!(got, vec![3, 1]);
            let got = offsets(take(&mut c, &log, 7, 10, Instant::now()));
            assert_eq!(got, vec![4, 0, 2]);
        }
    }

    #[test]
    fn a_redelivery_keeps_its_priority() {
        let log = keyed_log(&[(None, 0), (None, 0), (None, 7), (None, 0)]);
        let mut c = Cursor::new(1, opts(false, 5), 0);
        let t = Instant::now();
        assert_eq!(offsets(take(&mut c, &log, 7, 10, t)), vec![2, 0, 1, 3]);
        c.nack(7, 0, 4, None, true);
        assert_eq!(
            take(&mut c, &log, 7, 10, t),
            vec![(2, 2), (0, 2), (1, 2), (3, 2)]
        );
    }

    #[test]
    fn without_priorities_nothing_is_taken_ahead() {
        let log = log_of(100);
        let mut c = Cursor::new(1, opts(false, 5), 0);
        take(&mut c, &log, 7, 2, Instant::now());
        assert_eq!(c.slots.len(), 2, "the window holds only what was delivered");
        assert!(c.ready.is_empty());
    }

    #[test]
    fn ordered_keeps_one_message_per_key_in_flight_and_other_keys_flow() {
        // A0 A1 B0 A2 B1 C0 N0 N1 (N: no key)
        let log = keyed_log(&[
            (Some("a"), 0),
            (Some("a"), 0),
            (Some("b"), 0),
            (Some("a"), 0),
            (Some("b"), 0),
            (Some("c"), 0),
            (None, 0),
            (None, 0),
        ]);
        let mut c = Cursor::new(1, ordered(), 0);
        let t = Instant::now();
        assert_eq!(offsets(take(&mut c, &log, 7, 100, t)), vec![0, 2, 5, 6]);
        assert_eq!(c.backlog(8), 4, "A1, A2, B1 and N1 wait behind their keys");
        assert!(
            take(&mut c, &log, 8, 100, t).is_empty(),
            "another consumer gets none of them"
        );
        assert!(!c.has_ready(8));
        c.ack(7, 0, 1, 0, None);
        assert_eq!(c.take_promoted(), 1);
        assert_eq!(offsets(take(&mut c, &log, 8, 100, t)), vec![1]);
        // B0 comes back (nack): B1 still waits for it.
        c.nack(7, 2, 3, None, true);
        assert_eq!(take(&mut c, &log, 8, 100, t), vec![(2, 2)]);
        c.ack(8, 2, 3, 0, None);
        c.ack(7, 6, 7, 0, None);
        assert_eq!(offsets(take(&mut c, &log, 7, 100, t)), vec![4, 7]);
        c.ack(8, 1, 2, 0, None);
        assert_eq!(offsets(take(&mut c, &log, 7, 100, t)), vec![3]);
        c.ack(7, 0, 8, 0, None);
        assert_eq!(c.floor(), 8);
        assert!(c.ordered.as_ref().unwrap().keys.is_empty());
        assert!(c.ordered.as_ref().unwrap().owner_of.is_empty());
    }

    #[test]
    fn ordered_redelivery_after_a_timeout_keeps_the_key() {
        let log = keyed_log(&[(Some("a"), 0), (Some("a"), 0)]);
        let mut c = Cursor::new(1, ordered(), 0);
        let t0 = Instant::now();
        assert_eq!(take(&mut c, &log, 7, 10, t0), vec![(0, 1)]);
        c.fire_timers(t0, |_| {});
        // The late ack of the first delivery changes nothing; the redelivery goes first.
        assert_eq!(c.ack(7, 0, 1, 0, None), 0);
        assert_eq!(take(&mut c, &log, 8, 10, t0), vec![(0, 2)]);
        assert_eq!(c.ack(8, 0, 1, 0, None), 1);
        assert_eq!(take(&mut c, &log, 8, 10, t0), vec![(1, 1)]);
    }

    #[test]
    fn ordered_key_moves_on_when_its_message_is_given_up() {
        let log = keyed_log(&[(Some("a"), 0), (Some("a"), 0)]);
        let mut c = Cursor::new(
            1,
            CursorOptions {
                max_attempts: 1,
                ..ordered()
            },
            0,
        );
        let t = Instant::now();
        take(&mut c, &log, 7, 10, t);
        let r = c.nack(7, 0, 1, None, true);
        assert_eq!(r.gave_up, 1);
        assert_eq!(r.requeued, 1, "the next message of the key became ready");
        assert_eq!(offsets(take(&mut c, &log, 7, 10, t)), vec![1]);
        let mut c2 = Cursor::new(1, ordered(), 0);
        take(&mut c2, &log, 7, 10, t);
        assert_eq!(c2.give_up(7, 0, 1), 1);
        assert_eq!(offsets(take(&mut c2, &log, 7, 10, t)), vec![1]);
    }

    #[test]
    fn order_within_a_key_wins_over_priority() {
        // A0 (0), A1 (9), B0 (5)
        let log = keyed_log(&[(Some("a"), 0), (Some("a"), 9), (Some("b"), 5)]);
        let mut c = Cursor::new(1, ordered(), 0);
        let t = Instant::now();
        assert_eq!(offsets(take(&mut c, &log, 7, 10, t)), vec![2, 0]);
        c.ack(7, 0, 1, 0, None);
        assert_eq!(offsets(take(&mut c, &log, 7, 10, t)), vec![1]);
    }

    #[test]
    fn dropping_below_an_ordered_window_hands_the_key_on() {
        let log = keyed_log(&[(Some("a"), 0), (Some("a"), 0), (Some("a"), 0)]);
        let mut c = Cursor::new(1, ordered(), 0);
        let t = Instant::now();
        take(&mut c, &log, 7, 10, t);
        let mut freed = Vec::new();
        assert_eq!(
            c.drop_below(2, |who| freed.push(who)),
            1,
            "offset 1 was never received"
        );
        assert_eq!(freed, vec![7]);
        assert_eq!(offsets(take(&mut c, &log, 7, 10, t)), vec![2]);
    }

    #[test]
    fn status_tells_each_state_and_the_history_is_bounded() {
        let log = log_of(6);
        let mut c = Cursor::new(
            1,
            CursorOptions {
                history: 2,
                ..opts(false, 5)
            },
            0,
        );
        let t = Instant::now();
        let clock = DeliverClock {
            now: t,
            unix_us: 5_000_000,
            deadline: t + Duration::from_secs(30),
        };
        c.deliver(&log, 7, &limits(4), &clock, |_, _, _, _| {});
        c.ack(7, 0, 1, 6_000_000, Some(b"done"));
        c.nack(7, 2, 3, Some((t + Duration::from_secs(9), 14_000)), true);
        let e = c.entry(0, 6).unwrap();
        assert_eq!(e.state, MessageState::Acked);
        assert_eq!(&e.result[..], b"done");
        assert_eq!(
            (e.attempts, e.first_delivered_ms, e.settled_ms),
            (1, 5_000, 6_000)
        );
        let e = c.entry(1, 6).unwrap();
        assert_eq!((e.state, e.due_ms), (MessageState::InFlight, 35_000));
        let e = c.entry(2, 6).unwrap();
        assert_eq!(
            (e.state, e.due_ms, e.attempts),
            (MessageState::Delayed, 14_000, 1)
        );
        assert_eq!(c.entry(5, 6).unwrap().state, MessageState::Pending);
        assert!(c.entry(6, 6).is_none());

        let (pending, more) = c.list_window(false, 0, 2, 6);
        assert_eq!(
            pending.iter().map(|e| e.offset).collect::<Vec<_>>(),
            vec![2, 4]
        );
        assert_eq!(more, Some(5));
        let (pending, more) = c.list_window(false, 5, 2, 6);
        assert_eq!(
            pending.iter().map(|e| e.offset).collect::<Vec<_>>(),
            vec![5]
        );
        assert_eq!(more, None);
        let (flying, _) = c.list_window(true, 0, 10, 6);
        assert_eq!(
            flying.iter().map(|e| e.offset).collect::<Vec<_>>(),
            vec![1, 3]
        );

        c.ack(7, 1, 2, 7_000, None);
        c.ack(7, 3, 4, 8_000, None);
        let history: Vec<u64> = c.history(false).iter().map(|e| e.offset).collect();
        assert_eq!(history, vec![3, 1], "newest first, two kept");
        assert_eq!(c.entry(0, 6).unwrap().state, MessageState::Settled);

        c.fire_timers(t + Duration::from_secs(9), |_| {});
        take(&mut c, &log, 7, 1, t);
        assert_eq!(c.give_up(7, 2, 3), 1);
        assert_eq!(c.entry(2, 6).unwrap().state, MessageState::DeadLettered);
        assert!(c.settle_dead(2, 9_000, "bad input", Some((0, 41))));
        let e = c.entry(2, 6).unwrap();
        assert_eq!(
            (e.state, e.attempts, e.settled_ms),
            (MessageState::DeadLettered, 2, 9_000)
        );
        assert_eq!(
            (e.reason.as_str(), e.dead_letter),
            ("bad input", Some((0, 41)))
        );
        assert_eq!(c.history(true).len(), 1);
    }

    #[test]
    fn the_history_survives_its_encoding_and_refuses_garbage() {
        let log = log_of(4);
        let mut c = Cursor::new(1, opts(false, 5), 0);
        let t = Instant::now();
        take(&mut c, &log, 7, 4, t);
        c.ack(7, 0, 1, 100_000, Some(b"ok"));
        c.ack(7, 1, 2, 200_999, None);
        c.give_up(7, 2, 3);
        c.settle_dead(2, 300, "bad", Some((0, 9)));
        let saved = c.encode_history();
        let mut r = Cursor::restore(1, opts(false, 5), 3, &[], 0, 4);
        assert!(r.restore_history(&saved));
        assert_eq!(r.encode_history(), saved);
        let e = r.entry(0, 4).unwrap();
        assert_eq!(
            (e.state, &e.result[..], e.settled_ms),
            (MessageState::Acked, &b"ok"[..], 100)
        );
        let e = r.entry(2, 4).unwrap();
        assert_eq!(
            (e.state, e.reason.as_str()),
            (MessageState::DeadLettered, "bad")
        );
        for cut in 0..saved.len() {
            assert!(!r.restore_history(&saved[..cut]), "cut at {cut}");
        }
        let mut longer = saved.clone();
        longer.push(0);
        assert!(!r.restore_history(&longer));
    }

    #[test]
    fn a_requeued_dead_letter_goes_only_to_its_subscription() {
        let mut log = MemoryLog::default();
        for target in [None, Some("other"), Some("s")] {
            let mut message = ferrymq_protocol::Message::new("x");
            if let Some(target) = target {
                message
                    .headers
                    .push((crate::dead_letter::HEADER_REQUEUE_FOR.into(), target.into()));
            }
            let batch = ferrymq_protocol::RecordBatch::from_messages(&[message]).unwrap();
            log.append(1_000_000, batch.bytes().clone());
        }
        let mut c = Cursor::new(1, opts(false, 5), 0);
        assert_eq!(
            offsets(take(&mut c, &log, 7, 10, Instant::now())),
            vec![0, 2]
        );
        let mut other = Cursor::new(
            2,
            CursorOptions {
                name: "other".into(),
                ..opts(false, 5)
            },
            0,
        );
        assert_eq!(
            offsets(take(&mut other, &log, 7, 10, Instant::now())),
            vec![0, 1]
        );
        other.ack(7, 0, 2, 0, None);
        assert_eq!(other.floor(), 3, "the one meant for 's' is settled here");
    }

    #[test]
    fn a_restored_cursor_keeps_its_settled_runs_until_it_passes_them() {
        let r = Cursor::restore(1, opts(false, 5), 2, &[(4, 6), (8, 9)], 0, 10);
        assert_eq!(r.settled_runs(), vec![(4, 6), (8, 9)]);
        let r2 = Cursor::restore(1, opts(false, 5), r.floor(), &r.settled_runs(), 0, 10);
        assert_eq!(r2.settled_runs(), vec![(4, 6), (8, 9)]);
    }

    #[test]
    fn a_restored_cursor_delivers_by_priority_again() {
        let log = keyed_log(&[(None, 0), (None, 0), (None, 9)]);
        let mut c = Cursor::restore(1, opts(false, 5), 0, &[(1, 2)], 0, 3);
        assert_eq!(
            offsets(take(&mut c, &log, 7, 10, Instant::now())),
            vec![2, 0]
        );
    }
}
