//! Seeded power-loss simulation of a durable broker: random histories of publishes, consumption
//! with acks and nacks, failed syncs, clean stops and power losses, over a simulated disk
//! (`MemoryStorage` for the partition logs, `SimBlockFile` for the metadata store), checked
//! against a model of what the broker promised.
//!
//! Each history opens a broker, creates one disk topic (1 to 3 partitions, `fsync=always`) with
//! a named subscription `audit` that never consumes (so retention never deletes anything), then
//! runs random steps: publish small batches (some with an injected sync failure), consume from
//! the named subscription `work` (ack, nack or keep each delivery; `acks_saved` most of the
//! time), drop the `work` consumer, lose power (the metadata file first, so that the dying
//! store cannot write, then every handle is dropped without `shutdown`, then the log disk loses
//! what was not synced), stop cleanly and then lose power, or lose power in the middle of a
//! metadata commit. After every power loss the broker is reopened and checked:
//!
//! 1. every publish that returned `Ok` is in the topic at the `(partition, offset)` its receipt
//!    gave, with its body; every message ever delivered stays where it was, unchanged; nothing
//!    else is in the topic but messages whose publish failed (their outcome is unknown), each
//!    at most once;
//! 2. a message whose ack on `work` was confirmed (`acks_saved` returned `Ok`, or the ack was
//!    made before a clean `shutdown`) is never delivered to `work` again; within one run no
//!    acked message is delivered again at all;
//! 3. the broker opens after every power loss, the topic and its subscriptions are there, and
//!    the offsets of each partition are dense from 0.
//!
//! 4. the `work` consumer's count of messages in flight matches what it holds (a poll that
//!    meets a closed partition log after delivering from another partition still counts what it
//!    delivered);
//! 5. after the last restart, `work` delivers every message of the topic that was never acked
//!    (also when `work` was created from `earliest` while a partition log was closed for a
//!    reopen).
//!
//! Both were found by this simulation; the deterministic tests at the end of this file pin them.
//!
//! The partition logs live in `MemoryStorage` under a real temporary data dir: the broker itself
//! only creates the empty `topics` directory there (and finds no orphans in it).
//!
//! A failure names its seed. `FERRYMQ_SIM_SEED=<seed>` replays that history
//! (`FERRYMQ_SIM_TRACE=1` prints each step, with `-- --nocapture`), `FERRYMQ_SIM_HISTORIES=<n>`
//! runs more (or fewer), `FERRYMQ_SIM_BASE=<seed>` starts elsewhere. The broker's sync and state
//! threads run for real, so a replay repeats the same steps and crash decisions, while what was
//! unsynced at the moment of a crash (and so the outcome) can differ between runs: replay a
//! failing seed a few times.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferrymq_broker::{
    Broker, BrokerConfig, BrokerError, Consumer, DiskConfig, PublishReceipt, StorageFactory, Topic,
};
use ferrymq_protocol::limits::ACK_TIMEOUT_MS_MAX;
use ferrymq_protocol::{
    FsyncPolicy, Message, OffsetRange, RecordBatch, StartPosition, Storage, SubscribeRequest,
    TopicConfig,
};
use ferrymq_storage::{LogStorage, MemoryStorage, SimBlockFile, SimRng};

const HISTORIES_DEFAULT: u64 = 120;
const STEPS_PER_HISTORY: usize = 40;
const TOPIC: &str = "sim";
const WORK: &str = "work";
const AUDIT: &str = "audit";
/// Bound on anything the test awaits; far above what any step needs.
const AWAIT_MAX: Duration = Duration::from_secs(10);
/// A history taking longer than this is stuck (a thread join or lock that never returns).
const HISTORY_MAX: Duration = Duration::from_secs(120);

/// One simulated machine: every partition log on one `MemoryStorage`, the metadata store on one
/// `SimBlockFile`. A backend handed out after a crash is a fresh, live handle.
struct SimFactory {
    disk: MemoryStorage,
    meta: SimBlockFile,
}

impl StorageFactory for SimFactory {
    fn storage(&self) -> Box<dyn LogStorage + Send> {
        Box::new(self.disk.clone())
    }

    fn meta_backend(&self) -> Option<Box<dyn redb::StorageBackend>> {
        Some(Box::new(self.meta.clone()))
    }
}

/// What the broker promised, across every run of one history.
#[derive(Default)]
struct Model {
    /// Publishes that returned `Ok`: where the receipt put each message, and its body.
    acknowledged: BTreeMap<(u32, u64), Vec<u8>>,
    /// Bodies of publishes that returned an error: each may or may not be in the topic.
    uncertain: HashSet<Vec<u8>>,
    /// Every message seen delivered (so durable), by where it was: it must stay there, unchanged.
    seen: BTreeMap<(u32, u64), Vec<u8>>,
    /// Acks on `work` known durable, with how they were confirmed.
    confirmed: BTreeMap<(u32, u64), &'static str>,
    /// Acks on `work` made in earlier runs and never confirmed: may be delivered again.
    unconfirmed_earlier: BTreeSet<(u32, u64)>,
    work_created: bool,
    /// Every ack ever made on `work`, confirmed or not.
    acked_ever: BTreeSet<(u32, u64)>,
    next_message: u64,
}

#[derive(Default, Debug)]
struct Coverage {
    histories: u64,
    power_losses: u64,
    clean_stops: u64,
    meta_crashes_in_commit: u64,
    acknowledged_checked: u64,
    publishes_failed: u64,
    publishes_unanswered: u64,
    uncertain_found: u64,
    acks_confirmed: u64,
    acks_saved_failed: u64,
    unconfirmed_redelivered: u64,
    nacks: u64,
    poll_errors: u64,
}

