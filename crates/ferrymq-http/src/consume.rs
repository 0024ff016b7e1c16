//! Consuming over HTTP: long-poll (`POST .../poll`), a Server-Sent Events stream
//! (`GET .../stream`), and acks and nacks (`POST .../ack`, `POST .../nack`) naming the consumer
//! token the messages came with. The consumers themselves live in [`crate::consumers`], so that
//! what a client was given stays its own between requests. The stream's delivery pump and the
//! ack and nack logic serve the WebSocket consumer too (`crate::websocket`). The poll, ack and
//! nack routes are in [`crate::relay`], which passes them on to other nodes of a cluster and
//! calls the polls, acks and nacks at this node here.

use std::collections::btree_map::Entry as HeaderEntry;
use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use base64::Engine as _;
use bytes::Bytes;
use ferrymq_broker::connections::{ConnectionEntry, HeldCredit};
use ferrymq_broker::{validate_name, BrokerError, Consumer};
use ferrymq_protocol::limits::{DELAY_MS_MAX, ERROR_MESSAGE_BYTES_MAX, RANGES_COUNT_MAX};
use ferrymq_protocol::{
    parse_partition_list, ErrorCode, Message, OffsetRange, StartPosition, SubscribeRequest,
};
use futures_util::{Stream, StreamExt as _};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::consumers::{Entry, PollKey, StreamRegistration};
use crate::error::{body_rejection, ErrorBody, Path, Query};
use crate::schema::{MessageIds, Name};
use crate::{ApiError, ApiResult, AppState};

/// Messages one poll returns at most.
const POLL_MAX: u32 = 1000;
const POLL_MAX_DEFAULT: u32 = 10;
/// Longest a poll waits for a first message.
const WAIT_MS_MAX: u64 = 30_000;
const WAIT_MS_DEFAULT: u64 = 5_000;
/// Record bytes one poll returns at most (one message always goes, whatever its size).
const POLL_BYTES_MAX: usize = 4 << 20;
/// Unacked messages a stream holds at most, by default and at most.
const STREAM_IN_FLIGHT_DEFAULT: u32 = 100;
const STREAM_IN_FLIGHT_MAX: u32 = 10_000;
/// Messages a stream takes per pass.
const STREAM_BATCH: u32 = 100;
/// The one consumer of a stream, under its connection in the broker's listing.
const STREAM_CONSUMER_ID: u32 = 1;
const STREAM_BYTES_MAX: usize = 1 << 20;
/// SSE comment sent while a stream has nothing to say, so proxies and clients see it alive.
const HEARTBEAT: Duration = Duration::from_secs(15);

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(stream))
        .route_layer(axum::middleware::from_fn(crate::service::track))
}

/// What a node answers consumers with: its broker and consumers, and its cluster.
#[derive(Clone)]
pub(crate) struct Local {
    pub broker: ferrymq_broker::Broker,
    pub consumers: Arc<crate::consumers::Registry>,
    pub cluster: Option<crate::cluster::ClusterRouter>,
}

impl Local {
    pub(crate) fn of(state: &AppState) -> Local {
        Local {
            broker: state.broker.clone(),
            consumers: state.consumers.clone(),
            cluster: state.config.cluster.clone(),
        }
    }
}

/// Counters of what HTTP consumers received and settled.
struct ConsumeCounters {
    polled: metrics::Counter,
    streamed: metrics::Counter,
    websocket: metrics::Counter,
    acked: metrics::Counter,
    released: metrics::Counter,
}

fn counters() -> &'static ConsumeCounters {
    static COUNTERS: std::sync::OnceLock<ConsumeCounters> = std::sync::OnceLock::new();
    COUNTERS.get_or_init(|| ConsumeCounters {
        polled: metrics::counter!("ferrymq_http_delivered_messages_total", "via" => "poll"),
        streamed: metrics::counter!("ferrymq_http_delivered_messages_total", "via" => "stream"),
        websocket: metrics::counter!("ferrymq_http_delivered_messages_total", "via" => "websocket"),
        acked: metrics::counter!("ferrymq_http_acked_messages_total"),
        released: metrics::counter!("ferrymq_http_nacked_messages_total"),
    })
}

/// How a consumer is attached: the subscription's options (they apply when the request creates
/// the subscription; joining an existing one with different ones is a `conflict`).
#[derive(Debug, Default, Clone, Serialize, Deserialize, IntoParams, ToSchema)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct PollOptions {
    /// Most messages to return, 1..=1000; default 10.
    #[param(minimum = 1, maximum = 1000)]
    #[schema(minimum = 1, maximum = 1000)]
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    max: Option<u32>,
    /// How long to wait for a first message, 0..=30000 ms; default 5000. An empty list comes back
    /// when nothing arrived by then.
    #[param(minimum = 0, maximum = 30000)]
    #[schema(minimum = 0, maximum = 30000)]
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    wait_ms: Option<u64>,
    /// Where a new subscription starts: `earliest`, `latest` (default), `offset:N` or
    /// `time:UNIX_MS`. Ignored when the subscription exists.
    #[param(pattern = "^(earliest|latest|offset:[0-9]{1,19}|time:[0-9]{1,19})$")]
    #[schema(pattern = "^(earliest|latest|offset:[0-9]{1,19}|time:[0-9]{1,19})$")]
    start: Option<String>,
    /// Redelivery after this long without an ack, 10..=86400000 ms; default: the broker's (30 s).
    #[param(minimum = 10, maximum = 86400000)]
    #[schema(minimum = 10, maximum = 86400000)]
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    ack_timeout_ms: Option<u32>,
    /// Deliveries before a message is given up to the dead-letter topic; default: the broker's.
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    max_attempts: Option<u32>,
    /// At most one message per key in flight across the subscription's consumers.
    ordered: Option<bool>,
    /// At-most-once: messages count as acked when returned.
    auto_ack: Option<bool>,
    /// Where given-up messages go; default `<topic>.dlq`.
    #[param(pattern = "^[A-Za-z0-9._-]{1,255}$")]
    #[schema(pattern = "^[A-Za-z0-9._-]{1,255}$")]
    dead_letter_topic: Option<String>,
    /// Only these partitions, e.g. `1,2,4-7`; default all.
    #[param(pattern = "^[0-9]{1,9}(-[0-9]{1,9})?(,[0-9]{1,9}(-[0-9]{1,9})?)*$")]
    #[schema(pattern = "^[0-9]{1,9}(-[0-9]{1,9})?(,[0-9]{1,9}(-[0-9]{1,9})?)*$")]
    partitions: Option<String>,
}

