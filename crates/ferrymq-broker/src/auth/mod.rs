//! Users, grants, API tokens, and the one function that decides what a user may do
//! ([`Auth::rights`]); every transport asks it through a per-connection [`Access`] and only maps
//! its answer onto its own error.
//!
//! Model:
//! - A user has an Argon2id password hash, roles (`admin`: everything, users included;
//!   `monitor`: inspect every topic and read `/metrics`) and grants. A grant is a topic pattern
//!   (an exact name, a prefix such as `orders.*`, or `*`) with actions: publish, consume,
//!   inspect, manage, purge, pause.
//! - `manage` implies `purge` and `pause` (who may delete a topic may empty it; who may delete a
//!   subscription may stop its deliveries), so that grants made before the two existed keep what
//!   they allowed; `purge` and `pause` alone allow only themselves. The implication is applied
//!   where rights are computed ([`effective_actions`]); grants are stored and listed as given.
//! - A dead-letter topic `<source>.dlq` is granted what `<source>` is.
//! - While no user exists the broker is open: anyone may do anything (the loopback-only mode).
//!   Once one exists, a connection must authenticate, and what is not granted is refused.
//! - Once users exist, one of them is an admin: a change that would leave users and no admin
//!   (the first user without the admin role, the last admin's role revoked, the last admin
//!   removed) is refused, so that the broker always stays administrable without a restart.
//! - A topic the user has no right on at all is answered as an unknown topic, so that names
//!   cannot be probed; a topic it sees but may not act on that way is `forbidden`.
//! - API tokens are 256 random bits, shown once at creation and stored as their SHA-256 only.
//!
//! Invariants:
//! - Neither a password nor a token nor a hash ever leaves this module in an error message or a
//!   log line; errors name the user or the token's name, never the secret.
//! - Every change to users, grants or tokens is stored durably (when the broker has a data dir)
//!   before it is visible, and bumps [`Auth::generation`]: an [`Access`] re-checks its identity and
//!   drops its cached decisions at its next check, so a revocation applies at once.
//! - A check costs one atomic load and one lookup in the connection's cache; a miss costs
//!   O(grants of one user).
//!
//! Along its concepts: `policy` (actions, roles, patterns), this module (the users held, their
//! authentication and rights), `users` (changes to users and tokens), `replicated` (users held
//! by a cluster), `failures` (slowing repeated failed logins), `access` (one connection's
//! cached decisions).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::clock::unix_ms;
use crate::error::BrokerError;
use crate::meta::MetaStore;

mod access;
mod failures;
mod policy;
mod replicated;
mod users;

pub use access::Access;
pub use policy::*;
pub use replicated::UserReplicator;
pub use users::reset_admin;

/// Shortest password accepted: nothing guessable in a few tries is created.
pub const PASSWORD_BYTES_MIN: usize = 8;
/// Longest password accepted (the protocol's string limit is far above; hashing cost is not).
pub const PASSWORD_BYTES_MAX: usize = 1024;
/// Grants one user may hold: each check of a new topic walks them.
pub const GRANTS_PER_USER_MAX: usize = 1024;
/// Tokens one user may hold.
pub const TOKENS_PER_USER_MAX: usize = 256;
/// Users a broker holds: 10 000 with 10 grants each load in well under a second.
pub const USERS_MAX: usize = 100_000;
/// Addresses whose failed logins are remembered; the oldest is forgotten past this, so a flood
/// of addresses costs bounded memory.
pub const FAILURE_ADDRESSES_MAX: usize = 4096;
/// Failed logins from one address before its answers are slowed, by default: a person who
/// mistypes gets a few tries at full speed.
pub const FAILURES_FREE_DEFAULT: u32 = 3;
/// The slowest answer to a repeated failure.
const FAILURE_DELAY_MAX: Duration = Duration::from_secs(5);
/// A quiet address's failures are forgotten after this.
const FAILURE_MEMORY: Duration = Duration::from_secs(600);
/// Topic decisions one connection caches; past this the cache starts again (a connection that
/// touches more topics than this pays a grant walk per miss, nothing more).
const CACHED_TOPICS_MAX: usize = 1024;
/// Prefix of every API token, so that one found in a file or a log is recognisable.
pub const TOKEN_PREFIX: &str = "fmq_";

