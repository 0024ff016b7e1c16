//! Group commit: a sync begun under the log's lock, run without it while appends go on, and
//! finished under the lock again (`begin_sync`, `SyncJob::run`, `finish_sync`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ferrymq_storage::{
    FileStorage, LogConfig, LogError, MemoryStorage, PartitionLog, Storage, SyncDone, SyncJob,
};

const DIR: &str = "/data/topic-0";

fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes_max: 512,
        segment_age_ms_max: 1_000_000,
        index_interval_bytes: 64,
    }
}

fn record(i: u64) -> Vec<u8> {
    format!("record-{i:05}-{}", "y".repeat((i % 13) as usize)).into_bytes()
}

fn append_range<S: Storage>(log: &mut PartitionLog<S>, from: u64, to: u64) {
    for i in from..to {
        let r = record(i);
        assert_eq!(log.append(&[(1000 + i, &r)]).unwrap(), i..i + 1);
    }
}

/// Opens a crashed copy of `storage` and returns the offsets it holds, checking their bytes.
fn offsets_after_crash(storage: &MemoryStorage, seed: u64) -> std::ops::Range<u64> {
    let copy = storage.snapshot();
    copy.crash(seed);
    let (log, _) = PartitionLog::open(copy, DIR, small_config())
        .unwrap_or_else(|e| panic!("seed {seed}: reopen after crash: {e}"));
    let entries = log
        .read(log.start_offset(), usize::MAX, usize::MAX)
        .unwrap();
    for entry in &entries {
        assert_eq!(entry.record.as_ref(), record(entry.offset), "seed {seed}");
    }
    log.start_offset()..log.next_offset()
}

fn assert_send<T: Send>() {}

#[test]
fn jobs_and_a_boxed_log_can_cross_threads() {
    assert_send::<SyncJob>();
    assert_send::<SyncDone>();
    assert_send::<PartitionLog<Box<dyn Storage + Send>>>();
}

#[test]
fn a_job_covers_what_was_appended_before_it_began_and_no_more() {
    let storage = MemoryStorage::new();
    let (mut log, _) = PartitionLog::open(storage.clone(), DIR, small_config()).unwrap();
    assert_eq!(log.durable_offset(), 0);
    append_range(&mut log, 0, 5);
    let job = log.begin_sync().unwrap();
    assert_eq!(job.covers(), 5);
    // Appends go on while the job is out (same segment: 512 bytes hold more than 8 records).
    append_range(&mut log, 5, 8);
    let done = job.run();
    append_range(&mut log, 8, 9);
    assert!(done.is_ok());
    assert_eq!(log.finish_sync(done).unwrap(), 5);
    assert_eq!(log.durable_offset(), 5);
    assert_eq!(log.next_offset(), 9);
    let mut lost_later = false;
    for seed in 0..100 {
        let offsets = offsets_after_crash(&storage, seed);
        assert!(
            offsets.end >= 5,
            "seed {seed}: lost covered entries: {offsets:?}"
        );
        lost_later |= offsets.end < 9;
    }
    assert!(
        lost_later,
        "the job made entries appended after it began durable"
    );
    log.sync().unwrap();
    assert_eq!(log.durable_offset(), 9);
    for seed in 0..50 {
        assert_eq!(offsets_after_crash(&storage, seed), 0..9, "seed {seed}");
    }
}

#[test]
fn rolls_and_retention_while_a_job_is_out_do_not_undo_what_it_covers() {
    let storage = MemoryStorage::new();
    let (mut log, _) = PartitionLog::open(storage.clone(), DIR, small_config()).unwrap();
    append_range(&mut log, 0, 30);
    let segments_before = log.segments_count();
    let job = log.begin_sync().unwrap();
    // Several rolls, then retention of all closed segments up to one after the job's segment.
    append_range(&mut log, 30, 120);
    assert!(log.segments_count() > segments_before + 2);
    let done = job.run();
    assert_eq!(log.finish_sync(done).unwrap(), 30);
    for seed in 0..100 {
        let offsets = offsets_after_crash(&storage, seed);
        assert!(offsets.end >= 30, "seed {seed}: {offsets:?}");
    }
    // The job's directory sync began before the new segments existed, so it must not count for
    // them: the next sync syncs the directory again, and then nothing is lost.
    log.sync().unwrap();
    for seed in 0..100 {
        assert_eq!(offsets_after_crash(&storage, seed), 0..120, "seed {seed}");
    }
    let job = log.begin_sync().unwrap();
    log.delete_segments_below(100).unwrap();
    assert!(log.start_offset() > 30);
    let start = log.start_offset();
    assert_eq!(log.finish_sync(job.run()).unwrap(), 120);
    for seed in 0..50 {
        assert_eq!(
            offsets_after_crash(&storage, seed),
            start..120,
            "seed {seed}"
        );
    }
}

