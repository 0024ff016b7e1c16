//! [`verify_partition`]: an offline, read-only check of every byte of one partition's files.
//!
//! Invariants:
//! - Read-only: it takes `&S` and only lists, stats and reads. Unlike [`crate::PartitionLog::open`]
//!   it never cuts a torn tail, rebuilds an index or removes an orphan; it says what open would do.
//! - Every entry of every segment is checked (length bounds, checksum, offset), not only the tail
//!   open scans. Damage in the middle of a segment does not stop the check: it resumes at the next
//!   valid entry, found the same way open tells a torn tail from corruption.
//! - Entries are parsed by the same code as the log's ([`ChunkReader::entry`]); index files are
//!   read point by point through the same bounded window, so memory does not depend on file sizes.
//! - Every loop is bounded: over segments by their count, over entries by the segment's length
//!   (each step advances by at least one entry header or one byte), over points by the index
//!   file's length.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use crate::format::{
    index_file_name, parse_file_name, segment_file_name, time_index_file_name, EntryHeader,
    FileKind, INDEX_POINT_BYTES, TIME_INDEX_POINT_BYTES,
};
use crate::log::{valid_entry_after, zero_tail, ChunkReader, READ_CHUNK_BYTES_MAX};
use crate::storage::LogStorage;

/// What to do about an index point open may not notice.
const REBUILD_HINT: &str = "open checks only an index's shape and last points and may keep it, \
    failing reads that seek through it; deleting this segment's .index and .timeindex makes open \
    rebuild both from the log";

/// Most findings listed about the points of one index file; past it one more finding says how
/// many points were not checked, so that a garbage index cannot flood the report.
const POINT_FINDINGS_PER_FILE_MAX: usize = 16;

/// What kind of damage a [`Finding`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FindingKind {
    /// Invalid bytes at the end of the last segment with no valid entry after them: what a crash
    /// in the middle of a write leaves. `PartitionLog::open` cuts them off.
    TornTail,
    /// Bytes that are not a valid entry (length out of bounds, checksum mismatch, runs past the
    /// end) where one must be. Open refuses the log, or a read reaching it fails.
    CorruptEntry,
    /// A valid entry whose offset is not the one its position implies (a hole or a repeat
    /// inside a segment). Open refuses the log.
    OffsetMismatch,
    /// A segment is missing: the offsets between two segments have a hole. Open refuses the log.
    MissingSegment,
    /// Two segments hold the same offsets. Open refuses the log.
    OverlappingSegments,
    /// An index file is missing. Open rebuilds it from the log.
    IndexMissing,
    /// An index file disagrees with its log or with the other index file (a point at the wrong
    /// byte, a wrong offset or timestamp, points past the end, a partial point). Open rebuilds an
    /// index it finds stale, but it checks only the files' shape and their last points: a wrong
    /// point in the middle survives open, and reads that seek through it fail. Deleting the
    /// segment's `.index` and `.timeindex` makes open rebuild both from the log.
    IndexMismatch,
    /// An index file without its segment. Open removes it.
    OrphanIndex,
}

impl FindingKind {
    /// A short stable name, for machine-readable output.
    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::TornTail => "torn-tail",
            FindingKind::CorruptEntry => "corrupt-entry",
            FindingKind::OffsetMismatch => "offset-mismatch",
            FindingKind::MissingSegment => "missing-segment",
            FindingKind::OverlappingSegments => "overlapping-segments",
            FindingKind::IndexMissing => "index-missing",
            FindingKind::IndexMismatch => "index-mismatch",
            FindingKind::OrphanIndex => "orphan-index",
        }
    }

    /// Whether `PartitionLog::open` repairs this by itself (cutting, rebuilding or removing
    /// files), as opposed to refusing the log or failing a read.
    pub fn repaired_on_open(self) -> bool {
        matches!(
            self,
            FindingKind::TornTail | FindingKind::IndexMissing | FindingKind::OrphanIndex
        )
    }
}

/// One thing found wrong: in which file, at which byte, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub kind: FindingKind,
    pub file: PathBuf,
    /// Byte position in `file` where the damage is (0 for a file that is missing as a whole).
    pub position: u64,
    /// Plain English, including what open would do about it.
    pub description: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at byte {}: {}",
            self.file.display(),
            self.position,
            self.description
        )
    }
}

