//! Changing users: adding and removing them, their passwords, grants, roles and API tokens,
//! each through [`Auth::change`], which keeps an admin among the users and commits the change
//! (to the cluster first when there is one) before it takes effect; and `reset-admin`, offline.

use super::*;

impl Auth {
    /// Refuses a change of `user` from `current` to `next` that would leave users but no admin
    /// among them. Called under the serial lock, so the other users cannot change meanwhile.
    fn check_an_admin_remains(
        &self,
        user: &str,
        current: Option<&UserRecord>,
        next: Option<&UserRecord>,
    ) -> Result<(), BrokerError> {
        let is_admin = |r: Option<&UserRecord>| r.is_some_and(|r| r.roles & ROLE_ADMIN != 0);
        if is_admin(next) {
            return Ok(());
        }
        let state = self.state.read();
        let others = state.users.iter().filter(|(name, _)| name.as_str() != user);
        let other_admins = others
            .clone()
            .filter(|(_, u)| u.record.roles & ROLE_ADMIN != 0)
            .count();
        let users_after = others.count() + next.is_some() as usize;
        if other_admins > 0 || (users_after == 0 && current.is_none()) {
            return Ok(());
        }
        Err(BrokerError::Conflict(match (current, next) {
            (None, _) => format!(
                "the first user must have the admin role: with users and no admin, nobody could administer the broker; add '{user}' with the admin role"
            ),
            (Some(_), Some(_)) => format!(
                "'{user}' is the last admin: revoking its admin role would leave the broker without an admin; give another user the admin role first"
            ),
            (Some(_), None) => format!(
                "'{user}' is the last admin: removing it would leave the broker without an admin; give another user the admin role first"
            ),
        }))
    }

    /// Applies a change to one user's record: committed by the cluster first when there is one
    /// ([`UserReplicator`]), stored, then visible, then the generation moves. `change` gets the
    /// current record (`None`: no such user) and returns the new one (`None`: remove the user).
    fn change(
        &self,
        user: &str,
        change: impl FnOnce(Option<&UserRecord>) -> Result<Option<UserRecord>, BrokerError>,
    ) -> Result<(), BrokerError> {
        let _serial = self.serial.lock();
        let current = self.state.read().users.get(user).map(|u| u.record.clone());
        let next = change(current.as_ref())?;
        self.check_an_admin_remains(user, current.as_ref(), next.as_ref())?;
        let parsed = next.clone().map(User::new).transpose()?;
        if let Some(replicator) = self.replicator.get() {
            replicator.replicate(user, next.as_ref().map(encode_record))?;
        }
        self.install(user, next.as_ref(), parsed)
    }

    /// Stores `next` as `user`'s record (`None`: removes the user), makes it visible and moves
    /// the generation. Called under the serial lock.
    pub(super) fn install(
        &self,
        user: &str,
        next: Option<&UserRecord>,
        parsed: Option<User>,
    ) -> Result<(), BrokerError> {
        if let Some(store) = &self.store {
            match next {
                Some(record) => store.put_user(user, &encode_record(record))?,
                None => store.remove_user(user)?,
            }
        }
        {
            let mut state = self.state.write();
            state.tokens.retain(|_, (owner, _)| owner != user);
            match parsed {
                Some(parsed) => {
                    for token in &parsed.record.tokens {
                        if let Some(hash) = from_hex(&token.hash) {
                            state
                                .tokens
                                .insert(hash, (user.to_owned(), token.name.clone()));
                        }
                    }
                    state.users.insert(user.to_owned(), parsed);
                }
                None => {
                    state.users.remove(user);
                }
            }
            self.enabled
                .store(!state.users.is_empty(), Ordering::Release);
        }
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        self.changes.send_replace(generation);
        Ok(())
    }

    pub fn add_user(&self, name: &str, password: &str, roles: u8) -> Result<(), BrokerError> {
        crate::validate_name("user", name)?;
        validate_password(password)?;
        if roles & !ROLES_ALL != 0 {
            return Err(BrokerError::invalid("roles", "unknown role bits"));
        }
        let hash = hash_password(password)?;
        let users = self.user_count();
        self.change(name, |current| {
            if current.is_some() {
                return Err(BrokerError::Conflict(format!(
                    "user '{name}' already exists"
                )));
            }
            if users >= USERS_MAX {
                return Err(BrokerError::LimitExceeded(format!(
                    "the broker holds its maximum of {USERS_MAX} users"
                )));
            }
            Ok(Some(UserRecord {
                password_hash: hash,
                roles,
                grants: Vec::new(),
                tokens: Vec::new(),
            }))
        })?;
        tracing::info!(user = name, roles = %roles_to_string(roles), "user added");
        Ok(())
    }

