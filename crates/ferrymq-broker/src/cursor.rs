//! The delivery scheduler of one subscription on one partition.
//!
//! A cursor is plain state, driven under its partition's lock and free of I/O and clocks (callers
//! pass `now`), so every rule can be tested directly.
//!
//! Invariants:
//! - Every offset below `floor` is settled for this subscription (acked, given up, or dropped by
//!   the topic's overflow policy). `next` is the first offset never delivered.
//! - `slots[i]` holds the state of offset `floor + i` for every offset in `floor .. next`; the
//!   front slot is never `Settled` after [`Cursor::advance_floor`].
//! - `ready` holds exactly the offsets whose slot is `Ready`; `in_flight` counts the `InFlight`
//!   slots; a `Delayed` slot has one entry in `delayed`.
//! - `deadlines` holds one entry per delivery, in delivery order, so deadlines never decrease; an
//!   entry whose slot is no longer in flight under the same attempt is stale and skipped.
//! - Auto-ack cursors keep slots only while a delayed message is pending (then every later
//!   delivered message is a settled slot); without one, `floor == next`.
//! - A message whose `deliver_after_ms` has not passed is never delivered: when the cursor
//!   reaches it (or finds it ready before its first delivery, after a restart) it becomes a
//!   delayed slot due at its publish time plus its delay.
//!
//! The window `floor .. next` is bounded by the partition's retained log, which is bounded by the
//! topic's limits; in-flight slots are further bounded per consumer by the broker.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, VecDeque};

use bytes::Bytes;
use tokio::time::Instant;

use crate::log::RecordSource;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Ready,
    InFlight,
    Delayed,
    /// Given up after `max_attempts`: on its way to the dead-letter topic, settled once it is
    /// stored there (so a crash in between delivers it again rather than losing it).
    Dead,
    Settled,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    state: SlotState,
    /// Deliveries so far.
    attempt: u16,
    consumer: u64,
}

/// Most delayed messages one delivery pass sets aside before it returns.
const HOLD_PER_PASS_MAX: u32 = 4096;

/// The time of a delivery pass.
pub(crate) struct DeliverClock {
    pub now: Instant,
    /// The same moment as Unix milliseconds, to compare with publish times.
    pub unix_ms: u64,
    /// When what is delivered now must be acked.
    pub deadline: Instant,
}

impl DeliverClock {
    /// When a message with a `deliver_after_ms` that has not passed yet is due; `None` if it
    /// can go now.
    fn due(&self, stored: &crate::log::Stored) -> Option<Instant> {
        let delay = ferrymq_protocol::record_deliver_after_ms(&stored.record)?;
        let due_ms = stored.timestamp_ms.saturating_add(delay);
        (due_ms > self.unix_ms)
            .then(|| self.now + std::time::Duration::from_millis(due_ms - self.unix_ms))
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
    /// became due.
    pub requeued: u64,
    /// Given up after `max_attempts`.
    pub gave_up: u64,
}

pub(crate) struct Cursor {
    pub sub_id: u64,
    auto_ack: bool,
    /// Deliveries after which a message is given up instead of made ready again.
    max_attempts: u32,
    floor: u64,
    next: u64,
    slots: VecDeque<Slot>,
    ready: BTreeSet<u64>,
    deadlines: VecDeque<(Instant, u64, u16)>,
    delayed: BinaryHeap<Reverse<(Instant, u64)>>,
    in_flight: u64,
    /// Offsets given up since the owner last took them, with their attempts.
    dead_new: Vec<(u64, u16)>,
}

impl Cursor {
    pub fn new(sub_id: u64, auto_ack: bool, max_attempts: u32, start: u64) -> Self {
        assert!(max_attempts >= 1);
        Cursor {
            sub_id,
            auto_ack,
            max_attempts,
            floor: start,
            next: start,
            slots: VecDeque::new(),
            ready: BTreeSet::new(),
            deadlines: VecDeque::new(),
            delayed: BinaryHeap::new(),
            in_flight: 0,
            dead_new: Vec::new(),
        }
    }

