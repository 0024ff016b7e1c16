//! USER_ADD, USER_REMOVE, USER_PASSWD, USER_LIST (and its reply), GRANT and REVOKE.

use bytes::{BufMut, BytesMut};

use super::header::{opcode, opcode_name};
use super::kind::Frame;
use super::user_entry::{action_bits_in_version, UserEntry, ACTION_BITS_V3};
use crate::error::ProtocolError;
use crate::wire::{put_str16, Reader};

/// Writes the payload of a users frame in the layout of protocol `version`. A listing written to
/// an older version carries only the action bits that version knows, and leaves out a grant left
/// with none (one of only purge or pause, before version 3).
pub(super) fn encode(frame: &Frame, version: u16, buf: &mut BytesMut) {
    match frame {
        Frame::UserList => {}
        Frame::UserAdd {
            user,
            password,
            roles,
        } => {
            put_str16(buf, user);
            put_str16(buf, password);
            buf.put_u8(*roles);
        }
        Frame::UserRemove { user } => put_str16(buf, user),
        Frame::UserPasswd { user, password } => {
            put_str16(buf, user);
            put_str16(buf, password);
        }
        Frame::Grant {
            user,
            pattern,
            actions,
            roles,
        }
        | Frame::Revoke {
            user,
            pattern,
            actions,
            roles,
        } => {
            put_str16(buf, user);
            put_str16(buf, pattern);
            buf.put_u8(*actions);
            buf.put_u8(*roles);
        }
        Frame::UserListReply { users } => {
            // The bits of later versions than `version`; every other bit is written as it is.
            let newer = ACTION_BITS_V3 & !action_bits_in_version(version);
            buf.put_u32_le(users.len() as u32);
            for u in users {
                put_str16(buf, &u.name);
                buf.put_u8(u.roles);
                buf.put_u32_le(u.tokens);
                let grants: Vec<(&String, u8)> = u
                    .grants
                    .iter()
                    .filter(|(_, actions)| actions & !newer != 0 || actions & newer == 0)
                    .map(|(pattern, actions)| (pattern, actions & !newer))
                    .collect();
                buf.put_u16_le(grants.len() as u16);
                for (pattern, actions) in grants {
                    put_str16(buf, pattern);
                    buf.put_u8(actions);
                }
            }
        }
        other => unreachable!("{} is not a users frame", other.name()),
    }
}

/// Reads the payload of a users frame (`opcode` is one of them).
pub(super) fn decode(opcode: u16, r: &mut Reader) -> Result<Frame, ProtocolError> {
    use opcode::*;
    Ok(match opcode {
        USER_ADD => Frame::UserAdd {
            user: r.str16("user_add.user")?,
            password: r.str16("user_add.password")?,
            roles: r.u8("user_add.roles")?,
        },
        USER_REMOVE => Frame::UserRemove {
            user: r.str16("user_remove.user")?,
        },
        USER_PASSWD => Frame::UserPasswd {
            user: r.str16("user_passwd.user")?,
            password: r.str16("user_passwd.password")?,
        },
        USER_LIST => Frame::UserList,
        GRANT => Frame::Grant {
            user: r.str16("grant.user")?,
            pattern: r.str16("grant.pattern")?,
            actions: r.u8("grant.actions")?,
            roles: r.u8("grant.roles")?,
        },
        REVOKE => Frame::Revoke {
            user: r.str16("revoke.user")?,
            pattern: r.str16("revoke.pattern")?,
            actions: r.u8("revoke.actions")?,
            roles: r.u8("revoke.roles")?,
        },
        USER_LIST_REPLY => {
            let count = r.u32("user_list_reply.count")?;
            // Not preallocated from the count: each entry takes bytes, so a lying count
            // fails as truncated before it costs memory.
            let mut users = Vec::new();
            for _ in 0..count {
                let name = r.str16("user_list_reply.name")?;
                let roles = r.u8("user_list_reply.roles")?;
                let tokens = r.u32("user_list_reply.tokens")?;
                let grant_count = r.u16("user_list_reply.grant_count")?;
                let mut grants = Vec::new();
                for _ in 0..grant_count {
                    grants.push((
                        r.str16("user_list_reply.pattern")?,
                        r.u8("user_list_reply.actions")?,
                    ));
                }
                users.push(UserEntry {
                    name,
                    roles,
                    tokens,
                    grants,
                });
            }
            Frame::UserListReply { users }
        }
        other => unreachable!("{} is not a users opcode", opcode_name(other)),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_codec;
    use super::*;

    #[test]
    fn each_frame_roundtrips_and_every_shorter_payload_is_refused() {
        for frame in [
            Frame::UserAdd {
                user: "bob".into(),
                password: "pw".into(),
                roles: 2,
            },
            Frame::UserRemove { user: "bob".into() },
            Frame::UserPasswd {
                user: String::new(),
                password: "new".into(),
            },
            Frame::UserList,
            Frame::UserListReply {
                users: vec![UserEntry {
                    name: "bob".into(),
                    roles: 1,
                    tokens: 2,
                    grants: vec![("orders.*".into(), 3)],
                }],
            },
            Frame::Grant {
                user: "bob".into(),
                pattern: "orders".into(),
                actions: 1,
                roles: 0,
            },
            Frame::Revoke {
                user: "bob".into(),
                pattern: String::new(),
                actions: 0,
                roles: 2,
            },
        ] {
            assert_codec(&frame);
        }
    }

    #[test]
    fn an_older_version_lists_only_the_actions_it_knows() {
        use crate::frame::FrameHeader;
        use crate::limits::FRAME_HEADER_BYTES;
        let reply = Frame::UserListReply {
            users: vec![UserEntry {
                name: "ops".into(),
                roles: 0,
                tokens: 0,
                grants: vec![("orders".into(), 8 | 16), ("audit".into(), 16 | 32)],
            }],
        };
        let decoded = |version: u16| {
            let mut buf = BytesMut::new();
            reply.encode_as(version, 1, &mut buf);
            let header = FrameHeader::peek(&buf).unwrap().unwrap();
            let payload = buf.split_off(FRAME_HEADER_BYTES).freeze();
            Frame::decode_as(version, &header, payload).unwrap()
        };
        assert_eq!(decoded(3), reply);
        let Frame::UserListReply { users } = decoded(2) else {
            panic!("not a listing")
        };
        assert_eq!(users[0].grants, vec![("orders".to_owned(), 8)]);
    }
}
