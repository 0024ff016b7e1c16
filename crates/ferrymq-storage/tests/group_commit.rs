//! Group commit: a sync begun under the log's lock, run without it while appends go on, and
//! finished under the lock again (`begin_sync`, `SyncJob::run`, `finish_sync`).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ferrymq_storage::{
    AppendFn, FileStorage, LogConfig, LogError, LogStorage, MemoryStorage, PartitionLog, SyncDone,
    SyncFn, SyncJob,
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

fn append_range<S: LogStorage>(log: &mut PartitionLog<S>, from: u64, to: u64) {
    for i in from..to {
        let r = record(i);
        assert_eq!(log.append(&[(1000 + i, &r)]).unwrap(), i..i + 1);
    }
}

/// Opens a log on `storage`, with deferred writes if `deferred`.
fn open_log<S: LogStorage>(storage: S, deferred: bool) -> PartitionLog<S> {
    let (mut log, _) = PartitionLog::open(storage, DIR, small_config()).unwrap();
    if deferred {
        assert!(log.defer_writes(), "the storage defers appends");
    }
    log
}

/// The segment file starting at `base_offset`.
fn segment(base_offset: u64) -> PathBuf {
    Path::new(DIR).join(format!("{base_offset:020}.log"))
}

/// The base offset of the newest segment file in `storage`.
fn active_base(storage: &MemoryStorage) -> u64 {
    storage
        .paths()
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .map(|p| {
            p.file_stem()
                .unwrap()
                .to_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .max()
        .unwrap()
}

/// Reads the whole log and checks it holds exactly `offsets`, each with its record and timestamp.
fn assert_reads<S: LogStorage>(log: &PartitionLog<S>, offsets: std::ops::Range<u64>) {
    let entries = log
        .read(log.start_offset(), usize::MAX, usize::MAX)
        .unwrap();
    let got: Vec<u64> = entries.iter().map(|e| e.offset).collect();
    assert_eq!(got, offsets.collect::<Vec<_>>());
    for entry in &entries {
        assert_eq!(entry.record.as_ref(), record(entry.offset));
        assert_eq!(entry.timestamp_ms, 1000 + entry.offset);
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
    assert_send::<PartitionLog<Box<dyn LogStorage + Send>>>();
}

#[test]
fn a_job_covers_what_was_appended_before_it_began_and_no_more() {
    job_covers_what_was_appended_before_it_began(false);
}

#[test]
fn a_job_covers_what_was_appended_before_it_began_and_no_more_with_deferred_writes() {
    job_covers_what_was_appended_before_it_began(true);
}

fn job_covers_what_was_appended_before_it_began(deferred: bool) {
    let storage = MemoryStorage::new();
    let mut log = open_log(storage.clone(), deferred);
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
    sync_failure_stops_the_log(false);
}

#[test]
fn a_deferred_sync_failure_stops_the_log_with_deferred_writes() {
    sync_failure_stops_the_log(true);
}

fn sync_failure_stops_the_log(deferred: bool) {
    let storage = MemoryStorage::new();
    let mut log = open_log(storage.clone(), deferred);
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
    // Written at once, the entries stay in the file for the reopen to find; written by the job,
    // they are cut back with its failure (none of them was acknowledged).
    let (mut log, _) = PartitionLog::open(log.into_storage(), DIR, small_config()).unwrap();
    let end = if deferred { 0 } else { 5 };
    assert_reads(&log, 0..end);
    append_range(&mut log, end, end + 2);
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
    boxed_storage_log_syncs_on_another_thread(false);
}

#[test]
fn a_boxed_storage_log_syncs_on_another_thread_while_appends_go_on_with_deferred_writes() {
    // Appends roll segments while a job runs: each roll waits for the job's writes.
    boxed_storage_log_syncs_on_another_thread(true);
}

fn boxed_storage_log_syncs_on_another_thread(deferred: bool) {
    let storage = MemoryStorage::new();
    let boxed: Box<dyn LogStorage + Send> = Box::new(storage.clone());
    let log = open_log(boxed, deferred);
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
    let boxed: Box<dyn LogStorage + Send> = Box::new(FileStorage::new());
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

// Deferred writes (`PartitionLog::defer_writes`): appends only encode, sync jobs write.

#[test]
fn deferred_appends_reach_the_file_only_through_a_finished_job() {
    let storage = MemoryStorage::new();
    let mut log = open_log(storage.clone(), false);
    append_range(&mut log, 0, 3);
    log.sync().unwrap();
    assert!(log.defer_writes());
    let len_synced = storage.len(&segment(0)).unwrap();

    append_range(&mut log, 3, 6);
    // append_shared hands back the records although they are not written yet.
    let (r6, r7) = (record(6), record(7));
    let (range, shared) = log
        .append_shared(&[(1006, r6.as_slice()), (1007, r7.as_slice())])
        .unwrap();
    assert_eq!(range, 6..8);
    assert_eq!(shared, [Bytes::from(r6), Bytes::from(r7)]);
    assert_eq!(log.next_offset(), 8);
    assert_eq!(storage.len(&segment(0)).unwrap(), len_synced);
    assert_reads(&log, 0..3);
    // Nothing past the last sync is anywhere on disk yet.
    for seed in 0..20 {
        assert_eq!(offsets_after_crash(&storage, seed), 0..3, "seed {seed}");
    }

    let job = log.begin_sync().unwrap();
    assert_eq!(job.covers(), 8);
    // Beginning a job writes nothing: the job does, when it runs.
    assert_eq!(storage.len(&segment(0)).unwrap(), len_synced);
    assert_reads(&log, 0..3);
    let done = std::thread::spawn(move || job.run()).join().unwrap();
    assert!(done.is_ok());
    assert!(storage.len(&segment(0)).unwrap() > len_synced);
    assert_eq!(log.finish_sync(done).unwrap(), 8);
    assert_eq!(log.durable_offset(), 8);
    assert_reads(&log, 0..8);
    for seed in 0..50 {
        assert_eq!(offsets_after_crash(&storage, seed), 0..8, "seed {seed}");
    }
}

#[test]
fn reads_and_time_lookups_stop_where_the_file_ends() {
    let storage = MemoryStorage::new();
    let mut log = open_log(storage.clone(), true);
    append_range(&mut log, 0, 5);
    log.sync().unwrap();
    append_range(&mut log, 5, 10);
    assert_eq!(log.next_offset(), 10);

    assert_reads(&log, 0..5);
    // Offsets appended but not written are inside the log: reading there is not an error, it
    // just has nothing to give yet.
    for from in 5..=10 {
        assert_eq!(
            log.read(from, usize::MAX, usize::MAX).unwrap(),
            [],
            "from {from}"
        );
    }
    let tail = log.read(3, usize::MAX, usize::MAX).unwrap();
    assert_eq!(tail.iter().map(|e| e.offset).collect::<Vec<_>>(), [3, 4]);
    assert_eq!(log.offset_for_time(1002).unwrap(), 2);
    // Times of unwritten entries: an answer at or past the end of what is in the file.
    for time in [1005, 1007, 1009, 5000] {
        let offset = log.offset_for_time(time).unwrap();
        assert!((5..=10).contains(&offset), "time {time}: {offset}");
    }

    log.sync().unwrap();
    assert_reads(&log, 0..10);
    assert_eq!(log.offset_for_time(1007).unwrap(), 7);
    assert_eq!(log.offset_for_time(5000).unwrap(), 10);

    // Rolls write what is left, so closed segments are readable while the new active one's
    // entries are not yet.
    let segments_before = log.segments_count();
    append_range(&mut log, 10, 60);
    assert!(log.segments_count() > segments_before + 1);
    let base = active_base(&storage);
    assert!(base > 10 && base < 60, "{base}");
    assert_reads(&log, 0..base);
    assert_eq!(log.read(base, usize::MAX, usize::MAX).unwrap(), []);
    assert_eq!(log.offset_for_time(1000 + base - 1).unwrap(), base - 1);
    let offset = log.offset_for_time(1000 + base + 1).unwrap();
    assert!((base..=60).contains(&offset), "{offset}");
    log.sync().unwrap();
    assert_reads(&log, 0..60);
}

#[test]
fn jobs_run_in_reverse_order_write_in_the_order_they_began() {
    let storage = MemoryStorage::new();
    let mut log = open_log(storage.clone(), true);
    append_range(&mut log, 0, 5);
    let first = log.begin_sync().unwrap();
    append_range(&mut log, 5, 9);
    let second = log.begin_sync().unwrap();
    assert_eq!((first.covers(), second.covers()), (5, 9));

    let second = std::thread::spawn(move || second.run());
    std::thread::sleep(Duration::from_millis(200));
    // The second job waits for the first one's writes: nothing is in the file yet.
    assert!(!second.is_finished(), "the second job did not wait");
    assert_eq!(storage.len(&segment(0)).unwrap(), 0);
    let first = std::thread::spawn(move || first.run());
    let (first, second) = (first.join().unwrap(), second.join().unwrap());
    assert!(first.is_ok() && second.is_ok());
    // Finished in reverse order too: the later job's coverage stands.
    assert_eq!(log.finish_sync(second).unwrap(), 9);
    assert_eq!(log.finish_sync(first).unwrap(), 5);
    assert_eq!(log.durable_offset(), 9);
    assert_reads(&log, 0..9);
    for seed in 0..50 {
        assert_eq!(offsets_after_crash(&storage, seed), 0..9, "seed {seed}");
    }
}

#[test]
fn a_roll_waits_for_a_job_begun_before_it() {
    let storage = MemoryStorage::new();
    let mut log = open_log(storage.clone(), true);
    append_range(&mut log, 0, 5);
    let job = log.begin_sync().unwrap();
    let syncer = std::thread::spawn(move || {
        // Starts while the appends below go on; the first roll has to wait for it.
        std::thread::sleep(Duration::from_millis(100));
        job.run()
    });
    let segments_before = log.segments_count();
    append_range(&mut log, 5, 60);
    assert!(log.segments_count() > segments_before + 1);
    let done = syncer.join().unwrap();
    assert!(done.is_ok());
    assert_eq!(log.finish_sync(done).unwrap(), 5);
    // The rolls wrote and synced every closed segment after the job's entries.
    let base = active_base(&storage);
    assert_reads(&log, 0..base);
    for seed in 0..50 {
        let offsets = offsets_after_crash(&storage, seed);
        assert!(
            offsets.start == 0 && offsets.end >= base,
            "seed {seed}: {offsets:?}"
        );
    }
    log.sync().unwrap();
    assert_eq!(log.durable_offset(), 60);
    assert_reads(&log, 0..60);
    for seed in 0..100 {
        assert_eq!(offsets_after_crash(&storage, seed), 0..60, "seed {seed}");
    }
}

#[test]
fn a_failed_deferred_sync_stops_the_log_and_a_reopen_recovers_whole_entries() {
    let storage = MemoryStorage::new();
    let mut log = open_log(storage.clone(), true);
    append_range(&mut log, 0, 5);
    log.sync().unwrap();
    append_range(&mut log, 5, 9);
    let job = log.begin_sync().unwrap();
    storage.fail_next_syncs(1);
    let done = job.run();
    assert!(!done.is_ok());
    let err = log.finish_sync(done).unwrap_err();
    assert!(err.to_string().contains("injected"), "{err}");
    assert_eq!(log.durable_offset(), 5);
    let r = record(9);
    assert!(matches!(
        log.append(&[(1009, &r)]),
        Err(LogError::Failed { .. })
    ));
    assert!(matches!(log.begin_sync(), Err(LogError::Failed { .. })));
    // A crash keeps what was synced, and of the rest only whole entries survive a reopen.
    for seed in 0..100 {
        let offsets = offsets_after_crash(&storage, seed);
        assert!(
            offsets.start == 0 && (5..=9).contains(&offsets.end),
            "seed {seed}: {offsets:?}"
        );
    }
    let (mut log, report) = PartitionLog::open(log.into_storage(), DIR, small_config()).unwrap();
    assert!(report.truncation.is_none(), "{report:?}");
    let end = log.next_offset();
    assert!((5..=9).contains(&end), "{end}");
    assert_reads(&log, 0..end);
    assert!(log.defer_writes());
    append_range(&mut log, end, end + 3);
    log.sync().unwrap();
    assert_reads(&log, 0..end + 3);
}

/// A memory storage whose deferred appends fail, without writing, while `fail_writes` is set
/// (with `index_only`, only those to index files; immediate appends fail then too, like on a full
/// disk).
#[derive(Clone, Default)]
struct FailingWrites {
    inner: MemoryStorage,
    fail_writes: Arc<AtomicBool>,
    index_only: Arc<AtomicBool>,
}

impl FailingWrites {
    fn refuses(&self, path: &Path) -> bool {
        self.fail_writes.load(Relaxed)
            && (!self.index_only.load(Relaxed)
                || path
                    .extension()
                    .is_some_and(|e| e == "index" || e == "timeindex"))
    }
}

/// A memory storage that cannot defer appends: `append_later` is the trait's default.
#[derive(Clone, Default)]
struct NoDeferral {
    inner: MemoryStorage,
}

macro_rules! delegate_storage {
    () => {
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
        fn read_at(&self, path: &Path, position: u64, buf: &mut [u8]) -> io::Result<()> {
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
        fn sync_later(&mut self, path: &Path) -> io::Result<SyncFn> {
            self.inner.sync_later(path)
        }
        fn sync_dir_later(&mut self, dir: &Path) -> io::Result<SyncFn> {
            self.inner.sync_dir_later(dir)
        }
    };
}

impl LogStorage for FailingWrites {
    delegate_storage!();
    fn append(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        if self.index_only.load(Relaxed) && self.refuses(path) && !bytes.is_empty() {
            return Err(io::Error::other(format!(
                "append to {}: No space left on device",
                path.display()
            )));
        }
        self.inner.append(path, bytes)
    }
    fn append_later(&mut self, path: &Path) -> Option<io::Result<AppendFn>> {
        let append = match self.inner.append_later(path)? {
            Ok(append) => append,
            Err(error) => return Some(Err(error)),
        };
        let storage = self.clone();
        let path = path.to_path_buf();
        Some(Ok(Box::new(move |chunks: &[Bytes], sync: bool| {
            if storage.refuses(&path) && chunks.iter().any(|c| !c.is_empty()) {
                return Err(io::Error::other(format!(
                    "append to {}: No space left on device",
                    path.display()
                )));
            }
            append(chunks, sync)
        })))
    }
}

impl LogStorage for NoDeferral {
    delegate_storage!();
    fn append(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        self.inner.append(path, bytes)
    }
}

#[test]
fn a_failed_deferred_write_fails_its_job_and_every_later_one() {
    let storage = FailingWrites::default();
    let mut log = open_log(storage.clone(), true);
    append_range(&mut log, 0, 5);
    log.sync().unwrap();
    append_range(&mut log, 5, 7);
    let first = log.begin_sync().unwrap();
    append_range(&mut log, 7, 9);
    let second = log.begin_sync().unwrap();
    storage.fail_writes.store(true, Relaxed);
    let first = first.run();
    storage.fail_writes.store(false, Relaxed);
    // The disk is fine again, but the second job's entries would follow a hole: not written.
    let second = second.run();
    assert!(!first.is_ok() && !second.is_ok());
    let err = log.finish_sync(first).unwrap_err();
    assert!(err.to_string().contains("No space left"), "{err}");
    // Its error names the cause, the first job's failed write.
    let err = log.finish_sync(second).unwrap_err();
    assert!(err.to_string().contains("No space left"), "{err}");
    assert_eq!(log.durable_offset(), 5);
    let r = record(9);
    assert!(matches!(
        log.append(&[(1009, &r)]),
        Err(LogError::Failed { .. })
    ));
    let (log, report) = PartitionLog::open(log.into_storage(), DIR, small_config()).unwrap();
    assert!(report.truncation.is_none(), "{report:?}");
    assert_eq!(log.next_offset(), 5);
    assert_reads(&log, 0..5);
}

#[test]
fn a_failed_index_write_cuts_the_job_back_so_that_a_full_disk_can_reopen_the_log() {
    let storage = FailingWrites::default();
    let mut log = open_log(storage.clone(), true);
    append_range(&mut log, 0, 5);
    log.sync().unwrap();
    let index = Path::new(DIR).join(format!("{:020}.index", active_base(&storage.inner)));
    let synced = (
        storage.len(&segment(active_base(&storage.inner))).unwrap(),
        storage.len(&index).unwrap(),
    );
    // Enough for new index points, not enough for a roll.
    append_range(&mut log, 5, 12);
    assert_eq!(active_base(&storage.inner), 0);
    let job = log.begin_sync().unwrap();
    // The disk fills up between the log write and the index writes, and stays full.
    storage.index_only.store(true, Relaxed);
    storage.fail_writes.store(true, Relaxed);
    let done = job.run();
    let err = log.finish_sync(done).unwrap_err();
    assert!(err.to_string().contains("No space left"), "{err}");
    // The job's log write is cut back with the failed index write: the files agree again.
    assert_eq!(
        (
            storage.len(&segment(active_base(&storage.inner))).unwrap(),
            storage.len(&index).unwrap()
        ),
        synced
    );
    // So the reopen on the still-full disk has nothing to rebuild, and succeeds.
    let (mut log, report) = PartitionLog::open(log.into_storage(), DIR, small_config()).unwrap();
    assert!(report.truncation.is_none(), "{report:?}");
    assert!(report.indexes_rebuilt.is_empty(), "{report:?}");
    assert_reads(&log, 0..5);
    // Once there is space again, writing goes on from there.
    storage.fail_writes.store(false, Relaxed);
    assert!(log.defer_writes());
    append_range(&mut log, 5, 12);
    log.sync().unwrap();
    let (log, _) = PartitionLog::open(storage.clone(), DIR, small_config()).unwrap();
    assert_reads(&log, 0..12);
}

#[test]
fn a_roll_whose_leftover_write_fails_cuts_it_back_and_the_log_reopens_on_a_full_disk() {
    let storage = FailingWrites::default();
    let mut log = open_log(storage.clone(), true);
    append_range(&mut log, 0, 5);
    log.sync().unwrap();
    let segments = log.segments_count();
    storage.index_only.store(true, Relaxed);
    storage.fail_writes.store(true, Relaxed);
    // Appends go on in memory until one rolls the segment: the roll writes what is left, and its
    // index write meets the full disk.
    let mut failed_at = None;
    for i in 5..60 {
        let r = record(i);
        if let Err(error) = log.append(&[(1000 + i, &r)]) {
            assert!(error.to_string().contains("No space left"), "{error}");
            failed_at = Some(i);
            break;
        }
    }
    assert!(failed_at.is_some(), "no roll within 55 appends");
    assert_eq!(
        log.segments_count(),
        segments,
        "the failed roll closed the segment"
    );
    assert!(log.failed_reason().is_some());
    // The leftovers were cut back with their index: the still-full disk reopens the log as the
    // last sync left it, with nothing to rebuild.
    let (log, report) = PartitionLog::open(log.into_storage(), DIR, small_config()).unwrap();
    assert!(report.truncation.is_none(), "{report:?}");
    assert!(report.indexes_rebuilt.is_empty(), "{report:?}");
    assert_reads(&log, 0..5);
}

#[test]
fn a_job_dropped_without_running_fails_later_jobs_instead_of_blocking_them() {
    let storage = MemoryStorage::new();
    let mut log = open_log(storage.clone(), true);
    append_range(&mut log, 0, 3);
    log.sync().unwrap();
    append_range(&mut log, 3, 5);
    let dropped = log.begin_sync().unwrap();
    append_range(&mut log, 5, 7);
    let later = log.begin_sync().unwrap();
    drop(dropped);
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(later.run());
    });
    let done = receiver
        .recv_timeout(Duration::from_secs(10))
        .expect("the later job ran to its end within 10 s");
    assert!(!done.is_ok());
    assert!(log.finish_sync(done).is_err());
    assert_eq!(log.durable_offset(), 3);
    let r = record(7);
    assert!(matches!(
        log.append(&[(1007, &r)]),
        Err(LogError::Failed { .. })
    ));
    assert!(matches!(log.begin_sync(), Err(LogError::Failed { .. })));
    // Neither job wrote: the reopened log ends where the last sync left it.
    let (log, _) = PartitionLog::open(log.into_storage(), DIR, small_config()).unwrap();
    assert_eq!(log.next_offset(), 3);
    assert_reads(&log, 0..3);
}

#[test]
fn a_storage_that_cannot_defer_appends_keeps_writing_at_once() {
    let storage = NoDeferral::default();
    let mut log = open_log(storage.clone(), false);
    assert!(!log.defer_writes());
    append_range(&mut log, 0, 3);
    assert!(storage.len(&segment(0)).unwrap() > 0);
    // Written, so readable before any sync.
    assert_reads(&log, 0..3);
    let job = log.begin_sync().unwrap();
    assert_eq!(log.finish_sync(job.run()).unwrap(), 3);
    assert_reads(&log, 0..3);
}

#[test]
fn real_files_deferred_appends_are_written_by_jobs_and_read_back_after_a_reopen() {
    let dir = std::env::temp_dir().join(format!("ferrymq-deferred-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let boxed: Box<dyn LogStorage + Send> = Box::new(FileStorage::new());
    let (mut log, _) = PartitionLog::open(boxed, &dir, small_config()).unwrap();
    assert!(log.defer_writes());
    let first_segment = dir.join(format!("{:020}.log", 0));
    append_range(&mut log, 0, 5);
    assert_eq!(std::fs::metadata(&first_segment).unwrap().len(), 0);
    assert_eq!(log.read(0, usize::MAX, usize::MAX).unwrap(), []);
    let job = log.begin_sync().unwrap();
    // Appends and rolls while the job runs on another thread.
    let syncer = std::thread::spawn(move || job.run());
    append_range(&mut log, 5, 50);
    let done = syncer.join().unwrap();
    assert_eq!(log.finish_sync(done).unwrap(), 5);
    assert!(log.segments_count() > 2);
    log.sync().unwrap();
    assert_eq!(log.durable_offset(), 50);
    assert_reads(&log, 0..50);
    drop(log);

    let boxed: Box<dyn LogStorage + Send> = Box::new(FileStorage::new());
    let (mut log, report) = PartitionLog::open(boxed, &dir, small_config()).unwrap();
    assert!(report.truncation.is_none(), "{report:?}");
    assert!(report.indexes_rebuilt.is_empty(), "{report:?}");
    assert_eq!(log.next_offset(), 50);
    assert_reads(&log, 0..50);
    assert_eq!(log.offset_for_time(1042).unwrap(), 42);
    // An entry appended under deferral but never synced is not written, so it does not survive
    // the process (its publisher was never told it was stored).
    assert!(log.defer_writes());
    let segments = log.segments_count();
    append_range(&mut log, 50, 51);
    assert_eq!(log.segments_count(), segments);
    drop(log);
    let boxed: Box<dyn LogStorage + Send> = Box::new(FileStorage::new());
    let (log, _) = PartitionLog::open(boxed, &dir, small_config()).unwrap();
    assert_eq!(log.next_offset(), 50);
    drop(log);
    std::fs::remove_dir_all(&dir).unwrap();
}