/// One broker run, from open to power loss.
struct Run {
    broker: Broker,
    topic: Weak<Topic>,
    work: Option<Consumer>,
    /// Delivered to the current `work` consumer and neither acked nor nacked.
    in_flight: Vec<(u32, u64)>,
    /// Acks of the current `work` consumer not yet confirmed by `acks_saved`.
    unconfirmed: Vec<(u32, u64)>,
    /// Every ack made in this run, confirmed or not.
    acked: BTreeSet<(u32, u64)>,
    /// A metadata crash is armed or happened: `acks_saved` may fail.
    meta_fault: bool,
    /// A publish failed in this run (its partition's log failed a sync).
    publish_failed: bool,
}

struct Sim {
    seed: u64,
    rng: SimRng,
    trace: bool,
    data_dir: PathBuf,
    disk: MemoryStorage,
    meta: SimBlockFile,
    partitions: u32,
    segment_bytes: u64,
    tail_cache_bytes: u64,
    sync_threads: usize,
    /// Whether this history may lose power in the middle of a metadata commit.
    meta_faults: bool,
    step: usize,
    runs: u64,
    model: Model,
}

macro_rules! ensure {
    ($sim:expr, $cond:expr, $($arg:tt)+) => {
        if !$cond {
            return Err($sim.failure(format!($($arg)+)));
        }
    };
}

fn body_of(record: &Bytes) -> Result<Vec<u8>, String> {
    let batch = RecordBatch::decode(1, record.clone())
        .map_err(|e| format!("a stored record does not decode: {e}"))?;
    let record = batch
        .records()
        .next()
        .ok_or("a stored record holds no message")?;
    Ok(record.to_message().body.to_vec())
}

fn show(body: &[u8]) -> String {
    String::from_utf8_lossy(body).into_owned()
}

impl Sim {
    fn new(seed: u64, data_dir: PathBuf) -> Sim {
        let mut rng = SimRng::new(seed);
        let partitions = 1 + rng.below(3) as u32;
        let segment_bytes = [300, 1024, 128 * 1024 * 1024][rng.below(3) as usize];
        let tail_cache_bytes = [200, 4096, 4 * 1024 * 1024][rng.below(3) as usize];
        let sync_threads = 1 + rng.below(2) as usize;
        let meta_faults = rng.chance(1, 4);
        Sim {
            seed,
            rng,
            trace: std::env::var_os("FERRYMQ_SIM_TRACE").is_some(),
            data_dir,
            disk: MemoryStorage::new(),
            meta: SimBlockFile::new(),
            partitions,
            segment_bytes,
            tail_cache_bytes,
            sync_threads,
            meta_faults,
            step: 0,
            runs: 0,
            model: Model::default(),
        }
    }

    fn failure(&self, message: String) -> String {
        format!("step {} (run {}): {message}", self.step, self.runs)
    }

    fn trace(&self, what: impl FnOnce() -> String) {
        if self.trace {
            eprintln!(
                "[seed {} step {} run {}] {}",
                self.seed,
                self.step,
                self.runs,
                what()
            );
        }
    }

    fn disk_config(&self) -> DiskConfig {
        let mut config = DiskConfig::new(&self.data_dir);
        config.segment_bytes = self.segment_bytes;
        config.tail_cache_bytes = self.tail_cache_bytes;
        config.tail_cache_bytes_min = self.tail_cache_bytes / 2;
        config.sync_threads = self.sync_threads;
        config.storage = Arc::new(SimFactory {
            disk: self.disk.clone(),
            meta: self.meta.clone(),
        });
        config
    }

    fn broker_config() -> BrokerConfig {
        BrokerConfig {
            // A lost topic must show as missing, not come back as an empty memory topic.
            auto_create_topics: false,
            ..BrokerConfig::default()
        }
    }

    fn subscribe_request(name: &str) -> SubscribeRequest {
        SubscribeRequest {
            topic: TOPIC.into(),
            subscription: name.into(),
            start: StartPosition::Earliest,
            // Nothing expires or is given up within a history: every redelivery is a crash's.
            ack_timeout_ms: ACK_TIMEOUT_MS_MAX,
            max_attempts: 10_000,
            credit: 0,
            auto_ack: false,
            ordered: false,
            partitions: Vec::new(),
            dead_letter_topic: String::new(),
        }
    }

    /// The first run: a new broker, the topic and the `audit` subscription.
    fn create(&mut self) -> Result<Run, String> {
        let broker = Broker::open_durable(Self::broker_config(), self.disk_config())
            .map_err(|e| self.failure(format!("a new broker did not open: {e}")))?;
        let topic = broker
            .create_topic(
                TOPIC,
                TopicConfig {
                    partitions: self.partitions,
                    storage: Storage::Disk,
                    fsync: FsyncPolicy::Always,
                    ..TopicConfig::default()
                },
                false,
            )
            .map_err(|e| self.failure(format!("create_topic: {e}")))?;
        drop(
            broker
                .subscribe(&Self::subscribe_request(AUDIT))
                .map_err(|e| self.failure(format!("subscribe {AUDIT}: {e}")))?,
        );
        self.trace(|| {
            format!(
                "created: {} partitions, segments of {} bytes, tail cache {} bytes, {} sync threads, metadata faults {}",
                self.partitions,
                self.segment_bytes,
                self.tail_cache_bytes,
                self.sync_threads,
                self.meta_faults
            )
        });
        Ok(Run {
            broker,
            topic: Arc::downgrade(&topic),
            work: None,
            in_flight: Vec::new(),
            unconfirmed: Vec::new(),
            acked: BTreeSet::new(),
            meta_fault: false,
            publish_failed: false,
        })
    }

