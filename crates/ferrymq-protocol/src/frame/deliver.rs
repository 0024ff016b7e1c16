//! DELIVER, and [`DeliverEncoder`], which writes one straight into an output buffer.

use bytes::{BufMut, BytesMut};

use super::header::{opcode, opcode_name};
use super::kind::Frame;
use crate::error::ProtocolError;
use crate::limits::FRAME_HEADER_BYTES;
use crate::message::DeliveryBatch;
use crate::wire::Reader;

/// Writes the payload of a deliver frame.
pub(super) fn encode(frame: &Frame, buf: &mut BytesMut) {
    match frame {
        Frame::Deliver {
            consumer_id,
            deliveries,
        } => {
            buf.put_u32_le(*consumer_id);
            buf.put_u32_le(deliveries.count());
            buf.put_slice(deliveries.bytes());
        }
        other => unreachable!("{} is not a deliver frame", other.name()),
    }
}

/// Reads the payload of a deliver frame (`opcode` is one of them).
pub(super) fn decode(opcode: u16, r: &mut Reader) -> Result<Frame, ProtocolError> {
    use opcode::*;
    Ok(match opcode {
        DELIVER => {
            let consumer_id = r.u32("deliver.consumer_id")?;
            let count = r.u32("deliver.count")?;
            Frame::Deliver {
                consumer_id,
                deliveries: DeliveryBatch::decode(count, r.rest())?,
            }
        }
        other => unreachable!("{} is not a deliver opcode", opcode_name(other)),
    })
}

/// Writes a DELIVER frame straight into an output buffer, one delivery at a time, so the server
/// copies stored record bytes once and builds no intermediate values.
pub struct DeliverEncoder<'a> {
    buf: &'a mut BytesMut,
    start: usize,
    count: u32,
}

impl<'a> DeliverEncoder<'a> {
    pub fn begin(buf: &'a mut BytesMut, consumer_id: u32) -> Self {
        let start = buf.len();
        buf.put_u32_le(0);
        buf.put_u16_le(opcode::DELIVER);
        buf.put_u16_le(0);
        buf.put_u32_le(0);
        buf.put_u32_le(consumer_id);
        buf.put_u32_le(0);
        DeliverEncoder {
            buf,
            start,
            count: 0,
        }
    }

    /// Appends one delivery. `record` must be a record validated on publish. A frame holds at most
    /// [`crate::limits::BATCH_COUNT_MAX`] deliveries (the decoder refuses more); callers start a
    /// new frame when [`DeliverEncoder::count`] reaches it.
    pub fn push(
        &mut self,
        partition: u32,
        offset: u64,
        timestamp_ms: u64,
        attempt: u16,
        record: &[u8],
    ) {
        assert!(
            self.count < crate::limits::BATCH_COUNT_MAX,
            "a DELIVER frame holds at most BATCH_COUNT_MAX deliveries"
        );
        self.buf
            .reserve(crate::message::DELIVERY_PREFIX_BYTES + record.len());
        crate::message::put_delivery_prefix(self.buf, partition, offset, timestamp_ms, attempt);
        self.buf.put_slice(record);
        self.count += 1;
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// Bytes written so far for this frame.
    pub fn len(&self) -> usize {
        self.buf.len() - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Patches the length and count. A frame with no deliveries is removed again.
    pub fn finish(self) -> u32 {
        if self.count == 0 {
            self.buf.truncate(self.start);
            return 0;
        }
        let payload_len = (self.buf.len() - self.start - FRAME_HEADER_BYTES) as u32;
        self.buf[self.start..self.start + 4].copy_from_slice(&payload_len.to_le_bytes());
        let count_at = self.start + FRAME_HEADER_BYTES + 4;
        self.buf[count_at..count_at + 4].copy_from_slice(&self.count.to_le_bytes());
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_codec;
    use super::*;
    use crate::message::{Delivery, DeliveryBatch, Message};

    #[test]
    fn each_frame_roundtrips_and_every_shorter_payload_is_refused() {
        let delivery = |offset, attempt, body: &'static str| Delivery {
            partition: 1,
            offset,
            timestamp_ms: 1_700_000_000_000,
            attempt,
            message: Message::new(body).with_key("k"),
        };
        for deliveries in [
            vec![delivery(99, 2, "body")],
            vec![delivery(7, 1, "a"), delivery(8, 1, "")],
        ] {
            let frame = Frame::Deliver {
                consumer_id: 3,
                deliveries: DeliveryBatch::from_deliveries(&deliveries).expect("valid"),
            };
            assert_codec(&frame);
        }
    }
}