#[test]
fn a_job_begun_before_a_roll_leaves_the_new_segment_name_to_the_next_sync() {
    // Without the generation check the job would clear the pending directory sync although it
    // began before the new segment existed, and a later sync would skip the directory.
    let storage = MemoryStorage::new();
    let (mut log, _) = PartitionLog::open(storage.clone(), DIR, small_config()).unwrap();
    append_range(&mut log, 0, 4);
    // Right after open the directory sync is pending, so the job includes it.
    let job = log.begin_sync().unwrap();
    let segments = log.segments_count();
    append_range(&mut log, 4, 60);
    assert!(log.segments_count() > segments);
    log.finish_sync(job.run()).unwrap();
    let job = log.begin_sync().unwrap();
    log.finish_sync(job.run()).unwrap();
    for seed in 0..100 {
        assert_eq!(offsets_after_crash(&storage, seed), 0..60, "seed {seed}");
    }
}

#[test]
fn a_deferred_sync_failure_stops_the_log() {
    let storage = MemoryStorage::new();
    let (mut log, _) = PartitionLog::open(storage.clone(), DIR, small_config()).unwrap();
    append_range(&mut log, 0, 5);
    let job = log.begin_sync().unwrap();
    storage.fail_next_syncs(1);
    let done = job.run();
    assert!(!done.is_ok());
    let err = log.finish_sync(done).unwrap_err();
    assert!(err.to_string().contains("injected"), "{err}");
    assert!(log.failed_reason().is_some());
    assert_eq!(log.durable_offset(), 0);
    assert!(matches!(log.begin_sync(), Err(LogError::Failed { .. })));
    assert!(matches!(log.sync(), Err(LogError::Failed { .. })));
    let r = record(5);
    assert!(matches!(
        log.append(&[(1005, &r)]),
        Err(LogError::Failed { .. })
    ));
    let (mut log, _) = PartitionLog::open(log.into_storage(), DIR, small_config()).unwrap();
    append_range(&mut log, 5, 7);
    log.sync().unwrap();
}

#[test]
fn a_successful_job_is_not_acknowledged_after_another_one_failed() {
    let storage = MemoryStorage::new();
    let (mut log, _) = PartitionLog::open(storage.clone(), DIR, small_config()).unwrap();
    append_range(&mut log, 0, 5);
    let first = log.begin_sync().unwrap();
    append_range(&mut log, 5, 6);
    let second = log.begin_sync().unwrap();
    storage.fail_next_syncs(1);
    let first = first.run();
    let second = second.run();
    assert!(second.is_ok());
    log.finish_sync(first).unwrap_err();
    assert!(matches!(
        log.finish_sync(second),
        Err(LogError::Failed { .. })
    ));
    assert_eq!(log.durable_offset(), 0);
}

#[test]
fn a_boxed_storage_log_syncs_on_another_thread_while_appends_go_on() {
    let storage = MemoryStorage::new();
    let boxed: Box<dyn Storage + Send> = Box::new(storage.clone());
    let (log, _) = PartitionLog::open(boxed, DIR, small_config()).unwrap();
    let log = Arc::new(Mutex::new(log));
    let mut covered = 0;
    for round in 0..10u64 {
        let job = log.lock().unwrap().begin_sync().unwrap();
        let syncer = std::thread::spawn(move || job.run());
        append_range(&mut log.lock().unwrap(), round * 10, round * 10 + 10);
        let done = syncer.join().unwrap();
        covered = log.lock().unwrap().finish_sync(done).unwrap();
        assert_eq!(covered, round * 10);
    }
    assert_eq!(covered, 90);
    for seed in 0..50 {
        assert!(offsets_after_crash(&storage, seed).end >= 90, "seed {seed}");
    }
}

#[test]
fn missing_files_finds_a_segment_deleted_under_the_log() {
    let storage = MemoryStorage::new();
    let (mut log, _) = PartitionLog::open(storage.clone(), DIR, small_config()).unwrap();
    append_range(&mut log, 0, 60);
    assert!(log.segments_count() >= 3);
    assert!(log.missing_files().is_empty());
    let mut segments: Vec<PathBuf> = storage
        .paths()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    segments.sort();
    let mut handle = storage.clone();
    handle.remove(&segments[1]).unwrap();
    assert_eq!(log.missing_files(), vec![segments[1].clone()]);
}

#[test]
fn real_files_group_commit_and_missing_files() {
    let dir = std::env::temp_dir().join(format!("ferrymq-group-commit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let boxed: Box<dyn Storage + Send> = Box::new(FileStorage::new());
    let (mut log, _) = PartitionLog::open(boxed, &dir, small_config()).unwrap();
    append_range(&mut log, 0, 40);
    let job = log.begin_sync().unwrap();
    append_range(&mut log, 40, 50);
    let done = std::thread::spawn(move || job.run()).join().unwrap();
    assert_eq!(log.finish_sync(done).unwrap(), 40);
    assert_eq!(log.durable_offset(), 40);
    let first = Path::new(&dir).join(format!("{:020}.log", 0));
    std::fs::remove_file(&first).unwrap();
    assert_eq!(log.missing_files(), vec![first]);
    drop(log);
    std::fs::remove_dir_all(&dir).unwrap();
}
