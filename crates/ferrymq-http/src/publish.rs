//! Publishing: `POST /topics/{topic}/messages`.
//!
//! - `Content-Type: application/json` (or `application/<x>+json`): one message object, a JSON
//!   array of them, or `{"messages": [...]}`; the batch is stored all or nothing.
//! - Any other content type, or none: the raw body is one message, stored as is, with its
//!   content type in header `content-type` (not `application/x-www-form-urlencoded`, `curl -d`'s
//!   default). Key, priority, delay, partition and headers come from
//!   `X-FerryMQ-*` request headers or the query string; a query parameter wins over the request
//!   header of the same meaning.
//!
//! The raw path is the fast one: no JSON, the record is written straight into one buffer that the
//! broker keeps (the body is copied once), and the reply is formatted without serde.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use ferrymq_broker::{PublishReceipt, DEDUP_ID_BYTES_MAX, HEADER_DEDUP_ID};
use ferrymq_protocol::limits::{
    BATCH_COUNT_MAX, DELAY_MS_MAX, HEADERS_COUNT_MAX, HEADER_BYTES_MAX, KEY_BYTES_MAX, PRIORITY_MAX,
};
use ferrymq_protocol::{
    put_record_header, record_header_len, set_record_body_len, Durability, Message, RecordBatch,
    RecordHead,
};
use futures_util::future::Either;
use futures_util::FutureExt as _;
use http_body_util::{BodyExt as _, Full};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use smallvec::{smallvec, SmallVec};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{body_rejection, ErrorBody};
use crate::schema::Name;
use crate::{ApiError, ApiResult, AppState, Connection};

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    // Counted by the handler itself rather than by `service::track`: the hot path skips the
    // middleware and the counter lookup.
    OpenApiRouter::new().routes(routes!(publish))
}

pub(crate) const ROUTE: &str = "/topics/{topic}/messages";

/// Counts a request of this route by its status.
fn count(status: StatusCode) {
    if status == StatusCode::CREATED {
        crate::service::publish_counters().created.add(1);
    } else {
        crate::service::request_counter(&Method::POST, ROUTE, status).increment(1);
    }
}

/// The topic of `/topics/{topic}/messages`, percent-decoded.
fn topic_of(path: &str) -> ApiResult<Cow<'_, str>> {
    let raw = path
        .strip_prefix("/topics/")
        .and_then(|p| p.strip_suffix("/messages"))
        .ok_or_else(|| ApiError::invalid("path", format!("'{path}' is not {ROUTE}")))?;
    if !raw.contains('%') {
        return Ok(raw.into());
    }
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16));
        match (bytes[i], hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
        .map(Cow::Owned)
        .map_err(|_| ApiError::invalid("topic", "not UTF-8 once percent-decoded"))
}

/// `X-FerryMQ-Header-<name>: <value>` becomes message header `<name>` (lowercase).
pub const HEADER_PREFIX: &str = "x-ferrymq-header-";

pub(crate) fn durability_name(durability: Durability) -> &'static str {
    match durability {
        Durability::Memory => "memory",
        Durability::Written => "written",
        Durability::SyncedInterval => "synced_interval",
        Durability::Synced => "synced",
    }
}

/// One message of a JSON publish. Exactly one of `body` and `body_base64`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonMessage {
    /// Any JSON value: a string is stored as its UTF-8 text; any other value as its JSON text,
    /// exactly as sent (key order and spacing kept), with header `content-type:
    /// application/json`.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Value)]
    pub body: Option<Box<RawValue>>,
    /// The body as standard base64 (with padding), for binary bodies.
    pub body_base64: Option<String>,
    /// Picks the partition: a decimal number modulo the partition count, anything else by hash.
    pub key: Option<String>,
    /// This partition, instead of the key's (every message of a batch that names one must name
    /// the same).
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    pub partition: Option<u32>,
    /// 0 (default) to 9; higher is delivered first among ready messages.
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    #[schema(maximum = 9)]
    pub priority: Option<u8>,
    /// Not delivered before this many milliseconds from now, at most 30 days.
    #[serde(default, deserialize_with = "crate::schema::whole::option")]
    #[schema(maximum = 2_592_000_000_u64)]
    pub delay_ms: Option<u64>,
    /// Message headers, name to value.
    pub headers: Option<BTreeMap<String, String>>,
    /// A deduplication id, 1 to 256 bytes: within the topic's window (2 minutes by default) a
    /// message with an id the topic already stored is not stored again, and its id in the reply
    /// is the first one's (it is listed in `duplicates`). Stored as header `x-ferrymq-dedup-id`.
    #[schema(min_length = 1, max_length = 64)]
    pub dedup_id: Option<String>,
}

/// A JSON value that is present, `null` included (`Some("null")`).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(d).map(Some)
}

/// A batch: `{"messages": [...]}`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonBatch {
    #[schema(min_items = 1, max_items = 65536)]
    pub messages: Vec<JsonMessage>,
}

/// A JSON publish: one message, `{"messages": [...]}`, or an array of messages.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum PublishBody {
    One(JsonMessage),
    Batch(JsonBatch),
    Array(#[schema(inline)] crate::schema::MessageArray),
}

