//! HELLO and HELLO_OK (the handshake), PING and PONG, OK and ERROR.

use bytes::{BufMut, BytesMut};

use super::header::{opcode, opcode_name};
use super::kind::Frame;
use crate::error::ProtocolError;
use crate::wire::{put_str16, Reader};

/// Writes the payload of a session frame.
pub(super) fn encode(frame: &Frame, buf: &mut BytesMut) {
    match frame {
        Frame::Hello {
            version_min,
            version_max,
            heartbeat_ms,
            client_name,
            user,
            password,
        } => {
            buf.put_u16_le(*version_min);
            buf.put_u16_le(*version_max);
            buf.put_u32_le(*heartbeat_ms);
            put_str16(buf, client_name);
            put_str16(buf, user);
            put_str16(buf, password);
        }
        Frame::Ping | Frame::Pong | Frame::Ok => {}
        Frame::HelloOk {
            version,
            heartbeat_ms,
            frame_bytes_max,
            message_bytes_max,
            server,
        } => {
            buf.put_u16_le(*version);
            buf.put_u32_le(*heartbeat_ms);
            buf.put_u32_le(*frame_bytes_max);
            buf.put_u32_le(*message_bytes_max);
            put_str16(buf, server);
        }
        Frame::Error { code, message } => {
            buf.put_u16_le(*code);
            put_str16(buf, message);
        }
        other => unreachable!("{} is not a session frame", other.name()),
    }
}

/// Reads the payload of a session frame (`opcode` is one of them).
pub(super) fn decode(opcode: u16, r: &mut Reader) -> Result<Frame, ProtocolError> {
    use opcode::*;
    Ok(match opcode {
        HELLO => Frame::Hello {
            version_min: r.u16("hello.version_min")?,
            version_max: r.u16("hello.version_max")?,
            heartbeat_ms: r.u32("hello.heartbeat_ms")?,
            client_name: r.str16("hello.client_name")?,
            user: r.str16("hello.user")?,
            password: r.str16("hello.password")?,
        },
        PING => Frame::Ping,
        PONG => Frame::Pong,
        HELLO_OK => Frame::HelloOk {
            version: r.u16("hello_ok.version")?,
            heartbeat_ms: r.u32("hello_ok.heartbeat_ms")?,
            frame_bytes_max: r.u32("hello_ok.frame_bytes_max")?,
            message_bytes_max: r.u32("hello_ok.message_bytes_max")?,
            server: r.str16("hello_ok.server")?,
        },
        OK => Frame::Ok,
        ERROR => Frame::Error {
            code: r.u16("error.code")?,
            message: r.str16("error.message")?,
        },
        other => unreachable!("{} is not a session opcode", opcode_name(other)),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_codec;
    use super::*;

    #[test]
    fn each_frame_roundtrips_and_every_shorter_payload_is_refused() {
        for frame in [
            Frame::Hello {
                version_min: 1,
                version_max: 1,
                heartbeat_ms: 5000,
                client_name: "app".into(),
                user: "alice".into(),
                password: "secret".into(),
            },
            Frame::HelloOk {
                version: 1,
                heartbeat_ms: 5000,
                frame_bytes_max: 1 << 20,
                message_bytes_max: 256 << 10,
                server: "ferrymq".into(),
            },
            Frame::Ping,
            Frame::Pong,
            Frame::Ok,
            Frame::error(crate::ErrorCode::UnknownTopic, "no topic \"t\""),
        ] {
            assert_codec(&frame);
        }
    }
}
