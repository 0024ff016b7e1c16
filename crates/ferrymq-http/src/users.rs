//! User routes: users, grants and API tokens, the same operations as the binary protocol's
//! USER_ADD ... TOKEN_REVOKE, with the same rules (admin for users and grants; a user's own
//! password and tokens for itself). Roles and actions are names here, not bits.

use axum::http::StatusCode;
use axum::Extension;
use ferrymq_broker::auth::{
    actions_to_string, parse_actions, parse_roles, roles_to_string, Access, TokenInfo,
};
use ferrymq_broker::{Auth, BrokerError};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ErrorBody, Json, Path};
use crate::schema::Name;
use crate::{ApiError, ApiResult, AppState, Caller};

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_users, add_user))
        .routes(routes!(remove_user))
        .routes(routes!(set_password))
        .routes(routes!(grant))
        .routes(routes!(revoke))
        .routes(routes!(list_tokens, create_token))
        .routes(routes!(revoke_token))
        .route_layer(axum::middleware::from_fn(crate::service::track))
}

/// A user: never its password or hash.
#[derive(Serialize, utoipa::ToSchema)]
pub struct UserJson {
    pub name: String,
    /// `admin`, `monitor`.
    pub roles: Vec<String>,
    pub grants: Vec<GrantJson>,
    /// How many API tokens it holds.
    pub tokens: u32,
}

#[derive(Serialize, Deserialize, utoipa::ToSchema)]
pub struct GrantJson {
    /// An exact topic name, a prefix such as `orders.*`, or `*`.
    #[schema(example = "orders.*")]
    pub pattern: String,
    /// `publish`, `consume`, `inspect`, `manage`, `purge`, `pause` (`manage` implies the last two).
    pub actions: Vec<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct UserList {
    pub users: Vec<UserJson>,
}

#[derive(Deserialize, utoipa::ToSchema)]
pub struct NewUser {
    pub name: String,
    /// 8 to 1024 bytes; hashed with Argon2id, never stored or logged.
    pub password: String,
    #[serde(default)]
    pub roles: Vec<String>,
}

#[derive(Deserialize, utoipa::ToSchema)]
pub struct NewPassword {
    pub password: String,
}

/// Actions on a pattern, and/or roles, to add or take away.
#[derive(Deserialize, utoipa::ToSchema)]
pub struct GrantChange {
    /// Empty or absent when only roles change.
    #[serde(default)]
    pub pattern: String,
    #[serde(default)]
    pub actions: Vec<String>,
    #[serde(default)]
    pub roles: Vec<String>,
}

#[derive(Deserialize, utoipa::ToSchema)]
pub struct NewToken {
    pub name: String,
    /// Unix ms after which the token is refused; absent or 0: never.
    #[serde(default)]
    pub expires_ms: u64,
}

/// A new token, shown this once: the broker keeps only its hash.
#[derive(Serialize, utoipa::ToSchema)]
pub struct CreatedToken {
    pub name: String,
    pub token: String,
    pub expires_ms: u64,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct TokenJson {
    pub name: String,
    pub created_ms: u64,
    /// 0: never.
    pub expires_ms: u64,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct TokenList {
    pub tokens: Vec<TokenJson>,
}

fn names(text: String) -> Vec<String> {
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

fn bits(list: &[String], parse: fn(&str) -> Result<u8, BrokerError>) -> ApiResult<u8> {
    let mut out = 0;
    for name in list {
        out |= parse(name)?;
    }
    Ok(out)
}

fn admin(caller: &Caller, what: &str) -> ApiResult<Arc<Auth>> {
    caller.with(|access: &mut Access| {
        access.check_admin(what)?;
        Ok(access.auth().clone())
    })
}

fn own_or_admin(caller: &Caller, user: &str, what: &str) -> ApiResult<Arc<Auth>> {
    caller.with(|access: &mut Access| {
        access.check_self_or_admin(user, what)?;
        Ok(access.auth().clone())
    })
}

/// A password change hashes: tens of milliseconds, off the connection workers.
async fn blocking(job: impl FnOnce() -> Result<(), BrokerError> + Send + 'static) -> ApiResult<()> {
    // The request's span (who acted) goes along, for the line the change logs.
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(job))
        .await
        .map_err(|_| ApiError::from(BrokerError::Storage("a user change was interrupted".into())))?
        .map_err(Into::into)
}

/// Every user with its roles and grants (admin only).
#[utoipa::path(get, path = "/users", tag = "users",
    responses(
        (status = 200, description = "Users, by name", body = UserList),
        (status = 401, description = "`authentication_failed`", body = ErrorBody),
        (status = 403, description = "`forbidden`: not an admin", body = ErrorBody),
    ))]
async fn list_users(Extension(caller): Extension<Caller>) -> ApiResult<Json<UserList>> {
    let auth = admin(&caller, "list users")?;
    let users = auth
        .list_users()
        .into_iter()
        .map(|u| UserJson {
            name: u.name,
            roles: names(roles_to_string(u.roles)),
            grants: u
                .grants
                .into_iter()
                .map(|(pattern, actions)| GrantJson {
                    pattern,
                    actions: names(actions_to_string(actions)),
                })
                .collect(),
            tokens: u.tokens,
        })
        .collect();
    Ok(Json(UserList { users }))
}

/// Adds a user (admin only).
#[utoipa::path(post, path = "/users", tag = "users", request_body = NewUser,
    responses(
        (status = 201, description = "Added"),
        (status = 400, description = "A bad name, password or role (the message says which)", body = ErrorBody),
        (status = 403, description = "`forbidden`: not an admin", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 409, description = "`conflict`: the user exists, or it would be the broker's first user without the admin role (nobody could administer the broker)", body = ErrorBody),
    ))]
