//! Topic routes: create, list, describe, delete, and statistics.

use axum::extract::State;
use axum::http::StatusCode;
use ferrymq_protocol::{
    FsyncPolicy, OverflowPolicy, RetentionPolicy, Storage, SubscriptionStats, TopicConfig,
    TopicInfo, TopicStats,
};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

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

pub(crate) fn storage_name(storage: Storage) -> &'static str {
    match storage {
        Storage::Memory => "memory",
        Storage::Disk => "disk",
    }
}

pub(crate) fn overflow_name(overflow: OverflowPolicy) -> &'static str {
    match overflow {
        OverflowPolicy::DropOldest => "drop-oldest",
        OverflowPolicy::Reject => "reject",
    }
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
    /// Succeed (200 with the existing topic) when it already exists.
    #[serde(default)]
    pub if_not_exists: bool,
}

/// A topic's settings and what it holds.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TopicJson {
    pub name: String,
    pub partitions: u32,
    /// `disk` or `memory`.
    pub storage: &'static str,
    /// `drop-oldest` or `reject`.
    pub overflow: &'static str,
    /// Most messages retained; `null`: no limit.
    pub max_messages: Option<u64>,
    /// Most bytes retained; `null`: no limit.
    pub max_bytes: Option<u64>,
    /// Disk topics: `always`, `interval:<ms>` or `never`; `null` for memory topics, which have no
    /// log to sync.
    pub fsync: Option<String>,
    /// Disk topics: the age limit in ms, `null` for none; `null` for memory topics, which keep
    /// messages until their limits drop them.
    pub retention_ms: Option<u64>,
    /// `stream` (settled messages stay until the limits) or `work_queue` (they go once every
    /// subscription settled them).
    pub retention_policy: String,
    /// How long deduplication ids are remembered.
    pub dedup_window_ms: u64,
    /// Messages retained now, across partitions.
    pub messages: u64,
    pub bytes: u64,
    pub subscriptions: Vec<String>,
}

/// A limit as JSON: the broker's "none" (`u64::MAX`) is `null`, since a number that large is
/// not exact in JavaScript and would not survive a round trip through a browser or Node.
fn limit(value: u64) -> Option<u64> {
    (value != u64::MAX).then_some(value)
}

impl From<TopicInfo> for TopicJson {
    fn from(info: TopicInfo) -> Self {
        let disk = info.config.storage == Storage::Disk;
        TopicJson {
            name: info.name,
            partitions: info.config.partitions,
            storage: storage_name(info.config.storage),
            overflow: overflow_name(info.config.overflow),
            max_messages: limit(info.config.max_messages),
            max_bytes: limit(info.config.max_bytes),
            fsync: disk.then(|| info.config.fsync.to_string()),
            retention_ms: limit(info.config.retention_ms).filter(|_| disk),
            retention_policy: info.config.retention_policy.to_string(),
            dedup_window_ms: info.config.dedup_window_ms,
            messages: info.messages,
            bytes: info.bytes,
            subscriptions: info.subscriptions,
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TopicList {
    pub topics: Vec<TopicJson>,
}

/// Statistics of one subscription.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SubscriptionStatsJson {
    pub name: String,
    pub ephemeral: bool,
    pub consumers: u32,
    pub messages_out: u64,
    pub bytes_out: u64,
    /// Messages not yet delivered (including those waiting for redelivery).
    pub backlog: u64,
    pub in_flight: u64,
    pub acked: u64,
    pub redelivered: u64,
    /// Messages given up (moved to the dead-letter topic).
    pub gave_up: u64,
    /// From publish (or the end of a message's delay) to its first delivery.
    pub deliver_latency_us: LatencyJson,
    /// From publish (or the end of a message's delay) to its ack, redeliveries included (none
    /// for auto-ack subscriptions).
    pub ack_latency_us: LatencyJson,
}

/// A latency histogram summed over the topic's partitions since the broker started, in
/// microseconds. Each figure is the top of the bucket it falls in (buckets are at most 12.5 %
/// wide), so `p99: 130` means 99 % took at most 130 µs. The figures are `null` while `count` is 0;
/// `/metrics` has the buckets themselves.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct LatencyJson {
    pub count: u64,
    pub mean: Option<u64>,
    pub p50: Option<u64>,
    pub p90: Option<u64>,
    pub p99: Option<u64>,
    pub p999: Option<u64>,
    pub max: Option<u64>,
}

impl From<&ferrymq_protocol::Latency> for LatencyJson {
    fn from(h: &ferrymq_protocol::Latency) -> Self {
        let s = h.summary();
        LatencyJson {
            count: s.count,
            mean: s.mean,
            p50: s.p50,
            p90: s.p90,
            p99: s.p99,
            p999: s.p999,
            max: s.max,
        }
    }
}

/// Statistics of one topic and its subscriptions.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TopicStatsJson {
    pub name: String,
    pub messages_in: u64,
    pub bytes_in: u64,
    pub messages_out: u64,
    pub bytes_out: u64,
    /// Messages retained (queue size).
    pub depth: u64,
    pub depth_bytes: u64,
    /// Messages discarded before every subscription had them: every message the drop-oldest
    /// policy discarded (whether or not the topic had subscriptions), and those a disk topic's
    /// retention removed before a subscription received them. Each message counts once.
    pub dropped: u64,
    pub publishers: u32,
    pub subscribers: u32,
    pub subscriptions: Vec<SubscriptionStatsJson>,
}

