//! The message record: the wire form of one published message, its layout, and the code that
//! reads it. Every writer and reader of the layout lives here, so that the publish paths (the
//! binary protocol, the HTTP API) and the delivery readers (the broker, the clients) agree by
//! construction rather than by copies kept in step.
//!
//! A *record* is the wire form of one published message. The broker stores the record bytes as
//! they arrived and copies them verbatim into DELIVER frames behind a small delivery prefix, so a
//! message is validated once, on publish, and never re-encoded.
//!
//! Record layout (little-endian):
//!
//! ```text
//! 0   u8   priority            0..=9
//! 1   u8   flags               bit 0: key present, bit 1: deliver_after present, others zero
//! 2   u16  key_len             0 when no key
//! 4   u16  header_count
//! 6   u32  body_len
//! 10  u64  deliver_after_ms    only when flag bit 1 is set
//! ..  key_len bytes of key
//! ..  header_count × (u16 name_len, name UTF-8, u16 value_len, value UTF-8)
//! ..  body_len bytes of body
//! ```

use bytes::BufMut;

use crate::error::ProtocolError;
use crate::limits::{
    DELAY_MS_MAX, HEADERS_COUNT_MAX, HEADER_BYTES_MAX, KEY_BYTES_MAX, PRIORITY_MAX,
};
use crate::wire::Reader;

pub(crate) const FLAG_KEY: u8 = 0b01;
pub(crate) const FLAG_DELAY: u8 = 0b10;

/// Fixed part of a record, before the optional delay.
pub const RECORD_PREFIX_BYTES: usize = 10;

/// Where the fixed prefix holds `body_len`.
const BODY_LEN_AT: usize = 6;

/// A record's fields before its headers and body: what [`RecordHead::encode`] writes, the fixed
/// prefix, the optional delay and the key. Every writer of records goes through it (a
/// [`crate::Message`], the PUBLISH frame's encoder, the HTTP API's raw publish), so the layout
/// has one encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHead<'a> {
    pub priority: u8,
    pub key: Option<&'a [u8]>,
    pub deliver_after_ms: Option<u64>,
    /// How many [`put_record_header`] calls follow.
    pub header_count: u16,
    /// How many body bytes follow the headers; a writer that learns it only once the body is in
    /// writes 0 and patches it with [`set_record_body_len`].
    pub body_len: u32,
}

impl RecordHead<'_> {
    /// Bytes the head takes: the prefix, the delay, the key.
    #[inline]
    pub fn encoded_len(&self) -> usize {
        RECORD_PREFIX_BYTES
            + self.deliver_after_ms.map_or(0, |_| 8)
            + self.key.map_or(0, <[u8]>::len)
    }

    /// Writes the head. The caller has checked the limits ([`crate::Message::validate`] says
    /// which); the key's length must fit its u16 field.
    #[inline]
    pub fn encode(&self, buf: &mut impl BufMut) {
        debug_assert!(self.priority <= PRIORITY_MAX);
        debug_assert!(self.key.map_or(0, <[u8]>::len) <= KEY_BYTES_MAX);
        let mut flags = 0u8;
        if self.key.is_some() {
            flags |= FLAG_KEY;
        }
        if self.deliver_after_ms.is_some() {
            flags |= FLAG_DELAY;
        }
        buf.put_u8(self.priority);
        buf.put_u8(flags);
        buf.put_u16_le(self.key.map_or(0, |k| k.len() as u16));
        buf.put_u16_le(self.header_count);
        buf.put_u32_le(self.body_len);
        if let Some(delay) = self.deliver_after_ms {
            buf.put_u64_le(delay);
        }
        if let Some(key) = self.key {
            buf.put_slice(key);
        }
    }
}

/// Bytes one header takes in a record.
#[inline]
pub const fn record_header_len(name: &[u8], value: &[u8]) -> usize {
    4 + name.len() + value.len()
}

