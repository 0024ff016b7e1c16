//! A batch (one `append`) is stored all or nothing, also across a crash: the log is cut at every
//! byte a write can stop at, with and without garbage after the cut, and after seeded power
//! losses, and every reopened log holds each batch whole or not at all.

use std::path::{Path, PathBuf};

use ferrymq_storage::{LogConfig, LogStorage, MemoryStorage, PartitionLog, SimRng};

const DIR: &str = "/data/topic-0";

fn config(segment_bytes_max: u64) -> LogConfig {
    LogConfig {
        segment_bytes_max,
        segment_age_ms_max: 1_000_000,
        index_interval_bytes: 64,
    }
}

/// Record `i` of batch `batch`: its batch and position are readable from its bytes, sizes vary.
fn record(batch: u64, i: u64) -> Vec<u8> {
    format!(
        "b{batch:04}-r{i:04}-{}",
        "y".repeat(((batch * 7 + i) % 23) as usize)
    )
    .into_bytes()
}

fn append_batch<S: LogStorage>(log: &mut PartitionLog<S>, batch: u64, count: u64) {
    let records: Vec<Vec<u8>> = (0..count).map(|i| record(batch, i)).collect();
    let entries: Vec<(u64, &[u8])> = records
        .iter()
        .map(|r| (1000 + batch, r.as_slice()))
        .collect();
    log.append(&entries).unwrap();
}

/// Every record of the log, in order, as `(batch, index in batch)`.
fn batches_read<S: LogStorage>(log: &PartitionLog<S>) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut next = log.start_offset();
    while next < log.next_offset() {
        let entries = log.read(next, 1 << 20, 10_000).unwrap();
        assert!(!entries.is_empty(), "read from {next} returned nothing");
        for entry in entries {
            assert_eq!(entry.offset, next);
            next += 1;
            let text = String::from_utf8(entry.record.to_vec()).unwrap();
            let batch = text[1..5].parse().unwrap();
            let i = text[7..11].parse().unwrap();
            out.push((batch, i));
        }
    }
    out
}

/// Checks that the log holds batches `0..n` whole, for some `n` at least `at_least`, each with
/// `sizes[b]` records, and nothing else. Returns `n`.
fn assert_whole_batches(held: &[(u64, u64)], sizes: &[u64], at_least: usize, what: &str) -> usize {
    let mut at = 0;
    let mut batches = 0;
    while at < held.len() {
        let batch = held[at].0;
        assert_eq!(
            batch, batches as u64,
            "{what}: batch {batches} expected at record {at}"
        );
        let size = sizes[batch as usize];
        let got: Vec<(u64, u64)> = held[at..].iter().take(size as usize).copied().collect();
        let want: Vec<(u64, u64)> = (0..size).map(|i| (batch, i)).collect();
        assert_eq!(got, want, "{what}: batch {batch} is partial");
        at += size as usize;
        batches += 1;
    }
    assert!(
        batches >= at_least,
        "{what}: {batches} batches left, {at_least} were synced"
    );
    batches
}

fn segment_files(storage: &MemoryStorage) -> Vec<PathBuf> {
    let mut logs: Vec<PathBuf> = storage
        .paths()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    logs
}

/// A crash can stop the write of the last batch after any byte, and leave garbage after it: at
/// every such point the reopened log holds the earlier batches and none of the last one, and
/// takes new batches after them.
#[test]
fn a_batch_cut_at_any_byte_is_dropped_whole() {
    for garbage in [0usize, 1, 7, 40] {
        let storage = MemoryStorage::new();
        let mut log = PartitionLog::open(storage.clone(), DIR, config(1 << 20))
            .unwrap()
            .0;
        let sizes = [3u64, 1, 40];
        append_batch(&mut log, 0, sizes[0]);
        append_batch(&mut log, 1, sizes[1]);
        log.sync().unwrap();
        let path = segment_files(&storage).pop().unwrap();
        let before = storage.len(&path).unwrap();
        append_batch(&mut log, 2, sizes[2]);
        log.sync().unwrap();
        let after = storage.len(&path).unwrap();
        drop(log);
        let mut rng = SimRng::new(garbage as u64);
        for cut in before..=after {
            let mut copy = storage.snapshot();
            copy.truncate(&path, cut).unwrap();
            if cut < after && garbage > 0 {
                let bytes: Vec<u8> = (0..garbage).map(|_| rng.next_u64() as u8).collect();
                copy.append(&path, &bytes).unwrap();
            }
            let what =
                format!("cut at byte {cut} of {before}..{after}, {garbage} bytes of garbage");
            let (mut log, report) = PartitionLog::open(copy.clone(), DIR, config(1 << 20))
                .unwrap_or_else(|e| panic!("{what}: open failed: {e}"));
            let held = batches_read(&log);
            let n = assert_whole_batches(&held, &sizes, 2, &what);
            assert_eq!(n, if cut == after { 3 } else { 2 }, "{what}");
            if cut > before && cut < after {
                let truncation = report
                    .truncation
                    .unwrap_or_else(|| panic!("{what}: no report"));
                assert_eq!(
                    truncation.position, before,
                    "{what}: cut at the batch start"
                );
            }
            // The log goes on after the cut, and a second crash finds what the first left.
            append_batch(&mut log, n as u64, 2);
            log.sync().unwrap();
            drop(log);
            let log = PartitionLog::open(copy, DIR, config(1 << 20)).unwrap().0;
            let mut sizes_after = sizes[..n].to_vec();
            sizes_after.push(2);
            assert_whole_batches(&batches_read(&log), &sizes_after, n + 1, &what);
        }
    }
}

