//! SUBSCRIBE and its reply SUBSCRIBED, UNSUBSCRIBE, CREDIT and DELETE_SUBSCRIPTION.

use bytes::{BufMut, BytesMut};

use super::fields::{read_flags, read_name};
use super::header::{opcode, opcode_name};
use super::kind::Frame;
use super::subscribe_request::{StartPosition, SubscribeRequest};
use crate::error::ProtocolError;
use crate::limits::{NAME_BYTES_MAX, PARTITIONS_MAX};
use crate::wire::{put_str16, Reader};

const SUBSCRIBE_FLAG_AUTO_ACK: u8 = 1;
const SUBSCRIBE_FLAG_ORDERED: u8 = 2;

/// Writes the payload of a subscribe frame.
pub(super) fn encode(frame: &Frame, buf: &mut BytesMut) {
    match frame {
        Frame::Subscribe(s) => {
            put_str16(buf, &s.topic);
            put_str16(buf, &s.subscription);
            let (kind, value) = match s.start {
                StartPosition::Latest => (0u8, 0u64),
                StartPosition::Earliest => (1, 0),
                StartPosition::Offset(o) => (2, o),
                StartPosition::TimeMs(t) => (3, t),
            };
            buf.put_u8(kind);
            buf.put_u64_le(value);
            buf.put_u32_le(s.ack_timeout_ms);
            buf.put_u32_le(s.max_attempts);
            buf.put_u32_le(s.credit);
            let mut flags = 0;
            if s.auto_ack {
                flags |= SUBSCRIBE_FLAG_AUTO_ACK;
            }
            if s.ordered {
                flags |= SUBSCRIBE_FLAG_ORDERED;
            }
            buf.put_u8(flags);
            buf.put_u16_le(s.partitions.len() as u16);
            for &(first, last) in &s.partitions {
                buf.put_u32_le(first);
                buf.put_u32_le(last);
            }
            put_str16(buf, &s.dead_letter_topic);
        }
        Frame::Unsubscribe { consumer_id } => buf.put_u32_le(*consumer_id),
        Frame::Credit {
            consumer_id,
            credit,
        } => {
            buf.put_u32_le(*consumer_id);
            buf.put_u32_le(*credit);
        }
        Frame::DeleteSubscription {
            topic,
            subscription,
        } => {
            put_str16(buf, topic);
            put_str16(buf, subscription);
        }
        Frame::Subscribed {
            consumer_id,
            subscription,
            partitions,
        } => {
            buf.put_u32_le(*consumer_id);
            put_str16(buf, subscription);
            buf.put_u32_le(*partitions);
        }
        other => unreachable!("{} is not a subscribe frame", other.name()),
    }
}

/// Reads the payload of a subscribe frame (`opcode` is one of them).
pub(super) fn decode(opcode: u16, r: &mut Reader) -> Result<Frame, ProtocolError> {
    use opcode::*;
    Ok(match opcode {
        SUBSCRIBE => Frame::Subscribe(decode_request(r)?),
        UNSUBSCRIBE => Frame::Unsubscribe {
            consumer_id: r.u32("unsubscribe.consumer_id")?,
        },
        CREDIT => Frame::Credit {
            consumer_id: r.u32("credit.consumer_id")?,
            credit: r.u32("credit.credit")?,
        },
        DELETE_SUBSCRIPTION => Frame::DeleteSubscription {
            topic: read_name(r, "delete_subscription.topic")?,
            subscription: read_name(r, "delete_subscription.subscription")?,
        },
        SUBSCRIBED => Frame::Subscribed {
            consumer_id: r.u32("subscribed.consumer_id")?,
            subscription: r.str16("subscribed.subscription")?,
            partitions: r.u32("subscribed.partitions")?,
        },
        other => unreachable!("{} is not a subscribe opcode", opcode_name(other)),
    })
}

