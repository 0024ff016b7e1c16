//! The module doc's invariants as code: [`Cursor::check_invariants`] asserts them, and every
//! mutating method ends by calling it in debug builds and tests, so a broken rule fails where it
//! breaks rather than as a wrong delivery later.

use super::*;

/// Windows up to this many slots are checked whole after every mutation; beyond it only the
/// checks that cost nothing per slot run. A debug broker under an integration test's load keeps
/// windows of many thousand messages, and a walk over all of them after every ack would make
/// those tests quadratic; the unit and model tests stay far below this.
const CHECK_SLOTS_MAX: usize = 4096;

impl Cursor {
    /// Panics, naming the rule, when the cursor's state breaks an invariant of the module doc.
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    pub(super) fn check_invariants(&self) {
        let window = self.next.checked_sub(self.floor);
        assert_eq!(
            window,
            Some(self.slots.len() as u64),
            "slots cover floor..next"
        );
        if self.slots.is_empty() {
            assert!(
                self.deadlines.is_empty() && self.delayed.is_empty(),
                "no timers without a window"
            );
        }
        if let Some(front) = self.slots.front() {
            assert_ne!(
                front.state,
                SlotState::Settled,
                "the front slot is unsettled"
            );
        }
        assert!(
            self.acked.len() <= self.options.history && self.dead.len() <= self.options.history,
            "the history keeps at most its size"
        );
        assert_eq!(
            self.ordered.is_some(),
            self.options.ordered,
            "ordered state exactly for ordered cursors"
        );
        self.check_restored();
        if self.slots.len() > CHECK_SLOTS_MAX || self.deadlines.len() > 4 * CHECK_SLOTS_MAX {
            return;
        }
        self.check_slots();
        self.check_timers();
        self.check_ordered();
    }

    /// `ready` holds exactly the ready slots under their rank; `in_flight` counts the in-flight
    /// slots; an auto-ack cursor holds none in flight.
    fn check_slots(&self) {
        let mut ready = 0;
        let mut in_flight = 0;
        for (i, slot) in self.slots.iter().enumerate() {
            let offset = self.floor + i as u64;
            assert!(slot.priority <= PRIORITY_MAX, "priority within range");
            match slot.state {
                SlotState::Ready => {
                    ready += 1;
                    let rank = PRIORITY_MAX - slot.priority;
                    assert!(
                        self.ready.contains(&(rank, offset)),
                        "ready slot {offset} is in `ready` under its priority"
                    );
                }
                SlotState::InFlight => {
                    in_flight += 1;
                    assert!(slot.attempt >= 1, "in flight {offset} counts its delivery");
                }
                SlotState::Blocked | SlotState::Dead => assert!(
                    !self.options.auto_ack,
                    "auto-ack cursors neither block nor give up"
                ),
                SlotState::Delayed | SlotState::Settled => {}
            }
        }
        assert_eq!(ready, self.ready.len(), "`ready` holds only ready slots");
        assert_eq!(
            in_flight, self.in_flight,
            "`in_flight` counts in-flight slots"
        );
        assert!(
            !(self.options.auto_ack && in_flight > 0),
            "auto-ack cursors hold nothing in flight"
        );
    }

    /// Every in-flight slot has the deadline entry of its delivery; every delayed slot has an
    /// entry in `delayed`. (That deadlines never decrease is the caller's to keep, with one ack
    /// timeout and a clock that does not go back: see [`Cursor::deadlines_ascend`].)
    fn check_timers(&self) {
        let live: BTreeSet<(u64, u16, u64)> = self
            .deadlines
            .iter()
            .map(|&(_, offset, attempt, until_ms)| (offset, attempt, until_ms))
            .collect();
        let delayed: BTreeSet<u64> = self.delayed.iter().map(|Reverse((_, o))| *o).collect();
        for (i, slot) in self.slots.iter().enumerate() {
            let offset = self.floor + i as u64;
            match slot.state {
                SlotState::InFlight => assert!(
                    live.contains(&(offset, slot.attempt, slot.until_ms)),
                    "in-flight {offset} has the deadline of its delivery"
                ),
                SlotState::Delayed => assert!(
                    delayed.contains(&offset),
                    "delayed {offset} has an entry in `delayed`"
                ),
                _ => {}
            }
        }
    }

    /// Every key has one owner, ready, in flight or delayed; the offsets behind it ascend and
    /// those still in the window are blocked, and every blocked slot waits in its key's queue.
    fn check_ordered(&self) {
        let Some(o) = &self.ordered else {
            return;
        };
        assert_eq!(o.keys.len(), o.owner_of.len(), "one owner per key");
        let mut queued = 0;
        for (key, (owner, queue)) in &o.keys {
            assert_eq!(o.owner_of.get(owner), Some(key), "the owner knows its key");
            let state = self.slot(*owner).map(|s| s.state);
            assert!(
                matches!(
                    state,
                    Some(SlotState::Ready | SlotState::InFlight | SlotState::Delayed)
                ),
                "owner {owner} is in the window and unsettled, not {state:?}"
            );
            let mut previous = *owner;
            for &offset in queue {
                assert!(offset > previous, "a key's queue ascends behind its owner");
                previous = offset;
                if offset >= self.floor {
                    let state = self.slot(offset).map(|s| s.state);
                    assert_eq!(
                        state,
                        Some(SlotState::Blocked),
                        "queued {offset} is blocked"
                    );
                    queued += 1;
                }
            }
        }
        let blocked = self
            .slots
            .iter()
            .filter(|s| s.state == SlotState::Blocked)
            .count();
        assert_eq!(
            blocked, queued,
            "every blocked slot waits in its key's queue"
        );
    }

    /// Restored runs ascend without overlap, `restored_left` is their size at or above `next`,
    /// and saved delivery states are kept only at or above `next`.
    fn check_restored(&self) {
        let mut end = 0;
        let mut left = 0;
        for &(s, e) in &self.restored {
            assert!(s < e && s >= end, "restored runs ascend without overlap");
            end = e;
            left += e.saturating_sub(s.max(self.next));
        }
        assert_eq!(
            left, self.restored_left,
            "`restored_left` is what is left to pass"
        );
        if let Some((&first, _)) = self.restored_delivery.first_key_value() {
            assert!(
                first >= self.next,
                "saved delivery states lie at or above `next`"
            );
        }
    }

    /// True when the deadlines, in delivery order, never decrease: [`Cursor::fire_timers`] stops
    /// at the first one ahead. It holds while every delivery pass uses the subscription's one
    /// ack timeout and a clock that never goes back, as the broker does (unit tests that pass
    /// arbitrary clocks need not).
    #[cfg(test)]
    pub(super) fn deadlines_ascend(&self) -> bool {
        self.deadlines
            .iter()
            .zip(self.deadlines.iter().skip(1))
            .all(|(a, b)| a.0 <= b.0)
    }
}