/// What [`verify_partition`] found in one partition directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    pub dir: PathBuf,
    /// `.log` files.
    pub segments_count: usize,
    /// Valid entries (damaged ones are not counted).
    pub entries_count: u64,
    /// Bytes of all `.log` files, damaged bytes included.
    pub bytes: u64,
    /// Base offset of the first segment (0 without segments).
    pub start_offset: u64,
    /// The offset after the last valid entry of the last segment: what open would report.
    pub next_offset: u64,
    pub findings: Vec<Finding>,
}

impl VerifyReport {
    /// No finding at all.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }

    fn push(&mut self, kind: FindingKind, file: &Path, position: u64, description: String) {
        self.findings.push(Finding {
            kind,
            file: file.to_path_buf(),
            position,
            description,
        });
    }
}

/// Checks every entry of every segment in `dir` and both index files of each, without changing
/// anything. `Err` only for I/O errors (an unreadable directory or file); damage is reported in
/// [`VerifyReport::findings`]. A directory without segments is clean and empty.
pub fn verify_partition<S: LogStorage + ?Sized>(
    storage: &S,
    dir: &Path,
) -> io::Result<VerifyReport> {
    let mut report = VerifyReport {
        dir: dir.to_path_buf(),
        ..VerifyReport::default()
    };
    let bases = list_segments_reporting_orphans(storage, dir, &mut report)?;
    report.segments_count = bases.len();
    report.start_offset = bases.first().copied().unwrap_or(0);
    let mut previous: Option<SegmentChecked> = None;
    for (i, &base) in bases.iter().enumerate() {
        let log_path = dir.join(segment_file_name(base));
        if let Some(previous) = &previous {
            report_discontinuity(previous, base, &log_path, &mut report);
        }
        let is_last = i + 1 == bases.len();
        let checked = verify_segment(storage, dir, base, is_last, &mut report)?;
        report.next_offset = checked.next_offset;
        previous = Some(checked);
    }
    Ok(report)
}

/// The base offsets of the segments in `dir`, ascending; index files without their segment are
/// reported (open removes them).
fn list_segments_reporting_orphans<S: LogStorage + ?Sized>(
    storage: &S,
    dir: &Path,
    report: &mut VerifyReport,
) -> io::Result<Vec<u64>> {
    let mut bases = Vec::new();
    let mut index_files = Vec::new();
    for name in storage.list(dir)? {
        match parse_file_name(&name) {
            Some((base, FileKind::Segment)) => bases.push(base),
            Some((base, _)) => index_files.push((base, dir.join(&name))),
            None => {}
        }
    }
    bases.sort_unstable();
    index_files.sort();
    for (base, path) in &index_files {
        if bases.binary_search(base).is_err() {
            report.push(
                FindingKind::OrphanIndex,
                path,
                0,
                format!(
                    "index file without its segment {}; open removes it",
                    segment_file_name(*base)
                ),
            );
        }
    }
    Ok(bases)
}

/// A segment at `base` must start where `previous` ends: a gap is a lost segment (unless the
/// previous one ended in damage that hides its real end), an overlap puts offsets in both.
fn report_discontinuity(
    previous: &SegmentChecked,
    base: u64,
    log_path: &Path,
    report: &mut VerifyReport,
) {
    let previous_next = previous.next_offset;
    if base > previous_next && !previous.damaged_end {
        report.push(
            FindingKind::MissingSegment,
            log_path,
            0,
            format!(
                "segment starts at offset {base} but the previous segment, {}, ends at offset \
                 {previous_next}: offsets {previous_next}..{base} are missing (a lost or \
                 deleted segment); open refuses the log",
                previous.path.display()
            ),
        );
    } else if base < previous_next {
        report.push(
            FindingKind::OverlappingSegments,
            &previous.path,
            previous.len,
            format!(
                "segment ends at offset {previous_next} but the next segment, {}, starts at \
                 offset {base}: offsets {base}..{previous_next} are in both; open refuses the log",
                log_path.display()
            ),
        );
    }
}

/// What a segment's check found that the next segment's check needs.
struct SegmentChecked {
    path: PathBuf,
    len: u64,
    next_offset: u64,
    /// The scan stopped at damage it could not get past, so the segment's real end is unknown.
    damaged_end: bool,
}

