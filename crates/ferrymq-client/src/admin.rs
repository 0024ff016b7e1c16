//! User administration over the binary protocol: users, grants and API tokens. Roles and
//! actions are the protocol's bits (`docs/protocol.md`, USER_ADD and GRANT).

use ferrymq_protocol::{Frame, TokenEntry, UserEntry};

use crate::client::{unexpected, Client};
use crate::error::Result;

/// A new API token: `token` is shown this once, the broker keeps only its hash.
#[derive(Clone, PartialEq, Eq)]
pub struct CreatedToken {
    pub name: String,
    pub token: String,
    /// Unix ms; 0: never.
    pub expires_ms: u64,
}

impl std::fmt::Debug for CreatedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatedToken")
            .field("name", &self.name)
            .field("token", &"<redacted>")
            .field("expires_ms", &self.expires_ms)
            .finish()
    }
}

impl Client {
    /// Adds a user (admin only). `roles`: 1 admin, 2 monitor.
    pub async fn user_add(&self, user: &str, password: &str, roles: u8) -> Result<()> {
        self.expect_ok(Frame::UserAdd {
            user: user.to_owned(),
            password: password.to_owned(),
            roles,
        })
        .await
    }

    pub async fn user_remove(&self, user: &str) -> Result<()> {
        self.expect_ok(Frame::UserRemove {
            user: user.to_owned(),
        })
        .await
    }

    /// Sets a password: `user` empty for one's own.
    pub async fn user_passwd(&self, user: &str, password: &str) -> Result<()> {
        self.expect_ok(Frame::UserPasswd {
            user: user.to_owned(),
            password: password.to_owned(),
        })
        .await
    }

    pub async fn user_list(&self) -> Result<Vec<UserEntry>> {
        match self.connection().request(Frame::UserList).await? {
            Frame::UserListReply { users } => Ok(users),
            other => Err(unexpected(&other, "USER_LIST")),
        }
    }

    /// Grants `actions` (1 publish, 2 consume, 4 inspect, 8 manage) on `pattern`, and `roles`.
    pub async fn grant(&self, user: &str, pattern: &str, actions: u8, roles: u8) -> Result<()> {
        self.expect_ok(Frame::Grant {
            user: user.to_owned(),
            pattern: pattern.to_owned(),
            actions,
            roles,
        })
        .await
    }

    pub async fn revoke(&self, user: &str, pattern: &str, actions: u8, roles: u8) -> Result<()> {
        self.expect_ok(Frame::Revoke {
            user: user.to_owned(),
            pattern: pattern.to_owned(),
            actions,
            roles,
        })
        .await
    }

    /// Creates a named token for `user` (empty: oneself), expiring at `expires_ms` (0: never).
    pub async fn token_create(
        &self,
        user: &str,
        name: &str,
        expires_ms: u64,
    ) -> Result<CreatedToken> {
        let request = Frame::TokenCreate {
            user: user.to_owned(),
            name: name.to_owned(),
            expires_ms,
        };
        match self.connection().request(request).await? {
            Frame::TokenCreated {
                name,
                token,
                expires_ms,
            } => Ok(CreatedToken {
                name,
                token,
                expires_ms,
            }),
            other => Err(unexpected(&other, "TOKEN_CREATE")),
        }
    }

    pub async fn token_list(&self, user: &str) -> Result<Vec<TokenEntry>> {
        let request = Frame::TokenList {
            user: user.to_owned(),
        };
        match self.connection().request(request).await? {
            Frame::TokenListReply { tokens } => Ok(tokens),
            other => Err(unexpected(&other, "TOKEN_LIST")),
        }
    }

    pub async fn token_revoke(&self, user: &str, name: &str) -> Result<()> {
        self.expect_ok(Frame::TokenRevoke {
            user: user.to_owned(),
            name: name.to_owned(),
        })
        .await
    }
}