impl PollOptions {
    /// Fields of `body` win over the query's.
    pub(crate) fn merge(self, body: PollOptions) -> PollOptions {
        PollOptions {
            max: body.max.or(self.max),
            wait_ms: body.wait_ms.or(self.wait_ms),
            start: body.start.or(self.start),
            ack_timeout_ms: body.ack_timeout_ms.or(self.ack_timeout_ms),
            max_attempts: body.max_attempts.or(self.max_attempts),
            ordered: body.ordered.or(self.ordered),
            auto_ack: body.auto_ack.or(self.auto_ack),
            dead_letter_topic: body.dead_letter_topic.or(self.dead_letter_topic),
            partitions: body.partitions.or(self.partitions),
        }
    }
}

/// A stream's options: the subscription's, and how many unacked messages it may hold.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct StreamOptions {
    /// Unacked messages the stream holds at most before it waits for acks, 1..=10000; default
    /// 100. Ignored with `auto_ack`.
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    max_in_flight: Option<u32>,
    /// Where a new subscription starts: `earliest`, `latest` (default), `offset:N` or
    /// `time:UNIX_MS`. Ignored when the subscription exists.
    start: Option<String>,
    /// Redelivery after this long without an ack, 10..=86400000 ms; default: the broker's (30 s).
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    ack_timeout_ms: Option<u32>,
    /// Deliveries before a message is given up to the dead-letter topic; default: the broker's.
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    max_attempts: Option<u32>,
    /// At most one message per key in flight across the subscription's consumers.
    ordered: Option<bool>,
    /// At-most-once: messages count as acked when sent; no acks needed, no flow control.
    auto_ack: Option<bool>,
    /// Where given-up messages go; default `<topic>.dlq`.
    dead_letter_topic: Option<String>,
    /// Only these partitions, e.g. `1,2,4-7`; default all.
    partitions: Option<String>,
}

/// One delivered message.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct DeliveredMessage {
    /// `<partition>-<offset>`: what ack and nack take.
    pub(crate) id: String,
    pub(crate) partition: u32,
    offset: u64,
    /// Publish time, ms since the Unix epoch.
    timestamp_ms: u64,
    /// 1 for the first delivery, +1 for each redelivery.
    attempt: u16,
    /// The key as UTF-8; null without a key (and when it is not UTF-8: see `key_base64`).
    key: Option<String>,
    /// A key that is not UTF-8, base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    key_base64: Option<String>,
    priority: u8,
    /// Headers; a name repeated in the message has its values joined with `, `.
    headers: BTreeMap<String, String>,
    /// The body: a JSON value when the message has `content-type: application/json` (or
    /// `+json`) and parses as JSON, else a string when it is UTF-8. Absent otherwise: see
    /// `body_base64`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Value>)]
    body: Option<serde_json::Value>,
    /// A body that is not UTF-8, base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    body_base64: Option<String>,
}

/// What a poll returns.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct PollResponse {
    /// The consumer the messages are in flight to: name it in acks and nacks. Polls with the same
    /// options share it; it expires after 60 s without requests and nothing in flight. In a
    /// cluster it names the node (or nodes) holding it too, `<node>:<token>` joined by commas,
    /// so that an ack through any node reaches the nodes that delivered.
    pub(crate) consumer: String,
    /// Possibly empty, when nothing arrived within `wait_ms`.
    pub(crate) messages: Vec<DeliveredMessage>,
}

