//! The durable log of one FerryMQ partition: segmented append-only files with a per-entry
//! checksum, sparse offset and time indexes, crash recovery and retention.
//!
//! Invariants:
//! - All file access goes through the [`Storage`] seam, so the same code runs on real files
//!   ([`FileStorage`]) and on simulated ones that lose unsynced bytes ([`MemoryStorage`]).
//! - The byte layout is drawn in `docs/storage.md`; every integer is little-endian.

mod storage;

pub use storage::{FileStorage, MemoryStorage, SimRng, Storage};
