//! Admitting nodes to a running cluster and removing them (admin role): `POST /cluster/nodes`
//! and `DELETE /cluster/nodes/{node}`, which `ferrymq cluster add-node` and `remove-node` call.
//!
//! Both are written to the cluster's metadata through its leader, from whichever node is asked,
//! and answered `202 Accepted`: each Raft group then moves its voters (a new replica catches up
//! as a learner first), which `GET /cluster` shows as it happens.

use axum::extract::State;
use http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::cluster::{served_by, ClusterRoutes};
use crate::error::{ErrorBody, Json, Path};
use crate::{ApiError, ApiResult, AppState};

/// A node to admit.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeAdmission {
    /// Its `--node-id`.
    #[serde(deserialize_with = "crate::schema::whole::number")]
    pub node: u64,
    /// Where its peers reach it: its `--cluster-addr`, as `HOST:PORT`.
    #[schema(example = "10.0.0.4:7090")]
    pub cluster_addr: String,
}

/// A membership change the cluster took.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MembershipChange {
    pub node: u64,
    /// `admitted` or `removed`.
    #[schema(example = "admitted")]
    pub change: &'static str,
}

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(add_node))
        .routes(routes!(remove_node))
}

fn cluster_of(state: &AppState) -> ApiResult<std::sync::Arc<dyn ClusterRoutes>> {
    state
        .config
        .cluster
        .as_ref()
        .map(|c| c.0.clone())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not_clustered",
                "this broker runs alone: nodes are admitted to a cluster, which one started with \
             --node-id, --cluster-addr and --peers forms",
            )
        })
}

/// Admits a node to the cluster (admin role). Start it first with `--join` and a `--peers`
/// naming every member and itself; new partitions are placed on it from now on, and each
/// metadata replica it gets catches up before it votes.
#[utoipa::path(post, path = "/cluster/nodes", tag = "service",
    request_body = NodeAdmission,
    responses(
        (status = 202, description = "Admitted; the metadata group adds it as it catches up", body = MembershipChange),
        (status = 400, description = "An invalid node id or address", body = ErrorBody),
        (status = 403, description = "`forbidden`: not the admin role", body = ErrorBody),
        (status = 404, description = "`not_clustered`: this broker runs alone", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 503, description = "`not_leader`: no metadata leader within 5 s", body = ErrorBody),
    ))]
async fn add_node(
    State(state): State<AppState>,
    Json(request): Json<NodeAdmission>,
) -> ApiResult<(StatusCode, http::HeaderMap, Json<MembershipChange>)> {
    let cluster = cluster_of(&state)?;
    let served = cluster.add_node(request.node, request.cluster_addr).await?;
    Ok((
        StatusCode::ACCEPTED,
        served_by(Some(served)),
        Json(MembershipChange {
            node: request.node,
            change: "admitted",
        }),
    ))
}

/// Removes a node from the cluster (admin role): each of its replicas is given to another
/// member, which catches up before the node leaves the partition's group; then stop the node.
#[utoipa::path(delete, path = "/cluster/nodes/{node}", tag = "service",
    params(("node" = u64, Path, description = "The node's id")),
    responses(
        (status = 202, description = "Removed; its replicas move as the new ones catch up", body = MembershipChange),
        (status = 400, description = "Not a node id, not a member, or the last one", body = ErrorBody),
        (status = 403, description = "`forbidden`: not the admin role", body = ErrorBody),
        (status = 404, description = "`not_clustered`: this broker runs alone", body = ErrorBody),
        (status = 503, description = "`not_leader`: no metadata leader within 5 s", body = ErrorBody),
    ))]
async fn remove_node(
    State(state): State<AppState>,
    Path(node): Path<u64>,
) -> ApiResult<(StatusCode, http::HeaderMap, Json<MembershipChange>)> {
    let cluster = cluster_of(&state)?;
    let served = cluster.remove_node(node).await?;
    Ok((
        StatusCode::ACCEPTED,
        served_by(Some(served)),
        Json(MembershipChange {
            node,
            change: "removed",
        }),
    ))
}
