//! Seeded simulation: random histories of append, sync, group-commit sync jobs (begin, run and
//! finish, with appends, rolls, retention and crashes in between), read, retention, clean reopen
//! and crash on `MemoryStorage`, half of them with injected I/O errors, checked against a model of
//! what was appended and what was synced.
//!
//! Properties, after every crash and reopen:
//! - every entry appended before a completed `sync` survives, and so does every entry below the
//!   `covers` of a successfully finished sync job (a job begun, or run, but not finished claims
//!   nothing);
//! - a log stopped by an I/O error it could not undo loses nothing it acknowledged, and recovers
//!   at most the entries of the failed append beyond that;
//! - the recovered log is a prefix of what was appended since the start offset: same offsets,
//!   timestamps and bytes, in order, no holes, no garbage;
//! - appends after recovery continue at the recovered next offset and read back.
//!
//! A failure prints its seed. `FERRYMQ_SIM_SEED=<seed>` replays that one history
//! (`FERRYMQ_SIM_TRACE=1` prints each step);
//! `FERRYMQ_SIM_HISTORIES=<n>` changes how many are run, `FERRYMQ_SIM_BASE=<seed>` where they start.

use std::cell::{Cell, RefCell};
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use ferrymq_storage::{
    LogConfig, LogStorage, MemoryStorage, PartitionLog, SimRng, SyncDone, SyncFn, SyncJob,
};

const DIR: &str = "/sim/partition-0";
const HISTORIES_DEFAULT: u64 = 2000;
const STEPS_PER_HISTORY: usize = 80;

struct Model {
    /// Everything appended and not lost to a crash, by offset.
    entries: Vec<(u64, Vec<u8>)>,
    /// Offsets below this were deleted by retention.
    start_offset: u64,
    /// Offsets below this were synced, by `sync` or a finished sync job (or survived a crash,
    /// which makes them on disk).
    durable_offset: u64,
    /// Entries of an append that failed in a way the log could not undo: they may or may not be
    /// on disk, so a reopen may recover a prefix of them after `entries`.
    uncertain: Vec<(u64, Vec<u8>)>,
}

/// `MemoryStorage` with seeded I/O errors: an append writes a prefix of its bytes and fails, a
/// sync, directory sync or truncate fails; a deferred sync fails when captured or, more often,
/// when it runs. Disarmed while the log opens, so that a history goes
/// on; a failing open is covered by the unit tests.
struct FaultyStorage {
    inner: MemoryStorage,
    rng: RefCell<SimRng>,
    /// Faults per 10 000 operations; 0 for histories without I/O errors.
    rate_per_10k: u64,
    armed: Cell<bool>,
    faults: Cell<u64>,
}

impl FaultyStorage {
    fn fault(&self) -> bool {
        let fault = self.armed.get()
            && self.rate_per_10k > 0
            && self.rng.borrow_mut().chance(self.rate_per_10k, 10_000);
        if fault {
            self.faults.set(self.faults.get() + 1);
        }
        fault
    }
}

impl FaultyStorage {
    /// A deferred sync that, on a fault, fails when captured (one time in four) or, having made
    /// nothing durable, when it runs.
    fn deferred(
        &mut self,
        operation: &str,
        path: &Path,
        capture: fn(&mut MemoryStorage, &Path) -> io::Result<SyncFn>,
    ) -> io::Result<SyncFn> {
        if !self.fault() {
            return capture(&mut self.inner, path);
        }
        let error = injected(operation, path);
        if self.rng.borrow_mut().chance(1, 4) {
            return Err(error);
        }
        Ok(Box::new(move || Err(error)))
    }
}

fn injected(operation: &str, path: &Path) -> io::Error {
    io::Error::other(format!(
        "{operation} {}: injected I/O error",
        path.display()
    ))
}

