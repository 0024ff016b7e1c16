//! [`PartitionLog`]: the segmented, append-only log of one partition.
//!
//! Invariants:
//! - Offsets are dense: segment `i + 1` starts at the offset after the last entry of segment `i`,
//!   and inside a segment every entry's offset is its predecessor's plus one.
//! - Only the last segment (the active one) is ever written. A segment is synced before the next
//!   one is created, so a crash can only tear the tail of the active segment; damage anywhere else
//!   is corruption, reported with file and byte position and never served.
//! - `bytes` of a segment is the length of its valid entries; nothing past it is read.
//! - Index points are a cache of the log: each is checked against the entry it points at before
//!   recovery relies on it, reads check every entry they return, and any index that disagrees with
//!   its log is rebuilt from the log.
//! - No entry is kept in memory: reads go to the files through the [`LogStorage`] seam. Only the
//!   active segment's index points are in memory; closed segments are searched in their index
//!   files (a binary search, one small read per probe), so memory does not grow with the backlog.
//! - Every loop is bounded: over segments by their count, over entries by the byte length being
//!   scanned (each step advances at least one entry header), over index points by their count.
//! - With deferred writes ([`PartitionLog::defer_writes`]) the active segment's bookkeeping runs
//!   ahead of its file: entries past `Deferred::in_file` are encoded in memory or being written
//!   by a sync job, and are never read. Jobs write in the order they began, each after the
//!   previous one's writes, so the file never has a hole; a roll writes whatever is left before
//!   it closes the segment. A job whose writes fail cuts them back; the jobs after it write
//!   nothing.
//! - A batch (one `append`) is all or nothing across a crash: it is never split between segments,
//!   every entry of it but the last carries the batch bit, and open cuts a batch whose last entry
//!   is missing. Index points sit only on a batch's first entry, so a scan from a point always
//!   starts at a batch boundary.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use bytes::Bytes;

use crate::config::{LogConfig, BATCH_BYTES_MAX};
use crate::error::LogError;
use crate::format::{
    check_entry, decode_header, decode_index, encode_batch_entry, encode_index_point,
    encode_time_index_point, entry_bytes, index_file_name, parse_file_name, segment_file_name,
    time_index_file_name, EntryHeader, FileKind, IndexPoint, ENTRY_HEADER_BYTES, INDEX_POINT_BYTES,
    RECORD_BYTES_MAX, TIME_INDEX_POINT_BYTES,
};
use crate::storage::{AppendFn, LogStorage, SyncFn, WriteFn};

/// Most bytes read from a segment at once: large enough that a scan of small entries is a few
/// reads, small enough to keep per-read memory modest. Reads that want less read less.
pub(crate) const READ_CHUNK_BYTES_MAX: usize = 64 * 1024;
/// Fewest bytes read at once: a page, below which more calls cost more than the copy saves.
const READ_CHUNK_BYTES_MIN: usize = 4096;

/// Room a sync job keeps written past the active segment's entries (zeros), so that the
/// fdatasync of the next jobs does not change the file's size and need not write its inode: on
/// ext4 that halves the device writes of a small group commit (see [`LogStorage::write_later`]).
/// An eighth of the segment's entries, between these bounds: a partition written now and then
/// keeps 16 KiB of zeros on disk, a busy one 1 MiB (reached at 8 MiB of entries).
const ROOM_BYTES_MIN: u64 = 16 * 1024;
const ROOM_BYTES_MAX: u64 = 1 << 20;
/// Largest job that keeps room. Room costs its own bytes on the disk once, and saves one inode
/// write per sync: worth it for small groups (the inode write is a round trip to the disk, as
/// dear as writing some 16 KiB), not for large ones, which are bound by the disk's bandwidth.
const ROOM_JOB_BYTES_MAX: usize = 16 * 1024;

/// Index points recovery checks against the log, from the last one backwards, before it gives up
/// on an index and rebuilds it from the log. A crash leaves at most a few stale points at the end.
const INDEX_VERIFY_ATTEMPTS_MAX: usize = 8;

/// One entry as read back from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEntry {
    pub offset: u64,
    pub timestamp_ms: u64,
    /// The record bytes exactly as they were appended.
    pub record: Bytes,
}

/// A torn or garbage tail cut off the last segment on open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncation {
    pub file: PathBuf,
    /// Where the first invalid byte was, which is the file's new length.
    pub position: u64,
    pub bytes_dropped: u64,
    pub reason: String,
}

/// Damaged entries a read cannot get past: see [`PartitionLog::damage_at`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub file: PathBuf,
    /// Byte position of the first damaged entry in `file`.
    pub position: u64,
    pub reason: String,
    /// The first offset that cannot be read.
    pub first_offset: u64,
    /// The first offset after the damage that can be read again.
    pub end_offset: u64,
}

/// What [`PartitionLog::open`] found and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub segments_count: usize,
    pub start_offset: u64,
    pub next_offset: u64,
    pub truncation: Option<Truncation>,
    /// Index files that were missing or disagreed with their log and were rewritten.
    pub indexes_rebuilt: Vec<PathBuf>,
    /// Index files without a segment, removed (left by a crash or a half-finished deletion).
    pub orphans_removed: Vec<PathBuf>,
}

#[derive(Debug)]
struct Segment {
    base_offset: u64,
    /// One past the last entry.
    next_offset: u64,
    /// Length of the valid entries.
    bytes: u64,
    /// Index points in memory: those of the active segment (appends extend them) and of a segment
    /// being recovered. Empty for a closed segment, whose points are looked up in its files.
    points: Vec<IndexPoint>,
    /// For a closed segment, how many points its index files hold (checked on open or written
    /// by this process); `None` while the points are in memory.
    points_on_disk_count: Option<u64>,
    timestamp_ms_max: u64,
    log_path: PathBuf,
    index_path: PathBuf,
    time_index_path: PathBuf,
}

impl Segment {
    fn new(dir: &Path, base_offset: u64) -> Self {
        Segment {
            base_offset,
            next_offset: base_offset,
            bytes: 0,
            points: Vec::new(),
            points_on_disk_count: None,
            timestamp_ms_max: 0,
            log_path: dir.join(segment_file_name(base_offset)),
            index_path: dir.join(index_file_name(base_offset)),
            time_index_path: dir.join(time_index_file_name(base_offset)),
        }
    }

    fn is_empty(&self) -> bool {
        self.next_offset == self.base_offset
    }

    /// Timestamp of the first entry: the first index point is always the first entry.
    fn timestamp_ms_first(&self) -> Option<u64> {
        self.points.first().map(|p| p.timestamp_ms_max)
    }

    /// Moves a closed segment's points out of memory: its index files hold exactly these.
    fn close_points(&mut self) {
        self.points_on_disk_count = Some(self.points.len() as u64);
        self.points = Vec::new();
    }

    /// What recovery guarantees of a segment before the log relies on it: its valid bytes are in
    /// its file, it holds entries exactly when it has bytes, and its points start at its first
    /// entry and strictly increase, all before `bytes` (a scan from any of them starts at an
    /// entry).
    fn assert_recovered(&self, file_len: u64) {
        assert!(self.bytes <= file_len, "valid bytes past the file's end");
        assert!(self.next_offset >= self.base_offset);
        assert_eq!(self.is_empty(), self.bytes == 0);
        assert_eq!(self.points.is_empty(), self.bytes == 0);
        if let Some(first) = self.points.first() {
            assert_eq!((first.relative_offset, first.position), (0, 0));
        }
        for pair in self.points.windows(2) {
            assert!(pair[0].relative_offset < pair[1].relative_offset);
            assert!(pair[0].position < pair[1].position);
        }
        if let Some(last) = self.points.last() {
            assert!((last.position as u64) < self.bytes);
            assert!(self.base_offset + (last.relative_offset as u64) < self.next_offset);
        }
    }

    fn points_count(&self) -> u64 {
        self.points_on_disk_count
            .unwrap_or(self.points.len() as u64)
    }

    /// The i-th point's `(relative_offset, position)`, from memory or from the index file.
    fn point_at<S: LogStorage + ?Sized>(&self, storage: &S, i: u64) -> std::io::Result<(u32, u32)> {
        if self.points_on_disk_count.is_none() {
            let point = self.points[i as usize];
            return Ok((point.relative_offset, point.position));
        }
        let mut buf = [0u8; INDEX_POINT_BYTES];
        storage.read_at(&self.index_path, i * INDEX_POINT_BYTES as u64, &mut buf)?;
        let relative_offset = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
        let position = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
        Ok((relative_offset, position))
    }

    /// The i-th point's running maximum timestamp, from memory or from the time index file.
    fn point_timestamp_ms_max<S: LogStorage + ?Sized>(
        &self,
        storage: &S,
        i: u64,
    ) -> std::io::Result<u64> {
        if self.points_on_disk_count.is_none() {
            return Ok(self.points[i as usize].timestamp_ms_max);
        }
        let mut buf = [0u8; 8];
        storage.read_at(
            &self.time_index_path,
            i * TIME_INDEX_POINT_BYTES as u64,
            &mut buf,
        )?;
        Ok(u64::from_le_bytes(buf))
    }

    /// The number of points for which `below` holds, assuming it holds for a prefix of them
    /// (a binary search; at most 64 probes, each a read of one point for a closed segment).
    fn partition_points<S: LogStorage + ?Sized>(
        &self,
        storage: &S,
        mut below: impl FnMut(&S, u64) -> std::io::Result<bool>,
    ) -> std::io::Result<u64> {
        let (mut low, mut high) = (0u64, self.points_count());
        // Bounded: the range halves each step, and a u64 range halves at most 64 times.
        for _ in 0..64 {
            if low >= high {
                break;
            }
            let middle = low + (high - low) / 2;
            if below(storage, middle)? {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        Ok(low)
    }

    /// The index point at or before `offset` (which must be in this segment), as the point's
    /// index, its offset and its position.
    fn seek<S: LogStorage + ?Sized>(
        &self,
        storage: &S,
        offset: u64,
    ) -> Result<IndexPoint, LogError> {
        assert!(offset >= self.base_offset && offset < self.next_offset);
        let relative = (offset - self.base_offset) as u32;
        let after = self.partition_points(storage, |storage, i| {
            Ok(self.point_at(storage, i)?.0 <= relative)
        })?;
        let (relative_offset, position) = match after.checked_sub(1) {
            Some(i) => self.point_at(storage, i)?,
            // Only a damaged index file lacks the point at the first entry; scanning from the
            // start of the segment is then still correct.
            None => (0, 0),
        };
        if relative_offset > relative {
            return Err(LogError::Corrupt {
                file: self.index_path.clone(),
                position: after.saturating_sub(1) * INDEX_POINT_BYTES as u64,
                reason: format!(
                    "index points are out of order near offset {offset}; reopen the log to rebuild it"
                ),
            });
        }
        Ok(IndexPoint {
            relative_offset,
            position,
            timestamp_ms_max: 0,
        })
    }
}

/// A window over one file so that scans read in chunks rather than one call per entry.
pub(crate) struct ChunkReader<'a> {
    path: &'a Path,
    /// Bytes that may be read: the file's length or the segment's valid length.
    pub(crate) len: u64,
    /// Bytes to read when the window moves (more if one entry needs more).
    chunk_bytes: usize,
    start: u64,
    buf: Vec<u8>,
}

impl<'a> ChunkReader<'a> {
    pub(crate) fn new(path: &'a Path, len: u64, chunk_bytes: usize) -> Self {
        ChunkReader {
            path,
            len,
            chunk_bytes: chunk_bytes.clamp(READ_CHUNK_BYTES_MIN, READ_CHUNK_BYTES_MAX),
            start: 0,
            buf: Vec::new(),
        }
    }

