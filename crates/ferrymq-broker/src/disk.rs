//! Disk partitions: a partition's durable log, group commit, and recovery from write failures.
//!
//! A publish to a disk topic appends its records to the partition's [`PartitionLog`] under the
//! partition lock (one write call). Under `fsync=always` the records are then *unsynced*: they are
//! neither acknowledged nor delivered until a sync covers them. Syncs run on the broker's sync
//! threads, outside the partition lock, so publishers keep appending while an fsync is in flight;
//! the next sync then covers everything they appended (group commit). Under `interval` and
//! `never` records are delivered and acknowledged once written.
//!
//! Invariants (under the partition lock):
//! - `unsynced` holds exactly the written records at or above the tail's end, in offset order;
//!   the tail (`PartitionState::log`) ends where `unsynced` begins.
//! - A waiter is completed once: with `Ok` when a sync covering its end finished, or with the
//!   error of the failure that stopped the log.
//! - At most `SYNCS_IN_FLIGHT_MAX` syncs of a partition run at a time (`syncs_running`), each
//!   covering what was written before it began; a request arriving while that many run sets
//!   `sync_wanted`, and the sync thread that finishes one runs the next itself when no other job
//!   waits, or queues the partition again. They may finish in any order: what is durable is the
//!   highest `covers` finished.
//! - A failed log (`failed`) refuses appends until a recovery job has reopened it.

use std::collections::VecDeque;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferrymq_protocol::Durability;
use ferrymq_storage::{FileHandles, FileStorage, LogConfig, LogStorage, PartitionLog};
use parking_lot::{Condvar, Mutex};
use tokio::sync::oneshot;

use crate::error::BrokerError;
use crate::log::Stored;
use crate::names::ValidName;
use crate::write_faults::WriteFaults;

pub(crate) type FileLog = PartitionLog<Box<dyn LogStorage + Send>>;

/// Makes the storage each partition log is opened on: real files, or a simulated disk in tests.
pub trait StorageFactory: Send + Sync {
    fn storage(&self) -> Box<dyn LogStorage + Send>;

    /// Where the metadata store lives; `None`: the file `meta.redb` in the data dir. Called
    /// again to reopen the store after a failure: every call gives a handle to the same file.
    fn meta_backend(&self) -> Option<Box<dyn redb::StorageBackend>> {
        None
    }

    /// Removes a deleted topic's directory and everything in it, and closes whatever this
    /// storage holds open on those files: a descriptor left open keeps a deleted file's blocks
    /// allocated, so the space would not come back until the broker stopped.
    fn remove_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::remove_dir_all(dir)
    }
}

/// Real files through `std::fs`, all partitions sharing one bounded set of open handles.
#[derive(Debug, Clone)]
pub struct FileStorageFactory {
    handles: FileHandles,
}

impl FileStorageFactory {
    pub fn new(open_files_max: usize) -> Self {
        FileStorageFactory {
            handles: FileHandles::new(open_files_max),
        }
    }
}

/// Raises the process's open-files limit to its hard limit (once per process) and keeps the
/// partition logs within their share of it (`limits`).
impl Default for FileStorageFactory {
    fn default() -> Self {
        FileStorageFactory::new(crate::limits::log_files_max_for_process())
    }
}

impl StorageFactory for FileStorageFactory {
    fn storage(&self) -> Box<dyn LogStorage + Send> {
        Box::new(FileStorage::with_handles(self.handles.clone()))
    }

    fn remove_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        // Handles are shared by every partition: the deleted topic's stay in the set until they
        // are closed here (the set only closes one when it is full).
        self.handles.forget_under(dir);
        std::fs::remove_dir_all(dir)
    }
}

/// Where and how a broker keeps disk topics.
#[derive(Clone)]
pub struct DiskConfig {
    pub data_dir: PathBuf,
    /// Segment size of every partition log: the unit of retention.
    pub segment_bytes: u64,
    /// Records kept in memory per partition after they were written, so consumers that keep up
    /// are served without reading files; older records are read from the log (page cache).
    pub tail_cache_bytes: u64,
    /// The in-memory tails of all partitions together; past it each partition keeps only
    /// `tail_cache_bytes_min`, so a broker with many disk partitions stays bounded.
    pub tail_cache_budget_bytes: u64,
    pub tail_cache_bytes_min: u64,
    /// Threads running fsyncs: each handles one partition at a time, so this many partitions
    /// sync in parallel.
    pub sync_threads: usize,
    pub storage: Arc<dyn StorageFactory>,
}

impl fmt::Debug for DiskConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiskConfig")
            .field("data_dir", &self.data_dir)
            .field("segment_bytes", &self.segment_bytes)
            .field("tail_cache_bytes", &self.tail_cache_bytes)
            .field("tail_cache_budget_bytes", &self.tail_cache_budget_bytes)
            .field("sync_threads", &self.sync_threads)
            .finish_non_exhaustive()
    }
}