impl LogStorage for FaultyStorage {
    fn create_dir_all(&mut self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list(dir)
    }
    fn create(&mut self, path: &Path) -> io::Result<()> {
        self.inner.create(path)
    }
    fn len(&self, path: &Path) -> io::Result<u64> {
        self.inner.len(path)
    }
    fn append(&mut self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        if self.fault() {
            let written = self.rng.borrow_mut().below(bytes.len() as u64 + 1) as usize;
            self.inner.append(path, &bytes[..written])?;
            return Err(injected("append to", path));
        }
        self.inner.append(path, bytes)
    }
    fn read_at(&self, path: &Path, position: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(path, position, buf)
    }
    fn sync(&mut self, path: &Path) -> io::Result<()> {
        if self.fault() {
            return Err(injected("sync", path));
        }
        self.inner.sync(path)
    }
    fn sync_dir(&mut self, dir: &Path) -> io::Result<()> {
        if self.fault() {
            return Err(injected("sync directory", dir));
        }
        self.inner.sync_dir(dir)
    }
    fn sync_later(&mut self, path: &Path) -> io::Result<SyncFn> {
        self.deferred("sync", path, MemoryStorage::sync_later)
    }
    fn sync_dir_later(&mut self, dir: &Path) -> io::Result<SyncFn> {
        self.deferred("sync directory", dir, MemoryStorage::sync_dir_later)
    }
    fn truncate(&mut self, path: &Path, len: u64) -> io::Result<()> {
        if self.fault() {
            return Err(injected("truncate", path));
        }
        self.inner.truncate(path, len)
    }
    fn remove(&mut self, path: &Path) -> io::Result<()> {
        self.inner.remove(path)
    }
}

type Log = PartitionLog<FaultyStorage>;

fn check_log(log: &Log, model: &Model, step: usize) -> Result<(), String> {
    if log.start_offset() != model.start_offset {
        return Err(format!(
            "step {step}: start offset {} but the model has {}",
            log.start_offset(),
            model.start_offset
        ));
    }
    let mut next = log.start_offset();
    // Bounded by the entries the model holds (each batch returns at least one).
    for _ in 0..=model.entries.len() {
        let batch = log
            .read(next, 2048, 64)
            .map_err(|e| format!("step {step}: read at {next}: {e}"))?;
        if batch.is_empty() {
            break;
        }
        for entry in batch {
            let Some((timestamp_ms, record)) = model.entries.get(entry.offset as usize) else {
                return Err(format!(
                    "step {step}: offset {} beyond the {} appended",
                    entry.offset,
                    model.entries.len()
                ));
            };
            if entry.offset != next
                || entry.timestamp_ms != *timestamp_ms
                || entry.record.as_ref() != record.as_slice()
            {
                return Err(format!(
                    "step {step}: entry {} differs from what was appended at {next}",
                    entry.offset
                ));
            }
            next += 1;
        }
    }
    if next != log.next_offset() {
        return Err(format!(
            "step {step}: read up to {next} but next offset is {}",
            log.next_offset()
        ));
    }
    Ok(())
}

/// What the histories exercised, so that a change that makes crashes harmless by accident (or
/// never reaches recovery) fails the test instead of passing it vacuously.
#[derive(Default)]
struct Coverage {
    crashes: u64,
    truncations: u64,
    indexes_rebuilt: u64,
    synced_entries_checked: u64,
    io_errors: u64,
    failed_logs_reopened: u64,
    /// Sync jobs finished successfully with entries appended between their begin and finish.
    jobs_overtaken: u64,
    /// Sync jobs finished successfully.
    jobs_finished: u64,
    /// Crashes or reopens while a sync job was out (begun or run, not finished).
    jobs_abandoned: u64,
}

/// A group-commit sync job of the history, between `begin_sync` and `finish_sync`.
enum Job {
    Begun(SyncJob),
    Ran(SyncDone),
}