/// What a publish got.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PublishReply {
    /// The id of each message, `<partition>-<offset>`, in the order sent.
    #[schema(example = json!(["0-41"]))]
    pub ids: Vec<String>,
    /// `memory`, `written`, `synced_interval` or `synced`: what the broker promises about them.
    pub durability: String,
    /// The ids of the messages not stored because their deduplication id was seen within the
    /// topic's window: each is the id of the message stored first. Absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(example = json!(["0-41"]))]
    pub duplicates: Vec<String>,
}

/// Publishes messages. A JSON body (`Content-Type: application/json`) holds one message object,
/// `{"messages": [...]}`, or an array of message objects. Any other body is one message,
/// published as is (its content type kept as header `content-type`), with key, priority, delay,
/// partition and headers from the `X-FerryMQ-Key`, `X-FerryMQ-Priority`, `X-FerryMQ-Delay-Ms`,
/// `X-FerryMQ-Partition` and `X-FerryMQ-Header-<name>` request headers, or from the query string
/// (`key`, `priority`, `delay_ms`, `partition`), which wins over a request header. The topic is
/// created on first use when the broker auto-creates topics.
#[utoipa::path(post, path = "/topics/{topic}/messages", tag = "publish",
    params(
        ("topic" = Name, Path, description = "Topic name"),
        ("key" = Option<String>, Query, description = "Raw body: the message key (wins over X-FerryMQ-Key)"),
        ("priority" = Option<u8>, Query, description = "Raw body: priority 0-9 (wins over X-FerryMQ-Priority)"),
        ("delay_ms" = Option<u64>, Query, description = "Raw body: delay in ms (wins over X-FerryMQ-Delay-Ms)"),
        ("partition" = Option<u32>, Query, description = "Raw body: partition (wins over X-FerryMQ-Partition)"),
    ),
    request_body(
        content(
            (PublishBody = "application/json"),
            (Vec<u8> = "application/octet-stream"),
        ),
        description = "JSON messages, or one raw message of any other content type",
    ),
    responses(
        (status = 201, description = "Stored", body = PublishReply),
        (status = 400, description = "A field, header or query parameter is invalid (the message names it)", body = ErrorBody),
        (status = 404, description = "`unknown_topic`: auto-create is off, or the topic was deleted during the publish", body = ErrorBody),
        (status = 413, description = "`message_too_large` or `payload_too_large`", body = ErrorBody),
        (status = 429, description = "`topic_full` (reject policy)", body = ErrorBody),
        (status = 503, description = "`storage_unavailable`: the disk refused the write; nothing was stored", body = ErrorBody),
    ))]
async fn publish(State(state): State<AppState>, request: Request) -> Response {
    serve(Arc::new(Connection::new(state)), request)
        .await
        .map(axum::body::Body::new)
}

/// The body of a publish's response: the reply, unboxed, or an error's.
pub(crate) type ReplyBody = http_body_util::Either<Full<Bytes>, axum::body::Body>;

/// What the publish handler reads a request body as: hyper's own (the server's direct path) or
/// axum's (through the router).
pub(crate) trait RequestBody:
    hyper::body::Body<Data = Bytes, Error: std::error::Error + Send + Sync + 'static>
    + Send
    + Unpin
    + 'static
{
}

impl<B> RequestBody for B where
    B: hyper::body::Body<Data = Bytes, Error: std::error::Error + Send + Sync + 'static>
        + Send
        + Unpin
        + 'static
{
}

/// True for the requests [`publish`] serves: `POST /topics/{topic}/messages`, the topic one path
/// segment (an empty one too, which the handler refuses), exactly as the router matches it.
pub(crate) fn is_route(method: &Method, path: &str) -> bool {
    method == Method::POST
        && path
            .strip_prefix("/topics/")
            .and_then(|p| p.strip_suffix("/messages"))
            .is_some_and(|topic| !topic.contains('/'))
}

/// Serves a publish request. The server calls this straight for the requests of [`is_route`],
/// the hot path of the HTTP API, without the router's matching and path parameters.
///
/// The request's head is read before the returned future exists, and that future keeps only what
/// the publish needs across its waits: the URI, the body, a raw publish's record. So it is small,
/// and the connection, which moves it into its slot for every request, copies little. (An
/// `async fn` holds its arguments apart from the futures it awaits, so nested ones each taking
/// the request would hold a copy of it per level.)
pub(crate) fn serve<B: RequestBody>(
    connection: Arc<Connection>,
    request: http::Request<B>,
) -> impl Future<Output = http::Response<ReplyBody>> + Send {
    let result = match prepare(&connection.state, request) {
        Ok(Prepared {
            uri,
            body,
            raw,
            dedup_id,
        }) => Either::Left(publish_prepared(connection, uri, body, raw, dedup_id)),
        Err(error) => Either::Right(std::future::ready(Err(error))),
    };
    result.map(|result| {
        let response = match result {
            Ok(response) => response,
            Err(error) => error.into_response().map(http_body_util::Either::Right),
        };
        count(response.status());
        response
    })
}

/// A publish request whose head has been read.
struct Prepared<B> {
    /// The topic is a slice of its path.
    uri: Uri,
    body: B,
    /// A raw publish's record, written up to its body; `None` for a JSON publish.
    raw: Option<RawRecord>,
    /// A JSON publish's `Idempotency-Key` (or `X-FerryMQ-Dedup-Id`), for its one message.
    dedup_id: Option<String>,
}

