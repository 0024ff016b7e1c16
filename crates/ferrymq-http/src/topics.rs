//! Topic routes: create, list, describe, delete, and statistics.

use axum::extract::State;
use axum::http::StatusCode;
use ferrymq_protocol::{FsyncPolicy, OverflowPolicy, RetentionPolicy, Storage, TopicConfig};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use ferrymq_json::{StatsList, TopicJson, TopicList, TopicStatsJson};

use crate::cluster::served_by;
use crate::error::{ErrorBody, Json, Path};
use crate::schema::{CreateTopicSchema, Name};
use crate::{ApiError, ApiResult, AppState, Caller};

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_topic, list_topics))
        .routes(routes!(describe_topic, delete_topic))
        .routes(routes!(all_stats))
        .routes(routes!(topic_stats))
        .routes(routes!(skip_damaged))
        .route_layer(axum::middleware::from_fn(crate::service::track))
}

/// Where a topic keeps its messages.
#[derive(Debug, Clone, Copy, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum StorageName {
    /// In the data dir: durable, survives restarts.
    Disk,
    /// In memory only, bounded by `max_messages` and `max_bytes`.
    Memory,
}

/// What a full memory topic does.
#[derive(Debug, Clone, Copy, Deserialize, utoipa::ToSchema)]
pub enum OverflowName {
    /// Drop the oldest messages to make room (the default).
    #[serde(rename = "drop-oldest", alias = "drop_oldest")]
    DropOldest,
    /// Refuse the publish with `topic_full` (429).
    #[serde(rename = "reject")]
    Reject,
}

/// A topic to create. Omitted settings take the broker's defaults.
/// Its schema is [`CreateTopicSchema`], which says which settings go with which storage.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTopic {
    /// 1 to 255 bytes of letters, digits, `.`, `_` and `-`.
    pub name: String,
    /// Partitions (1 to 1024); order holds within a partition.
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    pub partitions: Option<u32>,
    /// `disk` or `memory`; default: the broker's (disk when it has a data dir).
    pub storage: Option<StorageName>,
    /// `drop-oldest` (default) or `reject`.
    pub overflow: Option<OverflowName>,
    /// Most messages retained.
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    pub max_messages: Option<u64>,
    /// Most bytes retained.
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    pub max_bytes: Option<u64>,
    /// Disk topics: `always` (default), `interval:<ms>` or `never`.
    pub fsync: Option<String>,
    /// Disk topics: messages older than this are deleted (whole segments).
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    pub retention_ms: Option<u64>,
    /// `stream` (keep messages until the limits; default for disk topics) or `work_queue`
    /// (delete what every subscription settled; default for memory topics).
    pub retention_policy: Option<String>,
    /// How long deduplication ids are remembered, 1 ms to a day; omitted: the broker's default.
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    pub dedup_window_ms: Option<u64>,
    /// On how many nodes of a cluster its partitions are kept: 1, 3 or 5; omitted: the broker's
    /// default (1 on a single node, which keeps one copy).
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    pub replicas: Option<u8>,
    /// Succeed (200 with the existing topic) when it already exists.
    #[serde(default)]
    pub if_not_exists: bool,
}

/// Creates a topic.
#[utoipa::path(post, path = "/topics", tag = "topics",
    request_body = CreateTopicSchema,
    responses(
        (status = 201, description = "Created", body = TopicJson),
        (status = 200, description = "It existed and `if_not_exists` was set", body = TopicJson),
        (status = 400, description = "A setting is invalid (the message names it)", body = ErrorBody),
        (status = 404, description = "`unknown_topic`: the user has no right at all on that name (an answer that tells no name apart from another)", body = ErrorBody),
        (status = 409, description = "`topic_exists`", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 429, description = "`limit_exceeded`: the broker holds its maximum of topics", body = ErrorBody),
        (status = 503, description = "`storage_unavailable`", body = ErrorBody),
    ))]
async fn create_topic(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
    Json(request): Json<CreateTopic>,
) -> ApiResult<(StatusCode, http::HeaderMap, Json<TopicJson>)> {
    if let Some(axum::Extension(caller)) = &caller {
        caller.check(ferrymq_broker::Action::Manage, &request.name)?;
    }
    let broker = &state.broker;
    let config = topic_config(broker, &request, state.config.cluster.is_some())?;
    let existed = request.if_not_exists && broker.topic(&request.name).is_ok();
    let (topic, node) = match &state.config.cluster {
        // In a cluster a new topic is replicated, created through the metadata group.
        Some(cluster) => {
            let node = cluster
                .0
                .create_topic(&request.name, config, request.if_not_exists)
                .await?;
            (broker.topic(&request.name)?, Some(node))
        }
        None => (
            broker.create_topic(&request.name, config, request.if_not_exists)?,
            None,
        ),
    };
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, served_by(node), Json(topic.info().into())))
}