    pub fn floor(&self) -> u64 {
        self.floor
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Messages waiting for a consumer: never delivered, or ready again, or delayed.
    pub fn backlog(&self, log_next: u64) -> u64 {
        log_next.saturating_sub(self.next) + self.ready.len() as u64 + self.delayed.len() as u64
    }

    /// True when a consumer polling now could get something.
    pub fn has_ready(&self, log_next: u64) -> bool {
        !self.ready.is_empty() || self.next < log_next
    }

    pub fn has_timers(&self) -> bool {
        !self.deadlines.is_empty() || !self.delayed.is_empty()
    }

    fn slot_mut(&mut self, offset: u64) -> Option<&mut Slot> {
        offset
            .checked_sub(self.floor)
            .and_then(|i| self.slots.get_mut(i as usize))
    }

    /// Hands messages to `consumer`: redeliveries first (lowest offset first), then new ones.
    /// `emit(offset, timestamp_ms, attempt, record)` is called for each.
    pub fn deliver(
        &mut self,
        log: &impl RecordSource,
        consumer: u64,
        limits: &DeliverLimits,
        clock: &DeliverClock,
        mut emit: impl FnMut(u64, u64, u16, &Bytes),
    ) -> Delivered {
        let deadline = clock.deadline;
        let mut out = Delivered::default();
        let count_max = if self.auto_ack {
            limits.count_max
        } else {
            limits.count_max.min(limits.in_flight_room)
        };
        let fits = |out: &Delivered, len: usize| {
            out.count < count_max
                && (out.count == 0 || out.bytes as usize + len <= limits.bytes_max)
        };

        while let Some(&offset) = self.ready.first() {
            let Some(stored) = log.get(offset) else {
                // Below the log head only if the source could not provide it (a disk read
                // stopped early); it stays ready for the next pass.
                return out;
            };
            let first_delivery = self.slot_mut(offset).is_some_and(|slot| slot.attempt == 0);
            if first_delivery {
                if let Some(due) = clock.due(stored) {
                    self.ready.pop_first();
                    self.hold(offset, due);
                    continue;
                }
            }
            if !fits(&out, stored.record.len()) {
                return out;
            }
            self.ready.pop_first();
            let auto_ack = self.auto_ack;
            let slot = self
                .slot_mut(offset)
                .expect("ready offset inside the window");
            assert_eq!(slot.state, SlotState::Ready);
            slot.attempt = slot.attempt.saturating_add(1);
            let attempt = slot.attempt;
            if auto_ack {
                slot.state = SlotState::Settled;
            } else {
                slot.state = SlotState::InFlight;
                slot.consumer = consumer;
                self.in_flight += 1;
                self.deadlines.push_back((deadline, offset, attempt));
            }
            emit(offset, stored.timestamp_ms, attempt, &stored.record);
            out.count += 1;
            out.bytes += stored.record.len() as u64;
            out.redelivered += 1;
        }

        let mut held = 0;
        while let Some(stored) = log.get(self.next) {
            let offset = self.next;
            if let Some(due) = clock.due(stored) {
                // Not yet due: held as a delayed slot, and the messages behind it flow on. A
                // pass holds a bounded number, so a long run of delayed messages is taken in
                // steps rather than under one long lock.
                if held == HOLD_PER_PASS_MAX {
                    break;
                }
                held += 1;
                self.next += 1;
                self.slots.push_back(Slot {
                    state: SlotState::Ready,
                    attempt: 0,
                    consumer: 0,
                });
                self.hold(offset, due);
                continue;
            }
            if !fits(&out, stored.record.len()) {
                break;
            }
            self.next += 1;
            if self.auto_ack {
                if self.slots.is_empty() {
                    self.floor = self.next;
                } else {
                    self.slots.push_back(Slot {
                        state: SlotState::Settled,
                        attempt: 1,
                        consumer,
                    });
                }
            } else {
                self.slots.push_back(Slot {
                    state: SlotState::InFlight,
                    attempt: 1,
                    consumer,
                });
                self.in_flight += 1;
                self.deadlines.push_back((deadline, offset, 1));
            }
            emit(offset, stored.timestamp_ms, 1, &stored.record);
            out.count += 1;
            out.bytes += stored.record.len() as u64;
        }
        self.advance_floor();
        out
    }

    /// Gives up the offsets in `start .. end` in flight to `consumer` at once (the consumer asked
    /// for their dead-lettering). Returns how many, with `on_released` per message's consumer.
    pub fn give_up(&mut self, consumer: u64, start: u64, end: u64) -> u64 {
        let (from, to) = (start.max(self.floor), end.min(self.next));
        let mut n = 0;
        for offset in from..to {
            let slot = &mut self.slots[(offset - self.floor) as usize];
            if slot.state == SlotState::InFlight && slot.consumer == consumer {
                slot.state = SlotState::Dead;
                let attempt = slot.attempt;
                self.dead_new.push((offset, attempt));
                self.in_flight -= 1;
                n += 1;
            }
        }
        n
    }

    /// The offsets given up (with their attempts) since the last call: the owner moves them to
    /// the dead-letter topic, then calls [`Cursor::settle_dead`] (or [`Cursor::revive_dead`]).
    pub fn take_dead(&mut self) -> Vec<(u64, u16)> {
        std::mem::take(&mut self.dead_new)
    }

    /// A dead letter is stored: its message is settled here. False if it no longer was dead
    /// (dropped by retention meanwhile).
    pub fn settle_dead(&mut self, offset: u64) -> bool {
        match self.slot_mut(offset) {
            Some(slot) if slot.state == SlotState::Dead => {
                slot.state = SlotState::Settled;
                self.advance_floor();
                true
            }
            _ => false,
        }
    }

    /// A dead letter could not be taken (its record could not be read): the message is made
    /// ready again, and given up again after its next delivery.
    pub fn revive_dead(&mut self, offset: u64) {
        if let Some(slot) = self.slot_mut(offset) {
            if slot.state == SlotState::Dead {
                slot.state = SlotState::Ready;
                self.ready.insert(offset);
            }
        }
    }

    /// Makes the (ready) slot of `offset` a delayed one, due at `due`.
    fn hold(&mut self, offset: u64, due: Instant) {
        let slot = self
            .slot_mut(offset)
            .expect("held offset inside the window");
        slot.state = SlotState::Delayed;
        self.delayed.push(Reverse((due, offset)));
    }

    /// Settles the offsets in `start .. end` that are in flight to `consumer`; anything else in
    /// the range (already settled, redelivered to another consumer) is ignored. Returns how many
    /// were acked.
    pub fn ack(&mut self, consumer: u64, start: u64, end: u64) -> u64 {
        let (from, to) = (start.max(self.floor), end.min(self.next));
        let mut acked = 0;
        for offset in from..to {
            let slot = &mut self.slots[(offset - self.floor) as usize];
            if slot.state == SlotState::InFlight && slot.consumer == consumer {
                slot.state = SlotState::Settled;
                acked += 1;
            }
        }
        self.in_flight -= acked;
        self.advance_floor();
        acked
    }

    /// Gives the offsets in `start .. end` in flight to `consumer` back: ready at once when `due`
    /// is `None`, else at `due`.
    pub fn nack(&mut self, consumer: u64, start: u64, end: u64, due: Option<Instant>) -> Released {
        let (from, to) = (start.max(self.floor), end.min(self.next));
        let mut out = Released::default();
        for offset in from..to {
            let slot = self.slots[(offset - self.floor) as usize];
            if slot.state == SlotState::InFlight && slot.consumer == consumer {
                self.release(offset, due, &mut out);
            }
        }
        self.advance_floor();
        out
    }

    /// Returns every message in flight to `consumer` (it left). Calls `on_release` per message.
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

    fn release(&mut self, offset: u64, due: Option<Instant>, out: &mut Released) {
        let max_attempts = self.max_attempts;
        let slot = self
            .slot_mut(offset)
            .expect("released offset inside the window");
        debug_assert_eq!(slot.state, SlotState::InFlight);
        if slot.attempt as u32 >= max_attempts {
            slot.state = SlotState::Dead;
            let attempt = slot.attempt;
            self.dead_new.push((offset, attempt));
            out.gave_up += 1;
        } else if let Some(due) = due {
            slot.state = SlotState::Delayed;
            self.delayed.push(Reverse((due, offset)));
            out.requeued += 1;
        } else {
            slot.state = SlotState::Ready;
            self.ready.insert(offset);
            out.requeued += 1;
        }
        self.in_flight -= 1;
    }

    /// Moves expired deliveries back to ready and due delayed messages to ready. `on_expired`
    /// receives the consumer of each expired delivery so its in-flight count can be lowered.
    pub fn fire_timers(&mut self, now: Instant, mut on_expired: impl FnMut(u64)) -> Released {
        let mut out = Released::default();
        while let Some(&(deadline, offset, attempt)) = self.deadlines.front() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_front();
            let Some(slot) = self.slot_mut(offset) else {
                continue;
            };
            if slot.state != SlotState::InFlight || slot.attempt != attempt {
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
            if let Some(slot) = self.slot_mut(offset) {
                if slot.state == SlotState::Delayed {
                    slot.state = SlotState::Ready;
                    self.ready.insert(offset);
                    out.requeued += 1;
                }
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
            let slot = self.slots.pop_front().expect("checked non-empty");
            match slot.state {
                SlotState::Settled => {}
                SlotState::InFlight => {
                    on_in_flight(slot.consumer);
                    self.in_flight -= 1;
                }
                SlotState::Ready => {
                    self.ready.remove(&self.floor);
                    lost += 1;
                }
                SlotState::Delayed => lost += 1, // its heap entry is skipped as stale
                // Its record was taken when it was given up; its dead letter goes on.
                SlotState::Dead => {}
            }
            self.floor += 1;
        }
        if self.next < head {
            lost += head - self.next;
            self.next = head;
        }
        self.floor = self.floor.max(head);
        self.advance_floor();
        lost
    }

    /// The offsets the next delivery pass of up to `count_max` messages would read, for sources
    /// that must fetch them first: ready offsets (lowest first), then new ones from `next`, below
    /// `below` (where the source's in-memory part begins) and `end` (the visible end).
    pub fn wanted(&self, count_max: u32, below: u64, end: u64) -> (Vec<u64>, std::ops::Range<u64>) {
        let ready: Vec<u64> = self
            .ready
            .iter()
            .copied()
            .take_while(|&o| o < below)
            .take(count_max as usize)
            .collect();
        let rest = (count_max as u64).saturating_sub(self.ready.len() as u64);
        let start = self.next;
        let stop = below.min(end).min(start.saturating_add(rest));
        (ready, start..stop.max(start))
    }

    /// The settled offsets at or above the floor, as `(start, end)` runs: with the floor, the
    /// state a restart needs (everything else in the window is delivered again).
    pub fn settled_runs(&self) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            if slot.state != SlotState::Settled {
                continue;
            }
            let offset = self.floor + i as u64;
            match runs.last_mut() {
                Some(last) if last.1 == offset => last.1 += 1,
                _ => runs.push((offset, offset + 1)),
            }
        }
        runs
    }

