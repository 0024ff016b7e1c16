//! Users and tokens as USER_LIST_REPLY and TOKEN_LIST_REPLY list them, and the action bits
//! grants carry in each protocol version.

use crate::limits::PROTOCOL_VERSION_3;

/// The action bits of GRANT, REVOKE and USER_LIST_REPLY in versions 1 and 2: 1 publish,
/// 2 consume, 4 inspect, 8 manage.
pub const ACTION_BITS_V1: u8 = 0x0F;

/// The action bits from version 3 on: those of version 1, 16 purge and 32 pause.
pub const ACTION_BITS_V3: u8 = 0x3F;

/// The action bits a connection of protocol `version` knows.
pub fn action_bits_in_version(version: u16) -> u8 {
    if version >= PROTOCOL_VERSION_3 {
        ACTION_BITS_V3
    } else {
        ACTION_BITS_V1
    }
}

/// A user as USER_LIST_REPLY carries it: never a password or a hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserEntry {
    pub name: String,
    pub roles: u8,
    /// How many API tokens the user holds.
    pub tokens: u32,
    /// (pattern, action bits).
    pub grants: Vec<(String, u8)>,
}

/// A token as TOKEN_LIST_REPLY carries it: its name and dates, never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenEntry {
    pub name: String,
    pub created_ms: u64,
    /// 0: never expires.
    pub expires_ms: u64,
}
