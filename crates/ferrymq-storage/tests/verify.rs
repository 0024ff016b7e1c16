//! `verify_partition`: a clean log verifies clean, each kind of damage is found with its file and
//! byte position, and verifying changes nothing.

use std::path::{Path, PathBuf};

use ferrymq_storage::{
    verify_partition, FileStorage, FindingKind, LogConfig, LogStorage, MemoryStorage, PartitionLog,
    VerifyReport, ENTRY_HEADER_BYTES,
};

const DIR: &str = "/data/topic-0";
const ENTRIES: u64 = 100;

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

/// A log of `ENTRIES` entries over several segments, synced, on `MemoryStorage`.
fn written() -> (MemoryStorage, Vec<u64>) {
    let (mut log, _) = PartitionLog::open(MemoryStorage::new(), DIR, small_config()).unwrap();
    // In batches of up to 7, some rolling a segment in the middle, with timestamps that go
    // back now and then (the time index keeps their running maximum).
    let mut i = 0;
    while i < ENTRIES {
        let records: Vec<(u64, Vec<u8>)> = (i..(i + 1 + i % 7).min(ENTRIES))
            .map(|j| (1000 + j - 3 * (j % 4), record(j)))
            .collect();
        let batch: Vec<(u64, &[u8])> = records.iter().map(|(t, r)| (*t, r.as_slice())).collect();
        log.append(&batch).unwrap();
        i += batch.len() as u64;
    }
    log.sync().unwrap();
    assert!(log.segments_count() >= 4, "{}", log.segments_count());
    let storage = log.into_storage();
    let bases = segment_bases(&storage, Path::new(DIR));
    (storage, bases)
}

fn segment_bases<S: LogStorage>(storage: &S, dir: &Path) -> Vec<u64> {
    let mut bases: Vec<u64> = storage
        .list(dir)
        .unwrap()
        .iter()
        .filter_map(|n| n.strip_suffix(".log").map(|b| b.parse().unwrap()))
        .collect();
    bases.sort_unstable();
    bases
}

fn file(base: u64, extension: &str) -> PathBuf {
    Path::new(DIR).join(format!("{base:020}.{extension}"))
}

/// Byte position of the entry with `offset` in the segment starting at `base`.
fn position_of(base: u64, offset: u64) -> u64 {
    (base..offset)
        .map(|i| (ENTRY_HEADER_BYTES + record(i).len()) as u64)
        .sum()
}

/// Every file and its bytes.
fn snapshot<S: LogStorage>(storage: &S, dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut names = storage.list(dir).unwrap();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let path = dir.join(&name);
            let mut bytes = vec![0u8; storage.len(&path).unwrap() as usize];
            storage.read_at(&path, 0, &mut bytes).unwrap();
            (name, bytes)
        })
        .collect()
}

/// Verifies, checking that no byte and no file name changed.
fn verify<S: LogStorage>(storage: &S, dir: &Path) -> VerifyReport {
    let before = snapshot(storage, dir);
    let report = verify_partition(storage, dir).unwrap();
    assert_eq!(before, snapshot(storage, dir), "verify changed a file");
    report
}

fn has(report: &VerifyReport, kind: FindingKind, file: &Path, position: u64) -> bool {
    report
        .findings
        .iter()
        .any(|f| f.kind == kind && f.file == file && f.position == position)
}

#[test]
fn a_clean_log_verifies_clean_with_its_totals() {
    let (storage, bases) = written();
    let report = verify(&storage, Path::new(DIR));
    assert!(report.is_clean(), "{:#?}", report.findings);
    assert_eq!(report.segments_count, bases.len());
    assert_eq!(report.entries_count, ENTRIES);
    assert_eq!(report.start_offset, 0);
    assert_eq!(report.next_offset, ENTRIES);
    let bytes: u64 = bases
        .iter()
        .map(|&b| storage.len(&file(b, "log")).unwrap())
        .sum();
    assert_eq!(report.bytes, bytes);
    // Open agrees that there is nothing to repair.
    let (_, recovery) = PartitionLog::open(storage, DIR, small_config()).unwrap();
    assert!(recovery.truncation.is_none() && recovery.indexes_rebuilt.is_empty());
}

#[test]
fn an_empty_directory_is_clean() {
    let mut storage = MemoryStorage::new();
    storage.create_dir_all(Path::new(DIR)).unwrap();
    let report = verify(&storage, Path::new(DIR));
    assert!(report.is_clean());
    assert_eq!((report.segments_count, report.entries_count), (0, 0));
}

#[test]
fn a_flipped_bit_in_a_body_is_found_at_its_entry_and_the_scan_goes_on() {
    let (storage, bases) = written();
    let (base, offset) = (bases[1], bases[1] + 2);
    let at = position_of(base, offset);
    storage
        .flip_bit(&file(base, "log"), at + ENTRY_HEADER_BYTES as u64 + 3, 4)
        .unwrap();
    let report = verify(&storage, Path::new(DIR));
    assert_eq!(report.findings.len(), 1, "{:#?}", report.findings);
    assert!(has(
        &report,
        FindingKind::CorruptEntry,
        &file(base, "log"),
        at
    ));
    assert!(report.findings[0].description.contains("checksum"));
    // Every other entry was still checked.
    assert_eq!(report.entries_count, ENTRIES - 1);
    assert_eq!(report.next_offset, ENTRIES);
}