/// The first event of a stream.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StreamConsumer {
    /// The stream's consumer: name it in acks and nacks while the stream is open.
    consumer: String,
    /// The subscription's name (`ephemeral#N` for `-`).
    subscription: String,
    auto_ack: bool,
    max_in_flight: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AckRequest {
    /// The token the messages came with.
    pub(crate) consumer: String,
    /// Message ids, `<partition>-<offset>`, 1 to 65536.
    #[schema(value_type = MessageIds, inline)]
    pub(crate) ids: Vec<String>,
    /// Kept with each acked message for status queries, at most 4096 bytes.
    pub(crate) result: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct AckResponse {
    /// Messages settled; ids no longer in flight to this consumer (acked already, or redelivered
    /// after their ack timeout) are not counted.
    pub(crate) acked: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NackRequest {
    /// The token the messages came with.
    pub(crate) consumer: String,
    /// Message ids, `<partition>-<offset>`, 1 to 65536.
    #[schema(value_type = MessageIds, inline)]
    pub(crate) ids: Vec<String>,
    /// Ready again after this long (at most 30 days); default at once.
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    #[schema(maximum = 2_592_000_000_u64)]
    pub(crate) delay_ms: Option<u64>,
    /// Move the messages to the dead-letter topic now instead of delivering them again.
    pub(crate) dead_letter: Option<bool>,
    /// Why, at most 1024 bytes. With `dead_letter`: the dead letter's `x-ferrymq-dead-reason`
    /// (default: `dead-lettered by the consumer (HTTP nack)`); without: kept for the dead letter
    /// of a message whose last attempt this nack spends (`max_attempts (n) reached: <reason>`).
    pub(crate) reason: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub(crate) struct NackResponse {
    /// Messages given back (or dead-lettered); ids no longer in flight to this consumer are not
    /// counted.
    pub(crate) released: u64,
}

pub(crate) fn path_names(
    Path((topic, subscription)): Path<(String, String)>,
) -> ApiResult<(String, String)> {
    validate_name("topic", &topic)?;
    if subscription != "-" {
        validate_name("subscription", &subscription)?;
    }
    Ok((topic, subscription))
}

fn parse_start(text: Option<&str>) -> ApiResult<StartPosition> {
    let bad = || {
        ApiError::invalid(
            "start",
            format!(
                "'{}' is not earliest, latest, offset:N or time:UNIX_MS",
                text.unwrap_or("")
            ),
        )
    };
    Ok(match text {
        None | Some("latest") => StartPosition::Latest,
        Some("earliest") => StartPosition::Earliest,
        Some(other) => match other.split_once(':') {
            Some(("offset", n)) => StartPosition::Offset(n.parse().map_err(|_| bad())?),
            Some(("time", t)) => StartPosition::TimeMs(t.parse().map_err(|_| bad())?),
            _ => return Err(bad()),
        },
    })
}

#[allow(clippy::too_many_arguments)]
fn subscribe_request(
    topic: &str,
    subscription: &str,
    start: Option<&str>,
    ack_timeout_ms: Option<u32>,
    max_attempts: Option<u32>,
    ordered: Option<bool>,
    auto_ack: Option<bool>,
    dead_letter_topic: Option<&str>,
    partitions: Option<&str>,
) -> ApiResult<SubscribeRequest> {
    let partitions = match partitions {
        None => Vec::new(),
        Some(text) => {
            parse_partition_list(text).map_err(|reason| ApiError::invalid("partitions", reason))?
        }
    };
    let ack_timeout_ms = ack_timeout_ms.unwrap_or(0);
    Ok(SubscribeRequest {
        topic: topic.to_string(),
        subscription: subscription.to_string(),
        start: parse_start(start)?,
        ack_timeout_ms,
        max_attempts: max_attempts.unwrap_or(0),
        credit: 0,
        auto_ack: auto_ack.unwrap_or(false),
        ordered: ordered.unwrap_or(false),
        partitions,
        dead_letter_topic: dead_letter_topic.unwrap_or("").to_string(),
    })
}

/// Reads an optional JSON body: empty is none; anything else must be `application/json`.
pub(crate) fn optional_json<T: serde::de::DeserializeOwned + Default>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<T> {
    let body = body.map_err(|e| match crate::BodyError::find(&e) {
        Some(_) => ApiError::from_body_error(&e),
        None => body_rejection(e.status(), e.body_text()),
    })?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_json_media_type);
    if !json {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "this endpoint takes an optional JSON body: send Content-Type: application/json, or options in the query string",
        ));
    }
    // `null` is no options, like an empty body.
    serde_json::from_slice::<Option<T>>(&body)
        .map(Option::unwrap_or_default)
        .map_err(|e| match e.classify() {
            serde_json::error::Category::Data => ApiError::invalid("JSON body", e),
            _ => ApiError::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                format!("malformed JSON: {e}"),
            ),
        })
}

fn is_json_media_type(value: &str) -> bool {
    let media = value.split(';').next().unwrap_or("").trim();
    media.eq_ignore_ascii_case("application/json")
        || (media.len() > 5 && media[media.len() - 5..].eq_ignore_ascii_case("+json"))
}

type Taken = (u32, u64, u64, u16, Bytes);

/// A delivered record as JSON.
fn delivered_message(
    (partition, offset, timestamp_ms, attempt, record): Taken,
) -> DeliveredMessage {
    let mut message = Message::from_stored(record);
    let b64 = base64::engine::general_purpose::STANDARD;
    let (key, key_base64) = match &message.key {
        None => (None, None),
        Some(key) => match std::str::from_utf8(key) {
            Ok(text) => (Some(text.to_string()), None),
            Err(_) => (None, Some(b64.encode(key))),
        },
    };
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    let mut json = false;
    for (name, value) in std::mem::take(&mut message.headers) {
        if name.eq_ignore_ascii_case("content-type") && is_json_media_type(&value) {
            json = true;
        }
        match headers.entry(name) {
            HeaderEntry::Vacant(slot) => {
                slot.insert(value);
            }
            HeaderEntry::Occupied(mut slot) => {
                let joined = slot.get_mut();
                joined.push_str(", ");
                joined.push_str(&value);
            }
        }
    }
    let parsed = json
        .then(|| serde_json::from_slice::<serde_json::Value>(&message.body).ok())
        .flatten();
    let (body, body_base64) = match parsed {
        Some(value) => (Some(value), None),
        None => match std::str::from_utf8(&message.body) {
            Ok(text) => (Some(serde_json::Value::String(text.to_string())), None),
            Err(_) => (None, Some(b64.encode(&message.body))),
        },
    };
    DeliveredMessage {
        id: format!("{partition}-{offset}"),
        partition,
        offset,
        timestamp_ms,
        attempt,
        key,
        key_base64,
        priority: message.priority,
        headers,
        body,
        body_base64,
    }
}

/// A poll's request, checked: what a node passes on to a partition's leader, too.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PollAsk {
    pub(crate) topic: String,
    pub(crate) subscription: String,
    pub(crate) max: u32,
    pub(crate) wait_ms: u64,
    pub(crate) options: PollOptions,
}

impl PollAsk {
    pub(crate) fn checked(
        topic: String,
        subscription: String,
        options: PollOptions,
    ) -> ApiResult<PollAsk> {
        if subscription == "-" {
            return Err(ApiError::invalid(
                "subscription",
                "a poll needs a named subscription: an ephemeral one ('-') would vanish between requests; use GET .../stream for one",
            ));
        }
        let max = options.max.unwrap_or(POLL_MAX_DEFAULT);
        if !(1..=POLL_MAX).contains(&max) {
            return Err(ApiError::invalid(
                "max",
                format!("{max} is outside 1..={POLL_MAX}"),
            ));
        }
        let wait_ms = options.wait_ms.unwrap_or(WAIT_MS_DEFAULT);
        if wait_ms > WAIT_MS_MAX {
            return Err(ApiError::invalid(
                "wait_ms",
                format!("{wait_ms} is above {WAIT_MS_MAX}"),
            ));
        }
        let ask = PollAsk {
            topic,
            subscription,
            max,
            wait_ms,
            options,
        };
        // Every option is checked here, before the poll goes anywhere.
        ask.request()?;
        Ok(ask)
    }