impl DiskConfig {
    /// Defaults for a data dir: 128 MiB segments (retention frees space in 128 MiB steps; a
    /// 10 GB backlog is 80 segments), 4 MiB of tail per partition within a 256 MiB budget.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        DiskConfig {
            data_dir: data_dir.into(),
            segment_bytes: 128 * 1024 * 1024,
            tail_cache_bytes: 4 * 1024 * 1024,
            tail_cache_budget_bytes: 256 * 1024 * 1024,
            tail_cache_bytes_min: 256 * 1024,
            sync_threads: 2,
            storage: Arc::new(FileStorageFactory::default()),
        }
    }

    pub(crate) fn log_config(&self) -> LogConfig {
        LogConfig {
            segment_bytes_max: self.segment_bytes,
            ..LogConfig::default()
        }
    }

    /// A partition's directory: a function of the validated topic name alone.
    pub(crate) fn partition_dir(&self, topic: ValidName<'_>, partition: u32) -> PathBuf {
        self.topic_dir(topic).join(partition.to_string())
    }

    /// A topic's directory, `topics/<name>`: one level below `topics/` for every valid name (see
    /// [`crate::names`]).
    pub(crate) fn topic_dir(&self, topic: ValidName<'_>) -> PathBuf {
        self.data_dir.join("topics").join(topic.as_str())
    }
}

/// A topic's fsync policy with the server default applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AppliedFsync {
    Always,
    Interval(Duration),
    Never,
}

impl AppliedFsync {
    pub fn durability(self) -> Durability {
        match self {
            AppliedFsync::Always => Durability::Synced,
            AppliedFsync::Interval(_) => Durability::SyncedInterval,
            AppliedFsync::Never => Durability::Written,
        }
    }
}

pub(crate) type Waiter = (u64, oneshot::Sender<Result<(), BrokerError>>);

/// Syncs of one partition that may run at once. With one, a publish that arrives while an
/// fsync runs waits for it to end and then for its own. Two at once (the second starting at
/// once) measured no better on ext4 here, neither in throughput nor in latency at 10 k msg/s
/// (the journal serializes them), so one it is; the bookkeeping allows more.
const SYNCS_IN_FLIGHT_MAX: u8 = 1;

/// How long a failed write keeps a reopened partition reported as faulty when no write comes
/// after it.
const WRITE_FAILURE_REMEMBERED: Duration = Duration::from_secs(60);

/// Longest wait between two attempts to reopen a failed log.
const MAX_RECOVERY_WAIT: Duration = Duration::from_secs(60);

/// The disk side of one partition; lives in its `PartitionState`.
pub(crate) struct DiskLog {
    shared: Arc<DiskShared>,
    /// `None` while the log is closed after a failure (until a recovery job reopens it), or
    /// when it could not be opened at start (`damaged`).
    log: Option<FileLog>,
    /// The log's first offset when it was last open (retention moves it).
    start_offset: u64,
    dir: PathBuf,
    fsync: AppliedFsync,
    /// Written but not yet delivered or acknowledged (fsync=always): `(offset, stored)`.
    unsynced: VecDeque<(u64, Stored)>,
    waiters: Vec<Waiter>,
    sync_queued: bool,
    syncs_running: u8,
    sync_wanted: bool,
    recover_queued: bool,
    last_sync: Instant,
    /// Why writes are refused until recovery reopens the log.
    failed: Option<String>,
    /// Why the last write failed, and when, until a write reaches the disk again: a reopened log
    /// on a disk that is still full takes writes again only to fail them, so its health is this,
    /// not `failed` alone.
    write_failure: Option<(String, Instant)>,
    /// When recovery may try again: attempts back off from 1 s to a minute.
    next_recovery: Instant,
    recover_attempts: u32,
    /// The log could not be opened at start (damage); it stays closed until the operator repairs
    /// it and restarts the broker, so saved subscription positions apply again.
    damaged: bool,
    /// Damaged ranges reads ran into, until an operator skips them (`Broker::skip_damaged`).
    /// At most [`DAMAGED_RANGES_MAX`]: past that, the oldest are reported and the newest wait.
    damage: Vec<ferrymq_storage::Damage>,
    /// Writes failed, and none reached the disk since: further failures are counted in
    /// [`WriteFaults`], not logged one by one.
    refusing: bool,
}

/// Damaged ranges one partition remembers: each is a fault an operator acts on, and a disk that
/// rots in more places than this needs the partition restored, not range by range.
pub(crate) const DAMAGED_RANGES_MAX: usize = 16;

impl DiskLog {
    pub fn new(
        shared: Arc<DiskShared>,
        mut log: FileLog,
        dir: PathBuf,
        fsync: AppliedFsync,
    ) -> Self {
        defer_writes_if_synced(&mut log, fsync);
        let start_offset = log.start_offset();
        DiskLog {
            start_offset,
            log: Some(log),
            ..Self::closed(shared, dir, fsync, None)
        }
    }

