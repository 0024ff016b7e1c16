//! The session table of one HTTP listener and the check of a request's session cookie, apart
//! from the routes that open and end sessions ([`crate::session`], whose module doc states the
//! invariants), so that the authorization of every request reads sessions without depending on
//! the login route, which checks passwords through it.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::{header, HeaderMap, Method, StatusCode};
use ferrymq_broker::{Auth, Identity};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::ApiError;

/// The cookie's name.
pub const SESSION_COOKIE: &str = "ferrymq_session";

/// The header a state-changing request sends its session's CSRF token in.
pub const CSRF_HEADER: &str = "x-csrf-token";

/// Default of `HttpConfig::session_lifetime`: a working day; a longer one leaves a forgotten
/// browser logged in for longer, a shorter one makes an operator log in twice a day.
pub const SESSION_LIFETIME_DEFAULT: Duration = Duration::from_secs(8 * 3600);

/// Default of `HttpConfig::sessions_max`: far more operators than a broker has, and at about
/// 200 bytes a session, 2 MB at most.
pub const SESSIONS_MAX_DEFAULT: usize = 10_000;

/// Sessions one user may hold at once: a browser per device and a few tabs' worth of
/// re-logins. Past it the user's oldest session ends, so a script that logs in in a loop
/// cannot fill the table on its own.
pub const SESSIONS_PER_USER_MAX: usize = 32;

struct Session {
    user: std::sync::Arc<str>,
    csrf_token: String,
    created: Instant,
    expires: Instant,
    expires_ms: u64,
}

/// The sessions of one HTTP listener (see the module doc).
pub struct Sessions {
    table: Mutex<HashMap<[u8; 32], Session>>,
    pub(crate) lifetime: Duration,
    sessions_max: usize,
}

/// What the guard found in a request's session cookie.
#[derive(Clone)]
pub(crate) struct SessionFound {
    pub identity: Identity,
    pub csrf_token: String,
    pub expires_ms: u64,
}

/// A new session: the cookie's value (shown this once) and what the page is told.
pub(crate) struct Opened {
    pub id: String,
    pub csrf_token: String,
    pub expires_ms: u64,
}

fn random_hex() -> Result<String, ApiError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("no randomness for a session: {e}"),
        )
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn id_hash(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Sessions {
    pub fn new(lifetime: Duration, sessions_max: usize) -> Sessions {
        assert!(
            sessions_max > 0,
            "a session table holds at least one session"
        );
        Sessions {
            table: Mutex::new(HashMap::new()),
            lifetime,
            sessions_max,
        }
    }

    /// Sessions open now (expired ones not yet dropped included).
    pub fn len(&self) -> usize {
        self.table.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Opens a session for `user`, or refuses when the table is full of live sessions.
    pub(crate) fn open(&self, user: &str) -> Result<Opened, ApiError> {
        let id = random_hex()?;
        let csrf_token = random_hex()?;
        let now = Instant::now();
        let expires_ms = unix_ms() + self.lifetime.as_millis() as u64;
        let mut table = self.table.lock();
        table.retain(|_, s| s.expires > now);
        let mut own: Vec<([u8; 32], Instant)> = table
            .iter()
            .filter(|(_, s)| &*s.user == user)
            .map(|(k, s)| (*k, s.created))
            .collect();
        if own.len() >= SESSIONS_PER_USER_MAX {
            own.sort_by_key(|(_, created)| *created);
            for (key, _) in &own[..=own.len() - SESSIONS_PER_USER_MAX] {
                table.remove(key);
            }
        }
        if table.len() >= self.sessions_max {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_sessions",
                format!(
                    "the broker holds its maximum of {} dashboard sessions; try again once some \
                     have ended or expired, or use a token",
                    self.sessions_max
                ),
            ));
        }
        table.insert(
            id_hash(&id),
            Session {
                user: user.into(),
                csrf_token: csrf_token.clone(),
                created: now,
                expires: now + self.lifetime,
                expires_ms,
            },
        );
        assert!(table.len() <= self.sessions_max);
        Ok(Opened {
            id,
            csrf_token,
            expires_ms,
        })
    }

    /// The live session of cookie value `id`; an expired one is dropped.
    pub(crate) fn find(&self, id: &str) -> Option<SessionFound> {
        let key = id_hash(id);
        let mut table = self.table.lock();
        let session = table.get(&key)?;
        if session.expires <= Instant::now() {
            table.remove(&key);
            return None;
        }
        Some(SessionFound {
            identity: Identity::User {
                name: session.user.clone(),
                token: None,
            },
            csrf_token: session.csrf_token.clone(),
            expires_ms: session.expires_ms,
        })
    }

    /// Ends the session of cookie value `id`; whether there was one.
    pub(crate) fn end(&self, id: &str) -> bool {
        self.table.lock().remove(&id_hash(id)).is_some()
    }
}

