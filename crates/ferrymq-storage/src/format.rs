//! The on-disk format: entries of a segment, index points, file names. Pure functions, no I/O.
//!
//! Entry layout (little-endian), drawn in `docs/storage.md`:
//!
//! ```text
//! 0   u32  length         bytes after this field: 20 + record length
//! 4   u32  crc32c         of every byte after this field (offset, timestamp, record)
//! 8   u64  offset         bit 63: the batch continues after this entry (format version 2)
//! 16  u64  timestamp_ms
//! 24  ..   record bytes, exactly as published
//! ```
//!
//! Format version 2 marks batches: every entry of an appended batch but its last has bit 63 of
//! its offset field set. An entry without the bit ends its batch, so a version 1 log (which never
//! sets it: offsets stay far below 2^63) reads as a log of one-entry batches, unchanged.
//!
//! Invariants:
//! - An entry whose length is out of bounds or whose checksum does not match is never decoded
//!   into a record: [`check_entry`] refuses it with the reason.
//! - Index points are 8 bytes (`u32 relative_offset, u32 position`), time index points 12 bytes
//!   (`u64 timestamp_ms, u32 relative_offset`); both files are written at the same entries, so
//!   the i-th point of one matches the i-th point of the other.
//! - The batch bit is under the checksum, so damage cannot make a whole batch look unfinished
//!   (or finished) without failing the checksum.

use ferrymq_protocol::limits::{MESSAGE_BODY_BYTES_CEILING, RECORD_OVERHEAD_BYTES_MAX};

/// Bytes before the record: length, crc, offset, timestamp.
pub const ENTRY_HEADER_BYTES: usize = 24;
/// Bytes covered by `length` besides the record: crc, offset, timestamp.
pub const ENTRY_LENGTH_OVERHEAD_BYTES: u32 = 20;

/// Largest record an entry may carry: the largest message the protocol can ever accept (body at
/// its configurable ceiling plus a record's overhead at its maxima). A length field claiming more
/// is damage, not data, which is what lets recovery tell garbage from a record.
pub const RECORD_BYTES_MAX: usize = RECORD_OVERHEAD_BYTES_MAX + MESSAGE_BODY_BYTES_CEILING as usize;

const _: () = assert!(RECORD_BYTES_MAX + ENTRY_HEADER_BYTES <= u32::MAX as usize);

/// The entry format this crate writes. Version 1 had no batch bit; its logs are read unchanged.
pub const ENTRY_FORMAT_VERSION: u32 = 2;

/// Bit of the offset field set on every entry of a batch but its last.
pub const BATCH_CONTINUES_BIT: u64 = 1 << 63;

/// Bytes of one offset index point.
pub const INDEX_POINT_BYTES: usize = 8;
/// Bytes of one time index point.
pub const TIME_INDEX_POINT_BYTES: usize = 12;

/// The fixed part of an entry, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryHeader {
    /// Bytes after the length field.
    pub length: u32,
    pub crc: u32,
    /// The entry's offset, without the batch bit.
    pub offset: u64,
    pub timestamp_ms: u64,
    /// More entries of the same appended batch follow this one.
    pub batch_continues: bool,
}

impl EntryHeader {
    /// Bytes of the whole entry on disk.
    pub fn entry_bytes(&self) -> u64 {
        4 + self.length as u64
    }

    pub fn record_bytes(&self) -> usize {
        (self.length - ENTRY_LENGTH_OVERHEAD_BYTES) as usize
    }
}

/// Bytes an entry with a record of `record_len` takes on disk.
pub fn entry_bytes(record_len: usize) -> usize {
    ENTRY_HEADER_BYTES + record_len
}

/// Appends one entry to `buf`, the last of its batch. The record must not exceed
/// [`RECORD_BYTES_MAX`] (checked by the caller, which returns an error to its own caller).
#[cfg(test)]
pub fn encode_entry(buf: &mut Vec<u8>, offset: u64, timestamp_ms: u64, record: &[u8]) {
    encode_batch_entry(buf, offset, timestamp_ms, record, false);
}

