//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`), kept in the crate so that
//! the inputs they found stay regression tests here. Not part of the crate's API.
//!
//! `log_recovery`: a partition log written by FerryMQ, then damaged by arbitrary edits of its segment, offset
//! index and time index files (byte flips, overwrites, truncations, deletions), then opened the
//! way the broker opens it after a crash. Opening and reading must never panic and never return
//! data that was not written: every entry read back is the record appended at that offset. A log
//! that opens takes a new append, and a reopen finds it.
//!
//! The input: its first bytes choose how many records to write and their sizes; the rest is a
//! list of edits of 5 bytes each (file, operation, position, value).
use std::path::{Path, PathBuf};

use crate::{LogConfig, LogStorage, MemoryStorage, PartitionLog};

const DIR: &str = "/data/orders/0";

fn config() -> LogConfig {
    // Small segments and dense index points, so that a few records make several of each.
    LogConfig {
        segment_bytes_max: 256,
        index_interval_bytes: 48,
        ..LogConfig::default()
    }
}

fn record(i: usize, size: u8) -> Vec<u8> {
    (0..size as usize + 1).map(|j| (i * 31 + j) as u8).collect()
}

fn apply_edit(storage: &mut MemoryStorage, files: &[PathBuf], edit: &[u8]) {
    let Some(path) = files.get(edit[0] as usize % files.len().max(1)) else {
        return;
    };
    let Ok(len) = storage.len(path) else {
        return;
    };
    let position = u16::from_le_bytes([edit[2], edit[3]]) as u64;
    match edit[1] % 4 {
        0 if len > 0 => {
            let at = position % len;
            let mut byte = [0u8];
            storage.read_at(path, at, &mut byte).unwrap();
            storage
                .write_at(path, at, &[byte[0] ^ edit[4].max(1)])
                .unwrap();
        }
        1 if len > 0 => {
            storage.write_at(path, position % len, &[edit[4]]).unwrap();
        }
        2 => storage.truncate(path, position % (len + 1)).unwrap(),
        3 if edit[4] == 0 => storage.remove(path).unwrap(),
        3 => storage.append(path, &edit[2..]).unwrap(),
        _ => {}
    }
}

fn files(storage: &MemoryStorage) -> Vec<PathBuf> {
    let mut names = storage.list(Path::new(DIR)).unwrap_or_default();
    names.sort();
    names.into_iter().map(|n| Path::new(DIR).join(n)).collect()
}

/// Writes, damages and reopens a log as `data` says, asserting what a user relies on (see the
/// module's documentation); panics on a violation.
// One history read top to bottom: write, damage, open and read, append, reopen.
pub fn log_recovery(data: &[u8]) {
    let Some((&count, rest)) = data.split_first() else {
        return;
    };
    let count = count as usize % 48;
    let (sizes, edits) = rest.split_at(count.min(rest.len()));
    let written: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| record(i, s))
        .collect();

    let (mut log, _) = PartitionLog::open(MemoryStorage::new(), DIR, config()).unwrap();
    for (i, r) in written.iter().enumerate() {
        log.append(&[(1_700_000_000_000 + i as u64, r.as_slice())])
            .unwrap();
    }
    log.sync().unwrap();
    let mut storage = log.into_storage();
    let names = files(&storage);
    for edit in edits.chunks_exact(5).take(16) {
        apply_edit(&mut storage, &names, edit);
    }

    let Ok((log, report)) = PartitionLog::open(storage, DIR, config()) else {
        // Damage a crash cannot cause is refused, with a reason: never served.
        return;
    };
    assert!(
        report.next_offset <= written.len() as u64,
        "more entries than were written"
    );
    assert_eq!(log.next_offset(), report.next_offset);
    let mut offset = log.start_offset();
    while offset < log.next_offset() {
        match log.read(offset, 1 << 16, 8) {
            Ok(entries) => {
                assert!(
                    !entries.is_empty(),
                    "a read below next_offset returns an entry"
                );
                for entry in &entries {
                    assert_eq!(entry.offset, offset, "offsets are dense");
                    assert_eq!(
                        &entry.record[..],
                        &written[offset as usize][..],
                        "entry {offset} is not what was written"
                    );
                    offset += 1;
                }
            }
            // Damage found by a read is an error, never data; skip past it.
            Err(_) => offset += 1,
        }
        let _ = log.offset_for_time(1_700_000_000_000 + offset);
    }

    if log.failed_reason().is_some() {
        return;
    }
    let mut log = log;
    let next = log.next_offset();
    if log
        .append(&[(1_800_000_000_000, b"after".as_slice())])
        .is_err()
        || log.sync().is_err()
    {
        return;
    }
    let storage = log.into_storage();
    let (log, _) = PartitionLog::open(storage, DIR, config()).expect("a log it wrote itself opens");
    let entries = log
        .read(next, 1 << 16, 1)
        .expect("the new entry reads back");
    assert_eq!(&entries[0].record[..], b"after");
}

#[cfg(test)]
mod tests {
    /// Inputs the fuzz target once failed on, replayed on every test run.
    #[test]
    fn log_recovery_findings() {
        let findings: &[&[u8]] = &[
            // Two byte flips in the first segment: the first open accepted the log, and after an
            // append the reopen refused it as corrupt.
            &[
                0x08, 0x05, 0x05, 0x20, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x40, 0x7f,
                0x8b, 0x80, 0x10, 0xfc, 0xff, 0xff, 0xff, 0x00,
            ],
        ];
        for input in findings {
            super::log_recovery(input);
        }
    }
}
