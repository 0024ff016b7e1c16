//! The broker's metadata and subscription state in redb, an embedded transactional store:
//! disk topics with their settings, their named subscriptions, and each subscription's cursor
//! per partition (its floor and the settled runs above it).
//!
//! Cursor changes (acks, given-up messages, auto-ack deliveries) are not committed one by one:
//! they mark the cursor dirty, and the state writer thread (`state_writer`) commits every dirty cursor in one
//! transaction, so thousands of acks share one fsync (group commit, as for publishes). An ack
//! that asks for confirmation is answered after the transaction that holds it committed.
//!
//! A failed redb commit (a full disk) leaves the open database refusing every later transaction
//! ("Previous I/O error occurred"). So the store is reopened after a failure: the broken
//! [`Database`] is dropped and the file opened again, which recovers it from its last committed
//! state. Until that succeeds, [`MetaStore::fault`] says why, every write gets the error, and the
//! state writer retries the reopen every [`REOPEN_INTERVAL`], with or without traffic.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use ferrymq_protocol::{FsyncPolicy, OverflowPolicy, RetentionPolicy, Storage, TopicConfig};
use parking_lot::{Mutex, RwLock};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::cursor::DeliveryState;
use crate::error::BrokerError;

const TOPICS: TableDefinition<&str, &[u8]> = TableDefinition::new("topics");
const SUBSCRIPTIONS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("subscriptions");
const CURSORS: TableDefinition<(&str, &str, u32), &[u8]> = TableDefinition::new("cursors");
/// Dead letters already requeued, per (dead-letter topic, partition): the offset runs, see
/// [`encode_runs`].
const REQUEUED: TableDefinition<(&str, u32), &[u8]> = TableDefinition::new("requeued");
/// Where each requeued dead letter went, per (dead-letter topic, partition, offset): the copy's
/// partition (u32 LE) and offset (u64 LE) in the source topic. Rows below the partition's first
/// offset are removed as the partition lets its messages go.
const REQUEUE_COPIES: TableDefinition<(&str, u32, u64), &[u8]> =
    TableDefinition::new("requeue_copies");
/// Per (topic, partition): one past the last message with a priority above 0, as of the last
/// clean shutdown. Taken out at start, so that after a crash it is unknown rather than stale.
const PRIORITY_ENDS: TableDefinition<(&str, u32), u64> = TableDefinition::new("priority_ends");
/// Per (topic, partition): where the log ended when a clean shutdown had synced it. Taken out at
/// start like [`PRIORITY_ENDS`]: a log that still ends there needs no sync before it is served.
const SYNCED_ENDS: TableDefinition<(&str, u32), u64> = TableDefinition::new("synced_ends");
/// Per (topic, subscription, partition): the acked and dead-lettered messages the cursor
/// remembered at the last clean shutdown (`Cursor::encode_history`).
const HISTORIES: TableDefinition<(&str, &str, u32), &[u8]> = TableDefinition::new("histories");
/// Per (topic, subscription, partition): the delivery states a restart must keep (attempts made,
/// a nack's due time), see [`encode_delivery`]. No row when there are none.
const DELIVERY: TableDefinition<(&str, &str, u32), &[u8]> = TableDefinition::new("delivery");
/// Per user name: the user's record (`auth::UserRecord` as JSON: password hash, roles, grants,
/// token hashes). Never a password or a token in clear.
const USERS: TableDefinition<&str, &[u8]> = TableDefinition::new("users");

fn storage_error(what: &str, error: impl std::fmt::Display) -> BrokerError {
    BrokerError::Storage(format!("metadata store: {what}: {error}"))
}

/// Every row of `table`, in key order, each made into an entry by `entry` (which refuses a row
/// it cannot read).
fn read_rows<K: redb::Key + 'static, V: redb::Value + 'static, T>(
    txn: &redb::ReadTransaction,
    table: TableDefinition<K, V>,
    mut entry: impl for<'a> FnMut(K::SelfType<'a>, V::SelfType<'a>) -> Result<T, BrokerError>,
) -> Result<Vec<T>, BrokerError> {
    let read = |e: redb::Error| storage_error("read", e);
    let mut out = Vec::new();
    for row in txn
        .open_table(table)
        .map_err(|e| read(e.into()))?
        .iter()
        .map_err(|e| read(e.into()))?
    {
        let (k, v) = row.map_err(|e| read(e.into()))?;
        out.push(entry(k.value(), v.value())?);
    }
    Ok(out)
}