/// A user as stored in the metadata store (JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct UserRecord {
    /// Argon2id in the PHC string format (algorithm, parameters, salt and hash).
    pub password_hash: String,
    pub roles: u8,
    #[serde(default)]
    pub grants: Vec<GrantRecord>,
    #[serde(default)]
    pub tokens: Vec<TokenRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct GrantRecord {
    pub pattern: String,
    pub actions: u8,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TokenRecord {
    pub name: String,
    /// SHA-256 of the token, hex.
    pub hash: String,
    pub created_ms: u64,
    /// Unix ms after which the token is refused; 0: never.
    pub expires_ms: u64,
}

struct User {
    record: UserRecord,
    grants: Vec<(Pattern, u8)>,
}

impl User {
    fn new(record: UserRecord) -> Result<User, BrokerError> {
        let grants = record
            .grants
            .iter()
            .map(|g| Ok((Pattern::parse(&g.pattern)?, g.actions)))
            .collect::<Result<_, BrokerError>>()?;
        Ok(User { record, grants })
    }

    /// What this user may do on `topic`: O(grants).
    fn rights(&self, topic: &str) -> u8 {
        if self.record.roles & ROLE_ADMIN != 0 {
            return ACTIONS_ALL;
        }
        let mut bits = 0;
        if self.record.roles & ROLE_MONITOR != 0 {
            bits |= ACTION_INSPECT;
        }
        let source = crate::headers::dead_letter_source(topic);
        for (pattern, actions) in &self.grants {
            if pattern.matches(topic) || source.is_some_and(|s| pattern.matches(s)) {
                bits |= actions;
            }
        }
        effective_actions(bits)
    }
}

#[derive(Default)]
struct State {
    users: HashMap<String, User>,
    /// Token hash → (user, token name).
    tokens: HashMap<[u8; 32], (String, String)>,
}

/// Who a connection or request authenticated as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// No credentials, on a broker without users.
    Anonymous,
    User {
        name: Arc<str>,
        /// The hash of the token used, if a token was.
        token: Option<[u8; 32]>,
    },
}

impl Identity {
    pub fn user(&self) -> Option<&str> {
        match self {
            Identity::Anonymous => None,
            Identity::User { name, .. } => Some(name),
        }
    }

    /// How the identity appears in logs: the user name and whether a token was used.
    pub fn describe(&self) -> String {
        match self {
            Identity::Anonymous => "anonymous".to_owned(),
            Identity::User { name, token: None } => format!("user '{name}'"),
            Identity::User {
                name,
                token: Some(_),
            } => format!("user '{name}' (token)"),
        }
    }
}

/// A user as listed: no hash, no token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub roles: u8,
    pub grants: Vec<(String, u8)>,
    pub tokens: u32,
}

/// A token as listed: its name and dates, never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenInfo {
    pub name: String,
    pub created_ms: u64,
    /// 0: never expires.
    pub expires_ms: u64,
}

/// Counters of failed logins, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailureCounts {
    /// Logins refused (wrong or unknown credentials, expired or revoked tokens).
    pub failures: u64,
    /// Refusals answered late because their address had failed repeatedly.
    pub delayed: u64,
    /// Addresses remembered now.
    pub addresses: usize,
}

#[derive(Default)]
struct Failures {
    by_address: HashMap<IpAddr, (u32, Instant)>,
}

/// The users of one broker and the decisions over them.
pub struct Auth {
    state: RwLock<State>,
    /// Whether any user exists: read on every connection's first check.
    enabled: AtomicBool,
    generation: AtomicU64,
    store: Option<Arc<MetaStore>>,
    /// Serialises changes, so that the store and memory see them in the same order. Password
    /// hashing happens before it is taken.
    serial: Mutex<()>,
    /// Verified against for an unknown user, so that it costs what a wrong password does.
    dummy_hash: OnceLock<String>,
    failures: Mutex<Failures>,
    failures_total: AtomicU64,
    delayed_total: AtomicU64,
    /// See [`FAILURES_FREE_DEFAULT`].
    failures_free: std::sync::atomic::AtomicU32,
    connections: Mutex<HashMap<String, usize>>,
    /// Carries the generation: streams wait on it to notice a revocation while idle.
    changes: tokio::sync::watch::Sender<u64>,
    /// Passwords verified lately, by SHA-256 of (user, password), with the generation they were
    /// verified at: HTTP clients send their password with every request, and an Argon2 check
    /// per request would cost more than the request. Only successes are kept, so a wrong
    /// password always costs a full check; any change to users forgets them all.
    verified: Mutex<HashMap<[u8; 32], (Identity, u64)>>,
    /// In a cluster: commits every change to the cluster's users before it applies here.
    replicator: OnceLock<Arc<dyn UserReplicator>>,
    /// The cluster's users last taken, with the generation they left: taken again unchanged,
    /// nothing is compared record by record.
    replicated_seen: Mutex<Option<(u64, replicated::Records)>>,
}

/// A user's record as it is stored and replicated.
fn encode_record(record: &UserRecord) -> Vec<u8> {
    serde_json::to_vec(record).expect("a user record serializes")
}

/// Verified passwords remembered at most (about 100 bytes each).
const VERIFIED_MAX: usize = 4096;

fn hash_password(password: &str) -> Result<String, BrokerError> {
    let mut salt = [0u8; 16];
    getrandom::fill(&mut salt)
        .map_err(|e| BrokerError::Storage(format!("no randomness for a salt: {e}")))?;
    let salt = SaltString::encode_b64(&salt).expect("16 bytes make a valid salt");
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|hash| hash.to_string())
        .map_err(|e| BrokerError::Storage(format!("cannot hash a password: {e}")))
}

fn verify_password(password: &str, hash: &str) -> bool {
    match PasswordHash::new(hash) {
        Ok(parsed) => Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok(),
        Err(_) => false,
    }
}