    /// A partition whose log could not be opened: every read and write gets `reason`.
    pub fn damaged(
        shared: Arc<DiskShared>,
        dir: PathBuf,
        fsync: AppliedFsync,
        reason: String,
    ) -> Self {
        DiskLog {
            damaged: true,
            ..Self::closed(shared, dir, fsync, Some(reason))
        }
    }

    fn closed(
        shared: Arc<DiskShared>,
        dir: PathBuf,
        fsync: AppliedFsync,
        failed: Option<String>,
    ) -> Self {
        DiskLog {
            shared,
            start_offset: 0,
            log: None,
            dir,
            fsync,
            unsynced: VecDeque::new(),
            waiters: Vec::new(),
            sync_queued: false,
            syncs_running: 0,
            sync_wanted: false,
            recover_queued: false,
            last_sync: Instant::now(),
            write_failure: failed.clone().map(|reason| (reason, Instant::now())),
            failed,
            next_recovery: Instant::now(),
            recover_attempts: 0,
            damaged: false,
            damage: Vec::new(),
            refusing: false,
        }
    }

    /// A read of `offset` met damage: remembers where it is and which offsets it hides (once per
    /// damaged entry), and says so in the log. Returns the error for the reader, naming it.
    pub fn note_damage(
        &mut self,
        topic: &str,
        partition: u32,
        offset: u64,
        error: ferrymq_storage::LogError,
    ) -> BrokerError {
        let found = match self.log.as_ref().map(|log| log.damage_at(offset)) {
            Some(Ok(Some(damage))) => damage,
            // Not located (the read failed for another reason, or the damage is elsewhere):
            // the reader gets the error as it is.
            _ => return BrokerError::Storage(error.to_string()),
        };
        let message = format!(
            "topic '{topic}' partition {partition}: messages {}..{} cannot be read: damaged data in {} at byte {} ({}); restore the file from a backup, or skip them with `ferrymq topic skip-damaged {topic} --partition {partition}`",
            found.first_offset,
            found.end_offset,
            found.file.display(),
            found.position,
            found.reason
        );
        let known = self
            .damage
            .iter()
            .any(|d| d.file == found.file && d.position == found.position);
        if !known && self.damage.len() < DAMAGED_RANGES_MAX {
            tracing::error!(
                topic,
                partition,
                file = %found.file.display(),
                position = found.position,
                first_offset = found.first_offset,
                end_offset = found.end_offset,
                reason = %found.reason,
                "a read found damaged data: these messages cannot be delivered until an operator skips them (see GET /status)"
            );
            self.damage.push(found);
        }
        BrokerError::Storage(message)
    }

    pub fn log(&self) -> Result<&FileLog, BrokerError> {
        self.log.as_ref().ok_or_else(|| match (&self.failed, self.damaged) {
            (Some(reason), true) => BrokerError::Storage(format!(
                "partition log {} is damaged and out of service: {reason}; repair or remove it, then restart the broker",
                self.dir.display()
            )),
            (Some(reason), false) => BrokerError::Storage(format!(
                "partition log {} is closed after a failure ({reason}); it is reopened automatically",
                self.dir.display()
            )),
            (None, _) => BrokerError::Storage(format!(
                "partition log {} is closed",
                self.dir.display()
            )),
        })
    }

    /// Refuses writes while the log is failed, with the reason.
    pub fn check_writable(&self) -> Result<&FileLog, BrokerError> {
        if self.damaged {
            return self.log();
        }
        if let Some(reason) = &self.failed {
            return Err(BrokerError::Storage(format!(
                "partition log {} refuses writes until it recovers: {reason}",
                self.dir.display()
            )));
        }
        self.log()
    }

    pub fn next_written(&self) -> u64 {
        self.log.as_ref().map_or(0, |l| l.next_offset())
    }

    pub fn has_unsynced_writes(&self, durable_next: u64) -> bool {
        self.next_written() > durable_next
    }

    /// Registers a publisher waiting for `end` to be durable.
    pub fn wait_for(&mut self, end: u64) -> oneshot::Receiver<Result<(), BrokerError>> {
        let (tx, rx) = oneshot::channel();
        self.waiters.push((end, tx));
        rx
    }

    /// Marks that a sync is wanted; returns true if the caller must queue the partition.
    pub fn want_sync(&mut self) -> bool {
        self.sync_wanted = true;
        if self.sync_queued || self.syncs_running >= SYNCS_IN_FLIGHT_MAX {
            return false;
        }
        self.sync_queued = true;
        true
    }

