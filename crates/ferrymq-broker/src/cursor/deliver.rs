//! Delivery passes: what a consumer gets next, in priority and log order, within its limits.

use super::*;

/// Whether a stored message may be delivered now.
#[derive(Debug, Clone, Copy)]
enum Due {
    /// Deliverable, for this many µs: since its publish, or since its delay ended.
    Now(u64),
    /// Delayed until this instant (also given in Unix ms).
    Later((Instant, u64)),
}

impl Due {
    /// How long it has been deliverable; 0 while it is not.
    fn waited_us(self) -> u64 {
        match self {
            Due::Now(waited) => waited,
            Due::Later(_) => 0,
        }
    }
}

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

    /// Whether `stored` can go now, reading its delay once.
    fn check(&self, stored: &crate::log::Stored) -> Due {
        let Some(delay) = ferrymq_protocol::record_deliver_after_ms(&stored.record) else {
            return Due::Now(self.unix_us.saturating_sub(stored.timestamp_us));
        };
        let due_ms = stored.timestamp_ms().saturating_add(delay);
        let unix_ms = self.unix_ms();
        if due_ms > unix_ms {
            return Due::Later((
                self.now + std::time::Duration::from_millis(due_ms - unix_ms),
                due_ms,
            ));
        }
        let since = stored
            .timestamp_us
            .saturating_add(delay.saturating_mul(1000));
        Due::Now(self.unix_us.saturating_sub(since))
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

/// One delivery pass in progress: to whom, within which limits, and what it delivered so far.
struct Pass<'a> {
    consumer: u64,
    auto_ack: bool,
    count_max: u32,
    bytes_max: usize,
    clock: &'a DeliverClock,
    deadline: Instant,
    deadline_ms: u64,
    out: Delivered,
}

impl Pass<'_> {
    /// Whether a record of `len` bytes fits in this pass; the first always does.
    fn fits(&self, len: usize) -> bool {
        self.out.count < self.count_max
            && (self.out.count == 0 || self.out.bytes as usize + len <= self.bytes_max)
    }
}

impl Cursor {
    /// True when `record` is a requeued dead letter meant for another subscription.
    pub(super) fn meant_for_another(&self, record: &[u8]) -> bool {
        crate::headers::requeued_for_another(record, &self.options.name)
    }

    /// Passes `next` without delivering it: it counts as settled here.
    pub(super) fn pass_settled(&mut self, priority: u8) {
        self.restored_delivery.remove(&self.next);
        self.next += 1;
        if self.slots.is_empty() {
            self.floor = self.next;
        } else {
            self.slots
                .push_back(Slot::new(SlotState::Settled, priority));
        }
    }

    /// Takes `next` into the window before its delivery (priorities): ready, delayed, blocked
    /// behind its key, or settled.
    pub(super) fn admit(&mut self, stored: &crate::log::Stored, clock: &DeliverClock) {
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
            Due::Later(due) => self.hold(offset, due),
            Due::Now(_) => self.make_ready(offset),
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
        let auto_ack = self.options.auto_ack;
        let mut pass = Pass {
            consumer,
            auto_ack,
            count_max: if auto_ack {
                limits.count_max
            } else {
                limits.count_max.min(limits.in_flight_room)
            },
            bytes_max: limits.bytes_max,
            clock,
            deadline: clock.deadline,
            deadline_ms: clock.deadline_ms(),
            out: Delivered::default(),
        };
        let admitting = self.admit_ahead(log, clock);
        // New messages go in log order only once nothing ahead is left to take in.
        if self.deliver_ready(log, &mut pass, &mut emit) && !admitting {
            self.deliver_new(log, &mut pass, &mut emit);
        }
        self.finish(pass.out)
    }

    /// Messages of a higher priority may lie ahead: takes what is ahead into the window first.
    /// True while not done: the next pass goes on taking them in before the rest goes in log
    /// order.
    fn admit_ahead(&mut self, log: &impl RecordSource, clock: &DeliverClock) -> bool {
        let priority_end = log.priority_end();
        if priority_end <= self.next {
            return false;
        }
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
        self.next < priority_end.min(self.floor.saturating_add(LOOKAHEAD))
    }