/// Writes one header after a [`RecordHead`] (its `header_count` says how many). Both lengths are
/// within [`HEADER_BYTES_MAX`], checked by the caller.
#[inline]
pub fn put_record_header(buf: &mut impl BufMut, name: &[u8], value: &[u8]) {
    debug_assert!(!name.is_empty() && name.len() <= HEADER_BYTES_MAX);
    debug_assert!(value.len() <= HEADER_BYTES_MAX);
    buf.put_u16_le(name.len() as u16);
    buf.put_slice(name);
    buf.put_u16_le(value.len() as u16);
    buf.put_slice(value);
}

/// Sets the `body_len` of the record that starts `record`, for a writer that appended the body
/// after writing the head with a length of 0.
#[inline]
pub fn set_record_body_len(record: &mut [u8], body_len: u32) {
    record[BODY_LEN_AT..BODY_LEN_AT + 4].copy_from_slice(&body_len.to_le_bytes());
}

/// A record's fixed prefix, read without checks: for readers of records already validated (the
/// batch they came in was decoded), which need the lengths to walk the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordPrefix {
    pub priority: u8,
    flags: u8,
    pub key_len: u16,
    pub header_count: u16,
    pub body_len: u32,
}

impl RecordPrefix {
    #[inline]
    pub fn read(prefix: &[u8; RECORD_PREFIX_BYTES]) -> RecordPrefix {
        RecordPrefix {
            priority: prefix[0],
            flags: prefix[1],
            key_len: u16::from_le_bytes([prefix[2], prefix[3]]),
            header_count: u16::from_le_bytes([prefix[4], prefix[5]]),
            body_len: u32::from_le_bytes([prefix[6], prefix[7], prefix[8], prefix[9]]),
        }
    }

    /// The key follows the delay (or the prefix).
    #[inline]
    pub fn has_key(&self) -> bool {
        self.flags & FLAG_KEY != 0
    }

    /// A u64 `deliver_after_ms` follows the prefix.
    #[inline]
    pub fn has_delay(&self) -> bool {
        self.flags & FLAG_DELAY != 0
    }
}

/// The `deliver_after_ms` of a validated record, read from its fixed prefix without decoding
/// the rest; `None` when the record has none (or is too short to be a record).
pub fn record_deliver_after_ms(record: &[u8]) -> Option<u64> {
    if record.len() < 18 || record[1] & FLAG_DELAY == 0 {
        return None;
    }
    Some(u64::from_le_bytes(record[10..18].try_into().ok()?))
}
/// Where a validated record's key starts: after the fixed prefix and the optional delay.
fn record_key_start(record: &[u8]) -> usize {
    if record.get(1).is_some_and(|f| f & FLAG_DELAY != 0) {
        RECORD_PREFIX_BYTES + 8
    } else {
        RECORD_PREFIX_BYTES
    }
}

/// The key of a validated record, read in place; `None` when it has none (or is malformed).
pub fn record_key(record: &[u8]) -> Option<&[u8]> {
    if record.len() < RECORD_PREFIX_BYTES || record[1] & FLAG_KEY == 0 {
        return None;
    }
    let len = u16::from_le_bytes([record[2], record[3]]) as usize;
    let start = record_key_start(record);
    record.get(start..start + len)
}

/// The value of the first header called `name` in a validated record, read in place without
/// decoding the rest. Cheap when the record has no headers.
pub fn record_header<'a>(record: &'a [u8], name: &str) -> Option<&'a [u8]> {
    if record.len() < RECORD_PREFIX_BYTES {
        return None;
    }
    let count = u16::from_le_bytes([record[4], record[5]]) as usize;
    if count == 0 {
        return None;
    }
    let key_len = if record[1] & FLAG_KEY != 0 {
        u16::from_le_bytes([record[2], record[3]]) as usize
    } else {
        0
    };
    let mut at = record_key_start(record) + key_len;
    let str16 = |at: &mut usize| -> Option<&'a [u8]> {
        let len = u16::from_le_bytes(record.get(*at..*at + 2)?.try_into().ok()?) as usize;
        let value = record.get(*at + 2..*at + 2 + len)?;
        *at += 2 + len;
        Some(value)
    };
    for _ in 0..count {
        let header = str16(&mut at)?;
        let value = str16(&mut at)?;
        if header == name.as_bytes() {
            return Some(value);
        }
    }
    None
}

