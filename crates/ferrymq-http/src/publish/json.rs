//! A JSON publish: one message object, `{"messages": [...]}`, or an array of them, converted
//! into records.

use std::borrow::Cow;
use std::collections::BTreeMap;

use axum::http::StatusCode;
use base64::Engine as _;
use bytes::Bytes;
use ferrymq_broker::HEADER_DEDUP_ID;
use ferrymq_protocol::limits::{BATCH_COUNT_MAX, HEADERS_COUNT_MAX};
use ferrymq_protocol::{Message, RecordBatch};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use smallvec::{smallvec, SmallVec};
use utoipa::openapi::schema::{ArrayBuilder, Schema};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

use crate::{ApiError, ApiResult};

use super::check::{check_dedup_id, check_delay, check_header, check_key, check_priority, named};
use super::raw::RawOptions;
use super::Outgoing;

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
pub(super) fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<RawValue>>, D::Error> {
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
    Array(#[schema(inline)] MessageArray),
}

/// A JSON publish's array of message objects: 1 to 65536.
#[derive(serde::Deserialize)]
pub struct MessageArray(#[allow(dead_code)] Vec<JsonMessage>);

impl PartialSchema for MessageArray {
    fn schema() -> RefOr<Schema> {
        ArrayBuilder::new()
            .items(utoipa::openapi::Ref::from_schema_name("JsonMessage"))
            .min_items(Some(1))
            .max_items(Some(ferrymq_protocol::limits::BATCH_COUNT_MAX as usize))
            .into()
    }
}

impl ToSchema for MessageArray {}

/// Parses with serde_json directly; on failure, again through axum's extractor, whose errors
/// name the path of the field at fault (`messages[2].priority: ...`).
pub(super) fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> ApiResult<T> {
    match serde_json::from_slice(body) {
        Ok(value) => Ok(value),
        Err(_) => match axum::Json::<T>::from_bytes(body) {
            Ok(axum::Json(value)) => Ok(value),
            Err(rejection) => Err(rejection.into()),
        },
    }
}

/// A JSON publish's messages: one (the common case) is kept inline, as is its conversion.
pub(super) type JsonMessages = SmallVec<[JsonMessage; 1]>;

/// A JSON publish's messages, from its whole body.
/// `defaults`: the query's options, for the messages that do not set their own.
pub(crate) fn json_batch(
    body: &[u8],
    defaults: RawOptions<'_>,
    dedup_id: Option<String>,
) -> ApiResult<Outgoing> {
    let (messages, names) = parse_messages(body)?;
    if dedup_id.is_some() && messages.len() > 1 {
        return Err(ApiError::invalid(
            "Idempotency-Key",
            "names one message: give each message of a batch its own dedup_id",
        ));
    }
    let mut partition: Option<Option<u32>> = None;
    let mut converted: SmallVec<[Message; 1]> = SmallVec::with_capacity(messages.len());
    let mut bytes_in = 0u64;
    for (i, m) in messages.into_iter().enumerate() {
        let field = |name: &'static str| names.field(i, name);
        let message = convert(m, &defaults, &dedup_id, &mut partition, field)?;
        bytes_in += message.body.len() as u64;
        converted.push(message);
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

/// How a message's field is named in an error: `priority` for a lone message object,
/// `[2].priority` in an array, `messages[2].priority` in `{"messages": [...]}`.
struct FieldNames {
    single: bool,
    prefix: &'static str,
}

impl FieldNames {
    fn field(&self, i: usize, name: &'static str) -> Cow<'static, str> {
        match (self.single, self.prefix) {
            (true, _) => Cow::Borrowed(name),
            (false, "") => format!("[{i}].{name}").into(),
            (false, p) => format!("{p}[{i}].{name}").into(),
        }
    }
}

/// The messages of a JSON publish's body, 1 to [`BATCH_COUNT_MAX`] of them, and how their
/// fields are named in errors.
fn parse_messages(body: &[u8]) -> ApiResult<(JsonMessages, FieldNames)> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace()).copied();
    let (messages, prefix): (JsonMessages, &'static str) =
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
    Ok((messages, FieldNames { single, prefix }))
}

/// One JSON message as the broker stores it, its fields checked in the order a client reads
/// the errors: body, priority, delay, key, partition (`partition` holds the batch's, which
/// every message must share), headers, deduplication id.
fn convert<F: Fn(&'static str) -> Cow<'static, str>>(
    m: JsonMessage,
    defaults: &RawOptions<'_>,
    dedup_header: &Option<String>,
    partition: &mut Option<Option<u32>>,
    field: F,
) -> ApiResult<Message> {
    let (body, json_body) = message_body(m.body, m.body_base64, &field)?;
    let priority = named(
        check_priority(m.priority.unwrap_or(defaults.priority)),
        || field("priority"),
    )?;
    let delay = m
        .delay_ms
        .map(|d| named(check_delay(d), || field("delay_ms")))
        .transpose()?
        .or(defaults.delay_ms);
    if let Some(key) = &m.key {
        named(check_key(key), || field("key"))?;
    }
    let key = m
        .key
        .or_else(|| defaults.key.as_deref().map(str::to_string));
    let m_partition = m.partition.or(defaults.partition);
    match partition {
        None => *partition = Some(m_partition),
        Some(p) if *p == m_partition => {}
        Some(_) => {
            return Err(ApiError::invalid(
                &field("partition"),
                "every message of a batch must name the same partition, or none",
            ))
        }
    }
    let headers = message_headers(json_body, m.headers, m.dedup_id, dedup_header, &field)?;
    Ok(Message {
        key: key.map(Bytes::from),
        headers,
        priority,
        deliver_after_ms: delay,
        body,
    })
}

/// A message's body, and whether it is JSON text (any value but a string): exactly one of
/// `body` and `body_base64`.
fn message_body<F: Fn(&'static str) -> Cow<'static, str>>(
    body: Option<Box<RawValue>>,
    body_base64: Option<String>,
    field: &F,
) -> ApiResult<(Bytes, bool)> {
    Ok(match (body, body_base64) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                &field("body"),
                "give body or body_base64, not both",
            ))
        }
        (None, None) => {
            return Err(ApiError::invalid(
                &field("body"),
                "missing: give body (any JSON value) or body_base64",
            ))
        }
        (Some(raw), None) if raw.get().starts_with('"') => {
            let text: String = serde_json::from_str(raw.get())
                .map_err(|e| ApiError::invalid(&field("body"), e))?;
            (Bytes::from(text), false)
        }
        (Some(raw), None) => (Bytes::from(String::from(Box::<str>::from(raw))), true),
        (None, Some(encoded)) => (
            Bytes::from(
                base64::engine::general_purpose::STANDARD
                    .decode(encoded.as_bytes())
                    .map_err(|e| ApiError::invalid(&field("body_base64"), e))?,
            ),
            false,
        ),
    })
}

/// A message's headers: `content-type: application/json` for a JSON body (unless the message
/// names its own), its own, and its deduplication id, from its `dedup_id` or the request's
/// `Idempotency-Key`, which must agree.
fn message_headers<F: Fn(&'static str) -> Cow<'static, str>>(
    json_body: bool,
    own: Option<BTreeMap<String, String>>,
    own_dedup_id: Option<String>,
    dedup_header: &Option<String>,
    field: &F,
) -> ApiResult<Vec<(String, String)>> {
    let mut headers: Vec<(String, String)> = Vec::new();
    if json_body {
        headers.push(("content-type".into(), "application/json".into()));
    }
    for (name, value) in own.unwrap_or_default() {
        named(check_header(&name, &value), || field("headers"))?;
        if json_body && name.eq_ignore_ascii_case("content-type") {
            headers.retain(|(n, _)| n != "content-type");
        }
        headers.push((name, value));
    }
    let id = match (own_dedup_id, dedup_header) {
        (Some(own), Some(header)) if own != *header => {
            return Err(ApiError::invalid(
                &field("dedup_id"),
                "differs from the Idempotency-Key header: give one of them",
            ))
        }
        (Some(own), _) => Some(own),
        (None, header) => header.clone(),
    };
    if let Some(id) = id {
        named(check_dedup_id(&id), || field("dedup_id"))?;
        headers.retain(|(n, _)| n != HEADER_DEDUP_ID);
        headers.push((HEADER_DEDUP_ID.to_owned(), id));
    }
    if headers.len() > HEADERS_COUNT_MAX {
        return Err(ApiError::invalid(
            &field("headers"),
            format!("{} headers, limit {HEADERS_COUNT_MAX}", headers.len()),
        ));
    }
    Ok(headers)
}

/// A top-level object whose first key is `messages` is a batch (a message object has no such
/// field, so anything else is parsed as one message and its errors name its fields).
pub(super) fn looks_like_batch(body: &[u8]) -> bool {
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

    #[test]
    fn batch_detection() {
        assert!(looks_like_batch(b" { \"messages\": []}"));
        assert!(!looks_like_batch(b"{\"body\": 1, \"messages\": []}"));
        assert!(!looks_like_batch(b"{\"messagesx\": []}"));
    }
}