/// A batch that does not fit the active segment starts a new one rather than being split, so a
/// crash during its write cannot leave its beginning in a closed, synced segment.
#[test]
fn a_batch_is_never_split_between_segments() {
    let storage = MemoryStorage::new();
    let mut log = PartitionLog::open(storage.clone(), DIR, config(600))
        .unwrap()
        .0;
    let sizes = [5u64, 30];
    append_batch(&mut log, 0, sizes[0]);
    log.sync().unwrap();
    let closed = segment_files(&storage).pop().unwrap();
    let closed_len = storage.len(&closed).unwrap();
    append_batch(&mut log, 1, sizes[1]);
    assert_eq!(log.segments_count(), 2);
    assert_eq!(
        storage.len(&closed).unwrap(),
        closed_len,
        "nothing of batch 1 in segment 0"
    );
    drop(log);
    // The crash loses the new segment's name, or any part of it.
    let active = segment_files(&storage).pop().unwrap();
    let active_len = storage.len(&active).unwrap();
    for cut in (0..active_len).chain([u64::MAX]) {
        let mut copy = storage.snapshot();
        if cut == u64::MAX {
            for suffix in ["log", "index", "timeindex"] {
                let _ = copy.remove(&active.with_extension(suffix));
            }
        } else {
            copy.truncate(&active, cut).unwrap();
        }
        let log = PartitionLog::open(copy, DIR, config(600)).unwrap().0;
        let what = format!("active segment cut at {cut}");
        assert_eq!(
            assert_whole_batches(&batches_read(&log), &sizes, 1, &what),
            1
        );
    }
}

/// Seeded power losses in the middle of histories of batches, syncs and reopens: every batch is
/// whole or absent, and every batch a finished sync covered is there. Replay one with
/// `FERRYMQ_BATCH_SEED`.
#[test]
fn seeded_crashes_never_leave_a_partial_batch() {
    let seeds: Vec<u64> = match std::env::var("FERRYMQ_BATCH_SEED") {
        Ok(seed) => vec![seed.parse().expect("FERRYMQ_BATCH_SEED is a number")],
        Err(_) => (0..300).collect(),
    };
    for seed in seeds {
        let mut rng = SimRng::new(seed);
        let storage = MemoryStorage::new();
        let segment_bytes = 400 + rng.below(4000);
        let cfg = config(segment_bytes);
        let mut log = PartitionLog::open(storage.clone(), DIR, cfg.clone())
            .unwrap()
            .0;
        let deferred = rng.chance(1, 2) && log.defer_writes();
        let mut sizes: Vec<u64> = Vec::new();
        let mut synced = 0usize;
        for _step in 0..(5 + rng.below(30)) {
            match rng.below(10) {
                0..=5 => {
                    let count = 1 + rng.below(60);
                    append_batch(&mut log, sizes.len() as u64, count);
                    sizes.push(count);
                }
                6..=7 => {
                    log.sync().unwrap();
                    synced = sizes.len();
                }
                _ => {
                    storage.crash(rng.next_u64());
                    let what = format!(
                        "seed {seed} (segments of {segment_bytes} bytes, deferred {deferred})"
                    );
                    let reopened = PartitionLog::open(storage.clone(), DIR, cfg.clone())
                        .unwrap_or_else(|e| panic!("{what}: open failed: {e}"));
                    log = reopened.0;
                    if deferred {
                        log.defer_writes();
                    }
                    let n = assert_whole_batches(&batches_read(&log), &sizes, synced, &what);
                    sizes.truncate(n);
                    synced = n;
                }
            }
        }
    }
}

#[test]
fn a_log_written_before_batch_marks_reads_as_batches_of_one() {
    // Entry format version 1, byte for byte: no batch bit on any entry.
    let storage = MemoryStorage::new();
    let mut bytes = Vec::new();
    for offset in 0..3u64 {
        let record = format!("v1 record {offset}");
        let length = 20 + record.len() as u32;
        let mut entry = Vec::new();
        entry.extend_from_slice(&offset.to_le_bytes());
        entry.extend_from_slice(&(500 + offset).to_le_bytes());
        entry.extend_from_slice(record.as_bytes());
        bytes.extend_from_slice(&length.to_le_bytes());
        bytes.extend_from_slice(&crc32c::crc32c(&entry).to_le_bytes());
        bytes.extend_from_slice(&entry);
    }
    let mut disk = storage.clone();
    disk.create_dir_all(Path::new(DIR)).unwrap();
    let path = Path::new(DIR).join(format!("{:020}.log", 0));
    disk.create(&path).unwrap();
    disk.append(&path, &bytes).unwrap();
    disk.sync(&path).unwrap();
    let (mut log, report) = PartitionLog::open(storage.clone(), DIR, config(1 << 20)).unwrap();
    assert_eq!(report.truncation, None);
    assert_eq!(log.next_offset(), 3);
    let records: Vec<_> = log.read(0, 1 << 20, 10).unwrap();
    assert_eq!(&records[2].record[..], b"v1 record 2");
    // New batches follow the old entries; cutting the last old entry's tail cuts only it.
    log.append(&[(600, b"v2 a".as_slice()), (600, b"v2 b".as_slice())])
        .unwrap();
    log.sync().unwrap();
    assert_eq!(log.read(3, 1 << 20, 10).unwrap().len(), 2);
}