/// Reads a publish request's head: the topic, the content type, and a JSON publish's (empty)
/// query, or a raw publish's options, written into its record.
fn prepare<B: RequestBody>(state: &AppState, request: http::Request<B>) -> ApiResult<Prepared<B>> {
    let (parts, body) = request.into_parts();
    topic_of(parts.uri.path())?;
    let limit = state.config.body_bytes_max;
    let mut dedup_id = None;
    let raw = if is_json(parts.headers.get(header::CONTENT_TYPE)) {
        // Checked now, so that a bad parameter is refused before the body is read.
        if let Some(query) = parts.uri.query() {
            RawOptions::default().apply_query(query)?;
        }
        dedup_id = dedup_header(&parts.headers)?.map(str::to_owned);
        if declared_length(&body).is_some_and(|n| n > limit) {
            return Err(too_large(limit));
        }
        None
    } else {
        Some(raw_record(raw_limit(state), &parts, &body)?)
    };
    Ok(Prepared {
        uri: parts.uri,
        body,
        raw,
        dedup_id,
    })
}

/// The rest of a publish once its head is read: the body, the broker, the reply. The arguments
/// are the future's own fields, each held once.
async fn publish_prepared<B: RequestBody>(
    connection: Arc<Connection>,
    uri: Uri,
    mut body: B,
    raw: Option<RawRecord>,
    dedup_id: Option<String>,
) -> ApiResult<http::Response<ReplyBody>> {
    let outgoing = match raw {
        None => {
            let limit = connection.state.config.body_bytes_max;
            let defaults = match uri.query() {
                Some(query) => {
                    let mut defaults = RawOptions::default();
                    defaults.apply_query(query)?;
                    defaults
                }
                None => RawOptions::default(),
            };
            json_batch(&read_body(limit, &mut body).await?, defaults, dedup_id)?
        }
        Some(RawRecord {
            mut record,
            partition,
        }) => {
            let limit = raw_limit(&connection.state);
            let body_len = read_body_into(limit, &mut body, &mut record).await?;
            raw_batch(record, partition, body_len)?
        }
    };
    drop(body);
    let (count, bytes_in) = (outgoing.count, outgoing.bytes_in);
    let pending = start(&connection, &topic_of(uri.path())?, outgoing)?;
    // The URI is a slice of the connection's read buffer, as were the headers and the body, gone
    // by now. While the publish waits for its fsync, the connection reads on to notice a client
    // that goes away, and that read would allocate a new buffer (8 KiB) if this one were still
    // shared.
    drop(uri);
    let receipt = pending
        .durable()
        .await
        .map_err(|error| unless_deleted(&connection, error))?;
    let counters = crate::service::publish_counters();
    counters.messages.add(count as u64);
    counters.bytes.add(bytes_in);
    Ok(reply(&connection, &receipt, count))
}

/// A request's messages, encoded for the broker.
pub(crate) struct Outgoing {
    pub(crate) batch: RecordBatch,
    partition: Option<u32>,
    count: usize,
    /// Body bytes, for the `bytes_in` counter.
    bytes_in: u64,
}

/// `application/json`, or `application/<anything>+json`, parameters allowed.
fn is_json(content_type: Option<&HeaderValue>) -> bool {
    let Some(value) = content_type else {
        return false;
    };
    if value.as_bytes() == b"application/json" {
        return true;
    }
    let Ok(value) = value.to_str() else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let Some(subtype) = essence
        .get(..12)
        .filter(|t| t.eq_ignore_ascii_case("application/"))
        .map(|_| &essence[12..])
    else {
        return false;
    };
    subtype.eq_ignore_ascii_case("json")
        || (subtype.len() > 5 && subtype[subtype.len() - 5..].eq_ignore_ascii_case("+json"))
}

/// A raw publish's limit: its body is one message.
#[derive(Clone, Copy)]
struct RawLimit(usize);

fn raw_limit(state: &AppState) -> RawLimit {
    RawLimit(state.broker.config().message_body_bytes_max as usize)
}

/// The whole request body, up to `limit` bytes. A body that arrives as one chunk (a small
/// request, the common case) is returned as that chunk, without a copy.
async fn read_body<B: RequestBody>(limit: usize, chunks: &mut B) -> ApiResult<Bytes> {
    let declared = declared_length(chunks);
    let Some(first) = next_chunk(chunks).await? else {
        return Ok(Bytes::new());
    };
    if first.len() > limit {
        return Err(too_large(limit));
    }
    // A body of declared length that came whole needs no second look for its end.
    if chunks.is_end_stream() {
        return Ok(first);
    }
    let Some(second) = next_chunk(chunks).await? else {
        return Ok(first);
    };
    if first.len() + second.len() > limit {
        return Err(too_large(limit));
    }
    // Sized once from the declared length, so that a large body is not copied over and over as
    // the buffer grows, and holds no more than the bytes the body budget counted.
    let mut out = BytesMut::with_capacity(declared.unwrap_or(first.len() + second.len()));
    out.put_slice(&first);
    out.put_slice(&second);
    append_chunks(chunks, &mut out, 0, limit).await?;
    Ok(out.freeze())
}