async fn add_user(
    Extension(caller): Extension<Caller>,
    Json(request): Json<NewUser>,
) -> ApiResult<StatusCode> {
    let auth = admin(&caller, "add users")?;
    let roles = bits(&request.roles, parse_roles)?;
    blocking(move || auth.add_user(&request.name, &request.password, roles)).await?;
    Ok(StatusCode::CREATED)
}

/// Removes a user (admin only): its connections and streams lose their rights at once.
#[utoipa::path(delete, path = "/users/{user}", tag = "users",
    params(("user" = Name, Path, description = "User name")),
    responses(
        (status = 204, description = "Removed"),
        (status = 403, description = "`forbidden`", body = ErrorBody),
        (status = 404, description = "`unknown_user`", body = ErrorBody),
        (status = 409, description = "`conflict`: the user is the last admin; give another user the admin role first", body = ErrorBody),
    ))]
async fn remove_user(
    Extension(caller): Extension<Caller>,
    Path(user): Path<String>,
) -> ApiResult<StatusCode> {
    admin(&caller, "remove users")?.remove_user(&user)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sets a password: one's own, or anyone's as an admin.
#[utoipa::path(put, path = "/users/{user}/password", tag = "users", request_body = NewPassword,
    params(("user" = Name, Path, description = "User name")),
    responses(
        (status = 204, description = "Changed"),
        (status = 400, description = "A bad password", body = ErrorBody),
        (status = 403, description = "`forbidden`", body = ErrorBody),
        (status = 404, description = "`unknown_user`", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
    ))]