    /// Creates the first admin when no user exists; returns whether it did.
    pub fn bootstrap_admin(&self, name: &str, password: &str) -> Result<bool, BrokerError> {
        if self.enabled() {
            return Ok(false);
        }
        self.add_user(name, password, ROLE_ADMIN)?;
        Ok(true)
    }

    pub fn remove_user(&self, name: &str) -> Result<(), BrokerError> {
        self.change(name, |current| match current {
            None => Err(unknown_user(name)),
            Some(_) => Ok(None),
        })?;
        tracing::info!(user = name, "user removed");
        Ok(())
    }

    pub fn set_password(&self, name: &str, password: &str) -> Result<(), BrokerError> {
        validate_password(password)?;
        let hash = hash_password(password)?;
        self.change(name, |current| {
            let mut record = current.cloned().ok_or_else(|| unknown_user(name))?;
            record.password_hash = hash;
            Ok(Some(record))
        })?;
        tracing::info!(user = name, "password changed");
        Ok(())
    }

    pub fn list_users(&self) -> Vec<UserInfo> {
        let state = self.state.read();
        let mut out: Vec<UserInfo> = state
            .users
            .iter()
            .map(|(name, user)| UserInfo {
                name: name.clone(),
                roles: user.record.roles,
                grants: user
                    .record
                    .grants
                    .iter()
                    .map(|g| (g.pattern.clone(), g.actions))
                    .collect(),
                tokens: user.record.tokens.len() as u32,
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Adds `actions` on `pattern` (empty: no topic grant) and `roles` to a user.
    pub fn grant(
        &self,
        user: &str,
        pattern: &str,
        actions: u8,
        roles: u8,
    ) -> Result<(), BrokerError> {
        let parsed = check_grant_arguments(pattern, actions, roles)?;
        self.change(user, |current| {
            let mut record = current.cloned().ok_or_else(|| unknown_user(user))?;
            record.roles |= roles;
            if let Some(parsed) = &parsed {
                let key = parsed.to_string();
                let count = record.grants.len();
                match record.grants.iter_mut().find(|g| g.pattern == key) {
                    Some(grant) => grant.actions |= actions,
                    None if count >= GRANTS_PER_USER_MAX => {
                        return Err(BrokerError::LimitExceeded(format!(
                            "user '{user}' holds its maximum of {GRANTS_PER_USER_MAX} grants"
                        )))
                    }
                    None => record.grants.push(GrantRecord {
                        pattern: key,
                        actions,
                    }),
                }
            }
            Ok(Some(record))
        })?;
        tracing::info!(user, pattern, actions = %actions_to_string(actions), roles = %roles_to_string(roles), "granted");
        Ok(())
    }

    /// Takes `actions` on exactly `pattern` and `roles` away from a user; a grant left without
    /// actions goes.
    pub fn revoke(
        &self,
        user: &str,
        pattern: &str,
        actions: u8,
        roles: u8,
    ) -> Result<(), BrokerError> {
        let parsed = check_grant_arguments(pattern, actions, roles)?;
        self.change(user, |current| {
            let mut record = current.cloned().ok_or_else(|| unknown_user(user))?;
            record.roles &= !roles;
            if let Some(parsed) = &parsed {
                let key = parsed.to_string();
                let Some(grant) = record.grants.iter_mut().find(|g| g.pattern == key) else {
                    return Err(BrokerError::invalid(
                        "grant pattern",
                        format!("user '{user}' has no grant on '{key}'"),
                    ));
                };
                grant.actions &= !actions;
                record.grants.retain(|g| g.actions != 0);
            }
            Ok(Some(record))
        })?;
        tracing::info!(user, pattern, actions = %actions_to_string(actions), roles = %roles_to_string(roles), "revoked");
        Ok(())
    }

    /// Creates a named token for `user`, valid until `expires_ms` (unix ms; 0: never). Returns
    /// the token: it is shown this once and stored only as its hash.
    pub fn create_token(
        &self,
        user: &str,
        name: &str,
        expires_ms: u64,
    ) -> Result<String, BrokerError> {
        crate::validate_name("token name", name)?;
        if expires_ms != 0 && expires_ms <= unix_ms() {
            return Err(BrokerError::invalid("expires", "the expiry is in the past"));
        }
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret)
            .map_err(|e| BrokerError::Storage(format!("no randomness for a token: {e}")))?;
        let token = format!("{TOKEN_PREFIX}{}", to_hex(&secret));
        let hash = to_hex(&token_hash(&token));
        self.change(user, |current| {
            let mut record = current.cloned().ok_or_else(|| unknown_user(user))?;
            if record.tokens.iter().any(|t| t.name == name) {
                return Err(BrokerError::Conflict(format!(
                    "user '{user}' already has a token named '{name}'"
                )));
            }
            if record.tokens.len() >= TOKENS_PER_USER_MAX {
                return Err(BrokerError::LimitExceeded(format!(
                    "user '{user}' holds its maximum of {TOKENS_PER_USER_MAX} tokens"
                )));
            }
            record.tokens.push(TokenRecord {
                name: name.to_owned(),
                hash,
                created_ms: unix_ms(),
                expires_ms,
            });
            Ok(Some(record))
        })?;
        tracing::info!(user, token = name, expires_ms, "API token created");
        Ok(token)
    }

    pub fn list_tokens(&self, user: &str) -> Result<Vec<TokenInfo>, BrokerError> {
        let state = self.state.read();
        let record = &state
            .users
            .get(user)
            .ok_or_else(|| unknown_user(user))?
            .record;
        Ok(record
            .tokens
            .iter()
            .map(|t| TokenInfo {
                name: t.name.clone(),
                created_ms: t.created_ms,
                expires_ms: t.expires_ms,
            })
            .collect())
    }

    pub fn revoke_token(&self, user: &str, name: &str) -> Result<(), BrokerError> {
        self.change(user, |current| {
            let mut record = current.cloned().ok_or_else(|| unknown_user(user))?;
            let before = record.tokens.len();
            record.tokens.retain(|t| t.name != name);
            if record.tokens.len() == before {
                return Err(BrokerError::UnknownToken {
                    user: user.to_owned(),
                    name: name.to_owned(),
                });
            }
            Ok(Some(record))
        })?;
        tracing::info!(user, token = name, "API token revoked");
        Ok(())
    }
}

fn unknown_user(name: &str) -> BrokerError {
    BrokerError::UnknownUser(name.to_owned())
}

fn check_grant_arguments(
    pattern: &str,
    actions: u8,
    roles: u8,
) -> Result<Option<Pattern>, BrokerError> {
    if actions & !ACTIONS_ALL != 0 {
        return Err(BrokerError::invalid("actions", "unknown action bits"));
    }
    if roles & !ROLES_ALL != 0 {
        return Err(BrokerError::invalid("roles", "unknown role bits"));
    }
    if pattern.is_empty() {
        if actions != 0 {
            return Err(BrokerError::invalid(
                "grant pattern",
                "actions need a topic pattern (a name, a prefix such as orders.*, or *)",
            ));
        }
        if roles == 0 {
            return Err(BrokerError::invalid(
                "grant",
                "name a topic pattern with actions, or a role",
            ));
        }
        return Ok(None);
    }
    if actions == 0 {
        return Err(BrokerError::invalid(
            "actions",
            "name at least one of publish, consume, inspect, manage, purge, pause",
        ));
    }
    Pattern::parse(pattern).map(Some)
}

/// Sets the password of `user` in a stopped broker's data dir, creating the user if missing, and
/// makes it an admin: the way back in after a lost admin password.
pub fn reset_admin(
    data_dir: &std::path::Path,
    user: &str,
    password: &str,
) -> Result<bool, BrokerError> {
    crate::validate_name("user", user)?;
    validate_password(password)?;
    let path = data_dir.join("meta.redb");
    if !path.exists() {
        return Err(BrokerError::Storage(format!(
            "{} does not exist: is {} a FerryMQ data dir?",
            path.display(),
            data_dir.display()
        )));
    }
    let store = MetaStore::open(&path).map_err(|e| match e {
        BrokerError::Storage(why) => BrokerError::Storage(format!(
            "{why} (is the broker still running? stop it first)"
        )),
        other => other,
    })?;
    let existing = store
        .load_users()?
        .into_iter()
        .find(|(name, _)| name == user)
        .map(|(_, bytes)| serde_json::from_slice::<UserRecord>(&bytes))
        .transpose()
        .map_err(|e| {
            BrokerError::Storage(format!("user '{user}' has an unreadable record: {e}"))
        })?;
    let created = existing.is_none();
    let mut record = existing.unwrap_or(UserRecord {
        password_hash: String::new(),
        roles: 0,
        grants: Vec::new(),
        tokens: Vec::new(),
    });
    record.password_hash = hash_password(password)?;
    record.roles |= ROLE_ADMIN;
    store.put_user(
        user,
        &serde_json::to_vec(&record).expect("a user record serializes"),
    )?;
    Ok(created)
}
