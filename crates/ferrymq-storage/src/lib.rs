//! The durable log of one FerryMQ partition: segmented append-only files with a per-entry
//! checksum, sparse offset and time indexes, crash recovery and retention.
//!
//! Invariants:
//! - All file access goes through the [`LogStorage`] seam, so the same code runs on real files
//!   ([`FileStorage`]) and on simulated ones that lose unsynced bytes ([`MemoryStorage`]).
//! - The byte layout is drawn in `docs/storage.md`; every integer is little-endian.
//! - One [`PartitionLog`] owns its directory: one writer, no locks inside. The broker serialises
//!   access to a partition (it already holds the partition's lock around appends). For group
//!   commit the fsync runs outside that lock: [`PartitionLog::begin_sync`] captures a
//!   [`SyncJob`], which runs on any thread, and [`PartitionLog::finish_sync`] acknowledges it.
//! - An entry appended before a completed [`PartitionLog::sync`], or below the
//!   [`SyncJob::covers`] of a finished sync job, survives any crash; after a crash the log is a
//!   prefix of what was appended, with dense offsets. The seeded simulation in
//!   `tests/simulation.rs` checks both over thousands of histories.
//! - [`SimBlockFile`] is a redb `StorageBackend` that can lose power the same way (per sector), so
//!   that what the broker keeps in redb is tested against crashes too (`tests/redb_crash.rs`).
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
//!
//! Group commit, with the log behind the broker's lock and the fsync on another thread:
//!
//! ```
//! use std::sync::Mutex;
//! use ferrymq_storage::{LogConfig, MemoryStorage, PartitionLog, LogStorage};
//!
//! let storage: Box<dyn LogStorage + Send> = Box::new(MemoryStorage::new());
//! let log = Mutex::new(PartitionLog::open(storage, "/data/orders-0", LogConfig::default())?.0);
//! log.lock().unwrap().append(&[(1, b"a".as_slice())])?;
//! let job = log.lock().unwrap().begin_sync()?; // cheap, under the lock
//! let done = std::thread::spawn(move || job.run()).join().unwrap(); // the fsync, no lock
//! let durable = log.lock().unwrap().finish_sync(done)?;
//! assert_eq!(durable, 1); // entries below 1 are durable
//! # Ok::<(), ferrymq_storage::LogError>(())
//! ```

mod config;
mod error;
mod format;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod log;
mod sim_block;
mod storage;
mod verify;

pub use config::{
    LogConfig, BATCH_BYTES_MAX, INDEX_INTERVAL_BYTES_DEFAULT, INDEX_INTERVAL_BYTES_MAX,
    SEGMENT_AGE_MS_DEFAULT, SEGMENT_BYTES_CEILING, SEGMENT_BYTES_DEFAULT,
};
pub use error::LogError;
pub use format::{ENTRY_FORMAT_VERSION, ENTRY_HEADER_BYTES, RECORD_BYTES_MAX};
pub use log::{
    delete_closed_segments_below, Damage, PartitionLog, RecoveryReport, StoredEntry, SyncDone,
    SyncJob, Truncation,
};
pub use sim_block::SimBlockFile;
pub use storage::{
    is_out_of_open_files, AppendFn, FileHandles, FileStorage, LogStorage, MemoryStorage, SimRng,
    SyncFn, WriteFn,
};
pub use verify::{verify_partition, Finding, FindingKind, VerifyReport};
