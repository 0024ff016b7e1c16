//! ACK, ACK_RESULT and NACK: settling deliveries by offset ranges.

use bytes::{BufMut, BytesMut};

use super::fields::{decode_ranges, encode_ranges, read_flags};
use super::header::{opcode, opcode_name};
use super::kind::Frame;
use crate::error::ProtocolError;
use crate::limits::{ERROR_MESSAGE_BYTES_MAX, PROTOCOL_VERSION_2};
use crate::status::read_result;
use crate::wire::{put_bytes16, put_str16, Reader};

const NACK_FLAG_DEAD_LETTER: u8 = 1;
const NACK_FLAG_RELEASE: u8 = 2;

/// Writes the payload of a ack frame.
pub(super) fn encode(frame: &Frame, version: u16, buf: &mut BytesMut) {
    match frame {
        Frame::Ack {
            consumer_id,
            ranges,
        } => {
            buf.put_u32_le(*consumer_id);
            encode_ranges(ranges, buf);
        }
        Frame::Nack {
            consumer_id,
            delay_ms,
            dead_letter,
            release,
            reason,
            ranges,
        } => {
            assert!(
                !(*dead_letter && *release),
                "a NACK either dead-letters or releases"
            );
            buf.put_u32_le(*consumer_id);
            buf.put_u32_le(*delay_ms);
            let mut flags = 0;
            if *dead_letter {
                flags |= NACK_FLAG_DEAD_LETTER;
            }
            // Version 1 has no release: the nearest it has is a plain NACK, which counts the
            // attempt (a client of version 1 never asks for a release).
            if *release && version >= PROTOCOL_VERSION_2 {
                flags |= NACK_FLAG_RELEASE;
            }
            buf.put_u8(flags);
            put_str16(buf, reason);
            encode_ranges(ranges, buf);
        }
        Frame::AckResult {
            consumer_id,
            result,
            ranges,
        } => {
            buf.put_u32_le(*consumer_id);
            put_bytes16(buf, result);
            encode_ranges(ranges, buf);
        }
        other => unreachable!("{} is not a ack frame", other.name()),
    }
}

/// Reads the payload of a ack frame (`opcode` is one of them).
pub(super) fn decode(opcode: u16, version: u16, r: &mut Reader) -> Result<Frame, ProtocolError> {
    use opcode::*;
    Ok(match opcode {
        ACK => Frame::Ack {
            consumer_id: r.u32("ack.consumer_id")?,
            ranges: decode_ranges(r)?,
        },
        NACK => {
            let consumer_id = r.u32("nack.consumer_id")?;
            let delay_ms = r.u32("nack.delay_ms")?;
            let known = match version >= PROTOCOL_VERSION_2 {
                true => NACK_FLAG_DEAD_LETTER | NACK_FLAG_RELEASE,
                false => NACK_FLAG_DEAD_LETTER,
            };
            let flags = read_flags(r, "nack.flags", known)?;
            if flags == NACK_FLAG_DEAD_LETTER | NACK_FLAG_RELEASE {
                return Err(ProtocolError::invalid(
                    "nack.flags",
                    "dead_letter and release together: a NACK does one or the other",
                ));
            }
            Frame::Nack {
                consumer_id,
                delay_ms,
                dead_letter: flags & NACK_FLAG_DEAD_LETTER != 0,
                release: flags & NACK_FLAG_RELEASE != 0,
                reason: {
                    let reason = r.str16("nack.reason")?;
                    if reason.len() > ERROR_MESSAGE_BYTES_MAX {
                        return Err(ProtocolError::invalid(
                            "nack.reason",
                            format!(
                                "{} bytes, above the limit of {ERROR_MESSAGE_BYTES_MAX}",
                                reason.len()
                            ),
                        ));
                    }
                    reason
                },
                ranges: decode_ranges(r)?,
            }
        }
        ACK_RESULT => Frame::AckResult {
            consumer_id: r.u32("ack_result.consumer_id")?,
            result: read_result(r, "ack_result.result")?,
            ranges: decode_ranges(r)?,
        },
        other => unreachable!("{} is not a ack opcode", opcode_name(other)),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_codec;
    use super::*;
    use bytes::Bytes;

    use crate::message::OffsetRange;

    #[test]
    fn each_frame_roundtrips_and_every_shorter_payload_is_refused() {
        for frame in [
            Frame::Ack {
                consumer_id: 3,
                ranges: vec![OffsetRange::single(0, 5)],
            },
            Frame::AckResult {
                consumer_id: 3,
                result: Bytes::from_static(b"ok"),
                ranges: vec![OffsetRange::single(0, 5), OffsetRange::single(1, 9)],
            },
            Frame::Nack {
                consumer_id: 3,
                delay_ms: 250,
                dead_letter: false,
                release: true,
                reason: String::new(),
                ranges: vec![OffsetRange::single(0, 6)],
            },
            Frame::Nack {
                consumer_id: 3,
                delay_ms: 0,
                dead_letter: true,
                release: false,
                reason: "bad input".into(),
                ranges: vec![],
            },
        ] {
            assert_codec(&frame);
        }
    }
}