    pub(crate) fn get<S: LogStorage + ?Sized>(
        &mut self,
        storage: &S,
        position: u64,
        bytes: usize,
    ) -> std::io::Result<&[u8]> {
        assert!(position + bytes as u64 <= self.len, "read past the window");
        let end = position + bytes as u64;
        if position < self.start || end > self.start + self.buf.len() as u64 {
            let want = (bytes.max(self.chunk_bytes) as u64).min(self.len - position) as usize;
            // A fresh zeroed buffer (calloc) rather than `resize`, which fills byte by byte.
            self.buf = vec![0u8; want];
            storage.read_at(self.path, position, &mut self.buf)?;
            self.start = position;
        }
        let at = (position - self.start) as usize;
        Ok(&self.buf[at..at + bytes])
    }

    /// The valid entry at `position`, or the reason there is none.
    pub(crate) fn entry<S: LogStorage + ?Sized>(
        &mut self,
        storage: &S,
        position: u64,
    ) -> std::io::Result<Result<EntryHeader, String>> {
        let left = self.len.saturating_sub(position);
        if left < ENTRY_HEADER_BYTES as u64 {
            return Ok(Err(format!("incomplete entry header: {left} bytes left")));
        }
        let head: [u8; ENTRY_HEADER_BYTES] = self
            .get(storage, position, ENTRY_HEADER_BYTES)?
            .try_into()
            .expect("24 bytes");
        let header = match decode_header(&head) {
            Ok(header) => header,
            Err(reason) => return Ok(Err(reason)),
        };
        if header.entry_bytes() > left {
            return Ok(Err(format!(
                "entry of {} bytes runs past the end ({left} bytes left)",
                header.entry_bytes()
            )));
        }
        let whole = self.get(storage, position, header.entry_bytes() as usize)?;
        Ok(check_entry(&header, whole).map(|()| header))
    }
}

/// The base offsets of the segments in `dir`, ascending. Index files without their segment (left
/// by a crash or a half-finished deletion) are removed: no reader can use them, and recovery
/// then meets only whole segments.
fn list_segments_removing_orphans<S: LogStorage + ?Sized>(
    storage: &mut S,
    dir: &Path,
    report: &mut RecoveryReport,
) -> Result<Vec<u64>, LogError> {
    let mut logs = Vec::new();
    let mut index_files = Vec::new();
    for name in storage.list(dir)? {
        match parse_file_name(&name) {
            Some((base, FileKind::Segment)) => logs.push(base),
            Some((base, _)) => index_files.push((base, dir.join(&name))),
            None => {}
        }
    }
    logs.sort_unstable();
    for (base, path) in index_files {
        if logs.binary_search(&base).is_err() {
            storage.remove(&path)?;
            tracing::warn!(file = %path.display(), "removed an index file without its segment");
            report.orphans_removed.push(path);
        }
    }
    Ok(logs)
}

/// Where a scan stopped and what it saw.
struct Scan {
    next_offset: u64,
    /// Position after the last valid entry.
    end: u64,
    timestamp_ms_max: u64,
    /// Damage at `end`: the reason, and whether it is certainly corruption (a valid checksum with
    /// the wrong offset) rather than possibly a torn write.
    damage: Option<(String, bool)>,
    /// The last valid entry carries the batch bit: the batch it belongs to has no end before
    /// `end`, and this is where it started.
    unfinished: Option<BatchStart>,
}

/// Where a batch starts, and the scan's state before it: what the log is cut back to when the
/// batch turns out to be unfinished.
#[derive(Debug, Clone, Copy)]
struct BatchStart {
    position: u64,
    offset: u64,
    timestamp_ms_max: u64,
    points_count: usize,
}

/// Where a scan starts: an entry's position, the offset it must have, and the running maximum
/// timestamp before it; and the index point it starts from, if any.
struct ScanStart {
    position: u64,
    expected_offset: u64,
    timestamp_ms_max: u64,
    /// The confirmed index point at `position`, given back to the first entry as its point. The
    /// interval rule would add it again from the point before, but open does not check the
    /// points before the last one: a damaged earlier point would make the rule drop the confirmed
    /// one, and the next open would scan from further back, across entries this open never read.
    point: Option<IndexPoint>,
}

/// Scans `reader` from `start`, appending index points to `points` under the interval rule,
/// until the end or the first invalid entry.
fn scan<S: LogStorage + ?Sized>(
    storage: &S,
    reader: &mut ChunkReader<'_>,
    base_offset: u64,
    start: ScanStart,
    points: &mut Vec<IndexPoint>,
    index_interval_bytes: u32,
) -> std::io::Result<Scan> {
    let mut state = ScanState::new(start, points.len());
    // Bounded: each step advances `position` by at least one entry header, towards `reader.len`.
    while state.position < reader.len {
        if let Some(damage) = state.position_damage() {
            return Ok(state.finish(Some(damage)));
        }
        // The header is taken straight out of `entry`'s result and not passed on in another
        // one: moving it through nested results cost a quarter more CPU in recovery_time.
        let header = match reader.entry(storage, state.position)? {
            Ok(header) => header,
            Err(reason) => return Ok(state.finish(Some((reason, false)))),
        };
        if let Some(damage) = state.offset_damage(&header) {
            return Ok(state.finish(Some(damage)));
        }
        state.accept(&header, base_offset, points, index_interval_bytes);
    }
    Ok(state.finish(None))
}

/// A scan between entries: where the next one must be and which offset it must have, and the
/// batch the entries so far belong to.
struct ScanState {
    position: u64,
    expected_offset: u64,
    timestamp_ms_max: u64,
    /// Where the current batch started; meaningful while `batch_open`.
    batch: BatchStart,
    /// The last entry accepted carries the batch bit: its batch has more entries to come.
    batch_open: bool,
    /// The point the scan started from, until the first entry takes it back.
    start_point: Option<IndexPoint>,
}

// The scan is the hot loop of recovery (every entry of a segment whose index is rebuilt), and it
// is instantiated in the caller's crate for its storage type: without `#[inline]` these steps
// stay calls across crates, and the state lives in memory instead of registers.
impl ScanState {
    #[inline]
    fn new(start: ScanStart, points_count: usize) -> Self {
        ScanState {
            position: start.position,
            expected_offset: start.expected_offset,
            timestamp_ms_max: start.timestamp_ms_max,
            batch: BatchStart {
                position: start.position,
                offset: start.expected_offset,
                timestamp_ms_max: start.timestamp_ms_max,
                points_count,
            },
            batch_open: false,
            start_point: start.point,
        }
    }

    /// Damage is a reason and whether it is certainly corruption rather than possibly a torn
    /// write. Index points hold u32 positions, and this log never writes a segment past them, so
    /// an entry beyond is certainly not its own.
    #[inline]
    fn position_damage(&self) -> Option<(String, bool)> {
        (self.position > u32::MAX as u64).then(|| {
            (
                "segment is larger than the format allows (4 GiB)".to_string(),
                true,
            )
        })
    }

    /// A valid entry with another offset than expected is certainly corruption: its checksum
    /// holds, so it is not a torn write.
    #[inline]
    fn offset_damage(&self, header: &EntryHeader) -> Option<(String, bool)> {
        (header.offset != self.expected_offset).then(|| {
            let reason = format!(
                "offset {} where {} was expected",
                header.offset, self.expected_offset
            );
            (reason, true)
        })
    }

    /// Takes a valid entry into the scan: a batch's first entry opens the batch (the state to
    /// cut back to if it never ends) and may get an index point; the batch bit says whether the
    /// batch goes on.
    #[inline]
    fn accept(
        &mut self,
        header: &EntryHeader,
        base_offset: u64,
        points: &mut Vec<IndexPoint>,
        index_interval_bytes: u32,
    ) {
        if !self.batch_open {
            self.batch = BatchStart {
                position: self.position,
                offset: self.expected_offset,
                timestamp_ms_max: self.timestamp_ms_max,
                points_count: points.len(),
            };
        }
        self.timestamp_ms_max = self.timestamp_ms_max.max(header.timestamp_ms);
        if !self.batch_open {
            let point = self.start_point.take().or_else(|| {
                point_due(
                    points.last(),
                    (self.expected_offset - base_offset) as u32,
                    self.position,
                    self.timestamp_ms_max,
                    index_interval_bytes,
                )
            });
            if let Some(point) = point {
                points.push(point);
            }
        }
        self.batch_open = header.batch_continues;
        self.position += header.entry_bytes();
        self.expected_offset += 1;
    }

