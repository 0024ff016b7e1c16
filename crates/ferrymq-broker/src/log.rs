//! The in-memory log of one partition: a FIFO of records addressed by offset.
//!
//! Invariants: offsets are dense (`head .. head + len`); timestamps never decrease, so a time
//! lookup is a binary search; `bytes` is the sum of record lengths plus the fixed per-message
//! overhead of every retained entry.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::config::MESSAGE_OVERHEAD_BYTES;

pub(crate) struct Stored {
    /// When it was published, Unix µs (whole milliseconds for what was read back from a file,
    /// which keeps milliseconds).
    pub timestamp_us: u64,
    /// The record exactly as published (see `ferrymq_protocol::Record`).
    pub record: Bytes,
}

impl Stored {
    /// When it was published, Unix ms (as deliveries and the files carry it).
    pub fn timestamp_ms(&self) -> u64 {
        self.timestamp_us / 1000
    }
}

/// Where a cursor reads the records it delivers.
pub(crate) trait RecordSource {
    fn get(&self, offset: u64) -> Option<&Stored>;
    /// Every message at or after this offset has priority 0 (cursors need not look ahead).
    fn priority_end(&self) -> u64;
}

#[derive(Default)]
pub(crate) struct MemoryLog {
    head: u64,
    entries: VecDeque<Stored>,
    bytes: u64,
    /// One past the last message with a priority above 0 (or, for a tail that starts after a
    /// restart, its start: what lies before it is not known).
    priority_end: u64,
}

impl RecordSource for MemoryLog {
    fn get(&self, offset: u64) -> Option<&Stored> {
        MemoryLog::get(self, offset)
    }

    fn priority_end(&self) -> u64 {
        self.priority_end
    }
}

/// A disk partition's view for one delivery pass: its in-memory tail, and the entries read from
/// the log files just before (offset-ordered) for what lies below that tail.
pub(crate) struct TailAndFetched<'a> {
    pub tail: &'a MemoryLog,
    pub fetched: &'a [(u64, Stored)],
}

impl RecordSource for TailAndFetched<'_> {
    fn get(&self, offset: u64) -> Option<&Stored> {
        if offset >= self.tail.head() {
            return self.tail.get(offset);
        }
        self.fetched
            .binary_search_by_key(&offset, |(o, _)| *o)
            .ok()
            .map(|i| &self.fetched[i].1)
    }

    fn priority_end(&self) -> u64 {
        self.tail.priority_end
    }
}

impl MemoryLog {
    /// An empty log whose first entry gets `offset` (a disk partition's tail after a restart).
    pub fn starting_at(offset: u64) -> Self {
        MemoryLog {
            head: offset,
            priority_end: offset,
            ..Default::default()
        }
    }

    /// One past the last message with a priority above 0 this log knows of.
    pub fn priority_end(&self) -> u64 {
        self.priority_end
    }

    /// What is known, from before this tail existed, of where priorities end (never beyond the
    /// tail's start: the tail itself keeps count from there).
    pub fn know_priority_end(&mut self, end: u64) {
        self.priority_end = self.priority_end.min(end.min(self.head));
    }

    /// Forgets every entry from `offset` on (a disk log lost its unsynced tail).
    pub fn truncate_back(&mut self, offset: u64) {
        while self.next_offset() > offset.max(self.head) {
            let entry = self.entries.pop_back().expect("next above head");
            self.bytes -= entry.record.len() as u64 + MESSAGE_OVERHEAD_BYTES;
        }
        if self.head > offset {
            self.head = offset;
        }
    }

    /// Appends at an offset the caller assigned, which must be `next_offset()`, or anything when
    /// the log is empty (the log then restarts there).
    pub fn append_at(&mut self, offset: u64, timestamp_us: u64, record: Bytes) {
        if self.entries.is_empty() {
            self.head = offset;
        }
        debug_assert_eq!(offset, self.next_offset());
        self.append(timestamp_us, record);
    }

    /// Moves an empty log's next offset on to `offset`: the offsets between went to messages
    /// dropped before they were stored.
    pub fn skip_to(&mut self, offset: u64) {
        debug_assert!(self.entries.is_empty());
        if self.entries.is_empty() && offset > self.head {
            self.head = offset;
        }
    }

    pub fn head(&self) -> u64 {
        self.head
    }

    pub fn next_offset(&self) -> u64 {
        self.head + self.entries.len() as u64
    }

