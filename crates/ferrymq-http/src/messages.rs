//! Messages by id, listings of a subscription's messages, deleting a subscription, and requeueing
//! dead letters.

use axum::extract::State;
use axum::http::StatusCode;
use base64::Engine as _;
use ferrymq_broker::BrokerError;
use ferrymq_protocol::limits::LIST_PAGE_BYTES_MAX;
use ferrymq_protocol::{ListKind, MessageEntry, MessageStatus};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{ErrorBody, Json, Path, Query};
use crate::schema::{ListState, MessageId, Name, RequeueSelection};
use crate::{ApiError, ApiResult, AppState};

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(message_status))
        .routes(routes!(message_content))
        .routes(routes!(list_messages))
        .routes(routes!(delete_subscription))
        .routes(routes!(requeue))
        .route_layer(axum::middleware::from_fn(crate::service::track))
}

/// Parses a message id, `<partition>-<offset>`.
pub(crate) fn parse_id(id: &str, field: &str) -> ApiResult<(u32, u64)> {
    let bad = || {
        ApiError::invalid(
            field,
            format!("'{id}' is not a message id: write <partition>-<offset>, e.g. 0-17"),
        )
    };
    let (partition, offset) = id.split_once('-').ok_or_else(bad)?;
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(partition) || !all_digits(offset) {
        return Err(bad());
    }
    Ok((
        partition.parse().map_err(|_| bad())?,
        offset.parse().map_err(|_| bad())?,
    ))
}

fn id_text(partition: u32, offset: u64) -> String {
    format!("{partition}-{offset}")
}

fn time(ms: u64) -> Option<u64> {
    (ms != 0).then_some(ms)
}

/// Where a dead letter went.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DeadLetterRef {
    /// `<partition>-<offset>` in the dead-letter topic.
    pub id: String,
    pub partition: u32,
    pub offset: u64,
    /// In a subscription's listing: once requeued, the id of its copy in the subscription's
    /// topic (`<partition>-<offset>`); absent while not requeued (or requeued before copies were
    /// recorded).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requeued_as: Option<String>,
}

/// One message as one subscription sees it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct EntryJson {
    /// `<partition>-<offset>`.
    pub id: String,
    pub partition: u32,
    pub offset: u64,
    /// `pending`, `delayed`, `in_flight`, `acked`, `dead_lettered`, `settled` or `before_start`.
    pub state: &'static str,
    /// Deliveries so far.
    pub attempts: u16,
    /// Unix ms; null when unknown.
    pub published_ms: Option<u64>,
    /// Unix ms of the first delivery; null when never delivered (or unknown).
    pub first_delivered_ms: Option<u64>,
    /// Unix ms it was acked or dead-lettered; null when not settled (or unknown).
    pub settled_ms: Option<u64>,
    /// Delayed: when it is due; in flight: its ack deadline (Unix ms); otherwise null.
    pub due_ms: Option<u64>,
    /// The result its consumer attached to the ack, when it is UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The result, base64, when it is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result_base64: Option<String>,
    /// Why it was dead-lettered.
    pub reason: Option<String>,
    pub dead_letter: Option<DeadLetterRef>,
}

impl From<MessageEntry> for EntryJson {
    fn from(e: MessageEntry) -> Self {
        let (result, result_base64) = if e.result.is_empty() {
            (None, None)
        } else {
            match std::str::from_utf8(&e.result) {
                Ok(text) => (Some(text.to_string()), None),
                Err(_) => (
                    None,
                    Some(base64::engine::general_purpose::STANDARD.encode(&e.result)),
                ),
            }
        };
        EntryJson {
            id: id_text(e.partition, e.offset),
            partition: e.partition,
            offset: e.offset,
            state: e.state.as_str(),
            attempts: e.attempts,
            published_ms: time(e.published_ms),
            first_delivered_ms: time(e.first_delivered_ms),
            settled_ms: time(e.settled_ms),
            due_ms: time(e.due_ms),
            result,
            result_base64,
            reason: (!e.reason.is_empty()).then_some(e.reason),
            dead_letter: e.dead_letter.map(|(partition, offset)| DeadLetterRef {
                id: id_text(partition, offset),
                partition,
                offset,
                requeued_as: None,
            }),
        }
    }
}

/// A message's state in one subscription.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SubscriptionEntryJson {
    pub subscription: String,
    #[serde(flatten)]
    pub entry: EntryJson,
}