/// Appends the rest of a body to `out` as it arrives, refusing it once what was appended since
/// `start` would pass `limit`.
async fn append_chunks<B: RequestBody>(
    chunks: &mut B,
    out: &mut BytesMut,
    start: usize,
    limit: usize,
) -> ApiResult<()> {
    // Until the body says it ended (all of a declared length came) or its stream does.
    while !chunks.is_end_stream() {
        let Some(chunk) = next_chunk(chunks).await? else {
            break;
        };
        if out.len() - start + chunk.len() > limit {
            return Err(too_large(limit));
        }
        out.put_slice(&chunk);
    }
    Ok(())
}

/// The body's length as the request declares it (`Content-Length`), known to hyper, which
/// parsed and checked it with the head.
fn declared_length<B: RequestBody>(body: &B) -> Option<usize> {
    body.size_hint()
        .exact()
        .and_then(|n| usize::try_from(n).ok())
}

fn too_large(limit: usize) -> ApiError {
    body_rejection(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the limit is {limit} bytes"),
    )
}

/// A raw body above the broker's message limit: it could never be stored, so it is refused
/// before it is read, from its declared length, or as soon as a chunked one passes the limit.
fn message_too_large(limit: RawLimit) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        ferrymq_protocol::ErrorCode::MessageTooLarge.as_str(),
        format!(
            "the message body is larger than the broker's limit of {} bytes (--message-max-bytes)",
            limit.0
        ),
    )
}

/// The body's next chunk of data (trailers, which a publish has no use for, are skipped).
async fn next_chunk<B: RequestBody>(body: &mut B) -> ApiResult<Option<Bytes>> {
    while let Some(frame) = body.frame().await {
        match frame.map_err(unreadable)?.into_data() {
            Ok(data) => return Ok(Some(data)),
            Err(_trailers) => continue,
        }
    }
    Ok(None)
}

fn unreadable(error: impl std::error::Error + 'static) -> ApiError {
    ApiError::from_body_error(&error)
}

/// Appends the request body to `out` as it arrives (no intermediate buffer), up to the message
/// limit; returns its length.
async fn read_body_into<B: RequestBody>(
    limit: RawLimit,
    body: &mut B,
    out: &mut BytesMut,
) -> ApiResult<usize> {
    let start = out.len();
    append_chunks(body, out, start, limit.0)
        .await
        .map_err(|error| {
            if error.status == StatusCode::PAYLOAD_TOO_LARGE {
                message_too_large(limit)
            } else {
                error
            }
        })?;
    Ok(out.len() - start)
}

/// Replies bytes per message id at most: `"<partition>-<offset>",` with a u32 and a u64.
const REPLY_ID_BYTES_MAX: usize = 34;

/// The reply to a publish, `{"ids":[...],"durability":"..."}`, written into the connection's
/// reply buffer: a keep-alive connection has sent its previous reply by the time it takes the
/// next request, so the buffer's space is reused and a reply allocates nothing.
fn reply(
    connection: &Connection,
    receipt: &PublishReceipt,
    count: usize,
) -> http::Response<ReplyBody> {
    let durability = durability_name(receipt.durability);
    let body = {
        let mut out = connection.replies.lock();
        out.reserve(40 + count * REPLY_ID_BYTES_MAX);
        out.put_slice(b"{\"ids\":[");
        for (i, (partition, offset)) in receipt.ids().enumerate() {
            if i > 0 {
                out.put_u8(b',');
            }
            out.put_u8(b'"');
            out.put_slice(itoa::Buffer::new().format(partition).as_bytes());
            out.put_u8(b'-');
            out.put_slice(itoa::Buffer::new().format(offset).as_bytes());
            out.put_u8(b'"');
        }
        out.put_slice(b"],\"durability\":\"");
        out.put_slice(durability.as_bytes());
        out.put_u8(b'"');
        if !receipt.duplicates.is_empty() {
            let ids: Vec<(u32, u64)> = receipt.ids().collect();
            out.put_slice(b",\"duplicates\":[");
            for (i, &index) in receipt.duplicates.iter().enumerate() {
                if i > 0 {
                    out.put_u8(b',');
                }
                let (partition, offset) = ids[index];
                out.put_u8(b'"');
                out.put_slice(itoa::Buffer::new().format(partition).as_bytes());
                out.put_u8(b'-');
                out.put_slice(itoa::Buffer::new().format(offset).as_bytes());
                out.put_u8(b'"');
            }
            out.put_u8(b']');
        }
        out.put_u8(b'}');
        out.split().freeze()
    };
    let mut response = http::Response::new(http_body_util::Either::Left(Full::new(body)));
    *response.status_mut() = StatusCode::CREATED;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Options of a raw publish, from request headers then the query string.
#[derive(Default)]
pub(crate) struct RawOptions<'a> {
    key: Option<Cow<'a, str>>,
    priority: u8,
    delay_ms: Option<u64>,
    partition: Option<u32>,
    /// Message headers: `X-FerryMQ-Header-*` request headers, plus `content-type`.
    header_count: usize,
    header_bytes: usize,
    /// `Idempotency-Key` or `X-FerryMQ-Dedup-Id`, written as header `x-ferrymq-dedup-id`.
    dedup_id: Option<&'a str>,
}

fn header_text<'a>(value: &'a HeaderValue, name: &str) -> ApiResult<&'a str> {
    value
        .to_str()
        .map_err(|_| ApiError::invalid(name, "must be visible ASCII text"))
}