    /// A cursor restored after a restart: everything below `floor` and in `settled` is settled,
    /// every other offset up to the last settled one is ready for delivery, and delivery of new
    /// messages resumes after it. `floor` and the runs are clamped to the log's `start .. end`
    /// (a log that lost its unsynced tail, or retention, may have moved either).
    pub fn restore(
        sub_id: u64,
        auto_ack: bool,
        max_attempts: u32,
        floor: u64,
        settled: &[(u64, u64)],
        start: u64,
        end: u64,
    ) -> Self {
        let floor = floor.clamp(start, end);
        let mut cursor = Cursor::new(sub_id, auto_ack, max_attempts, floor);
        if auto_ack {
            return cursor;
        }
        let top = settled
            .iter()
            .map(|&(_, e)| e)
            .max()
            .unwrap_or(floor)
            .clamp(floor, end);
        let mut runs: Vec<(u64, u64)> = settled.to_vec();
        runs.sort_unstable();
        let mut run = runs.iter().peekable();
        for offset in floor..top {
            while run.peek().is_some_and(|&&(_, e)| e <= offset) {
                run.next();
            }
            let is_settled = run.peek().is_some_and(|&&(s, _)| s <= offset);
            let state = if is_settled {
                SlotState::Settled
            } else {
                cursor.ready.insert(offset);
                SlotState::Ready
            };
            cursor.slots.push_back(Slot {
                state,
                attempt: 0,
                consumer: 0,
            });
        }
        cursor.next = top;
        cursor.advance_floor();
        cursor
    }