    /// The subscription the poll attaches to.
    pub(crate) fn request(&self) -> ApiResult<SubscribeRequest> {
        let options = &self.options;
        subscribe_request(
            &self.topic,
            &self.subscription,
            options.start.as_deref(),
            options.ack_timeout_ms,
            options.max_attempts,
            options.ordered,
            options.auto_ack,
            options.dead_letter_topic.as_deref(),
            options.partitions.as_deref(),
        )
    }
}

/// A poll at this node, of the partitions it leads: waits up to the ask's `wait_ms` for a first
/// message, less when `stop` is notified (a node gathering from several leaders has what it
/// needs). Answers with this node's own consumer token.
pub(crate) async fn poll_here(
    local: &Local,
    ask: &PollAsk,
    stop: Option<&tokio::sync::Notify>,
) -> ApiResult<PollResponse> {
    let request = ask.request()?;
    crate::cluster::check_serves_on(local.cluster.as_ref(), &ask.topic, &request.partitions)?;
    let key = PollKey {
        topic: ask.topic.clone(),
        subscription: ask.subscription.clone(),
        ack_timeout_ms: request.ack_timeout_ms,
        max_attempts: request.max_attempts,
        ordered: request.ordered,
        auto_ack: request.auto_ack,
        dead_letter_topic: request.dead_letter_topic.clone(),
        partitions: request.partitions.clone(),
    };
    let broker = local.broker.clone();
    let held = local
        .consumers
        .poll_consumer(key, || broker.subscribe(&request))?;
    let consumer = &held.entry.consumer;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(ask.wait_ms);
    let mut taken: Vec<Taken> = Vec::new();
    let never = tokio::sync::Notify::new();
    let stop = stop.unwrap_or(&never);
    loop {
        let notified = consumer.ready_notification();
        tokio::pin!(notified);
        notified.as_mut().enable();
        consumer.poll(ask.max, POLL_BYTES_MAX, |p, o, ts, attempt, record| {
            taken.push((p, o, ts, attempt, record.clone()))
        })?;
        if !taken.is_empty() || consumer.is_closed() || local.consumers.is_closing() {
            break;
        }
        tokio::select! {
            woken = tokio::time::timeout_at(deadline, notified) => {
                if woken.is_err() {
                    break;
                }
            }
            // The server is stopping: answer with nothing rather than hold it up.
            _ = local.consumers.wait_closed() => break,
            _ = stop.notified() => break,
        }
    }
    counters().polled.increment(taken.len() as u64);
    Ok(PollResponse {
        consumer: held.entry.token.clone(),
        messages: taken.into_iter().map(delivered_message).collect(),
    })
}

/// Server-Sent Events: messages as they come, each an event `message` with the message's id and
/// its JSON (as a poll returns it) as data, after a first event `consumer` naming the stream's
/// consumer token.
///
/// Ack and nack through the ack and nack routes with that token (unless `auto_ack`); at most
/// `max_in_flight` messages are unacked before the stream waits. Closing the stream gives its
/// unacked messages back at once. Subscription `-` is an ephemeral subscription of its own,
/// removed with the stream. A comment `: heartbeat` comes every 15 s while nothing else does.
#[utoipa::path(
    get,
    path = "/topics/{topic}/subscriptions/{subscription}/stream",
    tag = "consume",
    params(
        ("topic" = Name, Path, description = "Topic name"),
        ("subscription" = Name, Path, description = "A named subscription, or `-` for an ephemeral one of this stream's own"),
        StreamOptions,
    ),
    responses(
        (status = 200, description = "An event stream: `event: consumer` (data: StreamConsumer), then `event: message` (id: the message id, data: DeliveredMessage) for each message; `event: error` (data: the error JSON) before it ends if the topic goes away or the server stops, or, in a cluster, once this node stops serving a partition it delivered (`not_leader`, with `retry: 1000`)", content_type = "text/event-stream", body = String),
        (status = 400, description = "Bad option or name", body = ErrorBody),
        (status = 404, description = "Unknown topic (auto-create off)", body = ErrorBody),
        (status = 409, description = "Options contradict the existing subscription", body = ErrorBody),
        (status = 429, description = "Too many consumers", body = ErrorBody),
        (status = 503, description = "The server is stopping; or, in a cluster, `not_leader`: this node leads none of the partitions asked for (streams are served by the node they are opened on; the message names the leaders; `Retry-After: 1`)", body = ErrorBody),
    )
)]
// One argument per axum extractor: what the request carries, each taken as it is.
#[allow(clippy::too_many_arguments)]
async fn stream(
    State(state): State<AppState>,
    caller: Option<axum::Extension<crate::Caller>>,
    peer: Option<axum::Extension<crate::auth::Peer>>,
    over_tls: Option<axum::Extension<crate::auth::OverTls>>,
    headers: HeaderMap,
    path: Path<(String, String)>,
    Query(options): Query<StreamOptions>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    let access = caller.map(|c| c.0.access());
    let user = access
        .as_ref()
        .and_then(|a| a.identity().user().map(str::to_owned))
        .unwrap_or_default();
    let (pump, hello) = open_stream(&state, path, options, Via::Stream, access)?;
    // Listed among the broker's connections while the stream lives, and closable as they are.
    let listed = crate::operate::list_stream(
        &state,
        peer.map(|p| p.0),
        over_tls.map(|t| t.0),
        &headers,
        &user,
    );
    pump.list_on(&listed);
    let hello = serde_json::to_string(&hello).expect("serializes");
    let first = counted_event(&listed, "consumer", None, hello);
    // `None` in place of the guard once an operator closed the stream: it ends there.
    let messages =
        futures_util::stream::unfold((pump, Some(listed)), |(mut pump, listed)| async move {
            let listed = listed?;
            // `Pump::next` is cancel safe: a message it took is queued, not lost.
            let event = tokio::select! {
                out = pump.next() => match out? {
                    Out::Message(message) => {
                        listed.messages_out.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let data = serde_json::to_string(&message).expect("serializes");
                        counted_event(&listed, "message", Some(&message.id), data)
                    }
                    Out::Error(error) => error_event(&listed, error),
                },
                _ = listed.closed() => {
                    let closed = crate::operate::closed_by_operator(listed.id());
                    let event = error_event(&listed, closed);
                    return Some((Ok(event), (pump, None)));
                }
            };
            Some((Ok(event), (pump, Some(listed))))
        });
    let stream = futures_util::stream::iter([Ok::<_, Infallible>(first)]).chain(messages);
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(HEARTBEAT).text("heartbeat")))
}