#[test]
fn a_truncated_tail_is_reported_as_torn_where_open_would_cut() {
    let (mut storage, bases) = written();
    let last = *bases.last().unwrap();
    let path = file(last, "log");
    let len = storage.len(&path).unwrap();
    storage.truncate(&path, len - 5).unwrap();
    let report = verify(&storage, Path::new(DIR));
    let at = position_of(last, ENTRIES - 1);
    assert!(
        has(&report, FindingKind::TornTail, &path, at),
        "{:#?}",
        report.findings
    );
    assert_eq!(report.next_offset, ENTRIES - 1);
    // Open cuts at that very position.
    let (_, recovery) = PartitionLog::open(storage, DIR, small_config()).unwrap();
    assert_eq!(recovery.truncation.unwrap().position, at);
}

#[test]
fn a_deleted_middle_segment_is_found_at_the_segment_after_it() {
    let (mut storage, bases) = written();
    storage.remove(&file(bases[1], "log")).unwrap();
    let report = verify(&storage, Path::new(DIR));
    assert!(
        has(
            &report,
            FindingKind::MissingSegment,
            &file(bases[2], "log"),
            0
        ),
        "{:#?}",
        report.findings
    );
    assert!(has(
        &report,
        FindingKind::OrphanIndex,
        &file(bases[1], "index"),
        0
    ));
    assert!(report
        .findings
        .iter()
        .all(|f| f.kind != FindingKind::CorruptEntry));
}

#[test]
fn a_corrupt_index_point_is_found_at_its_byte() {
    let (storage, bases) = written();
    // Point 1's position field (bytes 12..16): one byte off the entry it should name.
    storage.flip_bit(&file(bases[0], "index"), 12, 0).unwrap();
    let report = verify(&storage, Path::new(DIR));
    assert!(
        has(
            &report,
            FindingKind::IndexMismatch,
            &file(bases[0], "index"),
            8
        ),
        "{:#?}",
        report.findings
    );
    assert!(report
        .findings
        .iter()
        .all(|f| f.kind == FindingKind::IndexMismatch && f.description.contains("delet")));
    // Open does not look at that point; deleting the index files makes it rebuild them.
    let (log, recovery) = PartitionLog::open(storage, DIR, small_config()).unwrap();
    assert!(recovery.indexes_rebuilt.is_empty());
    let mut storage = log.into_storage();
    storage.remove(&file(bases[0], "index")).unwrap();
    storage.remove(&file(bases[0], "timeindex")).unwrap();
    let (log, recovery) = PartitionLog::open(storage, DIR, small_config()).unwrap();
    assert_eq!(recovery.indexes_rebuilt.len(), 1);
    assert!(verify(log.storage(), Path::new(DIR)).is_clean());
}

#[test]
fn a_wrong_time_index_timestamp_is_found() {
    let (storage, bases) = written();
    // Point 1's timestamp (bytes 12..20 of the time index).
    storage
        .flip_bit(&file(bases[0], "timeindex"), 13, 2)
        .unwrap();
    let report = verify(&storage, Path::new(DIR));
    assert!(
        has(
            &report,
            FindingKind::IndexMismatch,
            &file(bases[0], "timeindex"),
            12
        ),
        "{:#?}",
        report.findings
    );
}

#[test]
fn a_deleted_index_file_is_reported_missing() {
    let (mut storage, bases) = written();
    storage.remove(&file(bases[1], "timeindex")).unwrap();
    let report = verify(&storage, Path::new(DIR));
    assert_eq!(report.findings.len(), 1, "{:#?}", report.findings);
    assert!(has(
        &report,
        FindingKind::IndexMissing,
        &file(bases[1], "timeindex"),
        0
    ));
}