/// Reopens after a clean stop or a crash and checks the recovered log against the model: at
/// least what was synced (after a crash) or everything certainly written (after a clean stop),
/// at most that plus the uncertain entries, all equal to what was appended.
fn reopen(
    log: Log,
    model: &mut Model,
    config: &LogConfig,
    crash_seed: Option<u64>,
    step: usize,
    coverage: &mut Coverage,
) -> Result<Log, String> {
    let storage = log.into_storage();
    storage.armed.set(false);
    if let Some(seed) = crash_seed {
        storage.inner.crash(seed);
        coverage.crashes += 1;
        coverage.synced_entries_checked += model.durable_offset.saturating_sub(model.start_offset);
    }
    let (log, report) = PartitionLog::open(storage, DIR, config.clone())
        .map_err(|e| format!("step {step}: reopen (crash: {}): {e}", crash_seed.is_some()))?;
    // What open leaves, the offline verifier finds clean, with the same offsets.
    let verified = ferrymq_storage::verify_partition(log.storage(), Path::new(DIR))
        .map_err(|e| format!("step {step}: verify after reopen: {e}"))?;
    if !verified.is_clean()
        || verified.next_offset != log.next_offset()
        || verified.start_offset != log.start_offset()
        || verified.entries_count != log.next_offset() - log.start_offset()
    {
        return Err(format!(
            "step {step}: verify after reopen disagrees with the log ({}..{}): {verified:#?}",
            log.start_offset(),
            log.next_offset()
        ));
    }
    log.storage().armed.set(true);
    coverage.truncations += u64::from(report.truncation.is_some());
    coverage.indexes_rebuilt += report.indexes_rebuilt.len() as u64;
    let next = log.next_offset();
    let certain = model.entries.len() as u64;
    let floor = if crash_seed.is_some() {
        model.durable_offset
    } else {
        certain
    };
    if next < floor {
        return Err(format!(
            "step {step}: reopen lost entries: next offset {next}, but {floor} must survive (crash: {})",
            crash_seed.is_some()
        ));
    }
    let ceiling = certain + model.uncertain.len() as u64;
    if next > ceiling {
        return Err(format!(
            "step {step}: log grew: next offset {next}, at most {ceiling} were written"
        ));
    }
    if next >= certain {
        let extra = (next - certain) as usize;
        model.entries.extend(model.uncertain.drain(..extra));
    } else {
        model.entries.truncate(next as usize);
    }
    model.uncertain.clear();
    if crash_seed.is_some() {
        model.durable_offset = next;
    }
    check_log(&log, model, step)?;
    Ok(log)
}