/// What carries a stream's messages, for the delivery counter.
#[derive(Clone, Copy)]
pub(crate) enum Via {
    Stream,
    WebSocket,
}

/// Attaches a stream's consumer (SSE or WebSocket): the delivery pump, and the first thing the
/// client is told.
// Over 70 lines: the checks, the consumer, what the client is told and the pump are made in one
// pass, each from what the step before it made.
pub(crate) fn open_stream(
    state: &AppState,
    path: Path<(String, String)>,
    options: StreamOptions,
    via: Via,
    access: Option<ferrymq_broker::Access>,
) -> ApiResult<(Pump, StreamConsumer)> {
    let (topic, subscription) = path_names(path)?;
    let max_in_flight = options.max_in_flight.unwrap_or(STREAM_IN_FLIGHT_DEFAULT);
    if !(1..=STREAM_IN_FLIGHT_MAX).contains(&max_in_flight) {
        return Err(ApiError::invalid(
            "max_in_flight",
            format!("{max_in_flight} is outside 1..={STREAM_IN_FLIGHT_MAX}"),
        ));
    }
    let name = if subscription == "-" {
        ""
    } else {
        subscription.as_str()
    };
    let request = subscribe_request(
        &topic,
        name,
        options.start.as_deref(),
        options.ack_timeout_ms,
        options.max_attempts,
        options.ordered,
        options.auto_ack,
        options.dead_letter_topic.as_deref(),
        options.partitions.as_deref(),
    )?;
    if state.consumers.is_closing() {
        return Err(BrokerError::ShuttingDown.into());
    }
    crate::cluster::check_serves(state, &topic, &request.partitions)?;
    let consumer = state.broker.subscribe(&request)?;
    let registration = state
        .consumers
        .register_stream(&topic, &subscription, consumer)?;
    let auto_ack = request.auto_ack;
    let token = registration.entry.token.clone();
    let hello = StreamConsumer {
        consumer: crate::cluster::tagged(state.config.cluster.as_ref(), &topic, token),
        subscription: registration
            .entry
            .consumer
            .subscription()
            .name()
            .to_string(),
        auto_ack,
        max_in_flight,
    };
    let delivered = match via {
        Via::Stream => &counters().streamed,
        Via::WebSocket => &counters().websocket,
    };
    let changes = access.as_ref().map(|a| a.auth().watch_changes());
    let leadership = Leadership::of(state, &registration.entry.consumer, &request.partitions);
    let pump = Pump {
        credit: StreamCredit::of(&registration.entry.consumer, max_in_flight, auto_ack),
        leadership,
        access,
        changes,
        delivered,
        consumers: state.consumers.clone(),
        registration,
        queue: VecDeque::new(),
        max_in_flight,
        auto_ack,
        done: false,
    };
    Ok((pump, hello))
}

/// What a stream's pump hands out next.
pub(crate) enum Out {
    Message(DeliveredMessage),
    /// The last thing a stream says: the topic went away, or the server is stopping.
    Error(ApiError),
}

/// A stream's deliveries; dropping it (the client went away) unregisters and drops its consumer.
pub(crate) struct Pump {
    /// The caller's rights, checked before each delivery: a stream whose user lost `consume`
    /// (or was removed, or whose token went) ends with the reason.
    access: Option<ferrymq_broker::Access>,
    /// Wakes the stream when users, grants or tokens change, so that an idle stream ends too.
    changes: Option<tokio::sync::watch::Receiver<u64>>,
    /// The delivery counter of the stream's kind.
    delivered: &'static metrics::Counter,
    consumers: Arc<crate::consumers::Registry>,
    registration: StreamRegistration,
    /// What the connection listing reads as the stream's credit (it holds it weakly).
    credit: Arc<StreamCredit>,
    queue: VecDeque<DeliveredMessage>,
    max_in_flight: u32,
    auto_ack: bool,
    done: bool,
    /// In a cluster, for a replicated topic: the partitions this node delivers to the stream.
    leadership: Option<Leadership>,
}

/// How often a stream in a cluster looks whether its node still leads what it delivers.
const LEADERSHIP_CHECK: Duration = Duration::from_millis(250);

/// The partitions of a replicated topic a stream's node serves (delivers, as their leader), each
/// with the term it serves it in: one it stops serving (its leader died and another node took
/// over, or this node lost an election or its quorum lease) ends the stream with `not_leader`,
/// since another node delivers that partition from then on. Partitions it comes to serve are
/// delivered from then on.
pub(crate) struct Leadership {
    broker: ferrymq_broker::Broker,
    cluster: crate::cluster::ClusterRouter,
    /// The partitions asked for (none: every one).
    asked: Vec<u32>,
    serving: Vec<(u32, u64)>,
}