    /// Retention for a log closed after a failure that could not be reopened yet: deletes the
    /// closed segments every subscription settled (all below `floor`), straight from the
    /// directory. On a full disk this frees the space that reopening may need (a rebuilt index),
    /// which retention of an open log would have freed. After a deletion, recovery may try again
    /// at once instead of at the end of its back-off.
    pub fn retain_while_closed(&mut self, floor: Option<u64>) {
        let Some(floor) = floor else {
            return;
        };
        if self.log.is_some() || self.damaged || self.failed.is_none() {
            return;
        }
        let mut storage = self.shared.config.storage.storage();
        match ferrymq_storage::delete_closed_segments_below(&mut *storage, &self.dir, floor) {
            Ok(0) => {}
            Ok(deleted) => {
                tracing::info!(dir = %self.dir.display(), deleted, "retention deleted settled segments of a closed partition log");
                self.next_recovery = Instant::now();
            }
            Err(error) => {
                static SITE: std::sync::OnceLock<crate::throttle::LogThrottle> =
                    std::sync::OnceLock::new();
                if let Some(skipped) = crate::throttle::throttled(&SITE) {
                    tracing::warn!(dir = %self.dir.display(), %error, skipped, "retention could not delete a segment of a closed partition log; retrying later");
                }
            }
        }
    }

    /// Marks a recovery as wanted; returns true if the caller must queue it.
    pub fn want_recovery(&mut self) -> bool {
        if self.recover_queued || self.failed.is_none() || self.damaged {
            return false;
        }
        if Instant::now() < self.next_recovery {
            return false;
        }
        self.recover_queued = true;
        true
    }

    /// Moves the waiters that `durable` covers to `done`, to be told once the partition lock is
    /// released: each wakes a publisher's task, which may go straight for that lock.
    pub fn take_covered_waiters(&mut self, durable: u64, done: &mut Vec<Waiter>) {
        let mut i = 0;
        while i < self.waiters.len() {
            if self.waiters[i].0 <= durable {
                done.push(self.waiters.swap_remove(i));
            } else {
                i += 1;
            }
        }
    }

    fn fail_waiters(&mut self, error: &BrokerError) {
        for (_, tx) in self.waiters.drain(..) {
            let _ = tx.send(Err(error.clone()));
        }
    }

    /// Closes the partition for good (its topic was deleted): waiting publishers are told.
    pub fn close(&mut self, reason: String) {
        if std::mem::take(&mut self.refusing) {
            self.shared.write_faults.forget(&self.dir);
        }
        let error = BrokerError::Storage(reason.clone());
        self.fail_waiters(&error);
        self.failed = Some(reason);
        self.log = None;
        self.unsynced.clear();
    }

    /// Stops writes after a failure that the log cannot undo by itself.
    pub fn fail(&mut self, reason: String) {
        self.report_fault(&reason);
        let error = BrokerError::Storage(format!(
            "partition log {} failed: {reason}",
            self.dir.display()
        ));
        self.fail_waiters(&error);
        self.write_failure = Some((reason.clone(), Instant::now()));
        self.failed = Some(reason);
    }

    /// Why this partition does not take writes, or failed its last one within
    /// [`WRITE_FAILURE_REMEMBERED`]; `None` when healthy. A partition nobody writes to after a
    /// failure is not reported for ever: without writes, nothing is failing.
    pub fn fault(&self) -> Option<&str> {
        if let Some(reason) = &self.failed {
            return Some(reason);
        }
        match &self.write_failure {
            Some((reason, at)) if at.elapsed() < WRITE_FAILURE_REMEMBERED => Some(reason),
            _ => None,
        }
    }

    /// The open log; `None` while it is closed after a failure (until a recovery job reopens
    /// it), or when it could not be opened at start (damaged).
    pub fn open_log(&self) -> Option<&FileLog> {
        self.log.as_ref()
    }

    /// [`DiskLog::open_log`], to write to or sync.
    pub fn open_log_mut(&mut self) -> Option<&mut FileLog> {
        self.log.as_mut()
    }

    /// The log's first offset when it was last open.
    pub fn start_offset(&self) -> u64 {
        self.start_offset
    }

    /// Retention deleted the log's segments below `start`.
    pub fn retained_from(&mut self, start: u64) {
        self.start_offset = start;
    }

    pub fn fsync(&self) -> AppliedFsync {
        self.fsync
    }

    /// When the last group commit finished.
    pub fn last_sync(&self) -> Instant {
        self.last_sync
    }

    /// True while writes are refused until recovery reopens the log.
    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// True when the log could not be opened at start.
    pub fn is_damaged(&self) -> bool {
        self.damaged
    }

    /// The damaged ranges reads ran into, not yet skipped.
    pub fn damage(&self) -> &[ferrymq_storage::Damage] {
        &self.damage
    }

    /// Takes the damaged ranges, for an operator's skip.
    pub fn take_damage(&mut self) -> Vec<ferrymq_storage::Damage> {
        std::mem::take(&mut self.damage)
    }

    /// The bytes held by the in-memory tails of all disk partitions, this one's included.
    pub fn tail_bytes(&self) -> &AtomicU64 {
        &self.shared.tail_bytes
    }

