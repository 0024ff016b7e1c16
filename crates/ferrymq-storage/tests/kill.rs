//! A writer process on real files is killed with SIGKILL while it appends and syncs; the log it
//! leaves must open, hold every entry the writer reported as synced, hold only what was written,
//! and take appends again. Three rounds, each resuming the same log.
//!
//! (SIGKILL keeps the page cache, so this checks recovery from an interrupted process on a real
//! file system; power loss is simulated by `MemoryStorage` in `simulation.rs`.)

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use ferrymq_storage::{FileStorage, LogConfig, PartitionLog};

const CHILD_DIR_ENV: &str = "FERRYMQ_KILL_TEST_CHILD_DIR";
const TEST_NAME: &str = "a_killed_writer_loses_nothing_it_synced";
/// Batches the writer appends at most: far more than a round waits for, so it is always killed
/// mid-way, yet bounded.
const CHILD_BATCHES_MAX: u64 = 1_000_000;

fn config() -> LogConfig {
    // Small segments so that kills also land around rolls.
    LogConfig {
        segment_bytes_max: 64 * 1024,
        ..LogConfig::default()
    }
}

fn record(offset: u64) -> Vec<u8> {
    format!("entry {offset} ")
        .repeat(1 + (offset % 5) as usize)
        .into_bytes()
}

/// The writer: appends batches whose bytes are a function of their offsets, syncs each, and
/// reports the synced next offset on stdout.
fn child(dir: &Path) {
    let (mut log, _) = PartitionLog::open(FileStorage::new(), dir, config()).expect("child open");
    for batch in 0..CHILD_BATCHES_MAX {
        let first = log.next_offset();
        let records: Vec<Vec<u8>> = (first..first + 50).map(record).collect();
        let entries: Vec<(u64, &[u8])> = records.iter().map(|r| (batch, r.as_slice())).collect();
        log.append(&entries).expect("child append");
        log.sync().expect("child sync");
        println!("synced {}", log.next_offset());
    }
}

#[test]
fn a_killed_writer_loses_nothing_it_synced() {
    if let Some(dir) = std::env::var_os(CHILD_DIR_ENV) {
        child(Path::new(&dir));
        return;
    }
    let dir = std::env::temp_dir().join(format!("ferrymq-kill-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let exe = std::env::current_exe().unwrap();
    let mut synced = 0u64;
    for round in 0..3u64 {
        let mut writer = Command::new(&exe)
            .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_DIR_ENV, &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = writer.stdout.take().unwrap();
        let mut reports = 0u64;
        // Bounded by what the writer prints; it is killed after a round-dependent count.
        for line in BufReader::new(stdout).lines() {
            let line = line.unwrap();
            if let Some(next) = line.strip_prefix("synced ") {
                synced = next.parse().unwrap();
                reports += 1;
                if reports == 30 + 17 * round {
                    writer.kill().unwrap();
                    break;
                }
            }
        }
        writer.wait().unwrap();
        assert!(reports > 0, "round {round}: the writer reported nothing");

        let (mut log, report) = PartitionLog::open(FileStorage::new(), &dir, config()).unwrap();
        assert!(
            log.next_offset() >= synced,
            "round {round}: {report:?}, synced up to {synced}"
        );
        let mut next = 0;
        for _ in 0..=log.next_offset() {
            let entries = log.read(next, 1 << 20, 1000).unwrap();
            let Some(last) = entries.last() else { break };
            for entry in &entries {
                assert_eq!(entry.record.as_ref(), record(entry.offset).as_slice());
            }
            next = last.offset + 1;
        }
        assert_eq!(next, log.next_offset(), "round {round}");
        // The log takes appends again after recovery.
        let r = record(log.next_offset());
        log.append(&[(0, &r)]).unwrap();
        log.sync().unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