/// An entry as `docs/storage.md` draws it.
fn encode_entry(buf: &mut Vec<u8>, offset: u64, timestamp_ms: u64, record: &[u8]) {
    let start = buf.len();
    buf.extend_from_slice(&(20 + record.len() as u32).to_le_bytes());
    buf.extend_from_slice(&[0; 4]);
    buf.extend_from_slice(&offset.to_le_bytes());
    buf.extend_from_slice(&timestamp_ms.to_le_bytes());
    buf.extend_from_slice(record);
    let crc = crc32c::crc32c(&buf[start + 8..]);
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// A segment of `offsets` with a single index point at its first entry.
fn write_segment(storage: &mut MemoryStorage, base: u64, offsets: std::ops::Range<u64>) -> u64 {
    let mut log = Vec::new();
    for offset in offsets {
        encode_entry(&mut log, offset, 1000 + offset, &record(offset));
    }
    let mut index = 0u32.to_le_bytes().to_vec();
    index.extend_from_slice(&0u32.to_le_bytes());
    let mut time_index = (1000 + base).to_le_bytes().to_vec();
    time_index.extend_from_slice(&0u32.to_le_bytes());
    for (extension, bytes) in [("log", &log), ("index", &index), ("timeindex", &time_index)] {
        storage.create(&file(base, extension)).unwrap();
        storage.append(&file(base, extension), bytes).unwrap();
    }
    log.len() as u64
}

#[test]
fn overlapping_segments_are_found_at_the_end_of_the_first() {
    let mut storage = MemoryStorage::new();
    storage.create_dir_all(Path::new(DIR)).unwrap();
    let first_len = write_segment(&mut storage, 0, 0..5);
    write_segment(&mut storage, 3, 3..8);
    let report = verify(&storage, Path::new(DIR));
    assert_eq!(report.findings.len(), 1, "{:#?}", report.findings);
    assert!(has(
        &report,
        FindingKind::OverlappingSegments,
        &file(0, "log"),
        first_len
    ));
    assert_eq!((report.entries_count, report.next_offset), (10, 8));
    assert!(PartitionLog::open(storage, DIR, small_config()).is_err());
}

#[test]
fn an_entry_with_a_wrong_offset_is_found() {
    let mut storage = MemoryStorage::new();
    storage.create_dir_all(Path::new(DIR)).unwrap();
    let mut log = Vec::new();
    for offset in [0, 1, 5, 6] {
        encode_entry(&mut log, offset, 1000 + offset, &record(offset));
    }
    storage.create(&file(0, "log")).unwrap();
    storage.append(&file(0, "log"), &log).unwrap();
    let report = verify(&storage, Path::new(DIR));
    assert!(has(
        &report,
        FindingKind::OffsetMismatch,
        &file(0, "log"),
        position_of(0, 2)
    ));
    assert!(has(
        &report,
        FindingKind::IndexMissing,
        &file(0, "index"),
        0
    ));
    assert_eq!(report.next_offset, 7);
}

#[test]
fn real_files_verify_read_only() {
    let dir = std::env::temp_dir().join(format!("ferrymq-verify-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (mut log, _) = PartitionLog::open(FileStorage::new(), &dir, small_config()).unwrap();
    for i in 0..ENTRIES {
        log.append(&[(1000 + i, &record(i))]).unwrap();
    }
    log.sync().unwrap();
    drop(log);
    let storage = FileStorage::new();
    assert!(verify(&storage, &dir).is_clean());

    let path = dir.join(format!("{:020}.log", 0));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[30] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let report = verify(&FileStorage::new(), &dir);
    assert!(
        has(&report, FindingKind::CorruptEntry, &path, 0),
        "{:#?}",
        report.findings
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn any_single_flipped_bit_in_any_file_is_found() {
    let (clean, _) = written();
    let paths = clean.paths();
    for seed in 0..400u64 {
        let mut rng = ferrymq_storage::SimRng::new(seed);
        let storage = clean.snapshot();
        let path = &paths[rng.below(paths.len() as u64) as usize];
        let len = storage.len(path).unwrap();
        if len == 0 {
            continue;
        }
        let position = rng.below(len);
        storage
            .flip_bit(path, position, rng.below(8) as u8)
            .unwrap();
        let report = verify(&storage, Path::new(DIR));
        assert!(
            !report.is_clean(),
            "seed {seed}: flip at byte {position} of {} not found",
            path.display()
        );
        assert!(
            report.findings.iter().any(|f| &f.file == path),
            "seed {seed}: {:#?}",
            report.findings
        );
    }
}

#[test]
fn an_unfinished_batch_at_the_tail_is_reported_where_open_cuts_it() {
    let storage = MemoryStorage::new();
    let mut log = PartitionLog::open(storage.clone(), DIR, small_config())
        .unwrap()
        .0;
    log.append(&[(1000, record(0).as_slice())]).unwrap();
    let records: Vec<Vec<u8>> = (1..5).map(record).collect();
    let entries: Vec<(u64, &[u8])> = records.iter().map(|r| (1001, r.as_slice())).collect();
    log.append(&entries).unwrap();
    log.sync().unwrap();
    drop(log);
    let path = file(0, "log");
    let batch_start = position_of(0, 1);
    // Cut after the batch's third entry: a write a crash stopped on an entry boundary.
    let mut copy = storage.snapshot();
    copy.truncate(&path, position_of(0, 4)).unwrap();
    let report = verify(&copy, Path::new(DIR));
    assert!(
        has(&report, FindingKind::TornTail, &path, batch_start),
        "{:#?}",
        report.findings
    );
    assert_eq!(report.next_offset, 1, "what open leaves");
    let torn = report
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::TornTail)
        .unwrap();
    assert_eq!(
        torn.description,
        "unfinished batch: the batch from offset 1 has 3 entries and no last one (a crash \
         stopped its write); open cuts it off from here, since a batch is stored whole or not at all"
    );
    let (log, recovery) = PartitionLog::open(copy.clone(), DIR, small_config()).unwrap();
    assert_eq!(log.next_offset(), 1);
    assert_eq!(recovery.truncation.unwrap().position, batch_start);
    drop(log);
    assert!(verify(&copy, Path::new(DIR)).findings.is_empty());
}