    /// Reopens after a power loss and checks the topic (checks 1 and 3).
    fn reopen(&mut self, coverage: &mut Coverage) -> Result<Run, String> {
        self.runs += 1;
        let broker = Broker::open_durable(Self::broker_config(), self.disk_config())
            .map_err(|e| self.failure(format!("CHECK 3: the broker did not open: {e}")))?;
        let topic = broker
            .topic(TOPIC)
            .map_err(|e| self.failure(format!("CHECK 3: the topic is gone: {e}")))?;
        ensure!(
            self,
            topic.partition_count() == self.partitions
                && topic.config().storage == Storage::Disk
                && topic.config().fsync == FsyncPolicy::Always,
            "CHECK 3: the topic came back with other settings: {:?}",
            topic.config()
        );
        let info = broker
            .describe_topic(TOPIC)
            .map_err(|e| self.failure(format!("describe_topic: {e}")))?;
        ensure!(
            self,
            info.subscriptions.iter().any(|s| s == AUDIT),
            "CHECK 3: subscription '{AUDIT}' is gone: {:?}",
            info.subscriptions
        );
        ensure!(
            self,
            !self.model.work_created || info.subscriptions.iter().any(|s| s == WORK),
            "CHECK 3: subscription '{WORK}' is gone: {:?}",
            info.subscriptions
        );
        let run = Run {
            broker,
            topic: Arc::downgrade(&topic),
            work: None,
            in_flight: Vec::new(),
            unconfirmed: Vec::new(),
            acked: BTreeSet::new(),
            meta_fault: false,
            publish_failed: false,
        };
        let total = self.check_contents(&run, coverage)?;
        ensure!(
            self,
            info.messages == total,
            "the topic says it holds {} messages, {total} were read",
            info.messages
        );
        Ok(run)
    }

    /// Reads the whole topic through an ephemeral subscription from the earliest offset and
    /// checks it against the model. Returns how many messages it holds.
    fn check_contents(&mut self, run: &Run, coverage: &mut Coverage) -> Result<u64, String> {
        let reader = run
            .broker
            .subscribe(&SubscribeRequest {
                subscription: String::new(),
                auto_ack: true,
                ..Self::subscribe_request("")
            })
            .map_err(|e| self.failure(format!("ephemeral subscribe: {e}")))?;
        let mut got: Vec<(u32, u64, Bytes)> = Vec::new();
        loop {
            let n = reader
                .poll(1000, usize::MAX, |p, o, _, _, record| {
                    got.push((p, o, record.clone()))
                })
                .map_err(|e| self.failure(format!("reading the topic: {e}")))?;
            if n == 0 {
                break;
            }
        }
        drop(reader);
        let mut next = vec![0u64; self.partitions as usize];
        let mut bodies = HashSet::new();
        for (p, o, record) in &got {
            let (p, o) = (*p, *o);
            ensure!(
                self,
                p < self.partitions,
                "a message in partition {p} of {}",
                self.partitions
            );
            ensure!(
                self,
                o == next[p as usize],
                "CHECK 3: partition {p} is not dense: offset {o} after {}",
                next[p as usize]
            );
            next[p as usize] += 1;
            let body = body_of(record).map_err(|e| self.failure(format!("{p}/{o}: {e}")))?;
            ensure!(
                self,
                bodies.insert(body.clone()),
                "CHECK 1: message '{}' is in the topic twice (again at {p}/{o})",
                show(&body)
            );
            self.check_body(p, o, &body, "in the topic after a restart")?;
            if !self.model.acknowledged.contains_key(&(p, o)) {
                coverage.uncertain_found += 1;
            }
            self.model.seen.insert((p, o), body);
        }
        for (&(p, o), body) in &self.model.acknowledged {
            ensure!(
                self,
                o < next[p as usize],
                "CHECK 1: acknowledged publish '{}' at {p}/{o} is lost: the partition ends at {}",
                show(body),
                next[p as usize]
            );
            coverage.acknowledged_checked += 1;
        }
        for (&(p, o), body) in &self.model.seen {
            ensure!(
                self,
                o < next[p as usize],
                "CHECK 1: message '{}' at {p}/{o}, delivered before, is lost: the partition ends at {}",
                show(body),
                next[p as usize]
            );
        }
        Ok(next.iter().sum())
    }

    /// A message found at `p/o` must be what the model says is there.
    fn check_body(&self, p: u32, o: u64, body: &[u8], context: &str) -> Result<(), String> {
        if let Some(want) = self.model.acknowledged.get(&(p, o)) {
            ensure!(
                self,
                want == body,
                "CHECK 1: {p}/{o} holds '{}' {context}, its acknowledged publish was '{}'",
                show(body),
                show(want)
            );
        } else if let Some(want) = self.model.seen.get(&(p, o)) {
            ensure!(
                self,
                want == body,
                "CHECK 1: {p}/{o} holds '{}' {context}, '{}' was delivered from there before",
                show(body),
                show(want)
            );
        } else {
            ensure!(
                self,
                self.model.uncertain.contains(body),
                "CHECK 1: {p}/{o} holds '{}' {context}, which was never published, or was acknowledged elsewhere",
                show(body)
            );
        }
        Ok(())
    }