/// A disk topic as stored: its settings with defaults already resolved.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TopicRecord {
    pub partitions: u32,
    pub overflow: String,
    pub max_messages: u64,
    pub max_bytes: u64,
    pub fsync: String,
    pub retention_ms: u64,
    /// `stream` or `work_queue`. Absent in topics saved before the setting existed, which
    /// deleted what every subscription settled: they keep doing so.
    #[serde(default)]
    pub retention_policy: Option<String>,
    /// 0 in topics saved before the setting existed: the broker's default.
    #[serde(default)]
    pub dedup_window_ms: u64,
}

impl TopicRecord {
    pub fn of(config: &TopicConfig) -> Self {
        TopicRecord {
            partitions: config.partitions,
            overflow: match config.overflow {
                // A saved config is resolved: `Default` never reaches here.
                OverflowPolicy::DropOldest | OverflowPolicy::Default => "drop_oldest".into(),
                OverflowPolicy::Reject => "reject".into(),
            },
            max_messages: config.max_messages,
            max_bytes: config.max_bytes,
            fsync: config.fsync.to_string(),
            retention_ms: config.retention_ms,
            retention_policy: Some(config.retention_policy.to_string()),
            dedup_window_ms: config.dedup_window_ms,
        }
    }

    pub fn config(&self) -> Result<TopicConfig, String> {
        Ok(TopicConfig {
            partitions: self.partitions,
            storage: Storage::Disk,
            overflow: match self.overflow.as_str() {
                "drop_oldest" => OverflowPolicy::DropOldest,
                "reject" => OverflowPolicy::Reject,
                other => return Err(format!("unknown overflow policy '{other}'")),
            },
            max_messages: self.max_messages,
            max_bytes: self.max_bytes,
            fsync: self.fsync.parse::<FsyncPolicy>()?,
            retention_ms: self.retention_ms,
            retention_policy: match &self.retention_policy {
                Some(policy) => policy.parse::<RetentionPolicy>()?,
                None => RetentionPolicy::WorkQueue,
            },
            dedup_window_ms: self.dedup_window_ms,
            replicas: 0,
        })
    }
}

/// A named subscription as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SubscriptionRecord {
    pub auto_ack: bool,
    pub ack_timeout_ms: u64,
    pub max_attempts: u32,
    #[serde(default)]
    pub ordered: bool,
    /// `None`: `<topic>.dlq`.
    #[serde(default)]
    pub dead_letter_topic: Option<String>,
    /// Where the subscription started in each partition, for status queries (messages below
    /// are not its own). Empty for subscriptions saved before starts were kept.
    #[serde(default)]
    pub start_offsets: Vec<u64>,
    /// Deliveries paused by an operator (absent in records written before pausing existed).
    #[serde(default)]
    pub paused: bool,
}

/// A cursor as stored: `floor` and the settled runs above it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CursorRecord {
    pub floor: u64,
    pub settled: Vec<(u64, u64)>,
}

impl CursorRecord {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + 16 * self.settled.len());
        out.extend_from_slice(&self.floor.to_le_bytes());
        for (start, end) in &self.settled {
            out.extend_from_slice(&start.to_le_bytes());
            out.extend_from_slice(&end.to_le_bytes());
        }
        out
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < 8 || !(bytes.len() - 8).is_multiple_of(16) {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let settled = (8..bytes.len())
            .step_by(16)
            .map(|i| (u64_at(i), u64_at(i + 8)))
            .collect();
        Some(CursorRecord {
            floor: u64_at(0),
            settled,
        })
    }
}

/// A boxed backend as a backend.
#[derive(Debug)]
struct Boxed(Box<dyn redb::StorageBackend>);

impl redb::StorageBackend for Boxed {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.0.write(offset, data)
    }
    fn close(&self) -> Result<(), std::io::Error> {
        self.0.close()
    }
}

/// Everything read back at start.
pub(crate) struct Loaded {
    pub topics: Vec<(String, TopicRecord)>,
    pub subscriptions: Vec<(String, String, SubscriptionRecord)>,
    pub cursors: HashMap<(String, String, u32), CursorRecord>,
    /// See [`PRIORITY_ENDS`].
    pub priority_ends: HashMap<(String, u32), u64>,
    /// See [`SYNCED_ENDS`].
    pub synced_ends: HashMap<(String, u32), u64>,
    /// See [`HISTORIES`].
    pub histories: HashMap<(String, String, u32), Vec<u8>>,
    /// See [`DELIVERY`].
    pub delivery: HashMap<(String, String, u32), Vec<DeliveryState>>,
}

