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
//! - `deadlines` holds one entry per delivery, in delivery order; every in-flight slot has the
//!   entry of its delivery (same offset, attempt and ack deadline). An entry whose slot is no
//!   longer in flight under the same attempt and ack deadline is stale and skipped (a release
//!   takes its attempt back, so the next delivery can carry the same attempt). Deadlines never
//!   decrease as long as the caller passes one ack timeout and a clock that does not go back (the
//!   broker does): [`Cursor::fire_timers`] stops at the first deadline ahead.
//! - An in-flight slot has at least one attempt. An auto-ack cursor holds nothing in flight, and
//!   nothing blocked or given up.
//! - Without a window (`floor == next`) there are no timers.
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
//!   A key's queue ascends; its offsets below the floor (dropped by the log) are stale and
//!   skipped. A given-up message revived because its record could not be taken
//!   ([`Cursor::revive_dead`]) is ready out of turn: its key had moved on.
//! - After a restart (`restore`), `next` starts again at the floor and the saved settled runs
//!   above it (`restored`) are skipped as the cursor passes them, so priorities and keys are
//!   known again for everything it delivers. Saved delivery states (`restore_delivery`: attempts
//!   made, a nack's delay) wait in `restored_delivery` and apply when their offset enters the
//!   window again; only offsets at or above `next` are kept there.
//!   The saved runs ascend without overlap, and `restored_left` is their size at or above
//!   `next`.
//! - The status history keeps at most `history` acked and `history` dead-lettered entries.
//!
//! [`Cursor::check_invariants`] asserts these after every mutating method in debug builds and
//! tests; `model.rs` drives random histories against a model of what each consumer holds.
//!
//! The window `floor .. next` is bounded by the partition's retained log, which is bounded by the
//! topic's limits; in-flight slots are further bounded per consumer by the broker, and the slots
//! an ordered cursor blocks by [`ORDERED_WINDOW_MAX`].

mod deliver;
mod history;
mod invariants;
#[cfg(test)]
mod model;
mod ordered;
mod restore;
mod settle;
#[cfg(test)]
mod tests;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use ferrymq_protocol::limits::PRIORITY_MAX;
use ferrymq_protocol::{MessageEntry, MessageState};
use tokio::time::Instant;

use crate::latency::{decode_lag, encode_lag, Latencies};
use crate::log::RecordSource;

pub(crate) use deliver::{DeliverClock, DeliverLimits, Delivered};
use history::{AckedEntry, DeadEntry};
use ordered::{KeyId, Ordered};
pub(crate) use restore::DeliveryState;
pub(crate) use settle::{GivenUp, Released};

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
        let cursor = Cursor {
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
        };
        cursor.debug_check();
        cursor
    }

    /// Asserts the invariants after a mutation in debug builds and tests; nothing in release
    /// builds, where a delivery pass must not walk the window twice.
    #[inline(always)]
    fn debug_check(&self) {
        #[cfg(debug_assertions)]
        self.check_invariants();
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
    /// The next offset this cursor takes into its window.
    pub fn next_offset(&self) -> u64 {
        self.next
    }

    pub fn has_ready(&self, log_next: u64) -> bool {
        !self.ready.is_empty() || self.next < log_next
    }

    pub fn has_timers(&self) -> bool {
        !self.deadlines.is_empty() || !self.delayed.is_empty()
    }

    /// Messages of an ordered cursor whose turn came since the last call: consumers waiting for
    /// something to poll should be woken.
    pub fn take_promoted(&mut self) -> u64 {
        self.debug_check();
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

    /// Makes the slot of `offset` a delayed one, due at `due`.
    fn hold(&mut self, offset: u64, (due, due_ms): (Instant, u64)) {
        let slot = self
            .slot_mut(offset)
            .expect("held offset inside the window");
        slot.state = SlotState::Delayed;
        slot.until_ms = due_ms;
        self.delayed.push(Reverse((due, offset)));
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
        self.debug_check();
        lost
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
        self.debug_check();
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
}
