//! The operator's frames (version 3): LIST_CONNECTIONS and its reply CONNECTION_LIST,
//! CLOSE_CONNECTION, PURGE_TOPIC and its reply PURGED, and PAUSE_SUBSCRIPTION.

use bytes::{BufMut, BytesMut};

use super::fields::{read_flags, read_name};
use super::header::{opcode, opcode_name};
use super::kind::Frame;
use crate::error::ProtocolError;
use crate::limits::LIST_LIMIT_MAX;
use crate::wire::{put_str16, Reader};

/// CONNECTION_LIST's `flags` bit: the connection is over TLS.
pub const CONNECTION_TLS: u8 = 1;
/// PAUSE_SUBSCRIPTION's `flags` bit: pause (clear: resume).
pub const PAUSE: u8 = 1;

/// Fixed bytes of one CONNECTION_LIST entry besides its three strings' bytes.
const CONNECTION_ENTRY_FIXED_BYTES: usize = 8 + 1 + 1 + 3 * 2 + 8 + 4 + 4 + 6 * 8;

/// A connection as CONNECTION_LIST carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionEntry {
    pub id: u64,
    /// 0 binary protocol, 1 HTTP stream.
    pub listener: u8,
    pub tls: bool,
    pub peer: String,
    /// Empty: anonymous.
    pub user: String,
    /// As the client sent it in HELLO.
    pub client_name: String,
    /// Unix ms.
    pub connected_ms: u64,
    pub subscriptions: u32,
    pub consumers: u32,
    pub messages_in: u64,
    pub bytes_in: u64,
    pub messages_out: u64,
    pub bytes_out: u64,
    pub credit: u64,
    pub unacked: u64,
}

fn encode_entry(c: &ConnectionEntry, buf: &mut BytesMut) {
    buf.put_u64_le(c.id);
    buf.put_u8(c.listener);
    buf.put_u8(if c.tls { CONNECTION_TLS } else { 0 });
    put_str16(buf, &c.peer);
    put_str16(buf, &c.user);
    put_str16(buf, &c.client_name);
    buf.put_u64_le(c.connected_ms);
    buf.put_u32_le(c.subscriptions);
    buf.put_u32_le(c.consumers);
    for counter in [
        c.messages_in,
        c.bytes_in,
        c.messages_out,
        c.bytes_out,
        c.credit,
        c.unacked,
    ] {
        buf.put_u64_le(counter);
    }
}

fn decode_entry(r: &mut Reader) -> Result<ConnectionEntry, ProtocolError> {
    Ok(ConnectionEntry {
        id: r.u64("connection.id")?,
        listener: r.u8("connection.listener")?,
        tls: read_flags(r, "connection.flags", CONNECTION_TLS)? & CONNECTION_TLS != 0,
        peer: r.str16("connection.peer")?,
        user: r.str16("connection.user")?,
        client_name: r.str16("connection.client_name")?,
        connected_ms: r.u64("connection.connected_ms")?,
        subscriptions: r.u32("connection.subscriptions")?,
        consumers: r.u32("connection.consumers")?,
        messages_in: r.u64("connection.messages_in")?,
        bytes_in: r.u64("connection.bytes_in")?,
        messages_out: r.u64("connection.messages_out")?,
        bytes_out: r.u64("connection.bytes_out")?,
        credit: r.u64("connection.credit")?,
        unacked: r.u64("connection.unacked")?,
    })
}

/// Writes the payload of an operator frame.
pub(super) fn encode(frame: &Frame, buf: &mut BytesMut) {
    match frame {
        Frame::ListConnections { after, limit } => {
            buf.put_u64_le(*after);
            buf.put_u32_le(*limit);
        }
        Frame::ConnectionList {
            total,
            next_after,
            connections,
        } => {
            buf.put_u64_le(*total);
            buf.put_u64_le(*next_after);
            buf.put_u32_le(connections.len() as u32);
            for c in connections {
                encode_entry(c, buf);
            }
        }
        Frame::CloseConnection { id } => buf.put_u64_le(*id),
        Frame::PurgeTopic { name } => put_str16(buf, name),
        Frame::Purged { messages } => buf.put_u64_le(*messages),
        Frame::PauseSubscription {
            topic,
            subscription,
            paused,
        } => {
            put_str16(buf, topic);
            put_str16(buf, subscription);
            buf.put_u8(if *paused { PAUSE } else { 0 });
        }
        other => unreachable!("{} is not an operator frame", other.name()),
    }
}