    /// The log lost everything from `end` on (a disk log reopened after a failed sync found less
    /// than was written): forget those offsets. Returns how many were in flight, through
    /// `on_in_flight` per consumer.
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
                    self.ready.remove(&self.next);
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
        while let Some(&(_, offset, _)) = self.deadlines.front() {
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::log::MemoryLog;

    fn log_of(n: u64) -> MemoryLog {
        let mut log = MemoryLog::default();
        for i in 0..n {
            log.append(i, Bytes::from(format!("m{i}")));
        }
        log
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
            unix_ms: 0,
            deadline: t,
        }
    }

    #[test]
    fn delivers_in_order_and_acks_advance_the_floor() {
        let log = log_of(5);
        let mut c = Cursor::new(1, false, 5, 0);
        let t = Instant::now();
        assert_eq!(take(&mut c, &log, 7, 3, t), vec![(0, 1), (1, 1), (2, 1)]);
        assert_eq!(c.in_flight(), 3);
        assert_eq!(c.backlog(log.next_offset()), 2);
        assert_eq!(c.ack(7, 1, 2), 1);
        assert_eq!(c.floor(), 0, "offset 0 still in flight");
        assert_eq!(c.ack(7, 0, 1), 1);
        assert_eq!(c.floor(), 2);
        assert_eq!(c.ack(7, 0, 3), 1);
        assert_eq!(c.floor(), 3);
        assert_eq!(c.in_flight(), 0);
    }

