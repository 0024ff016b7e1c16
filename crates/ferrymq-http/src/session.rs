//! Dashboard sessions: `POST /login` checks a user's password with the same function as every
//! other HTTP request (and is slowed the same way after failures), then hands out a session
//! cookie and a CSRF token; `POST /logout` ends the session on the server; `GET /session` tells
//! the page who it is.
//!
//! Invariants:
//! - The cookie is `HttpOnly` (no script reads it) and `SameSite=Strict` (no other site's page
//!   sends it). It is never taken alone for a request that changes state: such a request must
//!   also carry `X-CSRF-Token` equal to its session's token, which only the page that logged in
//!   has read (from the login's answer or from `GET /session`, which another origin cannot
//!   read). This is on top of the `Origin` check every state-changing request passes.
//! - The table keeps the SHA-256 of each session id, never the id, so neither a memory dump nor
//!   a log line holds a usable cookie; lookups compare hashes of fixed length.
//! - Sessions live in memory only: a restart logs everyone out. Each has a fixed lifetime from
//!   login, not extended by use. The table is bounded (`HttpConfig::sessions_max`), and one
//!   user holds at most [`SESSIONS_PER_USER_MAX`]: a user's oldest session is ended to make room
//!   for its new one, while a full table refuses new logins (503) rather than end other users'
//!   sessions.
//! - A session acts as its user with the user's current rights: each request checks the user
//!   still exists (`Access::refresh`), so removing a user ends its sessions' use at once.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use ferrymq_broker::auth::{actions_to_string, roles_to_string};
use ferrymq_broker::{Auth, Identity};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ErrorBody, Json};
use crate::users::GrantJson;
use crate::{ApiError, AppState};

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

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(login))
        .routes(routes!(logout))
        .routes(routes!(session))
        .route_layer(axum::middleware::from_fn(crate::service::track))
}

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
    lifetime: Duration,
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
    fn find(&self, id: &str) -> Option<SessionFound> {
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
    fn end(&self, id: &str) -> bool {
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

/// A user name and password.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct LoginRequest {
    #[schema(min_length = 1)]
    pub user: String,
    pub password: String,
}

/// Who the dashboard acts as, and the token its state-changing requests send.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SessionJson {
    /// Whether the broker has users: without any, no login is needed and every field below is
    /// empty.
    pub login_required: bool,
    /// The logged-in user; absent when there is no session.
    pub user: Option<String>,
    /// `admin`, `monitor`.
    pub roles: Vec<String>,
    pub grants: Vec<GrantJson>,
    /// Send as `X-CSRF-Token` with every request that changes state.
    pub csrf_token: Option<String>,
    /// Unix ms at which the session ends.
    pub expires_ms: Option<u64>,
}

impl SessionJson {
    fn open() -> SessionJson {
        SessionJson {
            login_required: false,
            user: None,
            roles: Vec::new(),
            grants: Vec::new(),
            csrf_token: None,
            expires_ms: None,
        }
    }

    fn of(auth: &Auth, user: &str, csrf_token: String, expires_ms: u64) -> SessionJson {
        let names = |text: String| -> Vec<String> {
            text.split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        };
        let info = auth.list_users().into_iter().find(|u| u.name == user);
        let (roles, grants) = match info {
            Some(info) => (
                names(roles_to_string(info.roles)),
                info.grants
                    .into_iter()
                    .map(|(pattern, actions)| GrantJson {
                        pattern,
                        actions: names(actions_to_string(actions)),
                    })
                    .collect(),
            ),
            None => (Vec::new(), Vec::new()),
        };
        SessionJson {
            login_required: true,
            user: Some(user.to_owned()),
            roles,
            grants,
            csrf_token: Some(csrf_token),
            expires_ms: Some(expires_ms),
        }
    }
}