fn parse_num<T: std::str::FromStr>(text: &str, field: &str) -> ApiResult<T>
where
    T::Err: std::fmt::Display,
{
    text.parse::<T>()
        .map_err(|e| ApiError::invalid(field, format!("'{text}': {e}")))
}

/// A check's failure named with its field, the name built only then (for a batch's message it
/// is formatted: `messages[3].priority`).
fn named<T, N: AsRef<str>>(checked: Result<T, String>, field: impl FnOnce() -> N) -> ApiResult<T> {
    checked.map_err(|reason| ApiError::invalid(field().as_ref(), reason))
}

fn check_priority(priority: u8) -> Result<u8, String> {
    if priority > PRIORITY_MAX {
        return Err(format!("{priority} is above {PRIORITY_MAX}"));
    }
    Ok(priority)
}

fn check_delay(delay: u64) -> Result<u64, String> {
    if delay > DELAY_MS_MAX {
        return Err(format!("{delay} is above {DELAY_MS_MAX} (30 days)"));
    }
    Ok(delay)
}

fn check_key(key: &str) -> Result<(), String> {
    if key.len() > KEY_BYTES_MAX {
        return Err(format!(
            "{} bytes, above the limit of {KEY_BYTES_MAX}",
            key.len()
        ));
    }
    Ok(())
}

fn check_header(name: &str, value: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > HEADER_BYTES_MAX {
        return Err(format!(
            "header name must be 1 to {HEADER_BYTES_MAX} bytes long"
        ));
    }
    if value.len() > HEADER_BYTES_MAX {
        return Err(format!(
            "header '{name}' has a {}-byte value, above the limit of {HEADER_BYTES_MAX}",
            value.len()
        ));
    }
    Ok(())
}

/// Whether a raw publish's `Content-Type` is kept as its message header `content-type`: not
/// `application/x-www-form-urlencoded`, which `curl -d` and HTML forms send when told nothing
/// and which a message body almost never is (`X-FerryMQ-Header-Content-Type` keeps it when it
/// is).
fn kept_content_type(value: &HeaderValue) -> bool {
    const FORM: &[u8] = b"application/x-www-form-urlencoded";
    let bytes = value.as_bytes();
    !(bytes.len() >= FORM.len()
        && bytes[..FORM.len()].eq_ignore_ascii_case(FORM)
        && matches!(bytes.get(FORM.len()), None | Some(b';' | b' ')))
}

/// A publish's deduplication id: `Idempotency-Key` (the IETF draft's name), or
/// `X-FerryMQ-Dedup-Id`; both may be given when they agree.
fn dedup_header(headers: &HeaderMap) -> ApiResult<Option<&str>> {
    let mut found: Option<(&str, &str)> = None;
    for name in ["idempotency-key", "x-ferrymq-dedup-id"] {
        let shown = if name == "idempotency-key" {
            "Idempotency-Key"
        } else {
            "X-FerryMQ-Dedup-Id"
        };
        let mut values = headers.get_all(name).iter();
        let Some(value) = values.next() else {
            continue;
        };
        if values.next().is_some() {
            return Err(ApiError::invalid(shown, "given twice: give one id"));
        }
        let id = header_text(value, shown)?;
        named(check_dedup_id(id), || shown)?;
        match found {
            Some((other, first)) if first != id => {
                return Err(ApiError::invalid(
                    shown,
                    format!("differs from {other}: give one of them, or the same id"),
                ))
            }
            Some(_) => {}
            None => found = Some((shown, id)),
        }
    }
    Ok(found.map(|(_, id)| id))
}

fn check_dedup_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > DEDUP_ID_BYTES_MAX {
        return Err(format!(
            "a deduplication id is 1 to {DEDUP_ID_BYTES_MAX} bytes, not {}",
            id.len()
        ));
    }
    Ok(())
}

/// The request headers that become message headers, with their message header names:
/// `content-type` (see [`kept_content_type`]), and `x-ferrymq-header-<name>` as `<name>`.
fn message_headers(headers: &HeaderMap) -> impl Iterator<Item = (&str, &HeaderValue)> {
    headers.iter().filter_map(|(name, value)| {
        let name = name.as_str();
        if name == "content-type" {
            kept_content_type(value).then_some((name, value))
        } else {
            name.strip_prefix(HEADER_PREFIX).map(|n| (n, value))
        }
    })
}

