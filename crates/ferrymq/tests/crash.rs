//! Crash test: a real `ferrymq serve --data-dir` under publish and consume load is killed with
//! SIGKILL at random moments and restarted on the same data dir, round after round.
//!
//! The topic is a disk topic (2-4 partitions, fsync always) created explicitly. In each round,
//! publishers send batches whose bodies encode `<publisher>:<sequence>:` (sequences continue
//! across rounds) and keep a few batches in flight; a publish counts as ACKNOWLEDGED only once its
//! PUBLISHED reply arrived, and the reply's (partition, offset) is recorded. One consumer on a
//! named subscription (start earliest) records every delivery and acks, mostly with
//! `ack_confirmed`, sometimes lazily (`ack_ranges`, confirmed by the next confirmed ack) or
//! later; an ack counts as CONFIRMED only once the server's OK arrived. Connection errors after
//! the kill end that round's tasks; unanswered publishes and acks simply do not count. A few
//! rounds kill the broker right after it starts listening (recovery of a recovery).
//!
//! After the last round the broker starts once more: the consumer drains the subscription until
//! it is idle, and an ephemeral subscription from earliest reads the whole log. Checked:
//! 1. every acknowledged publish is in the log at exactly the (partition, offset) of its reply;
//! 2. each partition's offsets are dense from 0, each id appears once, and each publisher's
//!    sequences increase along the offsets of a partition; every delivery matches the log;
//! 3. no message is delivered again after its ack was confirmed;
//! 4. every acknowledged publish was delivered to the subscription at least once.
//!
//! Also checked: the broker's log shows no panic, no publish or confirmed ack waits more than
//! `STALL_LIMIT` for its answer while the broker runs, and the tasks see no error but connection
//! errors after a kill. A short test without crashes checks the same load alone.
//!
//! The seed is printed and in every failure message; `FERRYMQ_CRASH_SEED=<seed>` replays the same
//! choices (rounds, kill moments, batch sizes), though thread timing still differs between runs.
//!
//! The soak variant runs only with `FERRYMQ_CRASH_SOAK=1`: fresh runs of the default plan, one
//! seed after the other (the first is `FERRYMQ_CRASH_SEED` or random), for
//! `FERRYMQ_CRASH_SOAK_SECS` (default 600):
//! `FERRYMQ_CRASH_SOAK=1 cargo test -p ferrymq --test crash soak -- --nocapture`.
//! `FERRYMQ_CRASH_BIN=<path>` tests another `ferrymq` binary (a release build, say).

mod common;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{temp_dir, BIN};
use ferrymq_client::{
    push_offset, Client, ClientConfig, Durability, Error, FsyncPolicy, Message, MessageId,
    OffsetRange, OverflowPolicy, PendingPublish, PublishReceipt, StartPosition, Storage,
    SubscribeOptions, Subscription, TopicConfig,
};

const TOPIC: &str = "crash";
const SUBSCRIPTION: &str = "crash-consumer";
const PUBLISHERS: u32 = 3;
/// High enough that no message is given up (dead-lettered) by crashes alone.
const MAX_ATTEMPTS: u32 = 1000;
/// How long the broker may take to start listening (recovery included).
const STARTUP_LIMIT: Duration = Duration::from_secs(20);
/// How long the load tasks may take to notice the kill and end.
const ROUND_END_LIMIT: Duration = Duration::from_secs(15);
/// The drain and the final read stop after this long without a delivery.
const IDLE: Duration = Duration::from_millis(1500);
/// Upper bounds on the drain and on the final read.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);
/// A publish or confirmed ack still unanswered this long before the kill means a stalled broker
/// (answers normally take milliseconds, a few hundred on a busy machine).
const STALL_LIMIT: Duration = Duration::from_secs(1);

/// (publisher, sequence), as encoded in a message body.
type Id = (u32, u64);

/// The tests of this file run one at a time: two brokers under load on a small machine would
/// make each other look stalled.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The default plan: 20 rounds, about 25 s.
fn plan(name: &'static str, seed: u64) -> Plan {
    Plan {
        name,
        seed,
        rounds: 20,
        rounds_budget: Duration::from_secs(45),
        total_limit: Duration::from_secs(110),
    }
}