impl Leadership {
    fn of(state: &AppState, consumer: &Consumer, ranges: &[(u32, u32)]) -> Option<Leadership> {
        let cluster = state.config.cluster.clone()?;
        let topic = consumer.topic();
        cluster.0.partition_leaders(topic.name(), &[])?;
        let asked = match crate::cluster::partition_list(ranges) {
            none if none.is_empty() => (0..consumer.partition_count()).collect(),
            some => some,
        };
        let mut leadership = Leadership {
            broker: state.broker.clone(),
            cluster,
            asked,
            serving: Vec::new(),
        };
        leadership.serving = leadership.serving_now(topic);
        Some(leadership)
    }

    fn serving_now(&self, topic: &ferrymq_broker::Topic) -> Vec<(u32, u64)> {
        self.asked
            .iter()
            .filter_map(|&p| Some((p, self.broker.serving_term(topic, p)?)))
            .collect()
    }

    /// `not_leader` once this node stopped serving a partition it delivered to the stream.
    fn check(&mut self, topic: &ferrymq_broker::Topic) -> Option<ApiError> {
        let now = self.serving_now(topic);
        let lost: Vec<u32> = self
            .serving
            .iter()
            .filter(|served| !now.contains(served))
            .map(|(p, _)| *p)
            .collect();
        if lost.is_empty() {
            self.serving = now;
            return None;
        }
        let leaders = self
            .cluster
            .0
            .partition_leaders(topic.name(), &lost)
            .unwrap_or_default();
        let me = self.cluster.0.node_id();
        let lost: Vec<String> = leaders
            .iter()
            .map(|(p, leader, _)| match leader {
                Some(leader) if *leader != me => {
                    format!("partition {p} (now led by node {leader})")
                }
                Some(_) => {
                    format!("partition {p} (its leadership here lapsed: no quorum, or a new term)")
                }
                None => format!("partition {p} (a leader is being elected)"),
            })
            .collect();
        Some(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::NotLeader.as_str(),
            format!(
                "node {me} no longer serves {} of '{}', and only a partition's leader delivers \
                 it: the stream ends and its unacked messages go back to the subscription; open \
                 it again in a second at the partition's leader (GET /cluster lists them), or \
                 poll through any node",
                lost.join(", "),
                topic.name()
            ),
        ))
    }
}

impl Pump {
    pub(crate) fn entry(&self) -> &Arc<Entry> {
        &self.registration.entry
    }

    /// Lists the stream's consumer on its connection `listed`: its subscription, its credit and
    /// its unacked messages are read from here when connections are listed.
    pub(crate) fn list_on(&self, listed: &ConnectionEntry) {
        listed.add_consumer(
            STREAM_CONSUMER_ID,
            &self.entry().consumer,
            self.credit.clone(),
        );
    }

    /// Why the stream must end before its next delivery: this node stopped serving a partition
    /// it delivered, or the caller lost the right to consume.
    fn refusal(&mut self, consumer: &Consumer) -> Option<ApiError> {
        let leadership = self.leadership.as_mut();
        if let Some(lost) = leadership.and_then(|l| l.check(consumer.topic())) {
            return Some(lost);
        }
        let access = self.access.as_mut()?;
        let checked = access.check(ferrymq_broker::Action::Consume, consumer.topic().name());
        checked.err().map(Into::into)
    }

    /// The next message as soon as there is one and room for it under `max_in_flight`; an error
    /// once, then `None`, when the stream ends. Cancel safe: dropped between its awaits, it has
    /// taken nothing from the subscription that it has not queued.
    pub(crate) async fn next(&mut self) -> Option<Out> {
        if let Some(message) = self.queue.pop_front() {
            return Some(Out::Message(message));
        }
        if self.done {
            return None;
        }
        let entry: Arc<Entry> = self.registration.entry.clone();
        let consumer: &Consumer = &entry.consumer;
        let registry = self.consumers.clone();
        loop {
            if let Some(error) = self.refusal(consumer) {
                self.done = true;
                return Some(Out::Error(error));
            }
            let ready = consumer.ready_notification();
            tokio::pin!(ready);
            ready.as_mut().enable();
            let settled = entry.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            let room = if self.auto_ack {
                STREAM_BATCH
            } else {
                self.max_in_flight
                    .saturating_sub(consumer.in_flight())
                    .min(STREAM_BATCH)
            };
            if room > 0 {
                let mut taken: Vec<Taken> = Vec::new();
                let polled = consumer.poll(room, STREAM_BYTES_MAX, |p, o, ts, attempt, record| {
                    taken.push((p, o, ts, attempt, record.clone()))
                });
                if let Err(error) = polled {
                    self.done = true;
                    return Some(Out::Error(error.into()));
                }
                if !taken.is_empty() {
                    self.delivered.increment(taken.len() as u64);
                    self.queue.extend(taken.into_iter().map(delivered_message));
                    return self.queue.pop_front().map(Out::Message);
                }
            }
            if consumer.is_closed() {
                self.done = true;
                return Some(Out::Error(
                    BrokerError::UnknownTopic(entry.topic.clone()).into(),
                ));
            }
            if self.consumers.is_closing() {
                self.done = true;
                return Some(Out::Error(BrokerError::ShuttingDown.into()));
            }
            // Room also comes back when messages time out (the subscription is woken if they
            // are requeued) or are given up (not woken): look again now and then.
            tokio::select! {
                _ = ready => {}
                _ = settled => {}
                _ = tokio::time::sleep(Duration::from_secs(1)), if room == 0 => {}
                _ = registry.wait_closed() => {}
                _ = async { self.changes.as_mut()?.changed().await.ok() }, if self.changes.is_some() => {}
                _ = tokio::time::sleep(LEADERSHIP_CHECK), if self.leadership.is_some() => {}
            }
        }
    }
}

