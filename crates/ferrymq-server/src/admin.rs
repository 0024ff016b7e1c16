//! The user administration frames (USER_ADD ... TOKEN_REVOKE): who may send each, and the
//! broker call it becomes. Hashing a password takes tens of milliseconds of CPU, so the changes
//! run on the blocking pool rather than on a worker that serves connections.

use ferrymq_broker::auth::{Access, TokenInfo, UserInfo};
use ferrymq_broker::BrokerError;
use ferrymq_protocol::{action_bits_in_version, Frame, TokenEntry, UserEntry};

/// Whether `frame` is one of the administration requests.
pub(crate) fn is_admin(frame: &Frame) -> bool {
    matches!(
        frame,
        Frame::UserAdd { .. }
            | Frame::UserRemove { .. }
            | Frame::UserPasswd { .. }
            | Frame::UserList
            | Frame::Grant { .. }
            | Frame::Revoke { .. }
            | Frame::TokenCreate { .. }
            | Frame::TokenList { .. }
            | Frame::TokenRevoke { .. }
    )
}

/// The user a request names: itself when `user` is empty.
fn target(access: &Access, user: String) -> Result<String, BrokerError> {
    if !user.is_empty() {
        return Ok(user);
    }
    access
        .identity()
        .user()
        .map(str::to_owned)
        .ok_or_else(|| BrokerError::InvalidArgument {
            field: "user",
            reason: "name a user: this connection has none (the broker has no users yet)"
                .to_owned(),
        })
}

async fn blocking<T: Send + 'static>(
    job: impl FnOnce() -> Result<T, BrokerError> + Send + 'static,
) -> Result<T, BrokerError> {
    // The caller's span (who acted) goes along, for the line the change logs.
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(job))
        .await
        .unwrap_or_else(|_| Err(BrokerError::Storage("a user change was interrupted".into())))
}

pub(crate) fn user_entries(users: Vec<UserInfo>) -> Vec<UserEntry> {
    users
        .into_iter()
        .map(|u| UserEntry {
            name: u.name,
            roles: u.roles,
            tokens: u.tokens,
            grants: u.grants,
        })
        .collect()
}

pub(crate) fn token_entries(tokens: Vec<TokenInfo>) -> Vec<TokenEntry> {
    tokens
        .into_iter()
        .map(|t| TokenEntry {
            name: t.name,
            created_ms: t.created_ms,
            expires_ms: t.expires_ms,
        })
        .collect()
}

/// Checks and carries out one administration request for the connection's identity, on a
/// connection of protocol `version`.
pub(crate) async fn handle(
    access: &mut Access,
    frame: Frame,
    version: u16,
) -> Result<Frame, BrokerError> {
    match frame {
        Frame::TokenCreate { .. } | Frame::TokenList { .. } | Frame::TokenRevoke { .. } => {
            handle_token(access, frame)
        }
        other => handle_user(access, other, version).await,
    }
}

/// Refuses action bits that protocol `version` does not know: purge and pause came with version
/// 3, and to an older connection their bits are unknown, as they were before (its listings never
/// show them either).
fn known_actions(actions: u8, version: u16) -> Result<u8, BrokerError> {
    if actions & !action_bits_in_version(version) != 0 {
        return Err(BrokerError::invalid("actions", "unknown action bits"));
    }
    Ok(actions)
}

/// USER_ADD, USER_REMOVE, USER_PASSWD, USER_LIST, GRANT and REVOKE.
async fn handle_user(
    access: &mut Access,
    frame: Frame,
    version: u16,
) -> Result<Frame, BrokerError> {
    let auth = access.auth().clone();
    match frame {
        Frame::UserAdd {
            user,
            password,
            roles,
        } => {
            access.check_admin("add users")?;
            blocking(move || auth.add_user(&user, &password, roles)).await?;
            Ok(Frame::Ok)
        }
        Frame::UserRemove { user } => {
            access.check_admin("remove users")?;
            auth.remove_user(&user)?;
            Ok(Frame::Ok)
        }
        Frame::UserPasswd { user, password } => {
            let user = target(access, user)?;
            access.check_self_or_admin(&user, "change another user's password")?;
            blocking(move || auth.set_password(&user, &password)).await?;
            Ok(Frame::Ok)
        }
        Frame::UserList => {
            access.check_admin("list users")?;
            Ok(Frame::UserListReply {
                users: user_entries(auth.list_users()),
            })
        }
        Frame::Grant {
            user,
            pattern,
            actions,
            roles,
        } => {
            access.check_admin("grant")?;
            auth.grant(&user, &pattern, known_actions(actions, version)?, roles)?;
            Ok(Frame::Ok)
        }
        Frame::Revoke {
            user,
            pattern,
            actions,
            roles,
        } => {
            access.check_admin("revoke")?;
            auth.revoke(&user, &pattern, known_actions(actions, version)?, roles)?;
            Ok(Frame::Ok)
        }
        other => unreachable!("{} is not a user administration frame", other.name()),
    }
}

/// TOKEN_CREATE, TOKEN_LIST and TOKEN_REVOKE.
fn handle_token(access: &mut Access, frame: Frame) -> Result<Frame, BrokerError> {
    let auth = access.auth().clone();
    match frame {
        Frame::TokenCreate {
            user,
            name,
            expires_ms,
        } => {
            let user = target(access, user)?;
            access.check_self_or_admin(&user, "create another user's tokens")?;
            let token = auth.create_token(&user, &name, expires_ms)?;
            Ok(Frame::TokenCreated {
                name,
                token,
                expires_ms,
            })
        }
        Frame::TokenList { user } => {
            let user = target(access, user)?;
            access.check_self_or_admin(&user, "list another user's tokens")?;
            Ok(Frame::TokenListReply {
                tokens: token_entries(auth.list_tokens(&user)?),
            })
        }
        Frame::TokenRevoke { user, name } => {
            let user = target(access, user)?;
            access.check_self_or_admin(&user, "revoke another user's tokens")?;
            auth.revoke_token(&user, &name)?;
            Ok(Frame::Ok)
        }
        other => unreachable!("{} is not a token frame", other.name()),
    }
}