/// Opens the store's database: the file `meta.redb`, or a backend a test gives.
type Opener = Box<dyn Fn() -> Result<Database, BrokerError> + Send + Sync>;

/// Fewest time between two reopens of a failed store: a disk that is still full is not hammered,
/// and the store is back within a second of space coming back.
pub(crate) const REOPEN_INTERVAL: Duration = Duration::from_secs(1);
/// Fewest time between two log lines about the same failure: one line per failure and per
/// recovery, and a reminder while it lasts, rather than one per retried commit.
const FAULT_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// Why the store refuses writes, and since when.
#[derive(Debug, Clone)]
pub(crate) struct MetaFault {
    pub reason: String,
    pub since: Instant,
    last_reopen: Option<Instant>,
    last_logged: Instant,
    reopen_attempts: u64,
}

pub(crate) struct MetaStore {
    /// `None` between dropping a broken database and opening it again (when that failed).
    db: RwLock<Option<Database>>,
    open_db: Opener,
    fault: Mutex<Option<MetaFault>>,
    /// What the store is, for messages: the file's path, or "backend".
    name: String,
}

impl MetaStore {
    pub fn open(path: &Path) -> Result<MetaStore, BrokerError> {
        let path = path.to_path_buf();
        let name = path.display().to_string();
        Self::with_opener(
            name,
            Box::new(move || {
                Database::create(&path)
                    .map_err(|e| storage_error(&format!("open {}", path.display()), e))
            }),
        )
    }

    /// Opens the store over backends from `backend`, called again for every reopen (each call
    /// must give a handle to the same underlying file).
    pub fn open_with_backend(
        backend: impl Fn() -> Option<Box<dyn redb::StorageBackend>> + Send + Sync + 'static,
    ) -> Result<MetaStore, BrokerError> {
        Self::with_opener(
            "backend".to_string(),
            Box::new(move || {
                let backend = backend()
                    .ok_or_else(|| storage_error("open", "the storage gave no backend"))?;
                redb::Builder::new()
                    .create_with_backend(Boxed(backend))
                    .map_err(|e| storage_error("open", e))
            }),
        )
    }

    fn with_opener(name: String, open_db: Opener) -> Result<MetaStore, BrokerError> {
        let db = open_db()?;
        let store = MetaStore {
            db: RwLock::new(Some(db)),
            open_db,
            fault: Mutex::new(None),
            name,
        };
        // Create the tables so that reads of a new store find them.
        store.write(|_| Ok(()))?;
        Ok(store)
    }

    /// Why the store refuses writes now, if it does.
    pub fn fault(&self) -> Option<MetaFault> {
        self.fault.lock().clone()
    }

    /// Records a failed transaction: from now on the store is reopened before it is used again.
    fn failed(&self, error: &BrokerError) {
        let mut fault = self.fault.lock();
        let now = Instant::now();
        match fault.as_mut() {
            None => {
                tracing::error!(store = %self.name, %error, "the metadata store failed; it refuses acks, topic and subscription changes until it is reopened, which is retried every second (free space in the data dir if it is full)");
                *fault = Some(MetaFault {
                    reason: error.to_string(),
                    since: now,
                    last_reopen: None,
                    last_logged: now,
                    reopen_attempts: 0,
                });
            }
            Some(fault) => {
                fault.reason = error.to_string();
                if now.duration_since(fault.last_logged) >= FAULT_LOG_INTERVAL {
                    fault.last_logged = now;
                    tracing::error!(store = %self.name, %error, failing_for_s = now.duration_since(fault.since).as_secs(), reopen_attempts = fault.reopen_attempts, "the metadata store still fails");
                }
            }
        }
    }

