//! The durable log of one FerryMQ partition: segmented append-only files with a per-entry
//! checksum, sparse offset and time indexes, crash recovery and retention.
//!
//! Invariants:
//! - All file access goes through the [`Storage`] seam, so the same code runs on real files
//!   ([`FileStorage`]) and on simulated ones that lose unsynced bytes ([`MemoryStorage`]).
//! - The byte layout is drawn in `docs/storage.md`; every integer is little-endian.

mod config;
mod error;
mod format;
mod log;
mod storage;

pub use config::{
    LogConfig, INDEX_INTERVAL_BYTES_DEFAULT, INDEX_INTERVAL_BYTES_MAX, SEGMENT_AGE_MS_DEFAULT,
    SEGMENT_BYTES_CEILING, SEGMENT_BYTES_DEFAULT,
};
pub use error::LogError;
pub use format::{ENTRY_HEADER_BYTES, RECORD_BYTES_MAX};
pub use log::{PartitionLog, RecoveryReport, StoredEntry, Truncation};
pub use storage::{FileStorage, MemoryStorage, SimRng, Storage};