    pub fn len(&self) -> u64 {
        self.entries.len() as u64
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn last_timestamp_us(&self) -> u64 {
        self.entries.back().map_or(0, |e| e.timestamp_us)
    }

    pub fn get(&self, offset: u64) -> Option<&Stored> {
        offset
            .checked_sub(self.head)
            .and_then(|i| self.entries.get(i as usize))
    }

    pub fn append(&mut self, timestamp_us: u64, record: Bytes) -> u64 {
        debug_assert!(timestamp_us >= self.last_timestamp_us());
        let offset = self.next_offset();
        self.bytes += record.len() as u64 + MESSAGE_OVERHEAD_BYTES;
        if record.first().is_some_and(|&p| p > 0) {
            self.priority_end = offset + 1;
        }
        self.entries.push_back(Stored {
            timestamp_us,
            record,
        });
        offset
    }

    /// Discards every entry below `offset`; returns how many were removed.
    pub fn trim_to(&mut self, offset: u64) -> u64 {
        let mut removed = 0;
        while self.head < offset {
            let Some(entry) = self.entries.pop_front() else {
                break;
            };
            self.bytes -= entry.record.len() as u64 + MESSAGE_OVERHEAD_BYTES;
            self.head += 1;
            removed += 1;
        }
        removed
    }

    /// The first offset whose timestamp is at or after `timestamp_ms`.
    pub fn offset_for_time(&self, timestamp_ms: u64) -> u64 {
        self.head
            + self
                .entries
                .partition_point(|e| e.timestamp_ms() < timestamp_ms) as u64
    }

    /// The smallest head offset at which the log holds at most `max_messages` messages and
    /// `max_bytes` bytes: one pass from the head over the entries that must go.
    pub fn head_to_fit(&self, max_messages: u64, max_bytes: u64) -> u64 {
        let mut head = self.head + self.len().saturating_sub(max_messages);
        let mut bytes = self.bytes - self.bytes_between(self.head, head);
        while bytes > max_bytes {
            let entry = self
                .get(head)
                .expect("bytes above zero means entries remain");
            bytes -= entry.record.len() as u64 + MESSAGE_OVERHEAD_BYTES;
            head += 1;
        }
        head
    }

    fn bytes_between(&self, from: u64, to: u64) -> u64 {
        (from..to)
            .filter_map(|o| self.get(o))
            .map(|e| e.record.len() as u64 + MESSAGE_OVERHEAD_BYTES)
            .sum()
    }
}

/// Decodes a stored record; records were validated on publish, so failure is a bug.
pub(crate) fn decode_stored(record: Bytes) -> ferrymq_protocol::Message {
    ferrymq_protocol::Message::from_stored(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_stay_dense_and_are_never_reused_after_trimming() {
        let mut log = MemoryLog::default();
        for i in 0..5u64 {
            assert_eq!(log.append(i * 10, Bytes::from_static(b"abc")), i);
        }
        assert_eq!(log.bytes(), 5 * (3 + MESSAGE_OVERHEAD_BYTES));
        assert_eq!(log.trim_to(3), 3);
        assert_eq!(log.head(), 3);
        assert!(log.get(2).is_none());
        assert_eq!(log.get(4).unwrap().timestamp_us, 40);
        assert_eq!(log.trim_to(10), 2);
        assert_eq!(log.next_offset(), 5);
        assert_eq!(log.append(50, Bytes::new()), 5);
    }

    #[test]
    fn head_to_fit_honours_both_limits() {
        let mut log = MemoryLog::default();
        for _ in 0..10 {
            log.append(0, Bytes::from_static(&[0; 36])); // 100 bytes each with overhead
        }
        assert_eq!(log.head_to_fit(100, 10_000), 0);
        assert_eq!(log.head_to_fit(4, 10_000), 6);
        assert_eq!(log.head_to_fit(100, 350), 7);
        assert_eq!(log.head_to_fit(2, 350), 8);
        assert_eq!(log.head_to_fit(100, 0), 10);
    }

    #[test]
    fn time_lookup_finds_first_message_at_or_after() {
        let mut log = MemoryLog::default();
        for ts_ms in [10, 20, 20, 30] {
            log.append(ts_ms * 1000 + 999, Bytes::new());
        }
        assert_eq!(log.offset_for_time(0), 0);
        assert_eq!(log.offset_for_time(20), 1);
        assert_eq!(log.offset_for_time(21), 3);
        assert_eq!(log.offset_for_time(99), 4);
    }
}