fn verified_key(user: &str, password: &str) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update((user.len() as u64).to_le_bytes());
    hasher.update(user.as_bytes());
    hasher.update(password.as_bytes());
    hasher.finalize().into()
}

fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}

fn from_hex(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, chunk) in text.as_bytes().chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16);
        out[i] = (digit(chunk[0])? * 16 + digit(chunk[1])?) as u8;
    }
    Some(out)
}

pub(crate) fn validate_password(password: &str) -> Result<(), BrokerError> {
    if password.len() < PASSWORD_BYTES_MIN || password.len() > PASSWORD_BYTES_MAX {
        return Err(BrokerError::invalid(
            "password",
            format!("must be {PASSWORD_BYTES_MIN} to {PASSWORD_BYTES_MAX} bytes long"),
        ));
    }
    Ok(())
}

fn authentication_failed() -> BrokerError {
    // One answer for an unknown user and a wrong password: which part was wrong stays unsaid.
    BrokerError::AuthenticationFailed("wrong user name or password".to_owned())
}

impl Auth {
    /// Users as loaded from the store (`None`: a broker without a data dir keeps them in memory).
    pub(crate) fn open(store: Option<Arc<MetaStore>>) -> Result<Auth, BrokerError> {
        let mut state = State::default();
        if let Some(store) = &store {
            for (name, bytes) in store.load_users()? {
                let record: UserRecord = serde_json::from_slice(&bytes).map_err(|e| {
                    BrokerError::Storage(format!("user '{name}' has an unreadable record: {e}"))
                })?;
                for token in &record.tokens {
                    let hash = from_hex(&token.hash).ok_or_else(|| {
                        BrokerError::Storage(format!(
                            "token '{}' of user '{name}' has an unreadable hash",
                            token.name
                        ))
                    })?;
                    state
                        .tokens
                        .insert(hash, (name.clone(), token.name.clone()));
                }
                let user = User::new(record).map_err(|e| {
                    BrokerError::Storage(format!("user '{name}' has an invalid grant: {e}"))
                })?;
                state.users.insert(name, user);
            }
        }
        Ok(Auth {
            enabled: AtomicBool::new(!state.users.is_empty()),
            state: RwLock::new(state),
            generation: AtomicU64::new(1),
            store,
            serial: Mutex::new(()),
            dummy_hash: OnceLock::new(),
            failures: Mutex::new(Failures::default()),
            failures_total: AtomicU64::new(0),
            delayed_total: AtomicU64::new(0),
            failures_free: std::sync::atomic::AtomicU32::new(FAILURES_FREE_DEFAULT),
            connections: Mutex::new(HashMap::new()),
            changes: tokio::sync::watch::Sender::new(1),
            verified: Mutex::new(HashMap::new()),
            replicator: OnceLock::new(),
            replicated_seen: Mutex::new(None),
        })
    }