#[test]
fn crash_and_restart_keeps_acknowledged_publishes_and_confirmed_acks() {
    let _serial = one_at_a_time();
    run(plan("crash", seed_from_env()));
}

/// Runs of the default plan, each on a fresh data dir with the next seed, for
/// `FERRYMQ_CRASH_SOAK_SECS`; only with `FERRYMQ_CRASH_SOAK` set. Fresh runs keep the bookkeeping
/// (every message of a run is remembered) within memory.
#[test]
fn soak() {
    if std::env::var_os("FERRYMQ_CRASH_SOAK").is_none() {
        eprintln!("crash soak skipped: set FERRYMQ_CRASH_SOAK=1 to run it");
        return;
    }
    let _serial = one_at_a_time();
    let secs: u64 = std::env::var("FERRYMQ_CRASH_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let started = Instant::now();
    let mut seeds = Rng(seed_from_env());
    let mut runs = 0;
    while started.elapsed() < Duration::from_secs(secs) {
        run(plan("crash-soak", seeds.next()));
        runs += 1;
    }
    eprintln!(
        "crash soak: {runs} runs of 20 rounds in {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

/// The load of a round without the crash: every publish must be answered and the broker must not
/// panic. A stall here would also show in every crash round, more noisily.
#[test]
fn concurrent_publishes_to_a_disk_topic_are_all_answered() {
    let _serial = one_at_a_time();
    let dir = temp_dir("no-crash");
    let broker = Broker::start(&dir.join("data"), dir.join("broker.log"), 0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let record: Shared = Arc::default();
    runtime.block_on(async {
        let client = Client::connect_with(client_config(&broker.addr))
            .await
            .expect("connect");
        client
            .create_topic(TOPIC, topic_config(3), false)
            .await
            .expect("create the topic");
        let stop = Arc::new(AtomicBool::new(false));
        let mut rng = Rng(7);
        let tasks: Vec<_> = (0..PUBLISHERS)
            .map(|p| {
                tokio::spawn(publisher(
                    broker.addr.clone(),
                    p,
                    Arc::default(),
                    record.clone(),
                    rng.fork(),
                    stop.clone(),
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(3)).await;
        stop.store(true, Ordering::Relaxed);
        // Each publisher waits for its last answers, at most the request timeout.
        for task in tasks {
            task.await.expect("a publisher panicked");
        }
    });
    let record = record.lock().unwrap();
    let panic = broker.panic();
    assert!(
        panic.is_none() && record.anomalies.is_empty(),
        "{} of {} messages acknowledged; broker panic: {panic:?}; problems:\n{}",
        record.published.len(),
        record.sent,
        record.anomalies[..record.anomalies.len().min(10)].join("\n")
    );
    assert_eq!(record.published.len() as u64, record.sent);
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}

struct Plan {
    name: &'static str,
    seed: u64,
    rounds: usize,
    /// No new round starts after this much time.
    rounds_budget: Duration,
    /// The whole test fails beyond this (each step is bounded too).
    total_limit: Duration,
}

fn seed_from_env() -> u64 {
    match std::env::var("FERRYMQ_CRASH_SEED") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("FERRYMQ_CRASH_SEED={text:?} is not a u64")),
        Err(_) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            Rng(nanos ^ ((std::process::id() as u64) << 32)).next()
        }
    }
}

/// splitmix64: small, seedable, good enough to pick moments and sizes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn fork(&mut self) -> Rng {
        Rng(self.next())
    }
}

/// The binary under test: this build's, or `FERRYMQ_CRASH_BIN` (a release build, say).
fn broker_bin() -> PathBuf {
    std::env::var_os("FERRYMQ_CRASH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(BIN))
}

/// One `ferrymq serve` process; its log goes to a file.
struct Broker {
    child: Child,
    log: PathBuf,
    addr: String,
}

impl Broker {
    fn start(data_dir: &Path, log: PathBuf, seed: u64) -> Broker {
        let file = File::create(&log).expect("create the broker log");
        let mut child = Command::new(broker_bin())
            .arg("serve")
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--tcp-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(["--log", "info"])
            .env_remove("FERRYMQ_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn ferrymq serve");
        let deadline = Instant::now() + STARTUP_LIMIT;
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let listening = text
                .lines()
                .find(|line| line.contains("serving the binary protocol"));
            if let Some(line) = listening {
                let at = line.find("tcp=").expect("tcp= field") + 4;
                let addr = line[at..].split_whitespace().next().unwrap().to_string();
                return Broker { child, log, addr };
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "seed {seed}: ferrymq serve exited with {status} while starting; log:\n{text}"
                );
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("seed {seed}: ferrymq serve did not listen within {STARTUP_LIMIT:?}; log:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGKILL, and reap the process.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The first panic in the broker's log, with the lines that say what failed.
    fn panic(&self) -> Option<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let at = lines.iter().position(|line| line.contains("panicked at"))?;
        let mut found: Vec<&str> = lines[at..]
            .iter()
            .take(4)
            .take_while(|line| !line.contains("stack backtrace"))
            .copied()
            .collect();
        if lines[at + 1..]
            .iter()
            .any(|line| line.contains("panicked at"))
        {
            found.push("(and more panics after it)");
        }
        Some(format!(
            "{} [log {}]",
            found.join(" | "),
            self.log.display()
        ))
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One delivery to the named subscription.
#[derive(Debug, Clone, Copy)]
struct Seen {
    at: MessageId,
    id: Id,
    /// Position in the record's event order.
    clock: u64,
    round: usize,
    attempt: u16,
}

/// What the load tasks saw, in one order (`clock`) shared by deliveries and confirmations.
#[derive(Default)]
struct Record {
    clock: u64,
    /// Acknowledged publishes: where their PUBLISHED reply put them.
    published: HashMap<Id, MessageId>,
    /// The same, by position, to catch a position handed out twice.
    owner: HashMap<MessageId, Id>,
    sent: u64,
    deliveries: Vec<Seen>,
    /// Clock of the first confirmed ack of each message.
    confirmed: HashMap<MessageId, u64>,
    /// Things that are wrong whatever the crash timing (reported at the end).
    anomalies: Vec<String>,
    /// Panics in the broker's logs, one per broker run.
    panics: Vec<String>,
    /// Connection errors seen by the tasks (expected after each kill).
    connection_errors: u64,
    /// Slowest PUBLISHED and confirmed-ack answers of the current round.
    slowest_publish: Duration,
    slowest_ack: Duration,
    /// When the current round's broker was killed (set just before the kill).
    killed_at: Option<Instant>,
}

impl Record {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn acknowledged(&mut self, ids: &[Id], receipt: &PublishReceipt) {
        if receipt.durability != Durability::Synced {
            self.anomalies.push(format!(
                "PUBLISHED for a disk topic with fsync always says {:?}, not Synced",
                receipt.durability
            ));
        }
        let at: Vec<MessageId> = receipt.ids().collect();
        if at.len() != ids.len() {
            self.anomalies.push(format!(
                "PUBLISHED names {} positions for {} messages",
                at.len(),
                ids.len()
            ));
        }
        for (&id, &at) in ids.iter().zip(&at) {
            self.published.insert(id, at);
            if let Some(before) = self.owner.insert(at, id) {
                self.anomalies.push(format!(
                    "position {at} acknowledged twice: for {before:?}, then for {id:?}"
                ));
            }
        }
    }

    fn delivered(&mut self, at: MessageId, body: &[u8], round: usize, attempt: u16) {
        let clock = self.tick();
        match parse_body(body) {
            Some(id) => self.deliveries.push(Seen {
                at,
                id,
                clock,
                round,
                attempt,
            }),
            None => self.anomalies.push(format!(
                "delivery {at} has a body that is not <publisher>:<seq>: {:?}",
                String::from_utf8_lossy(&body[..body.len().min(64)])
            )),
        }
    }

    fn confirm(&mut self, ranges: &[OffsetRange]) {
        let clock = self.tick();
        for range in ranges {
            for offset in range.offset..range.end() {
                self.confirmed
                    .entry(MessageId::new(range.partition, offset))
                    .or_insert(clock);
            }
        }
    }

    /// Connection errors are expected once the broker is killed; anything else is not.
    fn failed(&mut self, who: &str, error: Error) {
        if !error.is_connection_error() {
            self.anomalies
                .push(format!("{who}: unexpected error: {error}"));
        } else if self.killed_at.is_none() {
            self.anomalies.push(format!(
                "{who}: connection lost while the broker was running: {error}"
            ));
        } else {
            self.connection_errors += 1;
        }
    }

    /// A request sent at `sent` got no answer: fine if the kill came soon after, a stall if the
    /// broker sat on it for longer than [`STALL_LIMIT`].
    fn unanswered(&mut self, who: &str, what: &str, sent: Instant, error: Error) {
        if let Some(killed_at) = self.killed_at {
            let waited = killed_at.saturating_duration_since(sent);
            if waited > STALL_LIMIT {
                self.anomalies.push(format!(
                    "{who}: {what} was still unanswered when the broker was killed {} ms after it was sent (stalled broker)",
                    waited.as_millis()
                ));
            }
        }
        self.failed(who, error);
    }
}

type Shared = Arc<Mutex<Record>>;

fn body(id: Id, padding: usize) -> Vec<u8> {
    let mut body = format!("{}:{}:", id.0, id.1).into_bytes();
    body.resize(body.len() + padding, b'.');
    body
}

fn parse_body(body: &[u8]) -> Option<Id> {
    let text = std::str::from_utf8(body).ok()?;
    let mut parts = text.splitn(3, ':');
    let publisher = parts.next()?.parse().ok()?;
    let seq = parts.next()?.parse().ok()?;
    let rest = parts.next()?;
    rest.bytes().all(|b| b == b'.').then_some((publisher, seq))
}

fn client_config(addr: &str) -> ClientConfig {
    let mut config = ClientConfig::new(addr.to_string());
    config.connect_timeout = Duration::from_secs(5);
    config.request_timeout = Some(Duration::from_secs(10));
    config
}

fn subscription_options() -> SubscribeOptions {
    SubscribeOptions::new(TOPIC)
        .subscription(SUBSCRIPTION)
        .start(StartPosition::Earliest)
        .max_attempts(MAX_ATTEMPTS)
        .credit(256)
}

fn topic_config(partitions: u32) -> TopicConfig {
    TopicConfig {
        partitions,
        storage: Storage::Disk,
        overflow: OverflowPolicy::Reject,
        max_messages: 0,
        max_bytes: 0,
        fsync: FsyncPolicy::Always,
        retention_ms: u64::MAX,
        retention_policy: Default::default(),
        dedup_window_ms: 0,
        replicas: 0,
    }
}

/// Publishes batches with a few in flight until the connection fails or `stop` is set.
async fn publisher(
    addr: String,
    publisher: u32,
    next_seq: Arc<AtomicU64>,
    record: Shared,
    mut rng: Rng,
    stop: Arc<AtomicBool>,
) {
    let who = format!("publisher {publisher}");
    let client = match Client::connect_with(client_config(&addr)).await {
        Ok(client) => client,
        Err(error) => return record.lock().unwrap().failed(&who, error),
    };
    let depth = rng.range(1, 4) as usize;
    let mut in_flight: VecDeque<(Vec<Id>, Instant, PendingPublish)> = VecDeque::new();
    // Bounded by the kill: every send or answer fails once the broker is gone.
    while !stop.load(Ordering::Relaxed) {
        if in_flight.len() >= depth {
            let (ids, sent, pending) = in_flight.pop_front().unwrap();
            match pending.await {
                Ok(receipt) => {
                    let mut record = record.lock().unwrap();
                    record.slowest_publish = record.slowest_publish.max(sent.elapsed());
                    record.acknowledged(&ids, &receipt);
                }
                Err(error) => {
                    let what = format!("PUBLISH of {ids:?}");
                    record.lock().unwrap().unanswered(&who, &what, sent, error);
                    break;
                }
            }
            continue;
        }
        let count = rng.range(1, 8);
        let first = next_seq.fetch_add(count, Ordering::Relaxed);
        let ids: Vec<Id> = (first..first + count).map(|seq| (publisher, seq)).collect();
        let messages: Vec<Message> = ids
            .iter()
            .map(|&id| Message::new(body(id, rng.range(0, 200) as usize)))
            .collect();
        record.lock().unwrap().sent += count;
        match client.send_batch(TOPIC, None, &messages).await {
            Ok(pending) => in_flight.push_back((ids, Instant::now(), pending)),
            Err(error) => {
                record.lock().unwrap().failed(&who, error);
                break;
            }
        }
    }
    // Answers that arrived before the connection died still count.
    for (ids, sent, pending) in in_flight {
        match pending.await {
            Ok(receipt) => record.lock().unwrap().acknowledged(&ids, &receipt),
            Err(error) => {
                let what = format!("PUBLISH of {ids:?}");
                record.lock().unwrap().unanswered(&who, &what, sent, error);
            }
        }
    }
}

/// How the consumer acks a batch.
enum AckMode {
    /// `ack_confirmed` of this batch and everything held back.
    Confirmed,
    /// `ack_ranges` now; confirmed by the next confirmed ack on this consumer.
    Lazy,
    /// Not yet: acked with the next confirmed ack.
    Later,
}

/// Consumes the named subscription until the connection fails or, with `idle`, until nothing
/// arrives for that long. In `drain` mode every batch is acked confirmed.
async fn consumer(
    addr: String,
    round: usize,
    record: Shared,
    mut rng: Rng,
    idle: Option<Duration>,
) {
    let who = format!("consumer (round {round})");
    let client = match Client::connect_with(client_config(&addr)).await {
        Ok(client) => client,
        Err(error) => return record.lock().unwrap().failed(&who, error),
    };
    let mut subscription = match client.subscribe(subscription_options()).await {
        Ok(subscription) => subscription,
        Err(error) => return record.lock().unwrap().failed(&who, error),
    };
    // Acked lazily or held back, waiting for the next confirmed ack.
    let mut lazy: Vec<OffsetRange> = Vec::new();
    let mut later: Vec<OffsetRange> = Vec::new();
    loop {
        let next = match idle {
            Some(idle) => match tokio::time::timeout(idle, subscription.next_batch()).await {
                Ok(next) => next,
                Err(_) => break,
            },
            None => subscription.next_batch().await,
        };
        let batch = match next {
            None => break,
            Some(Err(error)) => {
                record.lock().unwrap().failed(&who, error);
                break;
            }
            Some(Ok(batch)) => batch,
        };
        let mut ranges = Vec::new();
        {
            let mut record = record.lock().unwrap();
            for delivery in batch.iter() {
                let at = MessageId::new(delivery.partition, delivery.offset);
                record.delivered(at, &delivery.message.body, round, delivery.attempt);
                push_offset(&mut ranges, delivery.partition, delivery.offset);
            }
        }
        let mode = match rng.next() % 10 {
            _ if idle.is_some() => AckMode::Confirmed,
            0 | 1 => AckMode::Lazy,
            2 | 3 => AckMode::Later,
            _ => AckMode::Confirmed,
        };
        match mode {
            AckMode::Later => later.extend(ranges),
            AckMode::Lazy => {
                if let Err(error) = subscription.ack_ranges(&ranges).await {
                    record.lock().unwrap().failed(&who, error);
                    break;
                }
                lazy.extend(ranges);
            }
            AckMode::Confirmed => {
                let sent = Instant::now();
                if let Err(error) = ack_confirmed(&subscription, &mut ranges, &mut later).await {
                    let what = format!("confirmed ACK of {} ranges", ranges.len());
                    record.lock().unwrap().unanswered(&who, &what, sent, error);
                    break;
                }
                let mut record = record.lock().unwrap();
                record.slowest_ack = record.slowest_ack.max(sent.elapsed());
                record.confirm(&ranges);
                record.confirm(&std::mem::take(&mut lazy));
            }
        }
    }
    if idle.is_some() && !(later.is_empty() && lazy.is_empty()) {
        let mut ranges = Vec::new();
        match ack_confirmed(&subscription, &mut ranges, &mut later).await {
            Ok(()) => {
                let mut record = record.lock().unwrap();
                record.confirm(&ranges);
                record.confirm(&lazy);
            }
            Err(error) => record.lock().unwrap().failed(&who, error),
        }
    }
}

/// Acks `ranges` plus what was held back, confirmed; on success `ranges` holds all of it.
async fn ack_confirmed(
    subscription: &Subscription,
    ranges: &mut Vec<OffsetRange>,
    later: &mut Vec<OffsetRange>,
) -> Result<(), Error> {
    ranges.append(later);
    subscription.ack_confirmed(ranges).await
}

/// Reads the whole topic through an ephemeral subscription from earliest: position → id.
async fn read_log(addr: &str, seed: u64) -> (BTreeMap<MessageId, Id>, Vec<String>) {
    let client = Client::connect_with(client_config(addr))
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: connect for the final read: {e}"));
    let expected = client
        .describe_topic(TOPIC)
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: describe the topic: {e}"))
        .messages;
    let mut subscription = client
        .subscribe(
            SubscribeOptions::new(TOPIC)
                .start(StartPosition::Earliest)
                .auto_ack(true)
                .credit(4096),
        )
        .await
        .unwrap_or_else(|e| panic!("seed {seed}: subscribe for the final read: {e}"));
    let mut log = BTreeMap::new();
    let mut problems = Vec::new();
    let deadline = Instant::now() + DRAIN_LIMIT;
    // Bounded by the idle wait and the deadline.
    while Instant::now() < deadline {
        // Once everything the topic holds has come, a short wait shows nothing more follows.
        let wait = if log.len() as u64 >= expected {
            Duration::from_millis(200)
        } else {
            IDLE
        };
        let batch = match tokio::time::timeout(wait, subscription.next_batch()).await {
            Err(_) | Ok(None) => break,
            Ok(Some(batch)) => {
                batch.unwrap_or_else(|e| panic!("seed {seed}: final read failed: {e}"))
            }
        };
        for delivery in batch.iter() {
            let at = MessageId::new(delivery.partition, delivery.offset);
            match parse_body(&delivery.message.body) {
                Some(id) => {
                    if let Some(before) = log.insert(at, id) {
                        problems.push(format!(
                            "the final read got {at} twice ({before:?}, {id:?})"
                        ));
                    }
                }
                None => problems.push(format!("log entry {at} has a malformed body")),
            }
        }
    }
    if log.len() as u64 != expected {
        problems.push(format!(
            "DESCRIBE_TOPIC counts {expected} messages, the final read got {}",
            log.len()
        ));
    }
    (log, problems)
}

fn run(plan: Plan) {
    let started = Instant::now();
    let seed = plan.seed;
    let mut rng = Rng(seed);
    let partitions = rng.range(2, 4) as u32;
    eprintln!(
        "{}: seed {seed} (replay with FERRYMQ_CRASH_SEED={seed}), {partitions} partitions",
        plan.name
    );
    let dir = temp_dir(plan.name);
    let data_dir = dir.join("data");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let record: Shared = Arc::default();
    let next_seq: Vec<Arc<AtomicU64>> = (0..PUBLISHERS).map(|_| Arc::default()).collect();
    let check_time = |what: &str| {
        assert!(
            started.elapsed() < plan.total_limit,
            "seed {seed}: the test ran past its limit of {:?} ({what})",
            plan.total_limit
        );
    };

    // Setup: the topic and the named subscription, before any load.
    {
        let broker = Broker::start(&data_dir, dir.join("setup.log"), seed);
        runtime.block_on(async {
            let client = Client::connect_with(client_config(&broker.addr))
                .await
                .unwrap_or_else(|e| panic!("seed {seed}: connect: {e}"));
            client
                .create_topic(TOPIC, topic_config(partitions), false)
                .await
                .unwrap_or_else(|e| panic!("seed {seed}: create the topic: {e}"));
            let subscription = client
                .subscribe(subscription_options())
                .await
                .unwrap_or_else(|e| panic!("seed {seed}: create the subscription: {e}"));
            subscription.close().await.unwrap();
        });
        if let Some(panic) = broker.panic() {
            panic!("seed {seed}: the broker panicked during setup: {panic}");
        }
    }

    let mut round = 0;
    while round < plan.rounds && started.elapsed() < plan.rounds_budget {
        round += 1;
        check_time("before a round");
        let mut broker = Broker::start(&data_dir, dir.join(format!("round-{round}.log")), seed);
        let early = round > 1 && rng.chance(10);
        let load = if early {
            Duration::from_millis(rng.range(0, 50))
        } else {
            Duration::from_millis(rng.range(300, 2000))
        };
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        if !early {
            for publisher_index in 0..PUBLISHERS {
                tasks.push(runtime.spawn(publisher(
                    broker.addr.clone(),
                    publisher_index,
                    next_seq[publisher_index as usize].clone(),
                    record.clone(),
                    rng.fork(),
                    stop.clone(),
                )));
            }
            tasks.push(runtime.spawn(consumer(
                broker.addr.clone(),
                round,
                record.clone(),
                rng.fork(),
                None,
            )));
        }
        std::thread::sleep(load);
        // Recorded before the kill, so that no task sees the connection drop before it is set.
        record.lock().unwrap().killed_at = Some(Instant::now());
        broker.kill();
        stop.store(true, Ordering::Relaxed);
        let ended = runtime.block_on(async {
            tokio::time::timeout(ROUND_END_LIMIT, async {
                for task in tasks {
                    task.await.expect("a load task panicked");
                }
            })
            .await
        });
        assert!(
            ended.is_ok(),
            "seed {seed}: round {round}: the load tasks did not end within {ROUND_END_LIMIT:?} of the kill"
        );
        let mut record = record.lock().unwrap();
        record.killed_at = None;
        if let Some(panic) = broker.panic() {
            record.panics.push(format!("round {round}: {panic}"));
        }
        let slowest_publish = std::mem::take(&mut record.slowest_publish);
        let slowest_ack = std::mem::take(&mut record.slowest_ack);
        eprintln!(
            "round {round:>3}: {:>4} ms load{}: {} acknowledged of {} sent, {} deliveries, {} confirmed; slowest answers: publish {} ms, ack {} ms",
            load.as_millis(),
            if early { " (killed while starting)" } else { "" },
            record.published.len(),
            record.sent,
            record.deliveries.len(),
            record.confirmed.len(),
            slowest_publish.as_millis(),
            slowest_ack.as_millis(),
        );
    }

    // The last start: drain the subscription, then read the whole log.
    check_time("before the drain");
    let broker = Broker::start(&data_dir, dir.join("final.log"), seed);
    let drained = runtime.block_on(async {
        tokio::time::timeout(
            DRAIN_LIMIT,
            consumer(
                broker.addr.clone(),
                round + 1,
                record.clone(),
                rng.fork(),
                Some(IDLE),
            ),
        )
        .await
    });
    assert!(
        drained.is_ok(),
        "seed {seed}: draining the subscription took longer than {DRAIN_LIMIT:?}"
    );
    let (log, mut read_problems) = runtime.block_on(read_log(&broker.addr, seed));
    check_time("after the final read");
    if let Some(panic) = broker.panic() {
        read_problems.push(format!("the broker panicked in the final run: {panic}"));
    }

    let record = record.lock().unwrap();
    let failures = check(&record, &log, read_problems);
    let summary = format!(
        "{} rounds, {} partitions, {} acknowledged publishes of {} sent, {} in the log, {} deliveries \
         ({} redeliveries), {} confirmed acks, {} connection errors, {:.1} s",
        round,
        partitions,
        record.published.len(),
        record.sent,
        log.len(),
        record.deliveries.len(),
        record.deliveries.len() - record.deliveries.iter().map(|s| s.at).collect::<std::collections::HashSet<_>>().len(),
        record.confirmed.len(),
        record.connection_errors,
        started.elapsed().as_secs_f64()
    );
    eprintln!("{}: {summary}", plan.name);
    if !failures.is_empty() {
        panic!(
            "seed {seed} (replay with FERRYMQ_CRASH_SEED={seed}): {} problems; data and logs kept in {}\n{summary}\n{}\nlast broker log lines:\n{}",
            failures.len(),
            dir.display(),
            failures.join("\n"),
            broker.log_tail()
        );
    }
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every check of the module documentation; returns what failed, a bounded number per kind.
fn check(
    record: &Record,
    log: &BTreeMap<MessageId, Id>,
    read_problems: Vec<String>,
) -> Vec<String> {
    const SHOWN: usize = 10;
    let mut failures = Vec::new();
    let mut report = |kind: &str, problems: Vec<String>| {
        if problems.is_empty() {
            return;
        }
        failures.push(format!("{kind}: {} cases", problems.len()));
        failures.extend(problems.iter().take(SHOWN).map(|p| format!("  {p}")));
    };
    report("broker panics", record.panics.clone());
    report("anomalies seen by the load tasks", record.anomalies.clone());
    report("final read", read_problems);

    // 1. Acknowledged publishes are where their reply put them.
    let mut acknowledged: Vec<(&Id, &MessageId)> = record.published.iter().collect();
    acknowledged.sort();
    let mut missing = Vec::new();
    for (id, at) in &acknowledged {
        match log.get(at) {
            Some(found) if found == *id => {}
            Some(found) => missing.push(format!(
                "acknowledged {id:?} at {at}, but the log holds {found:?} there"
            )),
            None => missing.push(format!(
                "acknowledged {id:?} at {at}, but the log has no {at}"
            )),
        }
    }
    report("(1) acknowledged publishes missing or moved", missing);

    // 2. Dense offsets, unique ids, each publisher's sequences increasing within a partition.
    let mut order = Vec::new();
    let mut next_offset: BTreeMap<u32, u64> = BTreeMap::new();
    let mut last_seq: HashMap<(u32, u32), (u64, MessageId)> = HashMap::new();
    let mut where_is: HashMap<Id, MessageId> = HashMap::new();
    for (&at, &id) in log {
        let expected = next_offset.entry(at.partition).or_insert(0);
        if at.offset != *expected {
            order.push(format!(
                "partition {}: offset {} follows {} (not dense)",
                at.partition,
                at.offset,
                *expected as i64 - 1
            ));
        }
        *expected = at.offset + 1;
        if let Some(before) = where_is.insert(id, at) {
            order.push(format!("{id:?} is in the log twice: {before} and {at}"));
        }
        if let Some((seq, before)) = last_seq.insert((at.partition, id.0), (id.1, at)) {
            if seq >= id.1 {
                order.push(format!(
                    "publisher {}: sequence {} at {at} after sequence {seq} at {before}",
                    id.0, id.1
                ));
            }
        }
    }
    let mut mismatched = Vec::new();
    for seen in &record.deliveries {
        match log.get(&seen.at) {
            Some(id) if *id == seen.id => {}
            other => mismatched.push(format!(
                "round {} delivered {:?} as {} (attempt {}), the log holds {other:?} there",
                seen.round, seen.id, seen.at, seen.attempt
            )),
        }
    }
    report("(2) log order", order);
    report("(2) deliveries that do not match the log", mismatched);

    // 3. Nothing delivered again once its ack was confirmed.
    let mut redelivered = Vec::new();
    for seen in &record.deliveries {
        if let Some(&confirmed) = record.confirmed.get(&seen.at) {
            if seen.clock > confirmed {
                redelivered.push(format!(
                    "{} ({:?}) delivered again in round {} (attempt {}) after its ack was confirmed",
                    seen.at, seen.id, seen.round, seen.attempt
                ));
            }
        }
    }
    report("(3) confirmed acks redelivered", redelivered);

    // 4. Every acknowledged publish reached the subscription.
    let delivered: std::collections::HashSet<Id> =
        record.deliveries.iter().map(|seen| seen.id).collect();
    let undelivered: Vec<String> = acknowledged
        .iter()
        .filter(|(id, _)| !delivered.contains(id))
        .map(|(id, at)| format!("{id:?} at {at} was never delivered"))
        .collect();
    report("(4) acknowledged publishes never delivered", undelivered);
    failures
}