    /// A batch of 1 to 4 new messages, a third of the time all with one key (one partition).
    fn batch(&mut self) -> (Vec<Vec<u8>>, Vec<Message>) {
        let count = 1 + self.rng.below(4);
        let key = self
            .rng
            .chance(1, 3)
            .then(|| self.rng.below(self.partitions as u64));
        let bodies: Vec<Vec<u8>> = (0..count)
            .map(|_| {
                self.model.next_message += 1;
                format!("s{}-m{}", self.seed, self.model.next_message).into_bytes()
            })
            .collect();
        let messages = bodies
            .iter()
            .map(|b| {
                let message = Message::new(b.clone());
                match key {
                    Some(k) => message.with_key(k.to_string()),
                    None => message,
                }
            })
            .collect();
        (bodies, messages)
    }

    async fn publish(
        &mut self,
        run: &mut Run,
        fail_sync: bool,
        coverage: &mut Coverage,
    ) -> Result<(), String> {
        let (bodies, messages) = self.batch();
        if fail_sync {
            self.disk.fail_next_syncs(1);
        }
        let result = tokio::time::timeout(AWAIT_MAX, run.broker.publish_messages(TOPIC, &messages))
            .await
            .map_err(|_| self.failure(format!("a publish did not complete in {AWAIT_MAX:?}")))?;
        if fail_sync {
            // A publish refused (its log already failed) leaves the failure armed; the recovery
            // running meanwhile may have met it, and that is one more fault, but it should not
            // linger into later steps.
            self.disk.fail_next_syncs(0);
        }
        let what = if fail_sync {
            "publish, a sync failing"
        } else {
            "publish"
        };
        self.record_publish(run, bodies, Some(result), what, coverage)
    }

    /// Publishes 2 to 4 batches at once (they share syncs: group commit). With
    /// `lose_power_first`, some publishes are still waiting for their sync when the power goes:
    /// the caller loses power next, and only those that had their answer count.
    async fn publish_concurrently(
        &mut self,
        run: &mut Run,
        lose_power_first: bool,
        coverage: &mut Coverage,
    ) -> Result<(), String> {
        let count = 2 + self.rng.below(3);
        let mut tasks = Vec::new();
        for _ in 0..count {
            let (bodies, messages) = self.batch();
            let broker = run.broker.clone();
            let task = tokio::spawn(async move { broker.publish_messages(TOPIC, &messages).await });
            tasks.push((bodies, task));
        }
        if lose_power_first {
            for _ in 0..self.rng.below(4) {
                std::thread::yield_now();
                tokio::task::yield_now().await;
            }
        }
        for (bodies, task) in tasks {
            if lose_power_first {
                task.abort();
            }
            let result = tokio::time::timeout(AWAIT_MAX, task).await.map_err(|_| {
                self.failure(format!("a publish did not complete in {AWAIT_MAX:?}"))
            })?;
            let (result, what) = match result {
                Ok(result) => (Some(result), "concurrent publish"),
                Err(error) if error.is_cancelled() => (None, "concurrent publish"),
                Err(error) => return Err(self.failure(format!("a publish task failed: {error}"))),
            };
            self.record_publish(run, bodies, result, what, coverage)?;
        }
        Ok(())
    }

    /// What a publish returned (`None`: no answer before the power went) goes into the model.
    fn record_publish(
        &mut self,
        run: &mut Run,
        bodies: Vec<Vec<u8>>,
        result: Option<Result<PublishReceipt, BrokerError>>,
        what: &str,
        coverage: &mut Coverage,
    ) -> Result<(), String> {
        let count = bodies.len();
        match result {
            Some(Ok(receipt)) => {
                let ids: Vec<(u32, u64)> = receipt.ids().collect();
                self.trace(|| format!("{what} of {count}: ok {ids:?}"));
                ensure!(
                    self,
                    ids.len() == bodies.len(),
                    "a receipt for {} messages lists {ids:?}",
                    bodies.len()
                );
                for ((p, o), body) in ids.into_iter().zip(bodies) {
                    ensure!(self, p < self.partitions, "a receipt names partition {p}");
                    if let Some(before) = self.model.acknowledged.get(&(p, o)) {
                        return Err(self.failure(format!(
                            "CHECK 1: offset {p}/{o} was given to '{}' and again to '{}'",
                            show(before),
                            show(&body)
                        )));
                    }
                    if let Some(before) = self.model.seen.get(&(p, o)) {
                        return Err(self.failure(format!(
                            "CHECK 1: offset {p}/{o} was given to '{}', but '{}' was delivered from there before",
                            show(&body),
                            show(before)
                        )));
                    }
                    self.model.acknowledged.insert((p, o), body);
                }
            }
            Some(Err(error)) => {
                self.trace(|| format!("{what} of {count}: {error}"));
                coverage.publishes_failed += 1;
                run.publish_failed = true;
                self.model.uncertain.extend(bodies);
            }
            None => {
                self.trace(|| format!("{what} of {count}: no answer before the power went"));
                coverage.publishes_unanswered += 1;
                self.model.uncertain.extend(bodies);
            }
        }
        Ok(())
    }

    /// A delivery to `work` (check 2, and check 1 for its body).
    fn check_work_delivery(
        &mut self,
        run: &Run,
        p: u32,
        o: u64,
        body: Vec<u8>,
        coverage: &mut Coverage,
    ) -> Result<(), String> {
        if let Some(how) = self.model.confirmed.get(&(p, o)) {
            return Err(self.failure(format!(
                "CHECK 2: '{}' at {p}/{o} was delivered to '{WORK}' again after a restart, but its ack was confirmed ({how})",
                show(&body)
            )));
        }
        ensure!(
            self,
            !run.acked.contains(&(p, o)),
            "CHECK 2: '{}' at {p}/{o} was delivered to '{WORK}' again in the run that acked it",
            show(&body)
        );
        ensure!(
            self,
            !run.in_flight.contains(&(p, o)),
            "'{}' at {p}/{o} was delivered to '{WORK}' while in flight",
            show(&body)
        );
        self.check_body(p, o, &body, "when delivered")?;
        if self.model.unconfirmed_earlier.remove(&(p, o)) {
            coverage.unconfirmed_redelivered += 1;
        }
        self.model.seen.insert((p, o), body);
        Ok(())
    }

