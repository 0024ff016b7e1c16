//! Inspection requests: pages of LIST_MESSAGES within the frame limit.

use ferrymq_broker::BrokerError;
use ferrymq_protocol::limits::FRAME_HEADER_BYTES;
use ferrymq_protocol::{Frame, ListKind, MessageEntry};

use super::Session;

/// The encoded size of a MESSAGE_LIST frame: header, count, entries (64 bytes plus result and
/// reason each, see `docs/protocol.md`), page token.
pub(super) fn message_list_bytes(entries: &[MessageEntry], next_page: &[u8]) -> usize {
    let entries: usize = entries
        .iter()
        .map(|e| 64 + e.result.len() + e.reason.len())
        .sum();
    FRAME_HEADER_BYTES + 4 + entries + 2 + next_page.len()
}

impl Session {
    /// One page of LIST_MESSAGES, as MESSAGE_LIST. A page too large for the frame limit (many
    /// entries with long results) is asked again with half the limit, until it fits.
    pub(super) fn list_messages(
        &self,
        topic: &str,
        subscription: &str,
        kind: ListKind,
        page: &[u8],
        mut limit: u32,
    ) -> Result<Frame, BrokerError> {
        let frame_bytes_max = self.config.effective_frame_bytes_max();
        loop {
            let listed = self
                .broker
                .list_messages(topic, subscription, kind, page, limit)?;
            let bytes = message_list_bytes(&listed.entries, &listed.next_page);
            if bytes <= frame_bytes_max || listed.entries.len() <= 1 {
                return Ok(Frame::MessageList {
                    entries: listed.entries,
                    next_page: listed.next_page,
                });
            }
            limit = (listed.entries.len() / 2) as u32;
        }
    }
}