    #[test]
    fn ack_from_another_consumer_or_twice_is_ignored() {
        let log = log_of(2);
        let mut c = Cursor::new(1, false, 5, 0);
        take(&mut c, &log, 7, 2, Instant::now());
        assert_eq!(c.ack(8, 0, 2), 0);
        assert_eq!(c.ack(7, 0, 1), 1);
        assert_eq!(c.ack(7, 0, 1), 0);
        assert_eq!(c.ack(7, 0, u64::MAX), 1);
        assert_eq!(c.in_flight(), 0);
    }

    #[test]
    fn expired_deliveries_come_back_with_the_next_attempt_first() {
        let log = log_of(4);
        let mut c = Cursor::new(1, false, 5, 0);
        let t0 = Instant::now();
        take(&mut c, &log, 7, 2, t0 + Duration::from_millis(100));
        c.ack(7, 1, 2);
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
        assert_eq!(c.ack(7, 0, 1), 0, "the old consumer's ack no longer counts");
        assert_eq!(c.ack(8, 0, 1), 1);
    }

    #[test]
    fn a_late_ack_after_timeout_and_redelivery_does_not_settle_the_new_delivery() {
        let log = log_of(1);
        let mut c = Cursor::new(1, false, 5, 0);
        let t0 = Instant::now();
        take(&mut c, &log, 7, 1, t0);
        c.fire_timers(t0, |_| {});
        take(&mut c, &log, 7, 1, t0 + Duration::from_secs(1));
        // Same consumer got it again: an ack now settles the current delivery, once.
        assert_eq!(c.ack(7, 0, 1), 1);
        assert_eq!(
            c.fire_timers(t0 + Duration::from_secs(5), |_| {}),
            Released::default()
        );
        assert_eq!(c.backlog(log.next_offset()), 0);
    }

    #[test]
    fn gives_up_after_max_attempts() {
        let log = log_of(1);
        let mut c = Cursor::new(1, false, 3, 0);
        let t0 = Instant::now();
        for attempt in 1..=3u16 {
            assert_eq!(take(&mut c, &log, 7, 1, t0), vec![(0, attempt)]);
            let r = c.nack(7, 0, 1, None);
            if attempt < 3 {
                assert_eq!(r.requeued, 1);
            } else {
                assert_eq!(r.gave_up, 1);
            }
        }
        // On its way to the dead-letter topic: not delivered again, not yet settled.
        assert!(take(&mut c, &log, 7, 1, t0).is_empty());
        assert_eq!(c.floor(), 0);
        assert_eq!(c.take_dead(), vec![(0, 3)]);
        assert!(c.take_dead().is_empty());
        assert!(c.settle_dead(0));
        assert_eq!(c.floor(), 1);
        assert!(!c.settle_dead(0));
    }