    /// Delivers ready messages, highest priority first. False when the pass must stop here (the
    /// limits are reached, or the source could not provide a record).
    fn deliver_ready(
        &mut self,
        log: &impl RecordSource,
        pass: &mut Pass,
        emit: &mut impl FnMut(u64, u64, u16, &Bytes),
    ) -> bool {
        while let Some(&(rank, offset)) = self.ready.first() {
            let Some(stored) = log.get(offset) else {
                // Below the log head only if the source could not provide it (a disk read
                // stopped early); it stays ready for the next pass.
                return false;
            };
            let first_delivery = self.slot(offset).is_some_and(|slot| slot.attempt == 0);
            let checked = first_delivery.then(|| pass.clock.check(stored));
            if let Some(Due::Later(due)) = checked {
                self.ready.pop_first();
                self.hold(offset, due);
                continue;
            }
            if !pass.fits(stored.record.len()) {
                return false;
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
                    Some(Due::Now(waited)) => waited,
                    _ => pass.clock.check(stored).waited_us(),
                };
                slot.first_us = pass.clock.unix_us;
                slot.lag = encode_lag(waited);
                waited
            });
            let attempt = slot.attempt;
            if pass.auto_ack {
                slot.state = SlotState::Settled;
            } else {
                slot.state = SlotState::InFlight;
                slot.consumer = pass.consumer;
                slot.until_ms = pass.deadline_ms;
                self.in_flight += 1;
                self.deadlines
                    .push_back((pass.deadline, offset, attempt, pass.deadline_ms));
            }
            if let Some(waited) = first_wait {
                self.latency.deliver.record(waited);
            }
            emit(offset, stored.timestamp_ms(), attempt, &stored.record);
            pass.out.count += 1;
            pass.out.bytes += stored.record.len() as u64;
            if attempt > 1 {
                pass.out.redelivered += 1;
            }
        }
        true
    }

    /// Takes new messages in log order: delivered, delayed, blocked behind their key, or passed.
    fn deliver_new(
        &mut self,
        log: &impl RecordSource,
        pass: &mut Pass,
        emit: &mut impl FnMut(u64, u64, u16, &Bytes),
    ) {
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
                Some((_, due_ms)) => pass.clock.due(due_ms).map_or(Due::Now(0), Due::Later),
                None => pass.clock.check(stored),
            };
            let waited = match checked {
                Due::Now(waited) => waited,
                Due::Later(due) => {
                    // Not yet due: held as a delayed slot, and the messages behind it flow on.
                    // A pass holds a bounded number, so a long run of delayed messages is taken
                    // in steps rather than under one long lock.
                    if set_aside == HOLD_PER_PASS_MAX {
                        break;
                    }
                    set_aside += 1;
                    self.hold_next(key, priority, restored, due);
                    continue;
                }
            };
            if !pass.fits(stored.record.len()) {
                break;
            }
            self.deliver_next(stored, key, priority, waited, pass, emit);
        }
    }

    /// Takes `next` into the window as a delayed slot, due at `due` (the messages behind it
    /// flow on); an ordered cursor's key is owned by it meanwhile.
    fn hold_next(
        &mut self,
        key: Option<KeyId>,
        priority: u8,
        restored: Option<(u16, u64)>,
        due: (Instant, u64),
    ) {
        let offset = self.next;
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
    }

    /// Delivers `next` (`stored`, deliverable for `waited` µs) in this pass.
    fn deliver_next(
        &mut self,
        stored: &crate::log::Stored,
        key: Option<KeyId>,
        priority: u8,
        waited: u64,
        pass: &mut Pass,
        emit: &mut impl FnMut(u64, u64, u16, &Bytes),
    ) {
        let offset = self.next;
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
            pass.out.redelivered += 1;
        }
        if pass.auto_ack {
            if self.slots.is_empty() {
                self.floor = self.next;
            } else {
                self.slots.push_back(Slot {
                    attempt,
                    consumer: pass.consumer,
                    first_us: pass.clock.unix_us,
                    lag: encode_lag(waited),
                    ..Slot::new(SlotState::Settled, priority)
                });
            }
        } else {
            self.slots.push_back(Slot {
                attempt,
                consumer: pass.consumer,
                first_us: pass.clock.unix_us,
                lag: encode_lag(waited),
                until_ms: pass.deadline_ms,
                ..Slot::new(SlotState::InFlight, priority)
            });
            self.in_flight += 1;
            self.deadlines
                .push_back((pass.deadline, offset, attempt, pass.deadline_ms));
        }
        emit(offset, stored.timestamp_ms(), attempt, &stored.record);
        pass.out.count += 1;
        pass.out.bytes += stored.record.len() as u64;
    }

    pub(super) fn finish(&mut self, out: Delivered) -> Delivered {
        self.advance_floor();
        self.debug_check();
        out
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
}