    #[inline]
    fn finish(self, damage: Option<(String, bool)>) -> Scan {
        Scan {
            next_offset: self.expected_offset,
            end: self.position,
            timestamp_ms_max: self.timestamp_ms_max,
            damage,
            unfinished: self.batch_open.then_some(self.batch),
        }
    }
}

/// What a read may still return: records up to `max_bytes` in all (the first entry always, so
/// that a large record cannot block a reader) and `max_count` entries.
struct ReadBudget {
    max_bytes: usize,
    max_count: usize,
    /// Record bytes returned so far.
    bytes_total: usize,
}

/// Where a recovered segment's valid entries end: one past the last offset, the byte after the
/// last entry, and the running maximum timestamp there.
struct SegmentEnd {
    next_offset: u64,
    position: u64,
    timestamp_ms_max: u64,
}

/// Drops index points from the end until the last one points at a valid entry with its offset:
/// a crash can leave points past what the log kept. After `INDEX_VERIFY_ATTEMPTS_MAX` failures
/// the index is not worth trusting and all points go (the scan then starts at byte 0). Returns
/// whether any point was dropped.
fn drop_unconfirmed_points<S: LogStorage + ?Sized>(
    storage: &S,
    reader: &mut ChunkReader<'_>,
    base_offset: u64,
    points: &mut Vec<IndexPoint>,
) -> std::io::Result<bool> {
    let mut dropped = false;
    let mut attempts = 0;
    while let Some(point) = points.last().copied() {
        if attempts == INDEX_VERIFY_ATTEMPTS_MAX {
            points.clear();
            break;
        }
        attempts += 1;
        let confirmed = reader
            .entry(storage, point.position as u64)?
            .is_ok_and(|h| h.offset == base_offset + point.relative_offset as u64);
        if confirmed {
            break;
        }
        points.pop();
        dropped = true;
    }
    Ok(dropped)
}

/// Scans from the last (confirmed) index point, or from the start without one: entries before
/// that point were checked when they were appended or in an earlier recovery, so open reads only
/// the tail. The point is popped, and the scan gives it back to its entry (or drops it with an
/// unfinished batch that starts there).
fn scan_from_last_point<S: LogStorage + ?Sized>(
    storage: &S,
    reader: &mut ChunkReader<'_>,
    base_offset: u64,
    points: &mut Vec<IndexPoint>,
    index_interval_bytes: u32,
) -> std::io::Result<Scan> {
    let start = match points.pop() {
        Some(point) => ScanStart {
            position: point.position as u64,
            expected_offset: base_offset + point.relative_offset as u64,
            // Its maximum already covers its own entry.
            timestamp_ms_max: point.timestamp_ms_max,
            point: Some(point),
        },
        None => ScanStart {
            position: 0,
            expected_offset: base_offset,
            timestamp_ms_max: 0,
            point: None,
        },
    };
    scan(
        storage,
        reader,
        base_offset,
        start,
        points,
        index_interval_bytes,
    )
}

/// Where the segment ends once a batch the scan left unfinished is cut off, and the cut to make:
/// the unfinished batch's start (its reason naming any damage cut after it), or else `cut`, the
/// torn tail found by the scan. A batch is stored whole or not at all, so its entries before a
/// crash go too. Only the last segment can hold one: batches never span segments, and a segment
/// is closed after its last batch, so in a closed segment it is corruption.
fn cut_unfinished_batch(
    log_path: &Path,
    is_last: bool,
    scan: &Scan,
    cut: Option<(u64, String)>,
) -> Result<(SegmentEnd, Option<(u64, String)>), LogError> {
    let Some(batch) = scan.unfinished else {
        let end = SegmentEnd {
            next_offset: scan.next_offset,
            position: scan.end,
            timestamp_ms_max: scan.timestamp_ms_max,
        };
        return Ok((end, cut));
    };
    let reason = format!(
        "the batch from offset {} at byte {} has no last entry ({} of its entries were \
         written{}): a crash stopped its write, and a batch is stored whole or not at all",
        batch.offset,
        batch.position,
        scan.next_offset - batch.offset,
        cut.as_ref()
            .map(|(_, why)| format!(", then {why}"))
            .unwrap_or_default()
    );
    if !is_last {
        return Err(LogError::Corrupt {
            file: log_path.to_path_buf(),
            position: batch.position,
            reason,
        });
    }
    let end = SegmentEnd {
        next_offset: batch.offset,
        position: batch.position,
        timestamp_ms_max: batch.timestamp_ms_max,
    };
    Ok((end, Some((batch.position, reason))))
}

/// The index rule, the same on append and on rebuild so that a rebuilt index is identical: the
/// first entry of a segment is indexed, then the first entry of a batch at least `interval` bytes
/// after the previous point (the caller asks only at a batch's first entry). Returns the point to add, if one is due.
fn point_due(
    last: Option<&IndexPoint>,
    relative_offset: u32,
    position: u64,
    timestamp_ms_max: u64,
    index_interval_bytes: u32,
) -> Option<IndexPoint> {
    let due = match last {
        None => true,
        Some(last) => position >= last.position as u64 + index_interval_bytes as u64,
    };
    if !due {
        return None;
    }
    assert!(position <= u32::MAX as u64, "segment positions fit u32");
    Some(IndexPoint {
        relative_offset,
        position: position as u32,
        timestamp_ms_max,
    })
}

/// Whether every byte from `position` to the end of the reader's window is zero: the room that
/// sync jobs keep written past the active segment's entries ([`LogStorage::write_later`]), left by
/// a stop or a crash, rather than a torn write. Bounded by the bytes after `position`, read a
/// chunk at a time; stops at the first byte that is not zero.
pub(crate) fn zero_tail<S: LogStorage + ?Sized>(
    storage: &S,
    reader: &mut ChunkReader<'_>,
    mut position: u64,
) -> std::io::Result<bool> {
    while position < reader.len {
        let bytes = (reader.len - position).min(READ_CHUNK_BYTES_MAX as u64) as usize;
        if reader
            .get(storage, position, bytes)?
            .iter()
            .any(|&b| b != 0)
        {
            return Ok(false);
        }
        position += bytes as u64;
    }
    Ok(true)
}

/// After damage at `position`, looks for any valid entry further on with an offset at or after
/// `expected_offset`. Finding one means the damage is in the middle of data (corruption); finding
/// none means it is a torn tail. Bounded by the bytes after `position`.
pub(crate) fn valid_entry_after<S: LogStorage + ?Sized>(
    storage: &S,
    reader: &mut ChunkReader<'_>,
    position: u64,
    expected_offset: u64,
) -> std::io::Result<Option<u64>> {
    let Some(last) = reader.len.checked_sub(ENTRY_HEADER_BYTES as u64) else {
        return Ok(None);
    };
    // Any later entry's offset is below this: each entry takes at least a header.
    let offset_bound = expected_offset + reader.len / ENTRY_HEADER_BYTES as u64 + 1;
    let mut candidate = position + 1;
    while candidate <= last {
        let head: [u8; ENTRY_HEADER_BYTES] = reader
            .get(storage, candidate, ENTRY_HEADER_BYTES)?
            .try_into()
            .expect("24 bytes");
        let plausible = decode_header(&head).is_ok_and(|h| {
            h.offset >= expected_offset
                && h.offset < offset_bound
                && candidate + h.entry_bytes() <= reader.len
        });
        if plausible && reader.entry(storage, candidate)?.is_ok() {
            return Ok(Some(candidate));
        }
        candidate += 1;
    }
    Ok(None)
}

/// A sync of the log captured by [`PartitionLog::begin_sync`], to be run without the log (on a
/// sync thread, while appends go on) and handed back to [`PartitionLog::finish_sync`].
#[must_use = "a sync job does nothing until it is run and finished"]
pub struct SyncJob {
    covers: u64,
    /// The log's segment-creation generation when the job began.
    generation: u64,
    /// Whether the job syncs the directory too.
    syncs_dir: bool,
    /// The active segment's sync (unless `writes` syncs it), then the directory's if included.
    syncs: Vec<SyncFn>,
    /// With deferred writes: what the job writes (and syncs) before `syncs`.
    writes: Option<JobWrites>,
}

impl SyncJob {
    /// The log's next offset when the job began: once the job is finished successfully, every
    /// entry below it is durable.
    pub fn covers(&self) -> u64 {
        self.covers
    }

    /// Runs the writes and syncs (the slow part; no access to the log), stopping at the first
    /// failure.
    pub fn run(self) -> SyncDone {
        let mut result = Ok(());
        let mut written = None;
        let mut cut_back = None;
        if let Some(writes) = self.writes {
            match writes.run() {
                Ok(end) => written = Some(end),
                Err((error, start)) => {
                    result = Err(error);
                    cut_back = start;
                }
            }
        }
        if result.is_ok() {
            for sync in self.syncs {
                result = sync();
                if result.is_err() {
                    break;
                }
            }
        }
        SyncDone {
            covers: self.covers,
            generation: self.generation,
            syncs_dir: self.syncs_dir,
            written,
            cut_back,
            result,
        }
    }
}

/// Where the active segment's file ends: it holds the segment's entries below `next_offset`,
/// ending at byte `bytes`. Tagged with the segment's base offset, since a roll starts a new file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileEnd {
    base_offset: u64,
    next_offset: u64,
    bytes: u64,
}

/// Where a group of deferred writes begins in the three files of a segment. A write that fails is
/// cut back to here in all three, so that they stay consistent with each other and reopening them
/// has nothing to rebuild: on a full disk, a rebuilt index could not be written either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileStart {
    base_offset: u64,
    log: u64,
    index: u64,
    time_index: u64,
}

/// Deferred writes: see [`PartitionLog::defer_writes`].
#[derive(Debug)]
struct Deferred {
    /// Encoded entries of the active segment not yet taken by a sync job, in order.
    log: Vec<Bytes>,
    /// Their index points, encoded for the two index files.
    index: Vec<u8>,
    time_index: Vec<u8>,
    /// What the active segment's file is known to hold (finished jobs and rolls move it): reads
    /// stop there.
    in_file: FileEnd,
    order: Arc<WriteOrder>,
    /// Tickets handed to jobs so far: the next job gets this one.
    tickets: u64,
}