impl<'a> RawOptions<'a> {
    /// One pass over the request headers: the `X-FerryMQ-*` options, and the size of the
    /// message headers (checked here, written later).
    fn from_headers(headers: &'a HeaderMap) -> ApiResult<Self> {
        let mut options = RawOptions {
            dedup_id: dedup_header(headers)?,
            ..RawOptions::default()
        };
        if let Some(id) = options.dedup_id {
            options.header_count += 1;
            options.header_bytes += record_header_len(HEADER_DEDUP_ID.as_bytes(), id.as_bytes());
        }
        for (name, value) in headers {
            let name = name.as_str();
            if name == "content-type" {
                if kept_content_type(value) {
                    let value = header_text(value, "Content-Type")?;
                    options.header_count += 1;
                    options.header_bytes += record_header_len(name.as_bytes(), value.as_bytes());
                }
                continue;
            }
            let Some(option) = name.strip_prefix("x-ferrymq-") else {
                continue;
            };
            match option {
                "key" => options.key = Some(header_text(value, "X-FerryMQ-Key")?.into()),
                "priority" => {
                    let field = "X-FerryMQ-Priority";
                    let priority = parse_num(header_text(value, field)?, field)?;
                    options.priority = named(check_priority(priority), || field)?;
                }
                "delay-ms" => {
                    let field = "X-FerryMQ-Delay-Ms";
                    let delay = parse_num(header_text(value, field)?, field)?;
                    options.delay_ms = Some(named(check_delay(delay), || field)?);
                }
                "partition" => {
                    let field = "X-FerryMQ-Partition";
                    options.partition = Some(parse_num(header_text(value, field)?, field)?);
                }
                // Read by `dedup_header`.
                "dedup-id" => {}
                _ => match option.strip_prefix("header-") {
                    Some(header_name) => {
                        let value = header_text(value, name)?;
                        named(check_header(header_name, value), || name)?;
                        options.header_count += 1;
                        options.header_bytes +=
                            record_header_len(header_name.as_bytes(), value.as_bytes());
                    }
                    None => {
                        return Err(ApiError::invalid(
                            name,
                            "unknown X-FerryMQ header: use X-FerryMQ-Key, -Priority, -Delay-Ms, -Partition, -Dedup-Id or -Header-<name>",
                        ))
                    }
                },
            }
        }
        if options.header_count > HEADERS_COUNT_MAX {
            return Err(ApiError::invalid(
                "headers",
                format!(
                    "{} message headers, limit {HEADERS_COUNT_MAX}",
                    options.header_count
                ),
            ));
        }
        Ok(options)
    }

    /// Applies `key=`, `priority=`, `delay_ms=`, `partition=` from the query string.
    fn apply_query(&mut self, query: &'a str) -> ApiResult<()> {
        for (name, value) in form_pairs(query) {
            match &*name {
                "key" => self.key = Some(value),
                "priority" => {
                    let field = "query priority";
                    self.priority = named(check_priority(parse_num(&value, field)?), || field)?
                }
                "delay_ms" => {
                    let field = "query delay_ms";
                    self.delay_ms = Some(named(check_delay(parse_num(&value, field)?), || field)?)
                }
                "partition" => self.partition = Some(parse_num(&value, "query partition")?),
                other => {
                    return Err(ApiError::invalid(
                        "query",
                        format!(
                            "unknown parameter '{other}': use key, priority, delay_ms or partition"
                        ),
                    ))
                }
            }
        }
        Ok(())
    }
}

/// `application/x-www-form-urlencoded` pairs: `+` is a space, `%XX` a byte (invalid UTF-8 is
/// replaced).
fn form_pairs(query: &str) -> impl Iterator<Item = (Cow<'_, str>, Cow<'_, str>)> {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        (url_decode(name), url_decode(value))
    })
}

fn url_decode(text: &str) -> Cow<'_, str> {
    if !text.contains(['%', '+']) {
        return text.into();
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16));
                match (hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned().into()
}

/// A raw publish's record before its body, and its one option that is not in the record.
struct RawRecord {
    record: BytesMut,
    partition: Option<u32>,
}

/// A raw publish's record, written up to its body, from the request's head: the record is
/// written straight into the buffer the broker keeps, sized from `Content-Length` so that the
/// body is copied once and nothing is reallocated.
fn raw_record<B: RequestBody>(
    limit: RawLimit,
    parts: &http::request::Parts,
    body: &B,
) -> ApiResult<RawRecord> {
    let headers = &parts.headers;
    let mut options = RawOptions::from_headers(headers)?;
    if let Some(query) = parts.uri.query() {
        options.apply_query(query)?;
    }
    let key = options.key.as_deref().map(str::as_bytes);
    if let Some(key) = &options.key {
        named(check_key(key), || "key")?;
    }
    let body_len = declared_length(body).unwrap_or(0);
    if body_len > limit.0 {
        return Err(message_too_large(limit));
    }
    let head = RecordHead {
        priority: options.priority,
        key,
        deliver_after_ms: options.delay_ms,
        header_count: options.header_count as u16,
        body_len: 0,
    };
    // Exactly the record's size, so that the broker can keep this buffer as it is.
    let mut record = BytesMut::with_capacity(head.encoded_len() + options.header_bytes + body_len);
    head.encode(&mut record);
    for (name, value) in message_headers(headers) {
        put_record_header(&mut record, name.as_bytes(), value.as_bytes());
    }
    if let Some(id) = options.dedup_id {
        put_record_header(&mut record, HEADER_DEDUP_ID.as_bytes(), id.as_bytes());
    }
    Ok(RawRecord {
        record,
        partition: options.partition,
    })
}

/// A raw publish's message, once its record holds the body (`body_len` bytes).
fn raw_batch(mut record: BytesMut, partition: Option<u32>, body_len: usize) -> ApiResult<Outgoing> {
    set_record_body_len(&mut record, body_len as u32);
    // Sized exactly when the body's length was declared: the broker then keeps this buffer.
    let batch = RecordBatch::decode_encoded(1, record)
        .map_err(|e| ApiError::invalid("message", e.to_string()))?;
    Ok(Outgoing {
        batch,
        partition,
        count: 1,
        bytes_in: body_len as u64,
    })
}

