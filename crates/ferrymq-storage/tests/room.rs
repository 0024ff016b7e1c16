//! Room kept past the active segment's entries, on real files: sync jobs under deferred writes
//! write zeros ahead so that their fdatasync does not change the file's size. What a reopened
//! log, `verify` and a roll make of those zeros.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use ferrymq_storage::{verify_partition, FileStorage, LogConfig, PartitionLog};

/// A fresh directory under the system's temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ferrymq-room-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn config(segment_bytes_max: u64) -> LogConfig {
    LogConfig {
        segment_bytes_max,
        segment_age_ms_max: 1_000_000_000,
        index_interval_bytes: 4096,
    }
}

fn record(i: u64, len: usize) -> Vec<u8> {
    let mut r = format!("record-{i:06}-").into_bytes();
    r.resize(len, b'r');
    r
}

/// Opens the log with deferred writes (as fsync=always does) and appends `count` records of
/// `len` bytes from offset `from`, one sync job per `per_job` records.
fn write(dir: &Path, segment_bytes_max: u64, from: u64, count: u64, len: usize, per_job: u64) {
    let (mut log, _) =
        PartitionLog::open(FileStorage::new(), dir, config(segment_bytes_max)).unwrap();
    assert!(log.defer_writes());
    assert_eq!(log.next_offset(), from);
    for i in from..from + count {
        log.append(&[(1_000 + i, &record(i, len))]).unwrap();
        if (i + 1 - from) % per_job == 0 {
            log.sync().unwrap();
        }
    }
    log.sync().unwrap();
}

/// The log files in `dir`, oldest first, with their lengths.
fn segment_files(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut files: Vec<(PathBuf, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .map(|p| {
            let len = std::fs::metadata(&p).unwrap().len();
            (p, len)
        })
        .collect();
    files.sort();
    files
}

/// Bytes of one entry of a record of `len` bytes on disk (header 24).
fn entry_bytes(len: usize) -> u64 {
    24 + len as u64
}

fn assert_reads_back(dir: &Path, count: u64, len: usize) {
    let (log, report) = PartitionLog::open(FileStorage::new(), dir, config(1 << 30)).unwrap();
    assert_eq!(report.truncation, None, "room is not a torn tail");
    assert_eq!(log.next_offset(), count);
    let entries = log.read(0, usize::MAX, usize::MAX).unwrap();
    assert_eq!(entries.len() as u64, count);
    for (i, entry) in entries.iter().enumerate() {
        assert_eq!(entry.offset, i as u64);
        assert_eq!(entry.record, record(i as u64, len));
    }
}

#[test]
fn small_jobs_keep_zeros_past_the_entries_which_a_reopen_cuts_without_a_report() {
    let dir = TempDir::new("reopen");
    write(&dir.0, 1 << 30, 0, 200, 100, 10);
    let data = 200 * entry_bytes(100);
    let files = segment_files(&dir.0);
    assert_eq!(files.len(), 1);
    let (path, len) = &files[0];
    // 10 records a job (1 240 bytes): room was kept, at least half of its 16 KiB (an eighth of
    // 24 800 bytes of entries is less) past the entries.
    assert!(
        *len >= data + 8 * 1024 && *len <= data + 16 * 1024,
        "file of {len} bytes for {data} bytes of entries"
    );
    let mut tail = vec![1u8; (*len - data) as usize];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut tail, data)
        .unwrap();
    assert!(tail.iter().all(|&b| b == 0), "the room is zeros");
    // `verify` sees no damage either.
    let verified = verify_partition(&FileStorage::new(), &dir.0).unwrap();
    assert!(verified.is_clean(), "{:?}", verified.findings);
    assert_eq!(verified.next_offset, 200);

    assert_reads_back(&dir.0, 200, 100);
    // The reopen cut the room: the file ends with its last entry.
    assert_eq!(segment_files(&dir.0)[0].1, data);

    // Writing on after a reopen goes where the entries end, not after the old room.
    write(&dir.0, 1 << 30, 200, 50, 100, 5);
    let (log, report) = PartitionLog::open(FileStorage::new(), &dir.0, config(1 << 30)).unwrap();
    assert_eq!(report.truncation, None);
    assert_eq!(log.next_offset(), 250);
    assert_eq!(
        log.read(199, usize::MAX, 2).unwrap()[1].record,
        record(200, 100)
    );
}

#[test]
fn room_grows_with_the_segment_to_one_mebibyte() {
    let dir = TempDir::new("grow");
    // 100 records a job (12 400 bytes, small enough to keep room), 10.4 MB in all.
    write(&dir.0, 1 << 30, 0, 84_000, 100, 100);
    let data = 84_000 * entry_bytes(100);
    let (_, len) = segment_files(&dir.0)[0];
    assert!(
        len >= data + (1 << 19) && len <= data + (1 << 20),
        "file of {len} bytes for {data} bytes of entries"
    );
    assert_reads_back(&dir.0, 84_000, 100);
}