/// The order in which sync jobs write: ticket by ticket, each after the previous one's writes
/// are done, so that a file never has a hole. After a failed write every later job fails without
/// writing (nothing it wrote could follow the failed bytes).
#[derive(Debug, Default)]
struct WriteOrder {
    turn: Mutex<Turn>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct Turn {
    /// The ticket whose writes go next.
    next: u64,
    failed: Option<String>,
}

impl WriteOrder {
    fn lock(&self) -> MutexGuard<'_, Turn> {
        self.turn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until every ticket below `ticket` has written; the failure among them, if any.
    fn wait(&self, ticket: u64) -> Result<(), String> {
        let mut turn = self.lock();
        // Bounded by the jobs ahead: each ends its turn when it has run or been dropped.
        while turn.next < ticket {
            turn = self
                .changed
                .wait(turn)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        match &turn.failed {
            Some(reason) => Err(reason.clone()),
            None => Ok(()),
        }
    }

    /// Ends the current ticket's turn.
    fn end_turn(&self, failed: Option<String>) {
        let mut turn = self.lock();
        turn.next += 1;
        if turn.failed.is_none() {
            turn.failed = failed;
        }
        self.changed.notify_all();
    }
}

/// A job's place in the [`WriteOrder`]; a job dropped without running still ends its turn (as a
/// failure, since what it should have written is not in the file).
struct Ticket {
    order: Arc<WriteOrder>,
    number: u64,
    ended: bool,
}

impl Ticket {
    fn end(mut self, failed: Option<String>) {
        self.ended = true;
        self.order.end_turn(failed);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.order.wait(self.number);
            self.order
                .end_turn(Some("a sync job was dropped before it wrote".to_string()));
        }
    }
}

/// The writes of one sync job under deferred writes.
struct JobWrites {
    ticket: Ticket,
    /// Writes to the active segment's file at `start.log` (then syncs it), and the chunks.
    log: (WriteFn, Vec<Bytes>),
    /// Appends to the index files, and their bytes (not synced: indexes are rebuilt if a crash
    /// leaves them short).
    indexes: Vec<(AppendFn, Bytes)>,
    /// Where the files end before them, and the log file once they are done.
    start: FileStart,
    end: FileEnd,
}

impl JobWrites {
    /// Writes in turn. On failure also says where to cut the files back to, if this job wrote
    /// anything (a job after a failed one writes nothing).
    fn run(self) -> Result<FileEnd, (std::io::Error, Option<FileStart>)> {
        let JobWrites {
            ticket,
            log: (write, chunks),
            indexes,
            start,
            end,
        } = self;
        if let Err(reason) = ticket.order.wait(ticket.number) {
            ticket.end(Some(reason.clone()));
            let error = std::io::Error::other(format!(
                "not written after an earlier write failed: {reason}"
            ));
            return Err((error, None));
        }
        let result = write(&chunks, start.log, true).and_then(|()| {
            for (append, bytes) in indexes {
                append(std::slice::from_ref(&bytes), false)?;
            }
            Ok(())
        });
        ticket.end(result.as_ref().err().map(|e| e.to_string()));
        result.map(|()| end).map_err(|error| (error, Some(start)))
    }
}

impl std::fmt::Debug for SyncJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncJob")
            .field("covers", &self.covers)
            .field("generation", &self.generation)
            .field("syncs_dir", &self.syncs_dir)
            .field("syncs_count", &self.syncs.len())
            .field("writes", &self.writes.is_some())
            .finish()
    }
}

/// A [`SyncJob`] that has run: its outcome, to be handed to [`PartitionLog::finish_sync`].
#[derive(Debug)]
#[must_use = "a sync is only acknowledged by PartitionLog::finish_sync"]
pub struct SyncDone {
    covers: u64,
    generation: u64,
    syncs_dir: bool,
    /// With deferred writes: where the file ended after the job's writes.
    written: Option<FileEnd>,
    /// With deferred writes that failed: where to cut the files back to.
    cut_back: Option<FileStart>,
    result: std::io::Result<()>,
}

impl SyncDone {
    /// See [`SyncJob::covers`].
    pub fn covers(&self) -> u64 {
        self.covers
    }

    /// Whether the syncs succeeded. Only [`PartitionLog::finish_sync`] acknowledges them: it also
    /// refuses if the log failed in the meantime.
    pub fn is_ok(&self) -> bool {
        self.result.is_ok()
    }
}

/// The durable log of one partition. See the module documentation for its invariants.
#[derive(Debug)]
pub struct PartitionLog<S: LogStorage> {
    storage: S,
    dir: PathBuf,
    config: LogConfig,
    /// Ascending by base offset, never empty; the last one is active.
    segments: Vec<Segment>,
    /// A segment file was created since the directory was last synced.
    dir_sync_pending: bool,
    /// Counts the times `dir_sync_pending` was set, so that a sync job knows whether a file was
    /// created after it began (its directory sync then does not cover that file).
    dir_generation: u64,
    /// Entries below this are known durable: see [`PartitionLog::durable_offset`].
    durable_offset: u64,
    /// Set when a failed write could not be undone, or a sync failed; writes and syncs are refused
    /// until the log is reopened.
    failed: Option<String>,
    /// `Some` once [`PartitionLog::defer_writes`] is on.
    deferred: Option<Deferred>,
}

impl<S: LogStorage> PartitionLog<S> {
    /// Opens (or creates) the log in `dir`, checking and repairing what a crash can leave: a torn
    /// tail of the last segment is cut off, missing or stale indexes are rebuilt. Damage a crash
    /// cannot cause (a bad entry followed by good ones, a missing middle segment) is an error.
    pub fn open(
        mut storage: S,
        dir: impl Into<PathBuf>,
        config: LogConfig,
    ) -> Result<(Self, RecoveryReport), LogError> {
        config.validate()?;
        let dir = dir.into();
        storage.create_dir_all(&dir)?;
        let mut report = RecoveryReport::default();
        let logs = list_segments_removing_orphans(&mut storage, &dir, &mut report)?;

        let mut log = PartitionLog {
            storage,
            dir,
            config,
            segments: Vec::with_capacity(logs.len().max(1)),
            // Whoever wrote this directory before may not have synced the names of the segments
            // it created (the process may have exited between a roll and a sync), so the first
            // sync after open syncs the directory too.
            dir_sync_pending: true,
            dir_generation: 0,
            durable_offset: 0,
            failed: None,
            deferred: None,
        };
        if logs.is_empty() {
            log.create_segment(0)?;
        }
        let count = logs.len();
        for (i, base) in logs.into_iter().enumerate() {
            // Continuity is checked before the segment is recovered, so that a log that fails to
            // open has not had its last segment cut first.
            log.check_continues_at(base)?;
            let segment = log.recover_segment(base, i + 1 == count, &mut report)?;
            log.segments.push(segment);
        }
        // Closed segments were synced, and their names made durable, before their successor was
        // created; whether the active segment's entries are on disk is unknown until a sync.
        log.durable_offset = log.active().base_offset;
        report.segments_count = log.segments.len();
        report.start_offset = log.start_offset();
        report.next_offset = log.next_offset();
        Ok((log, report))
    }

    /// A segment based at `base` must start exactly where the last recovered one ends: a gap is a
    /// lost segment, an overlap is corruption, and either makes the log's offsets ambiguous.
    fn check_continues_at(&self, base: u64) -> Result<(), LogError> {
        let Some(previous) = self.segments.last() else {
            return Ok(());
        };
        let path = self.dir.join(segment_file_name(base));
        if base > previous.next_offset {
            return Err(LogError::MissingSegment {
                dir: self.dir.clone(),
                expected_base_offset: previous.next_offset,
                found_base_offset: base,
                found: path,
            });
        }
        if base < previous.next_offset {
            return Err(LogError::Corrupt {
                file: previous.log_path.clone(),
                position: previous.bytes,
                reason: format!(
                    "segment ends at offset {} but the next segment, {}, starts at {base}",
                    previous.next_offset,
                    path.display()
                ),
            });
        }
        Ok(())
    }

    /// Recovers one segment, phase by phase: load its index, drop the index points the log does
    /// not confirm, scan from the last confirmed point to the end, judge what stopped the scan,
    /// cut a torn tail or an unfinished batch off the last segment, and rewrite a stale index.
    fn recover_segment(
        &mut self,
        base_offset: u64,
        is_last: bool,
        report: &mut RecoveryReport,
    ) -> Result<Segment, LogError> {
        let mut segment = Segment::new(&self.dir, base_offset);
        let file_len = self.storage.len(&segment.log_path)?;
        let (mut points, mut index_stale) = self.load_index(&segment, file_len)?;
        let mut reader = ChunkReader::new(&segment.log_path, file_len, READ_CHUNK_BYTES_MAX);
        if drop_unconfirmed_points(&self.storage, &mut reader, base_offset, &mut points)? {
            index_stale = true;
        }

        let points_before = points.len();
        let mut scan = scan_from_last_point(
            &self.storage,
            &mut reader,
            base_offset,
            &mut points,
            self.config.index_interval_bytes,
        )?;
        if points.len() != points_before {
            // The scan indexed entries the index did not have.
            index_stale = true;
        }

        let damage_cut =
            self.judge_scan_end(&segment.log_path, is_last, file_len, &mut scan, &mut reader)?;
        let (end, cut) = cut_unfinished_batch(&segment.log_path, is_last, &scan, damage_cut)?;
        if let Some(batch) = scan.unfinished {
            points.truncate(batch.points_count);
            index_stale = true;
        }
        if let Some((position, reason)) = cut {
            self.cut_tail(&segment.log_path, file_len, position, reason, report)?;
        }

        segment.next_offset = end.next_offset;
        segment.bytes = end.position;
        segment.timestamp_ms_max = end.timestamp_ms_max;
        segment.points = points;
        segment.assert_recovered(file_len);
        if index_stale {
            self.rebuild_index(&segment, is_last, report)?;
        }
        if !is_last {
            segment.close_points();
        }
        Ok(segment)
    }

    /// Decides what the bytes at the scan's end are, for damage the scan stopped at: zeros kept
    /// ahead by sync jobs (cut here, quietly, unless an unfinished batch will cut further back),
    /// a torn write of the last segment (returned as the cut to make, with its reason), or
    /// corruption a crash cannot cause (an error, and nothing is cut).
    fn judge_scan_end(
        &mut self,
        log_path: &Path,
        is_last: bool,
        file_len: u64,
        scan: &mut Scan,
        reader: &mut ChunkReader<'_>,
    ) -> Result<Option<(u64, String)>, LogError> {
        let room = is_last
            && scan.damage.as_ref().is_some_and(|(_, certain)| !certain)
            && zero_tail(&self.storage, reader, scan.end)?;
        if room {
            // Zeros after the last entry: room kept ahead by sync jobs, not damage. Cut, so that
            // the file ends with its entries again, but nothing is reported unless a batch was
            // left unfinished before it.
            tracing::debug!(
                file = %log_path.display(),
                position = scan.end,
                bytes = file_len - scan.end,
                "cutting the room kept past the last entry"
            );
            if scan.unfinished.is_none() {
                self.storage.truncate(log_path, scan.end)?;
                self.storage.sync(log_path)?;
            }
            return Ok(None);
        }
        let Some((reason, certain)) = scan.damage.take() else {
            return Ok(None);
        };
        let torn = is_last
            && !certain
            && valid_entry_after(&self.storage, reader, scan.end, scan.next_offset)?.is_none();
        if !torn {
            return Err(LogError::Corrupt {
                file: log_path.to_path_buf(),
                position: scan.end,
                reason,
            });
        }
        Ok(Some((scan.end, reason)))
    }

    /// Cuts the last segment's file at `position`, dropping a torn tail or an unfinished batch,
    /// and makes the cut durable so that a second crash cannot bring the garbage back.
    fn cut_tail(
        &mut self,
        log_path: &Path,
        file_len: u64,
        position: u64,
        reason: String,
        report: &mut RecoveryReport,
    ) -> Result<(), LogError> {
        let dropped = file_len - position;
        tracing::warn!(
            file = %log_path.display(),
            position,
            bytes_dropped = dropped,
            %reason,
            "truncating a torn tail left by a crash"
        );
        self.storage.truncate(log_path, position)?;
        self.storage.sync(log_path)?;
        report.truncation = Some(Truncation {
            file: log_path.to_path_buf(),
            position,
            bytes_dropped: dropped,
            reason,
        });
        Ok(())
    }

