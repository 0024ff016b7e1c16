//! TOKEN_CREATE, TOKEN_LIST, TOKEN_REVOKE and their replies.

use bytes::{BufMut, BytesMut};

use super::header::{opcode, opcode_name};
use super::kind::Frame;
use super::user_entry::TokenEntry;
use crate::error::ProtocolError;
use crate::wire::{put_str16, Reader};

/// Writes the payload of a tokens frame.
pub(super) fn encode(frame: &Frame, buf: &mut BytesMut) {
    match frame {
        Frame::TokenList { user } => put_str16(buf, user),
        Frame::TokenCreate {
            user,
            name,
            expires_ms,
        } => {
            put_str16(buf, user);
            put_str16(buf, name);
            buf.put_u64_le(*expires_ms);
        }
        Frame::TokenRevoke { user, name } => {
            put_str16(buf, user);
            put_str16(buf, name);
        }
        Frame::TokenCreated {
            name,
            token,
            expires_ms,
        } => {
            put_str16(buf, name);
            put_str16(buf, token);
            buf.put_u64_le(*expires_ms);
        }
        Frame::TokenListReply { tokens } => {
            buf.put_u32_le(tokens.len() as u32);
            for t in tokens {
                put_str16(buf, &t.name);
                buf.put_u64_le(t.created_ms);
                buf.put_u64_le(t.expires_ms);
            }
        }
        other => unreachable!("{} is not a tokens frame", other.name()),
    }
}

/// Reads the payload of a tokens frame (`opcode` is one of them).
pub(super) fn decode(opcode: u16, r: &mut Reader) -> Result<Frame, ProtocolError> {
    use opcode::*;
    Ok(match opcode {
        TOKEN_CREATE => Frame::TokenCreate {
            user: r.str16("token_create.user")?,
            name: r.str16("token_create.name")?,
            expires_ms: r.u64("token_create.expires_ms")?,
        },
        TOKEN_LIST => Frame::TokenList {
            user: r.str16("token_list.user")?,
        },
        TOKEN_REVOKE => Frame::TokenRevoke {
            user: r.str16("token_revoke.user")?,
            name: r.str16("token_revoke.name")?,
        },
        TOKEN_CREATED => Frame::TokenCreated {
            name: r.str16("token_created.name")?,
            token: r.str16("token_created.token")?,
            expires_ms: r.u64("token_created.expires_ms")?,
        },
        TOKEN_LIST_REPLY => {
            let count = r.u32("token_list_reply.count")?;
            let mut tokens = Vec::new();
            for _ in 0..count {
                tokens.push(TokenEntry {
                    name: r.str16("token_list_reply.name")?,
                    created_ms: r.u64("token_list_reply.created_ms")?,
                    expires_ms: r.u64("token_list_reply.expires_ms")?,
                });
            }
            Frame::TokenListReply { tokens }
        }
        other => unreachable!("{} is not a tokens opcode", opcode_name(other)),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_codec;
    use super::*;

    #[test]
    fn each_frame_roundtrips_and_every_shorter_payload_is_refused() {
        for frame in [
            Frame::TokenCreate {
                user: String::new(),
                name: "ci".into(),
                expires_ms: 0,
            },
            Frame::TokenList { user: "bob".into() },
            Frame::TokenRevoke {
                user: "bob".into(),
                name: "ci".into(),
            },
            Frame::TokenCreated {
                name: "ci".into(),
                token: "fmq_secret".into(),
                expires_ms: 1_800_000_000_000,
            },
            Frame::TokenListReply {
                tokens: vec![TokenEntry {
                    name: "ci".into(),
                    created_ms: 1_700_000_000_000,
                    expires_ms: 0,
                }],
            },
        ] {
            assert_codec(&frame);
        }
    }
}