    /// Attaches a `work` consumer if there is none (creating the subscription the first time).
    fn attach_work(&mut self, run: &mut Run) -> Result<(), String> {
        if run.work.is_some() {
            return Ok(());
        }
        let consumer = run
            .broker
            .subscribe(&Self::subscribe_request(WORK))
            .map_err(|e| self.failure(format!("subscribe {WORK}: {e}")))?;
        self.model.work_created = true;
        run.work = Some(consumer);
        run.unconfirmed.clear();
        run.in_flight.clear();
        Ok(())
    }

    /// Receives from `work` (without waiting), then acks, nacks or keeps each message in flight,
    /// and most of the time waits for the acks to be saved.
    async fn consume(
        &mut self,
        run: &mut Run,
        may_confirm: bool,
        coverage: &mut Coverage,
    ) -> Result<(), String> {
        self.attach_work(run)?;
        let count = 1 + self.rng.below(8) as u32;
        let mut got: Vec<(u32, u64, Bytes)> = Vec::new();
        let polled = run.work.as_ref().expect("subscribed above").poll(
            count,
            usize::MAX,
            |p, o, _, _, record| got.push((p, o, record.clone())),
        );
        // A log whose reopen after a failed sync failed too cannot be read until the next retry:
        // a storage error, not a durability problem. What was emitted before it is in flight.
        if let Err(error) = polled {
            self.trace(|| format!("poll {WORK}: {error} (after {} deliveries)", got.len()));
            coverage.poll_errors += 1;
        }
        for (p, o, record) in &got {
            let body = body_of(record).map_err(|e| self.failure(format!("{p}/{o}: {e}")))?;
            self.check_work_delivery(run, *p, *o, body, coverage)?;
            run.in_flight.push((*p, *o));
        }
        let mut acks = Vec::new();
        let mut nacks = Vec::new();
        let mut keep = Vec::new();
        for id in run.in_flight.drain(..) {
            match self.rng.below(10) {
                0..=5 => acks.push(id),
                6 | 7 => nacks.push(id),
                _ => keep.push(id),
            }
        }
        run.in_flight = keep;
        acks.sort_unstable();
        nacks.sort_unstable();
        let consumer = run.work.as_ref().expect("subscribed above");
        self.trace(|| format!("consume: got {} acks {acks:?} nacks {nacks:?}", got.len()));
        if !acks.is_empty() {
            let n = consumer
                .ack(&OffsetRange::coalesce(acks.iter().copied()))
                .map_err(|e| self.failure(format!("ack: {e}")))?;
            ensure!(
                self,
                n == acks.len() as u64,
                "acking {} messages in flight settled {n}",
                acks.len()
            );
            run.acked.extend(acks.iter().copied());
            self.model.acked_ever.extend(acks.iter().copied());
            run.unconfirmed.extend(acks.iter().copied());
        }
        if !nacks.is_empty() {
            let n = consumer
                .nack(
                    &OffsetRange::coalesce(nacks.iter().copied()),
                    Duration::ZERO,
                )
                .map_err(|e| self.failure(format!("nack: {e}")))?;
            ensure!(
                self,
                n == nacks.len() as u64,
                "nacking {} messages in flight released {n}",
                nacks.len()
            );
            coverage.nacks += n;
        }
        // CHECK 4: the consumer's count of messages in flight must match what it holds, also
        // after a poll that met a closed partition log (see
        // `a_poll_meeting_a_closed_partition_counts_what_it_delivered_from_the_others`).
        if consumer.in_flight() != run.in_flight.len() as u32 {
            let message = format!(
                "CHECK 4: the consumer counts {} messages in flight, it holds {}: {:?}",
                consumer.in_flight(),
                run.in_flight.len(),
                run.in_flight
            );
            return Err(self.failure(message));
        }
        if run.meta_fault || (may_confirm && self.rng.chance(3, 4)) {
            let saved = tokio::time::timeout(AWAIT_MAX, consumer.acks_saved())
                .await
                .map_err(|_| self.failure(format!("acks_saved did not answer in {AWAIT_MAX:?}")))?;
            match saved {
                Ok(()) => {
                    self.trace(|| format!("acks saved: {:?}", run.unconfirmed));
                    coverage.acks_confirmed += run.unconfirmed.len() as u64;
                    for id in run.unconfirmed.drain(..) {
                        self.model.confirmed.insert(id, "acks_saved returned Ok");
                    }
                }
                Err(error) => {
                    self.trace(|| format!("acks_saved: {error}"));
                    ensure!(
                        self,
                        run.meta_fault,
                        "acks_saved failed without a metadata fault: {error}"
                    );
                    coverage.acks_saved_failed += 1;
                }
            }
        }
        Ok(())
    }