    /// Takes the written records a sync covering everything below `covers` made durable.
    pub fn take_synced(
        &mut self,
        covers: u64,
    ) -> std::collections::vec_deque::Drain<'_, (u64, Stored)> {
        let synced = self.unsynced.partition_point(|(o, _)| *o < covers);
        self.unsynced.drain(..synced)
    }

    /// Forgets the written records at and after `next`, which a reopened log no longer holds;
    /// returns how many.
    pub fn forget_unsynced_from(&mut self, next: u64) -> usize {
        let lost = self.unsynced.iter().filter(|(o, _)| *o >= next).count();
        self.unsynced.retain(|(o, _)| *o < next);
        lost
    }

    /// A sync wrote new data through to the disk: the last write failure is over.
    pub fn wrote_through(&mut self) {
        self.write_failure = None;
        if std::mem::take(&mut self.refusing) {
            self.shared.write_faults.recovered(&self.dir);
        }
    }

    /// Logs a failure of a write, a sync or a reopen: the first of a run of them, until a write
    /// reaches the disk again, is logged; the rest are counted (see [`WriteFaults`]).
    fn report_fault(&mut self, reason: &str) {
        if self.refusing {
            self.shared.write_faults.again(&self.dir, reason);
        } else {
            self.refusing = true;
            self.shared.write_faults.stopped(&self.dir, reason);
        }
    }

    /// The newest timestamp of the written records that wait for a sync (0 when none).
    pub fn unsynced_timestamp_us(&self) -> u64 {
        self.unsynced.back().map_or(0, |(_, s)| s.timestamp_us)
    }

    /// Refuses a batch of `count` records and `bytes` bytes when the log refuses writes, or
    /// when it would take the log past `limits` (messages, bytes: a reject-overflow topic's).
    pub fn check_append(
        &self,
        topic: &str,
        partition: u32,
        (count, bytes): (u64, u64),
        limits: Option<(u64, u64)>,
    ) -> Result<(), BrokerError> {
        let log = self.check_writable()?;
        let Some((max_messages, max_bytes)) = limits else {
            return Ok(());
        };
        let held = log.next_offset() - log.start_offset();
        if held + count > max_messages || log.size_bytes() + bytes > max_bytes {
            return Err(BrokerError::TopicFull {
                topic: topic.to_string(),
                reason: format!(
                    "partition {partition} holds {held} messages, {} bytes on disk",
                    log.size_bytes()
                ),
            });
        }
        Ok(())
    }

    /// The offset the next append gets, counting records written but not yet synced; `None`
    /// while the log is closed.
    pub fn next_offset(&self) -> Option<u64> {
        self.log.as_ref().map(|log| log.next_offset())
    }

    /// Appends `entries` (checked by [`DiskLog::check_append`]) with one write. A failed write
    /// is recorded as the partition's fault, and may leave the log wanting a recovery.
    pub fn append(&mut self, topic: &str, partition: u32, entries: &[(u64, &[u8])]) -> Appended {
        let log = self.log.as_mut().expect("checked writable");
        let first = log.next_offset();
        // The records kept in memory are slices of the buffer written to the file: no copy
        // of their own.
        let appended = log.append_shared(entries);
        let end = log.next_offset();
        let error = match appended {
            Ok((_, records)) => {
                // Written to the file already unless the sync thread writes (fsync=always).
                if self.fsync != AppliedFsync::Always {
                    self.wrote_through();
                }
                return Appended {
                    first,
                    end,
                    records,
                    error: None,
                    wants_recovery: false,
                };
            }
            Err(error) => error,
        };
        // Nothing of a failed batch is in the log (a batch is one write to one segment);
        // `end - first` is zero, and kept general should that ever change.
        let records = entries
            .iter()
            .take((end - first) as usize)
            .map(|(_, record)| Bytes::copy_from_slice(record))
            .collect();
        let failed_reason = log.failed_reason().map(str::to_string);
        self.write_failure = Some((error.to_string(), Instant::now()));
        let mut wants_recovery = false;
        if let Some(reason) = failed_reason {
            self.fail(reason);
            wants_recovery = self.want_recovery();
        }
        if self.failed.is_none() {
            // Undone: the log takes writes still, but this one did not reach the disk.
            self.report_fault(&format!(
                "append to topic '{topic}' partition {partition} failed: {error}"
            ));
        }
        Appended {
            first,
            end,
            records,
            error: Some(BrokerError::Storage(format!(
                "could not write to topic '{topic}' partition {partition}: {error}"
            ))),
            wants_recovery,
        }
    }

    /// Keeps written records until a sync covers them (fsync=always). Returns the wait of the
    /// publisher for that sync, when anything was written, and whether the caller is to queue
    /// the sync.
    pub fn keep_until_synced(
        &mut self,
        written: impl Iterator<Item = (u64, Stored)>,
        (first, end): (u64, u64),
    ) -> (Option<oneshot::Receiver<Result<(), BrokerError>>>, bool) {
        self.unsynced.extend(written);
        self.debug_check();
        if end <= first {
            return (None, false);
        }
        let wait = self.wait_for(end);
        (Some(wait), self.want_sync())
    }

    /// Checks, in debug builds, the invariants stated at the top of this file that the disk
    /// side can check alone: the unsynced records are ascending and dense and lie in the log
    /// written, and no more syncs run than allowed.
    fn debug_check(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        assert!(
            self.syncs_running <= SYNCS_IN_FLIGHT_MAX,
            "{} syncs of {} running",
            self.syncs_running,
            self.dir.display()
        );
        if let (Some((first, _)), Some((last, _))) = (self.unsynced.front(), self.unsynced.back()) {
            assert_eq!(
                last - first + 1,
                self.unsynced.len() as u64,
                "unsynced records of {} are not dense",
                self.dir.display()
            );
            if let Some(log) = &self.log {
                assert!(
                    *last < log.next_offset(),
                    "unsynced record {last} of {} beyond the log's end {}",
                    self.dir.display(),
                    log.next_offset()
                );
            }
        }
    }

    /// The first phase of a group commit, under the partition lock: what to fsync, or `None`
    /// when the log failed or is closed.
    pub fn begin_sync(&mut self) -> Option<ferrymq_storage::SyncJob> {
        self.sync_queued = false;
        self.sync_wanted = false;
        if self.failed.is_some() {
            return None;
        }
        let log = self.log.as_mut()?;
        match log.begin_sync() {
            Ok(job) => {
                self.syncs_running += 1;
                self.debug_check();
                Some(job)
            }
            Err(error) => {
                self.fail(error.to_string());
                None
            }
        }
    }

    /// The last phase of a group commit, under the partition lock again: the offset the fsync
    /// covers, unless the log failed meanwhile (a deleted segment file included).
    pub fn finish_sync(&mut self, done: ferrymq_storage::SyncDone) -> SyncEnd {
        self.syncs_running -= 1;
        self.last_sync = Instant::now();
        let Some(log) = self.log.as_mut() else {
            return SyncEnd::Gone;
        };
        match log.finish_sync(done) {
            Ok(covers) => match log.active_segment_missing() {
                Some(file) => {
                    self.fail(format!(
                        "segment file {} was deleted while in use; entries written to it are lost when the log is reopened",
                        file.display()
                    ));
                    SyncEnd::Failed
                }
                None => {
                    self.debug_check();
                    SyncEnd::Covered(covers)
                }
            },
            Err(error) => {
                self.fail(error.to_string());
                SyncEnd::Failed
            }
        }
    }

    /// True when writes that asked for a sync came in while one ran, and some of them are not
    /// durable yet (below `durable_next` everything is).
    pub fn wants_another_sync(&self, durable_next: u64) -> bool {
        self.sync_wanted && self.has_unsynced_writes(durable_next)
    }

    /// Claims the next sync for the caller when none is queued and the syncs in flight allow
    /// one more.
    pub fn claim_sync(&mut self) -> bool {
        if self.sync_queued || self.syncs_running >= SYNCS_IN_FLIGHT_MAX {
            return false;
        }
        self.sync_queued = true;
        true
    }

    /// Reopens a failed log: recovery checks what is really on disk. Returns where the
    /// reopened log ends, or `None` when it was not failed or still cannot be reopened (then
    /// the next attempt backs off).
    pub fn reopen_failed(&mut self, config: &DiskConfig) -> Option<u64> {
        self.recover_queued = false;
        self.failed.as_ref()?;
        // Close the old log first so that its file handles are gone before the reopen.
        drop(self.log.take());
        match reopen(config, &self.dir) {
            Ok(mut log) => {
                let next = log.next_offset();
                defer_writes_if_synced(&mut log, self.fsync);
                self.start_offset = log.start_offset();
                self.log = Some(log);
                self.failed = None;
                self.recover_attempts = 0;
                Some(next)
            }
            Err(error) => {
                self.recover_attempts = self.recover_attempts.saturating_add(1);
                let wait =
                    Duration::from_secs(1 << self.recover_attempts.min(6)).min(MAX_RECOVERY_WAIT);
                self.next_recovery = Instant::now() + wait;
                tracing::debug!(dir = %self.dir.display(), %error, retry_in_s = wait.as_secs(), "partition log still cannot be reopened");
                self.report_fault(&format!("cannot be reopened: {error}"));
                self.failed = Some(error);
                None
            }
        }
    }
}