    /// If the store failed, reopens it when a reopen is due: drops the broken database and opens
    /// the file again (redb recovers it from its last commit), then checks it with an empty
    /// commit. `Err` while it still fails.
    pub fn recover(&self) -> Result<(), BrokerError> {
        let fault_error = |f: &MetaFault| {
            BrokerError::Storage(format!(
                "metadata store unavailable since {} s ago: {}; it is reopened every second",
                f.since.elapsed().as_secs(),
                f.reason
            ))
        };
        {
            let mut fault = self.fault.lock();
            let Some(f) = fault.as_mut() else {
                return Ok(());
            };
            if f.last_reopen
                .is_some_and(|at| at.elapsed() < REOPEN_INTERVAL)
            {
                return Err(fault_error(f));
            }
            f.last_reopen = Some(Instant::now());
            f.reopen_attempts += 1;
        }
        let reopened = {
            let mut db = self.db.write();
            // The broken database holds the file's lock: it goes before the file is opened again.
            *db = None;
            match (self.open_db)() {
                Ok(fresh) => {
                    *db = Some(fresh);
                    Ok(())
                }
                Err(error) => Err(error),
            }
        };
        let checked = reopened.and_then(|()| self.transact(|_| Ok(())));
        let mut fault = self.fault.lock();
        match checked {
            Ok(()) => {
                if let Some(f) = fault.take() {
                    tracing::info!(store = %self.name, failed_for_ms = f.since.elapsed().as_millis() as u64, reopen_attempts = f.reopen_attempts, "the metadata store is reopened and commits again");
                }
                Ok(())
            }
            Err(error) => {
                let f = fault.as_mut().expect("only this function clears a fault");
                f.reason = error.to_string();
                let now = Instant::now();
                if now.duration_since(f.last_logged) >= FAULT_LOG_INTERVAL {
                    f.last_logged = now;
                    tracing::error!(store = %self.name, %error, failing_for_s = now.duration_since(f.since).as_secs(), reopen_attempts = f.reopen_attempts, "the metadata store still cannot be reopened");
                }
                Err(fault_error(f))
            }
        }
    }

