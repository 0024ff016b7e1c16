//! The operator's routes: `GET /connections` (paged), `DELETE /connections/{id}`,
//! `POST /topics/{topic}/purge`, and `POST .../subscriptions/{subscription}/pause` and
//! `/resume`.
//!
//! Who may (checked by the guard in `auth`, as the binary protocol checks them): listing
//! connections the monitor or admin role, closing one the admin role, purge the `purge` action on
//! the topic and pause or resume the `pause` action (`manage` implies both). Changes run in the
//! guard's span that names who acted.

use axum::extract::State;
use axum::http::StatusCode;
use ferrymq_broker::connections::{
    ConnectionGuard, ConnectionInfo, Listener, CONNECTIONS_PAGE_MAX,
};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ErrorBody, Json, Path, Query};
use crate::schema::Name;
use crate::{ApiResult, AppState};

/// The most of a `User-Agent` kept as a stream's client name.
const CLIENT_NAME_CHARS_MAX: usize = 128;

/// Lists a long-lived HTTP stream (SSE or WebSocket) among the broker's connections while the
/// returned guard lives: its peer, TLS, user and `User-Agent` as client name. The stream lists
/// its consumer on it (`Pump::list_on`) and counts its messages and bytes there.
pub(crate) fn list_stream(
    state: &AppState,
    peer: Option<crate::auth::Peer>,
    over_tls: Option<crate::auth::OverTls>,
    headers: &axum::http::HeaderMap,
    user: &str,
) -> ConnectionGuard {
    let peer = peer.map_or(std::net::SocketAddr::from(([0, 0, 0, 0], 0)), |p| p.0);
    let listed =
        state
            .broker
            .connections()
            .register(Listener::Http, peer, over_tls.is_some_and(|t| t.0));
    let agent = headers
        .get(axum::http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let agent: String = agent.chars().take(CLIENT_NAME_CHARS_MAX).collect();
    listed.set_names(user, &agent);
    listed
}

/// What a stream closed by an operator is told last.
pub(crate) fn closed_by_operator(id: u64) -> crate::ApiError {
    crate::ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "shutting_down",
        format!("connection {id} was closed by an operator"),
    )
}

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_connections))
        .routes(routes!(close_connection))
        .routes(routes!(purge_topic))
        .routes(routes!(pause_subscription))
        .routes(routes!(resume_subscription))
        .route_layer(axum::middleware::from_fn(crate::service::track))
}

/// Which connections to list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ConnectionQuery {
    /// Connections with ids above this one: the `next_after` of the previous page (default 0,
    /// the first page).
    #[param(minimum = 0)]
    pub after: Option<u64>,
    /// Connections per page, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// One client connection.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ConnectionJson {
    /// Never reused while the broker runs.
    pub id: u64,
    /// `binary` (the binary protocol) or `http` (a long-lived HTTP stream).
    #[schema(example = "binary")]
    pub listener: &'static str,
    /// `ip:port` of the client.
    pub peer: String,
    /// Who it authenticated as; empty: anonymous.
    pub user: String,
    /// The name and version the client gave in HELLO, e.g. `ferrymq-python/0.1`.
    pub client_name: String,
    pub tls: bool,
    /// When it connected, unix ms.
    pub connected_ms: u64,
    /// Distinct subscriptions its consumers are on.
    pub subscriptions: u32,
    pub consumers: u32,
    /// Messages it published.
    pub messages_in: u64,
    /// Bytes of the frames it sent.
    pub bytes_in: u64,
    /// Messages delivered to it.
    pub messages_out: u64,
    /// Bytes sent to it.
    pub bytes_out: u64,
    /// Credit its consumers hold: messages the broker may send without waiting.
    pub credit: u64,
    /// Messages delivered to it and not yet acked or nacked.
    pub unacked: u64,
}

impl From<ConnectionInfo> for ConnectionJson {
    fn from(c: ConnectionInfo) -> Self {
        ConnectionJson {
            id: c.id,
            listener: c.listener.as_str(),
            peer: c.peer,
            user: c.user,
            client_name: c.client_name,
            tls: c.tls,
            connected_ms: c.connected_ms,
            subscriptions: c.subscriptions,
            consumers: c.consumers,
            messages_in: c.messages_in,
            bytes_in: c.bytes_in,
            messages_out: c.messages_out,
            bytes_out: c.bytes_out,
            credit: c.credit,
            unacked: c.unacked,
        }
    }
}

/// One page of connections. Rates are the difference of two listings over their interval.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ConnectionPageJson {
    /// In id order.
    pub connections: Vec<ConnectionJson>,
    /// Connections open now, on every page.
    pub total: u64,
    /// Pass as `after` for the next page; null: this was the last page.
    pub next_after: Option<u64>,
}