/// The configuration a create request asks for, checked, with the broker's defaults where
/// it names none.
// One check per field, in the order of the config: splitting it would scatter the table.
fn topic_config(
    broker: &ferrymq_broker::Broker,
    request: &CreateTopic,
    clustered: bool,
) -> ApiResult<TopicConfig> {
    let defaults = &broker.config().topic_defaults;
    let storage = match request.storage {
        Some(StorageName::Disk) => Storage::Disk,
        Some(StorageName::Memory) => Storage::Memory,
        None if defaults.storage == Storage::Disk && !broker.is_durable() => Storage::Memory,
        None => defaults.storage,
    };
    let fsync = match request.fsync.as_deref() {
        None => FsyncPolicy::Default,
        Some(text) => text
            .parse::<FsyncPolicy>()
            .map_err(|e| ApiError::invalid("fsync", e))?,
    };
    if storage == Storage::Memory
        && (request.fsync.is_some() || request.retention_ms.is_some_and(|r| r != 0))
    {
        return Err(ApiError::invalid(
            if request.fsync.is_some() {
                "fsync"
            } else {
                "retention_ms"
            },
            "applies to disk topics only",
        ));
    }
    // The binary protocol's 0 means "the default"; over HTTP a default is an omitted field, so
    // a 0 here is a mistake to refuse rather than a silent single partition.
    if request.partitions == Some(0) {
        return Err(ApiError::invalid(
            "partitions",
            "0: give 1 to 1024, or omit it for the broker's default",
        ));
    }
    Ok(TopicConfig {
        partitions: request.partitions.unwrap_or(0),
        storage,
        overflow: match request.overflow {
            Some(OverflowName::DropOldest) => OverflowPolicy::DropOldest,
            Some(OverflowName::Reject) => OverflowPolicy::Reject,
            None => defaults.overflow,
        },
        max_messages: request.max_messages.unwrap_or(0),
        max_bytes: request.max_bytes.unwrap_or(0),
        fsync,
        retention_ms: request.retention_ms.unwrap_or(0),
        retention_policy: match request.retention_policy.as_deref() {
            None => RetentionPolicy::Default,
            Some(text @ ("stream" | "work_queue")) => text
                .parse::<RetentionPolicy>()
                .map_err(|e| ApiError::invalid("retention_policy", e))?,
            Some(other) => {
                return Err(ApiError::invalid(
                    "retention_policy",
                    format!("'{other}': use stream or work_queue"),
                ))
            }
        },
        dedup_window_ms: match request.dedup_window_ms {
            Some(0) => {
                return Err(ApiError::invalid(
                    "dedup_window_ms",
                    "0: give 1 to 86400000, or omit it for the broker's default",
                ))
            }
            other => other.unwrap_or(0),
        },
        replicas: replicas(request.replicas, clustered)?,
    })
}

/// `replicas` of a topic created over HTTP: in a cluster, what the cluster checks (0, its
/// default, when omitted); on a node running alone, the one copy it keeps.
fn replicas(asked: Option<u8>, clustered: bool) -> Result<u8, ApiError> {
    match asked {
        _ if clustered => Ok(asked.unwrap_or(0)),
        None | Some(1) => Ok(0),
        Some(r) => Err(ApiError::invalid(
            "replicas",
            format!(
                "{r}: this node runs alone and keeps one copy; 3 or 5 replicas need a cluster \
                 (ferrymq serve --node-id --cluster-addr --peers)"
            ),
        )),
    }
}

/// Lists every topic, by name.
#[utoipa::path(get, path = "/topics", tag = "topics",
    responses((status = 200, description = "Every topic", body = TopicList)))]
async fn list_topics(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
) -> Json<TopicList> {
    Json(TopicList {
        topics: state
            .broker
            .list_topics()
            .into_iter()
            .filter(|t| caller.as_ref().is_none_or(|c| c.sees(&t.name)))
            .map(Into::into)
            .collect(),
    })
}

