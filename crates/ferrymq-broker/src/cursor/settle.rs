//! Settlement: acks, nacks, giving up after `max_attempts`, consumers leaving, and timers.

use super::*;

/// What releasing messages (timeout, nack, disconnect) did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Released {
    /// Made ready (or delayed) for another delivery; for timers, also delayed messages that
    /// became due, and messages of an ordered cursor whose turn came.
    pub requeued: u64,
    /// Given up after `max_attempts`.
    pub gave_up: u64,
}

/// A message given up, for the owner to move to the dead-letter topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GivenUp {
    pub offset: u64,
    pub attempts: u16,
}

impl Cursor {
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
        self.debug_check();
        n
    }

    /// The offsets given up since the last call: the owner moves them to the dead-letter topic,
    /// then calls [`Cursor::settle_dead`] (or [`Cursor::revive_dead`]).
    pub fn take_dead(&mut self) -> Vec<GivenUp> {
        self.debug_check();
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
        self.debug_check();
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
        self.debug_check();
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
        self.debug_check();
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
        self.debug_check();
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
        self.debug_check();
        out
    }

    pub(super) fn release(&mut self, offset: u64, due: Option<(Instant, u64)>, out: &mut Released) {
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
        self.debug_check();
        out
    }
}