impl From<SubscriptionStats> for SubscriptionStatsJson {
    fn from(s: SubscriptionStats) -> Self {
        SubscriptionStatsJson {
            name: s.name,
            ephemeral: s.ephemeral,
            consumers: s.consumers,
            messages_out: s.messages_out,
            bytes_out: s.bytes_out,
            backlog: s.backlog,
            in_flight: s.in_flight,
            acked: s.acked,
            redelivered: s.redelivered,
            gave_up: s.gave_up,
            deliver_latency_us: (&s.deliver_latency).into(),
            ack_latency_us: (&s.ack_latency).into(),
        }
    }
}

impl From<TopicStats> for TopicStatsJson {
    fn from(t: TopicStats) -> Self {
        TopicStatsJson {
            name: t.name,
            messages_in: t.messages_in,
            bytes_in: t.bytes_in,
            messages_out: t.messages_out,
            bytes_out: t.bytes_out,
            depth: t.depth,
            depth_bytes: t.depth_bytes,
            dropped: t.dropped,
            publishers: t.publishers,
            subscribers: t.subscribers,
            subscriptions: t.subscriptions.into_iter().map(Into::into).collect(),
        }
    }
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StatsList {
    pub topics: Vec<TopicStatsJson>,
}

/// Creates a topic.
#[utoipa::path(post, path = "/topics", tag = "topics",
    request_body = CreateTopicSchema,
    responses(
        (status = 201, description = "Created", body = TopicJson),
        (status = 200, description = "It existed and `if_not_exists` was set", body = TopicJson),
        (status = 400, description = "A setting is invalid (the message names it)", body = ErrorBody),
        (status = 409, description = "`topic_exists`", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 429, description = "`limit_exceeded`: the broker holds its maximum of topics", body = ErrorBody),
        (status = 503, description = "`storage_unavailable`", body = ErrorBody),
    ))]
async fn create_topic(
    State(state): State<AppState>,
    caller: Option<axum::Extension<Caller>>,
    Json(request): Json<CreateTopic>,
) -> ApiResult<(StatusCode, Json<TopicJson>)> {
    if let Some(axum::Extension(caller)) = &caller {
        caller.check(ferrymq_broker::Action::Manage, &request.name)?;
    }
    let broker = &state.broker;
    let config = topic_config(broker, &request)?;
    let existed = request.if_not_exists && broker.topic(&request.name).is_ok();
    let topic = broker.create_topic(&request.name, config, request.if_not_exists)?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(topic.info().into())))
}

/// The configuration a create request asks for, checked, with the broker's defaults where
/// it names none.
fn topic_config(broker: &ferrymq_broker::Broker, request: &CreateTopic) -> ApiResult<TopicConfig> {
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
    })
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
) -> ApiResult<StatusCode> {
    state.broker.delete_topic(&topic)?;
    Ok(StatusCode::NO_CONTENT)
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