/// Checks one segment: its two index files' shapes, then every entry in order with the index
/// points beside it, then the batch its last entries belong to, then the points left over.
fn verify_segment<S: LogStorage + ?Sized>(
    storage: &S,
    dir: &Path,
    base: u64,
    is_last: bool,
    report: &mut VerifyReport,
) -> io::Result<SegmentChecked> {
    let log_path = dir.join(segment_file_name(base));
    let index_path = dir.join(index_file_name(base));
    let time_index_path = dir.join(time_index_file_name(base));
    let log_len = storage.len(&log_path)?;
    report.bytes += log_len;

    let (index, time_index) = open_index_files(storage, &index_path, &time_index_path, report)?;
    let mut check = SegmentCheck {
        base,
        is_last,
        log_path: &log_path,
        log_len,
        reader: ChunkReader::new(&log_path, log_len, READ_CHUNK_BYTES_MAX),
        index,
        time_index,
        position: 0,
        expected: base,
        timestamp_ms_max: 0,
        damaged_end: false,
        batch_open: None,
    };
    check.check_entries(storage, report)?;
    check.check_last_batch(report);
    check.finish_index_files(storage, report)?;
    let (next_offset, damaged_end) = (check.expected, check.damaged_end);
    Ok(SegmentChecked {
        path: log_path,
        len: log_len,
        next_offset,
        damaged_end,
    })
}

/// Opens a segment's `.index` and `.timeindex` for the scan (`None` for a missing one, which is
/// reported). Both must hold a point at the same entries, so their counts must match.
fn open_index_files<'a, S: LogStorage + ?Sized>(
    storage: &S,
    index_path: &'a Path,
    time_index_path: &'a Path,
    report: &mut VerifyReport,
) -> io::Result<(Option<PointFile<'a>>, Option<PointFile<'a>>)> {
    let index = PointFile::open(storage, index_path, INDEX_POINT_BYTES, report)?;
    let time_index = PointFile::open(storage, time_index_path, TIME_INDEX_POINT_BYTES, report)?;
    if let (Some(a), Some(b)) = (&index, &time_index) {
        if a.count != b.count {
            report.push(
                FindingKind::IndexMismatch,
                time_index_path,
                0,
                format!(
                    "holds {} points but {} holds {}; both files have a point at the same \
                     entries; open rebuilds them",
                    b.count,
                    index_path.display(),
                    a.count
                ),
            );
        }
    }
    Ok((index, time_index))
}

/// The scan of one segment under verification: where it is in the log, and its index files read
/// alongside.
struct SegmentCheck<'a> {
    base: u64,
    is_last: bool,
    log_path: &'a Path,
    log_len: u64,
    reader: ChunkReader<'a>,
    index: Option<PointFile<'a>>,
    time_index: Option<PointFile<'a>>,
    /// Where the next entry starts.
    position: u64,
    /// The offset the next entry must have.
    expected: u64,
    timestamp_ms_max: u64,
    /// The scan stopped at damage it could not get past, so the segment's real end is unknown.
    damaged_end: bool,
    /// `(position, offset)` of the first entry of a batch whose last entry has not been seen.
    batch_open: Option<(u64, u64)>,
}

