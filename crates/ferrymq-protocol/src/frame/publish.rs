//! PUBLISH and its reply PUBLISHED, and [`PublishEncoder`], which writes a PUBLISH frame
//! message by message.

use bytes::{BufMut, BytesMut};

use super::durability::Durability;
use super::fields::{decode_ranges, encode_ranges, read_name};
use super::header::{opcode, opcode_name};
use super::kind::Frame;
use crate::error::ProtocolError;
use crate::limits::FRAME_HEADER_BYTES;
use crate::message::{Message, RecordBatch};
use crate::record::RecordHead;
use crate::wire::{put_str16, Reader};
use bytes::Bytes;

/// PUBLISH's partition field when the broker chooses.
const NO_PARTITION: u32 = u32::MAX;

/// Writes the payload of a publish frame.
pub(super) fn encode(frame: &Frame, buf: &mut BytesMut) {
    match frame {
        Frame::Publish {
            topic,
            partition,
            records,
        } => {
            put_str16(buf, topic);
            buf.put_u32_le(partition.unwrap_or(NO_PARTITION));
            buf.put_u32_le(records.count());
            buf.put_slice(records.bytes());
        }
        Frame::Published { durability, ranges } => {
            buf.put_u8(*durability as u8);
            encode_ranges(ranges, buf);
        }
        other => unreachable!("{} is not a publish frame", other.name()),
    }
}

/// Reads the payload of a publish frame (`opcode` is one of them).
pub(super) fn decode(opcode: u16, r: &mut Reader) -> Result<Frame, ProtocolError> {
    use opcode::*;
    Ok(match opcode {
        PUBLISH => {
            let topic = read_name(r, "publish.topic")?;
            let partition = match r.u32("publish.partition")? {
                NO_PARTITION => None,
                p => Some(p),
            };
            let count = r.u32("publish.count")?;
            let records = RecordBatch::decode(count, r.rest())?;
            Frame::Publish {
                topic,
                partition,
                records,
            }
        }
        PUBLISHED => {
            let durability = match r.u8("published.durability")? {
                0 => Durability::Memory,
                1 => Durability::Written,
                2 => Durability::SyncedInterval,
                3 => Durability::Synced,
                d => {
                    return Err(ProtocolError::invalid(
                        "published.durability",
                        format!("unknown value {d}"),
                    ))
                }
            };
            Frame::Published {
                durability,
                ranges: decode_ranges(r)?,
            }
        }
        other => unreachable!("{} is not a publish opcode", opcode_name(other)),
    })
}

/// Writes a PUBLISH frame message by message, so a client batches without building a `Vec`.
pub struct PublishEncoder {
    buf: BytesMut,
    count: u32,
    count_at: usize,
}

impl PublishEncoder {
    pub fn new(topic: &str, partition: Option<u32>, request_id: u32) -> Self {
        let mut buf = BytesMut::with_capacity(4096);
        buf.put_u32_le(0);
        buf.put_u16_le(opcode::PUBLISH);
        buf.put_u16_le(0);
        buf.put_u32_le(request_id);
        put_str16(&mut buf, topic);
        buf.put_u32_le(partition.unwrap_or(NO_PARTITION));
        let count_at = buf.len();
        buf.put_u32_le(0);
        PublishEncoder {
            buf,
            count: 0,
            count_at,
        }
    }

    /// Appends one message; fails on a message that breaks a codec limit, or when the frame
    /// already holds [`crate::limits::BATCH_COUNT_MAX`] messages (the decoder would refuse more).
    pub fn push(&mut self, message: &Message) -> Result<(), ProtocolError> {
        if self.count >= crate::limits::BATCH_COUNT_MAX {
            return Err(ProtocolError::invalid(
                "batch",
                format!("full at {} messages", crate::limits::BATCH_COUNT_MAX),
            ));
        }
        message.validate()?;
        message.encode_record(&mut self.buf);
        self.count += 1;
        Ok(())
    }

    /// Appends a record from its parts without building a [`Message`]: the fast path for bodies
    /// without headers or delay. The caller keeps within the limits `push` checks: priority,
    /// key length and [`crate::limits::BATCH_COUNT_MAX`] messages per frame.
    pub fn push_body(&mut self, key: Option<&[u8]>, priority: u8, body: &[u8]) {
        assert!(priority <= crate::limits::PRIORITY_MAX);
        assert!(
            self.count < crate::limits::BATCH_COUNT_MAX,
            "a PUBLISH frame holds at most BATCH_COUNT_MAX messages"
        );
        assert!(
            key.map_or(0, <[u8]>::len) <= crate::limits::KEY_BYTES_MAX
                && body.len() <= u32::MAX as usize
        );
        let head = RecordHead {
            priority,
            key,
            deliver_after_ms: None,
            header_count: 0,
            body_len: body.len() as u32,
        };
        self.buf.reserve(head.encoded_len() + body.len());
        head.encode(&mut self.buf);
        self.buf.put_slice(body);
        self.count += 1;
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The finished frame, header included.
    pub fn finish(mut self) -> Bytes {
        let payload_len = (self.buf.len() - FRAME_HEADER_BYTES) as u32;
        self.buf[0..4].copy_from_slice(&payload_len.to_le_bytes());
        let at = self.count_at;
        self.buf[at..at + 4].copy_from_slice(&self.count.to_le_bytes());
        self.buf.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_codec;
    use super::*;
    use crate::message::{Message, OffsetRange};

    #[test]
    fn each_frame_roundtrips_and_every_shorter_payload_is_refused() {
        for frame in [
            Frame::Publish {
                topic: "orders".into(),
                partition: Some(2),
                records: RecordBatch::from_messages(&[
                    Message::new("one").with_key("k"),
                    Message::new("two"),
                ])
                .expect("valid"),
            },
            Frame::Publish {
                topic: "orders".into(),
                partition: None,
                records: RecordBatch::from_messages(&[Message::new("x")]).expect("valid"),
            },
            Frame::Published {
                durability: Durability::Synced,
                ranges: vec![OffsetRange::single(0, 41), OffsetRange::single(1, 7)],
            },
        ] {
            assert_codec(&frame);
        }
    }
}