/// A message and its state in every subscription of its topic.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MessageStatusJson {
    pub topic: String,
    /// `<partition>-<offset>`.
    pub id: String,
    pub partition: u32,
    pub offset: u64,
    /// Unix ms.
    pub published_ms: u64,
    pub priority: u8,
    /// The key, when it has one and it is UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The key, base64, when it is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_base64: Option<String>,
    /// Size of the body (the body itself is not returned).
    pub body_bytes: u32,
    pub subscriptions: Vec<SubscriptionEntryJson>,
}

impl MessageStatusJson {
    fn new(topic: String, s: MessageStatus) -> Self {
        let (key, key_base64) = match s.key.as_deref().map(std::str::from_utf8) {
            None => (None, None),
            Some(Ok(text)) => (Some(text.to_string()), None),
            Some(Err(_)) => (
                None,
                s.key
                    .as_ref()
                    .map(|k| base64::engine::general_purpose::STANDARD.encode(k)),
            ),
        };
        MessageStatusJson {
            topic,
            id: id_text(s.partition, s.offset),
            partition: s.partition,
            offset: s.offset,
            published_ms: s.published_ms,
            priority: s.priority,
            key,
            key_base64,
            body_bytes: s.body_bytes,
            subscriptions: s
                .subscriptions
                .into_iter()
                .map(|sub| SubscriptionEntryJson {
                    subscription: sub.subscription,
                    entry: sub.entry.into(),
                })
                .collect(),
        }
    }
}

/// Where message `id` of a topic stands, in every subscription.
#[utoipa::path(get, path = "/topics/{topic}/messages/{id}", tag = "messages",
    params(
        ("topic" = Name, Path, description = "Topic name"),
        ("id" = MessageId, Path, description = "Message id, `<partition>-<offset>`"),
    ),
    responses(
        (status = 200, description = "The message and its state per subscription", body = MessageStatusJson),
        (status = 400, description = "Not a message id, or no such partition", body = ErrorBody),
        (status = 404, description = "`unknown_topic`, or `unknown_message` (never published, or no longer retained)", body = ErrorBody),
    ))]
async fn message_status(
    State(state): State<AppState>,
    Path((topic, id)): Path<(String, String)>,
) -> ApiResult<Json<MessageStatusJson>> {
    let (partition, offset) = parse_id(&id, "id")?;
    // An id in a partition the topic does not have names no message, like one past its end.
    if partition >= state.broker.topic(&topic)?.partition_count() {
        return Err(ApiError::from(BrokerError::UnknownMessage {
            topic,
            id,
            why: format!("the topic has no partition {partition}"),
        }));
    }
    let status = state.broker.message_status(&topic, partition, offset)?;
    Ok(Json(MessageStatusJson::new(topic, status)))
}

/// A retained message as it was published.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MessageContentJson {
    pub topic: String,
    /// `<partition>-<offset>`.
    pub id: String,
    pub partition: u32,
    pub offset: u64,
    /// Unix ms.
    pub published_ms: u64,
    pub priority: u8,
    /// The delay it was published with, in ms; null when none.
    pub delay_ms: Option<u64>,
    /// The key, when it has one and it is UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The key, base64, when it is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_base64: Option<String>,
    /// `[name, value]` pairs in the order stored (a name may repeat).
    #[schema(value_type = crate::schema::HeaderPairs)]
    pub headers: Vec<(String, String)>,
    /// The body, when it is UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The body, base64, when it is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
    pub body_bytes: u32,
}

/// Message `id` of a topic with its key, headers and body, while the topic retains it.
#[utoipa::path(get, path = "/topics/{topic}/messages/{id}/content", tag = "messages",
    params(
        ("topic" = Name, Path, description = "Topic name"),
        ("id" = MessageId, Path, description = "Message id, `<partition>-<offset>`"),
    ),
    responses(
        (status = 200, description = "The message as published", body = MessageContentJson),
        (status = 400, description = "Not a message id", body = ErrorBody),
        (status = 404, description = "`unknown_topic`, or `unknown_message` (never published, or no longer retained)", body = ErrorBody),
    ))]
