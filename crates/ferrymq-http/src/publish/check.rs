//! The checks of a message's fields that both publish paths share, and their error wording.

use axum::http::HeaderValue;
use ferrymq_broker::DEDUP_ID_BYTES_MAX;
use ferrymq_protocol::limits::{DELAY_MS_MAX, HEADER_BYTES_MAX, KEY_BYTES_MAX, PRIORITY_MAX};

use crate::{ApiError, ApiResult};

pub(super) fn header_text<'a>(value: &'a HeaderValue, name: &str) -> ApiResult<&'a str> {
    value
        .to_str()
        .map_err(|_| ApiError::invalid(name, "must be visible ASCII text"))
}

pub(super) fn parse_num<T: std::str::FromStr>(text: &str, field: &str) -> ApiResult<T>
where
    T::Err: std::fmt::Display,
{
    text.parse::<T>()
        .map_err(|e| ApiError::invalid(field, format!("'{text}': {e}")))
}

/// A check's failure named with its field, the name built only then (for a batch's message it
/// is formatted: `messages[3].priority`).
pub(super) fn named<T, N: AsRef<str>>(
    checked: Result<T, String>,
    field: impl FnOnce() -> N,
) -> ApiResult<T> {
    checked.map_err(|reason| ApiError::invalid(field().as_ref(), reason))
}

pub(super) fn check_priority(priority: u8) -> Result<u8, String> {
    if priority > PRIORITY_MAX {
        return Err(format!("{priority} is above {PRIORITY_MAX}"));
    }
    Ok(priority)
}

pub(super) fn check_delay(delay: u64) -> Result<u64, String> {
    if delay > DELAY_MS_MAX {
        return Err(format!("{delay} is above {DELAY_MS_MAX} (30 days)"));
    }
    Ok(delay)
}

pub(super) fn check_key(key: &str) -> Result<(), String> {
    if key.len() > KEY_BYTES_MAX {
        return Err(format!(
            "{} bytes, above the limit of {KEY_BYTES_MAX}",
            key.len()
        ));
    }
    Ok(())
}

pub(super) fn check_header(name: &str, value: &str) -> Result<(), String> {
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

pub(super) fn check_dedup_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > DEDUP_ID_BYTES_MAX {
        return Err(format!(
            "a deduplication id is 1 to {DEDUP_ID_BYTES_MAX} bytes, not {}",
            id.len()
        ));
    }
    Ok(())
}
