//! The fixed header every frame starts with, and the opcode numbers.
//!
//! Header (12 bytes, little-endian):
//!
//! ```text
//! 0  u32 payload_len   bytes after the header
//! 4  u16 opcode
//! 6  u16 flags         reserved, zero
//! 8  u32 request_id    echoed by the response; 0 = no response wanted on success
//! ```

use crate::error::ProtocolError;
use crate::limits::{FRAME_HEADER_BYTES, PROTOCOL_VERSION_3};

/// The parsed fixed header of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub payload_len: u32,
    pub opcode: u16,
    pub request_id: u32,
}

impl FrameHeader {
    /// Reads a header from the first 12 bytes of `buf`; `None` when fewer are there.
    pub fn peek(buf: &[u8]) -> Result<Option<FrameHeader>, ProtocolError> {
        if buf.len() < FRAME_HEADER_BYTES {
            return Ok(None);
        }
        let payload_len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
        let opcode = u16::from_le_bytes([buf[4], buf[5]]);
        let flags = u16::from_le_bytes([buf[6], buf[7]]);
        let request_id = u32::from_le_bytes([buf[8], buf[9], buf[10], buf[11]]);
        if flags != 0 {
            return Err(ProtocolError::InvalidFlags(flags));
        }
        Ok(Some(FrameHeader {
            payload_len,
            opcode,
            request_id,
        }))
    }

    pub fn frame_len(&self) -> usize {
        FRAME_HEADER_BYTES + self.payload_len as usize
    }
}

macro_rules! opcodes {
    ($($name:ident = $value:expr),* $(,)?) => {
        /// Opcode numbers. Requests are below 0x80, responses and server pushes at 0x80 and above.
        pub mod opcode {
            $(pub const $name: u16 = $value;)*
        }
        pub(crate) fn opcode_name(op: u16) -> &'static str {
            match op { $($value => stringify!($name),)* _ => "UNKNOWN" }
        }
    };
}

/// The protocol version an opcode arrived in. A connection on an older version does not know it:
/// its decoder refuses it as an unknown opcode, exactly as that version's server did.
pub fn opcode_since(op: u16) -> u16 {
    OPCODE_SINCE
        .iter()
        .find(|(o, _)| *o == op)
        .map_or(1, |(_, version)| *version)
}

/// The opcodes newer than version 1, with the version each arrived in.
const OPCODE_SINCE: &[(u16, u16)] = &[
    (opcode::CLUSTER_INFO, PROTOCOL_VERSION_3),
    (opcode::CLUSTER_INFO_REPLY, PROTOCOL_VERSION_3),
    (opcode::PURGE_TOPIC, PROTOCOL_VERSION_3),
    (opcode::PAUSE_SUBSCRIPTION, PROTOCOL_VERSION_3),
    (opcode::LIST_CONNECTIONS, PROTOCOL_VERSION_3),
    (opcode::CLOSE_CONNECTION, PROTOCOL_VERSION_3),
    (opcode::CONNECTION_LIST, PROTOCOL_VERSION_3),
    (opcode::PURGED, PROTOCOL_VERSION_3),
];

opcodes! {
    HELLO = 0x01,
    PING = 0x02,
    PONG = 0x03,
    CREATE_TOPIC = 0x10,
    DELETE_TOPIC = 0x11,
    LIST_TOPICS = 0x12,
    DESCRIBE_TOPIC = 0x13,
    PURGE_TOPIC = 0x14,
    PUBLISH = 0x20,
    SUBSCRIBE = 0x30,
    UNSUBSCRIBE = 0x31,
    CREDIT = 0x32,
    ACK = 0x33,
    NACK = 0x34,
    DELETE_SUBSCRIPTION = 0x35,
    ACK_RESULT = 0x36,
    PAUSE_SUBSCRIPTION = 0x37,
    STATS = 0x40,
    MESSAGE_STATUS = 0x41,
    LIST_MESSAGES = 0x42,
    REQUEUE_DEAD = 0x43,
    LIST_CONNECTIONS = 0x44,
    CLOSE_CONNECTION = 0x45,
    USER_ADD = 0x50,
    USER_REMOVE = 0x51,
    USER_PASSWD = 0x52,
    USER_LIST = 0x53,
    GRANT = 0x54,
    REVOKE = 0x55,
    TOKEN_CREATE = 0x56,
    TOKEN_LIST = 0x57,
    TOKEN_REVOKE = 0x58,
    CLUSTER_INFO = 0x60,
    HELLO_OK = 0x81,
    OK = 0x82,
    ERROR = 0x83,
    PUBLISHED = 0x84,
    TOPIC_LIST = 0x85,
    TOPIC_INFO = 0x86,
    SUBSCRIBED = 0x87,
    DELIVER = 0x88,
    STATS_REPLY = 0x89,
    MESSAGE_STATUS_REPLY = 0x8A,
    MESSAGE_LIST = 0x8B,
    REQUEUED = 0x8C,
    USER_LIST_REPLY = 0x8D,
    TOKEN_CREATED = 0x8E,
    TOKEN_LIST_REPLY = 0x8F,
    CLUSTER_INFO_REPLY = 0xA0,
    CONNECTION_LIST = 0x90,
    PURGED = 0x91,
}