async fn message_content(
    State(state): State<AppState>,
    Path((topic, id)): Path<(String, String)>,
) -> ApiResult<Json<MessageContentJson>> {
    let (partition, offset) = parse_id(&id, "id")?;
    // As for a status lookup: an id in a partition the topic does not have names no message.
    if partition >= state.broker.topic(&topic)?.partition_count() {
        return Err(ApiError::from(BrokerError::UnknownMessage {
            topic,
            id,
            why: format!("the topic has no partition {partition}"),
        }));
    }
    let stored = state.broker.stored_message(&topic, partition, offset)?;
    let message = stored.message;
    let base64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let (key, key_base64) = match message.key.as_deref() {
        None => (None, None),
        Some(key) => match std::str::from_utf8(key) {
            Ok(text) => (Some(text.to_string()), None),
            Err(_) => (None, Some(base64(key))),
        },
    };
    let (body, body_base64) = match std::str::from_utf8(&message.body) {
        Ok(text) => (Some(text.to_string()), None),
        Err(_) => (None, Some(base64(&message.body))),
    };
    Ok(Json(MessageContentJson {
        topic,
        id: id_text(partition, offset),
        partition,
        offset,
        published_ms: stored.published_ms,
        priority: message.priority,
        delay_ms: message.deliver_after_ms,
        key,
        key_base64,
        headers: message.headers,
        body,
        body_base64,
        body_bytes: message.body.len() as u32,
    }))
}

/// Which messages of a subscription to list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// `pending` (delayed included; partition and offset order), `in_flight`, `acked` or
    /// `dead_lettered` (these two newest first, from the broker's bounded history).
    #[param(value_type = ListState)]
    pub state: String,
    /// Entries per page, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// The `next_page` token of the previous page, passed back unchanged.
    #[param(pattern = "^([0-9a-f]{2}){0,64}$")]
    pub page: Option<String>,
}

/// One page of a listing.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MessagePageJson {
    pub messages: Vec<EntryJson>,
    /// Token of the next page (pass it as `page`); null: this was the last page.
    pub next_page: Option<String>,
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || text.len() > LIST_PAGE_BYTES_MAX * 2 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Says, for each dead letter of a listing, where its requeued copy is.
async fn mark_requeued(
    state: &AppState,
    topic: &str,
    subscription: &str,
    entries: &mut [EntryJson],
) {
    let letters: Vec<(u32, u64)> = entries
        .iter()
        .filter_map(|e| e.dead_letter.as_ref().map(|d| (d.partition, d.offset)))
        .collect();
    if letters.is_empty() {
        return;
    }
    let Ok(dlq) = state
        .broker
        .subscription_dead_letter_topic(topic, subscription)
    else {
        return;
    };
    let copies = state.broker.requeued_copies(&dlq, &letters).await;
    let refs = entries.iter_mut().filter_map(|e| e.dead_letter.as_mut());
    for (dead_letter, copy) in refs.zip(copies) {
        dead_letter.requeued_as = copy.map(|(p, o)| id_text(p, o));
    }
}

/// Lists a subscription's messages of one state, page by page.
#[utoipa::path(get, path = "/topics/{topic}/subscriptions/{subscription}/messages", tag = "messages",
    params(
        ("topic" = Name, Path, description = "Topic name"),
        ("subscription" = Name, Path, description = "Subscription name"),
        ListQuery,
    ),
    responses(
        (status = 200, description = "One page", body = MessagePageJson),
        (status = 400, description = "Bad state, limit or page token", body = ErrorBody),
        (status = 404, description = "`unknown_topic` or `unknown_subscription`", body = ErrorBody),
    ))]
async fn list_messages(
    State(state): State<AppState>,
    Path((topic, subscription)): Path<(String, String)>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<MessagePageJson>> {
    let kind: ListKind = query
        .state
        .parse()
        .map_err(|e: String| ApiError::invalid("state", e))?;
    let page = match query.page.as_deref() {
        None | Some("") => Vec::new(),
        Some(text) => from_hex(text).ok_or_else(|| {
            ApiError::invalid("page", "not a page token: pass next_page back unchanged")
        })?,
    };
    let limit = query.limit.unwrap_or(100);
    let listed = state
        .broker
        .list_messages(&topic, &subscription, kind, &page, limit)?;
    let mut messages: Vec<EntryJson> = listed.entries.into_iter().map(Into::into).collect();
    mark_requeued(&state, &topic, &subscription, &mut messages).await;
    Ok(Json(MessagePageJson {
        messages,
        next_page: (!listed.next_page.is_empty()).then(|| to_hex(&listed.next_page)),
    }))
}

/// Deletes a subscription (it must have no consumers attached).
#[utoipa::path(delete, path = "/topics/{topic}/subscriptions/{subscription}", tag = "messages",
    params(
        ("topic" = Name, Path, description = "Topic name"),
        ("subscription" = Name, Path, description = "Subscription name"),
    ),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "`unknown_topic` or `unknown_subscription`", body = ErrorBody),
        (status = 409, description = "`conflict`: consumers are attached", body = ErrorBody),
    ))]
