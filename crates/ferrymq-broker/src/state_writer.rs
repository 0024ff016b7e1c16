//! The state writer: cursor changes (acks, given-up messages, auto-ack deliveries) mark the
//! cursor dirty, and this thread commits every dirty cursor to the metadata store in one
//! transaction, so thousands of acks share one fsync (see `meta` for the store itself).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tokio::sync::watch;

use crate::error::BrokerError;
use crate::meta::{CursorRecord, CursorRow, MetaStore, REOPEN_INTERVAL};
use crate::partition::SERVING_NONE;
use crate::replication::{CursorReplicator, CursorState, CursorUpdate};
use crate::subscription::Subscription;
use crate::topic::Topic;

/// What the state writer reports: the last generation of marks committed, and the last that
/// failed (with why).
#[derive(Debug, Clone, Default)]
pub(crate) struct Committed {
    pub generation: u64,
    pub failed_generation: u64,
    pub error: Option<String>,
}

#[derive(Default)]
struct Dirty {
    /// By (subscription id, partition).
    cursors: HashMap<(u64, u32), (Weak<Topic>, Weak<Subscription>)>,
    generation: u64,
}

/// Commits dirty cursors in batches on its own thread.
pub(crate) struct StateWriter {
    store: Arc<MetaStore>,
    dirty: Mutex<Dirty>,
    wake: Condvar,
    stop: AtomicBool,
    committed: watch::Sender<Committed>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Set when someone waits for a commit: the writer stops batching and commits now.
    urgent: AtomicBool,
    /// Cluster mode: carries the cursors of replicated partitions to their other replicas.
    replicator: parking_lot::RwLock<Option<Arc<dyn CursorReplicator>>>,
}

/// The cursors of one commit that are replicated, by (topic, partition): the serving term and
/// the cursors.
type Replicated = std::collections::BTreeMap<(String, u32), (u64, Vec<CursorState>)>;

/// Pause before retrying a failed commit (a full disk), so a broken disk is not hammered.
const RETRY_DELAY: Duration = Duration::from_millis(200);
/// Fewest milliseconds between two commits nobody waits for (acks without confirmation,
/// auto-ack deliveries): each commit costs fsyncs that publishes under fsync=always would
/// otherwise queue behind. An ack that asks for confirmation is committed at once. After a crash
/// at most this window of unconfirmed acks is delivered again.
const LAZY_COMMIT_INTERVAL: Duration = Duration::from_millis(20);

impl StateWriter {
    pub fn start(store: Arc<MetaStore>) -> Arc<StateWriter> {
        let writer = Arc::new(StateWriter {
            store,
            dirty: Mutex::new(Dirty::default()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            committed: watch::Sender::new(Committed::default()),
            thread: Mutex::new(None),
            urgent: AtomicBool::new(false),
            replicator: parking_lot::RwLock::new(None),
        });
        let w = writer.clone();
        let handle = std::thread::Builder::new()
            .name("ferrymq-state".into())
            .spawn(move || w.run())
            .expect("spawning the state writer");
        *writer.thread.lock() = Some(handle);
        writer
    }

    pub fn set_replicator(&self, replicator: Arc<dyn CursorReplicator>) {
        *self.replicator.write() = Some(replicator);
    }

    pub fn store(&self) -> &MetaStore {
        &self.store
    }

    /// Marks a cursor for the next commit; returns the generation that commit will report.
    pub fn mark(
        &self,
        topic: &Arc<Topic>,
        subscription: &Arc<Subscription>,
        partition: u32,
    ) -> u64 {
        let mut dirty = self.dirty.lock();
        dirty.generation += 1;
        // The writer sleeps without a deadline only while nothing is dirty; otherwise it wakes
        // at its commit interval (or at once for a waiter), so only the first mark wakes it.
        let was_clean = dirty.cursors.is_empty();
        dirty
            .cursors
            .entry((subscription.id, partition))
            .or_insert_with(|| (Arc::downgrade(topic), Arc::downgrade(subscription)));
        let generation = dirty.generation;
        drop(dirty);
        if was_clean {
            self.wake.notify_one();
        }
        generation
    }

    /// Waits until the commit holding generation `generation` is done.
    pub async fn wait(&self, generation: u64) -> Result<(), BrokerError> {
        let mut rx = self.committed.subscribe();
        if rx.borrow().generation < generation {
            self.urgent.store(true, Relaxed);
            let _guard = self.dirty.lock();
            self.wake.notify_one();
        }
        let state = rx
            .wait_for(|c| c.generation >= generation || c.failed_generation >= generation)
            .await
            .map_err(|_| BrokerError::ShuttingDown)?;
        if state.generation >= generation {
            Ok(())
        } else {
            Err(BrokerError::Storage(format!(
                "acknowledgement state could not be saved: {}",
                state.error.as_deref().unwrap_or("unknown error")
            )))
        }
    }

    /// Stops the writer thread and waits for it (a commit in progress finishes). What is still
    /// dirty is not saved: [`StateWriter::flush`] first for a clean stop.
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
        {
            let _guard = self.dirty.lock();
            self.wake.notify_all();
        }
        if let Some(thread) = self.thread.lock().take() {
            let _ = thread.join();
        }
    }

    /// Commits what is dirty now, on the caller's thread (a clean shutdown).
    pub fn flush(&self) {
        let taken = {
            let mut dirty = self.dirty.lock();
            let generation = dirty.generation;
            std::mem::replace(
                &mut *dirty,
                Dirty {
                    cursors: HashMap::new(),
                    generation,
                },
            )
        };
        if !taken.cursors.is_empty() {
            self.commit(taken);
        }
    }

