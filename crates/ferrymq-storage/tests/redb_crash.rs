//! redb over `SimBlockFile`: seeded rounds of write transactions (most with
//! `Durability::Immediate`, some with `Durability::None`), power losses at random points (between
//! commits, in the middle of a commit, while the database opens or closes), and reopen.
//!
//! Property, after every crash: the database opens, and its table holds exactly the state of
//! some commit at or after the last `Immediate` commit that returned `Ok` (so every key/value
//! that commit made is there, with its value, unless a later commit changed it).
//!
//! A failure prints its seed; `FERRYMQ_SIM_SEED=<seed>` replays that round. Like the log
//! simulation, `FERRYMQ_SIM_HISTORIES=<n>` (n / 25 rounds) and `FERRYMQ_SIM_BASE` explore more.

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use ferrymq_storage::{SimBlockFile, SimRng};
use redb::{
    Builder, Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, TableError,
};

const TABLE: TableDefinition<u64, u64> = TableDefinition::new("acks");
const ROUNDS_DEFAULT: u64 = 50;
const LIVES_PER_ROUND: usize = 4;
const KEYS: u64 = 24;

type State = BTreeMap<u64, u64>;

/// A database over a live handle to `file`. The cache is small so that a large transaction
/// writes pages to the file before it commits.
fn open(file: &SimBlockFile) -> Result<Database, redb::DatabaseError> {
    Builder::new()
        .set_cache_size(64 * 1024)
        .create_with_backend(file.clone())
}

fn read_state(db: &Database) -> Result<State, String> {
    let txn = db.begin_read().map_err(|e| format!("begin read: {e}"))?;
    let table = match txn.open_table(TABLE) {
        Ok(table) => table,
        Err(TableError::TableDoesNotExist(_)) => return Ok(State::new()),
        Err(e) => return Err(format!("open table: {e}")),
    };
    let mut state = State::new();
    for item in table.iter().map_err(|e| format!("iter: {e}"))? {
        let (key, value) = item.map_err(|e| format!("read entry: {e}"))?;
        state.insert(key.value(), value.value());
    }
    Ok(state)
}

/// One write transaction: a few inserts and removals. Returns the state it commits.
fn write(
    db: &Database,
    state: &State,
    durability: Durability,
    rng: &mut SimRng,
) -> (State, Result<(), String>) {
    let mut next = state.clone();
    let changes: Vec<(u64, Option<u64>)> = (0..1 + rng.below(8))
        .map(|_| {
            let key = rng.below(KEYS);
            let value = if rng.chance(1, 5) {
                None
            } else {
                Some(rng.next_u64())
            };
            (key, value)
        })
        .collect();
    for (key, value) in &changes {
        match value {
            Some(value) => next.insert(*key, *value),
            None => next.remove(key),
        };
    }
    let result = (|| {
        let mut txn = db.begin_write().map_err(|e| format!("begin write: {e}"))?;
        txn.set_durability(durability)
            .map_err(|e| format!("set durability: {e}"))?;
        {
            let mut table = txn
                .open_table(TABLE)
                .map_err(|e| format!("open table: {e}"))?;
            for (key, value) in &changes {
                match value {
                    Some(value) => {
                        table
                            .insert(key, value)
                            .map_err(|e| format!("insert: {e}"))?;
                    }
                    None => {
                        table.remove(key).map_err(|e| format!("remove: {e}"))?;
                    }
                }
            }
        }
        txn.commit().map_err(|e| format!("commit: {e}"))
    })();
    (next, result)
}

#[derive(Default)]
struct Coverage {
    crashes_between_commits: u64,
    crashes_in_operations: u64,
    immediate_commits: u64,
    none_commits_seen_after_crash: u64,
}