impl SegmentCheck<'_> {
    /// Checks every entry from the start, resuming after damage at the next valid entry.
    fn check_entries<S: LogStorage + ?Sized>(
        &mut self,
        storage: &S,
        report: &mut VerifyReport,
    ) -> io::Result<()> {
        // Bounded: each step advances `position` by a whole entry, or to a later valid entry, or
        // leaves the loop.
        while self.position < self.log_len {
            if self.position > u32::MAX as u64 {
                report.push(
                    FindingKind::CorruptEntry,
                    self.log_path,
                    self.position,
                    "segment is larger than the format allows (index positions are 32-bit); the \
                     rest is not checked"
                        .to_string(),
                );
                self.damaged_end = true;
                return Ok(());
            }
            let header = match self.reader.entry(storage, self.position)? {
                Ok(header) => header,
                // The room sync jobs keep past the active segment's entries: not damage.
                Err(_) if self.is_last && zero_tail(storage, &mut self.reader, self.position)? => {
                    return Ok(())
                }
                Err(reason) => {
                    if self.skip_damage(storage, reason, report)? {
                        continue;
                    }
                    return Ok(());
                }
            };
            self.check_offset(&header, report);
            self.check_points_at(storage, &header, report)?;
            report.entries_count += 1;
            if !header.batch_continues {
                self.batch_open = None;
            } else if self.batch_open.is_none() {
                self.batch_open = Some((self.position, self.expected));
            }
            self.position += header.entry_bytes();
            self.expected += 1;
        }
        Ok(())
    }

    /// Reports damage at `position` as open would judge it: a torn tail if nothing valid follows
    /// in the last segment, corruption otherwise. Returns whether the scan goes on, at the next
    /// valid entry, with the index points into the damaged bytes skipped.
    fn skip_damage<S: LogStorage + ?Sized>(
        &mut self,
        storage: &S,
        reason: String,
        report: &mut VerifyReport,
    ) -> io::Result<bool> {
        let (position, expected) = (self.position, self.expected);
        let Some(next) = valid_entry_after(storage, &mut self.reader, position, expected)? else {
            self.report_damage_to_end(reason, report);
            return Ok(false);
        };
        // A valid entry with an offset at or after the expected one.
        let resumed = self.reader.entry(storage, next)?.ok().map(|h| h.offset);
        let lost = match resumed {
            Some(offset) if offset == expected + 1 => {
                format!(" (the entry with offset {expected})")
            }
            Some(offset) if offset > expected => {
                format!(" (the entries with offsets {expected} to {})", offset - 1)
            }
            _ => String::new(),
        };
        report.push(
            FindingKind::CorruptEntry,
            self.log_path,
            position,
            format!(
                "{reason}; the {} bytes up to the next valid entry, at byte {next}, are \
                 unreadable{lost}; open refuses the log, or a read reaching it fails",
                next - position
            ),
        );
        if let Some(offset) = resumed {
            self.expected = offset;
        }
        // Points into the damaged bytes cannot be checked.
        if let Some(index) = &mut self.index {
            index.skip_below_position(storage, next)?;
        }
        if let (Some(time_index), Some(offset)) = (&mut self.time_index, resumed) {
            time_index.skip_below_offset(storage, offset.saturating_sub(self.base))?;
        }
        self.position = next;
        // Which batch the next entry belongs to is lost with the damage.
        self.batch_open = None;
        Ok(true)
    }

    /// Damage at the scan's position with no valid entry after it in the segment: a torn tail open
    /// cuts off if this is the last segment, else corruption that hides the segment's real end.
    fn report_damage_to_end(&mut self, reason: String, report: &mut VerifyReport) {
        let (position, expected) = (self.position, self.expected);
        let unchecked = self.log_len - position;
        if self.is_last {
            report.push(
                FindingKind::TornTail,
                self.log_path,
                position,
                format!(
                    "torn tail: {reason}, and no valid entry follows in the last segment; \
                     open cuts these {unchecked} bytes off (offsets from {expected} on, if \
                     any were there, are lost)"
                ),
            );
        } else {
            report.push(
                FindingKind::CorruptEntry,
                self.log_path,
                position,
                format!(
                    "{reason}; no valid entry follows in this closed segment ({unchecked} \
                     bytes unreadable); open refuses the log"
                ),
            );
            self.damaged_end = true;
        }
    }

    /// A valid entry with another offset than expected is not a torn write (its checksum holds):
    /// offsets are missing or repeated. The scan goes on from the entry's own offset.
    fn check_offset(&mut self, header: &EntryHeader, report: &mut VerifyReport) {
        let expected = self.expected;
        if header.offset == expected {
            return;
        }
        let what = if header.offset > expected {
            format!(
                "offsets {expected}..{} are missing before it",
                header.offset
            )
        } else {
            "it repeats an offset already in the log".to_string()
        };
        report.push(
            FindingKind::OffsetMismatch,
            self.log_path,
            self.position,
            format!(
                "entry has offset {} where {expected} was expected ({what}); its checksum is \
                 valid, so this is not a torn write; open refuses the log",
                header.offset
            ),
        );
        self.expected = header.offset;
    }

    /// Matches the entry just read with the points of both index files that reach it.
    fn check_points_at<S: LogStorage + ?Sized>(
        &mut self,
        storage: &S,
        header: &EntryHeader,
        report: &mut VerifyReport,
    ) -> io::Result<()> {
        self.timestamp_ms_max = self.timestamp_ms_max.max(header.timestamp_ms);
        let relative = self
            .expected
            .checked_sub(self.base)
            .and_then(|r| u32::try_from(r).ok());
        if let Some(index) = &mut self.index {
            index.check_entry(
                storage,
                self.log_path,
                self.base,
                self.position,
                relative,
                report,
            )?;
        }
        if let (Some(time_index), Some(relative)) = (&mut self.time_index, relative) {
            time_index.check_time_entry(
                storage,
                self.base,
                relative,
                self.timestamp_ms_max,
                report,
            )?;
        }
        Ok(())
    }

    /// A batch still open at the end of the scan has no last entry: a torn tail open cuts off in
    /// the last segment (the segment then ends at the batch's start), corruption in a closed one.
    /// Unknowable, and so not reported, when the scan stopped at damage.
    fn check_last_batch(&mut self, report: &mut VerifyReport) {
        let (Some((start, offset)), false) = (self.batch_open, self.damaged_end) else {
            return;
        };
        let entries = self.expected - offset;
        if self.is_last {
            report.push(
                FindingKind::TornTail,
                self.log_path,
                start,
                format!(
                    "unfinished batch: the batch from offset {offset} has {entries} entries and \
                     no last one (a crash stopped its write); open cuts it off from here, since \
                     a batch is stored whole or not at all"
                ),
            );
            self.expected = offset;
        } else {
            report.push(
                FindingKind::CorruptEntry,
                self.log_path,
                start,
                format!(
                    "the batch from offset {offset} has {entries} entries and no last one, in a \
                     closed segment (batches never span segments); open refuses the log"
                ),
            );
        }
    }

    /// Points left after the scan name bytes or offsets past the valid entries; and the two
    /// files must name the same entries point by point.
    fn finish_index_files<S: LogStorage + ?Sized>(
        &mut self,
        storage: &S,
        report: &mut VerifyReport,
    ) -> io::Result<()> {
        if let Some(index) = &mut self.index {
            index.finish_positions(self.log_path, self.position, report);
        }
        if let Some(time_index) = &mut self.time_index {
            time_index.finish_offsets(self.expected, self.base, report);
        }
        if let (Some(index), Some(time_index)) = (&mut self.index, &mut self.time_index) {
            check_files_agree(storage, index, time_index, self.base, report)?;
        }
        Ok(())
    }
}

