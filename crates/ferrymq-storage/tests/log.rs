//! Rules of the partition log, one test each, on `MemoryStorage` (and once on real files).

use std::cell::Cell;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use ferrymq_storage::{
    delete_closed_segments_below, FileHandles, FileStorage, LogConfig, LogError, LogStorage,
    MemoryStorage, PartitionLog, SyncFn, ENTRY_HEADER_BYTES, RECORD_BYTES_MAX,
};
use proptest::prelude::*;

const DIR: &str = "/data/topic-0";

fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes_max: 1024,
        segment_age_ms_max: 1_000_000,
        index_interval_bytes: 128,
    }
}

fn record(i: u64) -> Vec<u8> {
    format!("record-{i:05}-{}", "x".repeat((i % 17) as usize)).into_bytes()
}

fn open(storage: MemoryStorage, config: LogConfig) -> PartitionLog<MemoryStorage> {
    PartitionLog::open(storage, DIR, config).unwrap().0
}

/// Appends records `from..to` one call each, with timestamp = 1000 + offset.
fn append_range<S: LogStorage>(log: &mut PartitionLog<S>, from: u64, to: u64) {
    for i in from..to {
        let r = record(i);
        let range = log.append(&[(1000 + i, &r)]).unwrap();
        assert_eq!(range, i..i + 1);
    }
}

fn read_all<S: LogStorage>(log: &PartitionLog<S>) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut next = log.start_offset();
    for _ in 0..100_000 {
        let batch = log.read(next, 4096, 100).unwrap();
        if batch.is_empty() {
            return out;
        }
        for entry in batch {
            assert_eq!(entry.offset, next);
            next += 1;
            out.push((entry.offset, entry.record.to_vec()));
        }
    }
    panic!("read_all did not finish");
}

fn segment_path(base: u64) -> PathBuf {
    Path::new(DIR).join(format!("{base:020}.log"))
}

fn file_bytes(storage: &MemoryStorage, path: &Path) -> Vec<u8> {
    let mut buf = vec![0u8; storage.len(path).unwrap() as usize];
    storage.read_at(path, 0, &mut buf).unwrap();
    buf
}

fn bases(storage: &MemoryStorage) -> Vec<u64> {
    let mut bases: Vec<u64> = storage
        .paths()
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .map(|p| p.file_stem().unwrap().to_str().unwrap().parse().unwrap())
        .collect();
    bases.sort();
    bases
}

#[test]
fn a_new_log_is_empty_and_appends_get_dense_offsets() {
    let (mut log, report) = PartitionLog::open(MemoryStorage::new(), DIR, small_config()).unwrap();
    assert_eq!((report.start_offset, report.next_offset), (0, 0));
    assert_eq!(log.read(0, 100, 100).unwrap(), vec![]);
    let batch: Vec<Vec<u8>> = (0..5).map(record).collect();
    let entries: Vec<(u64, &[u8])> = batch.iter().map(|r| (7, r.as_slice())).collect();
    assert_eq!(log.append(&entries).unwrap(), 0..5);
    assert_eq!(log.append(&[]).unwrap(), 5..5);
    assert_eq!(log.next_offset(), 5);
    let read = log.read(2, 1 << 20, 10).unwrap();
    assert_eq!(read.len(), 3);
    assert_eq!(read[0].offset, 2);
    assert_eq!(read[0].timestamp_ms, 7);
    assert_eq!(read[0].record.as_ref(), record(2).as_slice());
}

#[test]
fn read_honours_count_and_bytes_but_always_returns_one() {
    let mut log = open(MemoryStorage::new(), small_config());
    append_range(&mut log, 0, 10);
    assert_eq!(log.read(0, 1 << 20, 3).unwrap().len(), 3);
    assert_eq!(log.read(0, 1, 10).unwrap().len(), 1);
    let two = record(0).len() + record(1).len();
    assert_eq!(log.read(0, two, 10).unwrap().len(), 2);
    assert_eq!(log.read(0, 100, 0).unwrap(), vec![]);
    assert!(matches!(
        log.read(11, 100, 1),
        Err(LogError::OffsetOutOfRange { offset: 11, .. })
    ));
}

#[test]
fn segments_roll_by_size_and_reads_cross_them() {
    let mut log = open(MemoryStorage::new(), small_config());
    append_range(&mut log, 0, 200);
    assert!(log.segments_count() > 5, "{}", log.segments_count());
    let all = read_all(&log);
    assert_eq!(all.len(), 200);
    for (offset, bytes) in &all {
        assert_eq!(bytes, &record(*offset));
    }
    // Every segment stays within its limit, and is named by its first offset.
    let storage = log.into_storage();
    let bases = bases(&storage);
    for base in &bases {
        assert!(storage.len(&segment_path(*base)).unwrap() <= 1024);
    }
    let (log, report) = PartitionLog::open(storage, DIR, small_config()).unwrap();
    assert_eq!(report.next_offset, 200);
    assert_eq!(report.truncation, None);
    assert!(report.indexes_rebuilt.is_empty(), "{report:?}");
    assert_eq!(read_all(&log), all);
    for base in bases {
        assert_eq!(log.read(base, 10, 1).unwrap()[0].offset, base);
    }
}

