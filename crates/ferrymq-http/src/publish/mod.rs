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

mod check;
mod json;
mod raw;
mod reply;
mod request;

use std::future::Future;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use ferrymq_protocol::RecordBatch;
use futures_util::future::Either;
use futures_util::FutureExt as _;
use http_body_util::Full;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::cluster::{node_header, ClusterRouter, NODE_HEADER};
use crate::error::ErrorBody;
use crate::schema::Name;
use crate::{ApiError, ApiResult, AppState, Connection};

pub(crate) use json::json_batch;
use json::PublishBody;
use raw::{dedup_header, raw_batch, raw_record, RawOptions, RawRecord};
use reply::{reply, PublishReply};
use request::{
    declared_length, is_json, raw_limit, read_body, read_body_into, too_large, topic_of,
};

pub(crate) fn routes() -> OpenApiRouter<AppState> {
    // Counted by the handler itself rather than by `service::track`: the hot path skips the
    // middleware and the counter lookup.
    OpenApiRouter::new().routes(routes!(publish))
}

pub(crate) const ROUTE: &str = "/topics/{topic}/messages";

/// Counts a request of this route by its status.
fn count(status: StatusCode) {
    if status == StatusCode::CREATED {
        crate::counters::publish_counters().created.add(1);
    } else {
        crate::counters::request_counter(&Method::POST, ROUTE, status).increment(1);
    }
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
    if let Some(cluster) = &connection.state.config.cluster {
        let topic = topic_of(uri.path())?;
        if cluster.0.publishes_to(&topic) {
            return publish_through(&connection, cluster, &topic, outgoing).await;
        }
    }
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
    let counters = crate::counters::publish_counters();
    counters.messages.add(count as u64);
    counters.bytes.add(bytes_in);
    Ok(reply(&connection, &receipt, count))
}

/// In a cluster: a replicated topic's publish, answered once each partition's leader has it
/// committed on a majority of its replicas; `FerryMQ-Node` names the leaders that served it.
async fn publish_through(
    connection: &Connection,
    cluster: &ClusterRouter,
    topic: &str,
    outgoing: Outgoing,
) -> ApiResult<http::Response<ReplyBody>> {
    let (count, bytes_in) = (outgoing.count, outgoing.bytes_in);
    let (receipt, nodes) = cluster
        .0
        .publish(topic, outgoing.partition, outgoing.batch)
        .await?;
    let counters = crate::counters::publish_counters();
    counters.messages.add(count as u64);
    counters.bytes.add(bytes_in);
    let mut response = reply(connection, &receipt, count);
    response
        .headers_mut()
        .insert(NODE_HEADER, node_header(&nodes));
    Ok(response)
}

/// A request's messages, encoded for the broker.
pub(crate) struct Outgoing {
    pub(crate) batch: RecordBatch,
    partition: Option<u32>,
    count: usize,
    /// Body bytes, for the `bytes_in` counter.
    bytes_in: u64,
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

#[cfg(test)]
mod tests {
    use ferrymq_broker::{Broker, BrokerConfig};

    use super::*;
    use crate::HttpConfig;

    /// `route` with each `{parameter}` replaced by a segment of its own.
    fn concrete(route: &str) -> String {
        let mut out = String::new();
        let mut in_parameter = false;
        for c in route.chars() {
            match c {
                '{' => in_parameter = true,
                '}' => {
                    in_parameter = false;
                    out.push_str("p1");
                }
                c if !in_parameter => out.push(c),
                _ => {}
            }
        }
        out
    }

