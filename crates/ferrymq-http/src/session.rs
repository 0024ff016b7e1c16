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

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use ferrymq_broker::auth::{actions_to_string, roles_to_string};
use ferrymq_broker::Auth;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ErrorBody, Json};
use crate::users::GrantJson;
use crate::{ApiError, AppState};

use crate::session_store::{cookie, from_request};
pub use crate::session_store::{
    Sessions, CSRF_HEADER, SESSIONS_MAX_DEFAULT, SESSIONS_PER_USER_MAX, SESSION_COOKIE,
    SESSION_LIFETIME_DEFAULT,
};

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(login))
        .routes(routes!(logout))
        .routes(routes!(session))
        .route_layer(axum::middleware::from_fn(crate::service::track))
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