fn run(seed: u64, coverage: &mut Coverage) -> Result<(), String> {
    let mut rng = SimRng::new(seed);
    let config = LogConfig {
        segment_bytes_max: 64 + rng.below(2048),
        segment_age_ms_max: 50 + rng.below(5000),
        index_interval_bytes: 1 + rng.below(512) as u32,
    };
    // Half the histories have no I/O errors, so that crashes alone are explored deeply.
    let rate_per_10k = if rng.chance(1, 2) {
        0
    } else {
        1 + rng.below(300)
    };
    let storage = FaultyStorage {
        inner: MemoryStorage::new(),
        rng: RefCell::new(SimRng::new(rng.next_u64())),
        rate_per_10k,
        armed: Cell::new(false),
        faults: Cell::new(0),
    };
    let mut log = PartitionLog::open(storage, DIR, config.clone())
        .map_err(|e| format!("open: {e}"))?
        .0;
    log.storage().armed.set(true);
    let mut model = Model {
        entries: Vec::new(),
        start_offset: 0,
        durable_offset: 0,
        uncertain: Vec::new(),
    };
    let mut clock_ms = rng.below(1000);
    let mut job: Option<Job> = None;

    let trace = std::env::var_os("FERRYMQ_SIM_TRACE").is_some();
    for step in 0..STEPS_PER_HISTORY {
        let mut choice = rng.below(100);
        if log.failed_reason().is_some() {
            // A stopped log is reopened by its owner: cleanly or, sometimes, by a crash.
            coverage.failed_logs_reopened += 1;
            choice = if rng.chance(1, 2) { 80 } else { 90 };
        } else if job.is_some() && choice >= 78 && rng.chance(3, 4) {
            // Most jobs get to finish rather than meet a crash first.
            choice = 60;
        }
        if trace {
            eprintln!(
                "step {step}: choice {choice}, next {} durable {} uncertain {} segments {} failed {:?} files {:?}",
                log.next_offset(),
                model.durable_offset,
                model.uncertain.len(),
                log.segments_count(),
                log.failed_reason(),
                log.storage().inner.paths()
            );
            match &job {
                Some(Job::Begun(begun)) => eprintln!("  sync job begun, covers {}", begun.covers()),
                Some(Job::Ran(done)) => eprintln!(
                    "  sync job ran, covers {}, ok {}",
                    done.covers(),
                    done.is_ok()
                ),
                None => {}
            }
        }
        if choice >= 78 && job.take().is_some() {
            // The log goes away under the job: it claims nothing.
            coverage.jobs_abandoned += 1;
        }
        match choice {
            0..=49 => {
                let count = 1 + rng.below(6) as usize;
                let mut batch = Vec::with_capacity(count);
                for _ in 0..count {
                    clock_ms += rng.below(40);
                    let len_max = if rng.chance(1, 20) { 3000 } else { 120 };
                    let len = rng.below(len_max) as usize;
                    let record: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
                    batch.push((clock_ms, record));
                }
                let entries: Vec<(u64, &[u8])> =
                    batch.iter().map(|(t, r)| (*t, r.as_slice())).collect();
                let first = model.entries.len() as u64;
                match log.append(&entries) {
                    Ok(range) => {
                        if range != (first..first + count as u64) {
                            return Err(format!(
                                "step {step}: append returned {range:?}, expected {first}..{}",
                                first + count as u64
                            ));
                        }
                        model.entries.extend(batch);
                    }
                    Err(error) => {
                        coverage.io_errors += 1;
                        // What reached the log before the error stays; the rest is gone if the
                        // log undid it, or uncertain if it stopped.
                        let kept = log.next_offset().checked_sub(first).ok_or_else(|| {
                            format!("step {step}: append error moved next offset back: {error}")
                        })? as usize;
                        if kept > count {
                            return Err(format!(
                                "step {step}: append error kept {kept} of {count}"
                            ));
                        }
                        let mut batch = batch;
                        let rest = batch.split_off(kept);
                        model.entries.extend(batch);
                        if log.failed_reason().is_some() {
                            model.uncertain = rest;
                        }
                    }
                }
            }
            50..=55 => match log.sync() {
                Ok(()) => model.durable_offset = model.entries.len() as u64,
                Err(_) => {
                    coverage.io_errors += 1;
                    if log.failed_reason().is_none() {
                        return Err(format!("step {step}: a failed sync must stop the log"));
                    }
                }
            },
            // Group commit, one stage per step so that appends, rolls, retention, other syncs
            // and crashes land between begin, run and finish.
            56..=66 => match job.take() {
                None => match log.begin_sync() {
                    Ok(begun) => {
                        if begun.covers() != model.entries.len() as u64 {
                            return Err(format!(
                                "step {step}: a job begun at {} covers {}",
                                model.entries.len(),
                                begun.covers()
                            ));
                        }
                        job = Some(Job::Begun(begun));
                    }
                    Err(_) => {
                        coverage.io_errors += 1;
                        if log.failed_reason().is_none() {
                            return Err(format!("step {step}: a failed begin must stop the log"));
                        }
                    }
                },
                Some(Job::Begun(begun)) => job = Some(Job::Ran(begun.run())),
                Some(Job::Ran(done)) => {
                    let covers = done.covers();
                    match log.finish_sync(done) {
                        Ok(durable) => {
                            if durable != covers || log.durable_offset() < covers {
                                return Err(format!(
                                    "step {step}: finished job covering {covers} returned {durable}, durable offset {}",
                                    log.durable_offset()
                                ));
                            }
                            coverage.jobs_finished += 1;
                            coverage.jobs_overtaken += u64::from(log.next_offset() > covers);
                            model.durable_offset = model.durable_offset.max(covers);
                        }
                        Err(_) => {
                            coverage.io_errors += 1;
                            if log.failed_reason().is_none() {
                                return Err(format!(
                                    "step {step}: a failed sync job must stop the log"
                                ));
                            }
                        }
                    }
                }
            },
            67..=74 => {
                if log.next_offset() > log.start_offset() {
                    let from =
                        log.start_offset() + rng.below(log.next_offset() - log.start_offset());
                    let got = log
                        .read(from, rng.below(4096) as usize, 1 + rng.below(20) as usize)
                        .map_err(|e| format!("step {step}: read at {from}: {e}"))?;
                    if got.is_empty() || got[0].offset != from {
                        return Err(format!("step {step}: read at {from} returned {got:?}"));
                    }
                    for entry in got {
                        let (t, r) = &model.entries[entry.offset as usize];
                        if entry.timestamp_ms != *t || entry.record.as_ref() != r.as_slice() {
                            return Err(format!("step {step}: entry {} differs", entry.offset));
                        }
                    }
                }
                // Timestamps never go back in these histories, so the answer is the first entry
                // at or after the time.
                let target = rng.below(clock_ms + 100);
                let expected = (model.start_offset..model.entries.len() as u64)
                    .find(|&o| model.entries[o as usize].0 >= target)
                    .unwrap_or(model.entries.len() as u64);
                let found = log
                    .offset_for_time(target)
                    .map_err(|e| format!("step {step}: offset_for_time({target}): {e}"))?;
                if found != expected {
                    return Err(format!(
                        "step {step}: offset_for_time({target}) = {found}, expected {expected}"
                    ));
                }
            }
            75..=77 => {
                let below = model.start_offset
                    + rng.below(model.entries.len() as u64 - model.start_offset + 1);
                if log.delete_segments_below(below).is_err() {
                    coverage.io_errors += 1;
                }
                let start = log.start_offset();
                if start < model.start_offset || start > below.max(model.start_offset) {
                    return Err(format!(
                        "step {step}: retention below {below} moved start to {start}"
                    ));
                }
                model.start_offset = start;
            }
            78..=84 => {
                log = reopen(log, &mut model, &config, None, step, coverage)?;
            }
            _ => {
                let crash_seed = rng.next_u64();
                log = reopen(log, &mut model, &config, Some(crash_seed), step, coverage)?;
            }
        }
    }
    let log = reopen(log, &mut model, &config, None, STEPS_PER_HISTORY, coverage)?;
    // Nothing the log does leaves files that are not its own.
    for path in log.storage().inner.paths() {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !(name.ends_with(".log") || name.ends_with(".index") || name.ends_with(".timeindex")) {
            return Err(format!("stray file {}", path.display()));
        }
    }
    Ok(())
}