    /// Runs `f` in one write transaction and commits it durably; a failure marks the store for
    /// a reopen, which the next write (or the state writer) does.
    fn write(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> Result<(), BrokerError> {
        self.recover()?;
        self.transact(f).inspect_err(|error| self.failed(error))
    }

    fn transact(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> Result<(), BrokerError> {
        let guard = self.db.read();
        let db = guard
            .as_ref()
            .ok_or_else(|| storage_error("begin", "the store is not open"))?;
        let txn = db.begin_write().map_err(|e| storage_error("begin", e))?;
        {
            txn.open_table(TOPICS)
                .map_err(|e| storage_error("open table", e))?;
            txn.open_table(SUBSCRIPTIONS)
                .map_err(|e| storage_error("open table", e))?;
            txn.open_table(CURSORS)
                .map_err(|e| storage_error("open table", e))?;
            txn.open_table(REQUEUED)
                .map_err(|e| storage_error("open table", e))?;
            txn.open_table(REQUEUE_COPIES)
                .map_err(|e| storage_error("open table", e))?;
            txn.open_table(PRIORITY_ENDS)
                .map_err(|e| storage_error("open table", e))?;
            txn.open_table(SYNCED_ENDS)
                .map_err(|e| storage_error("open table", e))?;
            txn.open_table(HISTORIES)
                .map_err(|e| storage_error("open table", e))?;
            txn.open_table(DELIVERY)
                .map_err(|e| storage_error("open table", e))?;
            txn.open_table(USERS)
                .map_err(|e| storage_error("open table", e))?;
        }
        f(&txn).map_err(|e| storage_error("write", e))?;
        txn.commit().map_err(|e| storage_error("commit", e))
    }

    /// A read transaction, after a reopen if the store failed.
    fn begin_read(&self) -> Result<redb::ReadTransaction, BrokerError> {
        self.recover()?;
        let guard = self.db.read();
        let db = guard
            .as_ref()
            .ok_or_else(|| storage_error("read", "the store is not open"))?;
        db.begin_read().map_err(|e| storage_error("read", e))
    }

    pub fn load(&self) -> Result<Loaded, BrokerError> {
        let txn = self.begin_read()?;
        let topics = read_rows(&txn, TOPICS, |k, v| {
            let record: TopicRecord = serde_json::from_slice(v)
                .map_err(|e| storage_error(&format!("topic '{k}' has an unreadable record"), e))?;
            Ok((k.to_string(), record))
        })?;
        let subscriptions = read_rows(&txn, SUBSCRIPTIONS, |(topic, name), v| {
            let record: SubscriptionRecord = serde_json::from_slice(v).map_err(|e| {
                storage_error(
                    &format!("subscription '{name}' of '{topic}' has an unreadable record"),
                    e,
                )
            })?;
            Ok((topic.to_string(), name.to_string(), record))
        })?;
        let cursors = read_rows(&txn, CURSORS, |(topic, name, partition), v| {
            let record = CursorRecord::decode(v).ok_or_else(|| {
                storage_error(
                    &format!("cursor of '{name}' on '{topic}' partition {partition}"),
                    "unreadable record",
                )
            })?;
            Ok(((topic.to_string(), name.to_string(), partition), record))
        })?;
        let priority_ends = read_rows(&txn, PRIORITY_ENDS, |(topic, partition), end| {
            Ok(((topic.to_string(), partition), end))
        })?;
        let synced_ends = read_rows(&txn, SYNCED_ENDS, |(topic, partition), end| {
            Ok(((topic.to_string(), partition), end))
        })?;
        let histories = read_rows(&txn, HISTORIES, |(topic, name, partition), v| {
            Ok(((topic.to_string(), name.to_string(), partition), v.to_vec()))
        })?;
        let delivery = read_rows(&txn, DELIVERY, |(topic, name, partition), v| {
            let states = decode_delivery(v).ok_or_else(|| {
                storage_error(
                    &format!("delivery state of '{name}' on '{topic}' partition {partition}"),
                    "unreadable record",
                )
            })?;
            Ok(((topic.to_string(), name.to_string(), partition), states))
        })?;
        Ok(Loaded {
            topics,
            subscriptions,
            cursors: cursors.into_iter().collect(),
            priority_ends: priority_ends.into_iter().collect(),
            synced_ends: synced_ends.into_iter().collect(),
            histories: histories.into_iter().collect(),
            delivery: delivery.into_iter().collect(),
        })
    }

    /// Forgets the saved priority ends and synced ends: from now until the next clean shutdown
    /// they are unknown.
    pub fn clear_shutdown_marks(&self) -> Result<(), BrokerError> {
        self.write(|txn| {
            txn.open_table(PRIORITY_ENDS)?.retain(|_, _| false)?;
            txn.open_table(SYNCED_ENDS)?.retain(|_, _| false)?;
            Ok(())
        })
    }

    /// Saves, at a clean shutdown, every disk partition's priority end and the histories of
    /// its named subscriptions' cursors (replacing the histories saved before).
    pub fn put_shutdown_state(
        &self,
        ends: &[(String, u32, u64)],
        synced_ends: &[(String, u32, u64)],
        histories: &[(String, String, u32, Vec<u8>)],
    ) -> Result<(), BrokerError> {
        self.write(|txn| {
            let mut table = txn.open_table(PRIORITY_ENDS)?;
            for (topic, partition, end) in ends {
                table.insert((topic.as_str(), *partition), *end)?;
            }
            let mut table = txn.open_table(SYNCED_ENDS)?;
            for (topic, partition, end) in synced_ends {
                table.insert((topic.as_str(), *partition), *end)?;
            }
            let mut table = txn.open_table(HISTORIES)?;
            table.retain(|_, _| false)?;
            for (topic, name, partition, bytes) in histories {
                table.insert(
                    (topic.as_str(), name.as_str(), *partition),
                    bytes.as_slice(),
                )?;
            }
            Ok(())
        })
    }

    pub fn put_topic(&self, name: &str, record: &TopicRecord) -> Result<(), BrokerError> {
        let value = serde_json::to_vec(record).expect("a topic record serializes");
        self.write(|txn| {
            txn.open_table(TOPICS)?.insert(name, value.as_slice())?;
            Ok(())
        })
    }

    /// Removes a topic with its subscriptions and cursors.
    pub fn remove_topic(&self, name: &str) -> Result<(), BrokerError> {
        self.write(|txn| {
            txn.open_table(TOPICS)?.remove(name)?;
            txn.open_table(SUBSCRIPTIONS)?
                .retain(|(topic, _), _| topic != name)?;
            txn.open_table(CURSORS)?
                .retain(|(topic, _, _), _| topic != name)?;
            txn.open_table(REQUEUED)?
                .retain(|(topic, _), _| topic != name)?;
            txn.open_table(REQUEUE_COPIES)?
                .retain(|(topic, _, _), _| topic != name)?;
            txn.open_table(PRIORITY_ENDS)?
                .retain(|(topic, _), _| topic != name)?;
            txn.open_table(SYNCED_ENDS)?
                .retain(|(topic, _), _| topic != name)?;
            txn.open_table(HISTORIES)?
                .retain(|(topic, _, _), _| topic != name)?;
            txn.open_table(DELIVERY)?
                .retain(|(topic, _, _), _| topic != name)?;
            Ok(())
        })
    }

    /// Stores a new subscription with its starting cursors, in one transaction.
    pub fn put_subscription(
        &self,
        topic: &str,
        name: &str,
        record: &SubscriptionRecord,
        cursors: &[(u32, CursorRecord)],
    ) -> Result<(), BrokerError> {
        let value = serde_json::to_vec(record).expect("a subscription record serializes");
        self.write(|txn| {
            txn.open_table(SUBSCRIPTIONS)?
                .insert((topic, name), value.as_slice())?;
            let mut table = txn.open_table(CURSORS)?;
            for (partition, cursor) in cursors {
                table.insert((topic, name, *partition), cursor.encode().as_slice())?;
            }
            Ok(())
        })
    }

    /// Records whether a stored subscription's deliveries are paused.
    pub fn set_subscription_paused(
        &self,
        topic: &str,
        name: &str,
        paused: bool,
    ) -> Result<(), BrokerError> {
        self.write(|txn| {
            let mut table = txn.open_table(SUBSCRIPTIONS)?;
            let stored = table.get((topic, name))?.map(|v| v.value().to_vec());
            let Some(bytes) = stored else {
                return Ok(());
            };
            let Ok(mut record) = serde_json::from_slice::<SubscriptionRecord>(&bytes) else {
                return Ok(());
            };
            record.paused = paused;
            let value = serde_json::to_vec(&record).expect("a subscription record serializes");
            table.insert((topic, name), value.as_slice())?;
            Ok(())
        })
    }

    pub fn remove_subscription(&self, topic: &str, name: &str) -> Result<(), BrokerError> {
        self.write(|txn| {
            txn.open_table(SUBSCRIPTIONS)?.remove((topic, name))?;
            txn.open_table(CURSORS)?
                .retain(|(t, n, _), _| !(t == topic && n == name))?;
            txn.open_table(HISTORIES)?
                .retain(|(t, n, _), _| !(t == topic && n == name))?;
            txn.open_table(DELIVERY)?
                .retain(|(t, n, _), _| !(t == topic && n == name))?;
            Ok(())
        })
    }

    pub(crate) fn put_cursors(&self, rows: &[CursorRow]) -> Result<(), BrokerError> {
        self.write(|txn| {
            let mut table = txn.open_table(CURSORS)?;
            let mut delivery = txn.open_table(DELIVERY)?;
            for (topic, name, partition, cursor, states) in rows {
                let key = (topic.as_str(), name.as_str(), *partition);
                table.insert(key, cursor.encode().as_slice())?;
                if states.is_empty() {
                    delivery.remove(key)?;
                } else {
                    delivery.insert(key, encode_delivery(states).as_slice())?;
                }
            }
            Ok(())
        })
    }

    /// Every user's stored record, by name.
    pub fn load_users(&self) -> Result<Vec<(String, Vec<u8>)>, BrokerError> {
        let read = |e: redb::Error| storage_error("read", e);
        let txn = self.begin_read()?;
        let table = txn.open_table(USERS).map_err(|e| read(e.into()))?;
        let mut out = Vec::new();
        for row in table.iter().map_err(|e| read(e.into()))? {
            let (k, v) = row.map_err(|e| read(e.into()))?;
            out.push((k.value().to_string(), v.value().to_vec()));
        }
        Ok(out)
    }

    /// Stores a user's record, replacing the one before, durably.
    pub fn put_user(&self, name: &str, record: &[u8]) -> Result<(), BrokerError> {
        self.write(|txn| {
            txn.open_table(USERS)?.insert(name, record)?;
            Ok(())
        })
    }

    /// Many users in one transaction (tests that load thousands).
    #[cfg(test)]
    pub fn put_users(&self, users: &[(String, Vec<u8>)]) -> Result<(), BrokerError> {
        self.write(|txn| {
            let mut table = txn.open_table(USERS)?;
            for (name, record) in users {
                table.insert(name.as_str(), record.as_slice())?;
            }
            Ok(())
        })
    }

    pub fn remove_user(&self, name: &str) -> Result<(), BrokerError> {
        self.write(|txn| {
            txn.open_table(USERS)?.remove(name)?;
            Ok(())
        })
    }

    /// The requeued dead letters of the dead-letter topic `topic`, per partition.
    pub fn load_requeued(&self, topic: &str) -> Result<Vec<(u32, Runs)>, BrokerError> {
        let read = |e: redb::Error| storage_error("read", e);
        let txn = self.begin_read()?;
        let table = txn.open_table(REQUEUED).map_err(|e| read(e.into()))?;
        let mut out = Vec::new();
        for row in table
            .range((topic, 0u32)..=(topic, u32::MAX))
            .map_err(|e| read(e.into()))?
        {
            let (k, v) = row.map_err(|e| read(e.into()))?;
            let (_, partition) = k.value();
            let runs = decode_runs(v.value()).ok_or_else(|| {
                storage_error(
                    &format!("requeued dead letters of '{topic}' partition {partition}"),
                    "unreadable record",
                )
            })?;
            out.push((partition, runs));
        }
        Ok(out)
    }

    /// Where the requeued dead letters of `topic` went: (partition, offset, copy's partition,
    /// copy's offset).
    pub fn load_requeue_copies(&self, topic: &str) -> Result<Vec<RequeueCopy>, BrokerError> {
        let read = |e: redb::Error| storage_error("read", e);
        let txn = self.begin_read()?;
        let table = txn.open_table(REQUEUE_COPIES).map_err(|e| read(e.into()))?;
        let mut out = Vec::new();
        for row in table
            .range((topic, 0u32, 0u64)..=(topic, u32::MAX, u64::MAX))
            .map_err(|e| read(e.into()))?
        {
            let (k, v) = row.map_err(|e| read(e.into()))?;
            let (_, partition, offset) = k.value();
            let value = v.value();
            if value.len() != 12 {
                return Err(storage_error(
                    &format!("requeue copies of '{topic}' partition {partition}"),
                    "unreadable record",
                ));
            }
            let copy_partition = u32::from_le_bytes(value[..4].try_into().expect("4 bytes"));
            let copy_offset = u64::from_le_bytes(value[4..].try_into().expect("8 bytes"));
            out.push((partition, offset, copy_partition, copy_offset));
        }
        Ok(out)
    }

    /// Records where dead letters of one partition went, and forgets those below `start` (no
    /// longer retained), in one transaction.
    pub fn put_requeue_copies(
        &self,
        topic: &str,
        partition: u32,
        copies: &[(u64, (u32, u64))],
        start: u64,
    ) -> Result<(), BrokerError> {
        self.write(|txn| {
            let mut table = txn.open_table(REQUEUE_COPIES)?;
            table.retain_in(
                (topic, partition, 0u64)..(topic, partition, start),
                |_, _| false,
            )?;
            for &(offset, (copy_partition, copy_offset)) in copies {
                let mut value = [0u8; 12];
                value[..4].copy_from_slice(&copy_partition.to_le_bytes());
                value[4..].copy_from_slice(&copy_offset.to_le_bytes());
                table.insert((topic, partition, offset), value.as_slice())?;
            }
            Ok(())
        })
    }

    /// Replaces the requeued runs of the partitions given, in one transaction; a partition
    /// without runs loses its row.
    pub fn put_requeued(
        &self,
        topic: &str,
        partitions: &[(u32, &[(u64, u64)])],
    ) -> Result<(), BrokerError> {
        self.write(|txn| {
            let mut table = txn.open_table(REQUEUED)?;
            for &(partition, runs) in partitions {
                if runs.is_empty() {
                    table.remove((topic, partition))?;
                } else {
                    table.insert((topic, partition), encode_runs(runs).as_slice())?;
                }
            }
            Ok(())
        })
    }
}

/// A requeued dead letter's partition and offset, and its copy's partition and offset.
pub(crate) type RequeueCopy = (u32, u64, u32, u64);

/// A cursor to save: topic, subscription, partition, its record and its delivery states.
pub(crate) type CursorRow = (String, String, u32, CursorRecord, Vec<DeliveryState>);

/// Bytes of one saved delivery state.
const DELIVERY_STATE_BYTES: usize = 18;

/// Delivery states as stored: per message `u64 offset, u16 attempts, u64 due_ms` (0: no delay),
/// little-endian.
fn encode_delivery(states: &[DeliveryState]) -> Vec<u8> {
    let mut out = Vec::with_capacity(DELIVERY_STATE_BYTES * states.len());
    for (offset, attempts, due_ms) in states {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&attempts.to_le_bytes());
        out.extend_from_slice(&due_ms.to_le_bytes());
    }
    out
}

fn decode_delivery(bytes: &[u8]) -> Option<Vec<DeliveryState>> {
    if !bytes.len().is_multiple_of(DELIVERY_STATE_BYTES) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(DELIVERY_STATE_BYTES)
            .map(|c| {
                (
                    u64::from_le_bytes(c[0..8].try_into().expect("8 bytes")),
                    u16::from_le_bytes(c[8..10].try_into().expect("2 bytes")),
                    u64::from_le_bytes(c[10..18].try_into().expect("8 bytes")),
                )
            })
            .collect(),
    )
}

