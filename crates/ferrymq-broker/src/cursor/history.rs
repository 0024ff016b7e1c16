//! Status: how the cursor sees one message, its window listed page by page, and the history of
//! settled messages with its encoding (encoder beside decoder).

use super::*;

/// An acked message, remembered for status queries.
pub(super) struct AckedEntry {
    pub(super) offset: u64,
    pub(super) attempts: u16,
    pub(super) first_ms: u64,
    pub(super) settled_ms: u64,
    pub(super) result: Option<Box<[u8]>>,
}

/// A dead-lettered message, remembered for status queries.
pub(super) struct DeadEntry {
    pub(super) offset: u64,
    pub(super) attempts: u16,
    pub(super) first_ms: u64,
    pub(super) settled_ms: u64,
    pub(super) reason: Box<str>,
    pub(super) dead_letter: Option<(u32, u64)>,
}

/// Reads [`Cursor::encode_history`]'s format; `None` if it is not that.
pub(super) fn decode_history(bytes: &[u8]) -> Option<(Vec<AckedEntry>, Vec<DeadEntry>)> {
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

impl Cursor {
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
            // Not yet taken into the window: pending, unless it was delivered before a restart,
            // which left its attempts and the due time of a nack's delay to apply when it is.
            if let Some(&(attempts, due_ms)) = self.restored_delivery.get(&offset) {
                entry.attempts = attempts;
                if due_ms > 0 {
                    // `message_status` turns a due time already past back into pending.
                    entry.state = MessageState::Delayed;
                    entry.due_ms = due_ms;
                }
            }
            return Some(entry);
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
    pub(super) fn fill_settled(&self, entry: &mut MessageEntry) {
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

    pub(super) fn acked_entry(&self, a: &AckedEntry) -> MessageEntry {
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

    pub(super) fn dead_entry(&self, d: &DeadEntry) -> MessageEntry {
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
        self.debug_check();
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
