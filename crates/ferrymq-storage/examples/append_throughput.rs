//! Appends records to a partition log on real files and reports throughput.
//!
//! `cargo run --release -p ferrymq-storage --example append_throughput -- [dir] [records]
//! [record_bytes] [batch_count]`: appends `records` records of `record_bytes` in batches of
//! `batch_count`, syncing after every batch (the broker's fsync=always with one batch per group
//! commit), then reads everything back. The directory is removed afterwards.

use std::time::Instant;

use ferrymq_storage::{FileStorage, LogConfig, PartitionLog};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("ferrymq-append-throughput"));
    let records: usize = args.get(2).map_or(Ok(1_000_000), |a| a.parse())?;
    let record_bytes: usize = args.get(3).map_or(Ok(100), |a| a.parse())?;
    let batch_count: usize = args.get(4).map_or(Ok(1000), |a| a.parse())?;
    let _ = std::fs::remove_dir_all(&dir);

    let (mut log, _) = PartitionLog::open(FileStorage::new(), &dir, LogConfig::default())?;
    let record = vec![0x5Au8; record_bytes];
    let batch: Vec<(u64, &[u8])> = (0..batch_count).map(|_| (0, record.as_slice())).collect();
    let started = Instant::now();
    let mut appended = 0;
    while appended < records {
        let n = batch_count.min(records - appended);
        log.append(&batch[..n])?;
        log.sync()?;
        appended += n;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let bytes = log.size_bytes() as f64;
    println!(
        "append+sync: {records} records of {record_bytes} B in batches of {batch_count}: {:.0} records/s, {:.1} MB/s of log, {:.0} syncs/s",
        records as f64 / elapsed,
        bytes / elapsed / 1e6,
        (records / batch_count) as f64 / elapsed
    );

    let started = Instant::now();
    let mut next = log.start_offset();
    let mut read = 0usize;
    // Bounded: every read returns at least one entry until the end.
    for _ in 0..records {
        let entries = log.read(next, 1 << 20, 10_000)?;
        let Some(last) = entries.last() else { break };
        next = last.offset + 1;
        read += entries.len();
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "read: {read} records: {:.0} records/s, {:.1} MB/s",
        read as f64 / elapsed,
        bytes / elapsed / 1e6
    );
    drop(log);

    let started = Instant::now();
    let (log, _) = PartitionLog::open(FileStorage::new(), &dir, LogConfig::default())?;
    println!(
        "reopen: {:.1} ms for {} segments, next offset {}",
        started.elapsed().as_secs_f64() * 1e3,
        log.segments_count(),
        log.next_offset()
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