fn set_cookie(state: &AppState, value: &str, max_age_s: u64) -> HeaderValue {
    let secure = if state.config.session_cookie_secure {
        "; Secure"
    } else {
        ""
    };
    HeaderValue::from_str(&format!(
        "{SESSION_COOKIE}={value}; Path=/; Max-Age={max_age_s}; HttpOnly; SameSite=Strict{secure}"
    ))
    .expect("a cookie of hex digits is a valid header value")
}

/// Logs in: checks the password as every request's `Authorization` is checked (a failure is
/// answered late when its address keeps failing), opens a session, and sets its cookie.
#[utoipa::path(post, path = "/login", tag = "users", request_body = LoginRequest,
    responses(
        (status = 200, description = "Logged in: the session cookie is set; the body carries the CSRF token", body = SessionJson),
        (status = 400, description = "No user name, or a broker without users (nothing to log in to)", body = ErrorBody),
        (status = 401, description = "`authentication_failed`: unknown user or wrong password (one answer for both)", body = ErrorBody),
        (status = 415, description = "A body that is not JSON", body = ErrorBody),
        (status = 503, description = "`too_many_sessions`", body = ErrorBody),
    ))]
async fn login(
    State(state): State<AppState>,
    peer: Option<Extension<crate::auth::Peer>>,
    Json(request): Json<LoginRequest>,
) -> Response {
    let auth = state.broker.auth().clone();
    if !auth.enabled() {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "login_not_needed",
            "this broker has no users: every request is allowed without a login",
        )
        .into_response();
    }
    if request.user.is_empty() {
        return ApiError::invalid("user", "a user name is needed").into_response();
    }
    let user = request.user.clone();
    let peer: Option<SocketAddr> = peer.map(|p| p.0 .0);
    if let Err(mut refused) =
        crate::auth::authenticate_password(&state, peer, request.user, request.password).await
    {
        // The page shows the API's message; a challenge here would make the browser open its
        // own password prompt over the page.
        refused.headers_mut().remove(header::WWW_AUTHENTICATE);
        return refused;
    }
    let opened = match state.sessions.open(&user) {
        Ok(opened) => opened,
        Err(error) => return error.into_response(),
    };
    tracing::info!(%user, "dashboard session opened");
    let body = SessionJson::of(&auth, &user, opened.csrf_token, opened.expires_ms);
    let mut response = Json(body).into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        set_cookie(&state, &opened.id, state.sessions.lifetime.as_secs()),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Logs out: the session ends on the server (its cookie is refused from now on) and the
/// browser is told to forget the cookie.
#[utoipa::path(post, path = "/logout", tag = "users",
    responses(
        (status = 204, description = "Logged out"),
        (status = 401, description = "`authentication_failed`: no live session", body = ErrorBody),
        (status = 403, description = "`csrf_failed`: no or a wrong X-CSRF-Token", body = ErrorBody),
    ))]
async fn logout(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(id) = cookie(&headers) {
        if state.sessions.end(id) {
            tracing::info!("dashboard session ended by logout");
        }
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, set_cookie(&state, "", 0));
    response
}

/// The dashboard's session: whether a login is needed, and if one is open, its user, roles,
/// grants and CSRF token. Answers 200 in every case, so that a page can ask before it logs in.
#[utoipa::path(get, path = "/session", tag = "users",
    responses(
        (status = 200, description = "The session, or that there is none", body = SessionJson),
    ))]
async fn session(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let auth = state.broker.auth().clone();
    let body = match from_request(&state.sessions, &auth, &Method::GET, &headers) {
        Ok(Some(found)) if auth.validate(&found.identity).is_ok() => SessionJson::of(
            &auth,
            found.identity.user().unwrap_or_default(),
            found.csrf_token,
            found.expires_ms,
        ),
        _ if !auth.enabled() => SessionJson::open(),
        _ => SessionJson {
            login_required: true,
            ..SessionJson::open()
        },
    };
    let mut response = Json(body).into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
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