/// One partition's records of a batch, appended to its log by [`DiskLog::append`].
pub(crate) struct Appended {
    /// The offset of the first record.
    pub first: u64,
    /// The end of what was written.
    pub end: u64,
    /// The records written, as kept in memory.
    pub records: Vec<Bytes>,
    /// The write's error, recorded as the partition's fault already.
    pub error: Option<BrokerError>,
    /// The failure left the log wanting a recovery, for the caller to queue.
    pub wants_recovery: bool,
}

/// How the last phase of a group commit ended.
pub(crate) enum SyncEnd {
    /// The log was closed meanwhile: nothing follows.
    Gone,
    /// The log failed; it wants recovery.
    Failed,
    /// Everything below this offset is durable.
    Covered(u64),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum JobKind {
    Sync,
    Recover,
}

/// What the sync threads work on: the partitions of a topic. The topic implements it, so that
/// this layer depends on nothing above it.
pub(crate) trait SyncTarget: Send + Sync {
    /// One group commit of partition `index`. True when the partition needs another and the
    /// calling thread is to run it now (it counts as queued).
    fn sync_partition(&self, shared: &DiskShared, index: u32) -> bool;
    /// Reopens the failed log of partition `index`.
    fn recover_partition(&self, shared: &DiskShared, index: u32);
}

struct Job {
    target: Weak<dyn SyncTarget>,
    partition: u32,
    kind: JobKind,
    /// When it was queued, for the sync queue's histogram (`stages`).
    queued: Instant,
}

/// The queue the sync threads take jobs from, and the accounting of in-memory tails.
pub(crate) struct DiskShared {
    pub config: DiskConfig,
    queue: Mutex<VecDeque<Job>>,
    queued: Condvar,
    stop: AtomicBool,
    /// Bytes held by the in-memory tails of all disk partitions.
    pub tail_bytes: AtomicU64,
    /// The partitions refusing writes, for their log lines.
    pub write_faults: WriteFaults,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl DiskShared {
    pub fn start(config: DiskConfig) -> Arc<DiskShared> {
        let shared = Arc::new(DiskShared {
            config,
            queue: Mutex::new(VecDeque::new()),
            queued: Condvar::new(),
            stop: AtomicBool::new(false),
            tail_bytes: AtomicU64::new(0),
            write_faults: WriteFaults::default(),
            threads: Mutex::new(Vec::new()),
        });
        for i in 0..shared.config.sync_threads.max(1) {
            let worker = shared.clone();
            let handle = std::thread::Builder::new()
                .name(format!("ferrymq-sync-{i}"))
                .spawn(move || worker.run())
                .expect("spawning a sync thread");
            shared.threads.lock().push(handle);
        }
        shared
    }

    /// Stops the sync threads and waits for them; a job in progress finishes first.
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
        {
            let _guard = self.queue.lock();
            self.queued.notify_all();
        }
        let threads = std::mem::take(&mut *self.threads.lock());
        for thread in threads {
            let _ = thread.join();
        }
    }

