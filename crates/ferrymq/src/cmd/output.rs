//! Output for people and for programs shared by the commands: tables, times, bytes as text or
//! hex, and a message entry as JSON.

use std::io::{self, Write};

use ferrymq_client::MessageEntry;
use serde_json::{json, Value};

/// Lowercase hex, for keys and bodies that are not UTF-8.
pub(super) fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        text.push(DIGITS[(b >> 4) as usize] as char);
        text.push(DIGITS[(b & 0xf) as usize] as char);
    }
    text
}

/// Writes a plain table: a header row and columns padded to their widest cell, numbers aligned
/// right.
pub(super) fn write_table(
    out: &mut impl Write,
    headers: &[&str],
    right: &[bool],
    rows: &[Vec<String>],
) -> io::Result<()> {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header_cells: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header_cells).chain(rows) {
        let mut line = String::new();
        for (index, cell) in row.iter().enumerate() {
            let width = widths[index];
            if index > 0 {
                line.push_str("  ");
            }
            if right.get(index).copied().unwrap_or(false) {
                line.push_str(&format!("{cell:>width$}"));
            } else {
                line.push_str(&format!("{cell:<width$}"));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// A message entry as JSON: times in Unix ms (`null` when not known or not applicable), the
/// result as `result` when UTF-8, else as `result_hex`.
pub(super) fn entry_json(e: &MessageEntry) -> Value {
    let time = |ms: u64| if ms == 0 { Value::Null } else { json!(ms) };
    let mut object = serde_json::Map::new();
    object.insert("id".into(), json!(format!("{}-{}", e.partition, e.offset)));
    object.insert("partition".into(), json!(e.partition));
    object.insert("offset".into(), json!(e.offset));
    object.insert("state".into(), json!(e.state.as_str()));
    object.insert("attempts".into(), json!(e.attempts));
    object.insert("published_ms".into(), time(e.published_ms));
    object.insert("first_delivered_ms".into(), time(e.first_delivered_ms));
    object.insert("settled_ms".into(), time(e.settled_ms));
    object.insert("due_ms".into(), time(e.due_ms));
    insert_bytes(
        &mut object,
        "result",
        (!e.result.is_empty()).then_some(&e.result[..]),
    );
    object.insert(
        "reason".into(),
        if e.reason.is_empty() {
            Value::Null
        } else {
            json!(e.reason)
        },
    );
    object.insert(
        "dead_letter".into(),
        match e.dead_letter {
            None => Value::Null,
            Some((partition, offset)) => json!({
                "id": format!("{partition}-{offset}"),
                "partition": partition,
                "offset": offset,
            }),
        },
    );
    Value::Object(object)
}

/// Inserts `name` as a string when the bytes are UTF-8, `<name>_hex` otherwise, `null` for none.
pub(super) fn insert_bytes(
    object: &mut serde_json::Map<String, Value>,
    name: &str,
    bytes: Option<&[u8]>,
) {
    match bytes {
        None => {
            object.insert(name.into(), Value::Null);
        }
        Some(bytes) => match std::str::from_utf8(bytes) {
            Ok(text) => {
                object.insert(name.into(), json!(text));
            }
            Err(_) => {
                object.insert(format!("{name}_hex"), json!(to_hex(bytes)));
            }
        },
    }
}

/// Bytes for people: the text when it is UTF-8 without control characters, else `hex:...`.
pub(super) fn bytes_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_string(),
        _ => format!("hex:{}", to_hex(bytes)),
    }
}

/// A Unix time in ms as UTC, `2026-11-21T12:00:00.123Z`; `-` for 0 (never, or unknown).
pub(crate) fn time_text(ms: u64) -> String {
    if ms == 0 {
        return "-".to_string();
    }
    let (secs, millis) = (ms / 1000, ms % 1000);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm), proleptic Gregorian.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

pub(super) fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_hex_and_bytes_print_for_people() {
        assert_eq!(time_text(0), "-");
        assert_eq!(time_text(1), "1970-01-01T00:00:00.001Z");
        assert_eq!(time_text(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(time_text(1_763_726_645_123), "2025-11-21T12:04:05.123Z");
        assert_eq!(from_hex("00ff10"), Some(vec![0, 255, 16]));
        assert_eq!(from_hex("0"), None);
        assert_eq!(from_hex("zz"), None);
        assert_eq!(from_hex("é0"), None);
        assert_eq!(bytes_text(b"done"), "done");
        assert_eq!(bytes_text(&[0xff, 0x01]), "hex:ff01");
        assert_eq!(bytes_text(b"a\nb"), "hex:610a62");
    }

    #[test]
    fn tables_align_columns() {
        let mut out = Vec::new();
        let rows = vec![
            vec!["a".to_string(), "1".to_string()],
            vec!["long-name".to_string(), "12345".to_string()],
        ];
        write_table(&mut out, &["NAME", "N"], &[false, true], &rows).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "NAME           N\na              1\nlong-name  12345\n"
        );
    }
}
