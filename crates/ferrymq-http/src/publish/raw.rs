//! A raw publish: the body is one message, its options from `X-FerryMQ-*` request headers and the
//! query string, its record written straight into the buffer the broker keeps.

use std::borrow::Cow;

use axum::http::{HeaderMap, HeaderValue};
use bytes::BytesMut;
use ferrymq_broker::HEADER_DEDUP_ID;
use ferrymq_protocol::limits::HEADERS_COUNT_MAX;
use ferrymq_protocol::{
    put_record_header, record_header_len, set_record_body_len, RecordBatch, RecordHead,
};

use crate::{ApiError, ApiResult};

use super::check::{
    check_dedup_id, check_delay, check_header, check_key, check_priority, header_text, named,
    parse_num,
};
use super::request::{declared_length, message_too_large, RawLimit};
use super::{Outgoing, RequestBody};

/// `X-FerryMQ-Header-<name>: <value>` becomes message header `<name>` (lowercase).
pub const HEADER_PREFIX: &str = "x-ferrymq-header-";

/// Options of a raw publish, from request headers then the query string.
#[derive(Default)]
pub(crate) struct RawOptions<'a> {
    pub(super) key: Option<Cow<'a, str>>,
    pub(super) priority: u8,
    pub(super) delay_ms: Option<u64>,
    pub(super) partition: Option<u32>,
    /// Message headers: `X-FerryMQ-Header-*` request headers, plus `content-type`.
    header_count: usize,
    header_bytes: usize,
    /// `Idempotency-Key` or `X-FerryMQ-Dedup-Id`, written as header `x-ferrymq-dedup-id`.
    dedup_id: Option<&'a str>,
}

/// Whether a raw publish's `Content-Type` is kept as its message header `content-type`: not
/// `application/x-www-form-urlencoded`, which `curl -d` and HTML forms send when told nothing
/// and which a message body almost never is (`X-FerryMQ-Header-Content-Type` keeps it when it
/// is).
pub(super) fn kept_content_type(value: &HeaderValue) -> bool {
    const FORM: &[u8] = b"application/x-www-form-urlencoded";
    let bytes = value.as_bytes();
    !(bytes.len() >= FORM.len()
        && bytes[..FORM.len()].eq_ignore_ascii_case(FORM)
        && matches!(bytes.get(FORM.len()), None | Some(b';' | b' ')))
}

/// A publish's deduplication id: `Idempotency-Key` (the IETF draft's name), or
/// `X-FerryMQ-Dedup-Id`; both may be given when they agree.
pub(super) fn dedup_header(headers: &HeaderMap) -> ApiResult<Option<&str>> {
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

/// The request headers that become message headers, with their message header names:
/// `content-type` (see [`kept_content_type`]), and `x-ferrymq-header-<name>` as `<name>`.
pub(super) fn message_headers(headers: &HeaderMap) -> impl Iterator<Item = (&str, &HeaderValue)> {
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
    pub(super) fn from_headers(headers: &'a HeaderMap) -> ApiResult<Self> {
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
    pub(super) fn apply_query(&mut self, query: &'a str) -> ApiResult<()> {
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
/// replaced, a malformed escape kept as it is), empty pairs skipped.
pub(super) fn form_pairs(query: &str) -> form_urlencoded::Parse<'_> {
    form_urlencoded::parse(query.as_bytes())
}

/// A raw publish's record before its body, and its one option that is not in the record.
pub(super) struct RawRecord {
    pub(super) record: BytesMut,
    pub(super) partition: Option<u32>,
}

/// A raw publish's record, written up to its body, from the request's head: the record is
/// written straight into the buffer the broker keeps, sized from `Content-Length` so that the
/// body is copied once and nothing is reallocated.
pub(super) fn raw_record<B: RequestBody>(
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
pub(super) fn raw_batch(
    mut record: BytesMut,
    partition: Option<u32>,
    body_len: usize,
) -> ApiResult<Outgoing> {
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use ferrymq_protocol::limits::{DELAY_MS_MAX, PRIORITY_MAX};
    use ferrymq_protocol::Message;

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
    fn query_pairs_decode() {
        let pairs: Vec<_> = form_pairs("key=a%20b+c&priority=3&x=%zz&y=%4").collect();
        assert_eq!(pairs[0].1, "a b c");
        assert_eq!(pairs[1].1, "3");
        assert_eq!(pairs[2].1, "%zz");
        assert_eq!(pairs[3].1, "%4");
    }
}
