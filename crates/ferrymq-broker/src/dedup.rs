//! Idempotent publishing: a topic's window of recent deduplication ids.
//!
//! A publisher that does not know whether its publish was stored (the connection dropped, the
//! broker was killed before the answer) retries it with the same id in header
//! [`HEADER_DEDUP_ID`]. Within the topic's window a message whose id the topic saw is not stored
//! again: the publisher gets the id (`partition-offset`) of the message stored first, as NATS
//! JetStream does with `Nats-Msg-Id` in its duplicate window.
//!
//! Invariants:
//! - `ids` and `order` hold the same ids; `order` is sorted by the time each id was first stored.
//! - The window holds at most [`DEDUP_IDS_MAX`] ids: past it the oldest are forgotten before
//!   their time (counted in `evicted_early`), so memory stays bounded whatever the publish rate.
//! - The window is only read and written under the topic's dedup lock, which a publish carrying
//!   ids holds from the look-up until its ids are recorded: two publishes of one id cannot both
//!   miss it.
//!
//! - An id stays in the window only while its message may be durable: when the sync a publish
//!   waits for fails, the ids it entered are taken out again ([`Entered::withdraw`]), so that
//!   the publisher's retry is stored rather than answered with the id of a lost message.
//! - A duplicate is answered no sooner than the message it repeats: a retry that arrives while
//!   the first publish still waits for its sync waits for that sync (`Topic::wait_for_originals`),
//!   so that a retry is never told "stored" of a message a crash could still lose.
//!
//! On a disk topic the window is not persisted: after a start it is rebuilt from the partition
//! logs (the records of the last window that carry the header) before the first publish with an
//! id is answered. The log holds the ids anyway, so a crash cannot leave the two apart, and a
//! start with many topics reads nothing for topics that never see an id.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use bytes::Bytes;

/// The record header that carries a message's deduplication id. `x-ferrymq-` names are the
/// broker's own (the dead-letter and requeue headers share the prefix).
pub use ferrymq_protocol::HEADER_DEDUP_ID;

/// Longest deduplication id: a UUID or a hash is far shorter, and the bound keeps the window's
/// memory at about `DEDUP_IDS_MAX` × 300 bytes per topic.
pub const DEDUP_ID_BYTES_MAX: usize = 256;

/// Most ids a topic's window holds: two minutes of 800 publishes/s with ids, within ~30 MiB.
/// Past it the oldest ids are forgotten early, and a retry of those would be stored again.
pub const DEDUP_IDS_MAX: usize = 100_000;

/// The window a topic gets unless configured otherwise, as JetStream's default duplicate window.
pub const DEDUP_WINDOW_MS_DEFAULT: u64 = 2 * 60 * 1000;

/// Longest window: a day of ids is already more than the bound holds at any real rate.
pub const DEDUP_WINDOW_MS_MAX: u64 = 24 * 3600 * 1000;

pub(crate) struct DedupWindow {
    pub window_ms: u64,
    ids: HashMap<Bytes, Seen>,
    order: VecDeque<(u64, Bytes)>,
    /// Disk topics: whether the ids in the logs were read since the start.
    pub rebuilt: bool,
    /// Ids forgotten before their window ended because the window was full.
    pub evicted_early: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    pub partition: u32,
    pub offset: u64,
    pub stored_ms: u64,
}

impl DedupWindow {
    pub fn new(window_ms: u64, rebuilt: bool) -> Self {
        DedupWindow {
            window_ms,
            ids: HashMap::new(),
            order: VecDeque::new(),
            rebuilt,
            evicted_early: 0,
        }
    }

    /// Forgets the ids stored before `now_ms - window_ms`.
    pub fn expire(&mut self, now_ms: u64) {
        let oldest_kept = now_ms.saturating_sub(self.window_ms);
        while let Some((stored_ms, _)) = self.order.front() {
            if *stored_ms >= oldest_kept {
                break;
            }
            let (_, id) = self.order.pop_front().expect("a front");
            self.forget(&id);
        }
        self.check();
    }

    /// Where the message first stored under `id` is, if the window still holds it.
    pub fn get(&self, id: &[u8]) -> Option<Seen> {
        self.ids.get(id).copied()
    }