    /// The server sends the requests of `is_route` straight to the publish handler, past the
    /// router: it must take every request the router would give the publish route, and none
    /// that the router would give another route.
    #[tokio::test]
    async fn the_direct_path_takes_exactly_the_requests_the_router_serves_as_a_publish() {
        let broker = Broker::open(BrokerConfig::default());
        let state = AppState {
            broker: broker.clone(),
            started: std::time::Instant::now(),
            config: Arc::new(HttpConfig::for_broker(
                "127.0.0.1:0".parse().expect("an address"),
                &broker,
            )),
            consumers: Default::default(),
            readiness: Default::default(),
            history: Default::default(),
            sessions: Arc::new(crate::session::Sessions::new(
                std::time::Duration::from_secs(60),
                16,
            )),
        };
        let (_, api) = crate::router_with_openapi(state);
        let mut publish_operations = 0;
        for (route, item) in &api.paths.paths {
            let operations = [
                (Method::GET, item.get.is_some()),
                (Method::POST, item.post.is_some()),
                (Method::PUT, item.put.is_some()),
                (Method::DELETE, item.delete.is_some()),
                (Method::PATCH, item.patch.is_some()),
                (Method::HEAD, item.head.is_some()),
            ];
            for (method, served) in operations {
                let publish = served && route == ROUTE && method == Method::POST;
                publish_operations += usize::from(publish);
                if served {
                    assert_eq!(
                        is_route(&method, &concrete(route)),
                        publish,
                        "{method} {route}"
                    );
                }
            }
        }
        assert_eq!(
            publish_operations, 1,
            "the document lists the publish route"
        );
        for path in [
            "/topics/orders/messages",
            "/topics/orders%2Feu/messages",
            "/topics/messages/messages",
            // The router does not match an empty segment; the handler refuses it by name.
            "/topics//messages",
        ] {
            assert!(is_route(&Method::POST, path), "{path}");
        }
        for path in [
            "/topics/orders/messages/",
            "/topics/orders/eu/messages",
            "/topics/orders/message",
            "/topics/orders/messagesx",
            "/topics/messages",
            "/topic/orders/messages",
            "//topics/orders/messages",
            "/topics/orders/subscriptions/s/messages",
        ] {
            assert!(!is_route(&Method::POST, path), "{path}");
        }
        for method in [Method::GET, Method::PUT, Method::DELETE, Method::PATCH] {
            assert!(!is_route(&method, "/topics/orders/messages"), "{method}");
        }
    }

    use std::collections::BTreeMap;

    use ferrymq_protocol::limits::{
        DELAY_MS_MAX, HEADERS_COUNT_MAX, HEADER_BYTES_MAX, KEY_BYTES_MAX,
        MESSAGE_BODY_BYTES_DEFAULT, PRIORITY_MAX,
    };
    use ferrymq_protocol::{FrameDecoder, Message, PublishEncoder};
    use proptest::collection::{btree_map, vec};
    use proptest::prelude::*;
    use proptest::string::string_regex;

    /// Short, or exactly at the limit.
    fn text(limit: usize) -> impl Strategy<Value = String> {
        let at_limit = string_regex(&format!("[ -~]{{{limit}}}")).expect("a valid pattern");
        prop_oneof!["[ -~]{0,12}".boxed(), at_limit.boxed()]
    }

    fn message() -> impl Strategy<Value = Message> {
        let header_name = prop_oneof![
            "[a-z][a-z0-9-]{0,11}".boxed(),
            string_regex(&format!("[a-z]{{{HEADER_BYTES_MAX}}}"))
                .expect("a valid pattern")
                .boxed(),
        ];
        let headers = prop_oneof![
            btree_map(header_name, text(HEADER_BYTES_MAX), 0..4),
            btree_map("h[0-9a-z]{6}", "[ -~]{0,8}", HEADERS_COUNT_MAX),
        ];
        let body = prop_oneof![
            vec(any::<u8>(), 0..64),
            vec(any::<u8>(), MESSAGE_BODY_BYTES_DEFAULT as usize),
        ];
        (
            0..=PRIORITY_MAX,
            proptest::option::of(text(KEY_BYTES_MAX)),
            proptest::option::of(0..=DELAY_MS_MAX),
            headers,
            body,
        )
            .prop_map(|(priority, key, delay_ms, headers, body)| Message {
                key: key.map(Bytes::from),
                headers: headers.into_iter().collect(),
                priority,
                deliver_after_ms: delay_ms,
                body: Bytes::from(body),
            })
    }