/// One index file read point by point, in order, alongside the scan of its log.
struct PointFile<'a> {
    path: &'a Path,
    reader: ChunkReader<'a>,
    point_bytes: usize,
    /// Whole points in the file.
    count: u64,
    /// The first point not yet matched with an entry.
    next: u64,
    /// The last point read: `(relative_offset, position or timestamp)`.
    previous: Option<(u32, u64)>,
    findings: usize,
}

impl<'a> PointFile<'a> {
    fn open<S: LogStorage + ?Sized>(
        storage: &S,
        path: &'a Path,
        point_bytes: usize,
        report: &mut VerifyReport,
    ) -> io::Result<Option<Self>> {
        if !storage.exists(path) {
            report.push(
                FindingKind::IndexMissing,
                path,
                0,
                "index file is missing; open rebuilds it from the log".to_string(),
            );
            return Ok(None);
        }
        let len = storage.len(path)?;
        let partial = len % point_bytes as u64;
        if partial != 0 {
            report.push(
                FindingKind::IndexMismatch,
                path,
                len - partial,
                format!(
                    "file of {len} bytes ends in a partial point of {partial} bytes (points are \
                     {point_bytes} bytes); open rebuilds the index"
                ),
            );
        }
        let count = len / point_bytes as u64;
        Ok(Some(PointFile {
            path,
            reader: ChunkReader::new(path, count * point_bytes as u64, READ_CHUNK_BYTES_MAX),
            point_bytes,
            count,
            next: 0,
            previous: None,
            findings: 0,
        }))
    }

    /// The i-th point as `(relative_offset, position)` of an `.index`, or
    /// `(relative_offset, timestamp_ms)` of a `.timeindex`.
    fn point<S: LogStorage + ?Sized>(&mut self, storage: &S, i: u64) -> io::Result<(u32, u64)> {
        let bytes = self
            .reader
            .get(storage, i * self.point_bytes as u64, self.point_bytes)?;
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        Ok(if self.point_bytes == INDEX_POINT_BYTES {
            (u32_at(0), u32_at(4) as u64)
        } else {
            (
                u32_at(8),
                u64::from_le_bytes(bytes[0..8].try_into().expect("8")),
            )
        })
    }

