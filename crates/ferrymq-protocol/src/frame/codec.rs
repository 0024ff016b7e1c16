//! A frame's whole encoding: the header, then the payload its family file writes; decoding
//! dispatches on the opcode the same way. Adding a frame is a variant, an opcode, and one line
//! per table here.

use bytes::{BufMut, Bytes, BytesMut};

use super::header::{opcode, opcode_name, FrameHeader};
use super::kind::Frame;
use super::{ack, deliver, messages, publish, session, stats, subscribe, tokens, topics, users};
use crate::error::ProtocolError;
use crate::limits::FRAME_HEADER_BYTES;
use crate::wire::Reader;

impl Frame {
    /// Appends the whole frame, header included, to `buf`.
    ///
    /// Strings longer than their length field and name fields longer than
    /// [`crate::limits::NAME_BYTES_MAX`] are caller bugs: the client and server validate names
    /// before building frames.
    pub fn encode(&self, request_id: u32, buf: &mut BytesMut) {
        let start = buf.len();
        buf.put_u32_le(0);
        buf.put_u16_le(self.opcode());
        buf.put_u16_le(0);
        buf.put_u32_le(request_id);
        self.encode_payload(buf);
        let payload_len = buf.len() - start - FRAME_HEADER_BYTES;
        assert!(
            payload_len <= u32::MAX as usize,
            "frame payload does not fit u32"
        );
        buf[start..start + 4].copy_from_slice(&(payload_len as u32).to_le_bytes());
    }

    fn encode_payload(&self, buf: &mut BytesMut) {
        use opcode::*;
        match self.opcode() {
            HELLO | HELLO_OK | PING | PONG | OK | ERROR => session::encode(self, buf),
            CREATE_TOPIC | DELETE_TOPIC | LIST_TOPICS | DESCRIBE_TOPIC | TOPIC_LIST
            | TOPIC_INFO => topics::encode(self, buf),
            PUBLISH | PUBLISHED => publish::encode(self, buf),
            SUBSCRIBE | SUBSCRIBED | UNSUBSCRIBE | CREDIT | DELETE_SUBSCRIPTION => {
                subscribe::encode(self, buf)
            }
            DELIVER => deliver::encode(self, buf),
            ACK | ACK_RESULT | NACK => ack::encode(self, buf),
            STATS | STATS_REPLY => stats::encode(self, buf),
            MESSAGE_STATUS | MESSAGE_STATUS_REPLY | LIST_MESSAGES | MESSAGE_LIST | REQUEUE_DEAD
            | REQUEUED => messages::encode(self, buf),
            USER_ADD | USER_REMOVE | USER_PASSWD | USER_LIST | USER_LIST_REPLY | GRANT | REVOKE => {
                users::encode(self, buf)
            }
            TOKEN_CREATE | TOKEN_LIST | TOKEN_REVOKE | TOKEN_CREATED | TOKEN_LIST_REPLY => {
                tokens::encode(self, buf)
            }
            other => unreachable!("opcode {other:#x} has no family"),
        }
    }

    /// Decodes a frame's payload. `payload` must be exactly the bytes after the header.
    pub fn decode(header: &FrameHeader, payload: Bytes) -> Result<Frame, ProtocolError> {
        use opcode::*;
        debug_assert_eq!(payload.len(), header.payload_len as usize);
        let mut r = Reader::new(payload);
        let frame = match header.opcode {
            HELLO | HELLO_OK | PING | PONG | OK | ERROR => session::decode(header.opcode, &mut r)?,
            CREATE_TOPIC | DELETE_TOPIC | LIST_TOPICS | DESCRIBE_TOPIC | TOPIC_LIST
            | TOPIC_INFO => topics::decode(header.opcode, &mut r)?,
            PUBLISH | PUBLISHED => publish::decode(header.opcode, &mut r)?,
            SUBSCRIBE | SUBSCRIBED | UNSUBSCRIBE | CREDIT | DELETE_SUBSCRIPTION => {
                subscribe::decode(header.opcode, &mut r)?
            }
            DELIVER => deliver::decode(header.opcode, &mut r)?,
            ACK | ACK_RESULT | NACK => ack::decode(header.opcode, &mut r)?,
            STATS | STATS_REPLY => stats::decode(header.opcode, &mut r)?,
            MESSAGE_STATUS | MESSAGE_STATUS_REPLY | LIST_MESSAGES | MESSAGE_LIST | REQUEUE_DEAD
            | REQUEUED => messages::decode(header.opcode, &mut r)?,
            USER_ADD | USER_REMOVE | USER_PASSWD | USER_LIST | USER_LIST_REPLY | GRANT | REVOKE => {
                users::decode(header.opcode, &mut r)?
            }
            TOKEN_CREATE | TOKEN_LIST | TOKEN_REVOKE | TOKEN_CREATED | TOKEN_LIST_REPLY => {
                tokens::decode(header.opcode, &mut r)?
            }
            other => return Err(ProtocolError::UnknownOpcode(other)),
        };
        r.finish(opcode_name(header.opcode))?;
        Ok(frame)
    }
}
