//! The error codes ERROR frames carry.

/// Error codes carried by ERROR frames. Stable numbers: clients branch on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// The frame could not be decoded; the connection is closed after this error.
    MalformedFrame = 1,
    UnsupportedVersion = 2,
    FrameTooLarge = 3,
    MessageTooLarge = 4,
    UnknownTopic = 5,
    TopicExists = 6,
    /// A bounded topic with the `reject` policy is at its limit.
    TopicFull = 7,
    UnknownConsumer = 8,
    InvalidArgument = 9,
    AuthenticationFailed = 10,
    TooManyConnections = 11,
    /// A request arrived before a successful HELLO.
    HandshakeRequired = 12,
    Internal = 13,
    UnknownSubscription = 14,
    UnknownOpcode = 15,
    ShuttingDown = 16,
    /// A limit other than size was hit (subscriptions, consumers, credit).
    LimitExceeded = 17,
    /// Storage refused the write (disk full, read-only); the request can be retried later.
    StorageUnavailable = 18,
    Conflict = 19,
    /// No such message: never published at that id, or no longer retained.
    UnknownMessage = 20,
    /// The user is authenticated but not allowed this operation on this topic (or at all).
    Forbidden = 21,
    /// A cluster node that does not lead what the request needs (a partition, the metadata):
    /// the message names the leader and its address when known. Retry there. Version 3; older
    /// connections are sent `storage_unavailable`, which also says "retry later".
    NotLeader = 22,
}

impl ErrorCode {
    pub fn from_u16(v: u16) -> Option<ErrorCode> {
        use ErrorCode::*;
        Some(match v {
            1 => MalformedFrame,
            2 => UnsupportedVersion,
            3 => FrameTooLarge,
            4 => MessageTooLarge,
            5 => UnknownTopic,
            6 => TopicExists,
            7 => TopicFull,
            8 => UnknownConsumer,
            9 => InvalidArgument,
            10 => AuthenticationFailed,
            11 => TooManyConnections,
            12 => HandshakeRequired,
            13 => Internal,
            14 => UnknownSubscription,
            15 => UnknownOpcode,
            16 => ShuttingDown,
            17 => LimitExceeded,
            18 => StorageUnavailable,
            19 => Conflict,
            20 => UnknownMessage,
            21 => Forbidden,
            22 => NotLeader,
            _ => return None,
        })
    }

    /// A stable snake_case name, used in logs, the CLI and (later) JSON errors.
    pub fn as_str(self) -> &'static str {
        use ErrorCode::*;
        match self {
            MalformedFrame => "malformed_frame",
            UnsupportedVersion => "unsupported_version",
            FrameTooLarge => "frame_too_large",
            MessageTooLarge => "message_too_large",
            UnknownTopic => "unknown_topic",
            TopicExists => "topic_exists",
            TopicFull => "topic_full",
            UnknownConsumer => "unknown_consumer",
            InvalidArgument => "invalid_argument",
            AuthenticationFailed => "authentication_failed",
            TooManyConnections => "too_many_connections",
            HandshakeRequired => "handshake_required",
            Internal => "internal",
            UnknownSubscription => "unknown_subscription",
            UnknownOpcode => "unknown_opcode",
            ShuttingDown => "shutting_down",
            LimitExceeded => "limit_exceeded",
            StorageUnavailable => "storage_unavailable",
            Conflict => "conflict",
            UnknownMessage => "unknown_message",
            Forbidden => "forbidden",
            NotLeader => "not_leader",
        }
    }

    /// The protocol version the code arrived in.
    pub fn since(self) -> u16 {
        match self {
            ErrorCode::NotLeader => crate::limits::PROTOCOL_VERSION_3,
            _ => 1,
        }
    }

    /// The code to send on a connection of protocol `version`: this one, or the nearest one that
    /// version has (docs/protocol.md, "Versions").
    pub fn in_version(self, version: u16) -> ErrorCode {
        match self {
            code if code.since() <= version => code,
            ErrorCode::NotLeader => ErrorCode::StorageUnavailable,
            code => code,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::Frame;
    use bytes::BytesMut;

    #[test]
    fn a_newer_code_is_sent_as_its_nearest_older_one() {
        let frame = Frame::error(ErrorCode::NotLeader, "node 2 leads orders/0");
        for (version, expected) in [
            (1, ErrorCode::StorageUnavailable),
            (2, ErrorCode::StorageUnavailable),
            (3, ErrorCode::NotLeader),
        ] {
            let mut buf = BytesMut::new();
            frame.encode_as(version, 7, &mut buf);
            let decoder = crate::frame::FrameDecoder::new(1 << 20);
            let (_, decoded) = decoder.decode_as(version, &mut buf).unwrap().unwrap();
            let Frame::Error { code, message } = decoded else {
                panic!("{decoded:?}")
            };
            assert_eq!(code, expected as u16, "version {version}");
            assert_eq!(message, "node 2 leads orders/0");
        }
    }
}
