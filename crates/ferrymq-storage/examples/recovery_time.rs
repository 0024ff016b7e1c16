//! Times [`PartitionLog::open`] on a large log, the recovery a broker runs at every start.
//!
//! `cargo run --release -p ferrymq-storage --example recovery_time -- [dir] [log_bytes]
//! [record_bytes] [runs]`: writes a log of about `log_bytes` (1 GiB by default) of
//! `record_bytes` records (100 B) into `dir` unless it already holds one, then opens it `runs`
//! times (3) as it is, and `runs` times after removing its index files, so that the whole log is
//! scanned and the indexes rebuilt. Prints each time and the median of each kind. The log is kept,
//! so that two builds can be timed on the same bytes; remove `dir` afterwards.

use std::path::Path;
use std::time::{Duration, Instant};

use ferrymq_storage::{FileStorage, LogConfig, PartitionLog};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("ferrymq-recovery-time"));
    let log_bytes: u64 = args.get(2).map_or(Ok(1 << 30), |a| a.parse())?;
    let record_bytes: usize = args.get(3).map_or(Ok(100), |a| a.parse())?;
    let runs: usize = args.get(4).map_or(Ok(3), |a| a.parse())?;
    if runs == 0 {
        return Err("runs must be at least 1".into());
    }

    write_log_unless_present(&dir, log_bytes, record_bytes)?;
    let clean = time_opens(&dir, runs, false)?;
    let rebuilt = time_opens(&dir, runs, true)?;
    println!("median open, indexes present: {:.1} ms", ms(median(clean)));
    println!(
        "median open, indexes rebuilt: {:.1} ms",
        ms(median(rebuilt))
    );
    Ok(())
}

fn write_log_unless_present(
    dir: &Path,
    log_bytes: u64,
    record_bytes: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let (mut log, _) = PartitionLog::open(FileStorage::new(), dir, LogConfig::default())?;
    if log.size_bytes() >= log_bytes {
        return Ok(());
    }
    let record = vec![0x5Au8; record_bytes];
    let batch: Vec<(u64, &[u8])> = (0..1000u64)
        .map(|i| (1_700_000_000_000 + i, record.as_slice()))
        .collect();
    // Bounded: every append grows the log by at least one entry header per record.
    while log.size_bytes() < log_bytes {
        log.append(&batch)?;
    }
    log.sync()?;
    println!(
        "wrote {} records, {} bytes, in {} segments",
        log.next_offset(),
        log.size_bytes(),
        log.segments_count()
    );
    Ok(())
}

fn time_opens(
    dir: &Path,
    runs: usize,
    remove_indexes: bool,
) -> Result<Vec<Duration>, Box<dyn std::error::Error>> {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        if remove_indexes {
            for entry in std::fs::read_dir(dir)? {
                let path = entry?.path();
                if path.extension().is_some_and(|e| e != "log") {
                    std::fs::remove_file(&path)?;
                }
            }
        }
        let started = Instant::now();
        let (log, report) = PartitionLog::open(FileStorage::new(), dir, LogConfig::default())?;
        let elapsed = started.elapsed();
        println!(
            "open ({}): {:.1} ms, {} segments, next offset {}, {} indexes rebuilt",
            if remove_indexes {
                "no indexes"
            } else {
                "indexes"
            },
            ms(elapsed),
            report.segments_count,
            log.next_offset(),
            report.indexes_rebuilt.len()
        );
        times.push(elapsed);
    }
    Ok(times)
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort_unstable();
    times[times.len() / 2]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}