    /// The record a raw publish of `message` writes, from the request the message makes.
    fn raw_publish(message: &Message) -> Bytes {
        let mut request = http::Request::builder()
            .method(Method::POST)
            .uri("/topics/t/messages")
            .header("x-ferrymq-priority", message.priority.to_string());
        if let Some(key) = &message.key {
            request = request.header("x-ferrymq-key", key.as_ref());
        }
        if let Some(delay) = message.deliver_after_ms {
            request = request.header("x-ferrymq-delay-ms", delay.to_string());
        }
        for (name, value) in &message.headers {
            request = request.header(format!("{}{name}", raw::HEADER_PREFIX), value);
        }
        let request = request
            .body(Full::new(message.body.clone()))
            .expect("a valid request");
        let (parts, mut body) = request.into_parts();
        let limit = request::RawLimit(MESSAGE_BODY_BYTES_DEFAULT as usize);
        let RawRecord {
            mut record,
            partition,
        } = raw_record(limit, &parts, &body).expect("a valid raw publish");
        let body_len = read_body_into(limit, &mut body, &mut record)
            .now_or_never()
            .expect("a body in memory is ready")
            .expect("a body within the limit");
        let outgoing = raw_batch(record, partition, body_len).expect("a valid record");
        outgoing.batch.bytes().clone()
    }

    /// The record a JSON publish of `message` writes.
    fn json_publish(message: &Message) -> Bytes {
        use base64::Engine as _;
        let mut object = serde_json::json!({
            "body_base64": base64::engine::general_purpose::STANDARD.encode(&message.body),
            "priority": message.priority,
        });
        if let Some(key) = &message.key {
            object["key"] = std::str::from_utf8(key).expect("a text key").into();
        }
        if let Some(delay) = message.deliver_after_ms {
            object["delay_ms"] = delay.into();
        }
        if !message.headers.is_empty() {
            let headers: BTreeMap<_, _> = message.headers.iter().cloned().collect();
            object["headers"] = serde_json::to_value(headers).expect("headers serialize");
        }
        let body = serde_json::to_vec(&object).expect("the message serializes");
        let outgoing =
            json_batch(&body, RawOptions::default(), None).expect("a valid JSON publish");
        outgoing.batch.bytes().clone()
    }

    /// The records of a PUBLISH frame that `push` (and `push_body`, when the message has
    /// neither headers nor delay) wrote.
    fn frame_publish(message: &Message, by_parts: bool) -> Bytes {
        let mut encoder = PublishEncoder::new("t", None, 1);
        if by_parts {
            encoder.push_body(message.key.as_deref(), message.priority, &message.body);
        } else {
            encoder.push(message).expect("a valid message");
        }
        let mut frame = bytes::BytesMut::from(&encoder.finish()[..]);
        match FrameDecoder::new(usize::MAX).decode(&mut frame) {
            Ok(Some((_, ferrymq_protocol::Frame::Publish { records, .. }))) => {
                records.bytes().clone()
            }
            other => panic!("not a PUBLISH frame: {other:?}"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Every writer of the record layout writes the same bytes for the same message:
        /// `Message::encode_record`, the PUBLISH frame's encoder, and the HTTP API's raw and
        /// JSON publishes. Keys, headers and bodies run up to their limits.
        #[test]
        fn every_publish_path_writes_the_same_record(message in message()) {
            let encoded = RecordBatch::from_messages(std::slice::from_ref(&message))
                .expect("a valid message");
            let expected = encoded.bytes();
            prop_assert_eq!(&raw_publish(&message), expected, "raw publish");
            prop_assert_eq!(&json_publish(&message), expected, "JSON publish");
            prop_assert_eq!(&frame_publish(&message, false), expected, "PublishEncoder::push");
            if message.headers.is_empty() && message.deliver_after_ms.is_none() {
                prop_assert_eq!(
                    &frame_publish(&message, true),
                    expected,
                    "PublishEncoder::push_body"
                );
            }
            let decoded: Vec<Message> = encoded.messages().collect();
            prop_assert_eq!(decoded, vec![message]);
        }
    }
}