    /// Changes (to a new generation) whenever users, grants or tokens change.
    pub fn watch_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Whether any user exists: then every connection must authenticate.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Acquire)
    }

    /// Changes with every change to users, grants or tokens.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn user_count(&self) -> usize {
        self.state.read().users.len()
    }

    /// Checks credentials as HELLO and HTTP carry them: a user and a password; an empty user
    /// and a token as the password; or nothing at all, accepted only while no user exists.
    pub fn authenticate(&self, user: &str, secret: &str) -> Result<Identity, BrokerError> {
        match (user.is_empty(), secret.is_empty()) {
            (true, true) if !self.enabled() => Ok(Identity::Anonymous),
            (true, true) => Err(BrokerError::AuthenticationFailed(
                "this broker requires credentials: a user and password, or an API token".to_owned(),
            )),
            // Credentials that cannot be right are refused rather than ignored: a user who
            // gives them expects them to matter.
            _ if !self.enabled() => Err(BrokerError::AuthenticationFailed(
                "this broker has no users: connect without credentials, or create the first \
                 admin (FERRYMQ_ADMIN_PASSWORD) to use them"
                    .to_owned(),
            )),
            (true, false) => self.authenticate_token(secret),
            (false, _) => self.authenticate_password(user, secret),
        }
    }

    /// The user a verified client certificate names (mutual TLS): the TLS layer has checked the
    /// certificate against the client CA, so the name stands in for a password. A name that is
    /// no user is refused; on a broker without users the certificate adds nothing.
    pub fn authenticate_certificate(&self, name: &str) -> Result<Identity, BrokerError> {
        if !self.enabled() {
            return Ok(Identity::Anonymous);
        }
        match self.state.read().users.contains_key(name) {
            true => Ok(Identity::User {
                name: Arc::from(name),
                token: None,
            }),
            false => Err(BrokerError::AuthenticationFailed(format!(
                "the client certificate names '{name}', which is not a user of this broker: \
                 create the user (ferrymq user add) or log in with a password or token"
            ))),
        }
    }

    /// The identity of credentials verified since the last change to users, if these are; else
    /// `None`, and [`Auth::authenticate_and_remember`] does the full check.
    pub fn remembered(&self, user: &str, secret: &str) -> Option<Identity> {
        if user.is_empty() {
            return None;
        }
        let key = verified_key(user, secret);
        let generation = self.generation();
        match self.verified.lock().get(&key) {
            Some((identity, at)) if *at == generation => Some(identity.clone()),
            _ => None,
        }
    }

    /// [`Auth::authenticate`], remembering a verified password (see `verified`).
    pub fn authenticate_and_remember(
        &self,
        user: &str,
        secret: &str,
    ) -> Result<Identity, BrokerError> {
        let generation = self.generation();
        let identity = self.authenticate(user, secret)?;
        if !user.is_empty() {
            let mut verified = self.verified.lock();
            verified.retain(|_, (_, at)| *at == generation);
            if verified.len() >= VERIFIED_MAX {
                verified.clear();
            }
            verified.insert(verified_key(user, secret), (identity.clone(), generation));
        }
        Ok(identity)
    }

    fn authenticate_password(&self, user: &str, password: &str) -> Result<Identity, BrokerError> {
        let hash = self
            .state
            .read()
            .users
            .get(user)
            .map(|u| u.record.password_hash.clone());
        match hash {
            Some(hash) if verify_password(password, &hash) => Ok(Identity::User {
                name: Arc::from(user),
                token: None,
            }),
            Some(_) => Err(authentication_failed()),
            None => {
                // The same work as a wrong password, so that timing does not tell which users
                // exist.
                let dummy = self
                    .dummy_hash
                    .get_or_init(|| hash_password("not a password of anyone").unwrap_or_default());
                let _ = verify_password(password, dummy);
                Err(authentication_failed())
            }
        }
    }

    fn authenticate_token(&self, token: &str) -> Result<Identity, BrokerError> {
        let hash = token_hash(token);
        let state = self.state.read();
        let Some((user, name)) = state.tokens.get(&hash) else {
            return Err(BrokerError::AuthenticationFailed(
                "unknown or revoked API token".to_owned(),
            ));
        };
        let record = state
            .users
            .get(user)
            .and_then(|u| u.record.tokens.iter().find(|t| &t.name == name));
        match record {
            Some(t) if t.expires_ms != 0 && t.expires_ms <= unix_ms() => {
                Err(BrokerError::AuthenticationFailed(format!(
                    "API token '{name}' of user '{user}' has expired"
                )))
            }
            Some(_) => Ok(Identity::User {
                name: Arc::from(user.as_str()),
                token: Some(hash),
            }),
            None => Err(BrokerError::AuthenticationFailed(
                "unknown or revoked API token".to_owned(),
            )),
        }
    }

    /// Whether `who` is still valid (its user exists, its token is neither revoked nor expired),
    /// and until when (unix ms; 0: no expiry).
    pub fn validate(&self, who: &Identity) -> Result<u64, BrokerError> {
        match who {
            Identity::Anonymous if self.enabled() => Err(BrokerError::AuthenticationFailed(
                "users were configured after this connection was opened: reconnect with \
                 credentials"
                    .to_owned(),
            )),
            Identity::Anonymous => Ok(0),
            Identity::User { name, token } => {
                let state = self.state.read();
                let Some(user) = state.users.get(&**name) else {
                    return Err(BrokerError::AuthenticationFailed(format!(
                        "user '{name}' was removed"
                    )));
                };
                let Some(hash) = token else { return Ok(0) };
                let Some((_, token_name)) = state.tokens.get(hash) else {
                    return Err(BrokerError::AuthenticationFailed(format!(
                        "the API token of user '{name}' was revoked"
                    )));
                };
                let expires_ms = user
                    .record
                    .tokens
                    .iter()
                    .find(|t| &t.name == token_name)
                    .map_or(0, |t| t.expires_ms);
                if expires_ms != 0 && expires_ms <= unix_ms() {
                    return Err(BrokerError::AuthenticationFailed(format!(
                        "API token '{token_name}' of user '{name}' has expired"
                    )));
                }
                Ok(expires_ms)
            }
        }
    }

    /// What `who` may do on `topic`, as action bits; 0 means the topic is invisible to it. The
    /// one decision every transport's check comes down to. O(grants of one user).
    pub fn rights(&self, who: &Identity, topic: &str) -> u8 {
        match who {
            Identity::Anonymous => {
                if self.enabled() {
                    0
                } else {
                    ACTIONS_ALL
                }
            }
            Identity::User { name, .. } => self
                .state
                .read()
                .users
                .get(&**name)
                .map_or(0, |u| u.rights(topic)),
        }
    }

    /// `who`'s roles (all of them while the broker is open).
    pub fn roles(&self, who: &Identity) -> u8 {
        match who {
            Identity::Anonymous if !self.enabled() => ROLES_ALL,
            Identity::Anonymous => 0,
            Identity::User { name, .. } => self
                .state
                .read()
                .users
                .get(&**name)
                .map_or(0, |u| u.record.roles),
        }
    }

    /// Counts a connection of `who` against `max` per user (0: no limit); the slot is given
    /// back when dropped.
    pub fn admit(
        self: &Arc<Self>,
        who: &Identity,
        max: usize,
    ) -> Result<ConnectionSlot, BrokerError> {
        let Some(user) = who.user() else {
            return Ok(ConnectionSlot { auth: None });
        };
        if max == 0 {
            return Ok(ConnectionSlot { auth: None });
        }
        let mut connections = self.connections.lock();
        let count = connections.entry(user.to_owned()).or_insert(0);
        if *count >= max {
            return Err(BrokerError::LimitExceeded(format!(
                "user '{user}' already has {max} connections, its maximum"
            )));
        }
        *count += 1;
        Ok(ConnectionSlot {
            auth: Some((self.clone(), user.to_owned())),
        })
    }
}