/// Appends one entry to `buf`; `batch_continues` marks every entry of a batch but its last, so
/// that recovery can cut a batch a crash left unfinished.
pub fn encode_batch_entry(
    buf: &mut Vec<u8>,
    offset: u64,
    timestamp_ms: u64,
    record: &[u8],
    batch_continues: bool,
) {
    assert!(record.len() <= RECORD_BYTES_MAX, "record over the limit");
    assert!(offset & BATCH_CONTINUES_BIT == 0, "offset below 2^63");
    let length = ENTRY_LENGTH_OVERHEAD_BYTES + record.len() as u32;
    let start = buf.len();
    let offset_field = if batch_continues {
        offset | BATCH_CONTINUES_BIT
    } else {
        offset
    };
    buf.extend_from_slice(&length.to_le_bytes());
    buf.extend_from_slice(&[0u8; 4]);
    buf.extend_from_slice(&offset_field.to_le_bytes());
    buf.extend_from_slice(&timestamp_ms.to_le_bytes());
    buf.extend_from_slice(record);
    let crc = crc32c::crc32c(&buf[start + 8..]);
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes the 24-byte header and checks its length bounds. `Err` carries the reason.
pub fn decode_header(bytes: &[u8; ENTRY_HEADER_BYTES]) -> Result<EntryHeader, String> {
    let length = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    let crc = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    let offset_field = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let timestamp_ms = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
    if length < ENTRY_LENGTH_OVERHEAD_BYTES
        || length as usize > ENTRY_LENGTH_OVERHEAD_BYTES as usize + RECORD_BYTES_MAX
    {
        return Err(format!("entry length {length} out of bounds"));
    }
    Ok(EntryHeader {
        length,
        crc,
        offset: offset_field & !BATCH_CONTINUES_BIT,
        timestamp_ms,
        batch_continues: offset_field & BATCH_CONTINUES_BIT != 0,
    })
}

/// Checks the checksum of a whole entry (`bytes` starts at its length field and holds exactly
/// `header.entry_bytes()` bytes).
pub fn check_entry(header: &EntryHeader, bytes: &[u8]) -> Result<(), String> {
    assert_eq!(bytes.len() as u64, header.entry_bytes());
    let actual = crc32c::crc32c(&bytes[8..]);
    if actual != header.crc {
        return Err(format!(
            "checksum mismatch (stored {:#010x}, computed {actual:#010x})",
            header.crc
        ));
    }
    Ok(())
}

/// Tries to decode a whole, valid entry at the start of `bytes`: header, bounds, checksum.
#[cfg(test)]
pub fn decode_entry(bytes: &[u8]) -> Result<EntryHeader, String> {
    let Some(head) = bytes.get(..ENTRY_HEADER_BYTES) else {
        return Err("incomplete entry header".to_string());
    };
    let header = decode_header(head.try_into().expect("24 bytes"))?;
    let Some(whole) = bytes.get(..header.entry_bytes() as usize) else {
        return Err(format!(
            "entry of {} bytes runs past the end",
            header.entry_bytes()
        ));
    };
    check_entry(&header, whole)?;
    Ok(header)
}

/// One sparse index point: the entry at `relative_offset` starts at byte `position`, and every
/// entry up to it has a timestamp at most `timestamp_ms_max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexPoint {
    pub relative_offset: u32,
    pub position: u32,
    pub timestamp_ms_max: u64,
}

pub fn encode_index_point(buf: &mut Vec<u8>, point: &IndexPoint) {
    buf.extend_from_slice(&point.relative_offset.to_le_bytes());
    buf.extend_from_slice(&point.position.to_le_bytes());
}

pub fn encode_time_index_point(buf: &mut Vec<u8>, point: &IndexPoint) {
    buf.extend_from_slice(&point.timestamp_ms_max.to_le_bytes());
    buf.extend_from_slice(&point.relative_offset.to_le_bytes());
}

/// Decodes both index files into points. `None` if they disagree with each other or are not
/// strictly increasing: such indexes are rebuilt from the log rather than trusted.
pub fn decode_index(index: &[u8], time_index: &[u8]) -> Option<Vec<IndexPoint>> {
    if index.len() % INDEX_POINT_BYTES != 0 || time_index.len() % TIME_INDEX_POINT_BYTES != 0 {
        return None;
    }
    let count = index.len() / INDEX_POINT_BYTES;
    if time_index.len() / TIME_INDEX_POINT_BYTES != count {
        return None;
    }
    let mut points: Vec<IndexPoint> = Vec::with_capacity(count);
    for i in 0..count {
        let a = &index[i * INDEX_POINT_BYTES..(i + 1) * INDEX_POINT_BYTES];
        let b = &time_index[i * TIME_INDEX_POINT_BYTES..(i + 1) * TIME_INDEX_POINT_BYTES];
        let point = IndexPoint {
            relative_offset: u32::from_le_bytes(a[0..4].try_into().expect("4 bytes")),
            position: u32::from_le_bytes(a[4..8].try_into().expect("4 bytes")),
            timestamp_ms_max: u64::from_le_bytes(b[0..8].try_into().expect("8 bytes")),
        };
        let time_relative = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
        if time_relative != point.relative_offset {
            return None;
        }
        if let Some(last) = points.last() {
            if point.relative_offset <= last.relative_offset
                || point.position <= last.position
                || point.timestamp_ms_max < last.timestamp_ms_max
            {
                return None;
            }
        } else if point.relative_offset != 0 || point.position != 0 {
            // The first entry of a segment is always indexed.
            return None;
        }
        points.push(point);
    }
    Some(points)
}