    /// Rewrites a recovered segment's index files from its points. A closed segment's are synced
    /// at once, so that its rebuild is done once and not at every open until the next roll.
    fn rebuild_index(
        &mut self,
        segment: &Segment,
        is_last: bool,
        report: &mut RecoveryReport,
    ) -> Result<(), LogError> {
        self.rewrite_index(segment)?;
        if !is_last {
            self.storage.sync(&segment.index_path)?;
            self.storage.sync(&segment.time_index_path)?;
        }
        tracing::warn!(file = %segment.index_path.display(), "rebuilt index from the log");
        report.indexes_rebuilt.push(segment.index_path.clone());
        Ok(())
    }

    /// Reads both index files into points; `(points, stale)`, where stale means they were
    /// missing, malformed or inconsistent and are to be rebuilt.
    fn load_index(
        &self,
        segment: &Segment,
        log_len: u64,
    ) -> Result<(Vec<IndexPoint>, bool), LogError> {
        let storage = &self.storage;
        if !storage.exists(&segment.index_path) || !storage.exists(&segment.time_index_path) {
            // Stale even for an empty log: appends need the files to exist.
            return Ok((Vec::new(), true));
        }
        let index_len = storage.len(&segment.index_path)?;
        let time_index_len = storage.len(&segment.time_index_path)?;
        // A point per entry at most: anything longer is not an index of this log, and reading it
        // would let a damaged file decide how much memory we use.
        let points_max = log_len / ENTRY_HEADER_BYTES as u64 + 1;
        if index_len > points_max * INDEX_POINT_BYTES as u64
            || time_index_len > points_max * TIME_INDEX_POINT_BYTES as u64
        {
            return Ok((Vec::new(), true));
        }
        let mut index = vec![0u8; index_len as usize];
        storage.read_at(&segment.index_path, 0, &mut index)?;
        let mut time_index = vec![0u8; time_index_len as usize];
        storage.read_at(&segment.time_index_path, 0, &mut time_index)?;
        match decode_index(&index, &time_index) {
            Some(mut points) => {
                let before = points.len();
                // Points past the end of the log are stale (the log lost its tail in a crash).
                points.retain(|p| (p.position as u64) < log_len);
                let stale = points.len() != before || (points.is_empty() && log_len > 0);
                Ok((points, stale))
            }
            None => Ok((Vec::new(), true)),
        }
    }

    /// Writes a segment's index files from its in-memory points.
    fn rewrite_index(&mut self, segment: &Segment) -> Result<(), LogError> {
        let (mut index, mut time_index) = (Vec::new(), Vec::new());
        for point in &segment.points {
            encode_index_point(&mut index, point);
            encode_time_index_point(&mut time_index, point);
        }
        for (path, bytes) in [
            (&segment.index_path, &index),
            (&segment.time_index_path, &time_index),
        ] {
            if self.storage.exists(path) {
                self.storage.truncate(path, 0)?;
            } else {
                self.storage.create(path)?;
                self.mark_dir_sync_pending();
            }
            self.storage.append(path, bytes)?;
        }
        Ok(())
    }

    fn create_segment(&mut self, base_offset: u64) -> Result<(), LogError> {
        let segment = Segment::new(&self.dir, base_offset);
        self.storage.create(&segment.log_path)?;
        self.mark_dir_sync_pending();
        // Index files of this base can only be leftovers; empty them.
        if let Err(error) = self.rewrite_index(&segment) {
            // The segment file exists but the log does not know it: creating it again would
            // fail. Reopening finds it and rebuilds its index.
            // The caller reports the stop, once per run of failures.
            tracing::debug!(%error, "creating a segment's index failed; the log refuses writes until reopened");
            self.failed = Some(error.to_string());
            return Err(error);
        }
        self.segments.push(segment);
        Ok(())
    }

    /// A file was created in the directory: its name is not durable until the next directory sync.
    fn mark_dir_sync_pending(&mut self) {
        self.dir_sync_pending = true;
        self.dir_generation += 1;
    }

    fn active(&self) -> &Segment {
        self.segments.last().expect("a log always has a segment")
    }

    /// The offset the next appended entry gets.
    pub fn next_offset(&self) -> u64 {
        self.active().next_offset
    }

    /// The lowest offset still in the log (retention moves it up).
    pub fn start_offset(&self) -> u64 {
        self.segments[0].base_offset
    }