/// Describes one topic.
#[utoipa::path(get, path = "/topics/{topic}", tag = "topics",
    params(("topic" = Name, Path, description = "Topic name")),
    responses(
        (status = 200, description = "The topic", body = TopicJson),
        (status = 404, description = "`unknown_topic`", body = ErrorBody),
    ))]
async fn describe_topic(
    State(state): State<AppState>,
    Path(topic): Path<String>,
) -> ApiResult<Json<TopicJson>> {
    Ok(Json(state.broker.describe_topic(&topic)?.into()))
}

/// Deletes a topic with its messages and subscriptions.
#[utoipa::path(delete, path = "/topics/{topic}", tag = "topics",
    params(("topic" = Name, Path, description = "Topic name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "`unknown_topic`", body = ErrorBody),
    ))]
async fn delete_topic(
    State(state): State<AppState>,
    Path(topic): Path<String>,
) -> ApiResult<(StatusCode, http::HeaderMap)> {
    let through = state
        .config
        .cluster
        .as_ref()
        .and_then(|c| c.0.delete_topic(&topic));
    let node = match through {
        // A replicated topic is deleted through the metadata group, on every node.
        Some(deletion) => Some(deletion.await?),
        None => {
            state.broker.delete_topic(&topic)?;
            None
        }
    };
    Ok((StatusCode::NO_CONTENT, served_by(node)))
}

/// A damaged range that was skipped.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SkippedRange {
    /// The segment file holding the damaged bytes.
    pub file: String,
    /// Byte position of the damage in `file`.
    pub position: u64,
    /// First offset skipped.
    pub first_offset: u64,
    /// One past the last offset skipped.
    pub end_offset: u64,
    pub reason: String,
}

/// What a skip did.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SkipDamaged {
    /// The damaged ranges skipped: those reads had found in this partition (see `GET /status`).
    pub skipped: Vec<SkippedRange>,
    /// Messages settled by the skip, over all subscriptions.
    pub settled: u64,
}

/// Skips the damaged ranges that reads found in a partition: every subscription settles those
/// offsets without delivering them (as if acked, durably) and moves on past them, and the
/// `unreadable_range` faults of `GET /status` are cleared. Only what a read could not get past is
/// skipped. Restore the file from a backup instead if the messages matter.
#[utoipa::path(post, path = "/topics/{topic}/partitions/{partition}/skip-damaged", tag = "topics",
    params(
        ("topic" = String, Path, description = "Topic name"),
        ("partition" = u32, Path, description = "Partition index"),
    ),
    responses(
        (status = 200, description = "The ranges skipped (none if no damage was found)", body = SkipDamaged),
        (status = 400, description = "`invalid_request`: no such partition", body = ErrorBody),
        (status = 404, description = "`unknown_topic`", body = ErrorBody),
    ))]
async fn skip_damaged(
    State(state): State<AppState>,
    Path((topic, partition)): Path<(String, u32)>,
) -> ApiResult<Json<SkipDamaged>> {
    let (ranges, settled) = state.broker.skip_damaged(&topic, partition)?;
    Ok(Json(SkipDamaged {
        skipped: ranges
            .into_iter()
            .map(|d| SkippedRange {
                file: d.file.display().to_string(),
                position: d.position,
                first_offset: d.first_offset,
                end_offset: d.end_offset,
                reason: d.reason,
            })
            .collect(),
        settled,
    }))
}

/// Statistics of every topic and its subscriptions.
#[utoipa::path(get, path = "/stats", tag = "topics",
    responses((status = 200, description = "Every topic's statistics", body = StatsList)))]
async fn all_stats(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
) -> ApiResult<Json<StatsList>> {
    let topics = state.broker.stats(None)?;
    Ok(Json(StatsList {
        topics: topics
            .into_iter()
            .filter(|t| caller.as_ref().is_none_or(|c| c.sees(&t.name)))
            .map(Into::into)
            .collect(),
    }))
}

/// Statistics of one topic and its subscriptions.
#[utoipa::path(get, path = "/topics/{topic}/stats", tag = "topics",
    params(("topic" = Name, Path, description = "Topic name")),
    responses(
        (status = 200, description = "The topic's statistics", body = TopicStatsJson),
        (status = 404, description = "`unknown_topic`", body = ErrorBody),
    ))]
async fn topic_stats(
    State(state): State<AppState>,
    Path(topic): Path<String>,
) -> ApiResult<Json<TopicStatsJson>> {
    let stats = state.broker.stats(Some(&topic))?;
    let stats = stats
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::not_found(format!("unknown topic '{topic}'")))?;
    Ok(Json(stats.into()))
}