/// The stream's last event: `error`, with the error JSON. A `not_leader` one carries `retry:
/// 1000`, the reconnection delay an SSE client honours.
fn error_event(listed: &ConnectionEntry, error: ApiError) -> Event {
    let not_leader = error.code == ErrorCode::NotLeader.as_str();
    let body = serde_json::json!({"error": {"code": error.code, "message": error.message}});
    let event = counted_event(listed, "error", None, body.to_string());
    if not_leader {
        let line = format!("retry: {}\n", NOT_LEADER_RETRY.as_millis());
        listed
            .bytes_out
            .fetch_add(line.len() as u64, std::sync::atomic::Ordering::Relaxed);
        return event.retry(NOT_LEADER_RETRY);
    }
    event
}

/// How long a client of a stream ended by `not_leader` waits before opening it again: about an
/// election.
pub(crate) const NOT_LEADER_RETRY: Duration = Duration::from_secs(1);

/// An event of a stream, its bytes counted as the stream's bytes out: `event: <name>`, `id: <id>`
/// and `data: <data>` lines and the blank line that ends it (data holds no line break: it is
/// one line of JSON).
fn counted_event(listed: &ConnectionEntry, name: &str, id: Option<&str>, data: String) -> Event {
    let lines = [
        "event: ".len() + name.len() + 1,
        "data: ".len() + data.len() + 1,
        1,
    ];
    let id_line = id.map_or(0, |id| "id: ".len() + id.len() + 1);
    let bytes = lines.iter().sum::<usize>() + id_line;
    listed
        .bytes_out
        .fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
    let event = Event::default().event(name);
    match id {
        Some(id) => event.id(id),
        None => event,
    }
    .data(data)
}

/// The credit a stream holds, as the broker's connection listing shows it: the room left under
/// its `max_in_flight`; an auto-ack stream takes a batch whenever it can write one.
pub(crate) struct StreamCredit {
    consumer: Weak<Consumer>,
    max_in_flight: u32,
    auto_ack: bool,
}

impl StreamCredit {
    fn of(consumer: &Arc<Consumer>, max_in_flight: u32, auto_ack: bool) -> Arc<StreamCredit> {
        Arc::new(StreamCredit {
            consumer: Arc::downgrade(consumer),
            max_in_flight,
            auto_ack,
        })
    }
}

impl HeldCredit for StreamCredit {
    fn credit(&self) -> u32 {
        if self.auto_ack {
            return STREAM_BATCH;
        }
        self.consumer.upgrade().map_or(0, |consumer| {
            self.max_in_flight.saturating_sub(consumer.in_flight())
        })
    }
}

/// Parses message ids into coalesced ranges.
pub(crate) fn ranges_of(ids: &[String]) -> ApiResult<Vec<OffsetRange>> {
    if ids.is_empty() {
        return Err(ApiError::invalid(
            "ids",
            "empty: name at least one message id",
        ));
    }
    if ids.len() > RANGES_COUNT_MAX as usize {
        return Err(ApiError::invalid(
            "ids",
            format!("{} ids, at most {RANGES_COUNT_MAX} per request", ids.len()),
        ));
    }
    let mut parsed = Vec::with_capacity(ids.len());
    for id in ids {
        let one = id
            .split_once('-')
            .and_then(|(p, o)| Some((p.parse::<u32>().ok()?, o.parse::<u64>().ok()?)));
        match one {
            Some(pair) => parsed.push(pair),
            None => {
                return Err(ApiError::invalid(
                    "ids",
                    format!("'{id}' is not a message id: write <partition>-<offset>, e.g. 0-12"),
                ))
            }
        }
    }
    parsed.sort_unstable();
    parsed.dedup();
    Ok(OffsetRange::coalesce(parsed))
}

/// The ranges of `ids` to settle here: all of them, or (`served_only`) those of the partitions
/// of `topic` this node serves, `None` when that leaves none.
fn ranges_here(
    local: &Local,
    topic: &str,
    ids: &[String],
    served_only: bool,
) -> ApiResult<Option<Vec<OffsetRange>>> {
    if !served_only {
        return ranges_of(ids).map(Some);
    }
    let handle = local.broker.topic(topic)?;
    let served: Vec<String> = ids
        .iter()
        .filter(|id| {
            let partition = id.split_once('-').and_then(|(p, _)| p.parse::<u32>().ok());
            partition.is_some_and(|p| local.broker.serving_term(&handle, p).is_some())
        })
        .cloned()
        .collect();
    if served.is_empty() {
        return Ok(None);
    }
    ranges_of(&served).map(Some)
}

/// The consumer `token` names, which must receive from `topic`/`subscription`.
fn consumer_for(
    local: &Local,
    topic: &str,
    subscription: &str,
    token: &str,
) -> ApiResult<crate::consumers::InUse> {
    let unknown = |message: String| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::UnknownConsumer.as_str(),
            message,
        )
    };
    let held = match local.consumers.get(token) {
        Some(held) if held.entry.serves(topic, subscription) => return Ok(held),
        other => other,
    };
    let t = local.broker.topic(topic)?;
    if subscription != "-" && !t.info().subscriptions.iter().any(|s| s == subscription) {
        return Err(BrokerError::UnknownSubscription {
            topic: topic.to_string(),
            subscription: subscription.to_string(),
        }
        .into());
    }
    match held {
        Some(held) => Err(unknown(format!(
            "consumer '{token}' receives from topic '{}' subscription '{}', not '{topic}' '{subscription}'",
            held.entry.topic, held.entry.subscription
        ))),
        None => Err(unknown(format!(
            "no consumer '{token}': it expired ({} s without requests and nothing in flight; its \
             messages went back to the subscription), its stream closed, or it never existed; \
             poll again for a new one",
            local.consumers.idle_min().as_secs()
        ))),
    }
}

