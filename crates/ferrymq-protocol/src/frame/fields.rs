//! Fields several frames share: names, page tokens, flag bytes and offset ranges.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::ProtocolError;
use crate::limits::{LIST_PAGE_BYTES_MAX, NAME_BYTES_MAX, RANGES_COUNT_MAX};
use crate::message::{OffsetRange, OFFSET_RANGE_BYTES};
use crate::wire::Reader;

pub(super) fn read_name(r: &mut Reader, field: &'static str) -> Result<String, ProtocolError> {
    let name = r.str16(field)?;
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(ProtocolError::invalid(
            field,
            format!("must be 1..={NAME_BYTES_MAX} bytes"),
        ));
    }
    Ok(name)
}

/// A page token of LIST_MESSAGES / MESSAGE_LIST: bytes16 of at most [`LIST_PAGE_BYTES_MAX`].
pub(super) fn read_page(r: &mut Reader, field: &'static str) -> Result<Bytes, ProtocolError> {
    let page = r.bytes16(field)?;
    if page.len() > LIST_PAGE_BYTES_MAX {
        return Err(ProtocolError::invalid(
            field,
            format!(
                "{} bytes, above the limit of {LIST_PAGE_BYTES_MAX}",
                page.len()
            ),
        ));
    }
    Ok(page)
}

pub(super) fn read_flags(
    r: &mut Reader,
    field: &'static str,
    known: u8,
) -> Result<u8, ProtocolError> {
    let flags = r.u8(field)?;
    if flags & !known != 0 {
        return Err(ProtocolError::invalid(
            field,
            format!("unknown bits 0x{flags:02x}"),
        ));
    }
    Ok(flags)
}

pub(super) fn encode_ranges(ranges: &[OffsetRange], buf: &mut BytesMut) {
    assert!(
        ranges.len() <= RANGES_COUNT_MAX as usize,
        "{} ranges exceed the protocol limit",
        ranges.len()
    );
    buf.reserve(4 + ranges.len() * OFFSET_RANGE_BYTES);
    buf.put_u32_le(ranges.len() as u32);
    for range in ranges {
        range.encode(buf);
    }
}

pub(super) fn decode_ranges(r: &mut Reader) -> Result<Vec<OffsetRange>, ProtocolError> {
    let count = r.u32("ranges.count")?;
    if count > RANGES_COUNT_MAX {
        return Err(ProtocolError::invalid(
            "ranges.count",
            format!("{count}, limit {RANGES_COUNT_MAX}"),
        ));
    }
    if (count as usize) * OFFSET_RANGE_BYTES > r.remaining() {
        return Err(ProtocolError::Truncated { field: "ranges" });
    }
    (0..count).map(|_| OffsetRange::decode(r)).collect()
}