    fn byte_of(&self, i: u64) -> u64 {
        i * self.point_bytes as u64
    }

    /// Records a finding about point `i`, up to the per-file limit.
    fn report_point(&mut self, report: &mut VerifyReport, i: u64, description: String) {
        self.findings += 1;
        if self.findings <= POINT_FINDINGS_PER_FILE_MAX {
            report.push(
                FindingKind::IndexMismatch,
                self.path,
                self.byte_of(i),
                format!("point {i}: {description}; {REBUILD_HINT}"),
            );
        }
    }

    /// `.index`: the entry at `position` (with `relative` offset, if it has one) was just read.
    /// Every point up to this position must sit exactly on an entry start with its offset.
    fn check_entry<S: LogStorage + ?Sized>(
        &mut self,
        storage: &S,
        log_path: &Path,
        base: u64,
        position: u64,
        relative: Option<u32>,
        report: &mut VerifyReport,
    ) -> io::Result<()> {
        let mut matched = false;
        // Bounded by the number of points.
        while self.next < self.count {
            let i = self.next;
            let (point_relative, point_position) = self.point(storage, i)?;
            if point_position > position {
                break;
            }
            let previous = self.previous.replace((point_relative, point_position));
            self.next += 1;
            if point_position < position {
                let why = match previous {
                    Some((r, p)) if point_relative <= r || point_position <= p => format!(
                        "(offset {}, byte {point_position}) is not after the previous point \
                         (offset {}, byte {p}); points must strictly increase",
                        base + point_relative as u64,
                        base + r as u64
                    ),
                    _ => format!(
                        "byte {point_position} of {} is not the start of an entry",
                        log_path.display()
                    ),
                };
                self.report_point(report, i, why);
                continue;
            }
            matched = true;
            if Some(point_relative) != relative {
                let actual = relative
                    .map(|r| (base + r as u64).to_string())
                    .unwrap_or_else(|| "an offset outside this segment".to_string());
                self.report_point(
                    report,
                    i,
                    format!(
                        "says offset {} is at byte {point_position}, but the entry there has \
                         offset {actual}",
                        base + point_relative as u64
                    ),
                );
            }
            break;
        }
        if position == 0 && !matched {
            self.report_point(
                report,
                self.next,
                "the first entry of the segment has no point (an index starts with offset \
                 0 at byte 0)"
                    .to_string(),
            );
        }
        Ok(())
    }

    /// `.index`: skips the points into damaged bytes before `position`; they cannot be checked.
    fn skip_below_position<S: LogStorage + ?Sized>(
        &mut self,
        storage: &S,
        position: u64,
    ) -> io::Result<()> {
        self.skip_while(storage, |point| point.1 < position)
    }

    /// `.timeindex`: skips the points naming offsets below `relative` (in damaged bytes).
    fn skip_below_offset<S: LogStorage + ?Sized>(
        &mut self,
        storage: &S,
        relative: u64,
    ) -> io::Result<()> {
        self.skip_while(storage, |point| (point.0 as u64) < relative)
    }

    /// Steps over points while `skip` holds for them; bounded by the point count.
    fn skip_while<S: LogStorage + ?Sized>(
        &mut self,
        storage: &S,
        skip: impl Fn(&(u32, u64)) -> bool,
    ) -> io::Result<()> {
        while self.next < self.count {
            let point = self.point(storage, self.next)?;
            if !skip(&point) {
                break;
            }
            self.previous = Some(point);
            self.next += 1;
        }
        Ok(())
    }

    /// `.timeindex`: the entry with `relative` offset was just read, and the largest timestamp of
    /// the segment up to and including it is `timestamp_ms_max`.
    fn check_time_entry<S: LogStorage + ?Sized>(
        &mut self,
        storage: &S,
        base: u64,
        relative: u32,
        timestamp_ms_max: u64,
        report: &mut VerifyReport,
    ) -> io::Result<()> {
        let mut matched = false;
        // Bounded by the number of points.
        while self.next < self.count {
            let i = self.next;
            let (point_relative, timestamp_ms) = self.point(storage, i)?;
            if point_relative > relative {
                break;
            }
            let previous = self.previous.replace((point_relative, timestamp_ms));
            self.next += 1;
            if let Some(problem) =
                time_point_order_problem(previous, (point_relative, timestamp_ms), base)
            {
                self.report_point(report, i, problem);
                continue;
            }
            if point_relative < relative {
                self.report_point(
                    report,
                    i,
                    format!(
                        "names offset {}, which is not an entry of this segment",
                        base + point_relative as u64
                    ),
                );
                continue;
            }
            matched = true;
            if timestamp_ms != timestamp_ms_max {
                self.report_point(
                    report,
                    i,
                    format!(
                        "says the newest timestamp up to offset {} is {timestamp_ms}, but the \
                         entries up to it have {timestamp_ms_max}",
                        base + relative as u64
                    ),
                );
            }
            break;
        }
        if relative == 0 && !matched {
            self.report_point(
                report,
                self.next,
                "the first entry of the segment has no point (a time index starts with offset \
                 0)"
                .to_string(),
            );
        }
        Ok(())
    }