    /// Loses power: the metadata file first (so that the dying store cannot write any more),
    /// then every handle goes without `shutdown`, then the log disk loses what was not synced.
    /// With `clean`, the broker is shut down first and power is lost right after.
    async fn power_loss(
        &mut self,
        run: Run,
        clean: bool,
        coverage: &mut Coverage,
    ) -> Result<Run, String> {
        let meta_seed = self.rng.next_u64();
        let disk_seed = self.rng.next_u64();
        self.trace(|| format!("power loss (clean stop first: {clean})"));
        if clean {
            run.broker.shutdown();
            coverage.clean_stops += 1;
        } else {
            self.meta.crash(meta_seed);
        }
        let Run {
            broker,
            topic,
            work,
            unconfirmed,
            acked,
            ..
        } = run;
        drop(work);
        drop(broker);
        ensure!(
            self,
            topic.upgrade().is_none(),
            "the topic (with its partition logs) outlived its broker"
        );
        if clean {
            self.meta.crash(meta_seed);
            for id in acked {
                self.model
                    .confirmed
                    .entry(id)
                    .or_insert("acked before a clean shutdown");
            }
        } else {
            for id in unconfirmed {
                if !self.model.confirmed.contains_key(&id) {
                    self.model.unconfirmed_earlier.insert(id);
                }
            }
        }
        self.disk.fail_next_syncs(0);
        self.disk.crash(disk_seed);
        coverage.power_losses += 1;
        self.reopen(coverage)
    }

    /// Drains `work` after the last restart: nothing confirmed may come (check 2), and everything
    /// in the topic that was never acked must (check 5).
    fn drain_work(&mut self, run: &mut Run, coverage: &mut Coverage) -> Result<(), String> {
        if !self.model.work_created {
            return Ok(());
        }
        let consumer = run
            .broker
            .subscribe(&Self::subscribe_request(WORK))
            .map_err(|e| self.failure(format!("subscribe {WORK}: {e}")))?;
        loop {
            let mut got: Vec<(u32, u64, Bytes)> = Vec::new();
            let n = consumer
                .poll(1000, usize::MAX, |p, o, _, _, record| {
                    got.push((p, o, record.clone()))
                })
                .map_err(|e| self.failure(format!("poll {WORK}: {e}")))?;
            for (p, o, record) in got {
                let body = body_of(&record).map_err(|e| self.failure(format!("{p}/{o}: {e}")))?;
                self.check_work_delivery(run, p, o, body, coverage)?;
                run.in_flight.push((p, o));
            }
            if n == 0 {
                break;
            }
        }
        run.work = Some(consumer);
        // CHECK 5: `work` started at the earliest offset when it was created, and nothing expires
        // or is given up, so every message in the topic (all of it is in `seen` since the last
        // reopen) was acked at some point or comes now.
        let delivered: BTreeSet<(u32, u64)> = run.in_flight.iter().copied().collect();
        let missing: Vec<(u32, u64)> = self
            .model
            .seen
            .keys()
            .filter(|id| !delivered.contains(id) && !self.model.acked_ever.contains(id))
            .copied()
            .collect();
        if !missing.is_empty() {
            let message = format!(
                "CHECK 5: messages never acked are not delivered to '{WORK}' after the last restart: {missing:?}"
            );
            return Err(self.failure(message));
        }
        Ok(())
    }

    async fn run(mut self, coverage: &mut Coverage) -> Result<(), String> {
        let mut run = self.create()?;
        for step in 0..STEPS_PER_HISTORY {
            self.step = step;
            let roll = self.rng.below(100);
            run = match roll {
                0..=29 => {
                    self.publish(&mut run, false, coverage).await?;
                    run
                }
                30..=35 => {
                    self.publish(&mut run, true, coverage).await?;
                    run
                }
                36..=40 => {
                    self.publish_concurrently(&mut run, false, coverage).await?;
                    run
                }
                41..=42 => {
                    self.publish_concurrently(&mut run, true, coverage).await?;
                    self.power_loss(run, false, coverage).await?
                }
                43..=72 => {
                    self.consume(&mut run, true, coverage).await?;
                    run
                }
                73..=75 => {
                    self.trace(|| "drop the work consumer".into());
                    run.work = None;
                    run.in_flight.clear();
                    run.unconfirmed.clear();
                    run
                }
                76..=80 => self.power_loss(run, false, coverage).await?,
                81..=82 => self.power_loss(run, true, coverage).await?,
                83 => {
                    // Acks still being saved when the broker stops: the stop saves them.
                    self.consume(&mut run, false, coverage).await?;
                    self.power_loss(run, true, coverage).await?
                }
                84 => {
                    // Lost in flight: unconfirmed acks at the moment of a power loss.
                    self.consume(&mut run, false, coverage).await?;
                    self.power_loss(run, false, coverage).await?
                }
                88..=89 if self.meta_faults => {
                    // The power goes out during the metadata store's next few writes: most
                    // likely in the commit of the acks made now.
                    let operations = self.rng.below(8);
                    let seed = self.rng.next_u64();
                    // Created before the crash is armed: its creation is not what is tested.
                    self.attach_work(&mut run)?;
                    self.trace(|| format!("metadata crash after {operations} writes"));
                    self.meta.crash_after_operations(operations, seed);
                    run.meta_fault = true;
                    coverage.meta_crashes_in_commit += 1;
                    self.consume(&mut run, true, coverage).await?;
                    self.power_loss(run, false, coverage).await?
                }
                _ => {
                    // Let the sync and state threads get ahead.
                    std::thread::yield_now();
                    tokio::task::yield_now().await;
                    run
                }
            };
        }
        self.step = STEPS_PER_HISTORY;
        let mut run = self.power_loss(run, false, coverage).await?;
        self.drain_work(&mut run, coverage)?;
        drop(run);
        coverage.histories += 1;
        Ok(())
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Aborts the process, naming the seed, if one history runs far too long (a hang cannot be
/// caught otherwise).
struct Watchdog {
    current: Arc<Mutex<(u64, Instant)>>,
    stop: Arc<AtomicBool>,
}

impl Watchdog {
    fn start() -> Watchdog {
        let current = Arc::new(Mutex::new((0, Instant::now())));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (current.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let (seed, started) = *c.lock().unwrap_or_else(|p| p.into_inner());
                if !s.load(Relaxed) && started.elapsed() > HISTORY_MAX {
                    eprintln!(
                        "power-loss history with seed {seed} hangs (over {HISTORY_MAX:?})\nreplay: FERRYMQ_SIM_SEED={seed} FERRYMQ_SIM_TRACE=1 cargo test -p ferrymq-broker --test power_loss -- --nocapture"
                    );
                    std::process::abort();
                }
            }
        });
        Watchdog { current, stop }
    }

    fn begin(&self, seed: u64) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = (seed, Instant::now());
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Relaxed);
    }
}