async fn set_password(
    Extension(caller): Extension<Caller>,
    Path(user): Path<String>,
    Json(request): Json<NewPassword>,
) -> ApiResult<StatusCode> {
    let auth = own_or_admin(&caller, &user, "change another user's password")?;
    blocking(move || auth.set_password(&user, &request.password)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Grants actions on a topic pattern, and/or roles (admin only).
#[utoipa::path(post, path = "/users/{user}/grants", tag = "users", request_body = GrantChange,
    params(("user" = Name, Path, description = "User name")),
    responses(
        (status = 204, description = "Granted"),
        (status = 400, description = "A pattern that does not parse, an unknown action or role", body = ErrorBody),
        (status = 403, description = "`forbidden`", body = ErrorBody),
        (status = 404, description = "`unknown_user`", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
    ))]
async fn grant(
    Extension(caller): Extension<Caller>,
    Path(user): Path<String>,
    Json(request): Json<GrantChange>,
) -> ApiResult<StatusCode> {
    let auth = admin(&caller, "grant")?;
    let actions = bits(&request.actions, parse_actions)?;
    let roles = bits(&request.roles, parse_roles)?;
    auth.grant(&user, &request.pattern, actions, roles)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Takes actions on exactly a pattern, and/or roles, away (admin only): open streams that lose
/// `consume` end with the reason.
#[utoipa::path(post, path = "/users/{user}/revoke", tag = "users", request_body = GrantChange,
    params(("user" = Name, Path, description = "User name")),
    responses(
        (status = 204, description = "Revoked"),
        (status = 400, description = "No such grant", body = ErrorBody),
        (status = 403, description = "`forbidden`", body = ErrorBody),
        (status = 404, description = "`unknown_user`", body = ErrorBody),
        (status = 409, description = "`conflict`: the admin role of the last admin; give another user the admin role first", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
    ))]
async fn revoke(
    Extension(caller): Extension<Caller>,
    Path(user): Path<String>,
    Json(request): Json<GrantChange>,
) -> ApiResult<StatusCode> {
    let auth = admin(&caller, "revoke")?;
    let actions = bits(&request.actions, parse_actions)?;
    let roles = bits(&request.roles, parse_roles)?;
    auth.revoke(&user, &request.pattern, actions, roles)?;
    Ok(StatusCode::NO_CONTENT)
}

/// A user's tokens: names and dates, never values.
#[utoipa::path(get, path = "/users/{user}/tokens", tag = "users",
    params(("user" = Name, Path, description = "User name")),
    responses(
        (status = 200, description = "Tokens", body = TokenList),
        (status = 403, description = "`forbidden`", body = ErrorBody),
        (status = 404, description = "`unknown_user`", body = ErrorBody),
    ))]
async fn list_tokens(
    Extension(caller): Extension<Caller>,
    Path(user): Path<String>,
) -> ApiResult<Json<TokenList>> {
    let auth = own_or_admin(&caller, &user, "list another user's tokens")?;
    let tokens = auth
        .list_tokens(&user)?
        .into_iter()
        .map(|t: TokenInfo| TokenJson {
            name: t.name,
            created_ms: t.created_ms,
            expires_ms: t.expires_ms,
        })
        .collect();
    Ok(Json(TokenList { tokens }))
}

/// Creates a named API token; the answer shows it once.
#[utoipa::path(post, path = "/users/{user}/tokens", tag = "users", request_body = NewToken,
    params(("user" = Name, Path, description = "User name")),
    responses(
        (status = 201, description = "Created", body = CreatedToken),
        (status = 400, description = "A bad name or expiry", body = ErrorBody),
        (status = 403, description = "`forbidden`", body = ErrorBody),
        (status = 404, description = "`unknown_user`", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 409, description = "`conflict`: a token of that name exists", body = ErrorBody),
    ))]
async fn create_token(
    Extension(caller): Extension<Caller>,
    Path(user): Path<String>,
    Json(request): Json<NewToken>,
) -> ApiResult<(StatusCode, Json<CreatedToken>)> {
    let auth = own_or_admin(&caller, &user, "create another user's tokens")?;
    let token = auth.create_token(&user, &request.name, request.expires_ms)?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedToken {
            name: request.name,
            token,
            expires_ms: request.expires_ms,
        }),
    ))
}

/// Revokes a token: requests and streams using it are refused from now on.
#[utoipa::path(delete, path = "/users/{user}/tokens/{name}", tag = "users",
    params(
        ("user" = Name, Path, description = "User name"),
        ("name" = Name, Path, description = "Token name"),
    ),
    responses(
        (status = 204, description = "Revoked"),
        (status = 403, description = "`forbidden`", body = ErrorBody),
        (status = 404, description = "`unknown_user`, `unknown_token`", body = ErrorBody),
    ))]
async fn revoke_token(
    Extension(caller): Extension<Caller>,
    Path((user, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    own_or_admin(&caller, &user, "revoke another user's tokens")?.revoke_token(&user, &name)?;
    Ok(StatusCode::NO_CONTENT)
}