    #[test]
    fn delayed_nack_waits_for_its_due_time() {
        let log = log_of(1);
        let mut c = Cursor::new(1, false, 5, 0);
        let t0 = Instant::now();
        take(&mut c, &log, 7, 1, t0 + Duration::from_secs(60));
        c.nack(7, 0, 1, Some(t0 + Duration::from_secs(2)));
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
        let mut c = Cursor::new(1, false, 5, 0);
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
        let mut c = Cursor::new(1, false, 5, 0);
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
        let mut c = Cursor::new(1, true, 5, 0);
        assert_eq!(take(&mut c, &log, 7, 10, Instant::now()).len(), 3);
        assert_eq!(c.floor(), 3);
        assert_eq!(c.in_flight(), 0);
        assert!(!c.has_timers());
    }

    #[test]
    fn dropping_below_the_floor_loses_unsettled_messages_and_frees_in_flight() {
        let log = log_of(6);
        let mut c = Cursor::new(1, false, 5, 0);
        let t = Instant::now();
        take(&mut c, &log, 7, 2, t);
        c.ack(7, 0, 1);
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
        let mut c = Cursor::new(1, false, 5, 0);
        let t = Instant::now();
        take(&mut c, &log, 7, 8, t);
        c.ack(7, 0, 2);
        c.ack(7, 3, 4);
        c.ack(7, 5, 7);
        assert_eq!(c.floor(), 2);
        assert_eq!(c.settled_runs(), vec![(3, 4), (5, 7)]);
        let mut r = Cursor::restore(1, false, 5, c.floor(), &c.settled_runs(), 0, 10);
        assert_eq!(r.floor(), 2);
        let got: Vec<u64> = take(&mut r, &log, 9, 100, t).iter().map(|g| g.0).collect();
        assert_eq!(got, vec![2, 4, 7, 8, 9]);
    }

    #[test]
    fn a_restored_cursor_is_clamped_to_what_the_log_holds() {
        // The log lost its tail (8..) and retention moved its start to 3.
        let r = Cursor::restore(1, false, 5, 1, &[(5, 12)], 3, 8);
        assert_eq!(r.floor(), 3);
        assert_eq!(r.backlog(8), 2, "3 and 4 are ready, 5..8 settled");
        let r = Cursor::restore(1, false, 5, 20, &[], 3, 8);
        assert_eq!(r.floor(), 8);
    }

    #[test]
    fn truncating_forgets_offsets_beyond_the_new_end() {
        let log = log_of(10);
        let mut c = Cursor::new(1, false, 5, 0);
        take(&mut c, &log, 7, 10, Instant::now());
        c.ack(7, 0, 3);
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
            log.append(1000, batch.bytes().clone());
        }
        log
    }

    fn deliver_at(c: &mut Cursor, log: &MemoryLog, now: Instant, unix_ms: u64) -> Vec<(u64, u16)> {
        let clock = DeliverClock {
            now,
            unix_ms,
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
            let mut c = Cursor::new(1, auto_ack, 5, 0);
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
                c.ack(7, 0, 4);
                assert_eq!(c.floor(), 4);
            }
            assert!(!c.has_timers());
        }
    }

    #[test]
    fn a_restored_cursor_keeps_a_delay_that_has_not_passed() {
        let log = delayed_log(&[None, Some(1000), None]);
        // Offset 0 was settled, 1 held, 2 settled before the restart.
        let mut c = Cursor::restore(1, false, 5, 0, &[(0, 1), (2, 3)], 0, 3);
        let t = Instant::now();
        assert!(deliver_at(&mut c, &log, t, 1500).is_empty());
        assert!(c.has_timers());
        c.fire_timers(t + Duration::from_millis(500), |_| {});
        assert_eq!(deliver_at(&mut c, &log, t, 2000), vec![(1, 1)]);
    }
}