/// `{base_offset:020}.log`, `.index`, `.timeindex`.
pub fn segment_file_name(base_offset: u64) -> String {
    format!("{base_offset:020}.log")
}
pub fn index_file_name(base_offset: u64) -> String {
    format!("{base_offset:020}.index")
}
pub fn time_index_file_name(base_offset: u64) -> String {
    format!("{base_offset:020}.timeindex")
}

/// What kind of log file a name is, and its base offset; `None` for names that are not ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Segment,
    Index,
    TimeIndex,
}

pub fn parse_file_name(name: &str) -> Option<(u64, FileKind)> {
    let (stem, extension) = name.split_once('.')?;
    let kind = match extension {
        "log" => FileKind::Segment,
        "index" => FileKind::Index,
        "timeindex" => FileKind::TimeIndex,
        _ => return None,
    };
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stem.parse().ok()?, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_layout_is_byte_exact() {
        let mut buf = Vec::new();
        encode_entry(&mut buf, 0x0102, 0x0a0b, b"xy");
        assert_eq!(buf.len(), 26);
        assert_eq!(&buf[0..4], &22u32.to_le_bytes());
        assert_eq!(&buf[8..16], &0x0102u64.to_le_bytes());
        assert_eq!(&buf[16..24], &0x0a0bu64.to_le_bytes());
        assert_eq!(&buf[24..], b"xy");
        let crc = crc32c::crc32c(&buf[8..]);
        assert_eq!(&buf[4..8], &crc.to_le_bytes());
        let header = decode_entry(&buf).unwrap();
        assert_eq!(header.offset, 0x0102);
        assert_eq!(header.timestamp_ms, 0x0a0b);
        assert_eq!(header.record_bytes(), 2);
        assert!(!header.batch_continues);
    }

    #[test]
    fn batch_bit_is_bit_63_of_the_offset_and_under_the_checksum() {
        let mut buf = Vec::new();
        encode_batch_entry(&mut buf, 0x0102, 0x0a0b, b"xy", true);
        assert_eq!(&buf[8..16], &(0x0102u64 | 1 << 63).to_le_bytes());
        let header = decode_entry(&buf).unwrap();
        assert_eq!(header.offset, 0x0102);
        assert!(header.batch_continues);
        // Clearing the bit without fixing the checksum is damage, not a finished batch.
        buf[15] &= 0x7f;
        assert!(decode_entry(&buf).is_err());
    }

    #[test]
    fn any_flipped_bit_is_refused() {
        let mut buf = Vec::new();
        encode_entry(&mut buf, 7, 9, b"some record bytes");
        for bit in 0..buf.len() * 8 {
            let mut damaged = buf.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            match decode_entry(&damaged) {
                Err(_) => {}
                // A flip in the length's high bits may still be in bounds but must then run
                // past the end or fail the checksum; nothing decodes as valid.
                Ok(h) => panic!("bit {bit} decoded as {h:?}"),
            }
        }
    }

    #[test]
    fn lengths_out_of_bounds_are_refused() {
        let mut head = [0u8; ENTRY_HEADER_BYTES];
        head[0..4].copy_from_slice(&19u32.to_le_bytes());
        assert!(decode_header(&head).is_err());
        head[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode_header(&head).is_err());
        assert!(decode_entry(&[0u8; 10]).is_err());
    }

    #[test]
    fn index_files_must_agree_and_increase() {
        let points = [
            IndexPoint {
                relative_offset: 0,
                position: 0,
                timestamp_ms_max: 5,
            },
            IndexPoint {
                relative_offset: 10,
                position: 4096,
                timestamp_ms_max: 5,
            },
        ];
        let (mut index, mut time_index) = (Vec::new(), Vec::new());
        for p in &points {
            encode_index_point(&mut index, p);
            encode_time_index_point(&mut time_index, p);
        }
        assert_eq!(decode_index(&index, &time_index).unwrap(), points);
        assert!(decode_index(&index[..8], &time_index).is_none());
        assert!(decode_index(&index[..7], &time_index[..12]).is_none());
        let mut swapped = index[8..].to_vec();
        swapped.extend_from_slice(&index[..8]);
        assert!(decode_index(&swapped, &time_index).is_none());
        assert_eq!(decode_index(&[], &[]).unwrap(), vec![]);
    }

    #[test]
    fn file_names_roundtrip() {
        assert_eq!(segment_file_name(42), "00000000000000000042.log");
        assert_eq!(
            parse_file_name("00000000000000000042.timeindex"),
            Some((42, FileKind::TimeIndex))
        );
        assert_eq!(
            parse_file_name(&index_file_name(u64::MAX)),
            Some((u64::MAX, FileKind::Index))
        );
        assert_eq!(parse_file_name("42.log"), None);
        assert_eq!(parse_file_name("0000000000000000004x.log"), None);
        assert_eq!(parse_file_name("00000000000000000042.tmp"), None);
    }
}