#[test]
fn a_record_larger_than_a_segment_gets_a_segment_of_its_own() {
    let mut log = open(MemoryStorage::new(), small_config());
    append_range(&mut log, 0, 3);
    let big = vec![7u8; 5000];
    assert_eq!(log.append(&[(1, &big)]).unwrap(), 3..4);
    append_range(&mut log, 4, 6);
    assert_eq!(log.read(3, 10, 10).unwrap()[0].record.len(), 5000);
    assert_eq!(log.segments_count(), 3);
}

#[test]
fn segments_roll_by_age_of_their_first_entry() {
    let config = LogConfig {
        segment_age_ms_max: 100,
        ..LogConfig::default()
    };
    let mut log = open(MemoryStorage::new(), config);
    for (i, ts) in [0u64, 50, 99, 100, 150, 250].iter().enumerate() {
        let r = record(i as u64);
        log.append(&[(*ts, &r)]).unwrap();
    }
    // 0,50,99 | 100,150 | 250
    assert_eq!(log.segments_count(), 3);
    assert_eq!(bases(log.storage()), vec![0, 3, 5]);
}

#[test]
fn oversize_records_are_refused_before_anything_is_written() {
    let mut log = open(MemoryStorage::new(), small_config());
    let ok = record(0);
    let big = vec![0u8; RECORD_BYTES_MAX + 1];
    let err = log.append(&[(1, &ok), (2, &big)]).unwrap_err();
    assert!(matches!(err, LogError::RecordTooLarge { .. }), "{err}");
    assert_eq!(log.next_offset(), 0);
}

#[test]
fn invalid_config_is_refused() {
    let config = LogConfig {
        index_interval_bytes: 0,
        ..LogConfig::default()
    };
    let err = PartitionLog::open(MemoryStorage::new(), DIR, config).unwrap_err();
    assert!(err.to_string().contains("index_interval_bytes"), "{err}");
}

/// A storage that records the lowest position read from `.log` files, to prove reads seek.
struct ReadTracking {
    inner: MemoryStorage,
    lowest_log_read: Cell<u64>,
}