/// Reads the payload of an operator frame (`opcode` is one of them).
pub(super) fn decode(opcode: u16, r: &mut Reader) -> Result<Frame, ProtocolError> {
    use opcode::*;
    Ok(match opcode {
        LIST_CONNECTIONS => {
            let after = r.u64("list_connections.after")?;
            let limit = r.u32("list_connections.limit")?;
            if limit == 0 || limit > LIST_LIMIT_MAX {
                return Err(ProtocolError::invalid(
                    "list_connections.limit",
                    format!("{limit}: must be 1..={LIST_LIMIT_MAX}"),
                ));
            }
            Frame::ListConnections { after, limit }
        }
        CONNECTION_LIST => {
            let total = r.u64("connection_list.total")?;
            let next_after = r.u64("connection_list.next_after")?;
            let count = r.u32("connection_list.count")?;
            // Each entry takes at least its fixed bytes: a count the payload cannot hold is
            // refused before anything is allocated for it.
            if count as usize > r.remaining() / CONNECTION_ENTRY_FIXED_BYTES {
                return Err(ProtocolError::Truncated {
                    field: "connection_list.connections",
                });
            }
            let connections = (0..count)
                .map(|_| decode_entry(r))
                .collect::<Result<_, _>>()?;
            Frame::ConnectionList {
                total,
                next_after,
                connections,
            }
        }
        CLOSE_CONNECTION => Frame::CloseConnection {
            id: r.u64("close_connection.id")?,
        },
        PURGE_TOPIC => Frame::PurgeTopic {
            name: read_name(r, "purge_topic.name")?,
        },
        PURGED => Frame::Purged {
            messages: r.u64("purged.messages")?,
        },
        PAUSE_SUBSCRIPTION => Frame::PauseSubscription {
            topic: read_name(r, "pause_subscription.topic")?,
            subscription: read_name(r, "pause_subscription.subscription")?,
            paused: read_flags(r, "pause_subscription.flags", PAUSE)? & PAUSE != 0,
        },
        other => unreachable!("{} is not an operator opcode", opcode_name(other)),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_codec;
    use super::*;
    use bytes::Bytes;

    fn entry() -> ConnectionEntry {
        ConnectionEntry {
            id: 42,
            listener: 0,
            tls: true,
            peer: "127.0.0.1:50000".into(),
            user: "alice".into(),
            client_name: "ferrymq-python/0.1".into(),
            connected_ms: 1_700_000_000_000,
            subscriptions: 1,
            consumers: 2,
            messages_in: 3,
            bytes_in: 4,
            messages_out: 5,
            bytes_out: 6,
            credit: 7,
            unacked: 8,
        }
    }

    #[test]
    fn each_frame_roundtrips_and_every_shorter_payload_is_refused() {
        for frame in [
            Frame::ListConnections {
                after: 0,
                limit: 100,
            },
            Frame::ConnectionList {
                total: 1,
                next_after: 0,
                connections: vec![entry()],
            },
            Frame::CloseConnection { id: 42 },
            Frame::PurgeTopic {
                name: "orders".into(),
            },
            Frame::Purged { messages: 1000 },
            Frame::PauseSubscription {
                topic: "orders".into(),
                subscription: "billing".into(),
                paused: true,
            },
        ] {
            assert_codec(&frame);
        }
    }

    #[test]
    fn an_entry_has_the_fixed_size_it_claims() {
        let mut buf = BytesMut::new();
        let mut c = entry();
        (c.peer, c.user, c.client_name) = (String::new(), String::new(), String::new());
        encode_entry(&c, &mut buf);
        assert_eq!(buf.len(), CONNECTION_ENTRY_FIXED_BYTES);
    }

    #[test]
    fn a_limit_outside_the_range_and_unknown_flags_are_refused() {
        use crate::frame::FrameHeader;
        let decode = |op: u16, payload: Vec<u8>| {
            let header = FrameHeader {
                payload_len: payload.len() as u32,
                opcode: op,
                request_id: 1,
            };
            Frame::decode(&header, Bytes::from(payload))
        };
        let mut zero = 0u64.to_le_bytes().to_vec();
        zero.extend(0u32.to_le_bytes());
        assert!(decode(opcode::LIST_CONNECTIONS, zero).is_err());
        let mut pause = vec![1, 0, b't', 1, 0, b's'];
        pause.push(2);
        assert!(decode(opcode::PAUSE_SUBSCRIPTION, pause).is_err());
    }
}