/// One connection counted against its user's limit.
pub struct ConnectionSlot {
    auth: Option<(Arc<Auth>, String)>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        if let Some((auth, user)) = self.auth.take() {
            let mut connections = auth.connections.lock();
            if let Some(count) = connections.get_mut(&user) {
                *count -= 1;
                if *count == 0 {
                    connections.remove(&user);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// An auth with one admin, `owner`, as every broker with users has.
    fn auth() -> Arc<Auth> {
        let auth = Arc::new(Auth::open(None).unwrap());
        auth.add_user("owner", "owner-password", ROLE_ADMIN)
            .unwrap();
        auth
    }

    #[test]
    fn patterns_parse_and_match() {
        assert_eq!(Pattern::parse("*").unwrap(), Pattern::Any);
        assert_eq!(
            Pattern::parse("orders.*").unwrap(),
            Pattern::Prefix("orders.".into())
        );
        assert!(Pattern::parse("orders.*").unwrap().matches("orders.eu"));
        assert!(!Pattern::parse("orders.*").unwrap().matches("orders"));
        assert!(Pattern::parse("orders").unwrap().matches("orders"));
        assert!(!Pattern::parse("orders").unwrap().matches("orders2"));
        for bad in ["", "a*b", "**", "a b", "*.x", "ä"] {
            let error = Pattern::parse(bad).unwrap_err().to_string();
            assert!(error.contains("grant pattern"), "{bad}: {error}");
        }
    }

    #[test]
    fn an_open_broker_allows_anonymous_until_a_user_exists() {
        let auth = Arc::new(Auth::open(None).unwrap());
        let mut anonymous = Access::new(auth.clone(), auth.authenticate("", "").unwrap());
        anonymous.check(Action::Manage, "t").unwrap();
        let error = auth.authenticate("alice", "alice-password").unwrap_err();
        assert!(error.to_string().contains("no users"), "{error}");
        auth.add_user("alice", "alice-password", ROLE_ADMIN)
            .unwrap();
        let error = anonymous.check(Action::Publish, "t").unwrap_err();
        assert!(
            matches!(error, BrokerError::AuthenticationFailed(_)),
            "{error}"
        );
        assert!(matches!(
            auth.authenticate("", "").unwrap_err(),
            BrokerError::AuthenticationFailed(_)
        ));
    }

    #[test]
    fn grants_decide_and_unseen_topics_look_unknown() {
        let auth = auth();
        auth.add_user("alice", "alice-password", 0).unwrap();
        auth.grant("alice", "orders.*", ACTION_PUBLISH, 0).unwrap();
        auth.grant("alice", "audit", ACTION_INSPECT, 0).unwrap();
        let who = auth.authenticate("alice", "alice-password").unwrap();
        let mut access = Access::new(auth.clone(), who);
        access.check(Action::Publish, "orders.eu").unwrap();
        // The dead-letter topic follows its source.
        access.check(Action::Publish, "orders.eu.dlq").unwrap();
        assert!(matches!(
            access.check(Action::Consume, "orders.eu").unwrap_err(),
            BrokerError::Forbidden(_)
        ));
        assert!(matches!(
            access.check(Action::Publish, "payments").unwrap_err(),
            BrokerError::UnknownTopic(_)
        ));
        assert!(matches!(
            access.check(Action::Publish, "audit").unwrap_err(),
            BrokerError::Forbidden(_)
        ));
        // A revocation applies at the next check.
        auth.revoke("alice", "orders.*", ACTION_PUBLISH, 0).unwrap();
        assert!(matches!(
            access.check(Action::Publish, "orders.eu").unwrap_err(),
            BrokerError::UnknownTopic(_)
        ));
        assert_eq!(
            auth.list_users()[0].grants,
            vec![("audit".into(), ACTION_INSPECT)]
        );
    }

    #[test]
    fn purge_and_pause_are_grants_of_their_own_and_manage_implies_them() {
        let auth = auth();
        auth.add_user("oncall", "oncall-password", 0).unwrap();
        auth.add_user("keeper", "keeper-password", 0).unwrap();
        auth.grant("oncall", "orders", ACTION_PURGE, 0).unwrap();
        auth.grant("oncall", "audit", ACTION_PAUSE, 0).unwrap();
        auth.grant("keeper", "orders", ACTION_MANAGE, 0).unwrap();
        let access = |name: &str, password: &str| {
            Access::new(auth.clone(), auth.authenticate(name, password).unwrap())
        };
        let forbidden = |result: Result<(), BrokerError>| match result {
            Err(BrokerError::Forbidden(why)) => why,
            other => panic!("not forbidden: {other:?}"),
        };

        let mut oncall = access("oncall", "oncall-password");
        oncall.check(Action::Purge, "orders").unwrap();
        oncall.check(Action::Purge, "orders.dlq").unwrap();
        let why = forbidden(oncall.check(Action::Manage, "orders"));
        assert_eq!(why, "user 'oncall' may not manage topic 'orders'");
        let why = forbidden(oncall.check(Action::Pause, "orders"));
        assert_eq!(
            why,
            "user 'oncall' may not pause subscriptions of topic 'orders' (needs the pause or manage action)"
        );
        oncall.check(Action::Pause, "audit").unwrap();
        let why = forbidden(oncall.check(Action::Purge, "audit"));
        assert!(why.contains("needs the purge or manage action"), "{why}");
        // Purge or pause alone makes the topic visible, nothing more.
        assert!(matches!(
            oncall.check(Action::Inspect, "orders").unwrap_err(),
            BrokerError::Forbidden(_)
        ));

        // Grants made before purge and pause existed keep what they allowed.
        let mut keeper = access("keeper", "keeper-password");
        for action in [Action::Manage, Action::Purge, Action::Pause] {
            keeper.check(action, "orders").unwrap();
        }
        let mut admin = access("owner", "owner-password");
        for action in [Action::Purge, Action::Pause] {
            admin.check(action, "anything").unwrap();
        }
        // Listed as granted, the implication not spelled out.
        let users = auth.list_users();
        let keeper = users.iter().find(|u| u.name == "keeper").unwrap();
        assert_eq!(keeper.grants, vec![("orders".into(), ACTION_MANAGE)]);
    }

    #[test]
    fn actions_parse_and_print_by_name() {
        assert_eq!(
            parse_actions("purge, pause").unwrap(),
            ACTION_PURGE | ACTION_PAUSE
        );
        assert_eq!(parse_actions("all").unwrap(), ACTIONS_ALL);
        assert_eq!(
            actions_to_string(ACTION_INSPECT | ACTION_PURGE | ACTION_PAUSE),
            "inspect,purge,pause"
        );
        let error = parse_actions("purge,delete").unwrap_err().to_string();
        assert!(error.contains("manage, purge, pause or all"), "{error}");
        assert_eq!(
            effective_actions(ACTION_MANAGE),
            ACTION_MANAGE | ACTION_PURGE | ACTION_PAUSE
        );
        assert_eq!(effective_actions(ACTION_PURGE), ACTION_PURGE);
    }

    #[test]
    fn wrong_and_unknown_credentials_get_the_same_answer() {
        let auth = auth();
        auth.add_user("alice", "alice-password", 0).unwrap();
        let wrong = auth.authenticate("alice", "wrong-password").unwrap_err();
        let unknown = auth.authenticate("bob", "wrong-password").unwrap_err();
        assert_eq!(wrong, unknown);
        assert!(!wrong.to_string().contains("wrong-password"));
    }

    #[test]
    fn tokens_authenticate_until_revoked_or_expired_and_are_stored_hashed() {
        let auth = auth();
        auth.add_user("svc", "svc-password", 0).unwrap();
        auth.grant("svc", "*", ACTION_PUBLISH, 0).unwrap();
        let token = auth.create_token("svc", "deploy", 0).unwrap();
        assert!(token.starts_with(TOKEN_PREFIX) && token.len() == TOKEN_PREFIX.len() + 64);
        let stored = serde_json::to_string(&auth.state.read().users["svc"].record).unwrap();
        assert!(!stored.contains(&token[TOKEN_PREFIX.len()..]));
        let who = auth.authenticate("", &token).unwrap();
        let mut access = Access::new(auth.clone(), who);
        access.check(Action::Publish, "x").unwrap();
        auth.revoke_token("svc", "deploy").unwrap();
        assert!(matches!(
            access.check(Action::Publish, "x").unwrap_err(),
            BrokerError::AuthenticationFailed(_)
        ));
        assert!(auth.authenticate("", &token).is_err());
        let soon = auth.create_token("svc", "soon", unix_ms() + 50).unwrap();
        let mut access = Access::new(auth.clone(), auth.authenticate("", &soon).unwrap());
        access.check(Action::Publish, "x").unwrap();
        std::thread::sleep(Duration::from_millis(80));
        let error = access.check(Action::Publish, "x").unwrap_err();
        assert!(error.to_string().contains("expired"), "{error}");
        assert!(auth
            .authenticate("", &soon)
            .unwrap_err()
            .to_string()
            .contains("expired"));
    }

    #[test]
    fn roles_and_admin_checks() {
        let auth = auth();
        auth.add_user("root", "root-password", ROLE_ADMIN).unwrap();
        auth.add_user("watch", "watch-password", ROLE_MONITOR)
            .unwrap();
        let mut watch = Access::new(
            auth.clone(),
            auth.authenticate("watch", "watch-password").unwrap(),
        );
        watch.check(Action::Inspect, "anything").unwrap();
        watch.check_monitor("read metrics").unwrap();
        assert!(matches!(
            watch.check(Action::Publish, "anything"),
            Err(BrokerError::Forbidden(_))
        ));
        assert!(matches!(
            watch.check_admin("add users"),
            Err(BrokerError::Forbidden(_))
        ));
        watch
            .check_self_or_admin("watch", "change passwords")
            .unwrap();
        let mut root = Access::new(
            auth.clone(),
            auth.authenticate("root", "root-password").unwrap(),
        );
        root.check_admin("add users").unwrap();
        root.check(Action::Manage, "t").unwrap();
        auth.remove_user("root").unwrap();
        assert!(matches!(
            root.check_admin("add users"),
            Err(BrokerError::AuthenticationFailed(_))
        ));
    }

    #[test]
    fn no_change_leaves_users_without_an_admin() {
        let open = Arc::new(Auth::open(None).unwrap());
        // A first user without the admin role would lock the broker: refused, nothing stored.
        let error = open.add_user("alice", "alice-password", 0).unwrap_err();
        assert!(matches!(error, BrokerError::Conflict(_)), "{error}");
        assert!(error
            .to_string()
            .contains("first user must have the admin role"));
        assert!(!open.enabled(), "still open, still administrable");

        let auth = auth();
        auth.add_user("alice", "alice-password", ROLE_MONITOR)
            .unwrap();
        // The last admin may neither lose its role nor go.
        let error = auth.revoke("owner", "", 0, ROLE_ADMIN).unwrap_err();
        assert!(
            error.to_string().contains("'owner' is the last admin"),
            "{error}"
        );
        let error = auth.remove_user("owner").unwrap_err();
        assert!(
            error.to_string().contains("'owner' is the last admin"),
            "{error}"
        );
        let owner = auth
            .list_users()
            .into_iter()
            .find(|u| u.name == "owner")
            .unwrap();
        assert_eq!(owner.roles, ROLE_ADMIN, "nothing changed");
        // With a second admin, either may step down, and then the other is the last.
        auth.grant("alice", "", 0, ROLE_ADMIN).unwrap();
        auth.revoke("owner", "", 0, ROLE_ADMIN).unwrap();
        assert!(
            auth.remove_user("alice").is_err(),
            "alice is now the last admin"
        );
        auth.remove_user("owner").unwrap();
        // Other changes to the last admin stay allowed.
        auth.set_password("alice", "another-password").unwrap();
        auth.grant("alice", "orders", ACTION_PUBLISH, 0).unwrap();
    }

    #[test]
    fn bad_arguments_are_refused_with_their_reason() {
        let auth = auth();
        assert!(auth
            .add_user("alice", "short", 0)
            .unwrap_err()
            .to_string()
            .contains("password"));
        assert!(auth.add_user("a b", "long-enough", 0).is_err());
        auth.add_user("alice", "long-enough", 0).unwrap();
        assert!(matches!(
            auth.add_user("alice", "long-enough", 0),
            Err(BrokerError::Conflict(_))
        ));
        assert!(auth
            .grant("alice", "a*b", ACTION_PUBLISH, 0)
            .unwrap_err()
            .to_string()
            .contains("pattern"));
        assert!(auth.grant("alice", "a", 0, 0).is_err());
        assert!(auth
            .grant("nobody", "a", ACTION_PUBLISH, 0)
            .unwrap_err()
            .to_string()
            .contains("nobody"));
        assert!(parse_actions("publish,fly")
            .unwrap_err()
            .to_string()
            .contains("fly"));
        assert_eq!(
            parse_actions("publish, consume").unwrap(),
            ACTION_PUBLISH | ACTION_CONSUME
        );
    }

    #[test]
    fn repeated_failures_are_slowed_and_the_table_is_bounded() {
        let auth = auth();
        let address: IpAddr = "10.0.0.1".parse().unwrap();
        for _ in 0..FAILURES_FREE_DEFAULT {
            assert_eq!(auth.login_failed(address), Duration::ZERO);
        }
        assert_eq!(auth.login_failed(address), Duration::from_millis(100));
        assert_eq!(auth.login_failed(address), Duration::from_millis(200));
        auth.login_succeeded(address);
        assert_eq!(auth.login_failed(address), Duration::ZERO);
        for i in 0..(FAILURE_ADDRESSES_MAX as u32 + 10) {
            auth.login_failed(IpAddr::from(i.to_be_bytes()));
        }
        assert!(auth.failure_counts().addresses <= FAILURE_ADDRESSES_MAX);
        assert_eq!(auth.failure_counts().delayed, 2);
    }

    #[test]
    fn ten_thousand_users_with_ten_grants_load_fast_and_check_in_grants_of_one() {
        let dir = std::env::temp_dir().join(format!("ferrymq-auth-10k-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (auth, loaded) = auth_with_users(&dir, 10_000);
        assert_eq!(auth.user_count(), 10_000);
        // Unoptimised test builds are several times slower than a release build; the target
        // (under 1 s in release) is measured in docs/security-benchmarks.md.
        assert!(loaded < Duration::from_secs(5), "{loaded:?}");
        let who = auth.authenticate("user9999", "the-same-password").unwrap();
        let mut access = Access::new(auth.clone(), who);
        access.check(Action::Publish, "team9999.area9.x").unwrap();
        assert!(access.check(Action::Publish, "team1.area1.x").is_err());
        println!("loaded 10 000 users with 10 grants each in {loaded:?}");
        drop(access);
        drop(auth);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// An `Auth` over a fresh store holding `count` users with 10 pattern grants each, all with
    /// one password hash (hashing each would take minutes; loading does not look at them).
    fn auth_with_users(dir: &Path, count: usize) -> (Arc<Auth>, Duration) {
        let store = Arc::new(MetaStore::open(&dir.join("meta.redb")).unwrap());
        let hash = hash_password("the-same-password").unwrap();
        let users: Vec<(String, Vec<u8>)> = (0..count)
            .map(|u| {
                let record = UserRecord {
                    password_hash: hash.clone(),
                    roles: 0,
                    grants: (0..10)
                        .map(|g| GrantRecord {
                            pattern: format!("team{u}.area{g}.*"),
                            actions: ACTION_PUBLISH,
                        })
                        .collect(),
                    tokens: Vec::new(),
                };
                (format!("user{u}"), serde_json::to_vec(&record).unwrap())
            })
            .collect();
        store.put_users(&users).unwrap();
        let started = Instant::now();
        let auth = Arc::new(Auth::open(Some(store)).unwrap());
        (auth, started.elapsed())
    }

    /// Nanoseconds per publish check of user 0 on topics its last grant matches: each topic new
    /// to the connection (a miss walks the user's grants) or the same one (the cached answer).
    fn check_ns(auth: &Arc<Auth>, misses: bool) -> f64 {
        let who = Identity::User {
            name: Arc::from("user0"),
            token: None,
        };
        let mut access = Access::new(auth.clone(), who);
        let topics: Vec<String> = (0..1000).map(|i| format!("team0.area9.t{i}")).collect();
        let rounds = 200;
        let started = Instant::now();
        for _ in 0..rounds {
            for topic in &topics {
                let topic = if misses { topic } else { &topics[0] };
                access.check(Action::Publish, topic).unwrap();
            }
            if misses {
                // A fresh connection: every topic is new again.
                access = Access::new(auth.clone(), access.identity().clone());
            }
        }
        started.elapsed().as_nanos() as f64 / (rounds * topics.len()) as f64
    }

    /// The micro-benchmark of docs/benchmarks.md: a permission check costs the same with one
    /// user or ten thousand (it looks at the grants of the caller only), and 10 000 users load
    /// in under a second. Run optimised:
    /// `cargo test --release -p ferrymq-broker --lib checks_cost_the_same -- --ignored --nocapture`
    #[test]
    #[ignore = "a micro-benchmark: run optimised, see its doc"]
    fn checks_cost_the_same_with_one_user_or_ten_thousand() {
        let base = std::env::temp_dir().join(format!("ferrymq-auth-bench-{}", std::process::id()));
        let mut results = Vec::new();
        for count in [1, 10_000] {
            let dir = base.join(count.to_string());
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let (auth, loaded) = auth_with_users(&dir, count);
            let (miss, hit) = (check_ns(&auth, true), check_ns(&auth, false));
            println!(
                "{count} users x 10 grants: loaded in {loaded:?}; check of a new topic {miss:.0} ns, of a cached one {hit:.0} ns"
            );
            results.push((loaded, miss, hit));
        }
        let _ = std::fs::remove_dir_all(&base);
        let (one, many) = (results[0], results[1]);
        assert!(
            many.0 < Duration::from_secs(1),
            "10 000 users loaded in {:?}",
            many.0
        );
        // O(users) would be 10 000 times slower; noise on a shared machine is under 3x, plus
        // a few tens of nanoseconds of timer and cache effects on a check this short.
        assert!(
            many.1 < one.1 * 3.0 + 100.0,
            "miss: {} ns vs {} ns",
            many.1,
            one.1
        );
        assert!(
            many.2 < one.2 * 3.0 + 100.0,
            "hit: {} ns vs {} ns",
            many.2,
            one.2
        );
    }

    #[test]
    fn connections_per_user_are_capped() {
        let auth = auth();
        auth.add_user("alice", "alice-password", 0).unwrap();
        let who = auth.authenticate("alice", "alice-password").unwrap();
        let first = auth.admit(&who, 1).unwrap();
        assert!(matches!(
            auth.admit(&who, 1),
            Err(BrokerError::LimitExceeded(_))
        ));
        drop(first);
        auth.admit(&who, 1).unwrap();
    }
}