impl LogStorage for ReadTracking {
    fn create_dir_all(&mut self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn create(&mut self, path: &Path) -> io::Result<()> {
        self.inner.create(path)
    }
    fn len(&self, path: &Path) -> io::Result<u64> {
        self.inner.len(path)
    }
    fn append(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.inner.append(path, bytes)
    }
    fn read_at(&self, path: &Path, position: u64, buf: &mut [u8]) -> io::Result<()> {
        if path.extension().is_some_and(|e| e == "log") {
            self.lowest_log_read
                .set(self.lowest_log_read.get().min(position));
        }
        self.inner.read_at(path, position, buf)
    }
    fn sync(&mut self, path: &Path) -> io::Result<()> {
        self.inner.sync(path)
    }
    fn sync_dir(&mut self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
    fn truncate(&mut self, path: &Path, len: u64) -> io::Result<()> {
        self.inner.truncate(path, len)
    }
    fn remove(&mut self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
}

#[test]
fn reads_and_time_lookups_seek_with_the_index_instead_of_scanning() {
    let config = LogConfig {
        index_interval_bytes: 256,
        ..LogConfig::default()
    };
    let storage = ReadTracking {
        inner: MemoryStorage::new(),
        lowest_log_read: Cell::new(u64::MAX),
    };
    let (mut log, _) = PartitionLog::open(storage, DIR, config.clone()).unwrap();
    append_range(&mut log, 0, 5000);
    let entry_bytes_max = (ENTRY_HEADER_BYTES + record(16).len()) as u64;

    // Offset 4000 starts near byte 4000 * average entry size; the read must start within one
    // index interval (plus one entry) before it.
    let position_of_4000: u64 = (0..4000)
        .map(|i| (ENTRY_HEADER_BYTES + record(i).len()) as u64)
        .sum();
    log.storage().lowest_log_read.set(u64::MAX);
    assert_eq!(log.read(4000, 100, 1).unwrap()[0].offset, 4000);
    let lowest = log.storage().lowest_log_read.get();
    assert!(lowest <= position_of_4000, "{lowest} {position_of_4000}");
    assert!(
        position_of_4000 - lowest <= 256 + entry_bytes_max,
        "read started at {lowest}, entry is at {position_of_4000}"
    );

    log.storage().lowest_log_read.set(u64::MAX);
    assert_eq!(log.offset_for_time(1000 + 4000).unwrap(), 4000);
    let lowest = log.storage().lowest_log_read.get();
    assert!(position_of_4000 - lowest <= 256 + entry_bytes_max);
}

#[test]
fn closed_segments_are_searched_in_their_index_files() {
    let config = LogConfig {
        segment_bytes_max: 64 * 1024,
        index_interval_bytes: 256,
        ..LogConfig::default()
    };
    let storage = ReadTracking {
        inner: MemoryStorage::new(),
        lowest_log_read: Cell::new(u64::MAX),
    };
    let (mut log, _) = PartitionLog::open(storage, DIR, config.clone()).unwrap();
    append_range(&mut log, 0, 5000);
    assert!(log.segments_count() >= 3);
    // Both before and after a reopen (which loads closed segments from disk).
    for reopen in [false, true] {
        if reopen {
            log = PartitionLog::open(log.into_storage(), DIR, config.clone())
                .unwrap()
                .0;
        }
        let position_of_1000: u64 = (0..1000)
            .map(|i| (ENTRY_HEADER_BYTES + record(i).len()) as u64)
            .sum();
        assert!(position_of_1000 < 64 * 1024, "offset 1000 is in segment 0");
        let entry_bytes_max = (ENTRY_HEADER_BYTES + record(16).len()) as u64;
        log.storage().lowest_log_read.set(u64::MAX);
        let got = log.read(1000, 1 << 20, 1).unwrap();
        assert_eq!(got[0].offset, 1000);
        assert_eq!(got[0].record.as_ref(), record(1000).as_slice());
        let lowest = log.storage().lowest_log_read.get();
        assert!(
            lowest <= position_of_1000 && position_of_1000 - lowest <= 256 + entry_bytes_max,
            "read started at {lowest}, entry is at {position_of_1000}"
        );
        log.storage().lowest_log_read.set(u64::MAX);
        assert_eq!(log.offset_for_time(1000 + 1000).unwrap(), 1000);
        let lowest = log.storage().lowest_log_read.get();
        assert!(position_of_1000 - lowest <= 256 + entry_bytes_max);
        // Every offset of every segment still reads back.
        for offset in (0..5000).step_by(7) {
            assert_eq!(log.read(offset, 1, 1).unwrap()[0].offset, offset);
            assert_eq!(log.offset_for_time(1000 + offset).unwrap(), offset);
        }
    }
}

#[test]
fn offset_for_time_finds_the_first_entry_at_or_after_a_time() {
    let mut log = open(MemoryStorage::new(), small_config());
    append_range(&mut log, 0, 300); // timestamps 1000..1300
    assert_eq!(log.offset_for_time(0).unwrap(), 0);
    assert_eq!(log.offset_for_time(1000).unwrap(), 0);
    assert_eq!(log.offset_for_time(1001).unwrap(), 1);
    for target in [1017u64, 1100, 1201, 1299] {
        assert_eq!(log.offset_for_time(target).unwrap(), target - 1000);
    }
    assert_eq!(log.offset_for_time(1300).unwrap(), 300);
    assert_eq!(log.offset_for_time(u64::MAX).unwrap(), 300);
    // Out-of-order timestamps count as their running maximum.
    log.append(&[(5000, b"late"), (2000, b"earlier")]).unwrap();
    assert_eq!(log.offset_for_time(1500).unwrap(), 300);
    assert_eq!(log.offset_for_time(5000).unwrap(), 300);
}

#[test]
fn reopening_continues_offsets_and_indexes() {
    let mut log = open(MemoryStorage::new(), small_config());
    append_range(&mut log, 0, 50);
    log.sync().unwrap();
    let (mut log, report) = PartitionLog::open(log.into_storage(), DIR, small_config()).unwrap();
    assert_eq!(report.next_offset, 50);
    append_range(&mut log, 50, 120);
    let all = read_all(&log);
    assert_eq!(all.len(), 120);
    assert!(all.iter().all(|(o, r)| r == &record(*o)));
}

#[test]
fn a_torn_tail_is_truncated_and_reported() {
    let mut log = open(MemoryStorage::new(), LogConfig::default());
    append_range(&mut log, 0, 10);
    let mut storage = log.into_storage();
    let path = segment_path(0);
    let len = storage.len(&path).unwrap();
    // Half of the last entry is lost.
    let last_len = (ENTRY_HEADER_BYTES + record(9).len()) as u64;
    storage.truncate(&path, len - last_len / 2).unwrap();
    let (mut log, report) = PartitionLog::open(storage, DIR, LogConfig::default()).unwrap();
    let truncation = report.truncation.expect("a truncation");
    assert_eq!(truncation.file, path);
    assert_eq!(truncation.position, len - last_len);
    assert_eq!(truncation.bytes_dropped, last_len - last_len / 2);
    assert_eq!(log.next_offset(), 9);
    append_range(&mut log, 9, 12);
    assert_eq!(read_all(&log).len(), 12);
}

#[test]
fn a_garbage_tail_is_truncated_and_reported() {
    let mut log = open(MemoryStorage::new(), small_config());
    append_range(&mut log, 0, 30);
    let mut storage = log.into_storage();
    let last = *bases(&storage).last().unwrap();
    let path = segment_path(last);
    let len = storage.len(&path).unwrap();
    storage.append(&path, &[0xAB; 37]).unwrap();
    let (log, report) = PartitionLog::open(storage, DIR, small_config()).unwrap();
    let truncation = report.truncation.expect("a truncation");
    assert_eq!(
        (
            truncation.file,
            truncation.position,
            truncation.bytes_dropped
        ),
        (path, len, 37)
    );
    assert_eq!(log.next_offset(), 30);
}

#[test]
fn corruption_before_good_entries_in_the_last_segment_fails_open_with_file_and_position() {
    let mut log = open(MemoryStorage::new(), LogConfig::default());
    append_range(&mut log, 0, 10);
    let storage = log.into_storage();
    let path = segment_path(0);
    let position_of_3: u64 = (0..3)
        .map(|i| (ENTRY_HEADER_BYTES + record(i).len()) as u64)
        .sum();
    storage.flip_bit(&path, position_of_3 + 30, 2).unwrap();
    let err = PartitionLog::open(storage, DIR, LogConfig::default()).unwrap_err();
    match &err {
        LogError::Corrupt { file, position, .. } => {
            assert_eq!((file, *position), (&path, position_of_3));
        }
        other => panic!("{other}"),
    }
    let message = err.to_string();
    assert!(message.contains("00000000000000000000.log"), "{message}");
    assert!(
        message.contains(&format!("byte {position_of_3}")),
        "{message}"
    );
}

#[test]
fn corruption_inside_a_closed_segment_is_never_served() {
    let mut log = open(MemoryStorage::new(), small_config());
    append_range(&mut log, 0, 100);
    let storage = log.into_storage();
    // Damage entry 1 of segment 0: before its tail, so open does not scan it.
    let path = segment_path(0);
    let position_of_1 = (ENTRY_HEADER_BYTES + record(0).len()) as u64;
    storage.flip_bit(&path, position_of_1 + 26, 0).unwrap();
    let (log, _) = PartitionLog::open(storage, DIR, small_config()).unwrap();
    // A read from before the damage gets the entries up to it, and stops there.
    let before = log.read(0, 1 << 20, 100).unwrap();
    assert_eq!(before.iter().map(|e| e.offset).collect::<Vec<_>>(), [0]);
    // The damaged entry itself is an error naming file and position.
    let err = log.read(1, 1 << 20, 100).unwrap_err();
    match err {
        LogError::Corrupt { file, position, .. } => {
            assert_eq!((file, position), (path, position_of_1))
        }
        other => panic!("{other}"),
    }
    // Entries of later segments are served.
    assert_eq!(log.read(99, 1 << 20, 1).unwrap()[0].offset, 99);
}

#[test]
fn damage_at_the_end_of_a_closed_segment_fails_open() {
    let mut log = open(MemoryStorage::new(), small_config());
    append_range(&mut log, 0, 100);
    let mut storage = log.into_storage();
    let path = segment_path(0);
    let len = storage.len(&path).unwrap();
    storage.truncate(&path, len - 3).unwrap();
    let err = PartitionLog::open(storage, DIR, small_config()).unwrap_err();
    assert!(
        matches!(&err, LogError::Corrupt { file, .. } if file == &path),
        "{err}"
    );
}

#[test]
fn a_missing_middle_segment_is_detected() {
    let mut log = open(MemoryStorage::new(), small_config());
    append_range(&mut log, 0, 200);
    let mut storage = log.into_storage();
    let bases = bases(&storage);
    assert!(bases.len() >= 3);
    storage.remove(&segment_path(bases[1])).unwrap();
    let err = PartitionLog::open(storage, DIR, small_config()).unwrap_err();
    match &err {
        LogError::MissingSegment {
            expected_base_offset,
            found_base_offset,
            ..
        } => assert_eq!(
            (*expected_base_offset, *found_base_offset),
            (bases[1], bases[2])
        ),
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains(&format!("{:020}.log", bases[2])));
}

#[test]
fn a_missing_or_stale_index_is_rebuilt_identically() {
    let mut log = open(
        MemoryStorage::new(),
        LogConfig {
            index_interval_bytes: 64,
            ..LogConfig::default()
        },
    );
    append_range(&mut log, 0, 300);
    log.sync().unwrap();
    let mut storage = log.into_storage();
    let index = Path::new(DIR).join(format!("{:020}.index", 0));
    let time_index = Path::new(DIR).join(format!("{:020}.timeindex", 0));
    let original = (
        file_bytes(&storage, &index),
        file_bytes(&storage, &time_index),
    );
    assert!(original.0.len() > 8 * 10);

    storage.remove(&index).unwrap();
    let config = LogConfig {
        index_interval_bytes: 64,
        ..LogConfig::default()
    };
    let (log, report) = PartitionLog::open(storage, DIR, config.clone()).unwrap();
    assert_eq!(report.indexes_rebuilt, vec![index.clone()]);
    assert_eq!(read_all(&log).len(), 300);
    let mut storage = log.into_storage();
    assert_eq!(
        (
            file_bytes(&storage, &index),
            file_bytes(&storage, &time_index)
        ),
        original
    );

    // An index whose last points are garbage is repaired the same way.
    storage.append(&index, &[0xFF; 16]).unwrap();
    storage.append(&time_index, &[0xFF; 24]).unwrap();
    let (log, report) = PartitionLog::open(storage, DIR, config.clone()).unwrap();
    assert_eq!(report.indexes_rebuilt, vec![index.clone()]);
    let storage = log.into_storage();
    assert_eq!(file_bytes(&storage, &index), original.0);

    // An index pointing at the wrong place is not trusted.
    let len = storage.len(&index).unwrap();
    storage.flip_bit(&index, len - 3, 1).unwrap();
    let (log, report) = PartitionLog::open(storage, DIR, config).unwrap();
    assert_eq!(report.indexes_rebuilt, vec![index.clone()]);
    assert_eq!(read_all(&log).len(), 300);
}

#[test]
fn orphan_index_files_are_removed() {
    let mut storage = MemoryStorage::new();
    storage.create_dir_all(Path::new(DIR)).unwrap();
    let orphan = Path::new(DIR).join(format!("{:020}.index", 77));
    storage.create(&orphan).unwrap();
    let (_, report) = PartitionLog::open(storage, DIR, small_config()).unwrap();
    assert_eq!(report.orphans_removed, vec![orphan]);
}

#[test]
fn retention_of_a_closed_log_deletes_settled_segments_from_its_directory() {
    let mut log = open(MemoryStorage::new(), small_config());
    append_range(&mut log, 0, 200);
    let mut storage = log.into_storage();
    let all = bases(&storage);
    assert!(all.len() > 3, "{all:?}");
    let dir = Path::new(DIR);
    // Nothing below the second segment's base is settled past the first segment's end.
    assert_eq!(
        delete_closed_segments_below(&mut storage, dir, all[1] - 1).unwrap(),
        0
    );
    assert_eq!(bases(&storage), all);
    assert_eq!(
        delete_closed_segments_below(&mut storage, dir, all[2]).unwrap(),
        2
    );
    assert_eq!(bases(&storage), all[2..]);
    for base in &all[..2] {
        for name in [format!("{base:020}.index"), format!("{base:020}.timeindex")] {
            assert!(!storage.exists(&dir.join(name)));
        }
    }
    // The newest segment stays, whatever is settled.
    let last = *all.last().unwrap();
    delete_closed_segments_below(&mut storage, dir, u64::MAX).unwrap();
    assert_eq!(bases(&storage), [last]);
    let (log, report) = PartitionLog::open(storage, DIR, small_config()).unwrap();
    assert!(report.orphans_removed.is_empty(), "{report:?}");
    assert_eq!((log.start_offset(), log.next_offset()), (last, 200));
}

#[test]
fn a_log_restarted_at_a_later_offset_holds_nothing_before_it_and_reopens_there() {
    let mut log = open(MemoryStorage::new(), small_config());
    append_range(&mut log, 0, 100);
    assert!(matches!(
        log.restart_at(99),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    log.restart_at(500).unwrap();
    assert_eq!((log.start_offset(), log.next_offset()), (500, 500));
    assert_eq!(bases(log.storage()), [500]);
    assert!(matches!(
        log.read(50, 10, 1),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    append_range(&mut log, 500, 520);
    log.sync().unwrap();
    assert_eq!(log.read(500, 1 << 20, 1).unwrap()[0].offset, 500);
    let (reopened, _) = PartitionLog::open(log.into_storage(), DIR, small_config()).unwrap();
    assert_eq!(
        (reopened.start_offset(), reopened.next_offset()),
        (500, 520)
    );

    // At its own end: everything goes, the offsets go on.
    let mut log = open(MemoryStorage::new(), small_config());
    append_range(&mut log, 0, 30);
    log.restart_at(30).unwrap();
    assert_eq!((log.start_offset(), log.next_offset()), (30, 30));
}

#[test]
fn retention_deletes_whole_closed_segments_only() {
    let mut log = open(MemoryStorage::new(), small_config());
    append_range(&mut log, 0, 200);
    let segments = log.segments_count();
    let second_base = bases(log.storage())[1];

    assert_eq!(log.delete_segments_below(second_base - 1).unwrap(), 0);
    assert_eq!(log.delete_segments_below(second_base).unwrap(), 1);
    assert_eq!(log.start_offset(), second_base);
    assert!(matches!(
        log.read(0, 10, 1),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    assert_eq!(log.read(second_base, 10, 1).unwrap()[0].offset, second_base);
    assert!(!log.storage().exists(&segment_path(0)));
    assert!(!log
        .storage()
        .exists(&Path::new(DIR).join(format!("{:020}.index", 0))));

    let size = log.size_bytes();
    assert_eq!(log.delete_segments_over_size(size).unwrap(), 0);
    assert_eq!(log.delete_segments_over_size(size - 1).unwrap(), 1);

    // Timestamps are 1000 + offset: segments whose newest entry is older than 1100 go.
    let deleted = log.delete_segments_older_than(1200, 100).unwrap();
    assert!(deleted >= 1);
    // The newest entry of every deleted segment (start - 1) is at most 1100; segments hold
    // fewer than 40 entries, so the next one was not old enough.
    let start = log.start_offset();
    assert!((60..=101).contains(&start), "{start}");

    // The active segment stays, whatever the limits say.
    log.delete_segments_over_size(0).unwrap();
    log.delete_segments_below(u64::MAX).unwrap();
    assert_eq!(log.segments_count(), 1);
    assert!(segments > 3);
    assert_eq!(log.next_offset(), 200);
    let start = log.start_offset();
    let (log, _) = PartitionLog::open(log.into_storage(), DIR, small_config()).unwrap();
    assert_eq!((log.start_offset(), log.next_offset()), (start, 200));
}

#[test]
fn real_files_roundtrip_across_reopen() {
    let dir = std::env::temp_dir().join(format!("ferrymq-storage-log-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (mut log, _) = PartitionLog::open(FileStorage::new(), &dir, small_config()).unwrap();
    append_range(&mut log, 0, 100);
    log.sync().unwrap();
    drop(log);
    let (mut log, report) = PartitionLog::open(FileStorage::new(), &dir, small_config()).unwrap();
    assert_eq!(report.next_offset, 100);
    assert!(report.indexes_rebuilt.is_empty(), "{report:?}");
    append_range(&mut log, 100, 110);
    let all = read_all(&log);
    assert_eq!(all.len(), 110);
    assert!(all.iter().all(|(o, r)| r == &record(*o)));
    std::fs::remove_dir_all(&dir).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn append_read_roundtrips_across_segment_rolls(
        batches in prop::collection::vec(
            prop::collection::vec((0u64..10_000, prop::collection::vec(any::<u8>(), 0..300)), 1..20),
            1..20,
        ),
        segment_bytes_max in 64u64..4096,
        index_interval_bytes in 1u32..1024,
        reopen_every in 1usize..10,
    ) {
        let config = LogConfig { segment_bytes_max, index_interval_bytes, ..LogConfig::default() };
        let mut log = PartitionLog::open(MemoryStorage::new(), DIR, config.clone()).unwrap().0;
        let mut expected: Vec<(u64, Vec<u8>)> = Vec::new();
        for (i, batch) in batches.iter().enumerate() {
            let entries: Vec<(u64, &[u8])> = batch.iter().map(|(t, r)| (*t, r.as_slice())).collect();
            let range = log.append(&entries).unwrap();
            prop_assert_eq!(range.start, expected.len() as u64);
            prop_assert_eq!(range.end, (expected.len() + batch.len()) as u64);
            expected.extend(batch.iter().cloned());
            if i % reopen_every == 0 {
                let (reopened, report) = PartitionLog::open(log.into_storage(), DIR, config.clone()).unwrap();
                prop_assert!(report.truncation.is_none());
                prop_assert!(report.indexes_rebuilt.is_empty());
                log = reopened;
            }
        }
        // Every offset reads back as appended, from any starting point.
        for (from, (timestamp_ms, record)) in expected.iter().enumerate() {
            let got = log.read(from as u64, 1, 1).unwrap();
            prop_assert_eq!(got.len(), 1);
            prop_assert_eq!(got[0].offset, from as u64);
            prop_assert_eq!(got[0].timestamp_ms, *timestamp_ms);
            prop_assert_eq!(got[0].record.as_ref(), record.as_slice());
        }
        let all = read_all(&log);
        prop_assert_eq!(all.len(), expected.len());
    }
}

/// Fails chosen operations the way a full disk does: an append writes part of its bytes, then
/// reports an error.
struct FlakyStorage {
    inner: MemoryStorage,
    /// Shared with the test, which arms faults while the log owns the storage.
    faults: Rc<Faults>,
}

#[derive(Default)]
struct Faults {
    /// The next append to a `.log` file writes this many bytes, then fails.
    fail_next_log_append_after_bytes: Cell<Option<usize>>,
    fail_truncate: Cell<bool>,
    fail_next_sync: Cell<bool>,
}

impl LogStorage for FlakyStorage {
    fn create_dir_all(&mut self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn create(&mut self, path: &Path) -> io::Result<()> {
        self.inner.create(path)
    }
    fn len(&self, path: &Path) -> io::Result<u64> {
        self.inner.len(path)
    }
    fn append(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        if path.extension().is_some_and(|e| e == "log") {
            if let Some(written) = self.faults.fail_next_log_append_after_bytes.take() {
                self.inner
                    .append(path, &bytes[..written.min(bytes.len())])?;
                return Err(io::Error::other(format!(
                    "append to {}: no space left on device",
                    path.display()
                )));
            }
        }
        self.inner.append(path, bytes)
    }
    fn read_at(&self, path: &Path, position: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(path, position, buf)
    }
    fn sync(&mut self, path: &Path) -> io::Result<()> {
        if self.faults.fail_next_sync.take() {
            return Err(io::Error::other(format!(
                "sync {}: input/output error",
                path.display()
            )));
        }
        self.inner.sync(path)
    }
    fn sync_dir(&mut self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
    /// A failing deferred sync fails when it runs, as an fsync on the sync thread would.
    fn sync_later(&mut self, path: &Path) -> io::Result<SyncFn> {
        if self.faults.fail_next_sync.take() {
            let error = io::Error::other(format!("sync {}: input/output error", path.display()));
            return Ok(Box::new(move || Err(error)));
        }
        self.inner.sync_later(path)
    }
    fn truncate(&mut self, path: &Path, len: u64) -> io::Result<()> {
        if self.faults.fail_truncate.get() {
            return Err(io::Error::other(format!(
                "truncate {}: injected failure",
                path.display()
            )));
        }
        self.inner.truncate(path, len)
    }
    fn remove(&mut self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
}

#[test]
fn a_failed_append_is_undone_and_the_log_goes_on() {
    let faults = Rc::new(Faults::default());
    let storage = FlakyStorage {
        inner: MemoryStorage::new(),
        faults: Rc::clone(&faults),
    };
    let (mut log, _) = PartitionLog::open(storage, DIR, small_config()).unwrap();
    append_range(&mut log, 0, 5);
    faults.fail_next_log_append_after_bytes.set(Some(10));
    let r = record(5);
    let err = log.append(&[(1005, &r)]).unwrap_err();
    assert!(err.to_string().contains("no space left"), "{err}");
    assert_eq!(log.next_offset(), 5);
    append_range(&mut log, 5, 8);
    assert_eq!(read_all(&log).len(), 8);
    let (log, report) = PartitionLog::open(log.into_storage(), DIR, small_config()).unwrap();
    assert_eq!(report.truncation, None);
    assert_eq!(read_all(&log).len(), 8);
}

#[test]
fn a_failed_append_that_cannot_be_undone_stops_writes_until_reopened() {
    let faults = Rc::new(Faults::default());
    let storage = FlakyStorage {
        inner: MemoryStorage::new(),
        faults: Rc::clone(&faults),
    };
    let (mut log, _) = PartitionLog::open(storage, DIR, small_config()).unwrap();
    append_range(&mut log, 0, 5);
    faults.fail_next_log_append_after_bytes.set(Some(10));
    faults.fail_truncate.set(true);
    let r = record(5);
    log.append(&[(1005, &r)]).unwrap_err();
    let err = log.append(&[(1005, &r)]).unwrap_err();
    assert!(matches!(err, LogError::Failed { .. }), "{err}");
    assert!(err.to_string().contains("reopen"), "{err}");
    // Reads of what was written still work.
    assert_eq!(read_all(&log).len(), 5);
    faults.fail_truncate.set(false);
    let (mut log, report) = PartitionLog::open(log.into_storage(), DIR, small_config()).unwrap();
    assert_eq!(report.truncation.unwrap().bytes_dropped, 10);
    append_range(&mut log, 5, 7);
    assert_eq!(read_all(&log).len(), 7);
}

#[test]
fn a_failed_sync_stops_the_log_until_it_is_reopened() {
    let faults = Rc::new(Faults::default());
    let storage = FlakyStorage {
        inner: MemoryStorage::new(),
        faults: Rc::clone(&faults),
    };
    let (mut log, _) = PartitionLog::open(storage, DIR, small_config()).unwrap();
    append_range(&mut log, 0, 5);
    faults.fail_next_sync.set(true);
    let err = log.sync().unwrap_err();
    assert!(err.to_string().contains("input/output error"), "{err}");
    // A retried sync must not report success for pages the kernel may have dropped.
    assert!(matches!(log.sync(), Err(LogError::Failed { .. })));
    let r = record(5);
    assert!(matches!(
        log.append(&[(1005, &r)]),
        Err(LogError::Failed { .. })
    ));
    assert_eq!(read_all(&log).len(), 5);
    let (mut log, _) = PartitionLog::open(log.into_storage(), DIR, small_config()).unwrap();
    append_range(&mut log, 5, 7);
    log.sync().unwrap();
    assert_eq!(read_all(&log).len(), 7);
}

#[test]
fn a_failed_deferred_sync_stops_the_log_when_it_is_finished() {
    let faults = Rc::new(Faults::default());
    let storage = FlakyStorage {
        inner: MemoryStorage::new(),
        faults: Rc::clone(&faults),
    };
    let (mut log, _) = PartitionLog::open(storage, DIR, small_config()).unwrap();
    append_range(&mut log, 0, 5);
    faults.fail_next_sync.set(true);
    let job = log.begin_sync().unwrap();
    // Capturing succeeded; the log is still writable until the job is finished.
    append_range(&mut log, 5, 6);
    let err = log.finish_sync(job.run()).unwrap_err();
    assert!(err.to_string().contains("input/output error"), "{err}");
    assert!(log.failed_reason().is_some());
    assert!(matches!(log.begin_sync(), Err(LogError::Failed { .. })));
    assert_eq!(read_all(&log).len(), 6);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever bytes the files hold, opening and reading return results, never panic, and
    /// whatever is served is a valid entry at its offset.
    #[test]
    fn arbitrary_file_contents_never_panic(
        prefix_entries in 0u64..20,
        log_garbage in prop::collection::vec(any::<u8>(), 0..400),
        index_bytes in prop::collection::vec(any::<u8>(), 0..64),
        time_index_bytes in prop::collection::vec(any::<u8>(), 0..96),
        second_segment in any::<bool>(),
    ) {
        let mut log = open(MemoryStorage::new(), small_config());
        append_range(&mut log, 0, prefix_entries);
        let mut storage = log.into_storage();
        let base = *bases(&storage).last().unwrap();
        let path = segment_path(base);
        storage.append(&path, &log_garbage).unwrap();
        let index = Path::new(DIR).join(format!("{base:020}.index"));
        let time_index = Path::new(DIR).join(format!("{base:020}.timeindex"));
        storage.truncate(&index, 0).unwrap();
        storage.append(&index, &index_bytes).unwrap();
        storage.truncate(&time_index, 0).unwrap();
        storage.append(&time_index, &time_index_bytes).unwrap();
        if second_segment {
            let next = segment_path(base + 1_000);
            storage.create(&next).unwrap();
            storage.append(&next, &log_garbage).unwrap();
        }
        if let Ok((log, _)) = PartitionLog::open(storage, DIR, small_config()) {
            for offset in log.start_offset()..log.next_offset() {
                if let Ok(entries) = log.read(offset, 1 << 20, 1) {
                    prop_assert_eq!(entries[0].offset, offset);
                    if offset < prefix_entries {
                        let expected = record(offset);
                        prop_assert_eq!(entries[0].record.as_ref(), expected.as_slice());
                    }
                }
            }
            let _ = log.offset_for_time(1005);
        }
    }
}

#[test]
fn logs_sharing_a_bounded_set_of_handles_keep_working_past_the_bound() {
    let dir = std::env::temp_dir().join(format!("ferrymq-storage-handles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let handles = FileHandles::new(4);
    let mut logs: Vec<_> = (0..10)
        .map(|i| {
            let storage = FileStorage::with_handles(handles.clone());
            PartitionLog::open(storage, dir.join(i.to_string()), small_config())
                .unwrap()
                .0
        })
        .collect();
    for round in 0..5u64 {
        for (i, log) in logs.iter_mut().enumerate() {
            let record = format!("log {i} round {round}");
            log.append(&[(round, record.as_bytes())]).unwrap();
            log.sync().unwrap();
            assert!(handles.len() <= 4, "{} handles open", handles.len());
        }
    }
    for (i, log) in logs.iter().enumerate() {
        let entries = log.read(0, usize::MAX, 100).unwrap();
        let bodies: Vec<String> = entries
            .iter()
            .map(|e| String::from_utf8(e.record.to_vec()).unwrap())
            .collect();
        let want: Vec<String> = (0..5).map(|r| format!("log {i} round {r}")).collect();
        assert_eq!(bodies, want);
    }
    drop(logs);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn append_shared_returns_each_record_as_written_when_the_batch_rolls_a_segment() {
    let (mut log, _) = PartitionLog::open(MemoryStorage::new(), "/p", small_config()).unwrap();
    log.append(&[(7, b"first".as_slice())]).unwrap();
    let records: Vec<Vec<u8>> = (0..50u8).map(|i| vec![i; 10 + i as usize]).collect();
    let entries: Vec<(u64, &[u8])> = records.iter().map(|r| (7, r.as_slice())).collect();
    let segments_before = log.segments_count();
    let (range, shared) = log.append_shared(&entries).unwrap();
    // Larger than a segment: it gets one of its own, whole, rather than being split.
    assert_eq!(
        log.segments_count(),
        segments_before + 1,
        "one roll, before the batch"
    );
    assert_eq!(range, 1..51);
    assert_eq!(shared.len(), 50);
    for (got, want) in shared.iter().zip(&records) {
        assert_eq!(got.as_ref(), want.as_slice());
    }
    let read: Vec<Vec<u8>> = log
        .read(1, usize::MAX, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.record.to_vec())
        .collect();
    assert_eq!(read, records);
}

#[test]
fn a_damaged_entry_is_located_and_reads_get_past_it_only_where_it_ends() {
    let storage = MemoryStorage::new();
    let config = LogConfig {
        index_interval_bytes: 4096,
        ..small_config()
    };
    let config = LogConfig {
        segment_bytes_max: 1 << 20,
        ..config
    };
    let mut log = open(storage.clone(), config);
    append_range(&mut log, 0, 40);
    log.sync().unwrap();
    // A flipped bit in the body of entry 10: between two index points (one point, at 0).
    let position = (0..10)
        .map(|i| (ENTRY_HEADER_BYTES + record(i).len()) as u64)
        .sum::<u64>();
    storage
        .flip_bit(
            &segment_path(0),
            position + ENTRY_HEADER_BYTES as u64 + 2,
            3,
        )
        .unwrap();
    // A read from before the damage gets the entries up to it, then the damaged one fails.
    let before = log.read(5, usize::MAX, 100).unwrap();
    assert_eq!(
        before.iter().map(|e| e.offset).collect::<Vec<_>>(),
        (5..10).collect::<Vec<_>>()
    );
    let err = log.read(10, usize::MAX, 100).unwrap_err();
    assert!(
        matches!(&err, LogError::Corrupt { position: p, .. } if *p == position),
        "{err}"
    );
    // The damage is located with the offsets it hides, and entries after it read again.
    let damage = log.damage_at(10).unwrap().expect("damage at 10");
    assert_eq!(damage.file, segment_path(0));
    assert_eq!(damage.position, position);
    assert_eq!((damage.first_offset, damage.end_offset), (10, 11));
    assert_eq!(log.damage_at(9).unwrap(), None);
    assert_eq!(log.damage_at(11).unwrap(), None);
    let after = log.read(11, usize::MAX, 100).unwrap();
    assert_eq!(after.first().map(|e| e.offset), Some(11));
    assert_eq!(after.len(), 29);
}