async fn delete_subscription(
    State(state): State<AppState>,
    Path((topic, subscription)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    // HTTP long-poll consumers idle now would keep it attached until they expire.
    state.consumers.release(&topic, &subscription);
    state.broker.delete_subscription(&topic, &subscription)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Which dead letters to requeue: `{"all": true}`, `{"id": "0-5"}`, or
/// `{"partition": 0, "first": 10, "last": 19}` (inclusive).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequeueRequest {
    pub all: Option<bool>,
    /// One dead letter, `<partition>-<offset>` in the dead-letter topic.
    pub id: Option<String>,
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    pub partition: Option<u32>,
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    pub first: Option<u64>,
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    pub last: Option<u64>,
}

/// What a requeue did.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct RequeueReply {
    /// Dead letters published again to their source topic, for their subscription.
    pub requeued: u64,
    /// Selected offsets left: requeued before, not dead letters, or their source is gone.
    pub skipped: u64,
}

/// Publishes dead letters of a dead-letter topic again to the topic and partition they came
/// from, for the subscription they died in only; each at most once.
#[utoipa::path(post, path = "/topics/{topic}/requeue", tag = "messages",
    params(("topic" = Name, Path, description = "The dead-letter topic, e.g. `orders.dlq`")),
    request_body = RequeueSelection,
    responses(
        (status = 200, description = "Done", body = RequeueReply),
        (status = 400, description = "No selection, or more than one", body = ErrorBody),
        (status = 404, description = "`unknown_topic`, or `unknown_message`: the selection names a partition the topic does not have", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 503, description = "`storage_unavailable`", body = ErrorBody),
    ))]
async fn requeue(
    State(state): State<AppState>,
    Path(topic): Path<String>,
    Json(request): Json<RequeueRequest>,
) -> ApiResult<Json<RequeueReply>> {
    let partitions = state.broker.topic(&topic)?.partition_count();
    let range = match request {
        RequeueRequest {
            all: Some(true),
            id: None,
            partition: None,
            first: None,
            last: None,
        } => None,
        RequeueRequest {
            all: None | Some(false),
            id: Some(id),
            partition: None,
            first: None,
            last: None,
        } => {
            let (partition, offset) = parse_id(&id, "id")?;
            Some((partition, offset, offset))
        }
        RequeueRequest {
            all: None | Some(false),
            id: None,
            partition: Some(partition),
            first: Some(first),
            last,
        } => {
            let last = last.unwrap_or(first);
            if last < first {
                return Err(ApiError::invalid(
                    "last",
                    format!("{last} is below first {first}"),
                ));
            }
            Some((partition, first, last))
        }
        _ => {
            return Err(ApiError::invalid(
                "selection",
                "give exactly one of {\"all\": true}, {\"id\": \"<partition>-<offset>\"} or {\"partition\": p, \"first\": a, \"last\": b}",
            ))
        }
    };
    // A partition the topic does not have holds no dead letter to requeue.
    if let Some((partition, first, _)) = range.filter(|(p, _, _)| *p >= partitions) {
        return Err(ApiError::from(BrokerError::UnknownMessage {
            topic,
            id: id_text(partition, first),
            why: format!("the topic has no partition {partition}"),
        }));
    }
    let outcome = state.broker.requeue_dead_letters(&topic, range).await?;
    Ok(Json(RequeueReply {
        requeued: outcome.requeued,
        skipped: outcome.skipped,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse() {
        assert_eq!(parse_id("0-17", "id").unwrap(), (0, 17));
        assert_eq!(
            parse_id("3-18446744073709551615", "id").unwrap(),
            (3, u64::MAX)
        );
        for bad in ["", "0", "-1", "0-", "a-1", "1-+2", "0-1-2", "4294967296-0"] {
            let error = parse_id(bad, "id").unwrap_err();
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{bad}");
            assert!(error.message.contains("invalid id"), "{}", error.message);
        }
    }

    #[test]
    fn page_tokens_roundtrip() {
        let token = [0u8, 1, 0xab, 0xff];
        assert_eq!(from_hex(&to_hex(&token)).unwrap(), token);
        assert!(from_hex("abc").is_none());
        assert!(from_hex("zz").is_none());
    }
}