/// Starts publishing `outgoing` to `topic` through the connection's handle of it (looked up
/// again when the connection names another topic, or when the topic was deleted since).
fn start(
    connection: &Connection,
    topic: &str,
    outgoing: Outgoing,
) -> ApiResult<ferrymq_broker::PublishPending> {
    let broker = &connection.state.broker;
    let mut cached = connection.publishing.lock();
    if cached
        .as_ref()
        .is_some_and(|t| t.name() != topic || t.is_deleted())
    {
        *cached = None;
    }
    let handle = match &mut *cached {
        Some(handle) => handle,
        slot @ None => slot.insert(broker.topic_or_create(topic)?),
    };
    broker
        .publish_start(handle, outgoing.partition, outgoing.batch)
        .map_err(|error| {
            drop(cached);
            unless_deleted(connection, error)
        })
}

/// A publish's failure as the client should read it: if the topic was deleted during the
/// publish, the messages went with it, which is the topic's state (404), not a storage fault to
/// retry against (the 503 the closed log reports).
fn unless_deleted(connection: &Connection, error: ferrymq_broker::BrokerError) -> ApiError {
    let deleted = connection
        .publishing
        .lock()
        .as_ref()
        .filter(|topic| topic.is_deleted())
        .map(|topic| topic.name().to_string());
    match deleted {
        Some(name) => ApiError::new(
            StatusCode::NOT_FOUND,
            ferrymq_protocol::ErrorCode::UnknownTopic.as_str(),
            format!("topic '{name}' was deleted during the publish; nothing of it is kept"),
        ),
        None => ApiError::from(error),
    }
}

/// Parses with serde_json directly; on failure, again through axum's extractor, whose errors
/// name the path of the field at fault (`messages[2].priority: ...`).
fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> ApiResult<T> {
    match serde_json::from_slice(body) {
        Ok(value) => Ok(value),
        Err(_) => match axum::Json::<T>::from_bytes(body) {
            Ok(axum::Json(value)) => Ok(value),
            Err(rejection) => Err(rejection.into()),
        },
    }
}

/// A JSON publish's messages: one (the common case) is kept inline, as is its conversion.
type JsonMessages = SmallVec<[JsonMessage; 1]>;

/// A JSON publish's messages, from its whole body.
/// `defaults`: the query's options, for the messages that do not set their own.
pub(crate) fn json_batch(
    body: &[u8],
    defaults: RawOptions<'_>,
    dedup_id: Option<String>,
) -> ApiResult<Outgoing> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace()).copied();
    let (messages, prefix): (JsonMessages, &str) =
        match first {
            Some(b'[') => (SmallVec::from_vec(parse(body)?), ""),
            Some(b'{') if looks_like_batch(body) => (
                SmallVec::from_vec(parse::<JsonBatch>(body)?.messages),
                "messages",
            ),
            Some(b'{') => (smallvec![parse::<JsonMessage>(body)?], ""),
            _ => return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "malformed_json",
                "expected a message object, {\"messages\": [...]}, or an array of message objects",
            )),
        };
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "the batch is empty"));
    }
    if messages.len() > BATCH_COUNT_MAX as usize {
        return Err(ApiError::invalid(
            "messages",
            format!("{} messages, limit {BATCH_COUNT_MAX}", messages.len()),
        ));
    }
    let single = messages.len() == 1 && prefix.is_empty() && first == Some(b'{');
    if dedup_id.is_some() && messages.len() > 1 {
        return Err(ApiError::invalid(
            "Idempotency-Key",
            "names one message: give each message of a batch its own dedup_id",
        ));
    }
    // The name of a message's field in an error.
    let field = |i: usize, name: &'static str| -> Cow<'static, str> {
        match (single, prefix) {
            (true, _) => Cow::Borrowed(name),
            (false, "") => format!("[{i}].{name}").into(),
            (false, p) => format!("{p}[{i}].{name}").into(),
        }
    };
    let mut partition: Option<Option<u32>> = None;
    let mut converted: SmallVec<[Message; 1]> = SmallVec::with_capacity(messages.len());
    let mut bytes_in = 0u64;
    for (i, m) in messages.into_iter().enumerate() {
        let (body, json_body) = match (m.body, m.body_base64) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid(
                    &field(i, "body"),
                    "give body or body_base64, not both",
                ))
            }
            (None, None) => {
                return Err(ApiError::invalid(
                    &field(i, "body"),
                    "missing: give body (any JSON value) or body_base64",
                ))
            }
            (Some(raw), None) if raw.get().starts_with('"') => {
                let text: String = serde_json::from_str(raw.get())
                    .map_err(|e| ApiError::invalid(&field(i, "body"), e))?;
                (Bytes::from(text), false)
            }
            (Some(raw), None) => (Bytes::from(String::from(Box::<str>::from(raw))), true),
            (None, Some(encoded)) => (
                Bytes::from(
                    base64::engine::general_purpose::STANDARD
                        .decode(encoded.as_bytes())
                        .map_err(|e| ApiError::invalid(&field(i, "body_base64"), e))?,
                ),
                false,
            ),
        };
        let priority = named(
            check_priority(m.priority.unwrap_or(defaults.priority)),
            || field(i, "priority"),
        )?;
        let delay = m
            .delay_ms
            .map(|d| named(check_delay(d), || field(i, "delay_ms")))
            .transpose()?
            .or(defaults.delay_ms);
        if let Some(key) = &m.key {
            named(check_key(key), || field(i, "key"))?;
        }
        let key = m
            .key
            .or_else(|| defaults.key.as_deref().map(str::to_string));
        let m_partition = m.partition.or(defaults.partition);
        match partition {
            None => partition = Some(m_partition),
            Some(p) if p == m_partition => {}
            Some(_) => {
                return Err(ApiError::invalid(
                    &field(i, "partition"),
                    "every message of a batch must name the same partition, or none",
                ))
            }
        }
        let mut headers: Vec<(String, String)> = Vec::new();
        if json_body {
            headers.push(("content-type".into(), "application/json".into()));
        }
        for (name, value) in m.headers.unwrap_or_default() {
            named(check_header(&name, &value), || field(i, "headers"))?;
            if json_body && name.eq_ignore_ascii_case("content-type") {
                headers.retain(|(n, _)| n != "content-type");
            }
            headers.push((name, value));
        }
        let id = match (m.dedup_id, &dedup_id) {
            (Some(own), Some(header)) if own != *header => {
                return Err(ApiError::invalid(
                    &field(i, "dedup_id"),
                    "differs from the Idempotency-Key header: give one of them",
                ))
            }
            (Some(own), _) => Some(own),
            (None, header) => header.clone(),
        };
        if let Some(id) = id {
            named(check_dedup_id(&id), || field(i, "dedup_id"))?;
            headers.retain(|(n, _)| n != HEADER_DEDUP_ID);
            headers.push((HEADER_DEDUP_ID.to_owned(), id));
        }
        if headers.len() > HEADERS_COUNT_MAX {
            return Err(ApiError::invalid(
                &field(i, "headers"),
                format!("{} headers, limit {HEADERS_COUNT_MAX}", headers.len()),
            ));
        }
        bytes_in += body.len() as u64;
        converted.push(Message {
            key: key.map(Bytes::from),
            headers,
            priority,
            deliver_after_ms: delay,
            body,
        });
    }
    let batch = RecordBatch::from_messages(&converted)
        .map_err(|e| ApiError::invalid("message", e.to_string()))?;
    Ok(Outgoing {
        batch,
        partition: partition.flatten(),
        count: converted.len(),
        bytes_in,
    })
}