    /// Records `id` as stored at `seen`; an id already held keeps its first message.
    pub fn insert(&mut self, id: Bytes, seen: Seen) {
        if self.ids.contains_key(&id) {
            return;
        }
        while self.ids.len() >= DEDUP_IDS_MAX {
            let Some((_, oldest)) = self.order.pop_front() else {
                break;
            };
            self.forget(&oldest);
            self.evicted_early += 1;
        }
        // Kept sorted: a rebuild reads partitions one after another, not in time order.
        let at = self.order.partition_point(|(ms, _)| *ms <= seen.stored_ms);
        self.order.insert(at, (seen.stored_ms, id.clone()));
        self.ids.insert(id, seen);
        // Sorted on both sides of the new entry (the whole order is checked only in tests: an
        // O(n) walk per publish would cost more than the look-up it guards).
        debug_assert!(at == 0 || self.order[at - 1].0 <= seen.stored_ms);
        debug_assert!(self
            .order
            .get(at + 1)
            .is_none_or(|(ms, _)| seen.stored_ms <= *ms));
        self.check();
    }

    fn forget(&mut self, id: &Bytes) {
        self.ids.remove(id);
    }

    /// Takes `id` out if it still names the message at `partition`/`offset` (a later publish of
    /// the same id, after expiry, is left alone).
    fn withdraw(&mut self, id: &Bytes, partition: u32, offset: u64) {
        let Some(seen) = self.ids.get(id) else {
            return;
        };
        if (seen.partition, seen.offset) != (partition, offset) {
            return;
        }
        self.ids.remove(id);
        if let Some(at) = self.order.iter().position(|(_, held)| held == id) {
            self.order.remove(at);
        }
        self.check();
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// The invariants of the module doc that cost O(1).
    fn check(&self) {
        debug_assert_eq!(self.ids.len(), self.order.len());
        debug_assert!(self.ids.len() <= DEDUP_IDS_MAX);
    }

    /// The whole order, sorted and matching the map: in tests only (O(n)).
    #[cfg(test)]
    fn check_order(&self) {
        assert!(self
            .order
            .iter()
            .zip(self.order.iter().skip(1))
            .all(|(a, b)| a.0 <= b.0));
        assert!(self
            .order
            .iter()
            .all(|(ms, id)| self.ids[id].stored_ms == *ms));
    }
}

/// The ids one publish entered in its topic's window, with where their messages went, for as
/// long as the publish waits for its sync.
pub(crate) struct Entered {
    pub window: Arc<Mutex<DedupWindow>>,
    pub ids: Vec<(Bytes, u32, u64)>,
}

impl Entered {
    /// The publish's records did not reach the disk: its ids no longer name stored messages.
    pub fn withdraw(self) {
        let mut window = self.window.lock();
        for (id, partition, offset) in &self.ids {
            window.withdraw(id, *partition, *offset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(offset: u64, stored_ms: u64) -> Seen {
        Seen {
            partition: 0,
            offset,
            stored_ms,
        }
    }

    #[test]
    fn an_id_is_held_for_the_window_and_keeps_its_first_message() {
        let mut window = DedupWindow::new(1000, true);
        window.insert(Bytes::from_static(b"a"), seen(7, 10_000));
        window.insert(Bytes::from_static(b"a"), seen(8, 10_001));
        assert_eq!(window.get(b"a"), Some(seen(7, 10_000)));
        window.expire(11_000);
        assert_eq!(window.get(b"a"), Some(seen(7, 10_000)));
        window.expire(11_001);
        assert_eq!(window.get(b"a"), None);
        assert_eq!(window.len(), 0);
    }

    #[test]
    fn a_full_window_forgets_its_oldest_ids_first() {
        let mut window = DedupWindow::new(u64::MAX, true);
        for i in 0..DEDUP_IDS_MAX as u64 + 3 {
            window.insert(Bytes::from(i.to_string()), seen(i, i));
        }
        assert_eq!(window.len(), DEDUP_IDS_MAX);
        assert_eq!(window.evicted_early, 3);
        window.check_order();
        assert_eq!(window.get(b"2"), None);
        assert_eq!(window.get(b"3"), Some(seen(3, 3)));
    }

    #[test]
    fn ids_read_out_of_time_order_expire_in_time_order() {
        let mut window = DedupWindow::new(100, false);
        window.insert(Bytes::from_static(b"late"), seen(1, 500));
        window.insert(Bytes::from_static(b"early"), seen(0, 300));
        window.check_order();
        window.expire(450);
        assert_eq!(window.get(b"early"), None);
        assert!(window.get(b"late").is_some());
    }
}
