//! Ordered cursors: one owner per key, the key's later messages blocked behind it.

use super::*;

/// Which key a message of an ordered cursor belongs to. Keys are told apart by a 64-bit hash: two
/// keys that collide only share their turn, which never breaks either one's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum KeyId {
    None,
    Hash(u64),
}

impl KeyId {
    pub(super) fn of(record: &[u8]) -> KeyId {
        match ferrymq_protocol::record_key(record) {
            Some(key) => KeyId::Hash(crate::keys::key_hash(key)),
            None => KeyId::None,
        }
    }
}

#[derive(Default)]
pub(super) struct Ordered {
    /// Per key with an unsettled message: its owner and the blocked offsets behind it.
    pub(super) keys: HashMap<KeyId, (u64, VecDeque<u64>)>,
    /// The key of every owner.
    pub(super) owner_of: HashMap<u64, KeyId>,
}

impl Cursor {
    /// For an ordered cursor: true when `key` already has an unsettled message in the window.
    pub(super) fn key_busy(&self, key: KeyId) -> bool {
        self.ordered
            .as_ref()
            .is_some_and(|o| o.keys.contains_key(&key))
    }

    /// Makes `offset` the owner of `key` (which must be free).
    pub(super) fn own(&mut self, key: KeyId, offset: u64) {
        if let Some(o) = &mut self.ordered {
            o.keys.insert(key, (offset, VecDeque::new()));
            o.owner_of.insert(offset, key);
        }
    }

    /// Takes `next` into the window as a message waiting behind its key.
    pub(super) fn block_next(&mut self, key: KeyId, priority: u8) {
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
    pub(super) fn key_done(&mut self, offset: u64) {
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
}