/// A top-level object whose first key is `messages` is a batch (a message object has no such
/// field, so anything else is parsed as one message and its errors name its fields).
fn looks_like_batch(body: &[u8]) -> bool {
    let mut rest = body
        .iter()
        .skip_while(|b| b.is_ascii_whitespace())
        .skip(1)
        .skip_while(|b| b.is_ascii_whitespace());
    let expected = b"\"messages\"";
    expected.iter().all(|e| rest.next() == Some(e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;

    fn header_name() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9-]{0,11}"
    }

    proptest! {
        /// The raw publish writes records itself (straight into the buffer the broker keeps);
        /// the record layout is also written by `Message::encode_record` (JSON publishes, the
        /// clients) and `PublishEncoder::push_body`. Every writer must produce the same bytes.
        #[test]
        fn a_raw_record_is_byte_for_byte_the_message_encoding(
            priority in 0..=PRIORITY_MAX,
            key in proptest::option::of("[ -~]{0,24}"),
            delay_ms in proptest::option::of(0..=DELAY_MS_MAX),
            headers in vec((header_name(), "[ -~]{0,24}"), 0..4),
            body in vec(any::<u8>(), 0..64),
        ) {
            let mut record = BytesMut::new();
            RecordHead {
                priority,
                key: key.as_deref().map(str::as_bytes),
                deliver_after_ms: delay_ms,
                header_count: headers.len() as u16,
                body_len: 0,
            }
            .encode(&mut record);
            for (name, value) in &headers {
                put_record_header(&mut record, name.as_bytes(), value.as_bytes());
            }
            record.extend_from_slice(&body);
            let raw = raw_batch(record, None, body.len()).expect("a valid record");
            let message = Message {
                key: key.map(Bytes::from),
                headers,
                priority,
                deliver_after_ms: delay_ms,
                body: Bytes::from(body),
            };
            let encoded = RecordBatch::from_messages(&[message]).expect("a valid message");
            prop_assert_eq!(raw.batch.bytes(), encoded.bytes());
        }
    }

    #[test]
    fn json_content_types() {
        let ct = |s: &'static str| Some(HeaderValue::from_static(s));
        assert!(is_json(ct("application/json").as_ref()));
        assert!(is_json(ct("Application/JSON; charset=utf-8").as_ref()));
        assert!(is_json(ct("application/cloudevents+json").as_ref()));
        assert!(!is_json(ct("text/plain").as_ref()));
        assert!(!is_json(ct("application/jsonl").as_ref()));
        assert!(!is_json(ct("application/").as_ref()));
        assert!(!is_json(None));
    }

    #[test]
    fn query_pairs_decode() {
        let pairs: Vec<_> = form_pairs("key=a%20b+c&priority=3&x=%zz&y=%4").collect();
        assert_eq!(pairs[0].1, "a b c");
        assert_eq!(pairs[1].1, "3");
        assert_eq!(pairs[2].1, "%zz");
        assert_eq!(pairs[3].1, "%4");
    }

    #[test]
    fn batch_detection() {
        assert!(looks_like_batch(b" { \"messages\": []}"));
        assert!(!looks_like_batch(b"{\"body\": 1, \"messages\": []}"));
        assert!(!looks_like_batch(b"{\"messagesx\": []}"));
    }
}