/// Runs one history on its own runtime; a failure or panic names the seed.
fn run_reporting(seed: u64, data_dir: &std::path::Path, coverage: &mut Coverage) {
    let replay = format!(
        "replay: FERRYMQ_SIM_SEED={seed} FERRYMQ_SIM_TRACE=1 cargo test -p ferrymq-broker --test power_loss -- --nocapture"
    );
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        runtime.block_on(Sim::new(seed, data_dir.to_path_buf()).run(coverage))
    }));
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(message)) => {
            panic!("power-loss history failed with seed {seed}: {message}\n{replay}")
        }
        Err(_) => panic!("power-loss history panicked with seed {seed} (see above)\n{replay}"),
    }
}

/// Runs the `part`-th of two halves of the histories, so that the two tests use both cores.
fn run_half(part: u64) {
    let data_dir = std::env::temp_dir().join(format!(
        "ferrymq-broker-power-loss-{}-{part}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&data_dir);
    let seeds: Vec<u64> = match env_u64("FERRYMQ_SIM_SEED") {
        Some(seed) if part == 0 => vec![seed],
        Some(_) => Vec::new(),
        None => {
            let histories = env_u64("FERRYMQ_SIM_HISTORIES").unwrap_or(HISTORIES_DEFAULT);
            // A fixed base keeps CI reproducible; FERRYMQ_SIM_BASE explores other histories.
            let base = env_u64("FERRYMQ_SIM_BASE").unwrap_or(0);
            (0..histories)
                .filter(|i| i % 2 == part)
                .map(|i| base.wrapping_add(i))
                .collect()
        }
    };
    let count = seeds.len() as u64;
    let watchdog = Watchdog::start();
    let started = Instant::now();
    let mut coverage = Coverage::default();
    for seed in seeds {
        watchdog.begin(seed);
        run_reporting(seed, &data_dir, &mut coverage);
    }
    drop(watchdog);
    let _ = std::fs::remove_dir_all(&data_dir);
    eprintln!(
        "power loss: {count} histories in {:.1?}: {coverage:?}",
        started.elapsed()
    );
    if count >= 50 {
        assert!(coverage.power_losses > count, "too few power losses");
        assert!(coverage.clean_stops > 0, "no clean stop");
        assert!(
            coverage.acknowledged_checked > 0,
            "no acknowledged publish was checked"
        );
        assert!(coverage.publishes_failed > 0, "no publish ever failed");
        assert!(coverage.acks_confirmed > 0, "no ack was ever confirmed");
        assert!(
            coverage.meta_crashes_in_commit > 0,
            "no metadata crash in a commit"
        );
    }
}

#[test]
fn power_loss_keeps_acknowledged_publishes_and_confirmed_acks_first_half() {
    run_half(0);
}

#[test]
fn power_loss_keeps_acknowledged_publishes_and_confirmed_acks_second_half() {
    run_half(1);
}

/// A broker over a fresh simulated machine for the deterministic tests below: the topic (two
/// partitions) holds "a" at 0/0 and "b" at 1/0 and the broker was restarted cleanly, so that its
/// in-memory tails are empty and reading those messages needs the files.
struct Machine {
    data_dir: PathBuf,
    disk: MemoryStorage,
    meta: SimBlockFile,
}

impl Machine {
    fn config(&self) -> DiskConfig {
        let mut config = DiskConfig::new(&self.data_dir);
        config.sync_threads = 1;
        config.storage = Arc::new(SimFactory {
            disk: self.disk.clone(),
            meta: self.meta.clone(),
        });
        config
    }

    async fn start(name: &str) -> (Machine, Broker) {
        let machine = Machine {
            data_dir: std::env::temp_dir().join(format!(
                "ferrymq-broker-power-loss-{name}-{}",
                std::process::id()
            )),
            disk: MemoryStorage::new(),
            meta: SimBlockFile::new(),
        };
        let broker = Broker::open_durable(Sim::broker_config(), machine.config()).unwrap();
        broker
            .create_topic(
                TOPIC,
                TopicConfig {
                    partitions: 2,
                    storage: Storage::Disk,
                    fsync: FsyncPolicy::Always,
                    ..TopicConfig::default()
                },
                false,
            )
            .unwrap();
        broker.publish_messages(TOPIC, &to(0, "a")).await.unwrap();
        broker.publish_messages(TOPIC, &to(1, "b")).await.unwrap();
        broker.shutdown();
        drop(broker);
        let broker = Broker::open_durable(Sim::broker_config(), machine.config()).unwrap();
        (machine, broker)
    }

    /// Partition 1's next sync fails, and so does the sync of its reopen: its log is gone
    /// (`DiskLog::log` is `None`) until the disk heals and a maintenance round reopens it.
    async fn break_partition_1(&self, broker: &Broker) {
        self.disk.fail_next_syncs(u64::MAX);
        broker
            .publish_messages(TOPIC, &to(1, "c"))
            .await
            .unwrap_err();
        // The reopen is queued at once; give the sync thread time to fail it.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// A message routed to `partition` (a decimal key goes to key % partitions).
fn to(partition: u32, body: &str) -> [Message; 1] {
    [Message::new(body.to_string()).with_key(partition.to_string())]
}

/// CHECK 4 of the simulation, pinned: `Consumer::poll` visits the partitions in turn; a partition
/// whose log is closed after a failure (here: its log failed a sync and its reopen failed too,
/// so it stays closed until the maintenance retry) has nothing to give and is skipped, and what
/// the other partitions handed over is counted in flight. (It used to return an error after
/// partition 0 had handed over its message, without counting it: acking it then wrapped the
/// count below zero and the consumer never received again.)
#[tokio::test]
async fn a_poll_meeting_a_closed_partition_counts_what_it_delivered_from_the_others() {
    let (machine, broker) = Machine::start("poll").await;
    let consumer = broker.subscribe(&Sim::subscribe_request(WORK)).unwrap();
    machine.break_partition_1(&broker).await;

    let mut got = Vec::new();
    let polled = consumer.poll(10, usize::MAX, |p, o, _, _, _| got.push((p, o)));
    assert_eq!(polled.unwrap(), 1);
    assert_eq!(got, [(0, 0)]);
    assert_eq!(consumer.in_flight(), 1);
    assert_eq!(consumer.ack(&[OffsetRange::single(0, 0)]).unwrap(), 1);
    assert_eq!(consumer.in_flight(), 0);

    // The disk heals: a new message to the healthy partition reaches the consumer, and partition
    // 1 comes back with the next maintenance round.
    machine.disk.fail_next_syncs(0);
    broker.publish_messages(TOPIC, &to(0, "d")).await.unwrap();
    let mut delivered = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let wanted = |d: &Vec<(u32, u64)>| d.contains(&(0, 1)) && d.contains(&(1, 0));
    while !wanted(&delivered) && std::time::Instant::now() < deadline {
        if let Ok(Ok(d)) = tokio::time::timeout(Duration::from_millis(500), consumer.recv(10)).await
        {
            delivered.extend(d.iter().map(|d| (d.partition, d.offset)));
        }
    }
    drop(consumer);
    drop(broker);
    // 0/1 "d", and partition 1 back: 1/0 (and whatever of its failed publish the reopened log
    // kept, at 1/1), each once.
    assert!(wanted(&delivered), "{delivered:?}");
    let mut unique = delivered.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), delivered.len(), "{delivered:?}");
}

/// The same through `Consumer::recv`, the in-process API: the message of partition 0 reaches
/// the caller although partition 1 cannot be read.
#[tokio::test]
async fn a_recv_meeting_a_closed_partition_returns_what_the_others_delivered() {
    let (machine, broker) = Machine::start("recv").await;
    let consumer = broker
        .subscribe(&SubscribeRequest {
            ack_timeout_ms: 100,
            ..Sim::subscribe_request(WORK)
        })
        .unwrap();
    machine.break_partition_1(&broker).await;
    let first = consumer.recv(10).await.unwrap();
    assert_eq!(
        first
            .iter()
            .map(|d| (d.partition, d.offset))
            .collect::<Vec<_>>(),
        [(0, 0)]
    );
    // Its ack timeout passes: it comes back, and the count stays right.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(consumer.in_flight(), 0);
    machine.disk.fail_next_syncs(0);
    let again = tokio::time::timeout(Duration::from_secs(3), consumer.recv(10))
        .await
        .expect("redelivered within 3 s")
        .unwrap();
    assert!(again.iter().any(|d| (d.partition, d.offset) == (0, 0)));
    drop(consumer);
    drop(broker);
}

/// CHECK 5 of the simulation, pinned: a named subscription created from `earliest` while a
/// partition's log is closed for a reopen starts at the log's first offset as last seen, not at
/// the in-memory tail's head (after a restart, the end of the log), so that after the log
/// recovered every message reaches it.
#[tokio::test]
async fn a_subscription_from_earliest_gets_a_partition_that_was_closed_when_it_was_created() {
    let (machine, broker) = Machine::start("earliest").await;
    machine.break_partition_1(&broker).await;
    drop(broker.subscribe(&Sim::subscribe_request(WORK)).unwrap());
    machine.disk.fail_next_syncs(0);
    // A clean restart: the log of partition 1 opens again, and the subscription is as saved.
    broker.shutdown();
    drop(broker);
    let broker = Broker::open_durable(Sim::broker_config(), machine.config()).unwrap();
    let consumer = broker.subscribe(&Sim::subscribe_request(WORK)).unwrap();
    let mut got = Vec::new();
    while let Ok(Ok(deliveries)) =
        tokio::time::timeout(Duration::from_millis(500), consumer.recv(10)).await
    {
        got.extend(
            deliveries
                .iter()
                .map(|d| (d.partition, d.offset, show(&d.message.body))),
        );
    }
    drop(consumer);
    drop(broker);
    got.sort();
    // "c" was written before its sync failed and the reopen kept it: its publisher was told of
    // the failure, so it may or may not be there.
    got.retain(|(_, _, body)| body != "c");
    assert_eq!(
        got,
        [(0, 0, "a".to_string()), (1, 0, "b".to_string())],
        "BROKER BUG: subscription '{WORK}', created from earliest while partition 1 was being \
         reopened, never gets 1/0 \"b\""
    );
}
