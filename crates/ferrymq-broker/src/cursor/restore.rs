//! What a restart keeps: settled runs and delivery states, saved and taken back; operator skips.

use super::*;

/// The delivery state of one message that a restart must not forget: `(offset, attempts made,
/// due in Unix ms or 0)`. See [`Cursor::delivery_state`].
pub(crate) type DeliveryState = (u64, u16, u64);

impl Cursor {
    /// True (and the run bookkeeping moved on) when `next` lies in a settled run saved before a
    /// restart.
    pub(super) fn next_was_settled(&mut self) -> bool {
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
    pub(super) fn next_in_restored(&self) -> bool {
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
        self.debug_check();
        settled
    }

    /// How many restored settled offsets lie in `from .. to`.
    pub(super) fn restored_between(&self, from: u64, to: u64) -> u64 {
        self.restored
            .iter()
            .map(|&(s, e)| e.min(to).saturating_sub(s.max(from)))
            .sum()
    }

    /// Keeps only the restored runs' parts within `from .. to`.
    pub(super) fn clip_restored(&mut self, from: u64, to: u64) {
        let runs: VecDeque<(u64, u64)> = self
            .restored
            .iter()
            .map(|&(s, e)| (s.max(from), e.min(to)))
            .filter(|&(s, e)| s < e)
            .collect();
        self.restored_left = runs.iter().map(|&(s, e)| e - s).sum();
        self.restored = runs;
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
        self.debug_check();
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
        cursor.debug_check();
        cursor
    }

    /// Where the subscription started in this partition, as saved when it was created (a
    /// restored cursor knows only its floor).
    /// Where the subscription started in this partition (0 when unknown).
    pub fn start(&self) -> u64 {
        self.start
    }

    pub fn set_start(&mut self, start: u64) {
        self.start = start;
        self.debug_check();
    }
}