fn run_reporting(seed: u64, coverage: &mut Coverage) {
    let outcome = catch_unwind(AssertUnwindSafe(|| run(seed, coverage)));
    let replay = format!(
        "replay: FERRYMQ_SIM_SEED={seed} FERRYMQ_SIM_TRACE=1 cargo test -p ferrymq-storage --test simulation"
    );
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(message)) => panic!("simulation failed with seed {seed}: {message}\n{replay}"),
        Err(_) => panic!("simulation panicked with seed {seed} (see above)\n{replay}"),
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Runs the `part`-th of two halves of the histories, so the two tests use both cores.
fn run_half(part: u64) {
    let mut coverage = Coverage::default();
    if let Some(seed) = env_u64("FERRYMQ_SIM_SEED") {
        if part == 0 {
            run_reporting(seed, &mut coverage);
        }
        return;
    }
    let histories = env_u64("FERRYMQ_SIM_HISTORIES").unwrap_or(HISTORIES_DEFAULT);
    // A fixed base keeps CI reproducible; FERRYMQ_SIM_BASE explores other histories.
    let base = env_u64("FERRYMQ_SIM_BASE").unwrap_or(0);
    let half = histories / 2;
    let (first, count) = if part == 0 {
        (0, half)
    } else {
        (half, histories - half)
    };
    eprintln!(
        "simulation: {count} histories from seed {}",
        base.wrapping_add(first)
    );
    for i in first..first + count {
        run_reporting(base.wrapping_add(i), &mut coverage);
    }
    eprintln!(
        "simulation: {} crashes, {} torn tails truncated, {} indexes rebuilt, {} synced entries checked, {} I/O errors, {} stopped logs reopened, {} sync jobs finished ({} overtaken by appends, {} abandoned)",
        coverage.crashes,
        coverage.truncations,
        coverage.indexes_rebuilt,
        coverage.synced_entries_checked,
        coverage.io_errors,
        coverage.failed_logs_reopened,
        coverage.jobs_finished,
        coverage.jobs_overtaken,
        coverage.jobs_abandoned
    );
    if count >= 100 {
        assert!(coverage.crashes > count / 2, "too few crashes");
        assert!(coverage.truncations > 0, "no torn tail was ever truncated");
        assert!(coverage.indexes_rebuilt > 0, "no index was ever rebuilt");
        assert!(
            coverage.synced_entries_checked > 0,
            "no synced entry was checked"
        );
        assert!(
            coverage.jobs_overtaken > 0 && coverage.jobs_abandoned > 0,
            "sync jobs were never overtaken by appends or abandoned"
        );
    }
}

#[test]
fn random_histories_of_appends_syncs_and_crashes_first_half() {
    run_half(0);
}

#[test]
fn random_histories_of_appends_syncs_and_crashes_second_half() {
    run_half(1);
}

