//! MESSAGE_STATUS, LIST_MESSAGES and REQUEUE_DEAD, and their replies.

use bytes::{BufMut, BytesMut};

use super::fields::{read_name, read_page};
use super::header::{opcode, opcode_name};
use super::kind::Frame;
use crate::error::ProtocolError;
use crate::limits::LIST_LIMIT_MAX;
use crate::status::{
    decode_entry, decode_message_status, decode_requeue_selection, encode_entry,
    encode_message_status, encode_requeue_selection, ListKind,
};
use crate::wire::{put_bytes16, put_str16, Reader};

/// Writes the payload of a messages frame.
pub(super) fn encode(frame: &Frame, version: u16, buf: &mut BytesMut) {
    match frame {
        Frame::MessageStatus {
            topic,
            partition,
            offset,
        } => {
            put_str16(buf, topic);
            buf.put_u32_le(*partition);
            buf.put_u64_le(*offset);
        }
        Frame::ListMessages {
            topic,
            subscription,
            kind,
            page,
            limit,
        } => {
            put_str16(buf, topic);
            put_str16(buf, subscription);
            buf.put_u8(*kind as u8);
            put_bytes16(buf, page);
            buf.put_u32_le(*limit);
        }
        Frame::RequeueDead {
            dead_letter_topic,
            selection,
        } => {
            put_str16(buf, dead_letter_topic);
            encode_requeue_selection(selection, buf);
        }
        Frame::MessageStatusReply(status) => encode_message_status(status, version, buf),
        Frame::MessageList { entries, next_page } => {
            buf.put_u32_le(entries.len() as u32);
            for e in entries {
                encode_entry(e, version, buf);
            }
            put_bytes16(buf, next_page);
        }
        Frame::Requeued { requeued, skipped } => {
            buf.put_u64_le(*requeued);
            buf.put_u64_le(*skipped);
        }
        other => unreachable!("{} is not a messages frame", other.name()),
    }
}

/// Reads the payload of a messages frame (`opcode` is one of them).
pub(super) fn decode(opcode: u16, version: u16, r: &mut Reader) -> Result<Frame, ProtocolError> {
    use opcode::*;
    Ok(match opcode {
        MESSAGE_STATUS => Frame::MessageStatus {
            topic: read_name(r, "message_status.topic")?,
            partition: r.u32("message_status.partition")?,
            offset: r.u64("message_status.offset")?,
        },
        LIST_MESSAGES => {
            let topic = read_name(r, "list_messages.topic")?;
            let subscription = read_name(r, "list_messages.subscription")?;
            let kind = r.u8("list_messages.kind")?;
            let kind = ListKind::from_u8(kind).ok_or_else(|| {
                ProtocolError::invalid("list_messages.kind", format!("unknown kind {kind}"))
            })?;
            let page = read_page(r, "list_messages.page")?;
            let limit = r.u32("list_messages.limit")?;
            if limit == 0 || limit > LIST_LIMIT_MAX {
                return Err(ProtocolError::invalid(
                    "list_messages.limit",
                    format!("{limit} is not within 1..={LIST_LIMIT_MAX}"),
                ));
            }
            Frame::ListMessages {
                topic,
                subscription,
                kind,
                page,
                limit,
            }
        }
        REQUEUE_DEAD => Frame::RequeueDead {
            dead_letter_topic: read_name(r, "requeue_dead.dead_letter_topic")?,
            selection: decode_requeue_selection(r)?,
        },
        MESSAGE_STATUS_REPLY => Frame::MessageStatusReply(decode_message_status(r, version)?),
        MESSAGE_LIST => {
            let count = r.u32("message_list.count")?;
            if count > LIST_LIMIT_MAX {
                return Err(ProtocolError::invalid(
                    "message_list.count",
                    format!("{count} entries, above the limit of {LIST_LIMIT_MAX}"),
                ));
            }
            let mut entries = Vec::with_capacity(count as usize);
            for _ in 0..count {
                entries.push(decode_entry(r, version)?);
            }
            Frame::MessageList {
                entries,
                next_page: read_page(r, "message_list.next_page")?,
            }
        }
        REQUEUED => Frame::Requeued {
            requeued: r.u64("requeued.requeued")?,
            skipped: r.u64("requeued.skipped")?,
        },
        other => unreachable!("{} is not a messages opcode", opcode_name(other)),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_codec;
    use super::*;
    use bytes::Bytes;

    use crate::status::{
        MessageEntry, MessageState, MessageStatus, RequeueSelection, SubscriptionMessageStatus,
    };

    fn sample_entry() -> MessageEntry {
        MessageEntry {
            partition: 1,
            offset: 42,
            state: MessageState::DeadLettered,
            attempts: 5,
            published_ms: 1_700_000_000_000,
            first_delivered_ms: 1_700_000_000_010,
            settled_ms: 1_700_000_000_500,
            due_ms: 0,
            result: Bytes::new(),
            reason: "max attempts".into(),
            dead_letter: Some((0, 17)),
        }
    }

    #[test]
    fn each_frame_roundtrips_and_every_shorter_payload_is_refused() {
        for frame in [
            Frame::MessageStatus {
                topic: "orders".into(),
                partition: 1,
                offset: 42,
            },
            Frame::MessageStatusReply(MessageStatus {
                partition: 1,
                offset: 42,
                published_ms: 1_700_000_000_000,
                priority: 3,
                key: Some(Bytes::from_static(b"k")),
                body_bytes: 10,
                subscriptions: vec![SubscriptionMessageStatus {
                    subscription: "billing".into(),
                    entry: sample_entry(),
                }],
            }),
            Frame::ListMessages {
                topic: "orders".into(),
                subscription: "billing".into(),
                kind: ListKind::DeadLettered,
                page: Bytes::from_static(b"next"),
                limit: 50,
            },
            Frame::MessageList {
                entries: vec![sample_entry()],
                next_page: Bytes::new(),
            },
            Frame::RequeueDead {
                dead_letter_topic: "orders.dlq".into(),
                selection: RequeueSelection::Range {
                    partition: 0,
                    first: 3,
                    last: 9,
                },
            },
            Frame::Requeued {
                requeued: 4,
                skipped: 1,
            },
        ] {
            assert_codec(&frame);
        }
    }
}
