//! The access decision of one connection or request: its identity and the decisions it already
//! asked [`Auth`] for, dropped whenever users change.

use super::*;

/// One connection's (or one HTTP request's) view of [`Auth`]: its identity and the decisions it
/// has already asked for, valid while the generation does not move.
pub struct Access {
    auth: Arc<Auth>,
    who: Identity,
    generation: u64,
    /// Unix ms when the identity's token expires; 0: never.
    expires_ms: u64,
    cache: HashMap<Box<str>, u8>,
}

impl Access {
    pub fn new(auth: Arc<Auth>, who: Identity) -> Access {
        Access {
            generation: 0,
            auth,
            who,
            expires_ms: 0,
            cache: HashMap::new(),
        }
    }

    pub fn identity(&self) -> &Identity {
        &self.who
    }

    pub fn auth(&self) -> &Arc<Auth> {
        &self.auth
    }

    /// Re-checks the identity when anything changed since the last check, or its token expired.
    pub fn refresh(&mut self) -> Result<(), BrokerError> {
        let generation = self.auth.generation();
        let expired = self.expires_ms != 0 && self.expires_ms <= unix_ms();
        if generation != self.generation || expired {
            self.cache.clear();
            self.expires_ms = self.auth.validate(&self.who)?;
            self.generation = generation;
        }
        Ok(())
    }

    /// What the identity may do on `topic` (action bits; 0: invisible).
    pub fn rights(&mut self, topic: &str) -> Result<u8, BrokerError> {
        self.refresh()?;
        if let Some(&bits) = self.cache.get(topic) {
            return Ok(bits);
        }
        let bits = self.auth.rights(&self.who, topic);
        if self.cache.len() >= CACHED_TOPICS_MAX {
            self.cache.clear();
        }
        self.cache.insert(topic.into(), bits);
        Ok(bits)
    }

    /// Allows `action` on `topic`, or says why not: a topic the identity has no right on is
    /// answered as unknown (its existence stays hidden), one it sees as `forbidden`.
    pub fn check(&mut self, action: Action, topic: &str) -> Result<(), BrokerError> {
        let bits = self.rights(topic)?;
        if bits & action.bit() != 0 {
            Ok(())
        } else if bits == 0 {
            Err(BrokerError::UnknownTopic(topic.to_owned()))
        } else {
            let verb = match action {
                Action::Publish => "publish to",
                Action::Consume => "consume from",
                Action::Inspect => "inspect",
                Action::Manage => "manage",
                Action::Purge => "purge",
                Action::Pause => "pause subscriptions of",
            };
            let needs = match action {
                Action::Purge | Action::Pause => {
                    format!(" (needs the {} or manage action)", action.as_str())
                }
                _ => String::new(),
            };
            Err(BrokerError::Forbidden(format!(
                "{} may not {verb} topic '{topic}'{needs}",
                self.who.describe()
            )))
        }
    }

    /// Whether the identity may see `topic` in listings and statistics.
    pub fn sees(&mut self, topic: &str) -> Result<bool, BrokerError> {
        Ok(self.rights(topic)? != 0)
    }

    pub fn roles(&mut self) -> Result<u8, BrokerError> {
        self.refresh()?;
        Ok(self.auth.roles(&self.who))
    }

    /// Allows what only an admin may do (`what` names it in the refusal).
    pub fn check_admin(&mut self, what: &str) -> Result<(), BrokerError> {
        if self.roles()? & ROLE_ADMIN != 0 {
            return Ok(());
        }
        Err(BrokerError::Forbidden(format!(
            "{} may not {what}: it needs the admin role",
            self.who.describe()
        )))
    }

    /// Allows what a user may do to itself, and an admin to anyone.
    pub fn check_self_or_admin(&mut self, user: &str, what: &str) -> Result<(), BrokerError> {
        self.refresh()?;
        if self.who.user() == Some(user) {
            return Ok(());
        }
        self.check_admin(what)
    }

    /// Allows reading the broker's metrics: the monitor and admin roles.
    pub fn check_monitor(&mut self, what: &str) -> Result<(), BrokerError> {
        if self.roles()? & (ROLE_ADMIN | ROLE_MONITOR) != 0 {
            return Ok(());
        }
        Err(BrokerError::Forbidden(format!(
            "{} may not {what}: it needs the monitor or admin role",
            self.who.describe()
        )))
    }
}
