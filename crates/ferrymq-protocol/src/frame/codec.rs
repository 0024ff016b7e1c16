//! A frame's whole encoding: the header, then the payload its family file writes; decoding
//! dispatches on the opcode the same way. Adding a frame is a variant, an opcode, and one line
//! per table here.
//!
//! Every encoding is for one protocol version: [`Frame::encode`] and [`Frame::decode`] use the
//! newest, [`Frame::encode_as`] and [`Frame::decode_as`] the version a connection agreed on. The
//! families whose layout or values differ between versions (topics, NACK, message states,
//! statistics, the action bits of user listings) take the version; the others are the same in
//! every version.

use bytes::{BufMut, Bytes, BytesMut};

use super::error_code::ErrorCode;
use super::header::{opcode, opcode_name, opcode_since, FrameHeader};
use super::kind::Frame;
use super::{
    ack, cluster, deliver, messages, operate, publish, session, stats, subscribe, tokens, topics,
    users,
};
use crate::error::ProtocolError;
use crate::limits::{FRAME_HEADER_BYTES, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN};
use crate::wire::Reader;

impl Frame {
    /// Appends the whole frame, header included, to `buf`.
    ///
    /// Strings longer than their length field and name fields longer than
    /// [`crate::limits::NAME_BYTES_MAX`] are caller bugs: the client and server validate names
    /// before building frames.
    pub fn encode(&self, request_id: u32, buf: &mut BytesMut) {
        self.encode_as(PROTOCOL_VERSION, request_id, buf)
    }

    /// Appends the whole frame in the layout of protocol `version` (one this build speaks).
    /// A value the version cannot carry is written as its nearest equivalent there, as
    /// docs/protocol.md's changelog says for each.
    pub fn encode_as(&self, version: u16, request_id: u32, buf: &mut BytesMut) {
        assert!(
            (PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION).contains(&version),
            "protocol version {version} is not spoken by this build"
        );
        assert!(
            opcode_since(self.opcode()) <= version,
            "{} does not exist in protocol version {version}",
            self.name()
        );
        if let Frame::Error { code, message } = self {
            let older = ErrorCode::from_u16(*code)
                .map(|c| c.in_version(version) as u16)
                .filter(|older| older != code);
            if let Some(older) = older {
                let frame = Frame::Error {
                    code: older,
                    message: message.clone(),
                };
                return frame.encode_as(version, request_id, buf);
            }
        }
        let start = buf.len();
        buf.put_u32_le(0);
        buf.put_u16_le(self.opcode());
        buf.put_u16_le(0);
        buf.put_u32_le(request_id);
        self.encode_payload(version, buf);
        let payload_len = buf.len() - start - FRAME_HEADER_BYTES;
        assert!(
            payload_len <= u32::MAX as usize,
            "frame payload does not fit u32"
        );
        buf[start..start + 4].copy_from_slice(&(payload_len as u32).to_le_bytes());
    }

    fn encode_payload(&self, version: u16, buf: &mut BytesMut) {
        use opcode::*;
        match self.opcode() {
            HELLO | HELLO_OK | PING | PONG | OK | ERROR => session::encode(self, buf),
            CREATE_TOPIC | DELETE_TOPIC | LIST_TOPICS | DESCRIBE_TOPIC | TOPIC_LIST
            | TOPIC_INFO => topics::encode(self, version, buf),
            PUBLISH | PUBLISHED => publish::encode(self, buf),
            SUBSCRIBE | SUBSCRIBED | UNSUBSCRIBE | CREDIT | DELETE_SUBSCRIPTION => {
                subscribe::encode(self, buf)
            }
            DELIVER => deliver::encode(self, buf),
            ACK | ACK_RESULT | NACK => ack::encode(self, version, buf),
            STATS | STATS_REPLY => stats::encode(self, version, buf),
            MESSAGE_STATUS | MESSAGE_STATUS_REPLY | LIST_MESSAGES | MESSAGE_LIST | REQUEUE_DEAD
            | REQUEUED => messages::encode(self, version, buf),
            USER_ADD | USER_REMOVE | USER_PASSWD | USER_LIST | USER_LIST_REPLY | GRANT | REVOKE => {
                users::encode(self, version, buf)
            }
            TOKEN_CREATE | TOKEN_LIST | TOKEN_REVOKE | TOKEN_CREATED | TOKEN_LIST_REPLY => {
                tokens::encode(self, buf)
            }
            CLUSTER_INFO | CLUSTER_INFO_REPLY => cluster::encode(self, buf),
            LIST_CONNECTIONS | CONNECTION_LIST | CLOSE_CONNECTION | PURGE_TOPIC | PURGED
            | PAUSE_SUBSCRIPTION => operate::encode(self, buf),
            other => unreachable!("opcode {other:#x} has no family"),
        }
    }

    /// Decodes a frame's payload. `payload` must be exactly the bytes after the header.
    pub fn decode(header: &FrameHeader, payload: Bytes) -> Result<Frame, ProtocolError> {
        Frame::decode_as(PROTOCOL_VERSION, header, payload)
    }

    /// Decodes a frame's payload written in the layout of protocol `version`.
    pub fn decode_as(
        version: u16,
        header: &FrameHeader,
        payload: Bytes,
    ) -> Result<Frame, ProtocolError> {
        use opcode::*;
        debug_assert_eq!(payload.len(), header.payload_len as usize);
        if opcode_since(header.opcode) > version {
            return Err(ProtocolError::UnknownOpcode(header.opcode));
        }
        let mut r = Reader::new(payload);
        let frame = match header.opcode {
            HELLO | HELLO_OK | PING | PONG | OK | ERROR => session::decode(header.opcode, &mut r)?,
            CREATE_TOPIC | DELETE_TOPIC | LIST_TOPICS | DESCRIBE_TOPIC | TOPIC_LIST
            | TOPIC_INFO => topics::decode(header.opcode, version, &mut r)?,
            PUBLISH | PUBLISHED => publish::decode(header.opcode, &mut r)?,
            SUBSCRIBE | SUBSCRIBED | UNSUBSCRIBE | CREDIT | DELETE_SUBSCRIPTION => {
                subscribe::decode(header.opcode, &mut r)?
            }
            DELIVER => deliver::decode(header.opcode, &mut r)?,
            ACK | ACK_RESULT | NACK => ack::decode(header.opcode, version, &mut r)?,
            STATS | STATS_REPLY => stats::decode(header.opcode, version, &mut r)?,
            MESSAGE_STATUS | MESSAGE_STATUS_REPLY | LIST_MESSAGES | MESSAGE_LIST | REQUEUE_DEAD
            | REQUEUED => messages::decode(header.opcode, version, &mut r)?,
            USER_ADD | USER_REMOVE | USER_PASSWD | USER_LIST | USER_LIST_REPLY | GRANT | REVOKE => {
                users::decode(header.opcode, &mut r)?
            }
            TOKEN_CREATE | TOKEN_LIST | TOKEN_REVOKE | TOKEN_CREATED | TOKEN_LIST_REPLY => {
                tokens::decode(header.opcode, &mut r)?
            }
            CLUSTER_INFO | CLUSTER_INFO_REPLY => cluster::decode(header.opcode, &mut r)?,
            LIST_CONNECTIONS | CONNECTION_LIST | CLOSE_CONNECTION | PURGE_TOPIC | PURGED
            | PAUSE_SUBSCRIPTION => operate::decode(header.opcode, &mut r)?,
            other => return Err(ProtocolError::UnknownOpcode(other)),
        };
        r.finish(opcode_name(header.opcode))?;
        Ok(frame)
    }
}