    /// Bytes of all segments.
    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.bytes).sum()
    }

    /// Why the log refuses writes, if it does: a write or sync failed and could not be undone.
    /// The owner should reopen the log (after the cause, e.g. a full disk, is gone).
    pub fn failed_reason(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    pub fn segments_count(&self) -> usize {
        self.segments.len()
    }

    /// The directory of this partition's files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// Gives the storage back, e.g. to simulate a crash and reopen.
    pub fn into_storage(self) -> S {
        self.storage
    }

    /// Appends entries `(timestamp_ms, record)` and returns their offsets. Writes but does not
    /// sync: the caller decides when to call [`PartitionLog::sync`] (group commit). All records
    /// are checked before anything is written, and the batch is encoded into one buffer per
    /// segment it touches, so it costs about one write call per segment.
    ///
    /// On an I/O error the part of the batch that went to earlier segments (when the batch
    /// rolled a segment) stays appended; [`PartitionLog::next_offset`] says how far it got. The
    /// failed write itself is cut off again, or, if that fails too, the log refuses further
    /// writes until it is reopened (which recovers the tail).
    pub fn append(&mut self, entries: &[(u64, &[u8])]) -> Result<Range<u64>, LogError> {
        self.append_inner(entries, &mut Pending::default())
    }

    /// [`PartitionLog::append`], also returning each record as a slice of the buffer that was
    /// written (one allocation per segment touched), so a caller that keeps the records in
    /// memory (the broker's in-memory tail) shares the encoded bytes instead of copying them.
    /// The slices pin the whole buffer, entry headers included (24 bytes per entry).
    pub fn append_shared(
        &mut self,
        entries: &[(u64, &[u8])],
    ) -> Result<(Range<u64>, Vec<Bytes>), LogError> {
        let mut pending = Pending {
            keep: Some(Vec::with_capacity(entries.len())),
            ..Pending::default()
        };
        let range = self.append_inner(entries, &mut pending)?;
        Ok((range, pending.keep.take().unwrap_or_default()))
    }

    fn append_inner(
        &mut self,
        entries: &[(u64, &[u8])],
        pending: &mut Pending,
    ) -> Result<Range<u64>, LogError> {
        self.check_writable()?;
        if let Some((_, record)) = entries.iter().find(|(_, r)| r.len() > RECORD_BYTES_MAX) {
            return Err(LogError::RecordTooLarge {
                bytes: record.len(),
                max: RECORD_BYTES_MAX,
            });
        }
        let first = self.next_offset();
        let Some(last) = entries.len().checked_sub(1) else {
            return Ok(first..first);
        };
        let batch_bytes: u64 = entries
            .iter()
            .map(|(_, r)| entry_bytes(r.len()) as u64)
            .sum();
        if batch_bytes > BATCH_BYTES_MAX {
            return Err(LogError::BatchTooLarge {
                bytes: batch_bytes,
                max: BATCH_BYTES_MAX,
            });
        }
        if pending.keep.is_some() {
            pending.log.reserve_exact(batch_bytes as usize);
        }
        let timestamp_ms_last = entries.iter().map(|(t, _)| *t).max().unwrap_or(0);
        // The whole batch goes to one segment, so that recovery can cut it whole: a segment
        // closed in the middle of a batch would be synced with the batch's beginning in it.
        if self.roll_due(timestamp_ms_last, batch_bytes, entries.len() as u64) {
            self.roll()?;
        }
        for (i, &(timestamp_ms, record)) in entries.iter().enumerate() {
            let active = self.segments.last().expect("a log always has a segment");
            let offset = active.next_offset + pending.count;
            let position = active.bytes + pending.log.len() as u64;
            pending.timestamp_ms_max = pending
                .timestamp_ms_max
                .max(active.timestamp_ms_max)
                .max(timestamp_ms);
            if i == 0 {
                if let Some(point) = point_due(
                    active.points.last(),
                    (offset - active.base_offset) as u32,
                    position,
                    pending.timestamp_ms_max,
                    self.config.index_interval_bytes,
                ) {
                    pending.points.push(point);
                }
            }
            if pending.keep.is_some() {
                let at = pending.log.len() + ENTRY_HEADER_BYTES;
                pending.records_at.push(at..at + record.len());
            }
            encode_batch_entry(&mut pending.log, offset, timestamp_ms, record, i != last);
            pending.count += 1;
        }
        self.flush(pending)?;
        Ok(first..self.next_offset())
    }

    /// Whether a batch of `count` entries and `batch_bytes`, the latest at `timestamp_ms`, must
    /// go to a new segment.
    fn roll_due(&self, timestamp_ms: u64, batch_bytes: u64, count: u64) -> bool {
        let active = self.active();
        if active.is_empty() {
            return false;
        }
        let first_timestamp_ms = active.timestamp_ms_first().unwrap_or(timestamp_ms);
        let relative_last = active.next_offset - active.base_offset + count - 1;
        active.bytes + batch_bytes > self.config.segment_bytes_max
            || timestamp_ms.saturating_sub(first_timestamp_ms) >= self.config.segment_age_ms_max
            // Relative offsets are u32 in the index.
            || relative_last >= u32::MAX as u64
    }

    /// Writes what `append` has buffered for the active segment; on failure undoes it, or refuses
    /// further writes if it cannot.
    fn flush(&mut self, pending: &mut Pending) -> Result<(), LogError> {
        if pending.count == 0 {
            return Ok(());
        }
        if self.deferred.is_none() {
            let active = self.segments.last().expect("a log always has a segment");
            let (log_path, bytes) = (active.log_path.clone(), active.bytes);
            // Where the entries end, which the log knows: no need to ask the file its length.
            if let Err(error) = self.storage.write_at(&log_path, bytes, &pending.log) {
                self.undo(&log_path, bytes, &error);
                return Err(error.into());
            }
        }
        let (mut index, mut time_index) = (Vec::new(), Vec::new());
        for point in &pending.points {
            encode_index_point(&mut index, point);
            encode_time_index_point(&mut time_index, point);
        }
        let active = self
            .segments
            .last_mut()
            .expect("a log always has a segment");
        active.bytes += pending.log.len() as u64;
        active.next_offset += pending.count;
        active.timestamp_ms_max = active.timestamp_ms_max.max(pending.timestamp_ms_max);
        active.points.append(&mut pending.points);
        let index_path = active.index_path.clone();
        let time_index_path = active.time_index_path.clone();
        let written = Bytes::from(std::mem::take(&mut pending.log));
        if let Some(keep) = pending.keep.as_mut() {
            keep.extend(pending.records_at.drain(..).map(|at| written.slice(at)));
        }
        pending.count = 0;
        pending.points.clear();
        pending.timestamp_ms_max = 0;
        if let Some(deferred) = self.deferred.as_mut() {
            deferred.log.push(written);
            deferred.index.extend_from_slice(&index);
            deferred.time_index.extend_from_slice(&time_index);
            return Ok(());
        }
        if !index.is_empty() {
            for (path, bytes) in [(&index_path, &index), (&time_index_path, &time_index)] {
                if let Err(error) = self.storage.append(path, bytes) {
                    // The log write stands, but the index no longer matches the points in memory.
                    // Emptying it makes the next open rebuild it; until then, refuse writes.
                    for path in [&index_path, &time_index_path] {
                        let _ = self.storage.truncate(path, 0);
                    }
                    // The caller reports the stop, once per run of failures.
                    tracing::debug!(%error, "index write failed; the log refuses writes until reopened");
                    self.failed = Some(error.to_string());
                    return Err(error.into());
                }
            }
        }
        Ok(())
    }

    /// Cuts a segment's files back to where a failed group of deferred writes began. The log has
    /// failed already; this only spares reopening it a rebuild (which needs space the disk may not
    /// have). No later write can have followed: the jobs after a failed one write nothing.
    fn cut_back(&mut self, start: FileStart) {
        let Some(segment) = self
            .segments
            .iter()
            .find(|s| s.base_offset == start.base_offset)
        else {
            return;
        };
        for (path, len) in [
            (&segment.log_path, start.log),
            (&segment.index_path, start.index),
            (&segment.time_index_path, start.time_index),
        ] {
            if let Err(error) = self.storage.truncate(path, len) {
                tracing::warn!(file = %path.display(), %error, "could not cut a failed write back; reopening the log repairs the file");
            }
        }
    }

    fn undo(&mut self, path: &Path, len: u64, error: &std::io::Error) {
        if let Err(undo_error) = self.storage.truncate(path, len) {
            tracing::error!(%error, %undo_error, "could not undo a failed write");
            self.failed = Some(format!("{error}; undoing it failed: {undo_error}"));
        }
    }

    /// Closes the active segment (synced, so that a crash can only tear the new active one) and
    /// starts a new one at the next offset.
    fn roll(&mut self) -> Result<(), LogError> {
        self.write_deferred()?;
        let active = self.active();
        let next_offset = active.next_offset;
        let paths = [
            active.log_path.clone(),
            active.index_path.clone(),
            active.time_index_path.clone(),
        ];
        if self.deferred.is_some() {
            // A closed segment ends with its last entry: the room its jobs kept goes.
            let bytes = active.bytes;
            self.storage.truncate(&paths[0], bytes)?;
        }
        // The indexes too: they would be rebuilt after a crash, but a rebuild scans the whole
        // segment, and a closed segment's index never changes again.
        for path in &paths {
            self.sync_file(path)?;
        }
        self.segments
            .last_mut()
            .expect("a log always has a segment")
            .close_points();
        // The closed segment's name must be durable before a later one can be, or a crash could
        // leave a hole in the sequence.
        self.sync_directory_if_pending()?;
        self.create_segment(next_offset)?;
        if let Some(deferred) = self.deferred.as_mut() {
            deferred.in_file = FileEnd {
                base_offset: next_offset,
                next_offset,
                bytes: 0,
            };
        }
        Ok(())
    }

    /// Defers writes from now on: an append only encodes its entries in memory (and updates the
    /// offsets and index points), and each sync job writes what was appended before it began,
    /// with one `writev`, then syncs the file, on the thread that runs it. The owner's lock is
    /// then never held through a write that may wait for the disk, and the task appending never
    /// blocks on it. Reads see an entry once a finished sync (or a roll, which writes what is
    /// left before it closes the segment) has put it in its file.
    ///
    /// Meant for owners that acknowledge entries only once synced (fsync=always): an entry
    /// appended but never synced is gone if the process stops, where an undeferred write would
    /// survive in the page cache. A failed deferred write (or its sync) fails the job, which stops
    /// the log like a failed sync, and the job's writes are cut back in all three files: what the
    /// reopened log holds is then exactly what the jobs before it wrote, and reopening has no
    /// index to rebuild (which a full disk would refuse). Returns false, and changes nothing, if
    /// the storage cannot defer appends ([`LogStorage::append_later`]).
    pub fn defer_writes(&mut self) -> bool {
        if self.deferred.is_some() {
            return true;
        }
        let active = self.segments.last().expect("a log always has a segment");
        if self.storage.append_later(&active.log_path).is_none() {
            return false;
        }
        self.deferred = Some(Deferred {
            log: Vec::new(),
            index: Vec::new(),
            time_index: Vec::new(),
            in_file: FileEnd {
                base_offset: active.base_offset,
                next_offset: active.next_offset,
                bytes: active.bytes,
            },
            order: Arc::default(),
            tickets: 0,
        });
        true
    }

    /// Writes, at once, what deferred appends left in memory (a roll closes a complete segment),
    /// after the jobs in flight have written theirs. A failure stops the log: its bookkeeping
    /// counts entries the file may not hold, and reopening finds what it does.
    fn write_deferred(&mut self) -> Result<(), LogError> {
        let Some(deferred) = self.deferred.as_mut() else {
            return Ok(());
        };
        if let Err(reason) = deferred.order.wait(deferred.tickets) {
            self.failed = Some(reason.clone());
            return Err(LogError::Failed {
                dir: self.dir.clone(),
                reason,
            });
        }
        let log: Vec<u8> = std::mem::take(&mut deferred.log).concat();
        let index = std::mem::take(&mut deferred.index);
        let time_index = std::mem::take(&mut deferred.time_index);
        let active = self.segments.last().expect("a log always has a segment");
        let end = FileEnd {
            base_offset: active.base_offset,
            next_offset: active.next_offset,
            bytes: active.bytes,
        };
        let start = file_start(active, log.len(), index.len(), time_index.len());
        let paths = [
            active.log_path.clone(),
            active.index_path.clone(),
            active.time_index_path.clone(),
        ];
        for ((path, bytes), at) in
            paths
                .iter()
                .zip([&log, &index, &time_index])
                .zip([Some(start.log), None, None])
        {
            if bytes.is_empty() {
                continue;
            }
            // The log file may have room past its entries: its bytes go where they end.
            let written = match at {
                Some(position) => self.storage.write_at(path, position, bytes),
                None => self.storage.append(path, bytes),
            };
            if let Err(error) = written {
                // The caller reports the stop, once per run of failures.
                tracing::debug!(%error, "deferred write failed; the log refuses writes until reopened");
                self.failed = Some(error.to_string());
                self.cut_back(start);
                return Err(error.into());
            }
        }
        if let Some(deferred) = self.deferred.as_mut() {
            deferred.in_file = end;
        }
        Ok(())
    }

    /// The part of `segment` its file holds, `(next_offset, bytes)`: all of it, except for the
    /// active segment under deferred writes.
    fn in_file(&self, segment: &Segment) -> (u64, u64) {
        match &self.deferred {
            Some(deferred) if deferred.in_file.base_offset == segment.base_offset => {
                (deferred.in_file.next_offset, deferred.in_file.bytes)
            }
            _ => (segment.next_offset, segment.bytes),
        }
    }

    /// Makes every appended entry durable: syncs the active segment, and the directory if a
    /// segment was created since its last sync. Closed segments were synced when they closed.
    /// The same as [`PartitionLog::begin_sync`], [`SyncJob::run`] and
    /// [`PartitionLog::finish_sync`] in a row.
    ///
    /// A failed sync stops the log (writes and syncs are refused until it is reopened): after a
    /// failed fsync the kernel may have dropped the dirty pages, and a retried fsync can then
    /// succeed without the data being on disk. Reopening recovers from what is really there.
    pub fn sync(&mut self) -> Result<(), LogError> {
        let job = self.begin_sync()?;
        self.finish_sync(job.run()).map(|_| ())
    }

    /// Begins a sync of every entry appended so far, for group commit: the returned job is run
    /// without the log (its owner's lock released, appends going on meanwhile) and handed back to
    /// [`PartitionLog::finish_sync`], which says up to which offset entries are durable.
    ///
    /// The job captures a sync of the active segment and, if a segment was created since the
    /// directory was last synced, of the directory. That covers every entry below
    /// [`SyncJob::covers`] whatever happens before it is finished: closed segments were synced,
    /// and their names made durable, when they closed; a roll in the meantime syncs the captured
    /// segment itself; retention only deletes what it means to. Entries appended after this call
    /// are not claimed by this job.
    ///
    /// Refused if the log has failed. An error capturing the syncs stops the log like a failed
    /// sync.
    pub fn begin_sync(&mut self) -> Result<SyncJob, LogError> {
        self.check_writable()?;
        let covers = self.next_offset();
        let log_path = self.active().log_path.clone();
        let mut syncs = Vec::with_capacity(2);
        let writes = if self.deferred.is_some() {
            let writes = self.begin_writes();
            Some(self.stop_on_sync_error(writes, "deferred write")?)
        } else {
            let file_sync = self.storage.sync_later(&log_path);
            syncs.push(self.stop_on_sync_error(file_sync, "sync")?);
            None
        };
        let syncs_dir = self.dir_sync_pending;
        if syncs_dir {
            let dir_sync = self.storage.sync_dir_later(&self.dir);
            syncs.push(self.stop_on_sync_error(dir_sync, "directory sync")?);
        }
        Ok(SyncJob {
            covers,
            generation: self.dir_generation,
            syncs_dir,
            syncs,
            writes,
        })
    }

    /// Hands what deferred appends left in memory to a new job, with the next ticket.
    fn begin_writes(&mut self) -> std::io::Result<JobWrites> {
        let active = self.segments.last().expect("a log always has a segment");
        let end = FileEnd {
            base_offset: active.base_offset,
            next_offset: active.next_offset,
            bytes: active.bytes,
        };
        let cannot = || std::io::Error::other("the storage no longer defers appends");
        let deferred = self.deferred.as_mut().expect("deferred writes are on");
        let start = file_start(
            active,
            deferred.log.iter().map(Bytes::len).sum(),
            deferred.index.len(),
            deferred.time_index.len(),
        );
        let log_bytes = (active.bytes - start.log) as usize;
        let room = if (1..=ROOM_JOB_BYTES_MAX).contains(&log_bytes) {
            // Never past where the segment rolls.
            (active.bytes / 8)
                .clamp(ROOM_BYTES_MIN, ROOM_BYTES_MAX)
                .min(self.config.segment_bytes_max.saturating_sub(active.bytes))
        } else {
            0
        };
        let write = self
            .storage
            .write_later(&active.log_path, room)
            .ok_or_else(cannot)??;
        let mut indexes = Vec::new();
        for (path, bytes) in [
            (&active.index_path, &mut deferred.index),
            (&active.time_index_path, &mut deferred.time_index),
        ] {
            if !bytes.is_empty() {
                let append = self.storage.append_later(path).ok_or_else(cannot)??;
                indexes.push((append, Bytes::from(std::mem::take(bytes))));
            }
        }
        let ticket = Ticket {
            order: Arc::clone(&deferred.order),
            number: deferred.tickets,
            ended: false,
        };
        deferred.tickets += 1;
        // The next group is likely about as large as this one: room for it at once.
        let capacity = deferred.log.len();
        Ok(JobWrites {
            ticket,
            log: (
                write,
                std::mem::replace(&mut deferred.log, Vec::with_capacity(capacity)),
            ),
            indexes,
            start,
            end,
        })
    }

    /// Finishes a job from [`PartitionLog::begin_sync`] of this log: on success returns the
    /// offset below which every entry is now durable ([`SyncJob::covers`]). A failed sync stops
    /// the log, as in [`PartitionLog::sync`], and is returned. A successful one is refused too if
    /// the log failed since the job began (after a failed sync a later one can succeed without
    /// the data being on disk).
    pub fn finish_sync(&mut self, done: SyncDone) -> Result<u64, LogError> {
        if let Err(error) = done.result {
            // The caller reports the stop, once per run of failures.
            tracing::debug!(%error, "sync failed; the log refuses writes until reopened");
            self.failed = Some(error.to_string());
            if let Some(start) = done.cut_back {
                self.cut_back(start);
            }
            return Err(error.into());
        }
        self.check_writable()?;
        if let (Some(end), Some(deferred)) = (done.written, self.deferred.as_mut()) {
            if end.base_offset == deferred.in_file.base_offset
                && end.next_offset > deferred.in_file.next_offset
            {
                deferred.in_file = end;
            }
        }
        if done.syncs_dir && done.generation == self.dir_generation {
            // No file was created since the job began: its directory sync covered them all.
            self.dir_sync_pending = false;
        }
        self.durable_offset = self.durable_offset.max(done.covers);
        Ok(done.covers)
    }

    /// Entries below this offset are known durable: the highest [`SyncJob::covers`] finished
    /// successfully (or synced by [`PartitionLog::sync`]). Right after open it is the start of
    /// the active segment (closed segments were synced when they closed; the active one's entries
    /// may be in the page cache only, until the first sync). It can be below
    /// [`PartitionLog::start_offset`] after retention.
    pub fn durable_offset(&self) -> u64 {
        self.durable_offset
    }

    /// The segment log files this log holds that no longer exist in its directory (deleted under
    /// it, by an operator or another process): their entries cannot be read, and the owner should
    /// stop using the log and reopen it, which reports the gap.
    pub fn missing_files(&self) -> Vec<PathBuf> {
        self.segments
            .iter()
            .filter(|s| !self.storage.exists(&s.log_path))
            .map(|s| s.log_path.clone())
            .collect()
    }

    /// The active segment's file if it no longer exists: one check, cheap enough after every
    /// sync (appends to a deleted file would be lost at the next open).
    pub fn active_segment_missing(&self) -> Option<PathBuf> {
        let active = self.active();
        (!self.storage.exists(&active.log_path)).then(|| active.log_path.clone())
    }

    /// Stops the log on an error from capturing a deferred sync.
    fn stop_on_sync_error<T>(
        &mut self,
        captured: std::io::Result<T>,
        what: &str,
    ) -> Result<T, LogError> {
        captured.map_err(|error| {
            // The caller reports the stop, once per run of failures.
            tracing::debug!(%error, "{what} failed; the log refuses writes until reopened");
            self.failed = Some(error.to_string());
            LogError::from(error)
        })
    }

    fn check_writable(&self) -> Result<(), LogError> {
        match &self.failed {
            Some(reason) => Err(LogError::Failed {
                dir: self.dir.clone(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Syncs one file; a failure stops the log (see [`PartitionLog::sync`]).
    fn sync_file(&mut self, path: &Path) -> Result<(), LogError> {
        self.storage.sync(path).map_err(|error| {
            // The caller reports the stop, once per run of failures.
            tracing::debug!(%error, "sync failed; the log refuses writes until reopened");
            self.failed = Some(error.to_string());
            LogError::from(error)
        })
    }

    fn sync_directory_if_pending(&mut self) -> Result<(), LogError> {
        if !self.dir_sync_pending {
            return Ok(());
        }
        if let Err(error) = self.storage.sync_dir(&self.dir) {
            // The caller reports the stop, once per run of failures.
            tracing::debug!(%error, "directory sync failed; the log refuses writes until reopened");
            self.failed = Some(error.to_string());
            return Err(error.into());
        }
        self.dir_sync_pending = false;
        Ok(())
    }

    /// Reads entries from `from_offset` on: at most `max_count`, and at most `max_bytes` of
    /// records, except that the first entry is always returned so that a large record cannot
    /// block a reader. Empty at the end of the log. A damaged entry is an error, never data.
    pub fn read(
        &self,
        from_offset: u64,
        max_bytes: usize,
        max_count: usize,
    ) -> Result<Vec<StoredEntry>, LogError> {
        if from_offset < self.start_offset() || from_offset > self.next_offset() {
            return Err(LogError::OffsetOutOfRange {
                offset: from_offset,
                start_offset: self.start_offset(),
                next_offset: self.next_offset(),
            });
        }
        let mut out = Vec::new();
        if from_offset == self.next_offset() || max_count == 0 {
            return Ok(out);
        }
        let mut budget = ReadBudget {
            max_bytes,
            max_count,
            bytes_total: 0,
        };
        let first = self
            .segments
            .partition_point(|s| s.base_offset <= from_offset)
            - 1;
        for segment in &self.segments[first..] {
            let (segment_next, segment_bytes) = self.in_file(segment);
            if segment.is_empty() || segment_next <= from_offset {
                continue;
            }
            let wanted = from_offset.max(segment.base_offset);
            if self.read_segment(segment, segment_bytes, wanted, &mut budget, &mut out)? {
                return Ok(out);
            }
        }
        Ok(out)
    }

    /// Appends to `out` the entries of `segment` from offset `wanted` on, scanning from the index
    /// point at or before it and checking every entry on the way. Returns whether the read is
    /// complete: the budget is spent, or damage stops it after some entries were returned.
    fn read_segment(
        &self,
        segment: &Segment,
        segment_bytes: u64,
        wanted: u64,
        budget: &mut ReadBudget,
        out: &mut Vec<StoredEntry>,
    ) -> Result<bool, LogError> {
        let point = segment.seek(&self.storage, wanted)?;
        // Enough for the scan from the index point plus what the caller wants.
        let chunk_bytes = (self.config.index_interval_bytes as usize)
            .saturating_add(budget.max_bytes)
            .saturating_add(2 * ENTRY_HEADER_BYTES);
        let mut reader = ChunkReader::new(&segment.log_path, segment_bytes, chunk_bytes);
        let mut position = point.position as u64;
        let mut offset = segment.base_offset + point.relative_offset as u64;
        // Bounded by the segment's valid bytes: each step advances by a whole entry.
        while position < segment_bytes {
            let header = match self.checked_entry(segment, &mut reader, position, offset, &point) {
                Ok(header) => header,
                // Damage before the wanted entry, in the scan from the index point: the scan
                // resumes at the next valid entry, so that only the damaged entries are
                // unreadable, not every one up to the next index point.
                Err(error) if offset < wanted => {
                    match self.resume_after(&mut reader, position, offset)? {
                        Some((at, header)) if header.offset <= wanted => {
                            position = at;
                            offset = header.offset;
                            continue;
                        }
                        _ => return Err(error),
                    }
                }
                // The entries before the damage are served; the next read, from the damaged
                // one, gets the error.
                Err(_) if !out.is_empty() => return Ok(true),
                Err(error) => return Err(error),
            };
            if offset >= wanted {
                let record_bytes = header.record_bytes();
                if !out.is_empty() && budget.bytes_total + record_bytes > budget.max_bytes {
                    return Ok(true);
                }
                let record = reader.get(
                    &self.storage,
                    position + ENTRY_HEADER_BYTES as u64,
                    record_bytes,
                )?;
                out.push(StoredEntry {
                    offset,
                    timestamp_ms: header.timestamp_ms,
                    record: Bytes::copy_from_slice(record),
                });
                budget.bytes_total += record_bytes;
                if out.len() >= budget.max_count {
                    return Ok(true);
                }
            }
            position += header.entry_bytes();
            offset += 1;
        }
        Ok(false)
    }

    /// The first offset whose entry, or an earlier one, has a timestamp at or after `timestamp_ms`
    /// (timestamps are taken as their running maximum, so the answer is monotonic in time);
    /// `next_offset()` if there is none. Seeks with the time index and scans at most one
    /// index interval.
    pub fn offset_for_time(&self, timestamp_ms: u64) -> Result<u64, LogError> {
        let Some(segment) = self
            .segments
            .iter()
            .find(|s| !s.is_empty() && s.timestamp_ms_max >= timestamp_ms)
        else {
            return Ok(self.next_offset());
        };
        let after = segment.partition_points(&self.storage, |storage, i| {
            Ok(segment.point_timestamp_ms_max(storage, i)? < timestamp_ms)
        })?;
        let Some(last_earlier) = after.checked_sub(1) else {
            return Ok(segment.base_offset);
        };
        // Every entry up to this point is earlier than wanted; the answer is after it.
        let (relative_offset, position) = segment.point_at(&self.storage, last_earlier)?;
        let point = IndexPoint {
            relative_offset,
            position,
            timestamp_ms_max: 0,
        };
        // Entries not in the file yet (deferred writes) are not read: the answer is then at
        // least where the file ends.
        let (segment_next, segment_bytes) = self.in_file(segment);
        let mut reader = ChunkReader::new(
            &segment.log_path,
            segment_bytes,
            self.config.index_interval_bytes as usize * 2,
        );
        let mut position = point.position as u64;
        let mut offset = segment.base_offset + point.relative_offset as u64;
        while position < segment_bytes {
            let header = self.checked_entry(segment, &mut reader, position, offset, &point)?;
            if header.timestamp_ms >= timestamp_ms {
                return Ok(offset);
            }
            position += header.entry_bytes();
            offset += 1;
        }
        if segment_bytes < segment.bytes {
            return Ok(segment_next.max(offset));
        }
        // The segment's maximum is at or after the time, so the scan finds it; reaching here
        // means the in-memory maximum disagrees with the file.
        Err(LogError::Corrupt {
            file: segment.log_path.clone(),
            position,
            reason: format!("no entry at or after time {timestamp_ms} though the index says so"),
        })
    }

    /// The next valid entry after damage at `position`, whose offset was to be `offset`:
    /// `(position, header)`, or `None` if nothing valid follows in the segment.
    fn resume_after(
        &self,
        reader: &mut ChunkReader<'_>,
        position: u64,
        offset: u64,
    ) -> Result<Option<(u64, EntryHeader)>, LogError> {
        let Some(at) = valid_entry_after(&self.storage, reader, position, offset)? else {
            return Ok(None);
        };
        Ok(reader
            .entry(&self.storage, at)?
            .ok()
            .map(|header| (at, header)))
    }

    /// Where a read of `offset` fails, if it does: the damaged entry's file and byte position,
    /// why, and the first offset after it that a read can return again (the next valid entry of
    /// the segment, or the segment's end). `None` when `offset` reads fine. For an operator
    /// deciding what to skip: the offsets in between cannot be read.
    pub fn damage_at(&self, offset: u64) -> Result<Option<Damage>, LogError> {
        if offset < self.start_offset() || offset >= self.next_offset() {
            return Ok(None);
        }
        let index = self.segments.partition_point(|s| s.base_offset <= offset) - 1;
        let segment = &self.segments[index];
        let (segment_next, segment_bytes) = self.in_file(segment);
        if offset >= segment_next {
            return Ok(None);
        }
        let point = segment.seek(&self.storage, offset)?;
        let mut reader = ChunkReader::new(&segment.log_path, segment_bytes, READ_CHUNK_BYTES_MAX);
        let mut position = point.position as u64;
        let mut at = segment.base_offset + point.relative_offset as u64;
        // Bounded by the segment's bytes: each step advances by an entry or to a later one.
        while position < segment_bytes {
            match self.checked_entry(segment, &mut reader, position, at, &point) {
                Ok(_) if at == offset => return Ok(None),
                Ok(header) => {
                    position += header.entry_bytes();
                    at += 1;
                }
                Err(LogError::Corrupt { file, reason, .. }) => {
                    let resumed = self.resume_after(&mut reader, position, at)?;
                    match resumed {
                        Some((next, header)) if header.offset <= offset => {
                            position = next;
                            at = header.offset;
                        }
                        _ => {
                            return Ok(Some(Damage {
                                file,
                                position,
                                reason,
                                first_offset: at,
                                end_offset: resumed.map_or(segment_next, |(_, h)| h.offset),
                            }))
                        }
                    }
                }
                Err(error) => return Err(error),
            }
        }
        Ok(None)
    }

    /// The valid entry at `position`, which must have `offset`; otherwise the damage as an error.
    /// When the position came straight from an index point, the index may be what is damaged,
    /// and the error says so.
    fn checked_entry(
        &self,
        segment: &Segment,
        reader: &mut ChunkReader<'_>,
        position: u64,
        offset: u64,
        point: &IndexPoint,
    ) -> Result<EntryHeader, LogError> {
        let mut reason = match reader.entry(&self.storage, position)? {
            Ok(header) if header.offset == offset => return Ok(header),
            Ok(header) => format!("offset {} where {offset} was expected", header.offset),
            Err(reason) => reason,
        };
        if position == point.position as u64 {
            reason.push_str(&format!(
                " (position from index point for offset {offset} in {}, which may be the damaged file)",
                segment.index_path.display()
            ));
        }
        Err(LogError::Corrupt {
            file: segment.log_path.clone(),
            position,
            reason,
        })
    }

    /// Deletes the oldest closed segment. Its log goes first, so a crash in between leaves index
    /// files without a log, which the next open removes.
    fn delete_oldest(&mut self) -> Result<(), LogError> {
        assert!(
            self.segments.len() > 1,
            "the active segment is never deleted"
        );
        // The segments that stay must outlive a crash before the old one goes: if the active
        // segment's name were lost after its predecessors are deleted, the log would reopen
        // empty and hand out offsets again from zero.
        self.sync_directory_if_pending()?;
        let segment = self.segments.remove(0);
        remove_segment_files(&mut self.storage, &segment)?;
        Ok(())
    }

    /// Deletes whole closed segments whose entries are all below `offset`. Returns how many.
    pub fn delete_segments_below(&mut self, offset: u64) -> Result<usize, LogError> {
        let mut deleted = 0;
        while self.segments.len() > 1 && self.segments[0].next_offset <= offset {
            self.delete_oldest()?;
            deleted += 1;
        }
        Ok(deleted)
    }

    /// Deletes every entry below `offset`, the active segment's too: a non-empty active segment
    /// that ends at or below `offset` is closed first and a new, empty one started at the next
    /// offset (what purging a partition needs; offsets are never handed out again). Returns how
    /// many segments went.
    pub fn delete_all_below(&mut self, offset: u64) -> Result<usize, LogError> {
        let active = self.active();
        if active.next_offset > active.base_offset && active.next_offset <= offset {
            self.roll()?;
        }
        self.delete_segments_below(offset)
    }

    /// Deletes every entry and goes on at `offset`, which must not be below the log's end: the
    /// next entry appended gets `offset`. For a replica whose log ends below the oldest entry the
    /// rest of its group still holds. The old segments go first, so a crash part way leaves
    /// either them or an empty log, never a hole in the sequence.
    pub fn restart_at(&mut self, offset: u64) -> Result<(), LogError> {
        let next = self.next_offset();
        if offset < next {
            return Err(LogError::OffsetOutOfRange {
                offset,
                start_offset: self.start_offset(),
                next_offset: next,
            });
        }
        self.delete_all_below(next)?;
        if offset == next {
            return Ok(());
        }
        // Only the empty active segment is left: replace it with one based at `offset`.
        self.write_deferred()?;
        let empty = self.segments.pop().expect("a log always has a segment");
        let created = remove_segment_files(&mut self.storage, &empty)
            .map_err(LogError::from)
            .and_then(|()| self.create_segment(offset));
        if let Err(error) = created {
            // The log must keep a segment; it refuses writes until reopened, which finds
            // whichever files are there.
            self.failed = Some(error.to_string());
            self.segments.push(empty);
            return Err(error);
        }
        self.sync_directory_if_pending()?;
        if let Some(deferred) = self.deferred.as_mut() {
            deferred.in_file = FileEnd {
                base_offset: offset,
                next_offset: offset,
                bytes: 0,
            };
        }
        self.durable_offset = offset;
        Ok(())
    }

    /// Deletes the oldest closed segments while the log is larger than `size_bytes_max`.
    pub fn delete_segments_over_size(&mut self, size_bytes_max: u64) -> Result<usize, LogError> {
        let mut deleted = 0;
        while self.segments.len() > 1 && self.size_bytes() > size_bytes_max {
            self.delete_oldest()?;
            deleted += 1;
        }
        Ok(deleted)
    }

    /// Deletes the oldest closed segments whose newest entry is at least `age_ms_max` older than
    /// `now_ms`.
    pub fn delete_segments_older_than(
        &mut self,
        now_ms: u64,
        age_ms_max: u64,
    ) -> Result<usize, LogError> {
        let mut deleted = 0;
        while self.segments.len() > 1
            && now_ms.saturating_sub(self.segments[0].timestamp_ms_max) >= age_ms_max
        {
            self.delete_oldest()?;
            deleted += 1;
        }
        Ok(deleted)
    }
}

/// Deletes, in the directory of a log that is not open, the oldest segments whose entries are all
/// below `offset` (a segment goes when the next one starts at or below `offset`; the newest always
/// stays). For a log that cannot be reopened now, such as a failed partition on a full disk whose
/// reopening needs space for a rebuilt index: retention can still free what every subscription
/// settled. The directory is synced before the first deletion, as an open log does it, so that the
/// names of the segments that stay outlive a crash. Returns how many segments went.
pub fn delete_closed_segments_below<S: LogStorage + ?Sized>(
    storage: &mut S,
    dir: &Path,
    offset: u64,
) -> Result<usize, LogError> {
    let mut bases: Vec<u64> = storage
        .list(dir)?
        .iter()
        .filter_map(|name| match parse_file_name(name) {
            Some((base, FileKind::Segment)) => Some(base),
            _ => None,
        })
        .collect();
    bases.sort_unstable();
    let deletable = bases.windows(2).take_while(|w| w[1] <= offset).count();
    if deletable == 0 {
        return Ok(0);
    }
    storage.sync_dir(dir)?;
    for &base in &bases[..deletable] {
        remove_segment_files(storage, &Segment::new(dir, base))?;
    }
    Ok(deletable)
}

/// Removes a segment's file, then its index files where they exist.
fn remove_segment_files<S: LogStorage + ?Sized>(
    storage: &mut S,
    segment: &Segment,
) -> std::io::Result<()> {
    storage.remove(&segment.log_path)?;
    for path in [&segment.index_path, &segment.time_index_path] {
        if storage.exists(path) {
            storage.remove(path)?;
        }
    }
    Ok(())
}

/// Where the files of `active` begin a group of deferred writes of these sizes: its log file
/// ends `log_bytes` before the segment's in-memory end, and its index files hold one point per
/// in-memory point once they are written.
fn file_start(
    active: &Segment,
    log_bytes: usize,
    index_bytes: usize,
    time_index_bytes: usize,
) -> FileStart {
    let points = active.points.len() as u64;
    FileStart {
        base_offset: active.base_offset,
        log: active.bytes - log_bytes as u64,
        index: (points * INDEX_POINT_BYTES as u64).saturating_sub(index_bytes as u64),
        time_index: (points * TIME_INDEX_POINT_BYTES as u64)
            .saturating_sub(time_index_bytes as u64),
    }
}

/// Entries `append` has encoded for the active segment but not yet written.
#[derive(Default)]
struct Pending {
    log: Vec<u8>,
    count: u64,
    points: Vec<IndexPoint>,
    timestamp_ms_max: u64,
    /// `append_shared`: where each pending record sits in `log`, and the records of the buffers
    /// written so far.
    records_at: Vec<Range<usize>>,
    keep: Option<Vec<Bytes>>,
}