fn round(seed: u64, coverage: &mut Coverage) -> Result<(), String> {
    let mut rng = SimRng::new(seed);
    let file = SimBlockFile::new();
    // States a crash may leave: the last Immediate commit that returned Ok, then every later
    // commit attempted (a None commit, or one a crash interrupted).
    let mut candidates: Vec<State> = vec![State::new()];
    // What the next transaction starts from: what the database held when it was opened, and
    // then each commit.
    let mut state: State;
    for life in 0..=LIVES_PER_ROUND {
        let crashes_before = file.crashes_count();
        let db = match open(&file) {
            Ok(db) => db,
            // Only a power loss while opening (armed in the previous life) excuses a failure;
            // then the next open must succeed.
            Err(e) if file.crashes_count() > crashes_before => {
                coverage.crashes_in_operations += 1;
                open(&file).map_err(|e2| {
                    format!("life {life}: open after a crash during open ({e}): {e2}")
                })?
            }
            Err(e) => return Err(format!("life {life}: open: {e}")),
        };
        let found = read_state(&db).map_err(|e| format!("life {life}: {e}"))?;
        let Some(index) = candidates.iter().position(|c| *c == found) else {
            return Err(format!(
                "life {life}: the database holds a state no commit left: {found:?}\nlast durable: {:?}",
                candidates[0]
            ));
        };
        coverage.none_commits_seen_after_crash += u64::from(index > 0);
        state = found;
        if life == LIVES_PER_ROUND {
            break;
        }

        let crashes_before = file.crashes_count();
        if rng.chance(1, 2) {
            file.crash_after_operations(rng.below(40), rng.next_u64());
        }
        for _ in 0..1 + rng.below(6) {
            let durability = if rng.chance(1, 4) {
                Durability::None
            } else {
                Durability::Immediate
            };
            let immediate = matches!(durability, Durability::Immediate);
            let (next, result) = write(&db, &state, durability, &mut rng);
            match result {
                Ok(()) if immediate => {
                    coverage.immediate_commits += 1;
                    candidates = vec![next.clone()];
                }
                Ok(()) => candidates.push(next.clone()),
                Err(e) if file.crashes_count() > crashes_before => {
                    // The power went out during this transaction: it may or may not have landed.
                    let _ = e;
                    coverage.crashes_in_operations += 1;
                    candidates.push(next);
                    break;
                }
                Err(e) => return Err(format!("life {life}: a write failed without a crash: {e}")),
            }
            state = next;
        }
        if file.crashes_count() == crashes_before && rng.chance(3, 4) {
            // Power loss between commits, with the database open.
            file.crash(rng.next_u64());
            coverage.crashes_between_commits += 1;
        }
        // After a crash the database's handle is dead and closing it writes nothing; otherwise
        // this is a clean close (during which an armed crash may still strike).
        drop(db);
    }
    Ok(())
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Runs the `part`-th of two halves of the rounds, so that the two tests use both cores.
fn run_half(part: u64) {
    let seeds: Vec<u64> = match env_u64("FERRYMQ_SIM_SEED") {
        Some(seed) if part == 0 => vec![seed],
        Some(_) => Vec::new(),
        None => {
            let rounds = env_u64("FERRYMQ_SIM_HISTORIES").map_or(ROUNDS_DEFAULT, |n| n / 25);
            let base = env_u64("FERRYMQ_SIM_BASE").unwrap_or(0);
            (0..rounds)
                .filter(|i| i % 2 == part)
                .map(|i| base.wrapping_add(i))
                .collect()
        }
    };
    let count = seeds.len() as u64;
    let mut coverage = Coverage::default();
    for seed in seeds {
        let outcome = catch_unwind(AssertUnwindSafe(|| round(seed, &mut coverage)));
        let replay = format!(
            "replay: FERRYMQ_SIM_SEED={seed} cargo test -p ferrymq-storage --test redb_crash"
        );
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(message)) => panic!("redb round failed with seed {seed}: {message}\n{replay}"),
            Err(_) => panic!("redb round panicked with seed {seed} (see above)\n{replay}"),
        }
    }
    eprintln!(
        "redb: {count} rounds, {} immediate commits, {} crashes between commits, {} in operations, {} non-durable states seen after reopen",
        coverage.immediate_commits,
        coverage.crashes_between_commits,
        coverage.crashes_in_operations,
        coverage.none_commits_seen_after_crash
    );
    if count >= 20 {
        assert!(
            coverage.crashes_between_commits > 0 && coverage.crashes_in_operations > 0,
            "crashes were not spread over commits and operations"
        );
        assert!(coverage.immediate_commits > 0, "no commit was checked");
    }
}

#[test]
fn immediate_commits_survive_power_loss_at_any_point_first_half() {
    run_half(0);
}

#[test]
fn immediate_commits_survive_power_loss_at_any_point_second_half() {
    run_half(1);
}

#[test]
fn an_uncommitted_transaction_is_not_visible_after_a_crash() {
    for seed in 0..10 {
        let file = SimBlockFile::new();
        let db = open(&file).unwrap();
        let mut txn = db.begin_write().unwrap();
        txn.set_durability(Durability::Immediate).unwrap();
        txn.open_table(TABLE).unwrap().insert(1, 10).unwrap();
        txn.commit().unwrap();

        // Half the time the power goes out at the transaction's first write to the file (a page
        // spilled from the cache), half the time after all its inserts.
        let at_first_spill = seed % 2 == 0;
        if at_first_spill {
            file.crash_after_operations(0, seed);
        }
        let txn = db.begin_write().unwrap();
        {
            let mut table = txn.open_table(TABLE).unwrap();
            table.insert(1, 11).unwrap();
            let mut spilled = false;
            for key in 0..3000u64 {
                if table.insert(key + 2, key).is_err() {
                    spilled = true;
                    break;
                }
            }
            assert_eq!(spilled, at_first_spill, "seed {seed}");
        }
        if !at_first_spill {
            file.crash(seed);
        }
        drop(txn);
        drop(db);

        let db = open(&file).unwrap_or_else(|e| panic!("seed {seed}: reopen: {e}"));
        let state = read_state(&db).unwrap();
        assert_eq!(state, State::from([(1, 10)]), "seed {seed}");
    }
}