/// The session cookie's value in `headers`, if any.
pub(crate) fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value.trim())
        .filter(|value| !value.is_empty())
}

/// The session a request's cookie names, checked: live, and for a request that changes state,
/// with the session's CSRF token in `X-CSRF-Token`. `Ok(None)` when there is no cookie to use.
pub(crate) fn from_request(
    sessions: &Sessions,
    auth: &Auth,
    method: &Method,
    headers: &HeaderMap,
) -> Result<Option<SessionFound>, ApiError> {
    // Without users there is nothing to log in as: a stale cookie from an earlier run means
    // nothing, and the request goes on as anyone's.
    if !auth.enabled() {
        return Ok(None);
    }
    let Some(id) = cookie(headers) else {
        return Ok(None);
    };
    let Some(found) = sessions.find(id) else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            ferrymq_protocol::ErrorCode::AuthenticationFailed.as_str(),
            "the session has expired or was ended: log in again",
        ));
    };
    if method != Method::GET && method != Method::HEAD {
        let sent = headers
            .get(CSRF_HEADER)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        let matches: bool = sent.ct_eq(found.csrf_token.as_bytes()).into();
        if !matches {
            let why = if sent.is_empty() {
                "a request that changes state with a session cookie needs the X-CSRF-Token header"
            } else {
                "the X-CSRF-Token header does not match this session"
            };
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "csrf_failed",
                format!("{why}: send the token that POST /login or GET /session answered with"),
            ));
        }
    }
    Ok(Some(found))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; ferrymq_session=abc ; b=2"),
        );
        assert_eq!(cookie(&headers), Some("abc"));
        headers.insert(header::COOKIE, HeaderValue::from_static("ferrymq_session="));
        assert_eq!(cookie(&headers), None);
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("xferrymq_session=1"),
        );
        assert_eq!(cookie(&headers), None);
    }

    #[test]
    fn a_user_holds_a_bounded_number_of_sessions_and_the_table_is_bounded() {
        let sessions = Sessions::new(Duration::from_secs(60), SESSIONS_PER_USER_MAX + 2);
        let first = sessions.open("alice").unwrap();
        for _ in 1..SESSIONS_PER_USER_MAX {
            sessions.open("alice").unwrap();
        }
        assert!(sessions.find(&first.id).is_some());
        sessions.open("alice").unwrap();
        assert_eq!(sessions.len(), SESSIONS_PER_USER_MAX);
        assert!(
            sessions.find(&first.id).is_none(),
            "alice's oldest session ended"
        );
        sessions.open("bob").unwrap();
        sessions.open("carol").unwrap();
        let refused = sessions.open("dave").err().unwrap();
        assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.code, "too_many_sessions");
        assert_eq!(sessions.len(), SESSIONS_PER_USER_MAX + 2);
    }

    #[test]
    fn expired_sessions_are_not_found_and_make_room() {
        let sessions = Sessions::new(Duration::from_millis(1), 1);
        let opened = sessions.open("alice").unwrap();
        std::thread::sleep(Duration::from_millis(5));
        assert!(sessions.find(&opened.id).is_none());
        sessions.open("alice").unwrap();
        sessions.open("bob").err().unwrap();
        std::thread::sleep(Duration::from_millis(5));
        sessions.open("bob").unwrap();
    }
}