    pub fn queue_sync<T: SyncTarget + 'static>(&self, target: &Arc<T>, partition: u32) {
        let target: Weak<T> = Arc::downgrade(target);
        self.push(Job {
            target,
            partition,
            kind: JobKind::Sync,
            queued: Instant::now(),
        });
    }

    pub fn queue_recovery<T: SyncTarget + 'static>(&self, target: &Arc<T>, partition: u32) {
        let target: Weak<T> = Arc::downgrade(target);
        self.push(Job {
            target,
            partition,
            kind: JobKind::Recover,
            queued: Instant::now(),
        });
    }

    fn push(&self, job: Job) {
        self.queue.lock().push_back(job);
        self.queued.notify_one();
    }

    fn run(&self) {
        loop {
            let job = {
                let mut queue = self.queue.lock();
                loop {
                    if self.stop.load(Relaxed) {
                        return;
                    }
                    if let Some(job) = queue.pop_front() {
                        break job;
                    }
                    self.queued.wait(&mut queue);
                }
            };
            let Some(target) = job.target.upgrade() else {
                continue;
            };
            if let JobKind::Sync = job.kind {
                crate::stages::record_since(crate::stages::Stage::SyncQueue, job.queued);
            }
            match job.kind {
                // A partition written to while its sync ran is synced again on this thread
                // while no other job waits, without a hand-off through the queue.
                JobKind::Sync => while target.sync_partition(self, job.partition) {},
                JobKind::Recover => target.recover_partition(self, job.partition),
            }
        }
    }

    /// True when a sync thread that just finished a job may run the next sync of the same
    /// partition itself: the threads are not stopping and no other job waits.
    pub(crate) fn may_continue(&self) -> bool {
        !self.stop.load(Relaxed) && self.queue.lock().is_empty()
    }
}

/// Under fsync=always a publisher is answered only once a sync covers its records, so the sync
/// thread may as well write them: a publish then only encodes its records under the partition
/// lock, and no async worker blocks in a `write` that waits for the disk (on ext4 an append
/// waits for the pages and inode that an fsync in flight is writing back).
fn defer_writes_if_synced(log: &mut FileLog, fsync: AppliedFsync) {
    if matches!(fsync, AppliedFsync::Always) {
        log.defer_writes();
    }
}

/// Opens a partition log after a failure and syncs what it holds, so that all of it counts as
/// durable from here on.
fn reopen(config: &DiskConfig, dir: &Path) -> Result<FileLog, String> {
    let (mut log, report) = PartitionLog::open(config.storage.storage(), dir, config.log_config())
        .map_err(|e| e.to_string())?;
    log_recovery(dir, &report);
    log.sync().map_err(|e| e.to_string())?;
    // On a disk that is still full the next write fails again: the partition says it recovered
    // once a write reached the disk (see `WriteFaults`), not at each reopen.
    tracing::debug!(dir = %dir.display(), next_offset = log.next_offset(), "partition log reopened; writes are tried again");
    Ok(log)
}