    fn run(&self) {
        let mut last_commit = std::time::Instant::now();
        loop {
            let taken = {
                let mut dirty = self.dirty.lock();
                loop {
                    if self.stop.load(Relaxed) {
                        return;
                    }
                    let due = last_commit + LAZY_COMMIT_INTERVAL;
                    if !dirty.cursors.is_empty()
                        && !self.urgent.load(Relaxed)
                        && std::time::Instant::now() < due
                    {
                        self.wake.wait_until(&mut dirty, due);
                        continue;
                    }
                    if !dirty.cursors.is_empty() {
                        self.urgent.store(false, Relaxed);
                        let generation = dirty.generation;
                        break std::mem::replace(
                            &mut *dirty,
                            Dirty {
                                cursors: HashMap::new(),
                                generation,
                            },
                        );
                    }
                    if self.store.fault().is_some() {
                        // Nothing to commit, but the store failed: reopen it now rather than at
                        // the next ack, so that health tells the truth without traffic.
                        self.wake.wait_for(&mut dirty, REOPEN_INTERVAL);
                        if dirty.cursors.is_empty() && !self.stop.load(Relaxed) {
                            drop(dirty);
                            let _ = self.store.recover();
                            dirty = self.dirty.lock();
                        }
                        continue;
                    }
                    self.wake.wait(&mut dirty);
                }
            };
            last_commit = std::time::Instant::now();
            if !self.commit(taken) {
                std::thread::sleep(RETRY_DELAY);
            }
        }
    }

    /// Snapshots the cursors and commits them (and hands the replicated ones to the
    /// replicator); on failure marks them dirty again.
    fn commit(&self, taken: Dirty) -> bool {
        let replicator = self.replicator.read().clone();
        let (rows, replicated) = snapshot(&taken, replicator.as_deref());
        let started = std::time::Instant::now();
        let mut result = self.store.put_cursors(&rows);
        crate::stages::record_since(crate::stages::Stage::CursorCommit, started);
        if result.is_ok() && !replicated.is_empty() {
            let replicator = replicator.expect("replicated cursors have a replicator");
            result = replicate(replicator.as_ref(), replicated);
        }
        self.report(taken.generation, &result);
        match result {
            Ok(()) => true,
            Err(error) => {
                // The store logs the failure itself, once and then every half minute.
                tracing::debug!(%error, cursors = rows.len(), "could not save subscription state; retrying");
                let mut dirty = self.dirty.lock();
                for (key, value) in taken.cursors {
                    dirty.cursors.entry(key).or_insert(value);
                }
                false
            }
        }
    }

    /// Tells the waiters of `generation` how its commit went.
    fn report(&self, generation: u64, result: &Result<(), BrokerError>) {
        match result {
            Ok(()) => {
                self.committed
                    .send_modify(|c| c.generation = c.generation.max(generation));
            }
            Err(error) => {
                self.committed.send_modify(|c| {
                    c.failed_generation = c.failed_generation.max(generation);
                    c.error = Some(error.to_string());
                });
            }
        }
    }
}

/// Hands the replicated cursors to `replicator`, one update per partition; the first failure is
/// the commit's.
fn replicate(replicator: &dyn CursorReplicator, replicated: Replicated) -> Result<(), BrokerError> {
    let updates: Vec<CursorUpdate> = replicated
        .into_iter()
        .map(|((topic, partition), (epoch, states))| CursorUpdate {
            topic,
            partition,
            epoch,
            payload: crate::replication::encode(&states),
        })
        .collect();
    let results = replicator.replicate(updates);
    match results.into_iter().find_map(Result::err) {
        None => Ok(()),
        Some(error) => Err(BrokerError::Storage(format!(
            "acknowledgement state could not be replicated: {error}"
        ))),
    }
}

/// The rows to save of the cursors `taken` marked, and the replicated ones among them by
/// partition. A replicated cursor that another replica serves now is left out: its changes here
/// are void (a consumer waiting for them is told so by [`crate::Consumer::acks_saved`]).
fn snapshot(
    taken: &Dirty,
    replicator: Option<&dyn CursorReplicator>,
) -> (Vec<CursorRow>, Replicated) {
    let mut rows = Vec::with_capacity(taken.cursors.len());
    let mut replicated = Replicated::new();
    for (&(sub_id, partition), (topic, subscription)) in &taken.cursors {
        let (Some(topic), Some(subscription)) = (topic.upgrade(), subscription.upgrade()) else {
            continue;
        };
        if topic.is_deleted() {
            continue;
        }
        let p = &topic.partitions[partition as usize];
        let serving = p.serving.load(Relaxed);
        let replicates = replicator.is_some_and(|r| r.replicates(&topic.name));
        if replicates && serving == SERVING_NONE {
            continue;
        }
        let state = p.state.lock();
        let Some(cursor) = state.cursor(sub_id) else {
            continue;
        };
        let record = CursorRecord {
            floor: cursor.floor(),
            settled: cursor.settled_runs(),
        };
        let delivery = cursor.delivery_state();
        if replicates {
            let settings = subscription.record(partition, cursor.start());
            drop(state);
            replicated
                .entry((topic.name.clone(), partition))
                .or_insert_with(|| (serving, Vec::new()))
                .1
                .push(CursorState {
                    subscription: subscription.name.clone(),
                    settings,
                    floor: record.floor,
                    settled: record.settled.clone(),
                    delivery: delivery.clone(),
                });
        }
        rows.push((
            topic.name.clone(),
            subscription.name.clone(),
            partition,
            record,
            delivery,
        ));
    }
    (rows, replicated)
}