    /// `.index`: the scan ended at `end` (after the last valid entry); points left over name
    /// bytes past it.
    fn finish_positions(&mut self, log_path: &Path, end: u64, report: &mut VerifyReport) {
        let left = self.count - self.next;
        if left > 0 {
            report.push(
                FindingKind::IndexMismatch,
                self.path,
                self.byte_of(self.next),
                format!(
                    "point {} and the {} points after it point at or past byte {end}, the end of \
                     the valid entries of {} (stale: left when the log lost its tail); open \
                     drops them",
                    self.next,
                    left - 1,
                    log_path.display()
                ),
            );
        }
        self.report_unlisted(report);
    }

    /// `.timeindex`: the scan ended before offset `next_offset`; points left over name offsets at
    /// or after it.
    fn finish_offsets(&mut self, next_offset: u64, base: u64, report: &mut VerifyReport) {
        let left = self.count - self.next;
        if left > 0 {
            report.push(
                FindingKind::IndexMismatch,
                self.path,
                self.byte_of(self.next),
                format!(
                    "point {} and the {} points after it name offsets the segment does not hold \
                     (its valid entries end before offset {}, or the points are out of order); \
                     {REBUILD_HINT}",
                    self.next,
                    left - 1,
                    next_offset.max(base)
                ),
            );
        }
        self.report_unlisted(report);
    }

    fn report_unlisted(&mut self, report: &mut VerifyReport) {
        if self.findings > POINT_FINDINGS_PER_FILE_MAX {
            report.push(
                FindingKind::IndexMismatch,
                self.path,
                0,
                format!(
                    "{} more points of this file disagree with the log and are not listed; \
                     {REBUILD_HINT}",
                    self.findings - POINT_FINDINGS_PER_FILE_MAX
                ),
            );
        }
    }
}

/// What is wrong with the order of a time index point `(relative_offset, timestamp_ms)` after
/// `previous`, if anything: timestamps are a running maximum and never decrease, and offsets
/// strictly increase.
fn time_point_order_problem(
    previous: Option<(u32, u64)>,
    (point_relative, timestamp_ms): (u32, u64),
    base: u64,
) -> Option<String> {
    let (r, t) = previous?;
    if timestamp_ms < t {
        return Some(format!(
            "timestamp {timestamp_ms} is below the previous point's {t}; time index timestamps \
             are a running maximum and never decrease"
        ));
    }
    if point_relative <= r {
        return Some(format!(
            "offset {} is not after the previous point's {}; points must strictly increase",
            base + point_relative as u64,
            base + r as u64
        ));
    }
    None
}

/// The i-th point of one index file must name the same entry as the i-th of the other. Reports
/// the first disagreement only.
fn check_files_agree<S: LogStorage + ?Sized>(
    storage: &S,
    index: &mut PointFile<'_>,
    time_index: &mut PointFile<'_>,
    base: u64,
    report: &mut VerifyReport,
) -> io::Result<()> {
    let count = index.count.min(time_index.count);
    // Bounded by the number of points.
    for i in 0..count {
        let (a, _) = index.point(storage, i)?;
        let (b, _) = time_index.point(storage, i)?;
        if a != b {
            report.push(
                FindingKind::IndexMismatch,
                time_index.path,
                time_index.byte_of(i),
                format!(
                    "point {i} names offset {} but point {i} of {} names offset {}; the two \
                     files must agree point by point; open rebuilds the index",
                    base + b as u64,
                    index.path.display(),
                    base + a as u64
                ),
            );
            break;
        }
    }
    Ok(())
}