/// Where one validated record lies in its batch's bytes, with the fields the broker routes on.
/// Parsing into spans touches no reference counts and allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordSpan {
    pub start: usize,
    pub end: usize,
    pub priority: u8,
    pub deliver_after_ms: Option<u64>,
    /// `start..end` of the key within the batch's bytes.
    pub key: Option<(usize, usize)>,
    pub body_len: u32,
}

impl RecordSpan {
    /// Parses and validates the record at the reader's position.
    // One function over 70 lines on purpose: it reads the record's fields once, in wire order,
    // for every message of every publish, and each check sits beside the field it guards.
    pub(crate) fn parse<B: AsRef<[u8]>>(
        reader: &mut Reader<B>,
    ) -> Result<RecordSpan, ProtocolError> {
        let start = reader.position();
        let priority = reader.u8("record.priority")?;
        if priority > PRIORITY_MAX {
            return Err(ProtocolError::invalid(
                "record.priority",
                format!("{priority} is above {PRIORITY_MAX}"),
            ));
        }
        let flags = reader.u8("record.flags")?;
        if flags & !(FLAG_KEY | FLAG_DELAY) != 0 {
            return Err(ProtocolError::invalid(
                "record.flags",
                format!("unknown bits 0x{flags:02x}"),
            ));
        }
        let key_len = reader.u16("record.key_len")? as usize;
        let header_count = reader.u16("record.header_count")? as usize;
        let body_len = reader.u32("record.body_len")?;
        if flags & FLAG_KEY == 0 && key_len != 0 {
            return Err(ProtocolError::invalid(
                "record.key_len",
                "non-zero without the key flag",
            ));
        }
        if key_len > KEY_BYTES_MAX {
            return Err(ProtocolError::invalid(
                "record.key_len",
                format!("{key_len} bytes, limit {KEY_BYTES_MAX}"),
            ));
        }
        if header_count > HEADERS_COUNT_MAX {
            return Err(ProtocolError::invalid(
                "record.header_count",
                format!("{header_count}, limit {HEADERS_COUNT_MAX}"),
            ));
        }
        let deliver_after_ms = if flags & FLAG_DELAY != 0 {
            let delay = reader.u64("record.deliver_after_ms")?;
            if delay > DELAY_MS_MAX {
                return Err(ProtocolError::invalid(
                    "record.deliver_after_ms",
                    format!("{delay} is above {DELAY_MS_MAX}"),
                ));
            }
            Some(delay)
        } else {
            None
        };
        let key = if flags & FLAG_KEY != 0 {
            let key_start = reader.position();
            reader.skip(key_len, "record.key")?;
            Some((key_start, key_start + key_len))
        } else {
            None
        };
        for _ in 0..header_count {
            let name_len = reader.u16("record.header.name_len")? as usize;
            if name_len == 0 || name_len > HEADER_BYTES_MAX {
                return Err(ProtocolError::invalid(
                    "record.header.name_len",
                    format!("must be 1..={HEADER_BYTES_MAX}"),
                ));
            }
            let name = reader.take(name_len, "record.header.name")?;
            std::str::from_utf8(name).map_err(|_| ProtocolError::InvalidUtf8 {
                field: "record.header.name",
            })?;
            let value_len = reader.u16("record.header.value_len")? as usize;
            if value_len > HEADER_BYTES_MAX {
                return Err(ProtocolError::invalid(
                    "record.header.value_len",
                    format!("limit {HEADER_BYTES_MAX}"),
                ));
            }
            let value = reader.take(value_len, "record.header.value")?;
            std::str::from_utf8(value).map_err(|_| ProtocolError::InvalidUtf8 {
                field: "record.header.value",
            })?;
        }
        reader.skip(body_len as usize, "record.body")?;
        Ok(RecordSpan {
            start,
            end: reader.position(),
            priority,
            deliver_after_ms,
            key,
            body_len,
        })
    }
}