#[test]
fn a_torn_entry_in_the_room_is_still_a_torn_tail() {
    let dir = TempDir::new("torn");
    write(&dir.0, 1 << 30, 0, 30, 100, 10);
    let data = 30 * entry_bytes(100);
    let (path, len) = segment_files(&dir.0)[0].clone();
    assert!(len > data + 100);
    // Half an entry written into the room and lost with the power: a torn write, then zeros.
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&[0x7f; 60], data).unwrap();
    drop(file);
    let verified = verify_partition(&FileStorage::new(), &dir.0).unwrap();
    assert_eq!(verified.findings.len(), 1, "{:?}", verified.findings);
    assert_eq!(verified.findings[0].kind.as_str(), "torn-tail");

    let (log, report) = PartitionLog::open(FileStorage::new(), &dir.0, config(1 << 30)).unwrap();
    let truncation = report.truncation.expect("a torn tail is reported");
    assert_eq!(truncation.position, data);
    assert_eq!(truncation.bytes_dropped, len - data);
    assert_eq!(log.next_offset(), 30);
}

#[test]
fn a_closed_segment_ends_with_its_last_entry() {
    let dir = TempDir::new("roll");
    // Segments of at most 64 KiB: room is capped there, and each roll cuts what was kept.
    write(&dir.0, 64 * 1024, 0, 2_000, 100, 10);
    let files = segment_files(&dir.0);
    assert!(files.len() >= 3, "{files:?}");
    for (path, len) in &files[..files.len() - 1] {
        assert_eq!(
            len % entry_bytes(100),
            0,
            "{} ends inside room",
            path.display()
        );
        assert!(*len <= 64 * 1024);
    }
    let (_, active) = files.last().unwrap();
    assert!(*active <= 64 * 1024, "room is capped at the segment's size");
    let verified = verify_partition(&FileStorage::new(), &dir.0).unwrap();
    assert!(verified.is_clean(), "{:?}", verified.findings);
    assert_reads_back(&dir.0, 2_000, 100);
}

#[test]
fn large_jobs_keep_no_room() {
    let dir = TempDir::new("large");
    // 200 records of 1 000 bytes a job: 200 KiB, bound by the disk's bandwidth, not its round
    // trips; zeros would double what reaches the disk.
    write(&dir.0, 1 << 30, 0, 1_000, 1_000, 200);
    let files = segment_files(&dir.0);
    assert_eq!(files[0].1, 1_000 * entry_bytes(1_000));
    assert_reads_back(&dir.0, 1_000, 1_000);
}

/// Seeded crashes of a log whose sync jobs keep room, on the simulated disk (which adds the room
/// as unsynced zeros, so a crash keeps some of them, none, or garbage in their place): open never
/// fails, and every entry a finished sync covered is there, intact.
#[test]
fn crashes_with_room_lose_no_synced_entry() {
    use ferrymq_storage::{LogStorage, MemoryStorage, SimRng};
    const DIR: &str = "/data/room-0";
    let mut crashed_with_room = 0;
    for seed in 0..300u64 {
        let storage = MemoryStorage::new();
        let mut rng = SimRng::new(seed);
        let (mut log, _) = PartitionLog::open(storage.clone(), DIR, config(4096)).unwrap();
        assert!(log.defer_writes());
        let mut records = Vec::new();
        let mut durable = 0;
        for _ in 0..(20 + rng.below(60)) {
            let i = records.len() as u64;
            let r = record(i, 16 + rng.below(200) as usize);
            log.append(&[(1_000 + i, &r)]).unwrap();
            records.push(r);
            if rng.chance(1, 4) {
                let job = log.begin_sync().unwrap();
                durable = log.finish_sync(job.run()).unwrap();
            }
        }
        // Records end with 'r': a segment that ends with a zero byte has room.
        let room = storage.paths().iter().any(|p| {
            let len = storage.len(p).unwrap();
            let mut last = [1u8];
            p.extension().is_some_and(|e| e == "log")
                && len > 0
                && storage.read_at(p, len - 1, &mut last).is_ok()
                && last[0] == 0
        });
        crashed_with_room += room as u32;
        storage.crash(seed);
        let (log, _) = PartitionLog::open(storage, DIR, config(4096))
            .unwrap_or_else(|e| panic!("seed {seed}: open failed: {e}"));
        let next = log.next_offset();
        assert!(
            next >= durable,
            "seed {seed}: {next} entries, {durable} were synced"
        );
        let entries = log.read(0, usize::MAX, usize::MAX).unwrap();
        assert_eq!(entries.len() as u64, next, "seed {seed}");
        for entry in entries {
            assert_eq!(entry.record, records[entry.offset as usize], "seed {seed}");
        }
    }
    assert!(
        crashed_with_room > 150,
        "{crashed_with_room} of 300 crashes had room"
    );
}