/// Lists client connections, a page at a time (monitor or admin role).
#[utoipa::path(get, path = "/connections", tag = "connections",
    params(ConnectionQuery),
    responses(
        (status = 200, description = "One page", body = ConnectionPageJson),
        (status = 400, description = "`invalid_request`: a bad `after` or `limit`", body = ErrorBody),
    ))]
async fn list_connections(
    State(state): State<AppState>,
    Query(query): Query<ConnectionQuery>,
) -> ApiResult<Json<ConnectionPageJson>> {
    let limit = query.limit.unwrap_or(100).min(CONNECTIONS_PAGE_MAX);
    let page = state
        .broker
        .connections()
        .list(query.after.unwrap_or(0), limit)?;
    Ok(Json(ConnectionPageJson {
        connections: page.connections.into_iter().map(Into::into).collect(),
        total: page.total,
        next_after: (page.next_after != 0).then_some(page.next_after),
    }))
}

/// Closes a client connection (admin role): it is told why, its consumers' in-flight messages go
/// back to their subscriptions.
#[utoipa::path(delete, path = "/connections/{id}", tag = "connections",
    params(("id" = u64, Path, description = "Connection id, as `GET /connections` lists it")),
    responses(
        (status = 204, description = "Told to close"),
        (status = 400, description = "`invalid_request`: not a connection id", body = ErrorBody),
        (status = 404, description = "`unknown_connection`: closed already, or never open", body = ErrorBody),
    ))]
async fn close_connection(
    State(state): State<AppState>,
    Path(id): Path<u64>,
) -> ApiResult<StatusCode> {
    let closed = state.broker.connections().close(id)?;
    tracing::info!(connection = id, peer = %closed.peer, user = %closed.user, client = %closed.client_name, "connection closed");
    Ok(StatusCode::NO_CONTENT)
}

/// What a purge dropped.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PurgedJson {
    /// Messages the topic retained before the purge.
    pub purged: u64,
}

/// Drops every message a topic retains, a dead-letter topic's too (`purge`, or `manage`).
/// Subscriptions and consumers stay and get what is published next; in-flight messages leave
/// flight.
#[utoipa::path(post, path = "/topics/{topic}/purge", tag = "topics",
    params(("topic" = Name, Path, description = "Topic name")),
    responses(
        (status = 200, description = "Purged", body = PurgedJson),
        (status = 404, description = "`unknown_topic`", body = ErrorBody),
        (status = 503, description = "`storage_unavailable`: segments could not be deleted (the messages are no longer delivered)", body = ErrorBody),
    ))]
async fn purge_topic(
    State(state): State<AppState>,
    Path(topic): Path<String>,
) -> ApiResult<Json<PurgedJson>> {
    let purged = state.broker.purge_topic(&topic)?;
    Ok(Json(PurgedJson { purged }))
}

/// Pauses a subscription's deliveries to every consumer (`pause`, or `manage`); kept across
/// restarts. Publishing goes on; messages wait in its backlog.
#[utoipa::path(post, path = "/topics/{topic}/subscriptions/{subscription}/pause", tag = "topics",
    params(
        ("topic" = Name, Path, description = "Topic name"),
        ("subscription" = Name, Path, description = "Subscription name"),
    ),
    responses(
        (status = 204, description = "Paused (or already paused)"),
        (status = 404, description = "`unknown_topic` or `unknown_subscription`", body = ErrorBody),
        (status = 503, description = "`storage_unavailable`: the pause could not be stored", body = ErrorBody),
    ))]
async fn pause_subscription(
    State(state): State<AppState>,
    Path((topic, subscription)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    state
        .broker
        .pause_subscription(&topic, &subscription, true)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Resumes a paused subscription's deliveries (`pause`, or `manage`).
#[utoipa::path(post, path = "/topics/{topic}/subscriptions/{subscription}/resume", tag = "topics",
    params(
        ("topic" = Name, Path, description = "Topic name"),
        ("subscription" = Name, Path, description = "Subscription name"),
    ),
    responses(
        (status = 204, description = "Resumed (or was not paused)"),
        (status = 404, description = "`unknown_topic` or `unknown_subscription`", body = ErrorBody),
        (status = 503, description = "`storage_unavailable`: the change could not be stored", body = ErrorBody),
    ))]
async fn resume_subscription(
    State(state): State<AppState>,
    Path((topic, subscription)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    state
        .broker
        .pause_subscription(&topic, &subscription, false)?;
    Ok(StatusCode::NO_CONTENT)
}