/// Says in the broker's log what opening a partition log repaired.
pub(crate) fn log_recovery(dir: &Path, report: &ferrymq_storage::RecoveryReport) {
    if let Some(t) = &report.truncation {
        tracing::warn!(
            file = %t.file.display(),
            position = t.position,
            bytes_dropped = t.bytes_dropped,
            reason = %t.reason,
            "cut a torn tail off a partition log (a write in progress at a crash)"
        );
    }
    for path in &report.indexes_rebuilt {
        tracing::warn!(file = %path.display(), "rebuilt a missing or stale index");
    }
    for path in &report.orphans_removed {
        tracing::warn!(file = %path.display(), "removed an index file without its segment");
    }
    tracing::debug!(
        dir = %dir.display(),
        segments = report.segments_count,
        start_offset = report.start_offset,
        next_offset = report.next_offset,
        "partition log opened"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_is_a_fault_until_a_write_succeeds_or_a_quiet_minute_passes() {
        let dir = std::env::temp_dir().join(format!("ferrymq-disk-fault-{}", std::process::id()));
        let shared = DiskShared::start(DiskConfig::new(&dir));
        let mut disk = DiskLog::closed(shared.clone(), dir, AppliedFsync::Always, None);
        assert_eq!(disk.fault(), None);

        let full = "No space left on device (os error 28)".to_string();
        disk.write_failure = Some((full.clone(), Instant::now()));
        assert_eq!(disk.fault(), Some(full.as_str()));
        // A minute without writes after it: nothing is failing any more.
        if let Some(long_ago) = Instant::now().checked_sub(WRITE_FAILURE_REMEMBERED) {
            disk.write_failure = Some((full.clone(), long_ago));
            assert_eq!(disk.fault(), None);
        }

        // A log that stopped is a fault for as long as it is stopped, however old.
        disk.fail("segment gone".to_string());
        assert_eq!(disk.fault(), Some("segment gone"));
        if let Some(long_ago) = Instant::now().checked_sub(WRITE_FAILURE_REMEMBERED) {
            disk.write_failure = Some(("segment gone".to_string(), long_ago));
            assert_eq!(disk.fault(), Some("segment gone"));
        }
        shared.stop();
    }

    /// The syncs move records into a partition's in-memory tail and the publishes trim it: the
    /// tail passes its bound by at most the last group commit, and the broker-wide count of tail
    /// bytes stays exact.
    #[tokio::test]
    async fn publishes_keep_the_in_memory_tail_within_its_bound() {
        use crate::{Broker, BrokerConfig};
        use ferrymq_protocol::{FsyncPolicy, Message, Storage, TopicConfig};

        let dir = std::env::temp_dir().join(format!("ferrymq-disk-tail-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut config = DiskConfig::new(&dir);
        config.tail_cache_bytes = 4096;
        config.tail_cache_bytes_min = 1024;
        let broker = Broker::open_durable(BrokerConfig::default(), config).unwrap();
        let topic_config = TopicConfig {
            partitions: 1,
            storage: Storage::Disk,
            fsync: FsyncPolicy::Always,
            ..TopicConfig::default()
        };
        broker.create_topic("tail", topic_config, false).unwrap();
        let topic = broker.topic("tail").unwrap();
        let mut largest_batch = 0;
        for round in 0..40 {
            let messages: Vec<Message> = (0..10 + round % 7)
                .map(|i| Message::new(vec![b'x'; 100 + i]))
                .collect();
            let records = ferrymq_protocol::RecordBatch::from_messages(&messages).unwrap();
            // What the tail counts for them.
            let batch = records
                .spans()
                .map(|s| (s.end - s.start) as u64)
                .sum::<u64>()
                + messages.len() as u64 * crate::MESSAGE_OVERHEAD_BYTES;
            largest_batch = largest_batch.max(batch);
            let receipt = broker.publish_messages("tail", &messages).await.unwrap();
            assert_eq!(receipt.ranges.len(), 1);
            let state = topic.partitions[0].state.lock();
            let tail = state.log.bytes();
            assert!(
                tail <= 4096 + largest_batch,
                "round {round}: the tail holds {tail} bytes, bound 4096 + one group commit"
            );
            let shared = state.disk.as_ref().unwrap().shared.clone();
            assert_eq!(shared.tail_bytes.load(Relaxed), tail, "round {round}");
        }
        // The tail ends where the log does: every acknowledged record is in it.
        let state = topic.partitions[0].state.lock();
        assert_eq!(state.log.next_offset(), state.durable_next);
        assert!(state.log.head() > 0, "the tail was trimmed");
        drop(state);
        drop(broker);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