/// Acks what `request` names, delivered to this node's consumer it names; answers once the
/// acks are saved. The broker refuses a result over its limit, naming the field. `served_only`:
/// the ids of partitions this node does not serve are left to the other nodes a token names.
pub(crate) async fn ack_here(
    local: &Local,
    topic: &str,
    subscription: &str,
    request: &AckRequest,
    served_only: bool,
) -> ApiResult<u64> {
    let Some(ranges) = ranges_here(local, topic, &request.ids, served_only)? else {
        return Ok(0);
    };
    let held = consumer_for(local, topic, subscription, &request.consumer)?;
    ack_on(&held.entry, &ranges, request.result.as_deref()).await
}

/// Gives back what `request` names, delivered to this node's consumer it names (`served_only`:
/// as for [`ack_here`]).
pub(crate) fn nack_here(
    local: &Local,
    topic: &str,
    subscription: &str,
    request: &NackRequest,
    served_only: bool,
) -> ApiResult<u64> {
    let Some(ranges) = ranges_here(local, topic, &request.ids, served_only)? else {
        return Ok(0);
    };
    let release = Release::checked(
        request.delay_ms,
        request.dead_letter,
        request.reason.clone(),
    )?;
    let held = consumer_for(local, topic, subscription, &request.consumer)?;
    release.apply(&held.entry, &ranges)
}

/// Acks `ranges` delivered to the consumer of `entry`; answers once the acks are saved.
pub(crate) async fn ack_on(
    entry: &Entry,
    ranges: &[OffsetRange],
    result: Option<&str>,
) -> ApiResult<u64> {
    let consumer = &entry.consumer;
    let acked = consumer.ack_with_result(ranges, result.map(str::as_bytes))?;
    entry.settled.notify_waiters();
    counters().acked.increment(acked);
    consumer.acks_saved().await?;
    Ok(acked)
}

/// How a nack gives messages back, checked.
pub(crate) struct Release {
    delay_ms: u64,
    /// `Some(reason)`: dead-letter them now.
    dead_letter: Option<String>,
    /// A plain nack's reason (empty: none), for the dead letter of a message it gives up.
    reason: String,
}

impl Release {
    pub(crate) fn checked(
        delay_ms: Option<u64>,
        dead_letter: Option<bool>,
        reason: Option<String>,
    ) -> ApiResult<Release> {
        let dead_letter = dead_letter.unwrap_or(false);
        let delay_ms = delay_ms.unwrap_or(0);
        if delay_ms > DELAY_MS_MAX {
            return Err(ApiError::invalid(
                "delay_ms",
                format!("{delay_ms} is above {DELAY_MS_MAX} (30 days)"),
            ));
        }
        if dead_letter && delay_ms > 0 {
            return Err(ApiError::invalid(
                "delay_ms",
                "a dead-lettered message is not delivered again: drop delay_ms or dead_letter",
            ));
        }
        if let Some(reason) = &reason {
            // The binary protocol's limit for a nack's reason.
            if reason.len() > ERROR_MESSAGE_BYTES_MAX {
                return Err(ApiError::invalid(
                    "reason",
                    format!(
                        "{} bytes is above the limit of {ERROR_MESSAGE_BYTES_MAX}",
                        reason.len()
                    ),
                ));
            }
        }
        if !dead_letter {
            return Ok(Release {
                delay_ms,
                dead_letter: None,
                reason: reason.unwrap_or_default(),
            });
        }
        let reason = reason
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "dead-lettered by the consumer (HTTP nack)".to_string());
        Ok(Release {
            delay_ms,
            dead_letter: Some(reason),
            reason: String::new(),
        })
    }

    /// Gives `ranges` delivered to the consumer of `entry` back; returns how many.
    pub(crate) fn apply(&self, entry: &Entry, ranges: &[OffsetRange]) -> ApiResult<u64> {
        let consumer = &entry.consumer;
        let released = match &self.dead_letter {
            Some(reason) => consumer.dead_letter(ranges, reason)?,
            None => consumer.nack_with_reason(
                ranges,
                Duration::from_millis(self.delay_ms),
                &self.reason,
            )?,
        };
        entry.settled.notify_waiters();
        counters().released.increment(released);
        Ok(released)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_become_sorted_coalesced_ranges() {
        let ids: Vec<String> = ["0-3", "0-1", "1-0", "0-2", "0-2", "1-2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let ranges = ranges_of(&ids).unwrap();
        let plain: Vec<(u32, u64, u32)> = ranges
            .iter()
            .map(|r| (r.partition, r.offset, r.count))
            .collect();
        assert_eq!(plain, [(0, 1, 3), (1, 0, 1), (1, 2, 1)]);
        for bad in [
            "",
            "1",
            "a-1",
            "1-",
            "-1",
            "1-2-3",
            "4294967296-0",
            "0-18446744073709551616",
        ] {
            let error = ranges_of(&[bad.to_string()]).unwrap_err();
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{bad}");
            assert!(error.message.contains("ids"), "{bad}");
        }
    }

    #[test]
    fn json_media_types() {
        for yes in [
            "application/json",
            "Application/JSON; charset=utf-8",
            "application/vnd.api+json",
            "application/problem+JSON ; q=1",
        ] {
            assert!(is_json_media_type(yes), "{yes}");
        }
        for no in ["text/plain", "application/jsonl", "json", "", "+json"] {
            assert!(!is_json_media_type(no), "{no}");
        }
    }

    #[test]
    fn start_positions() {
        assert_eq!(parse_start(None).unwrap(), StartPosition::Latest);
        assert_eq!(
            parse_start(Some("earliest")).unwrap(),
            StartPosition::Earliest
        );
        assert_eq!(
            parse_start(Some("offset:7")).unwrap(),
            StartPosition::Offset(7)
        );
        assert_eq!(
            parse_start(Some("time:1700000000000")).unwrap(),
            StartPosition::TimeMs(1_700_000_000_000)
        );
        for bad in ["first", "offset:", "offset:-1", "time:soon", "Latest"] {
            assert!(parse_start(Some(bad)).is_err(), "{bad}");
        }
    }
}