/// Inclusive offset runs `(start, end)`, ascending and disjoint.
pub(crate) type Runs = Vec<(u64, u64)>;

/// Offset runs as stored: each run as two little-endian
/// `u64`s, start then end.
fn encode_runs(runs: &[(u64, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 * runs.len());
    for (start, end) in runs {
        out.extend_from_slice(&start.to_le_bytes());
        out.extend_from_slice(&end.to_le_bytes());
    }
    out
}

fn decode_runs(bytes: &[u8]) -> Option<Runs> {
    if !bytes.len().is_multiple_of(16) {
        return None;
    }
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    Some(
        (0..bytes.len())
            .step_by(16)
            .map(|i| (u64_at(i), u64_at(i + 8)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_records_roundtrip_and_refuse_bad_lengths() {
        let record = CursorRecord {
            floor: 7,
            settled: vec![(9, 10), (12, 20)],
        };
        assert_eq!(CursorRecord::decode(&record.encode()), Some(record));
        assert_eq!(CursorRecord::decode(&[0; 7]), None);
        assert_eq!(CursorRecord::decode(&[0; 9]), None);
    }

    #[test]
    fn requeued_runs_roundtrip_and_refuse_bad_lengths() {
        let runs = vec![(0, 3), (7, 7), (9, u64::MAX)];
        assert_eq!(decode_runs(&encode_runs(&runs)), Some(runs));
        assert_eq!(decode_runs(&[]), Some(Vec::new()));
        assert_eq!(decode_runs(&[0; 15]), None);
    }

    #[test]
    fn requeued_rows_are_per_topic_and_go_with_the_topic() {
        let dir =
            std::env::temp_dir().join(format!("ferrymq-meta-requeued-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = MetaStore::open(&dir.join("meta.redb")).unwrap();
        store
            .put_requeued("a.dlq", &[(0, &[(1, 2)]), (3, &[(5, 9)])])
            .unwrap();
        store.put_requeued("a.dlq.x", &[(0, &[(4, 4)])]).unwrap();
        assert_eq!(
            store.load_requeued("a.dlq").unwrap(),
            vec![(0, vec![(1, 2)]), (3, vec![(5, 9)])]
        );
        store.put_requeued("a.dlq", &[(3, &[])]).unwrap();
        assert_eq!(
            store.load_requeued("a.dlq").unwrap(),
            vec![(0, vec![(1, 2)])]
        );
        store
            .put_requeue_copies("a.dlq", 0, &[(1, (2, 40)), (2, (2, 41))], 0)
            .unwrap();
        store
            .put_requeue_copies("a.dlq.x", 0, &[(4, (0, 7))], 0)
            .unwrap();
        // Offsets below the new start are forgotten, with the new copies recorded.
        store
            .put_requeue_copies("a.dlq", 0, &[(5, (1, 3))], 2)
            .unwrap();
        assert_eq!(
            store.load_requeue_copies("a.dlq").unwrap(),
            vec![(0, 2, 2, 41), (0, 5, 1, 3)]
        );
        store.remove_topic("a.dlq").unwrap();
        assert_eq!(store.load_requeued("a.dlq").unwrap(), vec![]);
        assert_eq!(store.load_requeue_copies("a.dlq").unwrap(), vec![]);
        assert_eq!(
            store.load_requeue_copies("a.dlq.x").unwrap(),
            vec![(0, 4, 0, 7)]
        );
        assert_eq!(
            store.load_requeued("a.dlq.x").unwrap(),
            vec![(0, vec![(4, 4)])]
        );
        drop(store);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn topic_records_keep_every_setting() {
        let config = TopicConfig {
            partitions: 3,
            storage: Storage::Disk,
            overflow: OverflowPolicy::Reject,
            max_messages: 10,
            max_bytes: 20,
            fsync: FsyncPolicy::IntervalMs(50),
            retention_ms: 1000,
            retention_policy: Default::default(),
            dedup_window_ms: 0,
            replicas: 0,
        };
        let record: TopicRecord =
            serde_json::from_slice(&serde_json::to_vec(&TopicRecord::of(&config)).unwrap())
                .unwrap();
        assert_eq!(record.config().unwrap(), config);
    }
}
