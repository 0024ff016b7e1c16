//! Argument values more than one command reads: durations and message ids.

use std::time::Duration;

use ferrymq_client::MessageId;

/// Every duration the CLI takes (`--delay`, `--timeout`, `--retention`, the bench's): `500ms`,
/// `5s`, `2m`, `12h`, `7d`, or a bare number of seconds; fractions allowed (`1.5h`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration like 500ms, 5s, 2m, 12h, 7d or 1.5");
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = text.strip_suffix('h') {
        (n, 3600.0)
    } else if let Some(n) = text.strip_suffix('d') {
        (n, 86_400.0)
    } else {
        (text, 1.0)
    };
    let value: f64 = number.trim().parse().map_err(|_| bad())?;
    if !value.is_finite() || value < 0.0 {
        return Err(bad());
    }
    Duration::try_from_secs_f64(value * scale).map_err(|_| bad())
}

pub(super) fn parse_message_id(text: &str) -> Result<MessageId, String> {
    let bad = || format!("{text:?} is not a message id: use <partition>-<offset>, e.g. 0-17");
    let (partition, offset) = text.split_once('-').ok_or_else(bad)?;
    if !is_decimal(partition) || !is_decimal(offset) {
        return Err(bad());
    }
    Ok(MessageId::new(
        partition.parse().map_err(|_| bad())?,
        offset.parse().map_err(|_| bad())?,
    ))
}

pub(super) fn is_decimal(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("d").is_err());
        assert!(parse_duration("1w").is_err());
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("soon").is_err());
    }
}