/// Reads SUBSCRIBE's payload.
fn decode_request(r: &mut Reader) -> Result<SubscribeRequest, ProtocolError> {
    let topic = read_name(r, "subscribe.topic")?;
    let subscription = r.str16("subscribe.subscription")?;
    if subscription.len() > NAME_BYTES_MAX {
        return Err(ProtocolError::invalid(
            "subscribe.subscription",
            format!("longer than {NAME_BYTES_MAX} bytes"),
        ));
    }
    let start = decode_start(r)?;
    let ack_timeout_ms = r.u32("subscribe.ack_timeout_ms")?;
    let max_attempts = r.u32("subscribe.max_attempts")?;
    let credit = r.u32("subscribe.credit")?;
    let flags = read_flags(
        r,
        "subscribe.flags",
        SUBSCRIBE_FLAG_AUTO_ACK | SUBSCRIBE_FLAG_ORDERED,
    )?;
    let auto_ack = flags & SUBSCRIBE_FLAG_AUTO_ACK != 0;
    let ordered = flags & SUBSCRIBE_FLAG_ORDERED != 0;
    if auto_ack && ordered {
        return Err(ProtocolError::invalid(
            "subscribe.flags",
            "ordered delivery needs acks: it cannot be combined with auto_ack",
        ));
    }
    Ok(SubscribeRequest {
        topic,
        subscription,
        start,
        ack_timeout_ms,
        max_attempts,
        credit,
        auto_ack,
        ordered,
        partitions: decode_partitions(r)?,
        dead_letter_topic: decode_dead_letter_topic(r)?,
    })
}

/// Reads a start position: a kind byte and its u64 value.
fn decode_start(r: &mut Reader) -> Result<StartPosition, ProtocolError> {
    let kind = r.u8("subscribe.start")?;
    let value = r.u64("subscribe.start_value")?;
    if kind <= 1 && value != 0 {
        // Latest and earliest carry no value; refusing one keeps the decoding
        // canonical (what decodes re-encodes to the same bytes) and the bytes free
        // for a later version to give meaning to.
        return Err(ProtocolError::invalid(
            "subscribe.start_value",
            format!("{value} must be 0 for start kind {kind}"),
        ));
    }
    Ok(match kind {
        0 => StartPosition::Latest,
        1 => StartPosition::Earliest,
        2 => StartPosition::Offset(value),
        3 => StartPosition::TimeMs(value),
        k => {
            return Err(ProtocolError::invalid(
                "subscribe.start",
                format!("unknown start kind {k}"),
            ))
        }
    })
}

/// Reads the partition ranges a subscription is limited to.
fn decode_partitions(r: &mut Reader) -> Result<Vec<(u32, u32)>, ProtocolError> {
    let count = r.u16("subscribe.partitions")? as usize;
    if count > PARTITIONS_MAX as usize {
        return Err(ProtocolError::invalid(
            "subscribe.partitions",
            format!("{count} ranges, above the limit of {PARTITIONS_MAX}"),
        ));
    }
    let mut ranges = Vec::with_capacity(count);
    for _ in 0..count {
        let first = r.u32("subscribe.partitions")?;
        let last = r.u32("subscribe.partitions")?;
        if first > last {
            return Err(ProtocolError::invalid(
                "subscribe.partitions",
                format!("range {first}-{last} ends before it starts"),
            ));
        }
        ranges.push((first, last));
    }
    Ok(ranges)
}

/// Reads the dead-letter topic: empty for the default.
fn decode_dead_letter_topic(r: &mut Reader) -> Result<String, ProtocolError> {
    let name = r.str16("subscribe.dead_letter_topic")?;
    if name.len() > NAME_BYTES_MAX {
        return Err(ProtocolError::invalid(
            "subscribe.dead_letter_topic",
            format!("must be empty (the default) or 1..={NAME_BYTES_MAX} bytes"),
        ));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_codec;
    use super::*;

    #[test]
    fn each_frame_roundtrips_and_every_shorter_payload_is_refused() {
        for frame in [
            Frame::Subscribe(SubscribeRequest {
                topic: "orders".into(),
                subscription: "billing".into(),
                start: StartPosition::Offset(12),
                ack_timeout_ms: 30_000,
                max_attempts: 5,
                credit: 100,
                auto_ack: false,
                ordered: true,
                partitions: vec![(0, 0), (2, 5)],
                dead_letter_topic: "orders.failed".into(),
            }),
            Frame::Subscribe(SubscribeRequest::earliest("orders", "")),
            Frame::Subscribed {
                consumer_id: 3,
                subscription: "billing".into(),
                partitions: 4,
            },
            Frame::Unsubscribe { consumer_id: 3 },
            Frame::Credit {
                consumer_id: 3,
                credit: 500,
            },
            Frame::DeleteSubscription {
                topic: "orders".into(),
                subscription: "billing".into(),
            },
        ] {
            assert_codec(&frame);
        }
    }
}