/// One history of the corruption test: a synced log, one flipped bit somewhere in its files (log
/// or index), then reopen and read. The log may refuse to open, cut a suffix it takes for a torn
/// tail (and say so), or fail a read; it must never serve bytes that were not appended.
fn run_bit_flip(seed: u64, outcomes: &mut [u64; 4]) -> Result<(), String> {
    let mut rng = SimRng::new(seed);
    let config = LogConfig {
        segment_bytes_max: 64 + rng.below(2048),
        segment_age_ms_max: 1_000_000,
        index_interval_bytes: 1 + rng.below(256) as u32,
    };
    let mut log = PartitionLog::open(MemoryStorage::new(), DIR, config.clone())
        .map_err(|e| format!("open: {e}"))?
        .0;
    let mut entries: Vec<(u64, Vec<u8>)> = Vec::new();
    for i in 0..(1 + rng.below(200)) {
        let len = rng.below(100) as usize;
        let record: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        log.append(&[(i, &record)])
            .map_err(|e| format!("append: {e}"))?;
        entries.push((i, record));
    }
    log.sync().map_err(|e| format!("sync: {e}"))?;
    let storage = log.into_storage();
    let paths = storage.paths();
    let path = &paths[rng.below(paths.len() as u64) as usize];
    let len = storage.len(path).map_err(|e| e.to_string())?;
    if len == 0 {
        return Ok(());
    }
    let position = rng.below(len);
    outcomes[0] += 1;
    storage
        .flip_bit(path, position, rng.below(8) as u8)
        .map_err(|e| e.to_string())?;
    // The offline verifier checks every byte, so it finds every flip, in the flipped file.
    let verified = ferrymq_storage::verify_partition(&storage, Path::new(DIR))
        .map_err(|e| format!("verify: {e}"))?;
    if !verified.findings.iter().any(|f| &f.file == path) {
        return Err(format!(
            "verify missed a flipped bit at {position} of {}: {:#?}",
            path.display(),
            verified.findings
        ));
    }
    let unrepairable = verified.findings.iter().any(|f| !f.kind.repaired_on_open());

    let log = match PartitionLog::open(storage, DIR, config) {
        Ok((log, report)) => {
            outcomes[2] += u64::from(report.truncation.is_some());
            log
        }
        // Refusing to open is allowed; it must name the damage, which the error type does.
        Err(ferrymq_storage::LogError::Corrupt { .. }) => {
            if !unrepairable {
                return Err(format!(
                    "open refused a log whose findings verify says open repairs: {:#?}",
                    verified.findings
                ));
            }
            outcomes[1] += 1;
            return Ok(());
        }
        Err(other) => return Err(format!("open failed with an unexpected error: {other}")),
    };
    if log.next_offset() > entries.len() as u64 {
        return Err(format!("log grew to {} entries", log.next_offset()));
    }
    for offset in log.start_offset()..log.next_offset() {
        match log.read(offset, 1 << 20, 1) {
            Ok(got) => {
                let (timestamp_ms, record) = &entries[offset as usize];
                if got.len() != 1
                    || got[0].offset != offset
                    || got[0].timestamp_ms != *timestamp_ms
                    || got[0].record.as_ref() != record.as_slice()
                {
                    return Err(format!(
                        "served damaged data at offset {offset} after flipping a bit at {position} of {}",
                        path.display()
                    ));
                }
            }
            Err(ferrymq_storage::LogError::Corrupt { .. }) => outcomes[3] += 1,
            Err(other) => return Err(format!("read {offset}: unexpected error {other}")),
        }
    }
    Ok(())
}

#[test]
fn a_flipped_bit_is_never_served() {
    let seeds: Vec<u64> = match env_u64("FERRYMQ_SIM_SEED") {
        Some(seed) => vec![seed],
        None => {
            let base = env_u64("FERRYMQ_SIM_BASE").unwrap_or(0);
            let count = env_u64("FERRYMQ_SIM_HISTORIES").map_or(400, |n| n / 5);
            (base..base + count).collect()
        }
    };
    // Flips made, opens refused, tails cut, reads refused.
    let mut outcomes = [0u64; 4];
    let replaying = seeds.len() == 1;
    for seed in seeds {
        let outcome = catch_unwind(AssertUnwindSafe(|| run_bit_flip(seed, &mut outcomes)));
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(message)) => panic!(
                "bit-flip history failed with seed {seed}: {message}\nreplay: FERRYMQ_SIM_SEED={seed} cargo test -p ferrymq-storage --test simulation a_flipped_bit"
            ),
            Err(_) => panic!(
                "bit-flip history panicked with seed {seed}\nreplay: FERRYMQ_SIM_SEED={seed} cargo test -p ferrymq-storage --test simulation a_flipped_bit"
            ),
        }
    }
    eprintln!(
        "bit flips: {} made, {} opens refused, {} tails cut, {} reads refused",
        outcomes[0], outcomes[1], outcomes[2], outcomes[3]
    );
    if !replaying {
        assert!(
            outcomes[1] > 0 && outcomes[2] > 0 && outcomes[3] > 0,
            "{outcomes:?}"
        );
    }
}
