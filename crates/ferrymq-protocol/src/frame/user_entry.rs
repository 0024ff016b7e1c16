//! Users and tokens as USER_LIST_REPLY and TOKEN_LIST_REPLY list them.

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
