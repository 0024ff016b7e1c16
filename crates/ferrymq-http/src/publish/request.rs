//! A publish request's path and body: the topic, the content type, and the body read within its
//! limit.

use std::borrow::Cow;

use axum::http::{HeaderValue, StatusCode};
use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::BodyExt as _;

use crate::error::body_rejection;
use crate::{ApiError, ApiResult, AppState};

use super::{RequestBody, ROUTE};

/// The topic of `/topics/{topic}/messages`, percent-decoded.
pub(super) fn topic_of(path: &str) -> ApiResult<Cow<'_, str>> {
    let raw = path
        .strip_prefix("/topics/")
        .and_then(|p| p.strip_suffix("/messages"))
        .ok_or_else(|| ApiError::invalid("path", format!("'{path}' is not {ROUTE}")))?;
    // The common topic has no escape: it is the path's slice, not scanned again for UTF-8.
    if !raw.contains('%') {
        return Ok(raw.into());
    }
    // As the router decodes a path parameter: an escape that is not `%` and two hex digits is
    // kept as it is.
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| ApiError::invalid("topic", "not UTF-8 once percent-decoded"))
}

/// `application/json`, or `application/<anything>+json`, parameters allowed.
pub(super) fn is_json(content_type: Option<&HeaderValue>) -> bool {
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
pub(super) struct RawLimit(pub(super) usize);

pub(super) fn raw_limit(state: &AppState) -> RawLimit {
    RawLimit(state.broker.config().message_body_bytes_max as usize)
}

/// The whole request body, up to `limit` bytes. A body that arrives as one chunk (a small
/// request, the common case) is returned as that chunk, without a copy.
pub(super) async fn read_body<B: RequestBody>(limit: usize, chunks: &mut B) -> ApiResult<Bytes> {
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
pub(super) async fn append_chunks<B: RequestBody>(
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
pub(super) fn declared_length<B: RequestBody>(body: &B) -> Option<usize> {
    body.size_hint()
        .exact()
        .and_then(|n| usize::try_from(n).ok())
}

pub(super) fn too_large(limit: usize) -> ApiError {
    body_rejection(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the limit is {limit} bytes"),
    )
}

/// A raw body above the broker's message limit: it could never be stored, so it is refused
/// before it is read, from its declared length, or as soon as a chunked one passes the limit.
pub(super) fn message_too_large(limit: RawLimit) -> ApiError {
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
pub(super) async fn next_chunk<B: RequestBody>(body: &mut B) -> ApiResult<Option<Bytes>> {
    while let Some(frame) = body.frame().await {
        match frame.map_err(unreadable)?.into_data() {
            Ok(data) => return Ok(Some(data)),
            Err(_trailers) => continue,
        }
    }
    Ok(None)
}

pub(super) fn unreadable(error: impl std::error::Error + 'static) -> ApiError {
    ApiError::from_body_error(&error)
}

/// Appends the request body to `out` as it arrives (no intermediate buffer), up to the message
/// limit; returns its length.
pub(super) async fn read_body_into<B: RequestBody>(
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
