//! The durable log of one FerryMQ partition: segmented append-only files with a per-entry
//! checksum, sparse offset and time indexes, crash recovery and retention.
//!
//! Invariants:
//! - All file access goes through the [`Storage`] seam, so the same code runs on real files
//!   ([`FileStorage`]) and on simulated ones that lose unsynced bytes ([`MemoryStorage`]).
//! - The byte layout is drawn in `docs/storage.md`; every integer is little-endian.
//! - One [`PartitionLog`] owns its directory: one writer, no locks inside. The broker serialises
//!   access to a partition (it already holds the partition's lock around appends).
//! - An entry appended before a completed [`PartitionLog::sync`] survives any crash; after a crash
//!   the log is a prefix of what was appended, with dense offsets. The seeded simulation in
//!   `tests/simulation.rs` checks both over thousands of histories.
//!
//! ```
//! use ferrymq_storage::{LogConfig, MemoryStorage, PartitionLog};
//!
//! let (mut log, report) =
//!     PartitionLog::open(MemoryStorage::new(), "/data/orders-0", LogConfig::default())?;
//! assert_eq!(report.next_offset, 0);
//! let offsets = log.append(&[(1_700_000_000_000, b"record bytes".as_slice())])?;
//! log.sync()?; // durable from here on
//! let entries = log.read(offsets.start, 1 << 20, 100)?;
//! assert_eq!(entries[0].record.as_ref(), b"record bytes");
//! # Ok::<(), ferrymq_storage::LogError>(())
//! ```

mod config;
mod error;
mod format;
mod log;
mod storage;
mod verify;

pub use config::{
    LogConfig, INDEX_INTERVAL_BYTES_DEFAULT, INDEX_INTERVAL_BYTES_MAX, SEGMENT_AGE_MS_DEFAULT,
    SEGMENT_BYTES_CEILING, SEGMENT_BYTES_DEFAULT,
};
pub use error::LogError;
pub use format::{ENTRY_HEADER_BYTES, RECORD_BYTES_MAX};
pub use log::{PartitionLog, RecoveryReport, StoredEntry, Truncation};
pub use storage::{FileStorage, MemoryStorage, SimRng, Storage};
pub use verify::{verify_partition, Finding, FindingKind, VerifyReport};
