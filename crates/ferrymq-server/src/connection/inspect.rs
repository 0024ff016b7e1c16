//! Inspection requests: STATS, MESSAGE_STATUS and LIST_MESSAGES, each answer within the frame
//! limit.

use ferrymq_broker::{Action, BrokerError};
use ferrymq_protocol::limits::FRAME_HEADER_BYTES;
use ferrymq_protocol::{ErrorCode, Frame, ListKind, MessageEntry};

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
    /// One topic's statistics, or those of every topic this connection may see. A reply above
    /// the frame limit is refused with the reason rather than sent.
    pub(super) fn stats(&mut self, id: u32, topic: &str) {
        let name = (!topic.is_empty()).then_some(topic);
        let stats = match name {
            Some(name) => self
                .allow(Action::Inspect, name)
                .and_then(|_| self.broker.stats(Some(name))),
            None => self.broker.stats(None).map(|mut topics| {
                let access = self.access();
                topics.retain(|t| access.sees(&t.name).unwrap_or(false));
                topics
            }),
        };
        match stats {
            Ok(_) if id == 0 => {}
            Ok(topics) => {
                let max = self.config.effective_frame_bytes_max();
                let reply = Frame::StatsReply { topics };
                if let Err(bytes) = self.out.push_within(&reply, id, max) {
                    self.reply_error(
                        id,
                        ErrorCode::FrameTooLarge,
                        match name {
                            None => format!(
                                "the statistics of every topic take {bytes} bytes, above \
                                 the frame limit of {max}: ask for one topic at a time"
                            ),
                            Some(name) => format!(
                                "the statistics of topic '{name}' take {bytes} bytes, \
                                 above the frame limit of {max}"
                            ),
                        },
                    );
                }
            }
            Err(error) => self.reply(id, Err(error)),
        }
    }

    pub(super) fn message_status(&mut self, id: u32, topic: &str, partition: u32, offset: u64) {
        let result = self.allow(Action::Inspect, topic).and_then(|_| {
            self.broker
                .message_status(topic, partition, offset)
                .map(Frame::MessageStatusReply)
        });
        self.reply(id, result)
    }

    /// LIST_MESSAGES after the check that the connection may inspect `topic`.
    /// LIST_MESSAGES, taken whole so that the dispatch table stays one line per frame kind.
    pub(super) fn list_messages_frame(&mut self, id: u32, frame: Frame) {
        let Frame::ListMessages {
            topic,
            subscription,
            kind,
            page,
            limit,
        } = frame
        else {
            unreachable!("dispatched as LIST_MESSAGES")
        };
        self.list_messages_checked(id, &topic, &subscription, kind, &page, limit)
    }

    pub(super) fn list_messages_checked(
        &mut self,
        id: u32,
        topic: &str,
        subscription: &str,
        kind: ListKind,
        page: &[u8],
        limit: u32,
    ) {
        let result = self
            .allow(Action::Inspect, topic)
            .and_then(|_| self.list_messages(topic, subscription, kind, page, limit));
        self.reply(id, result)
    }

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
